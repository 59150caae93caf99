#include "dist/gradient_reducer.h"

#include <map>

#include "dist/consistency.h"
#include "dist/error.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

Tensor slot(const Tensor& flat, int64_t offset, const Shape& shape) {
  return flat.slice(0, offset, offset + shape_numel(shape)).view(shape);
}

}  // namespace

struct GradientReducer::State {
  struct Param {
    std::string name;
    Variable var;
    int bucket = 0;
    int64_t offset = 0;  // in elements, within the bucket
    bool ready = false;
  };
  struct Bucket {
    Tensor flat;  // [numel of its parameters], contiguous
    std::vector<int> params;
    int pending = 0;
    std::shared_ptr<Work> work;
  };

  std::shared_ptr<Comm> comm;
  ReducerOptions options;
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  int next_launch = 0;
  int ready_count = 0;
  bool sync = true;
  double last_wait_seconds = 0.0;
  int last_launched_in_backward = 0;
  std::function<void()> first_launch_observer;
  BucketLauncher launcher;  // empty: all-reduce (DDP)

  void launch_ready_buckets() {
    while (next_launch < static_cast<int>(buckets.size()) && buckets[next_launch].pending == 0) {
      if (next_launch == 0 && first_launch_observer) first_launch_observer();
      Bucket& b = buckets[next_launch++];
      b.work = launcher ? launcher(next_launch - 1) : comm->all_reduce_async(b.flat, ReduceOp::avg);
    }
  }

  void on_grad_ready(int index) {
    if (!sync) return;
    Param& p = params[index];
    if (p.ready)
      throw DistError(
          "GradientReducer: parameter '" + p.name +
          "' received its gradient twice before finish(). HINT: call finish() after every synchronised "
          "backward, and set_sync(false) for the micro-batches that only accumulate");
    p.ready = true;
    ++ready_count;
    Bucket& b = buckets[p.bucket];
    if (!launcher) slot(b.flat, p.offset, p.var.shape()).copy_(p.var.grad());
    if (--b.pending == 0) launch_ready_buckets();
  }

  void reset() {
    for (Param& p : params) p.ready = false;
    for (Bucket& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.work.reset();
    }
    next_launch = 0;
    ready_count = 0;
  }
};

std::vector<std::vector<int>> plan_gradient_buckets(const std::vector<NamedParameter>& params,
                                                    const ReducerOptions& options) {
  std::vector<std::vector<int>> buckets;
  std::vector<size_t> used;                           // bytes per bucket
  std::map<std::pair<DType, std::string>, int> open;  // (dtype, device) -> bucket being filled
  // Reverse registration order: the order backward makes gradients ready.
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const Variable& param = params[static_cast<size_t>(i)].param;
    if (!param.requires_grad()) continue;
    const Tensor& data = param.data();
    const auto key = std::make_pair(data.dtype(), data.device().str());
    auto found = open.find(key);
    int b = found == open.end() ? -1 : found->second;
    if (b >= 0) {
      const size_t cap = b == 0 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
      if (used[b] > 0 && used[b] + data.nbytes() > cap) b = -1;
    }
    if (b < 0) {
      b = static_cast<int>(buckets.size());
      buckets.emplace_back();
      used.push_back(0);
      open[key] = b;
    }
    buckets[b].push_back(i);
    used[b] += data.nbytes();
  }
  return buckets;
}

GradientReducer::GradientReducer(std::shared_ptr<Comm> comm, const std::vector<NamedParameter>& params,
                                 const ReducerOptions& options, BucketLauncher launcher)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.comm = std::move(comm);
  s.options = options;
  s.launcher = std::move(launcher);
  if (!active()) return;
  const std::vector<std::vector<int>> plan = plan_gradient_buckets(params, options);
  for (size_t b = 0; b < plan.size(); ++b) {
    State::Bucket& bucket = s.buckets.emplace_back();
    int64_t numel = 0;
    for (int index : plan[b]) {
      const NamedParameter& named = params[static_cast<size_t>(index)];
      State::Param p;
      p.name = named.name;
      p.var = named.param;
      p.bucket = static_cast<int>(b);
      p.offset = numel;
      numel += named.param.numel();
      bucket.params.push_back(static_cast<int>(s.params.size()));
      s.params.push_back(std::move(p));
    }
    // A launcher reduces from the parameters' own gradients: no copy, no buffer.
    if (!s.launcher) {
      const Tensor& first = params[static_cast<size_t>(plan[b].front())].param.data();
      bucket.flat = Tensor::zeros({numel}, first.dtype(), first.device());
    }
  }
  s.reset();
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.params[i].var.add_grad_ready_hook([weak, i](Variable&) {
      if (auto state = weak.lock()) state->on_grad_ready(static_cast<int>(i));
    });
  }
}

GradientReducer::~GradientReducer() {
  // Buckets in flight read our buffers: let them finish (or fail) before the buffers go.
  if (!state_) return;
  for (auto& b : state_->buckets) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (const DistError&) {
    }
  }
}

