// The hang watchdog's clock, against wall time measured here: it fires once, after the limit,
// with the last progress's description; beats, disarming and 0 keep it quiet; the limit grows
// with the longest interval. Limits are generous against a loaded 2-core machine's stalls.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "train/watchdog.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Fired {
  std::mutex mu;
  int count = 0;
  std::string what;
  double idle_s = 0, limit_s = 0;
  Clock::time_point at;
  mx::Watchdog::OnHang handler() {
    return [this](const std::string& w, double idle, double limit) {
      std::lock_guard<std::mutex> lock(mu);
      ++count;
      what = w;
      idle_s = idle;
      limit_s = limit;
      at = Clock::now();
    };
  }
  int fired() {
    std::lock_guard<std::mutex> lock(mu);
    return count;
  }
};

// Waits up to `within` for the handler to have run; true if it did.
bool wait_fired(Fired& f, std::chrono::milliseconds within) {
  const auto end = Clock::now() + within;
  while (Clock::now() < end) {
    if (f.fired()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return f.fired() > 0;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST(Watchdog, FiresOnceAfterTheLimitWithTheLastProgress) {
  Fired f;
  mx::Watchdog w(0.3, f.handler());
  const auto t0 = Clock::now();
  w.arm("step 1's start");
  w.beat("step 1, micro-batch 2 of 4");
  ASSERT_TRUE(wait_fired(f, 10s));
  EXPECT_EQ(f.what, "step 1, micro-batch 2 of 4");
  EXPECT_GE(seconds(f.at - t0), 0.3);
  EXPECT_GE(f.idle_s, 0.3);
  EXPECT_DOUBLE_EQ(f.limit_s, 0.3);
  std::this_thread::sleep_for(800ms);  // still armed, still no progress: once only
  EXPECT_EQ(f.fired(), 1);
}

TEST(Watchdog, BeatsKeepItQuiet) {
  Fired f;
  mx::Watchdog w(1.0, f.handler());
  w.arm("step 1's start");
  for (int i = 0; i < 60; ++i) {  // 1.8 s of progress every 30 ms
    std::this_thread::sleep_for(30ms);
    w.beat("micro-batch " + std::to_string(i));
  }
  w.disarm();
  EXPECT_EQ(f.fired(), 0);
}

TEST(Watchdog, DisarmedOrOffItNeverFires) {
  Fired f, off;
  mx::Watchdog w(0.2, f.handler());
  mx::Watchdog none(0, off.handler());
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(none.limit_s(), 0);
  w.arm("step 1's start");
  none.arm("step 1's start");
  w.disarm();  // (a checkpoint's save)
  std::this_thread::sleep_for(700ms);
  EXPECT_EQ(f.fired(), 0);
  EXPECT_EQ(off.fired(), 0);
  w.arm("step 2's start");  // armed again: the clock starts now, not at the disarm
  ASSERT_TRUE(wait_fired(f, 10s));
  EXPECT_EQ(f.what, "step 2's start");
}

TEST(Watchdog, ABeatAfterADisarmArmsIt) {
  Fired f;
  mx::Watchdog w(0.2, f.handler());
  w.arm("step 1's start");
  w.disarm();
  std::this_thread::sleep_for(100ms);  // (the thread now waits for a notification)
  w.beat("validation batch 1 of 4 after step 1");
  ASSERT_TRUE(wait_fired(f, 10s));
  EXPECT_EQ(f.what, "validation batch 1 of 4 after step 1");
}

TEST(Watchdog, TheLimitGrowsWithTheLongestInterval) {
  Fired g;
  mx::Watchdog slow(2.0, g.handler(), /*adapt=*/4.0);
  EXPECT_DOUBLE_EQ(slow.limit_s(), 2.0);
  const auto t0 = Clock::now();
  slow.arm("step 1's start");
  std::this_thread::sleep_for(600ms);
  const auto t1 = Clock::now();
  slow.beat("step 1, micro-batch 2 of 2");
  const double first = seconds(Clock::now() - t0);
  // the limit is now 4 x the first interval (>= 2.4 s), above the 2 s given
  EXPECT_GE(slow.limit_s(), 4.0 * 0.6);
  EXPECT_LE(slow.limit_s(), 4.0 * first + 1e-9);
  ASSERT_TRUE(wait_fired(g, 20s));
  EXPECT_GE(seconds(g.at - t1), 4.0 * 0.6);  // not at the 2 s timeout
  EXPECT_GE(g.limit_s, 4.0 * 0.6);
  EXPECT_EQ(g.what, "step 1, micro-batch 2 of 2");
  // an interval across a disarm (a checkpoint) does not count
  Fired h;
  mx::Watchdog across(0.5, h.handler(), 4.0);
  across.arm("step 1's start");
  across.disarm();
  std::this_thread::sleep_for(700ms);
  across.arm("step 2's start");
  across.beat("step 2, micro-batch 1 of 1");
  EXPECT_LT(across.limit_s(), 4.0 * 0.5);
  across.disarm();
}

}  // namespace
