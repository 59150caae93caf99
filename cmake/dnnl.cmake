# oneDNN (Debian's libdnnl-dev) for the CPU backend's f32 convolutions (nn/cpu/dnnl_conv.cpp). Optional:
# without it the oneDNN sources are left out and every convolution runs im2col + OpenBLAS.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY dnnl)
if(DNNL_INCLUDE_DIR AND DNNL_LIBRARY)
  set(TRAINER_WITH_DNNL ON)
  message(STATUS "oneDNN: ${DNNL_LIBRARY} (CPU convolutions)")
else()
  set(TRAINER_WITH_DNNL OFF)
  message(STATUS "oneDNN: not found (apt-get install libdnnl-dev); CPU convolutions use im2col + OpenBLAS")
endif()
