#include "data/index_permutation.h"

#include "core/error.h"
#include "data/splitmix64.h"

namespace mx {

IndexPermutation::IndexPermutation(uint64_t n, uint64_t key) : n_(n) {
  MX_ASSERT(n >= 1 && n <= (uint64_t{1} << 62), "permutation size ", n);
  half_bits_ = 1;
  while ((uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = key;
  for (uint64_t& round_key : round_keys_) {
    k = splitmix64(k);
    round_key = k;
  }
}

uint64_t IndexPermutation::feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (uint64_t round_key : round_keys_) {
    const uint64_t mixed = left ^ (splitmix64(right ^ round_key) & half_mask_);
    left = right;
    right = mixed;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::operator()(uint64_t x) const {
  MX_ASSERT(x < n_, "index ", x, " of permutation size ", n_);
  // Walking x's cycle in the larger domain must come back into [0, n) (at worst at x itself).
  uint64_t y = feistel(x);
  while (y >= n_) y = feistel(y);
  return y;
}

}  // namespace mx
