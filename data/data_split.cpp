#include "data/data_split.h"

#include <cmath>

#include "core/error.h"

namespace mx {

DataSplit split_train_val(int64_t num_tokens, double val_fraction, int64_t seq_len) {
  MX_REQUIRE(val_fraction >= 0.0 && val_fraction < 1.0, "data.val_fraction must be in [0, 1), got ",
             val_fraction);
  MX_REQUIRE(seq_len >= 1, "seq_len must be >= 1, got ", seq_len);
  MX_ASSERT(num_tokens >= 0, "num_tokens ", num_tokens);
  const int64_t window = seq_len + 1;
  int64_t val = std::llround(static_cast<double>(num_tokens) * val_fraction);
  if (val_fraction > 0.0 && val < window && num_tokens - window >= window) val = window;
  // A validation range that cannot hold one window would only fail later; give it to training.
  if (val < window) val = 0;
  const int64_t cut = num_tokens - val;
  // The data is long enough; what val_fraction left for training is not (the window sampler's
  // message would blame the file).
  MX_REQUIRE(val == 0 || cut >= window, "data.val_fraction = ", val_fraction, " holds out ", val,
             " of the data's ", num_tokens, " tokens, leaving ", cut, " for training: one ",
             "window needs seq_len + 1 = ", window, " (lower data.val_fraction)");
  return DataSplit{0, cut, cut, num_tokens};
}

}  // namespace mx
