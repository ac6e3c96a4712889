// FNV-1a 64 against the published test vectors of its authors' reference suite (fnv-test.c:
// "", "a", "foobar"), and a byte past 0x7F (a signed char must not sign-extend).
#include <gtest/gtest.h>

#include <string>

#include "core/fnv1a.h"

namespace mx {
namespace {

TEST(Fnv1a, PublishedVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
  static_assert(fnv1a64("") == 0xcbf29ce484222325ull);
}

TEST(Fnv1a, HighBytesAreUnsigned) {
  // One step by hand: (basis ^ 0xFF) * prime, mod 2^64.
  const uint64_t expect = (0xcbf29ce484222325ull ^ 0xFFull) * 1099511628211ull;
  EXPECT_EQ(fnv1a64(std::string(1, '\xFF')), expect);
}

}  // namespace
}  // namespace mx
