#include "parallel/shard.h"

#include <algorithm>

#include "core/error.h"

namespace mx {

ShardLayout make_shard_layout(int64_t numel, int world_size, int64_t align) {
  MX_ASSERT(numel >= 0, "make_shard_layout: numel ", numel);
  MX_ASSERT(world_size >= 1, "make_shard_layout: world_size ", world_size);
  MX_ASSERT(align >= 1, "make_shard_layout: align ", align);
  ShardLayout l;
  l.numel = numel;
  l.world_size = world_size;
  const int64_t per_rank = (numel + world_size - 1) / world_size;  // ceil(numel / N)
  l.shard_numel = (per_rank + align - 1) / align * align;
  l.padded_numel = l.shard_numel * world_size;
  return l;
}

int64_t ShardLayout::valid_numel(int rank) const {
  MX_ASSERT(rank >= 0 && rank < world_size, "rank ", rank, " of ", world_size);
  return std::clamp<int64_t>(numel - shard_begin(rank), 0, shard_numel);
}

int ShardLayout::owner_of(int64_t index) const {
  MX_ASSERT(index >= 0 && index < numel, "element ", index, " outside [0, ", numel, ")");
  return static_cast<int>(index / shard_numel);
}

std::vector<ShardSlice> shard_slices(const ShardLayout& layout, int64_t begin, int64_t end) {
  MX_ASSERT(0 <= begin && begin <= end && end <= layout.numel, "shard_slices: range [", begin,
            ", ", end, ") outside [0, ", layout.numel, ")");
  std::vector<ShardSlice> out;
  if (begin == end) return out;
  for (int r = layout.owner_of(begin); r <= layout.owner_of(end - 1); ++r) {
    const int64_t lo = std::max(begin, layout.shard_begin(r));
    const int64_t hi = std::min(end, layout.shard_end(r));
    out.push_back({r, lo, lo - layout.shard_begin(r), hi - lo});
  }
  return out;
}

}  // namespace mx
