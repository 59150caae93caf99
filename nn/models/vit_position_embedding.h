#pragma once
// A ViT's position embedding resized to another patch grid, as torchvision's
// vision_transformer.interpolate_embeddings does when weights trained at one image size load into a
// model for another (224 -> 384, or an ImageNet checkpoint into a 32x32 model): the class token's
// embedding is kept, and the g x g grid of every channel is resampled bicubically
// (torch.nn.functional.interpolate(mode="bicubic", align_corners=True): Keys' cubic convolution with
// A = -0.75, edge samples repeated past the border).
#include <cstdint>

#include "nn/tensor.h"

namespace trainer {

// pos [1, 1 + g*g, D] (class token first) -> [1, 1 + new_grid^2, D] in pos's dtype, on the host,
// computed in f64. A grid equal to g returns the values unchanged. Throws std::invalid_argument when
// pos is not of that form or new_grid < 1.
Tensor interpolate_position_embedding(const Tensor& pos, int64_t new_grid);

}  // namespace trainer
