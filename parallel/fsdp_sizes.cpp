#include "parallel/fsdp_sizes.h"

#include <algorithm>

#include "core/arena.h"
#include "core/error.h"
#include "parallel/shard.h"

namespace mx {

int fsdp_shard_size(Sharding sharding, int world_size, int shard_group) {
  switch (sharding) {
    case Sharding::kFull:
    case Sharding::kGradOp: return world_size;
    case Sharding::kNone: return 1;
    case Sharding::kHybrid: return shard_group > 0 ? shard_group : world_size;
  }
  return 1;
}

FsdpBufferSizes fsdp_buffer_sizes(const ParamLayout& layout, int shard_size, Sharding sharding,
                                  size_t elem_bytes) {
  MX_ASSERT(shard_size >= 1, "fsdp_buffer_sizes: shard size ", shard_size);
  FsdpBufferSizes z;
  z.shard_size = shard_size;
  int64_t max_padded = 0, max_shard = 0, block_padded = 0;
  size_t per_unit_slots = 0;  // grad-op: every unit's own slot
  const int n_units = int(layout.units().size());
  for (int i = 0; i < n_units; ++i) {
    const ShardLayout sl = make_shard_layout(layout.units()[size_t(i)].numel, shard_size);
    z.local_numel += sl.shard_numel;
    max_padded = std::max(max_padded, sl.padded_numel);
    max_shard = std::max(max_shard, sl.shard_numel);
    per_unit_slots += Arena::round_up(elem_bytes * size_t(sl.padded_numel));
    const bool large = i == layout.embed_unit() || (i == layout.head_unit() && !layout.tied());
    if (!large) block_padded = std::max(block_padded, sl.padded_numel);
  }
  z.state_bytes = Arena::round_up(elem_bytes * size_t(z.local_numel));
  if (shard_size > 1) {
    z.max_padded = max_padded;
    z.block_padded = block_padded;
    z.max_shard = max_shard;
    z.param_slots = sharding == Sharding::kGradOp ? n_units : 3;
    z.grad_slots = 3;
    z.slot_bytes = Arena::round_up(elem_bytes * size_t(max_padded));
    z.block_slot_bytes = Arena::round_up(elem_bytes * size_t(block_padded));
    const size_t three = z.slot_bytes + 2 * z.block_slot_bytes;  // one large, two block-sized
    z.gathered_bytes = sharding == Sharding::kGradOp ? per_unit_slots : three;
    z.unit_grad_bytes = three;
    z.reduce_scatter_bytes = Arena::round_up(elem_bytes * size_t(max_shard));
  }
  return z;
}

}  // namespace mx
