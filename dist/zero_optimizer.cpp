#include "dist/zero_optimizer.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

#include "dist/error.h"
#include "nn/backend.h"

namespace trainer {
namespace {

// `t`'s elements in logical row-major order as a 1-D view (a copy only for non-contiguous layouts,
// e.g. channels_last weights: then reading is fine, and writing goes through copy_ instead).
Tensor flat_view(const Tensor& t) { return t.contiguous().reshape({t.numel()}); }

std::string entry(const std::string& slot, const std::string& param) { return slot + "." + param; }

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<Comm> comm, std::unique_ptr<Optimizer> inner,
                             const ZeroOptions& options)
    : Optimizer(inner->name(), inner->param_groups(), inner->lr(), inner->state_slots()),
      comm_(std::move(comm)),
      options_(options),
      rank_(comm_->rank()),
      world_(comm_->world_size()) {
  if (options.stage != 1 && options.stage != 2)
    throw std::invalid_argument("ZeRO: stage " + std::to_string(options.stage) + " is not 1 or 2");
  if (const auto* sgd = dynamic_cast<const Sgd*>(inner.get())) {
    sgd_ = sgd->options();
  } else if (const auto* adamw = dynamic_cast<const AdamW*>(inner.get())) {
    adamw_ = true;
    adamw_options_ = adamw->options();
  } else {
    throw std::invalid_argument("ZeRO: optimizer '" + inner->name() + "' is not supported (sgd, adamw are)");
  }
  if (inner->step_count() != 0) throw std::invalid_argument("ZeRO: wrap the optimizer before its first step");
  for (const ParamGroup& group : param_groups()) {
    for (const NamedParameter& p : group.params) {
      if (!p.param.requires_grad()) continue;
      const Tensor& first = params_.empty() ? p.param.data() : params_.front().var.data();
      if (p.param.dtype() != first.dtype() || p.param.device() != first.device())
        throw std::invalid_argument("ZeRO: parameter '" + p.name + "' is " + p.param.data().str() +
                                    ", the first one " + first.str() +
                                    "; one flat buffer needs one dtype and device");
      params_.push_back({p.name, p.param, group.weight_decay, total_, 0});
      total_ += p.param.numel();
    }
  }
  shard_ = (total_ + world_ - 1) / world_;
  const int64_t lo = rank_ * shard_, hi = lo + shard_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t b = std::max(lo, params_[i].flat_begin);
    const int64_t e = std::min(hi, params_[i].flat_begin + params_[i].var.numel());
    if (b < e) pieces_.push_back({static_cast<int>(i), b - params_[i].flat_begin, b - lo, e - b});
  }
  // Allocated now rather than at the first step (as Optimizer does), so the start-up log reports the
  // real per-rank footprint; zeros are what an unstepped state holds anyway.
  const Tensor& like = params_.front().var.data();
  for (size_t k = 0; k < state_slots().size(); ++k)
    slots_.push_back(Tensor::zeros({shard_}, like.dtype(), like.device()));
}

std::string ZeroOptimizer::describe() const {
  const int64_t element = static_cast<int64_t>(dtype_size(params_.front().var.dtype()));
  const int64_t unsharded = static_cast<int64_t>(state_slots().size()) * total_ * element;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "ZeRO stage %d over %d rank%s: this rank updates %lld of %lld parameter elements; optimizer "
                "state %lld bytes on this rank (%lld unsharded)",
                options_.stage, world_, world_ == 1 ? "" : "s", static_cast<long long>(shard_),
                static_cast<long long>(total_), static_cast<long long>(local_state_bytes()),
                static_cast<long long>(unsharded));
  return buf;
}

int64_t ZeroOptimizer::local_state_bytes() const {
  int64_t bytes = 0;
  for (const Tensor& s : slots_) bytes += s.defined() ? static_cast<int64_t>(s.nbytes()) : 0;
  return bytes;
}

