// NCCL collectives inside a CUDA graph (dist.cuda_graph), through a real one-rank NCCL communicator:
// a captured all-reduce runs in every replay, ordered between the compute-stream work before and after
// it; the capture keeps its tensors until a replay is watched, and each replay is watched as one unit
// until it completes; a host wait inside a capture fails it with a message. Then a whole resnet18 step
// with the DDP gradient reducer (and SyncBatchNorm, and fp16's device loss scaler agreeing through an
// all-reduce) replays to the eager losses bit for bit.
//
// One GPU cannot hold two NCCL ranks, so the reducer sees a view of the one-rank communicator that
// claims two ranks: its hooks, buckets, copies and NCCL calls all run (NCCL then averages over one
// rank, the identity). At one rank NCCL takes a shortcut (no kernel plans, proxies or references held
// by the graph), so these tests check our side of the capture (streams, events, the watchdog, the
// reducer, tensor lifetimes), not NCCL's: two real ranks are bench/gpu_checks.sh's multigpu section.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "dist/error.h"
#include "dist/gradient_reducer.h"
#include "dist/nccl_comm.h"
#include "dist/store.h"
#include "dist/sync_batch_norm.h"
#include "nn/amp/autocast.h"
#include "nn/amp/loss_scaler.h"
#include "nn/cuda/cuda_graph.h"
#include "nn/functional.h"
#include "nn/optim/sgd.h"
#include "tests/gpu/backend_options.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/graph_steps.h"
#include "tests/gpu/nccl_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;
using namespace std::chrono_literals;

// A one-rank NCCL communicator over a loopback store.
class NcclGraph : public OneRankNcclTest {
 protected:
  NcclGraph() : OneRankNcclTest(/*watchdog_store=*/false) {}

  // Waits (bounded) until the watchdog has seen every watched replay complete.
  bool watchdog_drained() const {
    for (int i = 0; i < 200 && comm_->pending_count() > 0; ++i) std::this_thread::sleep_for(10ms);
    return comm_->pending_count() == 0;
  }
};

// The one-rank communicator as the reducer of a two-rank job sees it.
class TwoRankView : public Comm {
 public:
  explicit TwoRankView(std::shared_ptr<NcclComm> comm) : comm_(std::move(comm)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend_name() const override { return "nccl"; }
  std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) override {
    return comm_->all_reduce_async(std::move(tensor), op);
  }
  void reduce_scatter(Tensor&, Tensor&, ReduceOp) override { throw DistError("not in this view"); }
  void broadcast(Tensor& tensor, int root) override { comm_->broadcast(tensor, root); }
  std::vector<Tensor> all_gather(const Tensor& tensor) override { return comm_->all_gather(tensor); }
  void barrier() override { comm_->barrier(); }
  void set_timeout(std::chrono::milliseconds timeout) override { comm_->set_timeout(timeout); }
  std::chrono::milliseconds timeout() const override { return comm_->timeout(); }
  void abort(const std::string& reason) override { comm_->abort(reason); }
  void throw_if_failed() const override { comm_->throw_if_failed(); }
  void watch_graph_replay(const std::string& what) override { comm_->watch_graph_replay(what); }
  void shutdown() override {}

 private:
  std::shared_ptr<NcclComm> comm_;
};

TEST_F(NcclGraph, ACapturedAllReduceRunsInEveryReplayBetweenTheWorkAroundIt) {
  Generator gen(5);
  Tensor input = on_gpu(random({64, 33}, gen));
  Tensor output = Tensor::zeros({33, 64}, DType::f32, gpu());
  // Non-contiguous: NCCL gets a staged contiguous copy, copied back on the device after the collective.
  Tensor work = Tensor::zeros({33, 64}, DType::f32, gpu()).permute({1, 0});
  cuda::CudaGraph graph;
  graph.capture([&] {
    work.copy_(input);                       // compute stream, before
    comm_->all_reduce(work, ReduceOp::sum);  // communication stream; the compute stream waits for it
    output.copy_(work.permute({1, 0}));      // compute stream, after
  });
  EXPECT_EQ(comm_->pending_count(), 0u);  // recorded, not run: nothing for the watchdog yet
  EXPECT_EQ(comm_->captured_count(), 1u);
  for (int replay = 0; replay < 3; ++replay) {
    const Tensor expected = random({64, 33}, gen);
    input.copy_(expected);
    graph.replay();
    comm_->watch_graph_replay("test graph");
    EXPECT_EQ(comm_->captured_count(), 0u);  // the capture is over: its tensors are released
    expect_equal(expected, output.permute({1, 0}).to(Device::cpu()), "replay");
    EXPECT_TRUE(watchdog_drained()) << "replay " << replay;
  }
  // The communicator goes on working eagerly between and after replays.
  Tensor eager = on_gpu(Tensor::from_vector<float>({1.0f, 2.0f}, {2}));
  comm_->all_reduce(eager, ReduceOp::max);
  expect_equal(Tensor::from_vector<float>({1.0f, 2.0f}, {2}), eager.to(Device::cpu()), "eager");
}

