// The memory limit of the cgroup this process runs in (a container's, a job scheduler's).
#pragma once
#include <cstdint>
#include <string>

namespace mx {

// The lowest memory limit on this process's cgroup and its ancestors, in bytes; -1 when none
// is set ("max", v1's page-rounded 2^63) or none can be read. `self_cgroup` is the text of
// /proc/self/cgroup: its cgroup v2 line ("0::/path") or else its v1 memory controller's line
// ("4:memory:/path"); the limits are read under `fs_root` (/sys/fs/cgroup): v2's
// <fs_root>/<path>/memory.max, v1's <fs_root>/memory/<path>/memory.limit_in_bytes, at the path
// and every directory above it that exists there (a container that sees its own cgroup as the
// root, with the host's path in /proc/self/cgroup, finds its limit at the root).
int64_t cgroup_memory_limit(const std::string& self_cgroup, const std::string& fs_root);

// cgroup_memory_limit of this process (/proc/self/cgroup under /sys/fs/cgroup).
int64_t this_cgroup_memory_limit();

}  // namespace mx
