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
// bf16 gathers (bf16_blocks, FsdpOptions): each block unit's weight slot holds the block as bf16
// codes (2 bytes an element, padded) plus its exact fp32 exchange (ExactExchange below: the
// all-gather's S x per_rank elements and the numel assembled ones); the other units and every
// gradient slot stay fp32. The large slot is the largest unit's slot in either form.
// Resident block codes (bf16_blocks with S = 1: nothing is gathered): each block unit's bf16
// codes, kept beside the master weights and rewritten by AdamW in its pass, which the model's
// bf16 GEMMs read instead of rounding every block weight at every use (resident_code_bytes:
// 2 bytes a block element, 64-byte rounded per unit).
// Two block-sized slots are enough beside the large one: the embedding and an untied head are
// never held at once (the embedding is released before the first block; its gradients start
// after the head's are reduce-scattered), and a tied head's unit is its final norm alone, while
// the embedding keeps the large slot from the lookup to its backward.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/params.h"
#include "parallel/fsdp.h"
#include "parallel/shard.h"

namespace mx {

struct FsdpBufferSizes {
  int shard_size = 1;       // S: ranks sharing one copy of the state
  int64_t local_numel = 0;  // elements of each state shard (padding included)
  int64_t max_padded = 0;   // elements of the large slot (0 when S == 1)
  int64_t block_padded = 0;  // elements of a block-sized slot (0 when S == 1)
  int64_t max_shard = 0;    // elements of the reduce-scatter output (0 when S == 1)
  int param_slots = 0;
  int grad_slots = 0;
  bool bf16_blocks = false;  // block units gathered as bf16 codes (S > 1 only)
  bool resident_codes = false;  // block units kept as bf16 codes too (bf16 blocks, S == 1)
  // Arena capacities in bytes (each a whole number of 64-byte-rounded allocations).
  size_t state_bytes = 0;           // one of master / gradients / m / v
  size_t slot_bytes = 0;            // the large slot, fp32 (gradients)
  size_t block_slot_bytes = 0;      // a block-sized slot, fp32 (gradients)
  std::vector<size_t> unit_bytes;   // each unit's gathered weights (used when S > 1)
  size_t weight_slot_bytes = 0;     // the large weight slot: the largest of unit_bytes
  size_t weight_block_slot_bytes = 0;  // a block-sized weight slot: the largest block's
  size_t gathered_bytes = 0;        // full / hybrid: weight_slot_bytes + 2
                                    // weight_block_slot_bytes; grad-op: the sum of unit_bytes
  size_t unit_grad_bytes = 0;       // slot_bytes + 2 block_slot_bytes
  size_t reduce_scatter_bytes = 0;  // rounded 4 x max_shard
  size_t resident_code_bytes = 0;   // resident_codes: the block units' codes
  size_t total_bytes() const {
    return 4 * state_bytes + gathered_bytes + unit_grad_bytes + reduce_scatter_bytes +
           resident_code_bytes;
  }
};

// S for a strategy: full / grad-op: the world; none: 1; hybrid: shard_group (0: the world).
int fsdp_shard_size(Sharding sharding, int world_size, int shard_group);

// FSDP's bf16 gathers: a block unit travels as bf16 codes, and the tensors the model reads in
// fp32 (its two RMSNorm weights, the unit's 1-D tensors) travel beside it exactly. Each rank
// packs the pieces of them that its shard holds, in the unit's order, into per_rank fp32
// elements (the most any rank holds); one all-gather of per_rank elements a rank delivers every
// piece, and each piece is copied to its place in the assembled tensors (numel elements, the
// tensors one after the other in the unit's order). A tensor crossing a shard boundary comes
// in two pieces or more.
struct ExactPiece {
  int rank = 0;
  int64_t local = 0;   // first element in that rank's shard
  int64_t packed = 0;  // ... in that rank's packed elements
  int64_t to = 0;      // ... in the assembled tensors
  int64_t numel = 0;
};
struct ExactExchange {
  int64_t per_rank = 0;
  int64_t numel = 0;
  std::vector<int64_t> tensor_at;  // each 1-D tensor's offset in the assembled tensors
  std::vector<ExactPiece> pieces;  // rank-major, then in the unit's order
};
ExactExchange exact_exchange(const ParamLayout& layout, int unit, int shard_size);

// elem_bytes: bytes per element of the state and the fp32 slots (fp32 on the CPU engine).
// bf16_blocks: FsdpOptions::bf16_blocks (with shard_size 1: resident block codes).
FsdpBufferSizes fsdp_buffer_sizes(const ParamLayout& layout, int shard_size, Sharding sharding,
                                  bool bf16_blocks = false, size_t elem_bytes = sizeof(float));

// Bytes of a block unit's bf16 weight slot: its codes, the exchange's all-gather buffer and the
// assembled tensors, each 64-byte rounded.
size_t bf16_block_slot_bytes(const ShardLayout& shard, const ExactExchange& x);

}  // namespace mx
