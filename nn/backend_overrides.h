#pragma once
// The override declarations of every Backend kernel, shared by the CPU and CUDA backend classes so
// the list exists once: a new kernel is added to nn/backend.h and here.

#define TRAINER_BACKEND_OVERRIDES                                                                            \
  void copy(Tensor& dst, const Tensor& src) override;                                                        \
  void fill(Tensor& dst, double value) override;                                                             \
  Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) override;                                     \
  Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first) override;                  \
  Tensor unary(UnaryOp op, const Tensor& a) override;                                                        \
  Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) override;          \
  void axpy(Tensor& dst, const Tensor& src, double alpha) override;                                          \
  Tensor relu_backward_of_sum(const Tensor& a, const Tensor& b, const Tensor& relu_out) override;            \
  void scale(Tensor& dst, double alpha) override;                                                            \
  void add_to_counter(Tensor& counter, int64_t amount) override;                                             \
  Tensor sum(const Tensor& a, const std::vector<int>& dims, bool keepdim) override;                          \
  Tensor broadcast_to(const Tensor& a, const Shape& shape) override;                                         \
  bool all_finite(const Tensor& a) override;                                                                 \
  void scale_and_flag_nonfinite(Tensor& dst, double alpha, Tensor& flag) override;                           \
  void unscale_and_flag_nonfinite(Tensor& dst, const Tensor& scale, Tensor& flag) override;                  \
  void update_loss_scale(Tensor& scale, Tensor& tracker, Tensor& skipped, Tensor& flag,                      \
                         const LossScaleRule& rule) override;                                                \
  Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) override;                      \
  Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) override;                         \
  Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) override;       \
  Tensor conv2d_backward_input(const Tensor& grad_y, const Tensor& w, const Shape& x_shape,                  \
                               const Conv2dParams& p) override;                                              \
  Tensor conv2d_backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,                 \
                                const Conv2dParams& p) override;                                             \
  std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dParams& p) override;                     \
  Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Shape& x_shape,              \
                             const Pool2dParams& p) override;                                                \
  Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p) override;                                        \
  Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p) override;    \
  Tensor global_avg_pool(const Tensor& x) override;                                                          \
  Tensor global_avg_pool_backward(const Tensor& grad_y, const Shape& x_shape, MemoryFormat format) override; \
  std::pair<Tensor, Tensor> bn_mean_var(const Tensor& x) override;                                           \
  std::pair<Tensor, Tensor> bn_train_stats(const Tensor& x, double eps, double momentum,                     \
                                           Tensor& running_mean, Tensor& running_var) override;              \
  Tensor bn_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,            \
                  const Tensor& beta, const BnEpilogue& epilogue) override;                                  \
  std::pair<Tensor, Tensor> bn_backward_reduce(const Tensor& grad_y, const Tensor& x, const Tensor& mean,    \
                                               const Tensor& invstd, const Tensor& relu_out) override;       \
  Tensor bn_backward_input(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,  \
                           const Tensor& gamma, const Tensor& sum_dy, const Tensor& sum_dy_xhat,             \
                           int64_t count, const Tensor& relu_out) override;                                  \
  void sync_bn_local_stats(const Tensor& x, Tensor& packed) override;                                        \
  std::pair<Tensor, Tensor> sync_bn_global_stats(const Tensor& packed, DType stats, double eps,              \
                                                 double momentum, Tensor& running_mean, Tensor& running_var) \
      override;                                                                                              \
  std::pair<Tensor, Tensor> sync_bn_local_grad_sums(const Tensor& grad_y, const Tensor& x,                   \
                                                    const Tensor& mean, const Tensor& invstd,                \
                                                    const Tensor& global_stats, Tensor& packed) override;    \
  LayerNormForward layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& gamma,                 \
                              const Tensor& beta, double eps, DType y_dtype) override;                       \
  LayerNormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean,              \
                                     const Tensor& rstd, const Tensor& gamma) override;                      \
  Tensor softmax(const Tensor& x) override;                                                                  \
  Tensor softmax_backward(const Tensor& grad_y, const Tensor& y) override;                                   \
  std::pair<Tensor, Tensor> cross_entropy(const Tensor& logits, const Tensor& targets,                       \
                                          double label_smoothing) override;                                  \
  Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs, const Tensor& targets,         \
                                double label_smoothing) override;                                            \
  Tensor topk_correct(const Tensor& logits, const Tensor& targets, int k) override;                          \
  Tensor argmax(const Tensor& logits) override;                                                              \
  std::pair<Tensor, Tensor> soft_cross_entropy(const Tensor& logits, const Tensor& targets) override;        \
  Tensor soft_cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs, const Tensor& targets)    \
      override;                                                                                              \
  Tensor bce_with_logits(const Tensor& logits, const Tensor& targets) override;                              \
  Tensor bce_with_logits_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets)      \
      override;                                                                                              \
  Tensor mix_images(const Tensor& images, const Tensor& draws) override;                                     \
  Tensor mix_targets(const Tensor& labels, int64_t classes, double label_smoothing, const Tensor& draws,     \
                     DType dtype) override;                                                                  \
  Tensor dropout_mask(const Shape& shape, double p, DType dtype, Generator& gen) override;                   \
  void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,                 \
                const SgdParams& p) override;                                                                \
  void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,                    \
                  const AdamWParams& p) override;                                                            \
  void count_updates(Tensor& counts, const std::vector<int64_t>& rows, const int64_t* skip_if) override;     \
  void ema_update(const std::vector<EmaPair>& pairs, Tensor& updates, const EmaParams& p) override;          \
  void add_squared_norms(const std::vector<const Tensor*>& tensors, Tensor& out) override;                   \
  void clip_by_total_norm(const std::vector<Tensor*>& tensors, double max_norm, Tensor& norm_out) override;  \
  void lamb_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,                     \
                 const LambParams& p) override;                                                              \
  void lars_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,                \
                 const LarsParams& p) override;
