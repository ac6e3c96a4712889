// FNV-1a, 64 bits: a short, stable fingerprint of a text, for comparing things across ranks
// (config sources, config.json, a manifest) and for naming (a long sweep point id ends in one).
// Not a checksum of data on storage (that is CRC32C, core/crc32c.h) and not collision-resistant
// against an adversary; the same text gives the same value on every machine and every run.
#pragma once
#include <cstdint>
#include <string_view>

namespace mx {

constexpr uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 14695981039346656037ull;  // offset basis (0xcbf29ce484222325)
  for (char ch : text) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;  // prime
  return h;
}

}  // namespace mx
