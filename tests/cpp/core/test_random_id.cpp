// random_hex_id: 8 lowercase hex digits per word, and draws that differ (a constant id would
// let two runs claim one S3 prefix as the same run, or two hosts share a temporary name).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/random_id.h"

namespace mx {
namespace {

TEST(RandomId, HexDigitsPerWord) {
  for (int words : {1, 2, 4}) {
    const std::string id = random_hex_id(words);
    ASSERT_EQ(id.size(), size_t(8 * words));
    for (char c : id) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << id;
  }
}

TEST(RandomId, DrawsDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) seen.insert(random_hex_id(2));
  EXPECT_EQ(seen.size(), 64u);  // 64 draws of 64 bits: a repeat is a ~1e-16 chance
}

}  // namespace
}  // namespace mx
