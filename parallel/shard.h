// Flat-buffer sharding of one FSDP unit (a transformer block, the embedding, the head).
//
// A unit's parameters are one flat buffer of `numel` elements. With N ranks it is padded with
// zeros to padded_numel = shard_numel * N, where shard_numel = ceil(numel / N) (rounded up to a
// multiple of `align` elements when asked, e.g. so every rank's slot in a bf16 gather buffer
// starts 16-byte aligned). Rank r owns the padded range [r * shard_numel, (r+1) * shard_numel);
// its real elements are that range ∩ [0, numel) (possibly empty: numel 5 over 4 ranks gives
// shard 2, and rank 3 holds only padding). All-gathering every rank's shard (padding included)
// rebuilds the padded unit in rank order; reduce-scattering a padded full gradient gives each
// rank the gradient of its shard.
#pragma once
#include <cstdint>
#include <vector>

namespace mx {

struct ShardLayout {
  int64_t numel = 0;         // real elements of the unit
  int world_size = 1;        // N
  int64_t shard_numel = 0;   // elements per rank, padding included
  int64_t padded_numel = 0;  // shard_numel * N >= numel

  int64_t shard_begin(int rank) const { return rank * shard_numel; }  // in the unit (padded)
  int64_t shard_end(int rank) const { return shard_begin(rank) + shard_numel; }
  // Real (unpadded) elements rank r holds: they are the first valid_numel(r) of its shard.
  int64_t valid_numel(int rank) const;
  int64_t padding_numel(int rank) const { return shard_numel - valid_numel(rank); }
  int owner_of(int64_t index) const;  // the rank holding element `index` of [0, numel)
};

// world_size >= 1, numel >= 0, align >= 1 (a bad value is a bug: std::logic_error).
ShardLayout make_shard_layout(int64_t numel, int world_size, int64_t align = 1);

// One contiguous piece of a global element range, as held by one rank.
struct ShardSlice {
  int rank = 0;
  int64_t global_begin = 0;  // first element, as an index into the unit
  int64_t local_begin = 0;   // the same element, as an index into that rank's shard
  int64_t numel = 0;
  bool operator==(const ShardSlice&) const = default;
};

// Where the elements [begin, end) of the unit live (0 <= begin <= end <= numel): the slices in
// rank order, empty ones left out, covering the range exactly. Resharding a checkpoint written
// by N ranks for M ranks reads, for each new shard, the slices of its range in the old layout.
std::vector<ShardSlice> shard_slices(const ShardLayout& layout, int64_t begin, int64_t end);

}  // namespace mx
