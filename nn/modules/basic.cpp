#include "nn/modules/basic.h"

#include "nn/functional.h"

namespace trainer {

Variable ReLU::forward(const Variable& x) { return F::relu(x); }

Variable GELU::forward(const Variable& x) { return F::gelu(x, approximate_); }

Variable Flatten::forward(const Variable& x) { return F::flatten(x, start_dim_); }

Variable Permute::forward(const Variable& x) { return F::permute(x, order_); }

}  // namespace trainer
