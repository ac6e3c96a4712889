#include "train/watchdog.h"

#include <algorithm>

namespace mx {

Watchdog::Watchdog(double timeout_s, OnHang on_hang, double adapt)
    : timeout_s_(timeout_s), adapt_(adapt), on_hang_(std::move(on_hang)) {
  if (enabled()) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::arm(const std::string& what) {
  if (!enabled()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    last_ = Clock::now();
    what_ = what;
  }
  cv_.notify_all();
}

void Watchdog::beat(const std::string& what) {
  if (!enabled()) return;
  bool was_armed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    was_armed = armed_;
    if (armed_) longest_s_ = std::max(longest_s_, std::chrono::duration<double>(now - last_).count());
    armed_ = true;
    last_ = now;
    what_ = what;
  }
  // Armed, the thread's wait ends at the old deadline and then waits again from the new one:
  // no wake-up a micro-batch. Disarmed, it waits for a notification.
  if (!was_armed) cv_.notify_all();
}

void Watchdog::disarm() {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

double Watchdog::limit_s() const {
  if (!enabled()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  return limit_locked();
}

double Watchdog::limit_locked() const { return std::max(timeout_s_, adapt_ * longest_s_); }

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!quit_) {
    if (!armed_ || fired_) {
      cv_.wait(lock);
      continue;
    }
    const double limit = limit_locked();
    const auto deadline = last_ + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(limit));
    if (Clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      continue;  // (woken early, or a beat moved the deadline: look again)
    }
    fired_ = true;
    const std::string what = what_;
    const double idle = std::chrono::duration<double>(Clock::now() - last_).count();
    lock.unlock();
    on_hang_(what, idle, limit);
    lock.lock();
  }
}

}  // namespace mx
