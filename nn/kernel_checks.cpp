#include "nn/kernel_checks.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/amp/loss_scale_rule.h"

namespace trainer {

int64_t check_logits(const Tensor& logits, const char* op) {
  if (logits.dim() != 2)
    throw std::invalid_argument(std::string(op) + ": logits must be [N, K], got shape " +
                                shape_str(logits.shape()));
  if (logits.size(1) < 1) throw std::invalid_argument(std::string(op) + ": logits have no classes (K = 0)");
  return logits.size(1);
}

void check_targets_shape(const Tensor& targets, int64_t n, const char* op) {
  if (targets.dtype() != DType::i64)
    throw std::invalid_argument(std::string(op) + ": targets must be i64, got " +
                                std::string(dtype_name(targets.dtype())));
  if (targets.dim() != 1 || targets.size(0) != n)
    throw std::invalid_argument(std::string(op) + ": targets must have shape [" + std::to_string(n) +
                                "], got " + shape_str(targets.shape()));
}

Tensor host_targets_in_range(const Tensor& targets, int64_t n, int64_t k, const char* op) {
  check_targets_shape(targets, n, op);
  Tensor t = targets.to(Device::cpu()).contiguous();
  const int64_t* pt = t.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    if (pt[i] < 0 || pt[i] >= k)
      throw std::invalid_argument(std::string(op) + ": target " + std::to_string(pt[i]) + " of sample " +
                                  std::to_string(i) + " is outside [0, " + std::to_string(k) + ")");
  return t;
}

void check_label_smoothing(double eps, const char* op) {
  if (!(eps >= 0.0 && eps <= 1.0))
    throw std::invalid_argument(std::string(op) + ": label_smoothing must be in [0, 1], got " +
                                std::to_string(eps));
}

AdamWScalars adamw_scalars(const AdamWParams& p) {
  if (p.step < 1) throw std::invalid_argument("adamw_step: step is 1-based, got " + std::to_string(p.step));
  const double step = static_cast<double>(p.step);
  return {p.lr / (1.0 - std::pow(p.beta1, step)), std::sqrt(1.0 - std::pow(p.beta2, step))};
}

LambScalars lamb_scalars(const LambParams& p, int64_t step) {
  if (step < 1) throw std::invalid_argument("lamb_step: step is 1-based, got " + std::to_string(step));
  const double t = static_cast<double>(step);
  return {1.0 - std::pow(p.beta1, t), std::sqrt(1.0 - std::pow(p.beta2, t))};
}

void check_ema_update(const std::vector<Backend::EmaPair>& pairs, const Tensor& updates, Device device) {
  check_flag(updates, device, "ema_update (updates)");
  for (const Backend::EmaPair& pair : pairs) {
    const Tensor& a = *pair.average;
    const Tensor& v = *pair.value;
    const bool floating = a.dtype() == DType::f32 || a.dtype() == DType::f64;
    if (a.device() != device || v.device() != device || a.shape() != v.shape() || a.dtype() != v.dtype() ||
        !(floating || a.dtype() == DType::i64) || !a.is_contiguous(a.suggest_memory_format()) ||
        (a.strides() != v.strides() && a.numel() > 1))
      throw std::invalid_argument(
          "ema_update: the average " + a.str() + " and its value " + v.str() +
          " must be dense f32, f64 or i64 tensors of one shape, dtype and layout on " + device.str());
  }
}

void check_squared_norms(const std::vector<const Tensor*>& tensors, const Tensor& out, Device device) {
  if (out.dtype() != DType::f64 || out.numel() != 1 || out.device() != device)
    throw std::invalid_argument("add_squared_norms: out must be f64 [1] on " + device.str() + ", got " +
                                out.str());
  for (const Tensor* t : tensors)
    if (t->device() != device || (t->dtype() != DType::f32 && t->dtype() != DType::f64))
      throw std::invalid_argument("add_squared_norms: " + t->str() + " must be f32 or f64 on " +
                                  device.str());
}

void check_clip_by_total_norm(const std::vector<Tensor*>& tensors, double max_norm, const Tensor& norm_out,
                              Device device) {
  if (!std::isfinite(max_norm) || max_norm < 0.0)
    throw std::invalid_argument("clip_by_total_norm: max_norm must be finite and >= 0, got " +
                                std::to_string(max_norm));
  if (norm_out.dtype() != DType::f64 || norm_out.numel() != 1 || norm_out.device() != device)
    throw std::invalid_argument("clip_by_total_norm: norm_out must be f64 [1] on " + device.str() + ", got " +
                                norm_out.str());
  for (const Tensor* t : tensors)
    if (t->device() != device || (t->dtype() != DType::f32 && t->dtype() != DType::f64) ||
        !t->is_contiguous(t->suggest_memory_format()))
      throw std::invalid_argument("clip_by_total_norm: " + t->str() +
                                  " must be a dense f32 or f64 tensor on " + device.str());
}

void check_flag(const Tensor& flag, Device device, const char* op) {
  if (flag.dtype() != DType::i64 || flag.numel() != 1 || flag.device() != device)
    throw std::invalid_argument(std::string(op) + ": the flag must be i64 [1] on " + device.str() + ", got " +
                                std::string(dtype_name(flag.dtype())) + " " + shape_str(flag.shape()) +
                                " on " + flag.device().str());
}

void check_counter(const Tensor& counter, const char* op) {
  if (counter.dtype() != DType::i64 || counter.numel() != 1)
    throw std::invalid_argument(std::string(op) + ": the counter must be one i64 element, got " +
                                std::string(dtype_name(counter.dtype())) + " " + shape_str(counter.shape()));
}

void check_update_counts(const Tensor& counts, const std::vector<int64_t>& rows) {
  if (counts.dtype() != DType::i64 || counts.dim() != 1 || !counts.is_contiguous())
    throw std::invalid_argument("count_updates: counts must be a contiguous i64 vector, got " + counts.str());
  for (int64_t r : rows)
    if (r < 0 || r >= counts.numel())
      throw std::invalid_argument("count_updates: row " + std::to_string(r) + " outside " + counts.str());
}

void check_loss_scale(const Tensor& scale, Device device, const char* op) {
  if (scale.dtype() != DType::f32 || scale.numel() != 1 || scale.device() != device)
    throw std::invalid_argument(std::string(op) + ": the loss scale must be f32 [1] on " + device.str() +
                                ", got " + std::string(dtype_name(scale.dtype())) + " " +
                                shape_str(scale.shape()) + " on " + scale.device().str());
}

void check_loss_scale_state(const Tensor& scale, const Tensor& tracker, const Tensor& skipped,
                            const Tensor& flag, const LossScaleRule& rule, const char* op) {
  check_loss_scale(scale, scale.device(), op);
  check_flag(flag, scale.device(), op);
  check_counter(tracker, op);
  if (tracker.device() != scale.device() || skipped.device() != scale.device() ||
      skipped.dtype() != DType::f64 || skipped.numel() != 1)
    throw std::invalid_argument(std::string(op) + ": tracker (i64 [1]) and skipped (f64 [1]) must be on " +
                                scale.device().str() + ", got " + tracker.str() + " and " + skipped.str());
  if (!valid_loss_scale_rule(rule))
    throw std::invalid_argument(std::string(op) +
                                ": need growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1");
}

int64_t check_sync_bn_global_stats(const Tensor& packed, DType stats, const Tensor& running_mean,
                                   const Tensor& running_var) {
  const std::string op = "sync_bn_global_stats";
  if (!packed.defined() || packed.numel() % 2 != 1)
    throw std::invalid_argument(op + ": expected packed sums of 2C + 1 values, got " +
                                (packed.defined() ? shape_str(packed.shape()) : std::string("undefined")));
  if (stats != DType::f32 && stats != DType::f64)
    throw std::invalid_argument(op + ": statistics must be f32 or f64, got " +
                                std::string(dtype_name(stats)));
  if (running_mean.defined() != running_var.defined())
    throw std::invalid_argument(op + ": running_mean and running_var must be both defined or neither");
  return (packed.numel() - 1) / 2;
}

namespace {

std::string dtype_text(DType d) { return std::string(dtype_name(d)); }

void check_floating(const Tensor& t, const char* op, const char* name) {
  const DType d = t.dtype();
  if (d != DType::f32 && d != DType::f64 && !is_half(d))
    throw std::invalid_argument(std::string(op) + ": " + name + " must be floating, got " + dtype_text(d));
}

void check_layer_norm_parameter(const Tensor& p, const Tensor& x, int64_t normalized_size, const char* op,
                                const char* name) {
  if (!p.defined()) return;
  if (p.dim() != 1 || p.size(0) != normalized_size)
    throw std::invalid_argument(std::string(op) + ": " + name + " must have shape [" +
                                std::to_string(normalized_size) + "], got " + shape_str(p.shape()));
  const DType wide = accumulate_dtype(x.dtype());
  if (p.dtype() != x.dtype() && p.dtype() != wide)
    throw std::invalid_argument(std::string(op) + ": " + name + " must be " + dtype_text(x.dtype()) +
                                (wide != x.dtype() ? " or " + dtype_text(wide) : std::string()) +
                                " beside a " + dtype_text(x.dtype()) + " input, got " +
                                dtype_text(p.dtype()));
  if (p.device() != x.device())
    throw std::invalid_argument(std::string(op) + ": " + name + " is on another device than the input");
}

void check_row_statistic(const Tensor& s, const Tensor& x, int64_t rows, const char* op, const char* name) {
  if (s.numel() != rows || s.dtype() != accumulate_dtype(x.dtype()) || !s.is_contiguous() ||
      s.device() != x.device())
    throw std::invalid_argument(std::string(op) + ": " + name + " must be a contiguous " +
                                dtype_text(accumulate_dtype(x.dtype())) + " tensor of " +
                                std::to_string(rows) + " values on the input's device (layer_norm's), got " +
                                dtype_text(s.dtype()) + " " + shape_str(s.shape()));
}

}  // namespace

int64_t check_layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& gamma, const Tensor& beta,
                         const char* op) {
  check_floating(x, op, "input");
  if (!x.is_contiguous(x.suggest_memory_format()))
    throw std::invalid_argument(std::string(op) +
                                ": input must be dense (contiguous or channels-last), got " +
                                shape_str(x.shape()) + " with strides " + shape_str(x.strides()));
  if (normalized_size < 1 || x.numel() % normalized_size != 0)
    throw std::invalid_argument(std::string(op) + ": normalized_size " + std::to_string(normalized_size) +
                                " does not divide the input " + shape_str(x.shape()) + " into rows");
  if (beta.defined() && !gamma.defined())
    throw std::invalid_argument(std::string(op) + ": a bias without a weight");
  check_layer_norm_parameter(gamma, x, normalized_size, op, "weight");
  check_layer_norm_parameter(beta, x, normalized_size, op, "bias");
  return x.numel() / normalized_size;
}