TEST_F(NcclGraph, AHostWaitInsideACaptureFailsItWithAReason) {
  cuda::CudaGraph graph;
  try {
    graph.capture([&] { comm_->barrier(); });
    FAIL() << "a barrier was captured";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("the host cannot wait for a collective recorded in a CUDA graph"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(graph.captured());
}

struct StepOptions {
  bool sync_bn = false;
  bool fp16 = false;
};

// 12 SGD steps of resnet18-cifar with the DDP reducer; with `graph`, steps from the third on replay a
// capture of the step (forward, backward with the buckets' all-reduces, finish, loss scaler, SGD).
std::vector<double> reduced_losses(const std::shared_ptr<NcclComm>& nccl, bool graph, StepOptions options) {
  auto view = std::make_shared<TwoRankView>(nccl);
  auto model = gpu_model("resnet18", 3, 32, "cifar", 7);
  if (options.sync_bn) {
    EXPECT_GT(convert_sync_batchnorm(*model, view), 0);
  }
  SgdOptions so;
  so.lr = 0.05, so.momentum = 0.9, so.weight_decay = 5e-4;
  Sgd opt(model->named_parameters(), so);
  ReducerOptions ro;
  ro.bucket_cap_bytes = 4u << 20;  // several buckets in flight during backward
  GradientReducer reducer(view, model->named_parameters(), ro);
  EXPECT_GT(reducer.bucket_count(), 2);
  LossScalerOptions lo;
  lo.enabled = options.fp16;
  lo.init_scale = 1024.0;
  LossScaler scaler(lo);
  const std::vector<Variable> params = model->parameters();
  const std::optional<DType> half = options.fp16 ? std::optional<DType>(DType::f16) : std::nullopt;
  if (options.fp16) {
    scaler.keep_on_device(gpu());
    opt.skip_if(scaler.found_inf_flag());
  }
  Generator gen(11);
  auto [x, y] = cifar_batch(gen, 16, half);
  Variable loss;
  auto step = [&] {
    loss = autocast_loss(*model, x, y, half);
    scaler.scale_loss(loss).backward();
    reducer.finish();
    if (options.fp16) {
      scaler.unscale_on_device(params, [&](Tensor& flag) { view->all_reduce(flag, ReduceOp::max); });
      opt.step();
      scaler.update_on_device();
    } else {
      opt.step();
    }
    opt.zero_grad();
  };
  const std::vector<double> out =
      run_graph_steps({.steps = 12,
                       .capture_at = graph ? 2 : -1,
                       .load_batch =
                           [&](int) {
                             x.copy_(random(x.shape(), gen));
                             random_labels(y, gen);
                           },
                       .step = step,
                       .loss = [&] { return loss.item(); },
                       .after_replay = [&] { view->watch_graph_replay("resnet18 step"); }});
  EXPECT_EQ(reducer.last_buckets_launched_in_backward(), reducer.bucket_count());
  return out;
}

TEST_F(NcclGraph, AStepWithTheGradientAllReduceReplaysToTheEagerLossesBitwise) {
  testing::set_backend_option(&runtime::BackendOptions::deterministic, true);
  for (StepOptions options : {StepOptions{}, StepOptions{.sync_bn = true}, StepOptions{.fp16 = true}}) {
    const std::vector<double> eager = reduced_losses(comm_, false, options);
    const std::vector<double> replayed = reduced_losses(comm_, true, options);
    EXPECT_EQ(eager, replayed) << "sync_bn " << options.sync_bn << " fp16 " << options.fp16;
    EXPECT_TRUE(watchdog_drained());
  }
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
}

}  // namespace
}  // namespace trainer
