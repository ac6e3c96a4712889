// The training loop: schedule, gradient accumulation, clipping, AdamW, validation, metrics,
// progress, checkpoints and resume, a text sample at the end.
#pragma once
#include "train/config.h"

namespace mx {

// Runs the whole job. Returns the process exit code (0, or 130 / 143 after SIGINT / SIGTERM,
// once a checkpoint of the last completed step is written). Throws UserError / StorageError.
int run_training(const RunConfig& config);

}  // namespace mx
