#include "recording_backend.h"

namespace trainer::op_cases {

void RecordingBackend::copy(Tensor& dst, const Tensor& src) {
  called_.insert("copy");
  inner_.copy(dst, src);
}

void RecordingBackend::fill(Tensor& dst, double value) {
  called_.insert("fill");
  inner_.fill(dst, value);
}

Tensor RecordingBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  called_.insert("binary");
  return inner_.binary(op, a, b);
}

Tensor RecordingBackend::binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first) {
  called_.insert("binary_scalar");
  return inner_.binary_scalar(op, a, s, scalar_first);
}

Tensor RecordingBackend::unary(UnaryOp op, const Tensor& a) {
  called_.insert("unary");
  return inner_.unary(op, a);
}

Tensor RecordingBackend::unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  called_.insert("unary_backward");
  return inner_.unary_backward(op, grad, x, y);
}

void RecordingBackend::axpy(Tensor& dst, const Tensor& src, double alpha) {
  called_.insert("axpy");
  inner_.axpy(dst, src, alpha);
}

Tensor RecordingBackend::relu_backward_of_sum(const Tensor& a, const Tensor& b, const Tensor& relu_out) {
  called_.insert("relu_backward_of_sum");
  return inner_.relu_backward_of_sum(a, b, relu_out);
}

void RecordingBackend::scale(Tensor& dst, double alpha) {
  called_.insert("scale");
  inner_.scale(dst, alpha);
}

void RecordingBackend::add_to_counter(Tensor& counter, int64_t amount) {
  called_.insert("add_to_counter");
  inner_.add_to_counter(counter, amount);
}

Tensor RecordingBackend::sum(const Tensor& a, const std::vector<int>& dims, bool keepdim) {
  called_.insert("sum");
  return inner_.sum(a, dims, keepdim);
}

Tensor RecordingBackend::broadcast_to(const Tensor& a, const Shape& shape) {
  called_.insert("broadcast_to");
  return inner_.broadcast_to(a, shape);
}

bool RecordingBackend::all_finite(const Tensor& a) {
  called_.insert("all_finite");
  return inner_.all_finite(a);
}

void RecordingBackend::scale_and_flag_nonfinite(Tensor& dst, double alpha, Tensor& flag) {
  called_.insert("scale_and_flag_nonfinite");
  inner_.scale_and_flag_nonfinite(dst, alpha, flag);
}

void RecordingBackend::unscale_and_flag_nonfinite(Tensor& dst, const Tensor& scale, Tensor& flag) {
  called_.insert("unscale_and_flag_nonfinite");
  inner_.unscale_and_flag_nonfinite(dst, scale, flag);
}

void RecordingBackend::update_loss_scale(Tensor& scale, Tensor& tracker, Tensor& skipped, Tensor& flag,
                                         const LossScaleRule& rule) {
  called_.insert("update_loss_scale");
  inner_.update_loss_scale(scale, tracker, skipped, flag, rule);
}

Tensor RecordingBackend::matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  called_.insert("matmul");
  return inner_.matmul(a, b, trans_a, trans_b);
}

std::optional<Tensor> RecordingBackend::linear_fused(const Tensor& x, const Tensor& w, const Tensor& bias) {
  called_.insert("linear_fused");
  return inner_.linear_fused(x, w, bias);
}

std::optional<std::pair<Tensor, Tensor>> RecordingBackend::linear_weight_grads_fused(const Tensor& g,
                                                                                     const Tensor& x) {
  called_.insert("linear_weight_grads_fused");
  return inner_.linear_weight_grads_fused(g, x);
}
Tensor RecordingBackend::bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  called_.insert("bmm");
  return inner_.bmm(a, b, trans_a, trans_b);
}

Tensor RecordingBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  called_.insert("conv2d");
  return inner_.conv2d(x, w, bias, p);
}

Tensor RecordingBackend::conv2d_backward_input(const Tensor& grad_y, const Tensor& w, const Shape& x_shape,
                                               const Conv2dParams& p) {
  called_.insert("conv2d_backward_input");
  return inner_.conv2d_backward_input(grad_y, w, x_shape, p);
}

Tensor RecordingBackend::conv2d_backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,
                                                const Conv2dParams& p) {
  called_.insert("conv2d_backward_weight");
  return inner_.conv2d_backward_weight(grad_y, x, w_shape, p);
}

