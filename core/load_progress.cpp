#include "core/load_progress.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <utility>

#include "core/log.h"
#include "core/stop.h"

namespace mx {

LoadProgress::LoadProgress(std::string what, int64_t total_bytes, bool stoppable)
    : what_(std::move(what)),
      total_(total_bytes),
      stoppable_(stoppable),
      start_(Clock::now()),
      last_(start_) {
  if (const char* p = std::getenv("MXTRAIN_TEST_PROGRESS_S")) period_ = std::atof(p);
  if (const char* s = std::getenv("MXTRAIN_TEST_SLOW_LOAD_MS")) slow_ms_ = std::atoi(s);
}

void LoadProgress::before_piece() {
  if (stoppable_ && g_stop_request.load()) throw StopRequested{};
  if (slow_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
}

void LoadProgress::after_piece(int64_t bytes) {
  done_ += bytes;
  const auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_).count() < period_) return;
  last_ = now;
  const int percent = int(100.0 * double(done_) / double(std::max<int64_t>(total_, 1)));
  info(what_, ": ", format_bytes(double(done_)), " of ", format_bytes(double(total_)), " (",
       percent, "%), ", format_duration(std::chrono::duration<double>(now - start_).count()));
}

}  // namespace mx
