// Deterministic, resumable sampling of training windows of seq_len + 1 tokens (inputs and the
// targets shifted by one). Which window a sample gets is a pure function of (seed, sample index),
// so resuming restores one counter, and any rank can compute its share of a global batch alone.
#pragma once
#include <cstdint>

#include "data/token_dataset.h"

namespace mx {

// The range [begin, end) is cut into W = (end - begin - 1) / seq_len non-overlapping windows;
// window w starts at begin + w * seq_len (consecutive windows share one boundary token: the last
// target of one is the first input of the next). Sample i belongs to epoch e = i / W and reads
// window perm_e(i % W), perm_e a permutation of [0, W) keyed by (seed, e): every epoch visits
// every window exactly once, and each epoch in a new order. With shuffle = false, perm_e is the
// identity (sample i reads window i % W): the order a reference implementation can replay.
class WindowSampler {
 public:
  // UserError if [begin, end) holds fewer than seq_len + 1 tokens. The dataset must outlive this.
  WindowSampler(const TokenDataset* data, int64_t begin, int64_t end, int64_t seq_len, uint64_t seed,
                bool shuffle = true);

  int64_t num_windows() const { return num_windows_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t epoch_of(int64_t sample_index) const { return sample_index / num_windows_; }
  int64_t window_of(int64_t sample_index) const;
  int64_t window_start(int64_t window) const { return begin_ + window * seq_len_; }

  // out: [count, seq_len + 1] int32 for samples first_sample .. first_sample + count - 1.
  void fill(int64_t first_sample, int64_t count, int32_t* out) const;

 private:
  const TokenDataset* data_;
  int64_t begin_;
  int64_t seq_len_;
  int64_t num_windows_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace mx
