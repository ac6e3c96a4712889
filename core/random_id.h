// Random identifiers for names that must not collide across processes and hosts (a temporary
// file's name, a run's claim on a checkpoint prefix). Not for anything seeded: training
// randomness comes from the run's seed, never from here.
#pragma once
#include <cstdio>
#include <random>
#include <string>

namespace mx {

// `words` 32-bit draws from the system's random device, as 8 lowercase hex digits each.
inline std::string random_hex_id(int words) {
  std::random_device rd;
  std::string id;
  char word[9];
  for (int i = 0; i < words; ++i) {
    std::snprintf(word, sizeof word, "%08x", unsigned(rd()));
    id += word;
  }
  return id;
}

}  // namespace mx
