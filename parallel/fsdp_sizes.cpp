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

ExactExchange exact_exchange(const ParamLayout& layout, int unit, int shard_size) {
  const ParamUnit& u = layout.units()[size_t(unit)];
  const ShardLayout sl = make_shard_layout(u.numel, shard_size);
  ExactExchange x;
  std::vector<int64_t> packed(size_t(shard_size), 0);
  std::vector<ExactPiece> pieces;
  for (int ti : u.tensors) {
    const ParamTensor& t = layout.tensors()[size_t(ti)];
    if (t.shape.size() != 1) continue;
    const int64_t begin = t.offset - u.offset;
    x.tensor_at.push_back(x.numel);
    for (const ShardSlice& s : shard_slices(sl, begin, begin + t.numel)) {
      pieces.push_back({s.rank, s.local_begin, packed[size_t(s.rank)],
                        x.numel + (s.global_begin - begin), s.numel});
      packed[size_t(s.rank)] += s.numel;
    }
    x.numel += t.numel;
  }
  for (int64_t n : packed) x.per_rank = std::max(x.per_rank, n);
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const ExactPiece& a, const ExactPiece& b) { return a.rank < b.rank; });
  x.pieces = std::move(pieces);
  return x;
}

size_t bf16_block_slot_bytes(const ShardLayout& shard, const ExactExchange& x) {
  return Arena::round_up(sizeof(uint16_t) * size_t(shard.padded_numel)) +
         Arena::round_up(sizeof(float) * size_t(shard.world_size * x.per_rank)) +
         Arena::round_up(sizeof(float) * size_t(x.numel));
}

FsdpBufferSizes fsdp_buffer_sizes(const ParamLayout& layout, int shard_size, Sharding sharding,
                                  bool bf16_blocks, size_t elem_bytes) {
  MX_ASSERT(shard_size >= 1, "fsdp_buffer_sizes: shard size ", shard_size);
  FsdpBufferSizes z;
  z.shard_size = shard_size;
  z.bf16_blocks = bf16_blocks && shard_size > 1;
  z.resident_codes = bf16_blocks && shard_size == 1;
  int64_t max_padded = 0, max_shard = 0, block_padded = 0;
  size_t per_unit_slots = 0, weight_max = 0, weight_block_max = 0;
  const int n_units = int(layout.units().size());
  for (int i = 0; i < n_units; ++i) {
    const ShardLayout sl = make_shard_layout(layout.units()[size_t(i)].numel, shard_size);
    z.local_numel += sl.shard_numel;
    max_padded = std::max(max_padded, sl.padded_numel);
    max_shard = std::max(max_shard, sl.shard_numel);
    const bool block = i != layout.embed_unit() && i != layout.head_unit();
    if (z.resident_codes && block)
      z.resident_code_bytes += Arena::round_up(sizeof(uint16_t) * size_t(sl.padded_numel));
    const size_t weights = z.bf16_blocks && block
                               ? bf16_block_slot_bytes(sl, exact_exchange(layout, i, shard_size))
                               : Arena::round_up(elem_bytes * size_t(sl.padded_numel));
    z.unit_bytes.push_back(weights);
    per_unit_slots += weights;
    weight_max = std::max(weight_max, weights);
    const bool large = i == layout.embed_unit() || (i == layout.head_unit() && !layout.tied());
    if (!large) {
      block_padded = std::max(block_padded, sl.padded_numel);
      weight_block_max = std::max(weight_block_max, weights);
    }
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
    z.weight_slot_bytes = weight_max;
    z.weight_block_slot_bytes = weight_block_max;
    // one large slot, two block-sized
    z.gathered_bytes = sharding == Sharding::kGradOp
                           ? per_unit_slots
                           : z.weight_slot_bytes + 2 * z.weight_block_slot_bytes;
    z.unit_grad_bytes = z.slot_bytes + 2 * z.block_slot_bytes;
    z.reduce_scatter_bytes = Arena::round_up(elem_bytes * size_t(max_shard));
  }
  return z;
}

}  // namespace mx
