// A stop asked for by a signal, for work that is not a training step: `mxtrain train`'s
// handlers (train/trainer.cpp) set it; long start-up work (the data's id scan) polls it.
#pragma once
#include <atomic>
#include <exception>

namespace mx {

// The signal that asked for the stop: SIGINT or SIGTERM (SIGUSR1 is taken as SIGTERM); 0: none.
inline std::atomic<int> g_stop_request{0};
// The SIGTERMs (and SIGUSR1s) taken so far: a new one is seen even when a stop was already
// asked for (g_stop_request then stays SIGTERM).
inline std::atomic<int> g_sigterm_count{0};

// Thrown by start-up work that saw g_stop_request; the trainer catches it, agrees on the stop
// with the other ranks and ends the run before its first step (nothing trained, nothing saved).
struct StopRequested : std::exception {
  const char* what() const noexcept override { return "stopped by a signal during start-up"; }
};

}  // namespace mx
