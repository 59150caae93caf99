#include "nn/backend.h"

#include <stdexcept>

#include "nn/cpu/cpu_backend.h"

namespace trainer {
namespace {
Backend* g_cuda_backend = nullptr;
}

void Backend::sgd_step_many(const std::vector<SgdUpdate>& updates, const SgdParams& p) {
  Tensor no_buffer;
  for (const SgdUpdate& u : updates)
    sgd_step(*u.param, *u.grad, u.momentum_buffer ? *u.momentum_buffer : no_buffer, u.first_step, p);
}

void Backend::adamw_step_many(const std::vector<AdamWUpdate>& updates, const AdamWParams& p) {
  for (const AdamWUpdate& u : updates) {
    AdamWParams each = p;
    each.step = u.step;
    each.device_scalars = u.device_scalars;
    each.applied_steps = u.applied_steps;
    adamw_step(*u.param, *u.grad, *u.exp_avg, *u.exp_avg_sq, each);
  }
}

Tensor packed_attention_head(const Tensor& qkv, int which) {
  return qkv.slice(2, which, which + 1).squeeze(2).permute({0, 2, 1, 3});  // [B, T, H, d] -> [B, H, T, d]
}

int64_t conv_output_size(int64_t in, int kernel, int stride, int pad, int dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

int64_t pool_output_size(int64_t in, int kernel, int stride, int pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - kernel;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  // PyTorch: with ceil_mode the last window must start inside the input or left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

Backend& backend_for(Device device) {
  if (device.is_cpu()) return cpu_backend();
  if (!g_cuda_backend)
    throw std::runtime_error("tensor on " + device.str() +
                             " but this build has no CUDA backend. HINT: build with -DTRAINER_CUDA=ON");
  return *g_cuda_backend;
}

void register_backend(DeviceKind kind, Backend* backend) {
  if (kind == DeviceKind::cuda) g_cuda_backend = backend;
}

}  // namespace trainer
