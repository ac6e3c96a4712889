// The byte-level tokenizer against known UTF-8 byte sequences.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/byte_tokenizer.h"

namespace mx {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string decode_bytes(const std::vector<int32_t>& bytes) { return byte_decode(bytes); }

TEST(ByteTokenizerTest, EncodeGivesUtf8Bytes) {
  EXPECT_EQ(byte_encode("A\xC3\xA9"), (std::vector<int32_t>{0x41, 0xC3, 0xA9}));  // "Aé"
  EXPECT_EQ(byte_encode("\xF0\x9F\x99\x82"), (std::vector<int32_t>{0xF0, 0x9F, 0x99, 0x82}));  // 🙂
  EXPECT_TRUE(byte_encode("").empty());
}

TEST(ByteTokenizerTest, RoundTripsValidUtf8) {
  const std::string text =
      "plain ascii\n\t"
      "h\xC3\xA9llo "             // é (2 bytes)
      "\xE4\xB8\x96\xE7\x95\x8C "  // 世界 (3 bytes each)
      "\xF0\x9F\x99\x82 "          // 🙂 (4 bytes)
      "\xEF\xBF\xBF \xF4\x8F\xBF\xBF";  // U+FFFF, U+10FFFF (the largest code point)
  EXPECT_EQ(byte_decode(byte_encode(text)), text);
  std::string with_nul("a\0b", 3);
  EXPECT_EQ(byte_decode(byte_encode(with_nul)), with_nul);
}

TEST(ByteTokenizerTest, SkipsIdsOutsideBytes) {
  EXPECT_EQ(byte_decode({'h', 300, 'i', -1, 256}), "hi");
  // Skipped ids do not break the bytes around them: 0xC3 0xA9 still form "é".
  EXPECT_EQ(byte_decode({0xC3, 1000, 0xA9}), "\xC3\xA9");
}

TEST(ByteTokenizerTest, ReplacesEachMaximalIllFormedSubpart) {
  EXPECT_EQ(decode_bytes({'a', 0x80, 'b'}), "a" + kFffd + "b");         // stray continuation
  EXPECT_EQ(decode_bytes({0xFF}), kFffd);                               // never valid
  EXPECT_EQ(decode_bytes({0xC3}), kFffd);                               // cut at the end
  EXPECT_EQ(decode_bytes({0xC3, 'A'}), kFffd + "A");                    // cut by ASCII
  EXPECT_EQ(decode_bytes({0xE2, 0x82, 'x'}), kFffd + "x");              // 2 of 3: one subpart
  EXPECT_EQ(decode_bytes({0xF0, 0x9F, 0x99}), kFffd);                   // 3 of 4 at the end
  EXPECT_EQ(decode_bytes({0xC0, 0xAF}), kFffd + kFffd);                 // overlong '/'
  EXPECT_EQ(decode_bytes({0xE0, 0x80, 0xAF}), kFffd + kFffd + kFffd);   // overlong, 3 bytes
  EXPECT_EQ(decode_bytes({0xED, 0xA0, 0x80}), kFffd + kFffd + kFffd);   // surrogate U+D800
  EXPECT_EQ(decode_bytes({0xF4, 0x90, 0x80, 0x80}), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(decode_bytes({0xC3, 0xC3, 0xA9}), kFffd + "\xC3\xA9");      // restart at the breaker
  // The Unicode 15 example (Table 3-8): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  EXPECT_EQ(decode_bytes({0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64}),
            "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
}

TEST(ByteTokenizerTest, AnyBytesDecodeToValidUtf8) {
  std::vector<int32_t> all;
  for (int b = 0; b < 256; ++b) all.push_back(b);
  for (int b = 255; b >= 0; b -= 3) all.push_back(b);
  const std::string out = byte_decode(all);
  EXPECT_EQ(sanitize_utf8(out), out);  // already valid: nothing left to replace
  EXPECT_NE(out.find(kFffd), std::string::npos);
}

}  // namespace
}  // namespace mx