Tensor ZeroOptimizer::reduce_gradients() {
  const Tensor& like = params_.front().var.data();
  Tensor flat = options_.stage == 1 && flat_grad_.defined()
                    ? flat_grad_
                    : Tensor::empty({shard_ * world_}, like.dtype(), like.device());
  if (options_.stage == 1) flat_grad_ = flat;
  if (shard_ * world_ > total_) flat.slice(0, total_, shard_ * world_).zero_();  // the padding
  for (Param& p : params_) {
    if (!p.var.grad().defined()) {
      const std::string message = "ZeRO on rank " + std::to_string(rank_) + ": parameter '" + p.name +
                                  "' has no gradient at the optimizer step. Every rank reduces every "
                                  "parameter's gradient, so every parameter must take part in the loss. "
                                  "HINT: freeze parameters you do not train (requires_grad = false)";
      comm_->abort(message);  // the other ranks would wait in the reduce-scatter
      throw DistError(message);
    }
    flat.slice(0, p.flat_begin, p.flat_begin + p.var.numel()).view(p.var.shape()).copy_(p.var.grad());
    if (options_.stage == 2) p.var.zero_grad();  // its values live on in the flat buffer
  }
  Tensor grad_shard = Tensor::empty({shard_}, like.dtype(), like.device());
  comm_->reduce_scatter(flat, grad_shard, ReduceOp::avg);
  return grad_shard;  // stage 2: `flat` goes out of scope here, the unsharded gradients with it
}

void ZeroOptimizer::clip(Tensor& grad_shard) {
  // Squares summed over this rank's pieces only: the padding never enters the norm.
  double local = 0.0;
  for (const Piece& piece : pieces_) {
    const Tensor g = grad_shard.slice(0, piece.shard_begin, piece.shard_begin + piece.length);
    Backend& be = backend_for(g);
    local += be.sum(be.unary(UnaryOp::square, g), {}, false).item();
  }
  Tensor sum_sq = Tensor::from_vector<double>({local}, {1});
  comm_->all_reduce(sum_sq, ReduceOp::sum);
  const double norm = std::sqrt(sum_sq.item());
  const double coef = options_.max_grad_norm / (norm + 1e-6);
  if (!(coef >= 1.0)) backend_for(grad_shard).scale(grad_shard, coef);  // as clip_grad_norm: NaN propagates
}

Tensor ZeroOptimizer::param_shard() const {
  const Tensor& like = params_.front().var.data();
  Tensor shard = Tensor::zeros({shard_}, like.dtype(), like.device());
  for (const Piece& piece : pieces_) {
    const Tensor src = flat_view(params_[piece.param].var.data());
    shard.slice(0, piece.shard_begin, piece.shard_begin + piece.length)
        .copy_(src.slice(0, piece.param_begin, piece.param_begin + piece.length));
  }
  return shard;
}

void ZeroOptimizer::update_shard(Tensor& param_shard, const Tensor& grad_shard) {
  // Every parameter has a gradient (checked in reduce_gradients), so every one counts this update, on
  // every rank, whether or not a piece of it lies in this shard.
  for (Param& p : params_) ++p.steps;
  for (const Piece& piece : pieces_) {
    const Param& p = params_[piece.param];
    auto part = [&](const Tensor& t) {
      return t.slice(0, piece.shard_begin, piece.shard_begin + piece.length);
    };
    Tensor w = part(param_shard);
    const Tensor g = part(grad_shard);
    Backend& be = backend_for(w);
    if (adamw_) {
      AdamWParams a;
      a.lr = lr();
      a.beta1 = adamw_options_.beta1;
      a.beta2 = adamw_options_.beta2;
      a.eps = adamw_options_.eps;
      a.weight_decay = p.weight_decay;
      a.step = p.steps;
      Tensor m = part(slots_[0]), v = part(slots_[1]);
      be.adamw_step(w, g, m, v, a);
    } else {
      SgdParams s;
      s.lr = lr();
      s.momentum = sgd_.momentum;
      s.dampening = sgd_.dampening;
      s.weight_decay = p.weight_decay;
      s.nesterov = sgd_.nesterov;
      Tensor buffer = slots_.empty() ? Tensor() : part(slots_[0]);
      be.sgd_step(w, g, buffer, p.steps == 1, s);
    }
  }
}

void ZeroOptimizer::all_gather_params(const Tensor& param_shard) {
  const Tensor full = comm_->all_gather_cat(param_shard);  // [P]
  for (Param& p : params_) {
    const Tensor src = full.slice(0, p.flat_begin, p.flat_begin + p.var.numel()).view(p.var.shape());
    p.var.data().copy_(src);
  }
}

