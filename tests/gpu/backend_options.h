#pragma once
// Tests change one of the CUDA backend's options (runtime::BackendOptions) and set them back, as a run
// sets them all at once: through the options value, the only way the backend takes them.
#include "nn/runtime.h"

namespace trainer::testing {

template <class T>
void set_backend_option(T runtime::BackendOptions::*field, T value) {
  runtime::BackendOptions options = runtime::backend_options();
  options.*field = value;
  runtime::apply_backend_options(options);
}

}  // namespace trainer::testing
