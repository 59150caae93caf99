#include "bench/cudnn/conv_prologue_probe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "bench/cudnn/conv_prologue_graph.h"
#include "bench/cudnn/relative_difference.h"
#include "nn/cuda/conv_geometry.h"
#include "nn/cuda/cuda_common.h"
#include "nn/random.h"

namespace trainer::bench {

using namespace cuda;
using namespace cuda::conv_stats;

std::vector<ConvProbeRow> probe_conv_prologue_fusion(DType dtype, const Shape& xs, const Shape& ws,
                                                     const Conv2dParams& p) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    throw std::invalid_argument("probe_conv_prologue_fusion: bf16 or f16, got " +
                                std::string(dtype_name(dtype)));
  const Device dev = current_device();
  const MemoryFormat cl = MemoryFormat::channels_last;
  const Shape ys = cudnn_conv::check_geometry("probe_conv_prologue_fusion", xs, ws, p);
  const int64_t C = xs[1];
  Generator gen(1);
  // The BatchNorm's input (a convolution's output, roughly centred) and its statistics and affine
  // parameters; scale and bias are what bn_apply computes from them per channel.
  Tensor x = Tensor::empty(xs, dtype, dev, cl), w = Tensor::empty(ws, dtype, dev, cl);
  normal_(x, 0.1, 1.0, gen);
  normal_(w, 0.0, 0.05, gen);
  Tensor mean = Tensor::empty({C}, DType::f64), invstd = Tensor::empty({C}, DType::f64),
         gamma = Tensor::empty({C}, DType::f64), beta = Tensor::empty({C}, DType::f64);
  uniform_(mean, -0.2, 0.2, gen);
  uniform_(invstd, 0.8, 1.2, gen);
  uniform_(gamma, 0.5, 1.5, gen);
  uniform_(beta, -0.3, 0.3, gen);
  std::vector<float> scale_h(C), bias_h(C);
  for (int64_t c = 0; c < C; ++c) {
    const double s = invstd.data<double>()[c] * gamma.data<double>()[c];
    scale_h[c] = static_cast<float>(s);
    bias_h[c] = static_cast<float>(beta.data<double>()[c] - mean.data<double>()[c] * s);
  }
  auto f32_on_device = [&](const Tensor& t) { return t.to(DType::f32).to(dev); };
  const Tensor mean_d = f32_on_device(mean), invstd_d = f32_on_device(invstd), gamma_d = f32_on_device(gamma),
               beta_d = f32_on_device(beta);
  Tensor scale32 = Tensor::from_vector<float>(scale_h, {1, C, 1, 1}).to(dev),
         bias32 = Tensor::from_vector<float>(bias_h, {1, C, 1, 1}).to(dev);
  Tensor scale16 = scale32.to(dtype), bias16 = bias32.to(dtype);
  Tensor a = Tensor::empty(xs, dtype, dev, cl);  // relu(x * scale + bias), ours, as the convolution's input
  Tensor y = Tensor::empty(ys, dtype, dev, cl), y_fused = Tensor::empty(ys, dtype, dev, cl);
  Tensor sum = Tensor::zeros({ys[1]}, DType::f32, dev), sqsum = Tensor::zeros({ys[1]}, DType::f32, dev);
  Backend& k = backend_for(x);
  const BnEpilogue relu{Tensor(), true};

  std::vector<ConvProbeRow> rows;
  std::optional<RunnablePlan> conv;
  rows.push_back(probe_engines(build(Pattern::conv, cuda_context().cudnn, dtype, xs, ws, ys, p), "conv alone",
                               pack_uids(Pattern::conv),
                               {{kX, a.raw_data()}, {kW, w.raw_data()}, {kY, y.raw_data()}}, conv));
  if (!conv) return rows;
  rows.push_back(timed_row("ours: bn_apply (scale, bias, ReLU), then conv", [&] {
    k.bn_apply(x, mean_d, invstd_d, gamma_d, beta_d, relu);  // the same traffic as writing into a
    return conv->execute();
  }));
  rows.push_back(timed_row("ours: bn_apply, conv, bn_mean_var", [&] {
    k.bn_apply(x, mean_d, invstd_d, gamma_d, beta_d, relu);
    if (!conv->execute()) return false;
    k.bn_mean_var(y);
    return true;
  }));
  // Ours, for the comparison: a = bn_apply(x), y = conv(a).
  a.copy_(k.bn_apply(x, mean_d, invstd_d, gamma_d, beta_d, relu));
  if (!conv->execute()) return rows;
  for (const bool genstats : {false, true}) {
    for (const bool half_coefficients : {false, true}) {
      const Tensor& sc = half_coefficients ? scale16 : scale32;
      const Tensor& bi = half_coefficients ? bias16 : bias32;
      const std::string name = std::string("fused: scale, bias, ReLU -> conv") +
                               (genstats ? " + genstats" : "") +
                               (half_coefficients ? " (half coefficients)" : " (f32 coefficients)");
      std::optional<RunnablePlan> fused;
      ConvProbeRow row = probe_engines(
          build_prologue(cuda_context().cudnn, dtype,
                         half_coefficients ? (dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF)
                                           : CUDNN_DATA_FLOAT,
                         xs, ws, ys, p, genstats),
          name.c_str(), prologue_pack_uids(genstats),
          {{kX, x.raw_data()},
           {kScale, sc.raw_data()},
           {kBias, bi.raw_data()},
           {kW, w.raw_data()},
           {kY, y_fused.raw_data()},
           {kSum, sum.raw_data()},
           {kSqSum, sqsum.raw_data()}},
          fused);
      if (fused && fused->execute()) {
        char note[96];
        std::snprintf(note, sizeof note, "; output vs ours: %.1e of max |y|",
                      relative_difference(y_fused, y));
        row.note += note;
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace trainer::bench
