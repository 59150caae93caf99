// What the launcher says while it stops the ranks after a failure (issue 30, item 2): at once which
// rank failed and how long it waits, and when the grace ends which ranks it has to SIGKILL.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "app/launcher_process.h"

namespace trainer {
namespace {

using trainer::testing::Launcher;
using LaunchStop = trainer::testing::LauncherTest;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Rank 1 fails while rank 0 ignores SIGTERM. The launcher says at once that it is
// stopping the others and for how long it waits; when the grace ends it names rank 0, the frozen one.
TEST_F(LaunchStop, AFrozenRankIsNamedWhenTheGraceEnds) {
  const std::string ready = (dir_ / "ready").string();
  const std::string script = "if [ \"$RANK\" = 0 ]; then trap '' TERM; touch " + ready +
                             "; exec sleep 60; fi; "
                             "while [ ! -e " +
                             ready +
                             " ]; do sleep 0.02; done; echo \"trainer: error: rank 1 gives up\" >&2; exit 4";
  Launcher l(shell_ranks({"--nproc-per-node", "2"}, script), shell_env("1500"));
  EXPECT_EQ(l.wait_exit(60), 1) << l.output();
  const std::string out = l.output();
  const std::string at_once =
      "trainer launch: rank 1 failed (exit status 4); stopping the others, waiting up to 1500 ms for them to "
      "exit before SIGKILL\n";
  const std::string at_grace_end =
      "trainer launch: rank 0 did not exit within 1500 ms of SIGTERM (frozen?); sending SIGKILL\n";
  const std::string summary =
      "trainer launch: rank 1 failed (exit status 4); its last error line: trainer: error: rank 1 gives up\n";
  ASSERT_TRUE(contains(out, at_once)) << out;
  ASSERT_TRUE(contains(out, at_grace_end)) << out;
  ASSERT_TRUE(contains(out, summary)) << out;
  // In this order: the first line was not held back until the grace ended.
  EXPECT_LT(out.find("[rank 1] trainer: error: rank 1 gives up"), out.find(at_once)) << out;
  EXPECT_LT(out.find(at_once), out.find(at_grace_end)) << out;
  EXPECT_LT(out.find(at_grace_end), out.find(summary)) << out;
  trainer::testing::expect_gone(l.rank_pids());
}

}  // namespace
}  // namespace trainer