bool check_binary_dtypes(BinaryOp op, const Tensor& a, const Tensor& b, const char* op_name) {
  if (a.dtype() == b.dtype()) return false;
  if (op == BinaryOp::add && a.dtype() == DType::f32 && is_half(b.dtype()) && a.shape() == b.shape())
    return true;
  throw std::invalid_argument(std::string(op_name) + ": dtype mismatch " + dtype_text(a.dtype()) + " vs " +
                              dtype_text(b.dtype()) +
                              " (only add takes an f32 tensor beside a half one of its shape)");
}

void check_layer_norm_output_dtype(DType y_dtype, DType x_dtype, const char* op) {
  if (y_dtype == x_dtype || (x_dtype == DType::f32 && is_half(y_dtype))) return;
  throw std::invalid_argument(std::string(op) + ": the output of a " + dtype_text(x_dtype) +
                              " input is stored as " + dtype_text(x_dtype) +
                              (x_dtype == DType::f32 ? " or a half dtype" : std::string()) + ", not " +
                              dtype_text(y_dtype));
}

int64_t check_layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& gamma, const char* op) {
  const int64_t rows = mean.numel();
  if (rows == 0 ? x.numel() != 0 : x.numel() % rows != 0)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) +
                                " row statistics do not divide the input " + shape_str(x.shape()));
  const int64_t normalized_size = rows == 0 ? (gamma.defined() ? gamma.numel() : 1) : x.numel() / rows;
  check_layer_norm(x, normalized_size, gamma, Tensor(), op);
  const bool dtype_ok = grad_y.dtype() == x.dtype() || (x.dtype() == DType::f32 && is_half(grad_y.dtype()));
  if (grad_y.shape() != x.shape() || !dtype_ok || grad_y.device() != x.device())
    throw std::invalid_argument(std::string(op) + ": grad_y must be a " + dtype_text(x.dtype()) +
                                (x.dtype() == DType::f32 ? " (or half)" : "") + " " + shape_str(x.shape()) +
                                " tensor on the input's device, got " + dtype_text(grad_y.dtype()) + " " +
                                shape_str(grad_y.shape()));
  check_row_statistic(mean, x, rows, op, "mean");
  check_row_statistic(rstd, x, rows, op, "rstd");
  return normalized_size;
}

