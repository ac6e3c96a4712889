// The training loop's hang watchdog (train.hang_timeout_s). A rank stuck without dying (a peer
// stopped or hung inside a collective, a wedged GPU, a deadlock in our own code) leaves every
// other rank waiting in its next collective forever: mpirun ends a job only when a rank exits.
// On a paid cluster that is hours of idle nodes. The trainer reports progress here (a
// micro-batch done, the optimizer step, a validation batch); a thread of this class calls
// `on_hang` once when no progress came for the limit, and the trainer's handler ends the job.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace mx {

// The exit code of a run the watchdog ended (2 is bad input, 3 storage, 130 / 143 a stop).
inline constexpr int kExitHang = 4;
// The limit grows to this many times the longest interval between progress reports so far.
inline constexpr double kHangAdapt = 10.0;

class Watchdog {
 public:
  // what: the last progress's description ("step 12, micro-batch 3 of 8"); idle_s: the seconds
  // since it; limit_s: the limit that ran out. Called on the watchdog's own thread, at most once.
  using OnHang = std::function<void(const std::string& what, double idle_s, double limit_s)>;

  // timeout_s <= 0: off (no thread; arm, beat and disarm do nothing). The limit on an interval
  // is the larger of timeout_s and `adapt` times the longest interval between beats so far, so
  // a run whose micro-batch legitimately takes longer than timeout_s is not ended after its
  // first one; the first interval is bounded by timeout_s alone.
  Watchdog(double timeout_s, OnHang on_hang, double adapt = kHangAdapt);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts watching from now (work that must make progress begins: a step).
  void arm(const std::string& what);
  // Progress: the clock restarts and `what` describes the work now under way (armed, if it
  // was not).
  void beat(const std::string& what);
  // Stops watching (work with its own limits: a checkpoint's storage requests, the run's end).
  void disarm();

  bool enabled() const { return timeout_s_ > 0; }
  // The limit the next interval gets, in seconds (0 when off).
  double limit_s() const;

 private:
  using Clock = std::chrono::steady_clock;
  void run();
  double limit_locked() const;  // limit_s's value, mu_ held

  const double timeout_s_;
  const double adapt_;
  OnHang on_hang_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool quit_ = false;
  bool fired_ = false;
  Clock::time_point last_;
  double longest_s_ = 0;  // the longest interval between beats while armed
  std::string what_;
  std::thread thread_;
};

}  // namespace mx