void GradientReducer::set_sync(bool sync) { state_->sync = sync; }
bool GradientReducer::sync() const { return state_->sync; }
std::function<void()> GradientReducer::set_first_launch_observer(std::function<void()> observer) {
  std::swap(state_->first_launch_observer, observer);
  return observer;
}

bool GradientReducer::active() const { return state_->comm && state_->comm->world_size() > 1; }
bool GradientReducer::pending() const { return state_->ready_count > 0; }
int GradientReducer::bucket_count() const { return static_cast<int>(state_->buckets.size()); }
double GradientReducer::last_wait_seconds() const { return state_->last_wait_seconds; }
int GradientReducer::last_buckets_launched_in_backward() const { return state_->last_launched_in_backward; }

std::vector<std::vector<std::string>> GradientReducer::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> names;
  for (const auto& b : state_->buckets) {
    names.emplace_back();
    for (int i : b.params) names.back().push_back(state_->params[i].name);
  }
  return names;
}

void GradientReducer::finish() {
  State& s = *state_;
  if (!active() || !s.sync) return;
  const auto start = Clock::now();
  struct ResetOnExit {
    State& s;
    ~ResetOnExit() { s.reset(); }
  } reset_on_exit{s};
  s.last_launched_in_backward = s.next_launch;

  if (s.ready_count < static_cast<int>(s.params.size())) {
    std::vector<std::string> missing;
    for (const auto& p : s.params)
      if (!p.ready) missing.push_back(p.name);
    if (!s.options.find_unused_parameters) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 20; ++i) list += (i ? ", " : "") + missing[i];
      if (missing.size() > 20) list += " and " + std::to_string(missing.size() - 20) + " more";
      const std::string message =
          s.ready_count == 0
              ? "GradientReducer on rank " + std::to_string(s.comm->rank()) +
                    ": finish() without a synchronised backward since the last finish(). HINT: call "
                    "set_sync(true) "
                    "before the backward of the last micro-batch, then finish()"
              : "GradientReducer on rank " + std::to_string(s.comm->rank()) + ": " +
                    std::to_string(missing.size()) +
                    " parameter(s) received no gradient in this backward: " + list +
                    ". Data-parallel training averages every parameter's gradient across ranks, so every "
                    "parameter must take part in the loss. HINT: freeze parameters you do not train "
                    "(requires_grad = false), remove layers the forward does not use, or turn on "
                    "find_unused_parameters to reduce zeros for them";
      s.comm->abort(message);  // the other ranks would wait for the missing buckets
      throw DistError(message);
    }
    for (auto& p : s.params) {
      if (p.ready) continue;
      p.ready = true;
      ++s.ready_count;
      State::Bucket& b = s.buckets[p.bucket];
      if (!s.launcher) slot(b.flat, p.offset, p.var.shape()).zero_();
      --b.pending;
    }
    s.launch_ready_buckets();
  }
  for (auto& b : s.buckets)
    if (b.work) b.work->wait();
  if (s.launcher) {  // it reduced into its own storage: nothing to write back
    s.last_wait_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return;
  }
  for (auto& p : s.params) {
    const Tensor averaged = slot(s.buckets[p.bucket].flat, p.offset, p.var.shape());
    Tensor& grad = p.var.grad();
    if (grad.defined()) {
      grad.copy_(averaged);
    } else {
      grad = averaged.clone();
    }
  }
  s.last_wait_seconds = std::chrono::duration<double>(Clock::now() - start).count();
}

void broadcast_state(Comm& comm, const std::vector<NamedTensor>& state, int root) {
  if (comm.world_size() <= 1) return;
  std::string signature;
  for (const auto& t : state)
    signature +=
        t.name + " " + shape_str(t.tensor->shape()) + " " + std::string(dtype_name(t.tensor->dtype())) + ";";
  const std::string hash = content_hash(signature);
  check_same_on_all_ranks(comm,
                          "the model's parameter and buffer names, shapes and dtypes (hash of the list)",
                          static_cast<int64_t>(std::stoull(hash, nullptr, 16) >> 1),
                          "every rank must build the same model: start them with the same config");
  // One flat buffer per (dtype, device), in state_dict order.
  std::map<std::pair<DType, std::string>, std::vector<const NamedTensor*>> groups;
  for (const auto& t : state)
    if (t.tensor->numel() > 0) groups[{t.tensor->dtype(), t.tensor->device().str()}].push_back(&t);
  for (auto& [key, members] : groups) {
    int64_t total = 0;
    for (const NamedTensor* t : members) total += t->tensor->numel();
    Tensor flat = Tensor::empty({total}, key.first, members.front()->tensor->device());
    int64_t offset = 0;
    if (comm.rank() == root) {
      for (const NamedTensor* t : members) {
        slot(flat, offset, t->tensor->shape()).copy_(*t->tensor);
        offset += t->tensor->numel();
      }
    }
    comm.broadcast(flat, root);
    if (comm.rank() != root) {
      for (const NamedTensor* t : members) {
        t->tensor->copy_(slot(flat, offset, t->tensor->shape()));
        offset += t->tensor->numel();
      }
    }
  }
}

}  // namespace trainer
