// Learning-rate schedule: linear warmup, then cosine decay to min_lr at the last step.
#pragma once
#include <cstdint>

namespace mx {

// The learning rate of step `step` (0-based) of `total` steps:
//   step < warmup: lr * (step + 1) / warmup
//   else: min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2, p = (step - warmup) / max(1, total - warmup)
double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_lr);

}  // namespace mx
