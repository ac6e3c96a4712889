// Train / validation split of one token sequence: validation is the tail, so it is a fixed,
// contiguous held-out range that no training window ever reads.
#pragma once
#include <cstdint>

namespace mx {

struct DataSplit {
  int64_t train_begin, train_end, val_begin, val_end;
};

// The last round(num_tokens * val_fraction) tokens are validation, raised to seq_len + 1 (one
// whole window) when val_fraction > 0 and the train part can still hold a window too. If even
// that leaves validation shorter than one window, validation is empty (val_begin == val_end ==
// num_tokens) and training keeps all tokens. UserError unless 0 <= val_fraction < 1.
DataSplit split_train_val(int64_t num_tokens, double val_fraction, int64_t seq_len);

}  // namespace mx