std::pair<Tensor, Tensor> RecordingBackend::max_pool2d(const Tensor& x, const Pool2dParams& p) {
  called_.insert("max_pool2d");
  return inner_.max_pool2d(x, p);
}

Tensor RecordingBackend::max_pool2d_backward(const Tensor& grad_y, const Tensor& indices,
                                             const Shape& x_shape, const Pool2dParams& p) {
  called_.insert("max_pool2d_backward");
  return inner_.max_pool2d_backward(grad_y, indices, x_shape, p);
}

Tensor RecordingBackend::avg_pool2d(const Tensor& x, const Pool2dParams& p) {
  called_.insert("avg_pool2d");
  return inner_.avg_pool2d(x, p);
}

Tensor RecordingBackend::avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape,
                                             const Pool2dParams& p) {
  called_.insert("avg_pool2d_backward");
  return inner_.avg_pool2d_backward(grad_y, x_shape, p);
}

Tensor RecordingBackend::global_avg_pool(const Tensor& x) {
  called_.insert("global_avg_pool");
  return inner_.global_avg_pool(x);
}

Tensor RecordingBackend::global_avg_pool_backward(const Tensor& grad_y, const Shape& x_shape,
                                                  MemoryFormat format) {
  called_.insert("global_avg_pool_backward");
  return inner_.global_avg_pool_backward(grad_y, x_shape, format);
}

std::pair<Tensor, Tensor> RecordingBackend::bn_mean_var(const Tensor& x) {
  called_.insert("bn_mean_var");
  return inner_.bn_mean_var(x);
}

std::pair<Tensor, Tensor> RecordingBackend::bn_train_stats(const Tensor& x, double eps, double momentum,
                                                           Tensor& running_mean, Tensor& running_var) {
  called_.insert("bn_train_stats");
  return inner_.bn_train_stats(x, eps, momentum, running_mean, running_var);
}

Tensor RecordingBackend::bn_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                  const Tensor& gamma, const Tensor& beta, const BnEpilogue& epilogue) {
  called_.insert("bn_apply");
  return inner_.bn_apply(x, mean, invstd, gamma, beta, epilogue);
}

std::pair<Tensor, Tensor> RecordingBackend::bn_backward_reduce(const Tensor& grad_y, const Tensor& x,
                                                               const Tensor& mean, const Tensor& invstd,
                                                               const Tensor& relu_out) {
  called_.insert("bn_backward_reduce");
  return inner_.bn_backward_reduce(grad_y, x, mean, invstd, relu_out);
}

Tensor RecordingBackend::bn_backward_input(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                           const Tensor& invstd, const Tensor& gamma, const Tensor& sum_dy,
                                           const Tensor& sum_dy_xhat, int64_t count, const Tensor& relu_out) {
  called_.insert("bn_backward_input");
  return inner_.bn_backward_input(grad_y, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, relu_out);
}

std::optional<BnGrads> RecordingBackend::bn_backward_fused(const Tensor& grad_y, const Tensor& x,
                                                           const Tensor& mean, const Tensor& invstd,
                                                           const Tensor& gamma, const Tensor& beta,
                                                           const Tensor& relu_out, double eps) {
  called_.insert("bn_backward_fused");
  return inner_.bn_backward_fused(grad_y, x, mean, invstd, gamma, beta, relu_out, eps);
}

std::optional<BnForward> RecordingBackend::bn_forward_fused(const Tensor& x, const Tensor& gamma,
                                                            const Tensor& beta, Tensor& running_mean,
                                                            Tensor& running_var, double momentum, double eps,
                                                            const BnEpilogue& epilogue) {
  called_.insert("bn_forward_fused");
  return inner_.bn_forward_fused(x, gamma, beta, running_mean, running_var, momentum, eps, epilogue);
}

std::optional<std::pair<Tensor, Tensor>> RecordingBackend::conv2d_weight_and_bias_grads_fused(
    const Tensor& grad_y, const Tensor& x, const Shape& w_shape, const Conv2dParams& p) {
  called_.insert("conv2d_weight_and_bias_grads_fused");
  return inner_.conv2d_weight_and_bias_grads_fused(grad_y, x, w_shape, p);
}

