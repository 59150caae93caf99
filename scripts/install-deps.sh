#!/usr/bin/env bash
# Installs the Debian 12 packages that building, testing and training need, and only those that are
# missing (so a second run is quick and needs no network). The CUDA toolkit is not installed here:
# when /usr/local/cuda exists the build uses it, otherwise it builds the CPU backend only.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config  # toolchain
  libopenblas-dev                                      # CPU matmul and im2col convolution
  libdnnl-dev                                          # CPU f32 convolutions (oneDNN; optional in CMake)
  libtomlplusplus-dev                                  # config files
  zlib1g-dev                                           # gzip-compressed IDX datasets
  libgtest-dev                                         # tests
  dataset-fashion-mnist                                # the default training set
  libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev    # JPEG (whole and crop-region) and PNG decoding
  libopencv-core-dev libopencv-imgproc-dev             # resizing; never libopencv-dev (Qt, VTK, MPI)
  prometheus-cpp-dev                                   # the metrics exporter (pull, with civetweb)
  nlohmann-json3-dev                                   # JSON: safetensors headers, summaries, bench records
  libonnx-dev libprotobuf-dev                          # trainer export: ONNX's protobuf classes (optional in CMake)
  prometheus                                           # tests: a real Prometheus server
  chromium                                             # tests: trainer report's page in a real browser
  python3-torch python3-torchvision                    # tests: the PyTorch reference checks (CPU)
  python3-onnx                                         # tests: onnx.checker on the exported models
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  as_root=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
