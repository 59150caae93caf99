#pragma once
// Multi-head self-attention as torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
// called as attn(x, x, x, need_weights=False), which is how torchvision's ViT uses it: one packed
// projection in_proj_weight [3D, D] / in_proj_bias [3D] (q, k, v stacked in that order), the heads'
// outputs joined and projected by out_proj (a Linear [D, D]). Parameter names and order equal
// PyTorch's, so state dicts load unchanged. No attention dropout, mask or separate k/v widths
// (torchvision's ViT uses none).
#include <cstdint>
#include <memory>

#include "nn/init.h"
#include "nn/modules/linear.h"
#include "nn/modules/module.h"

namespace trainer {

class MultiheadAttention : public Module {
 public:
  // Initialised as PyTorch's _reset_parameters: in_proj_weight xavier_uniform, in_proj_bias 0,
  // out_proj.weight as a Linear's, out_proj.bias 0.
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, Generator& gen = init::default_generator());
  Variable forward(const Variable& x) override;  // [N, T, D] -> [N, T, D]
  void reset_parameters(Generator& gen);

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  Variable& in_proj_weight() { return in_proj_weight_; }
  Variable& in_proj_bias() { return in_proj_bias_; }
  Linear& out_proj() { return *out_proj_; }

 private:
  int64_t embed_dim_, num_heads_;
  Variable in_proj_weight_, in_proj_bias_;
  std::shared_ptr<Linear> out_proj_;
};

}  // namespace trainer
