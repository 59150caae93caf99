// NcclComm through a real NCCL communicator at world size 1 (rank 0 of 1, its unique id shared through a
// TcpStore on a free loopback port): every collective on device tensors (and staged CPU tensors), the
// stream ordering against the compute stream, and ProcessGroup's backend choice. Multi-GPU runs are
// covered by the launcher on a multi-GPU host.
#include "dist/nccl_comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist/error.h"
#include "dist/gradient_reducer.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/nccl_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;
using namespace std::chrono_literals;

class Nccl : public OneRankNcclTest {
 protected:
  Nccl() : OneRankNcclTest(/*watchdog_store=*/true) {}
};

Tensor values(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_vector<float>(v, shape);
}

TEST_F(Nccl, IsARealNcclCommunicatorOfOneRank) {
  EXPECT_EQ(comm_->backend_name(), "nccl");
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->world_size(), 1);
  EXPECT_NE(comm_->stream().handle(), nullptr);
  EXPECT_NE(comm_->stream().handle(), static_cast<void*>(cuda_stream()));
}

TEST_F(Nccl, AllReduceSumAvgMaxOnDevice) {
  const Tensor host = values({1.5f, -2.0f, 3.25f, 0.0f, -7.5f, 1e-3f}, {2, 3});
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    Tensor t = on_gpu(host);
    comm_->all_reduce(t, op);
    expect_equal(host, t.to(Device::cpu()), std::string(reduce_op_name(op)));
  }
  // Other dtypes NCCL reduces natively.
  for (DType dt : {DType::f64, DType::bf16, DType::f16}) {
    Tensor t = on_gpu(host.to(dt));
    comm_->all_reduce(t, ReduceOp::avg);
    expect_equal(host.to(dt).to(DType::f32), t.to(Device::cpu()).to(DType::f32), std::string(dtype_name(dt)));
  }
  Tensor i = on_gpu(Tensor::from_vector<int64_t>({5, -3, 1LL << 40}, {3}));
  comm_->all_reduce(i, ReduceOp::max);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{5, -3, 1LL << 40}));
  EXPECT_THROW(comm_->all_reduce(i, ReduceOp::avg), DistError);
}

// The result is ordered on the compute stream: work queued after wait() sees it, before any host sync.
TEST_F(Nccl, AsyncAllReduceIsOrderedAgainstTheComputeStream) {
  Generator gen(7);
  const Tensor host = random({1 << 20}, gen);  // 4 MiB: the collective takes real time
  Tensor t = on_gpu(host);
  t.fill_(2.0);  // queued on the compute stream just before: NCCL must see it
  auto work = comm_->all_reduce_async(t, ReduceOp::sum);
  work->wait();  // compute stream waits; the host does not
  Tensor doubled = dev().binary_scalar(BinaryOp::mul, t, 3.0, false);  // compute stream, after the collective
  const std::vector<float> out = doubled.to_vector<float>();
  for (size_t k = 0; k < out.size(); k += 4099) ASSERT_EQ(out[k], 6.0f) << k;
  EXPECT_TRUE(work->completed());
  // Many in flight at once, waited in order (the reducer's bucket pattern).
  std::vector<Tensor> buckets;
  std::vector<std::shared_ptr<Work>> works;
  for (int b = 0; b < 8; ++b) {
    buckets.push_back(Tensor::full({4096 * (b + 1)}, b + 0.5, DType::f32, gpu()));
    works.push_back(comm_->all_reduce_async(buckets.back(), ReduceOp::avg));
  }
  for (auto& w : works) w->wait();
  for (int b = 0; b < 8; ++b) EXPECT_EQ(buckets[b].to_vector<float>().back(), b + 0.5f);
}

