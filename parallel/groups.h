// Process groups for hybrid sharding (HSDP, `parallel.sharding = hybrid`): parameters are
// sharded within a shard group of S consecutive ranks (one node: fast links) and replicated
// across the W / S shard groups (nodes). A gradient is reduce-scattered inside the shard group,
// then its shard all-reduced across the replica group: the same sum as a reduce-scatter over
// the world, with only 1/S of the bytes crossing nodes.
//
//   world rank w:  shard group  w / S, shard rank   w % S   (ranks S*g .. S*g + S-1)
//                  replica group w % S, replica rank w / S  (ranks j, j+S, j+2S, ...)
#pragma once
#include <memory>

#include "parallel/communicator.h"

namespace mx {

struct HybridGroups {
  std::unique_ptr<Communicator> shard;    // size S: all-gather / reduce-scatter of units
  std::unique_ptr<Communicator> replica;  // size W / S: all-reduce of gradient shards
};

// Collective over `world`. shard_group_size must divide world.size() (UserError otherwise:
// it comes from parallel.shard_group).
HybridGroups make_hybrid_groups(Communicator& world, int shard_group_size);

}  // namespace mx
