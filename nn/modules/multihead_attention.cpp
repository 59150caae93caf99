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
  auto heads_of = [&](int64_t which) {  // q, k or v as [N, H, T, hd]
    return F::permute(F::reshape(F::slice(qkv, 2, which, which + 1), {n, t, h, hd}), {0, 2, 1, 3});
  };
  const Variable attended = F::scaled_dot_product_attention(heads_of(0), heads_of(1), heads_of(2));
  const Variable joined = F::reshape(F::permute(attended, {0, 2, 1, 3}), {n * t, d});  // heads side by side
  return F::reshape(out_proj_->forward(joined), {n, t, d});
}

}  // namespace trainer
