// Distributed evaluation is exact: 3 ranks, each its contiguous EvalShard of a dataset whose size is
// not a multiple of 3, combined with combine_across_ranks (sums all-reduced, scores all-gathered), give
// bit-identical accuracy, confusion matrix, scores and ROC-AUC to one rank evaluating everything.
#include <gtest/gtest.h>

#include <cmath>

#include "data/distributed_sampler.h"
#include "metrics/eval_metrics.h"
#include "multi_process.h"
#include "nn/backend.h"

namespace trainer {
namespace {

using namespace testing;

constexpr int64_t kClasses = 4;

// Logits of samples `indices` ([n, K]); every third sample repeats an earlier one, so scores tie.
Tensor logits_of(const std::vector<int64_t>& indices) {
  std::vector<float> v;
  for (int64_t i : indices) {
    const int64_t s = i % 3 == 2 ? i - 2 : i;
    for (int64_t c = 0; c < kClasses; ++c) v.push_back(2.0f * std::sin(1.1f * s + 0.7f * c) + 0.3f * c);
  }
  return Tensor::from_vector(v, {static_cast<int64_t>(indices.size()), kClasses});
}

Tensor labels_of(const std::vector<int64_t>& indices) {
  std::vector<int64_t> v;
  for (int64_t i : indices) v.push_back((i * 7 + i / 3) % kClasses);
  return Tensor::from_vector(v, {static_cast<int64_t>(indices.size())});
}

// Evaluates `indices` in batches of 3, as the loader would.
EvalMetrics evaluate_indices(const std::vector<int64_t>& indices) {
  EvalMetrics m(kClasses, true);
  for (size_t b = 0; b < indices.size(); b += 3) {
    const std::vector<int64_t> batch(indices.begin() + b, indices.begin() + std::min(indices.size(), b + 3));
    const Tensor logits = logits_of(batch), labels = labels_of(batch);
    auto [loss, probs] = backend_for(logits).cross_entropy(logits, labels, 0.0);
    m.add_batch(logits, labels, loss, probs);
  }
  return m;
}

void check_three_ranks_equal_one(int64_t dataset_size) {
  const int world = 3, port = free_port();
  const auto out = run_processes(world, [&](int rank) {
    Rank me(rank, world, port, 10s);
    const EvalMetrics one = evaluate_indices(EvalShard(dataset_size, 1, 0).indices());
    const EvalMetrics all =
        combine_across_ranks(evaluate_indices(EvalShard(dataset_size, world, rank).indices()), *me.comm);
    auto fail = [&](const std::string& what) { throw std::runtime_error(what + " differs from one rank"); };
    if (all.count() != dataset_size || all.count() != one.count()) fail("count");
    if (all.top1() != one.top1()) fail("top1");
    if (all.top5() != one.top5()) fail("top5");
    if (all.confusion() != one.confusion()) fail("confusion matrix");
    if (all.labels() != one.labels()) fail("labels");
    if (all.scores() != one.scores()) fail("scores");
    const double a = all.auc(), b = one.auc();
    if (!(a == b || (std::isnan(a) && std::isnan(b))))
      fail("auc " + std::to_string(a) + " vs " + std::to_string(b));
    if (dataset_size >= 8 && std::isnan(a)) fail("auc is NaN");
    if (std::abs(all.mean_loss() - one.mean_loss()) > 1e-12) fail("mean loss");
    me.comm->shutdown();
  });
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

TEST(DistributedEvaluation, ThreeRanksOnTenSamplesEqualOneRankBitForBit) { check_three_ranks_equal_one(10); }
TEST(DistributedEvaluation, ARankWithAnEmptyShard) { check_three_ranks_equal_one(2); }

TEST(DistributedEvaluation, WorldSizeOneReturnsTheLocalMetrics) {
  SingleProcessComm single;
  const EvalMetrics local = evaluate_indices(EvalShard(7, 1, 0).indices());
  const EvalMetrics m = combine_across_ranks(local, single);
  EXPECT_EQ(m.count(), 7);
  EXPECT_EQ(m.scores(), local.scores());
  EXPECT_EQ(m.auc(), local.auc());
}

}  // namespace
}  // namespace trainer
