// SplitMix64 (Steele, Lea, Flood 2014): a strong 64-bit mixer. Hashing a counter with it gives
// reproducible pseudo-random values that do not depend on thread count or call order.
#pragma once
#include <cstdint>

namespace mx {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace mx