std::optional<Tensor> RecordingBackend::scaled_residual_add(const Tensor& x, const Tensor& h,
                                                            const Tensor& scale, const Tensor& keep) {
  called_.insert("scaled_residual_add");
  return inner_.scaled_residual_add(x, h, scale, keep);
}

std::optional<std::pair<Tensor, Tensor>> RecordingBackend::scaled_residual_add_backward(const Tensor& grad_y,
                                                                                        const Tensor& h,
                                                                                        const Tensor& scale,
                                                                                        const Tensor& keep) {
  called_.insert("scaled_residual_add_backward");
  return inner_.scaled_residual_add_backward(grad_y, h, scale, keep);
}

std::optional<AttentionForward> RecordingBackend::fused_attention(const Tensor& q, const Tensor& k,
                                                                  const Tensor& v, double scale) {
  called_.insert("fused_attention");
  return inner_.fused_attention(q, k, v, scale);
}

std::optional<AttentionGrads> RecordingBackend::fused_attention_backward(const Tensor& grad_out,
                                                                         const Tensor& q, const Tensor& k,
                                                                         const Tensor& v, const Tensor& out,
                                                                         const Tensor& stats, double scale) {
  called_.insert("fused_attention_backward");
  return inner_.fused_attention_backward(grad_out, q, k, v, out, stats, scale);
}

void RecordingBackend::sync_bn_local_stats(const Tensor& x, Tensor& packed) {
  called_.insert("sync_bn_local_stats");
  inner_.sync_bn_local_stats(x, packed);
}

std::pair<Tensor, Tensor> RecordingBackend::sync_bn_global_stats(const Tensor& packed, DType stats,
                                                                 double eps, double momentum,
                                                                 Tensor& running_mean, Tensor& running_var) {
  called_.insert("sync_bn_global_stats");
  return inner_.sync_bn_global_stats(packed, stats, eps, momentum, running_mean, running_var);
}

std::pair<Tensor, Tensor> RecordingBackend::sync_bn_local_grad_sums(const Tensor& grad_y, const Tensor& x,
                                                                    const Tensor& mean, const Tensor& invstd,
                                                                    const Tensor& global_stats,
                                                                    Tensor& packed) {
  called_.insert("sync_bn_local_grad_sums");
  return inner_.sync_bn_local_grad_sums(grad_y, x, mean, invstd, global_stats, packed);
}

LayerNormForward RecordingBackend::layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& gamma,
                                              const Tensor& beta, double eps, DType y_dtype) {
  called_.insert("layer_norm");
  return inner_.layer_norm(x, normalized_size, gamma, beta, eps, y_dtype);
}

LayerNormGrads RecordingBackend::layer_norm_backward(const Tensor& grad_y, const Tensor& x,
                                                     const Tensor& mean, const Tensor& rstd,
                                                     const Tensor& gamma) {
  called_.insert("layer_norm_backward");
  return inner_.layer_norm_backward(grad_y, x, mean, rstd, gamma);
}

std::optional<AddLayerNormForward> RecordingBackend::add_layer_norm(const Tensor& x, const Tensor& branch,
                                                                    int64_t normalized_size,
                                                                    const Tensor& gamma, const Tensor& beta,
                                                                    double eps, DType y_dtype) {
  called_.insert("add_layer_norm");
  return inner_.add_layer_norm(x, branch, normalized_size, gamma, beta, eps, y_dtype);
}

std::optional<AddLayerNormGrads> RecordingBackend::add_layer_norm_backward(
    const Tensor& grad_y, const Tensor& grad_h_in, const Tensor& h, const Tensor& mean, const Tensor& rstd,
    const Tensor& gamma, DType branch_dtype) {
  called_.insert("add_layer_norm_backward");
  return inner_.add_layer_norm_backward(grad_y, grad_h_in, h, mean, rstd, gamma, branch_dtype);
}

Tensor RecordingBackend::softmax(const Tensor& x) {
  called_.insert("softmax");
  return inner_.softmax(x);
}

Tensor RecordingBackend::softmax_backward(const Tensor& grad_y, const Tensor& y) {
  called_.insert("softmax_backward");
  return inner_.softmax_backward(grad_y, y);
}

std::pair<Tensor, Tensor> RecordingBackend::cross_entropy(const Tensor& logits, const Tensor& targets,
                                                          double label_smoothing) {
  called_.insert("cross_entropy");
  return inner_.cross_entropy(logits, targets, label_smoothing);
}

