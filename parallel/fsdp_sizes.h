// The sizes of every buffer Fsdp allocates, as one function of (layout, shard count,
// strategy). Fsdp's constructor sizes its arenas with it and `mxtrain plan` adds up the same
// numbers, so the planner's per-rank FSDP memory cannot drift from the engine's.
//
// Per rank (every rank holds the same sizes: shards are padded to equal length):
//   4 state arenas     master weights, gradients, AdamW m, AdamW v: local_numel fp32 each,
//                      local_numel = sum over units of ceil(numel_u / S)
//   gathered weights   param_slots (S > 1 only): for full / hybrid 3 slots (the unit in use,
//                      the prefetched next one, the tied embedding): one of the largest unit
//                      and two of the largest block; for grad-op one slot per unit, each the
//                      size of its own unit (forward's gathered weights are kept for
//                      backward: one padded copy of the model)
//   unit gradients     grad_slots = 3 slots (S > 1 only): the unit in backward, the one being
//                      reduce-scattered, the tied embedding; one of the largest unit, two of
//                      the largest block
//   reduce-scatter     one shard of the largest unit (S > 1 only)
// Padded sizes: max_padded = max over units of ceil(numel_u / S) x S elements; block_padded the
// same over the blocks (and a tied head's unit). With S = 1 (one process, or sharding = none)
// nothing is gathered or scattered.
// Two block-sized slots are enough beside the large one: the embedding and an untied head are
// never held at once (the embedding is released before the first block; its gradients start
// after the head's are reduce-scattered), and a tied head's unit is its final norm alone, while
// the embedding keeps the large slot from the lookup to its backward.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/params.h"
#include "parallel/fsdp.h"

namespace mx {

struct FsdpBufferSizes {
  int shard_size = 1;       // S: ranks sharing one copy of the state
  int64_t local_numel = 0;  // elements of each state shard (padding included)
  int64_t max_padded = 0;   // elements of the large slot (0 when S == 1)
  int64_t block_padded = 0;  // elements of a block-sized slot (0 when S == 1)
  int64_t max_shard = 0;    // elements of the reduce-scatter output (0 when S == 1)
  int param_slots = 0;
  int grad_slots = 0;
  // Arena capacities in bytes (each a whole number of 64-byte-rounded allocations).
  size_t state_bytes = 0;           // one of master / gradients / m / v
  size_t slot_bytes = 0;            // the large slot
  size_t block_slot_bytes = 0;      // a block-sized slot
  size_t gathered_bytes = 0;        // full / hybrid: slot_bytes + 2 block_slot_bytes; grad-op:
                                    // the sum of every unit's own slot
  size_t unit_grad_bytes = 0;       // slot_bytes + 2 block_slot_bytes
  size_t reduce_scatter_bytes = 0;  // rounded 4 x max_shard
  size_t total_bytes() const {
    return 4 * state_bytes + gathered_bytes + unit_grad_bytes + reduce_scatter_bytes;
  }
};

// S for a strategy: full / grad-op: the world; none: 1; hybrid: shard_group (0: the world).
int fsdp_shard_size(Sharding sharding, int world_size, int shard_group);

// elem_bytes: bytes per element of the state and the slots (fp32 on the CPU engine).
FsdpBufferSizes fsdp_buffer_sizes(const ParamLayout& layout, int shard_size, Sharding sharding,
                                  size_t elem_bytes = sizeof(float));

}  // namespace mx
