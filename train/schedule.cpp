#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace mx {

double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_lr) {
  if (step < warmup) return lr * double(step + 1) / double(warmup);
  double p = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  p = std::clamp(p, 0.0, 1.0);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * p));
}

}  // namespace mx