TEST_F(Nccl, AllReduceOfNonContiguousAndCpuTensors) {
  const Tensor host = values({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor base = on_gpu(host);
  Tensor transposed = base.permute({1, 0});  // [3, 2], not contiguous
  ASSERT_FALSE(transposed.is_contiguous());
  comm_->all_reduce(transposed, ReduceOp::sum);
  expect_equal(host, base.to(Device::cpu()), "non-contiguous");
  // The training loop's stop flag and evaluation sums are CPU tensors: staged through the device.
  Tensor flag = Tensor::from_vector<int64_t>({1}, {1});
  comm_->all_reduce(flag, ReduceOp::max);
  EXPECT_EQ(flag.item(), 1.0);
  Tensor sums = Tensor::from_vector<double>({0.25, 1e10, -3.0}, {3});
  comm_->all_reduce(sums, ReduceOp::sum);
  EXPECT_EQ(sums.to_vector<double>(), (std::vector<double>{0.25, 1e10, -3.0}));
}

TEST_F(Nccl, Broadcast) {
  const Tensor host = values({3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
  Tensor t = on_gpu(host);
  comm_->broadcast(t, 0);
  expect_equal(host, t.to(Device::cpu()), "device");
  Tensor c = host.clone();
  comm_->broadcast(c, 0);
  expect_equal(host, c, "cpu");
  EXPECT_THROW(comm_->broadcast(t, 1), DistError);
}

TEST_F(Nccl, AllGather) {
  const Tensor host = values({1, 2, 3, 4, 5, 6}, {3, 2});
  const std::vector<Tensor> parts = comm_->all_gather(on_gpu(host));
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_TRUE(parts[0].device().is_cuda());
  expect_equal(host, parts[0].to(Device::cpu()), "device");
  const std::vector<Tensor> cpu_parts = comm_->all_gather(host);
  ASSERT_EQ(cpu_parts.size(), 1u);
  EXPECT_TRUE(cpu_parts[0].device().is_cpu());
  expect_equal(host, cpu_parts[0], "cpu");
  // Zero rows (a rank with no evaluation samples left) and a scalar.
  const std::vector<Tensor> empty = comm_->all_gather(Tensor::empty({0, 5}, DType::f32, gpu()));
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].shape(), (Shape{0, 5}));
  const Tensor cat = comm_->all_gather_cat(on_gpu(Tensor::from_vector<int64_t>({7, 8}, {2})));
  EXPECT_EQ(cat.to_vector<int64_t>(), (std::vector<int64_t>{7, 8}));
}

TEST_F(Nccl, BarrierAndShutdown) {
  comm_->barrier();
  comm_->barrier();
  Tensor t = on_gpu(values({1}, {1}));
  comm_->all_reduce(t, ReduceOp::sum);
  comm_->shutdown();
  EXPECT_THROW(comm_->barrier(), DistError);
  comm_->shutdown();  // idempotent
}

TEST_F(Nccl, AbortFailsLaterCallsWithTheReason) {
  comm_->abort("test abort");
  try {
    Tensor t = on_gpu(values({1}, {1}));
    comm_->all_reduce(t, ReduceOp::sum);
    FAIL() << "expected an error";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
  }
  comm_->shutdown();  // after a failure: releases without communicating
}

// At world size 1 the reducer is inactive (no hooks) and finish() leaves gradients as they are.
TEST_F(Nccl, GradientReducerAtWorldSizeOneLeavesGradientsUnchanged) {
  Generator gen(3);
  const Tensor g_host = random({4, 3}, gen);
  Variable w(on_gpu(random({4, 3}, gen)), true);
  w.grad() = on_gpu(g_host);
  GradientReducer reducer(comm_, {{"w", w}});
  EXPECT_FALSE(reducer.active());
  reducer.finish();
  expect_equal(g_host, w.grad().to(Device::cpu()), "grad");
  broadcast_state(*comm_, {});
}

// ProcessGroup's backend choice (needs no second process).
TEST(NcclProcessGroup, BackendSelection) {
  DistOptions o;
  o.device = Device::cpu();
  EXPECT_EQ(resolve_comm_backend(o), "tcp");
  o.device = Device::cuda(0);
  EXPECT_EQ(resolve_comm_backend(o), "nccl");
  o.backend = "tcp";
  EXPECT_EQ(resolve_comm_backend(o), "tcp");
  o.backend = "nccl";
  EXPECT_EQ(resolve_comm_backend(o), "nccl");
  o.device = Device::cpu();
  try {
    resolve_comm_backend(o);
    FAIL() << "expected an error";
  } catch (const DistError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("\"nccl\" needs the model on a GPU"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT:"), std::string::npos) << msg;
  }
  o.backend = "gloo";
  EXPECT_THROW(resolve_comm_backend(o), DistError);
  // World size 1: no communication at all, whatever the backend.
  ProcessEnv env;
  DistOptions one;
  one.device = Device::cuda(0);
  auto pg = ProcessGroup::init(env, one);
  EXPECT_EQ(pg->comm().backend_name(), "single");
}

}  // namespace
}  // namespace trainer
