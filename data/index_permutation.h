// A keyed pseudo-random permutation of [0, n), computed per index in O(1) memory: the sampler
// needs "which window is the i-th of epoch e" for billions of windows without storing a shuffle,
// and it must be a bijection so an epoch visits every window exactly once.
#pragma once
#include <cstdint>

namespace mx {

// A balanced Feistel network over the smallest even-bit power-of-two domain >= n (at most 4n),
// with cycle walking: values that land outside [0, n) are permuted again until they land inside.
// Restricting a permutation this way stays a bijection on [0, n); the expected walk is < 4 steps.
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t x) const;  // x in [0, n)
  uint64_t size() const { return n_; }

 private:
  static constexpr int kRounds = 6;  // 4 suffice in theory (Luby-Rackoff); more mix small domains
  uint64_t feistel(uint64_t x) const;

  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t round_keys_[kRounds];
};

}  // namespace mx
