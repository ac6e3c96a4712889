#include "parallel/groups.h"

#include "core/error.h"

namespace mx {

HybridGroups make_hybrid_groups(Communicator& world, int shard_group_size) {
  const int w = world.size(), s = shard_group_size;
  MX_REQUIRE(s >= 1 && s <= w && w % s == 0, "parallel.shard_group = ", s,
             " must divide the number of processes (", w, ")");
  HybridGroups g;
  // Both splits run on every rank, in the same order (split is collective).
  g.shard = world.split(/*color=*/world.rank() / s, /*key=*/world.rank());
  g.replica = world.split(/*color=*/world.rank() % s, /*key=*/world.rank());
  return g;
}

}  // namespace mx
