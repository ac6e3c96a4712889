// The training loop: schedule, gradient accumulation, clipping, AdamW, validation, metrics,
// progress, checkpoints and resume, a text sample at the end.
#pragma once
#include <functional>
#include <string>

#include "train/config.h"

namespace mx {

// Runs the whole job. Returns the process exit code (0, or 130 / 143 after SIGINT / SIGTERM,
// once a checkpoint of the last completed step is written). Throws UserError / StorageError.
// A rank that makes no progress for train.hang_timeout_s ends itself (train/watchdog.h) with
// exit code kExitHang, from the watchdog's thread: `on_hang` gets its `error:` line first (the
// SageMaker entrypoint records it as the job's failure).
int run_training(const RunConfig& config,
                 const std::function<void(const std::string&)>& on_hang = {});

// The stop handlers run_training uses (SIGINT, SIGTERM; SIGUSR1, which mpirun relays, as
// SIGTERM: a stop at the next step boundary, with a checkpoint), installed from a training
// process's first instructions: a rank that mpirun relayed a stop to during its start-up
// (before MPI_Init returned) was killed by the default action, or missed it.
void install_stop_signal_handlers();

}  // namespace mx
