#pragma once
// Layer normalisation with a weight [C] (ones) and a bias [C] (zeros) when elementwise_affine, as
// torch.nn.LayerNorm(C) -- over the last dimension of [..., C] (a transformer's tokens) -- or, with
// LayerNormOver::channels, over C of an [N, C, H, W] batch, as torchvision's ConvNeXt LayerNorm2d
// (which permutes to NHWC, normalises the last dimension and permutes back). The parameter names
// match torchvision's, so state dicts load unchanged.
#include <cstdint>
#include <optional>

#include "nn/modules/module.h"

namespace trainer {

enum class LayerNormOver : uint8_t { last_dim, channels };

class LayerNorm : public Module {
 public:
  // torch.nn.LayerNorm's default eps; torchvision's ViT and ConvNeXt pass 1e-6.
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true,
                     LayerNormOver over = LayerNormOver::last_dim);
  // last_dim: [..., C] -> same, in any layout (a layout other than contiguous is copied first).
  // channels: [N, C, H, W] -> same in channels-last memory, where the channels of a pixel are adjacent
  // and normalising them needs no permute; a contiguous input is converted once (a channels-last
  // network never is).
  Variable forward(const Variable& x) override;
  // A pre-norm transformer's residual join and this norm: {h, forward(h)} with h = x + branch (branch of
  // x's shape). One pass where the backend fuses them (F::add_layer_norm): over the last dimension of
  // contiguous tensors with branch no wider than x (the f32 residual stream and a block's half output).
  std::pair<Variable, Variable> forward_after_add(const Variable& x, const Variable& branch);
  void reset_parameters();  // weight 1, bias 0
  // The model's promise that this norm's output feeds only autocast's matmuls (a transformer's
  // linears and attention projections), which round it to their half dtype: under autocast an f32
  // input's output is then stored in that dtype by the norm's kernel, the same numbers PyTorch
  // computes, without the f32 store and the cast pass that reads it again.
  void set_output_feeds_matmuls(bool feeds) { output_feeds_matmuls_ = feeds; }

  int64_t normalized_size() const { return normalized_size_; }
  double eps() const { return eps_; }
  LayerNormOver over() const { return over_; }
  Variable& weight() { return weight_; }  // undefined without elementwise_affine
  Variable& bias() { return bias_; }

 private:
  int64_t normalized_size_;
  double eps_;
  LayerNormOver over_;
  bool output_feeds_matmuls_ = false;

  std::optional<DType> output_dtype(const Variable& x) const;
  Variable weight_, bias_;
};

}  // namespace trainer
