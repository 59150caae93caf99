#pragma once
// The op-case table: every Backend virtual (nn/backend.h) run on listed shapes, dtypes and layouts, as
// ggml's test-backend-ops runs every op on every backend. One list, two checks:
//   - on the CPU in float64, each case with a gradient is checked against central finite differences
//     of its own forward (tests/nn/op_table_test.cpp);
//   - on a GPU, each case runs on the CUDA backend in its device dtypes and layouts against the CPU on
//     the same values (tests/gpu/op_table_test.cpp).
// A recording backend (recording_backend.h) runs every case and fails the table when a virtual of
// backend.h is run by no case: a new op joins this table, not a new ad-hoc test file.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/random.h"
#include "nn/tensor.h"

namespace trainer::op_cases {

// How a case's input is drawn (on the host, in f64, from the case's seed).
struct InputSpec {
  enum class Values {
    uniform,         // [lo, hi)
    away_from_zero,  // |v| in [0.2, 1), random sign: no finite difference crosses a kink at 0
    distinct,        // a shuffled ramp, steps of 0.1 (no ties in a max, no kink crossed by +-h)
    labels,          // i64 class indices in [0, classes)
    zeros,
  };
  Shape shape;
  Values values = Values::uniform;
  double lo = -1.0, hi = 1.0;
  int64_t classes = 0;
  // The input's dtype whatever the case runs in (i64 labels and counters, f64 sync-BN buffers, the f32
  // loss scale); nullopt: the dtype under test.
  std::optional<DType> fixed_dtype =
      std::nullopt;  // initialised: brace lists that leave it out warn otherwise
  // A 4-D image tensor: laid out channels-last on the device runs that ask for it.
  bool image = false;
};

inline InputSpec uniform(Shape shape, double lo = -1.0, double hi = 1.0) {
  return {std::move(shape), InputSpec::Values::uniform, lo, hi};
}
inline InputSpec image(Shape shape, InputSpec::Values values = InputSpec::Values::uniform) {
  InputSpec s{std::move(shape), values};
  s.image = true;
  return s;
}
inline InputSpec labels(int64_t n, int64_t classes) {
  InputSpec s{{n}, InputSpec::Values::labels};
  s.classes = classes;
  s.fixed_dtype = DType::i64;
  return s;
}
inline InputSpec fixed(Shape shape, DType dtype, InputSpec::Values values = InputSpec::Values::zeros) {
  InputSpec s{std::move(shape), values};
  s.fixed_dtype = dtype;
  return s;
}

using Tensors = std::vector<Tensor>;

struct OpCase {
  std::string name;  // "conv2d 3x3 stride 2 pad 1 groups 2"
  std::vector<InputSpec> inputs;
  // Runs the op on `backend` with fresh copies of the inputs (on its device; in-place ops may change
  // them) and returns what the backends must agree on.
  std::function<Tensors(Backend&, Tensors&)> run;
  // When the case has a backward: d(sum(run(...)[0] * seed)) / d inputs[i] for each i in
  // `differentiable`, computed with the backend's kernels; checked against finite differences.
  std::function<Tensors(Backend&, Tensors&, const Tensor& seed)> gradient;
  std::vector<int> differentiable;
  // Device runs: these dtypes (the CPU reference always runs in f64 on the same rounded values), each
  // also in channels-last when `channels_last`.
  std::vector<DType> device_dtypes = {DType::f32};
  bool channels_last = false;
  // Relative tolerance of a device run in f32, scaled by the largest expected magnitude of each output;
  // half dtypes get their own (op_cases.cpp).
  double rtol_f32 = 1e-5;
  // Replaces the elementwise comparison for outputs that only agree in distribution (dropout's mask).
  std::function<std::string(const Tensors& reference, const Tensors& device)> compare;
};

// Convolution and pooling parameters in one call, for the table and the older kernel tests alike.
inline Conv2dParams conv_params(int stride, int pad, int dilation = 1, int groups = 1) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}
inline Pool2dParams pool_params(int kernel, int stride, int pad = 0, bool ceil_mode = false,
                                bool count_include_pad = true) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = kernel;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  return p;
}

// Every case of the table, in a fixed order.
std::vector<OpCase> all_op_cases();

// The families, one file each.
std::vector<OpCase> elementwise_cases();
std::vector<OpCase> reduction_cases();
std::vector<OpCase> conv_matmul_cases();
std::vector<OpCase> pool_cases();
std::vector<OpCase> batch_norm_cases();
std::vector<OpCase> loss_optim_cases();
std::vector<OpCase> layerwise_optim_cases();
std::vector<OpCase> transformer_cases();
std::vector<OpCase> soft_target_cases();

// The case's inputs, drawn from `seed` in f64 (fixed dtypes as given), on the host.
Tensors make_inputs(const OpCase& c, uint64_t seed);

// Fresh copies of `inputs` on `device`: floating inputs in `dtype` (the others keep theirs), images in
// `format`.
Tensors copies_on(const OpCase& c, const Tensors& inputs, Device device, DType dtype, MemoryFormat format);

// The finite-difference check on the CPU in f64: "" or what differs (the worst element).
std::string check_gradients(const OpCase& c, uint64_t seed);

// The case on `device` in `dtype` and `format` against the CPU in f64 on the same (rounded) values:
// "" or what differs.
std::string check_on_device(const OpCase& c, Device device, DType dtype, MemoryFormat format, uint64_t seed);

// A gtest name for the case at `index` of all_op_cases(): its index and name in letters, digits and _.
std::string case_test_name(const ::testing::TestParamInfo<size_t>& info);

// The Backend virtuals named in nn/backend.h (the file at `path`), in order.
std::vector<std::string> backend_virtuals(const std::string& path);

// The virtuals the cases call when run on the CPU backend, recorded by a forwarding backend.
std::vector<std::string> virtuals_run_by_cases();

}  // namespace trainer::op_cases
