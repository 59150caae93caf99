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
  std::map<std::string, int> by_name;
  for (const ParamGroup& group : param_groups()) {
    for (const NamedParameter& p : group.params) {
      if (!p.param.requires_grad()) continue;
      const Tensor& first = params_.empty() ? p.param.data() : params_.front().var.data();
      if (p.param.dtype() != first.dtype() || p.param.device() != first.device())
        throw std::invalid_argument("ZeRO: parameter '" + p.name + "' is " + p.param.data().str() +
                                    ", the first one " + first.str() +
                                    "; one flat buffer needs one dtype and device");
      by_name[p.name] = static_cast<int>(params_.size());
      Param param;
      param.name = p.name;
      param.var = p.param;
      param.weight_decay = group.weight_decay;
      param.lr_scale = group.lr_scale;
      params_.push_back(std::move(param));
      total_ += p.param.numel();
    }
  }
  if (options_.stage == 1) {
    std::vector<int> all(params_.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    build_layout({all});
  } else {
    // Registration order (names the optimizer does not train are left out), then anything the order
    // did not name, so every parameter is in exactly one bucket.
    std::vector<NamedParameter> ordered;
    std::vector<int> index_of;  // ordered -> params_
    std::vector<bool> placed(params_.size(), false);
    for (const std::string& name : options_.registration_order) {
      auto it = by_name.find(name);
      if (it == by_name.end() || placed[it->second]) continue;
      placed[it->second] = true;
      ordered.push_back({name, params_[it->second].var});
      index_of.push_back(it->second);
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (placed[i]) continue;
      ordered.push_back({params_[i].name, params_[i].var});
      index_of.push_back(static_cast<int>(i));
    }
    std::vector<std::vector<int>> buckets = plan_gradient_buckets(ordered, options_.buckets);
    for (auto& bucket : buckets)
      for (int& i : bucket) i = index_of[i];
    build_layout(buckets);
    // The same plan numbers the reducer's buckets, so its launcher's index is ours.
    reducer_ = std::make_unique<GradientReducer>(comm_, ordered, options_.buckets, [this](int bucket) {
      reduce_bucket(bucket);
      return std::shared_ptr<Work>();  // done: the reduce-scatter is blocking
    });
  }
  // Allocated now rather than at the first step (as Optimizer does), so the start-up log reports the
  // real per-rank footprint; zeros are what an unstepped state holds anyway.
  const Tensor& like = params_.front().var.data();
  for (size_t k = 0; k < state_slots().size(); ++k)
    slots_.push_back(Tensor::zeros({shard_}, like.dtype(), like.device()));
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::build_layout(const std::vector<std::vector<int>>& buckets) {
  for (const std::vector<int>& members : buckets) {
    Bucket& bucket = buckets_.emplace_back();
    bucket.params = members;
    for (int i : members) {
      params_[i].bucket = static_cast<int>(buckets_.size()) - 1;
      params_[i].bucket_begin = bucket.numel;
      bucket.numel += params_[i].var.numel();
    }
    bucket.chunk = (bucket.numel + world_ - 1) / world_;
    bucket.shard_begin = shard_;
    shard_ += bucket.chunk;
  }
  pieces_ = pieces_of_rank(rank_);
  located_.assign(params_.size(), {});
  for (int r = 0; r < world_; ++r) {
    for (Piece piece : pieces_of_rank(r)) {
      piece.shard_begin += r * shard_;
      located_[piece.param].push_back(piece);
    }
  }
}

std::vector<ZeroOptimizer::Piece> ZeroOptimizer::pieces_of_rank(int rank) const {
  std::vector<Piece> pieces;
  for (const Bucket& bucket : buckets_) {
    const int64_t lo = rank * bucket.chunk, hi = lo + bucket.chunk;  // within the bucket
    for (int i : bucket.params) {
      const Param& p = params_[i];
      const int64_t b = std::max(lo, p.bucket_begin);
      const int64_t e = std::min(hi, p.bucket_begin + p.var.numel());
      if (b < e) pieces.push_back({i, b - p.bucket_begin, bucket.shard_begin + (b - lo), e - b});
    }
  }
  return pieces;
}

void ZeroOptimizer::unshard(const Tensor& gathered, int param, Tensor& flat) const {
  for (const Piece& piece : located_[param])
    flat.slice(0, piece.param_begin, piece.param_begin + piece.length)
        .copy_(gathered.slice(0, piece.shard_begin, piece.shard_begin + piece.length));
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

void ZeroOptimizer::check_gradients() {
  for (const Param& p : params_) {
    if (p.reduced || p.var.grad().defined()) continue;
    const std::string message = "ZeRO on rank " + std::to_string(rank_) + ": parameter '" + p.name +
                                "' has no gradient at the optimizer step. Every rank reduces every "
                                "parameter's gradient, so every parameter must take part in the loss. "
                                "HINT: freeze parameters you do not train (requires_grad = false)";
    comm_->abort(message);  // the other ranks would wait in the reduce-scatter
    throw DistError(message);
  }
}

void ZeroOptimizer::reduce_bucket(int b) {
  Bucket& bucket = buckets_[b];
  const Tensor& like = params_.front().var.data();
  const int64_t padded = bucket.chunk * world_;
  // One buffer of the largest bucket, kept between steps and reused by every bucket (DeepSpeed's
  // reduction bucket; stage 1's one bucket is the whole flat vector).
  if (!flat_grad_.defined()) {
    int64_t largest = 0;
    for (const Bucket& other : buckets_) largest = std::max(largest, other.chunk * world_);
    flat_grad_ = Tensor::empty({largest}, like.dtype(), like.device());
  }
  Tensor flat = flat_grad_.slice(0, 0, padded);
  if (padded > bucket.numel) flat.slice(0, bucket.numel, padded).zero_();  // the padding
  for (int i : bucket.params) {
    Param& p = params_[i];
    Tensor slot = flat.slice(0, p.bucket_begin, p.bucket_begin + p.var.numel()).view(p.var.shape());
    if (p.var.grad().defined()) {
      slot.copy_(p.var.grad());
    } else {
      slot.zero_();  // unused under find_unused_parameters, or its gradient is already in the shard
    }
    if (options_.stage == 2) p.var.zero_grad();  // its values live on in the flat buffer
    p.reduced = true;
  }
  if (!grad_shard_.defined()) grad_shard_ = Tensor::empty({shard_}, like.dtype(), like.device());
  Tensor mine = grad_shard_.slice(0, bucket.shard_begin, bucket.shard_begin + bucket.chunk);
  if (!bucket.in_shard) {  // the first reduction since zero_grad() writes the shard directly
    comm_->reduce_scatter(flat, mine, ReduceOp::avg);
    bucket.in_shard = true;
    return;
  }
  // Micro-batches reduced separately (a backward after this bucket's reduction) add up.
  Tensor reduced = Tensor::empty({bucket.chunk}, like.dtype(), like.device());
  comm_->reduce_scatter(flat, reduced, ReduceOp::avg);
  backend_for(mine).axpy(mine, reduced, 1.0);
}

void ZeroOptimizer::reduce_remaining() {
  // Under find_unused_parameters a parameter without gradient reduces zeros, as in DDP.
  if (!options_.buckets.find_unused_parameters) check_gradients();
  if (reducer_ && reducer_->pending()) reducer_->finish();  // buckets backward left, unused parameters
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // Stage 2 releases what it reduces, so a gradient present is a new one (a backward after the
    // reduction accumulates by linearity); stage 1 keeps them and reduces each once per step.
    bool any = !buckets_[b].in_shard;
    for (int i : buckets_[b].params)
      any = any || (params_[i].var.grad().defined() && (options_.stage == 2 || !params_[i].reduced));
    if (any) reduce_bucket(static_cast<int>(b));
  }
}

std::vector<Tensor> ZeroOptimizer::gradients_to_unscale() {
  std::vector<Tensor> grads;
  if (options_.stage == 1) {
    for (const Param& p : params_)
      if (p.var.grad().defined()) grads.push_back(p.var.grad());
    return grads;
  }
  reduce_remaining();
  grads.push_back(grad_shard_);
  return grads;
}

void ZeroOptimizer::zero_grad() {
  Optimizer::zero_grad();
  for (Param& p : params_) p.reduced = false;
  for (Bucket& b : buckets_) b.in_shard = false;
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
  // Every parameter has a gradient (checked in reduce_remaining), so every one counts this update, on
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
      Tensor m = part(slots_[0]), v = part(slots_[1]);
      be.adamw_step(w, g, m, v, adamw_params(adamw_options_, lr() * p.lr_scale, p.weight_decay, p.steps));
    } else {
      Tensor buffer = slots_.empty() ? Tensor() : part(slots_[0]);
      be.sgd_step(w, g, buffer, p.steps == 1, sgd_params(sgd_, lr() * p.lr_scale, p.weight_decay));
    }
  }
}

void ZeroOptimizer::all_gather_params(const Tensor& param_shard) {
  const Tensor full = comm_->all_gather_cat(param_shard);  // [N * S]
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor data = params_[i].var.data();
    // Written in place when the layout allows; channels_last weights go through a temporary.
    const bool direct = data.is_contiguous();
    Tensor flat =
        direct ? data.view({data.numel()}) : Tensor::empty({data.numel()}, data.dtype(), data.device());
    unshard(full, static_cast<int>(i), flat);
    if (!direct) data.copy_(flat.view(data.shape()));
  }
}

void ZeroOptimizer::step() {
  set_step_count(step_count() + 1);
  reduce_remaining();
  if (options_.max_grad_norm > 0) clip(grad_shard_);
  Tensor shard = param_shard();
  update_shard(shard, grad_shard_);
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
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    for (size_t k = 0; k < state_slots().size(); ++k) {
      Tensor t = Tensor::zeros({p.var.numel()}, p.var.dtype(), p.var.device());
      if (stepped) unshard(full[k], static_cast<int>(i), t);
      out.emplace_back(entry(state_slots()[k], p.name), t.view(p.var.shape()));
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
