// Progress and stopping for long start-up reads (a checkpoint's shards, a Hugging Face model's
// weights: minutes for a large model, from S3 or a network file system). Every `period` seconds
// (10; MXTRAIN_TEST_PROGRESS_S in tests) an info line "WHAT: X of Y (P%), T"; in the trainer's
// start-up, before each piece, a stop asked for by a signal (core/stop.h's g_stop_request)
// throws StopRequested, which the trainer agrees on with the other ranks. MXTRAIN_TEST_SLOW_LOAD_MS pauses before each piece,
// so that tests can stop a load in the middle.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace mx {

class LoadProgress {
 public:
  // `stoppable`: the trainer's start-up, which agrees on a StopRequested with the other ranks.
  // Elsewhere (export, generate, the SageMaker entrypoint's export after a training whose
  // stop handlers are still installed) a signal must not throw out of the load.
  LoadProgress(std::string what, int64_t total_bytes, bool stoppable);
  void before_piece();              // StopRequested once a stop is asked for (when stoppable)
  void after_piece(int64_t bytes);  // counts them; a line when the period has passed

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_;
  int64_t total_ = 0, done_ = 0;
  double period_ = 10.0;
  int slow_ms_ = 0;
  bool stoppable_ = false;
  Clock::time_point start_, last_;
};

}  // namespace mx