Tensor RecordingBackend::cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs,
                                                const Tensor& targets, double label_smoothing) {
  called_.insert("cross_entropy_backward");
  return inner_.cross_entropy_backward(grad_loss, probs, targets, label_smoothing);
}

Tensor RecordingBackend::topk_correct(const Tensor& logits, const Tensor& targets, int k) {
  called_.insert("topk_correct");
  return inner_.topk_correct(logits, targets, k);
}

Tensor RecordingBackend::argmax(const Tensor& logits) {
  called_.insert("argmax");
  return inner_.argmax(logits);
}

Tensor RecordingBackend::dropout_mask(const Shape& shape, double p, DType dtype, Generator& gen) {
  called_.insert("dropout_mask");
  return inner_.dropout_mask(shape, p, dtype, gen);
}

std::pair<Tensor, Tensor> RecordingBackend::soft_cross_entropy(const Tensor& logits, const Tensor& targets) {
  called_.insert("soft_cross_entropy");
  return inner_.soft_cross_entropy(logits, targets);
}

Tensor RecordingBackend::soft_cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs,
                                                     const Tensor& targets) {
  called_.insert("soft_cross_entropy_backward");
  return inner_.soft_cross_entropy_backward(grad_loss, probs, targets);
}

Tensor RecordingBackend::bce_with_logits(const Tensor& logits, const Tensor& targets) {
  called_.insert("bce_with_logits");
  return inner_.bce_with_logits(logits, targets);
}

Tensor RecordingBackend::bce_with_logits_backward(const Tensor& grad_loss, const Tensor& logits,
                                                  const Tensor& targets) {
  called_.insert("bce_with_logits_backward");
  return inner_.bce_with_logits_backward(grad_loss, logits, targets);
}

Tensor RecordingBackend::mix_images(const Tensor& images, const Tensor& draws) {
  called_.insert("mix_images");
  return inner_.mix_images(images, draws);
}

Tensor RecordingBackend::mix_targets(const Tensor& labels, int64_t classes, double label_smoothing,
                                     const Tensor& draws, DType dtype) {
  called_.insert("mix_targets");
  return inner_.mix_targets(labels, classes, label_smoothing, draws, dtype);
}

void RecordingBackend::sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                                const SgdParams& p) {
  called_.insert("sgd_step");
  inner_.sgd_step(param, grad, momentum_buffer, first_step, p);
}

void RecordingBackend::adamw_step_many(const std::vector<AdamWUpdate>& updates, const AdamWParams& p) {
  called_.insert("adamw_step_many");
  inner_.adamw_step_many(updates, p);
}

void RecordingBackend::sgd_step_many(const std::vector<SgdUpdate>& updates, const SgdParams& p) {
  called_.insert("sgd_step_many");
  inner_.sgd_step_many(updates, p);
}

void RecordingBackend::adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                                  const AdamWParams& p) {
  called_.insert("adamw_step");
  inner_.adamw_step(param, grad, exp_avg, exp_avg_sq, p);
}

void RecordingBackend::count_updates(Tensor& counts, const std::vector<int64_t>& rows,
                                     const int64_t* skip_if) {
  called_.insert("count_updates");
  inner_.count_updates(counts, rows, skip_if);
}

void RecordingBackend::ema_update(const std::vector<EmaPair>& pairs, Tensor& updates, const EmaParams& p) {
  called_.insert("ema_update");
  inner_.ema_update(pairs, updates, p);
}

void RecordingBackend::add_squared_norms(const std::vector<const Tensor*>& tensors, Tensor& out) {
  called_.insert("add_squared_norms");
  inner_.add_squared_norms(tensors, out);
}

void RecordingBackend::clip_by_total_norm(const std::vector<Tensor*>& tensors, double max_norm,
                                          Tensor& norm_out) {
  called_.insert("clip_by_total_norm");
  inner_.clip_by_total_norm(tensors, max_norm, norm_out);
}

void RecordingBackend::lamb_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                                 const LambParams& p) {
  called_.insert("lamb_step");
  inner_.lamb_step(param, grad, exp_avg, exp_avg_sq, p);
}

void RecordingBackend::lars_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                                 const LarsParams& p) {
  called_.insert("lars_step");
  inner_.lars_step(param, grad, momentum_buffer, first_step, p);
}

}  // namespace trainer::op_cases
