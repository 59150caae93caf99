#include "nn/modules/multihead_attention.h"

#include <stdexcept>
#include <string>

#include "nn/functional.h"

namespace trainer {

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, Generator& gen)
    : embed_dim_(embed_dim), num_heads_(num_heads) {
  if (embed_dim <= 0 || num_heads <= 0 || embed_dim % num_heads != 0)
    throw std::invalid_argument("MultiheadAttention(" + std::to_string(embed_dim) + ", " +
                                std::to_string(num_heads) +
                                "): embed_dim must be a positive multiple of num_heads");
  in_proj_weight_ = register_parameter("in_proj_weight", Tensor::empty({3 * embed_dim, embed_dim}));
  in_proj_bias_ = register_parameter("in_proj_bias", Tensor::empty({3 * embed_dim}));
  // PyTorch registers out_proj after its own parameters, so it follows them in the state dict.
  out_proj_ = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, true, gen));
  reset_parameters(gen);
}

void MultiheadAttention::reset_parameters(Generator& gen) {
  // The packed [3D, D] weight's fans are those of the whole matrix, as in PyTorch (not of q, k, v).
  init::xavier_uniform_(in_proj_weight_.data(), gen);
  init::zeros_(in_proj_bias_.data());
  out_proj_->reset_parameters(gen);
  init::zeros_(out_proj_->bias().data());
}

Variable MultiheadAttention::forward(const Variable& x) {
  if (x.dim() != 3 || x.size(2) != embed_dim_)
    throw std::invalid_argument("MultiheadAttention(" + std::to_string(embed_dim_) + ", " +
                                std::to_string(num_heads_) + ") expects input [N, T, " +
                                std::to_string(embed_dim_) + "], got " + shape_str(x.shape()));
  const int64_t n = x.size(0), t = x.size(1), d = embed_dim_, h = num_heads_, hd = d / h;
  // The tokens of every sample are the rows of one GEMM.
  const Variable qkv =
      F::reshape(F::linear(F::reshape(x, {n * t, d}), in_proj_weight_, in_proj_bias_), {n, t, 3, h, hd});
  // [N, T, H, hd]: q, k and v are read from qkv in place and, on the fused path, the heads come back
  // side by side in memory, so joining them below is a view.
  const Variable attended = F::packed_self_attention(qkv);
  const Variable joined = F::reshape(attended, {n * t, d});  // heads side by side
  return F::reshape(out_proj_->forward(joined), {n, t, d});
}

}  // namespace trainer