int64_t check_softmax(const Tensor& x, const char* op) {
  check_floating(x, op, "input");
  if (x.dim() < 1)
    throw std::invalid_argument(std::string(op) + ": input must have a dimension to normalise");
  return x.size(x.dim() - 1);
}

int64_t check_softmax_backward(const Tensor& grad_y, const Tensor& y, const char* op) {
  const int64_t n = check_softmax(y, op);
  if (grad_y.shape() != y.shape() || grad_y.dtype() != y.dtype() || grad_y.device() != y.device())
    throw std::invalid_argument(std::string(op) + ": grad_y must be a " + dtype_text(y.dtype()) + " " +
                                shape_str(y.shape()) + " tensor on the output's device, got " +
                                dtype_text(grad_y.dtype()) + " " + shape_str(grad_y.shape()));
  return n;
}

BmmSizes check_bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const char* op) {
  auto shapes = [&] {
    return shape_str(a.shape()) + (trans_a ? "^T" : "") + " @ " + shape_str(b.shape()) +
           (trans_b ? "^T" : "");
  };
  if (a.dim() != 3 || b.dim() != 3)
    throw std::invalid_argument(std::string(op) + ": expects 3-D tensors [batch, rows, cols], got " +
                                shapes());
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(op) + ": dtype mismatch, " + dtype_text(a.dtype()) + " and " +
                                dtype_text(b.dtype()));
  if (a.size(0) != b.size(0))
    throw std::invalid_argument(std::string(op) + ": batch sizes differ: " + shapes());
  const BmmSizes s{a.size(0), a.size(trans_a ? 2 : 1), a.size(trans_a ? 1 : 2), b.size(trans_b ? 1 : 2)};
  if (s.k != b.size(trans_b ? 2 : 1))
    throw std::invalid_argument(std::string(op) + ": inner dimensions differ: " + shapes());
  return s;
}

std::optional<BatchedMatrixLayout> batched_matrix_layout(const Tensor& t) {
  const int64_t rows = t.size(1), cols = t.size(2), s1 = t.stride(1), s2 = t.stride(2);
  // A size-1 dimension's stride is never used: any value is valid there, and BLAS only asks that ld
  // covers the other dimension.
  if ((cols == 1 || s2 == 1) && (rows == 1 || s1 >= std::max<int64_t>(cols, 1)))
    return BatchedMatrixLayout{true, rows == 1 ? std::max<int64_t>(cols, 1) : s1, t.stride(0)};
  if ((rows == 1 || s1 == 1) && (cols == 1 || s2 >= std::max<int64_t>(rows, 1)))
    return BatchedMatrixLayout{false, cols == 1 ? std::max<int64_t>(rows, 1) : s2, t.stride(0)};
  return std::nullopt;
}

}  // namespace trainer
