#include "dist/consistency.h"

#include <gtest/gtest.h>

#include "dist/error.h"
#include "multi_process.h"

namespace trainer {
namespace {

using namespace testing;

RunIdentity identity() {
  RunIdentity id;
  id.build = "trainer 0.1.0 (b51c007, cpu)";
  id.config_hash = content_hash("[train]\nepochs = 3\n");
  id.dataset_fingerprint = "fashion-mnist train 60000 images 28x28x1 crc 9a3b";
  id.steps_per_epoch = 468;
  return id;
}

std::vector<std::string> check_all(int world, const std::function<void(int, RunIdentity&)>& change,
                                   std::chrono::milliseconds timeout = 5s, int ranks_calling = -1) {
  ThreadWorld w(world);
  return run_threads(ranks_calling < 0 ? world : ranks_calling, [&](int rank) {
    auto store = w.client();
    RunIdentity id = identity();
    change(rank, id);
    check_consistency(*store, rank, world, run_identity_items(id), timeout);
  });
}

TEST(Consistency, IdenticalRanksPass) {
  for (const auto& e : check_all(3, [](int, RunIdentity&) {})) EXPECT_EQ(e, "");
}

TEST(Consistency, DifferentConfigStopsEveryRankNamingTheRank) {
  const auto errors = check_all(3, [](int rank, RunIdentity& id) {
    if (rank == 1) id.config_hash = content_hash("[train]\nepochs = 4\n");
  });
  const std::string a = content_hash("[train]\nepochs = 3\n"), b = content_hash("[train]\nepochs = 4\n");
  for (const auto& e : errors) {
    EXPECT_EQ(e, errors[0]);  // every rank stops with the same message
    EXPECT_NE(e.find("rank(s) 1 differ from rank 0"), std::string::npos) << e;
    EXPECT_NE(e.find("config hash: '" + a + "' on rank(s) 0, 2; '" + b + "' on rank(s) 1."),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("HINT: start every rank with the same config"), std::string::npos) << e;
    EXPECT_EQ(e.find("dataset fingerprint"), std::string::npos) << e;
  }
}

TEST(Consistency, DifferentDataAndStepCounts) {
  const auto errors = check_all(4, [](int rank, RunIdentity& id) {
    if (rank >= 2) id.dataset_fingerprint = "fashion-mnist train 59999 images";
    if (rank == 3) id.steps_per_epoch = 469;
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rank(s) 2, 3 differ from rank 0"), std::string::npos) << e;
    EXPECT_NE(e.find("dataset fingerprint:"), std::string::npos) << e;
    EXPECT_NE(e.find("'fashion-mnist train 59999 images' on rank(s) 2, 3"), std::string::npos) << e;
    EXPECT_NE(e.find("steps per epoch: '468' on rank(s) 0-2; '469' on rank(s) 3."), std::string::npos) << e;
  }
}

// A distinct item (the GPU each rank trains on) stops the ranks that share a value, and only those
// ranks and values are named; ranks with their own values pass.
TEST(Consistency, RanksSharingADistinctItemAreNamed) {
  auto check = [](const std::vector<std::string>& gpus) {
    const int world = static_cast<int>(gpus.size());
    ThreadWorld w(world);
    return run_threads(world, [&](int rank) {
      auto store = w.client();
      check_consistency(*store, rank, world,
                        {{"config hash", "same", "same config"},
                         {"GPU", gpus[rank], "one GPU per rank", /*distinct=*/true}},
                        5s);
    });
  };
  for (const auto& e : check({"host-a GPU-0", "host-a GPU-1", "host-b GPU-0"})) EXPECT_EQ(e, "");
  const auto errors = check({"host-a GPU-0", "host-a GPU-1", "host-a GPU-0", "host-b GPU-0"});
  for (const auto& e : errors) {
    EXPECT_EQ(e, errors[0]);
    EXPECT_NE(e.find("rank(s) 0, 2 share what must be their own"), std::string::npos) << e;
    EXPECT_NE(e.find("GPU shared: 'host-a GPU-0' on rank(s) 0, 2. HINT: one GPU per rank"), std::string::npos)
        << e;
    EXPECT_EQ(e.find("differ from rank 0"), std::string::npos) << e;
    EXPECT_EQ(e.find("host-b"), std::string::npos) << e;
  }
}

TEST(Consistency, MissingRankIsNamed) {
  const auto errors = check_all(
      3, [](int, RunIdentity&) {}, 500ms, /*ranks_calling=*/2);
  for (const auto& e : errors) {
    EXPECT_NE(
        e.find(
            "the startup consistency check timed out after 500 ms: 2 of 3 ranks arrived; missing rank(s): 2"),
        std::string::npos)
        << e;
  }
}

TEST(Consistency, EpochStepCheckThroughTheCommunicator) {
  ThreadWorld w(3);
  const auto errors = run_threads(3, [&](int rank) {
    auto store = w.client();
    auto comm = w.comm(*store, rank);
    check_epoch_steps(*comm, 0, 100);  // agree
    check_epoch_steps(*comm, 1, rank == 2 ? 101 : 100);
  });
  for (const auto& e : errors) {
    EXPECT_NE(
        e.find("ranks disagree on the number of steps in epoch 2: 100 on rank(s) 0, 1; 101 on rank(s) 2."),
        std::string::npos)
        << e;
    EXPECT_NE(e.find("HINT"), std::string::npos) << e;
  }
}

// Connected ranks agree through one all_gather of a hash; ranks that differ get the same detailed
// message as from the store alone, naming the item, the values and the ranks.
TEST(Consistency, ConnectedRanksCompareAHashAndNameWhatDiffers) {
  ThreadWorld w(3);
  const auto errors = run_threads(3, [&](int rank) {
    auto store = w.client();
    auto comm = w.comm(*store, rank);
    check_consistency_connected(*comm, *store, rank, 3, {{"resume point", "step 9", "same checkpoint"}}, 5s,
                                "agree");
    check_consistency_connected(*comm, *store, rank, 3,
                                {{"resume point", rank == 1 ? "a fresh start" : "step 9", "same checkpoint"}},
                                5s, "differ");
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("the differ check failed: rank(s) 1 differ from rank 0"), std::string::npos) << e;
    EXPECT_NE(e.find("resume point: 'step 9' on rank(s) 0, 2; 'a fresh start' on rank(s) 1. HINT: same "
                     "checkpoint"),
              std::string::npos)
        << e;
  }
}

// The hook that lets a real multi-GPU run show the check: one rank claims more steps than it has
// (TRAINER_TEST_EPOCH_STEPS=1:3, read at start-up: tests/app/fault_injection_test.cpp).
TEST(Consistency, TestHookMakesOneRankClaimMoreSteps) {
  ThreadWorld w(2);
  const auto errors = run_threads(2, [&](int rank) {
    auto store = w.client();
    auto comm = w.comm(*store, rank);
    check_epoch_steps(*comm, 0, 50, rank == 1 ? 3 : 0);
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors)
    EXPECT_NE(e.find("ranks disagree on the number of steps in epoch 1: 50 on rank(s) 0; 53 on rank(s) 1."),
              std::string::npos)
        << e;
}

TEST(Consistency, ContentHashIsStable) {
  EXPECT_EQ(content_hash(""), "cbf29ce484222325");
  EXPECT_EQ(content_hash("a"), "af63dc4c8601ec8c");
}

}  // namespace
}  // namespace trainer