void ZeroOptimizer::step() {
  set_step_count(step_count() + 1);
  Tensor grad_shard = reduce_gradients();
  if (options_.max_grad_norm > 0) clip(grad_shard);
  Tensor shard = param_shard();
  update_shard(shard, grad_shard);
  grad_shard = Tensor();  // stage 2: the sharded gradient is not needed for the all-gather
  all_gather_params(shard);
}

// ---- checkpoints: full state in the wrapped optimizer's names

void ZeroOptimizer::gather_state() {
  gathered_.clear();
  for (const Tensor& slot : slots_) {
    Tensor full = comm_->all_gather_cat(slot);
    if (rank_ == 0) gathered_.push_back(std::move(full));
  }
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (state_slots().empty()) return out;
  const bool stepped = params_.front().steps > 0;
  std::vector<Tensor> full = world_ == 1 ? slots_ : gathered_;
  if (stepped && full.size() != state_slots().size())
    throw std::logic_error("ZeRO: state_tensors() needs gather_state() on every rank first (rank " +
                           std::to_string(rank_) + ")");
  gathered_.clear();
  for (const Param& p : params_) {
    for (size_t k = 0; k < state_slots().size(); ++k) {
      Tensor t =
          stepped ? full[k].slice(0, p.flat_begin, p.flat_begin + p.var.numel()).view(p.var.shape()).clone()
                  : Tensor::zeros(p.var.shape(), p.var.dtype(), p.var.device());
      out.emplace_back(entry(state_slots()[k], p.name), std::move(t));
    }
    out.emplace_back(entry("step", p.name), Tensor::scalar(static_cast<double>(p.steps), DType::i64));
  }
  return out;
}

void ZeroOptimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t step_count) {
  const std::string where = name() + " state (ZeRO): ";
  if (step_count < 0)
    throw std::invalid_argument(where + "negative step count " + std::to_string(step_count));
  std::map<std::string, const Tensor*> given;
  for (const auto& [key, tensor] : state)
    if (!given.emplace(key, &tensor).second)
      throw std::invalid_argument(where + "duplicate entry '" + key + "'");
  auto take = [&](const std::string& key) -> const Tensor& {
    auto it = given.find(key);
    if (it == given.end() || !it->second->defined())
      throw std::invalid_argument(where + "missing entry '" + key + "'");
    const Tensor& t = *it->second;
    given.erase(it);
    return t;
  };
  // Validate everything before changing anything.
  std::vector<int64_t> steps;
  std::vector<std::vector<const Tensor*>> slot_tensors;  // [param][slot]
  if (!state_slots().empty()) {
    for (const Param& p : params_) {
      slot_tensors.emplace_back();
      for (const std::string& slot : state_slots()) {
        const Tensor& t = take(entry(slot, p.name));
        if (t.shape() != p.var.shape())
          throw std::invalid_argument(where + "entry '" + entry(slot, p.name) + "' has shape " +
                                      shape_str(t.shape()) + ", the parameter has " +
                                      shape_str(p.var.shape()));
        slot_tensors.back().push_back(&t);
      }
      const Tensor& t = take(entry("step", p.name));
      const double value = t.numel() == 1 ? t.item() : -1.0;
      if (!(value >= 0.0) || value != std::floor(value))
        throw std::invalid_argument(where + "entry '" + entry("step", p.name) +
                                    "' must hold one non-negative integer");
      steps.push_back(static_cast<int64_t>(value));
    }
  }
  if (!given.empty()) throw std::invalid_argument(where + "unexpected entry '" + given.begin()->first + "'");

  for (size_t i = 0; i < steps.size(); ++i) params_[i].steps = steps[i];
  if (!state_slots().empty()) {
    const Tensor& like = params_.front().var.data();
    slots_.clear();
    for (size_t k = 0; k < state_slots().size(); ++k) {
      Tensor shard = Tensor::zeros({shard_}, like.dtype(), like.device());
      for (const Piece& piece : pieces_) {
        const Tensor src = flat_view(*slot_tensors[piece.param][k]).to(like.device());
        shard.slice(0, piece.shard_begin, piece.shard_begin + piece.length)
            .copy_(src.slice(0, piece.param_begin, piece.param_begin + piece.length));
      }
      slots_.push_back(std::move(shard));
    }
  }
  set_step_count(step_count);
}

}  // namespace trainer
