#include "core/memory_limit.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mx {

namespace {

// The number in a limit file; -1 for "max", an unreadable file, or v1's "no limit"
// (PAGE_COUNTER_MAX pages: 2^63 rounded down to a page, and above any machine's memory).
int64_t read_limit(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!in || !(in >> text) || text == "max") return -1;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v <= 0) return -1;
  if (v >= (1LL << 62)) return -1;
  return v;
}

// The lowest limit in `file_name` at `rel` (a cgroup path, "/a/b") under `root` and above it.
int64_t lowest_on_path(const std::filesystem::path& root, const std::string& rel,
                       const char* file_name) {
  int64_t lowest = -1;
  std::filesystem::path p = std::filesystem::path(rel).relative_path();
  while (true) {
    const int64_t v = read_limit(root / p / file_name);
    if (v > 0 && (lowest < 0 || v < lowest)) lowest = v;
    if (p.empty()) break;
    p = p.parent_path();
  }
  return lowest;
}

}  // namespace

int64_t cgroup_memory_limit(const std::string& self_cgroup, const std::string& fs_root) {
  std::istringstream lines(self_cgroup);
  std::string line, v2_path, v1_path;
  bool v2 = false, v1 = false;
  while (std::getline(lines, line)) {
    // "hierarchy-ID:controller-list:cgroup-path" (the path may itself hold ':')
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      v2 = true, v2_path = path;
      continue;
    }
    std::istringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "memory") v1 = true, v1_path = path;
  }
  const std::filesystem::path root(fs_root);
  int64_t lowest = -1;
  // (a hybrid host lists both: the memory controller is wherever its v1 line says, else v2's)
  if (v1) lowest = lowest_on_path(root / "memory", v1_path, "memory.limit_in_bytes");
  else if (v2) lowest = lowest_on_path(root, v2_path, "memory.max");
  return lowest;
}

int64_t this_cgroup_memory_limit() {
  std::ifstream in("/proc/self/cgroup");
  if (!in) return -1;
  std::stringstream text;
  text << in.rdbuf();
  return cgroup_memory_limit(text.str(), "/sys/fs/cgroup");
}

}  // namespace mx
