// Gradient accumulation under data parallelism: k micro-batches, the first k-1 under no_sync, equal one
// batch k times larger (Caffe's "accumulation equals one big batch", here on 2 ranks), and a step
// communicates exactly once per bucket however many micro-batches it has.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "dist/gradient_reducer.h"
#include "multi_process.h"
#include "nn/functional.h"
#include "nn/modules/linear.h"
#include "nn/optim/sgd.h"

namespace trainer {
namespace {

using namespace testing;

// Forwards to another communicator and counts all-reduces.
class CountingComm : public Comm {
 public:
  explicit CountingComm(std::shared_ptr<Comm> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) override {
    ++all_reduces;
    return inner_->all_reduce_async(std::move(tensor), op);
  }
  void reduce_scatter(Tensor& input, Tensor& output, ReduceOp op) override {
    inner_->reduce_scatter(input, output, op);
  }
  void broadcast(Tensor& tensor, int root) override { inner_->broadcast(tensor, root); }
  std::vector<Tensor> all_gather(const Tensor& tensor) override { return inner_->all_gather(tensor); }
  void barrier() override { inner_->barrier(); }
  void set_timeout(std::chrono::milliseconds timeout) override { inner_->set_timeout(timeout); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  void shutdown() override { inner_->shutdown(); }

  std::atomic<int> all_reduces{0};

 private:
  std::shared_ptr<Comm> inner_;
};

struct Mlp : Module {
  Mlp() {
    Generator gen(11);
    fc1 = register_module("fc1", std::make_shared<Linear>(5, 8, true, gen));
    fc2 = register_module("fc2", std::make_shared<Linear>(8, 3, true, gen));
  }
  Variable forward(const Variable& x) override { return fc2->forward(F::relu(fc1->forward(x))); }
  std::shared_ptr<Linear> fc1, fc2;
};

// Rows [begin, end) of this rank's data for `step` ([rows, 5]).
Tensor data(int rank, int step, int64_t begin, int64_t end) {
  std::vector<float> v;
  for (int64_t i = begin; i < end; ++i)
    for (int j = 0; j < 5; ++j) v.push_back(std::sin(0.9f * i + 1.3f * j + 7.0f * step + 31.0f * rank));
  return Tensor::from_vector(v, {end - begin, 5});
}

Variable loss_of(Module& m, const Tensor& x) { return F::mean(F::square(m(Variable(x)))); }

ReducerOptions small_buckets() {
  ReducerOptions o;
  o.first_bucket_cap_bytes = 16;
  o.bucket_cap_bytes = 64;
  return o;
}

TEST(GradientAccumulation, MicroBatchesUnderNoSyncEqualOneBigBatchOnTwoRanks) {
  constexpr int kMicro = 4, kMicroBatch = 2, kSteps = 10;
  const int port = free_port();
  const auto out = run_processes(2, [&](int rank) {
    Rank me(rank, 2, port, 10s);
    auto counting = std::make_shared<CountingComm>(me.comm);
    Mlp accum, big;
    GradientReducer accum_reducer(counting, accum.named_parameters(), small_buckets());
    GradientReducer big_reducer(me.comm, big.named_parameters(), small_buckets());
    if (accum_reducer.bucket_count() < 2) throw std::runtime_error("expected several buckets");
    SgdOptions so;
    so.lr = 0.05;
    so.momentum = 0.9;
    Sgd accum_opt(accum.named_parameters(), so), big_opt(big.named_parameters(), so);
    for (int step = 0; step < kSteps; ++step) {
      const int before = counting->all_reduces.load();
      for (int i = 0; i < kMicro; ++i) {
        const bool last = i + 1 == kMicro;
        accum_reducer.set_sync(last);
        F::div(loss_of(accum, data(rank, step, i * kMicroBatch, (i + 1) * kMicroBatch)), kMicro).backward();
      }
      accum_reducer.finish();
      const int launched = counting->all_reduces.load() - before;
      if (launched != accum_reducer.bucket_count())
        throw std::runtime_error("step " + std::to_string(step) + ": " + std::to_string(launched) +
                                 " all-reduces for " + std::to_string(accum_reducer.bucket_count()) +
                                 " buckets");
      accum_opt.step();
      accum_opt.zero_grad();

      loss_of(big, data(rank, step, 0, kMicro * kMicroBatch)).backward();
      big_reducer.finish();
      big_opt.step();
      big_opt.zero_grad();
    }
    const auto a = accum.named_parameters(), b = big.named_parameters();
    for (size_t p = 0; p < a.size(); ++p) {
      const auto va = a[p].param.data().to_vector<float>(), vb = b[p].param.data().to_vector<float>();
      for (size_t i = 0; i < va.size(); ++i)
        if (!(std::abs(va[i] - vb[i]) <= 1e-5f))
          throw std::runtime_error(a[p].name + "[" + std::to_string(i) + "]: accumulated " +
                                   std::to_string(va[i]) + ", one batch " + std::to_string(vb[i]));
    }
    me.comm->shutdown();
  });
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

}  // namespace
}  // namespace trainer
