#include "data/window_sampler.h"

#include "core/error.h"
#include "data/index_permutation.h"
#include "data/splitmix64.h"

namespace mx {

WindowSampler::WindowSampler(const TokenDataset* data, int64_t begin, int64_t end, int64_t seq_len,
                             uint64_t seed, bool shuffle)
    : data_(data), begin_(begin), seq_len_(seq_len), num_windows_(0), seed_(seed),
      shuffle_(shuffle) {
  MX_ASSERT(data != nullptr);
  MX_REQUIRE(seq_len >= 1, "seq_len must be >= 1, got ", seq_len);
  MX_REQUIRE(begin >= 0 && begin <= end && end <= data->size(), "data '", data->path(),
             "': token range [", begin, ", ", end, ") is outside its ", data->size(), " tokens");
  MX_REQUIRE(end - begin >= seq_len + 1, "data '", data->path(), "' too short for seq_len ", seq_len,
             ": token range [", begin, ", ", end, ") holds ", end - begin,
             " tokens, one window needs seq_len + 1 = ", seq_len + 1);
  num_windows_ = (end - begin - 1) / seq_len;
}

int64_t WindowSampler::window_of(int64_t sample_index) const {
  MX_ASSERT(sample_index >= 0, "sample index ", sample_index);
  if (!shuffle_) return sample_index % num_windows_;
  const uint64_t epoch = static_cast<uint64_t>(sample_index / num_windows_);
  // Hash the epoch before mixing in the seed so (seed, e) and (seed + 1, e - 1) differ.
  const uint64_t key = splitmix64(seed_ ^ splitmix64(epoch));
  const IndexPermutation perm(static_cast<uint64_t>(num_windows_), key);
  return static_cast<int64_t>(perm(static_cast<uint64_t>(sample_index % num_windows_)));
}

void WindowSampler::fill(int64_t first_sample, int64_t count, int32_t* out) const {
  const int64_t window_tokens = seq_len_ + 1;
  for (int64_t k = 0; k < count; ++k) {
    data_->copy(window_start(window_of(first_sample + k)), window_tokens, out + k * window_tokens);
  }
}

}  // namespace mx
