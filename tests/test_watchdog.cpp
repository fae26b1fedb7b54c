// The training watchdog and the transports' abort hooks: hooks run in registration order, once,
// never after their owner unregistered, a failing hook is reported rather than thrown; and a
// watchdog that sees no progress ends the process with exit status 1, naming the collective the
// rank is blocked in and each transport it aborted (an NCCL communicator registers
// ncclCommAbort there; here a stand-in).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "apps/watchdog.hpp"
#include "parallel/communicator.hpp"

namespace colossal {
namespace {

TEST(AbortHooks, RunOnceNewestFirstAndNeverAfterUnregister) {
  std::vector<int> calls;
  const int a = parallel::register_abort_hook("first", [&] { calls.push_back(1); });
  const int b = parallel::register_abort_hook("gone", [&] { calls.push_back(2); });
  parallel::register_abort_hook("failing", [] { throw std::runtime_error("no device"); });
  parallel::register_abort_hook("last", [&] { calls.push_back(4); });
  EXPECT_NE(a, b);
  parallel::unregister_abort_hook(b);
  const std::vector<std::string> ran = parallel::run_abort_hooks();
  EXPECT_EQ(calls, (std::vector<int>{4, 1}));
  ASSERT_EQ(ran.size(), 3u);
  EXPECT_EQ(ran[0], "last");
  EXPECT_EQ(ran[1], "failing (failed: no device)");
  EXPECT_EQ(ran[2], "first");
  EXPECT_TRUE(parallel::run_abort_hooks().empty()) << "each hook runs once";
  EXPECT_EQ(calls.size(), 2u);
  parallel::unregister_abort_hook(a);  // already forgotten: harmless
}

// A rank stuck with no progress: the watchdog's message, then the hooks, then exit status 1.
void stall_under_the_watchdog() {
  parallel::register_abort_hook("stand-in transport of 2 ranks",
                                [] { std::fprintf(stderr, "stand-in aborted\n"); });
  apps::Watchdog watchdog(0.3, 5);
  watchdog.progress(7, "in the step");
  std::this_thread::sleep_for(std::chrono::seconds(20));  // never reached: the watchdog ends it
}

TEST(WatchdogDeathTest, EndsTheRankAndAbortsTheTransports) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(stall_under_the_watchdog(), ::testing::ExitedWithCode(1),
              "rank 5.*watchdog: no progress for 0 s \\(step 7, in the step; "
              "train.watchdog_seconds = 0.3\\)(.|\n)*stand-in aborted(.|\n)*watchdog: aborted the "
              "stand-in transport of 2 ranks");
}

}  // namespace
}  // namespace colossal
