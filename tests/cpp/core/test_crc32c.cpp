// CRC32C against published check values: the catalogue's check value for "123456789" and the
// test vectors of RFC 3720 (iSCSI), appendix B.4.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/crc32c.h"

namespace mx {
namespace {

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_hex(crc32c(s.data(), s.size())), "e3069283");
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) up[i] = (unsigned char)i, down[i] = (unsigned char)(31 - i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, IncrementalEqualsWholeAtEveryAlignment) {
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = (unsigned char)(i * 131 + 7);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut = 0; cut <= 40; ++cut) {
    uint32_t c = crc32c_update(0, data.data(), cut);
    c = crc32c_update(c, data.data() + cut, data.size() - cut);
    EXPECT_EQ(c, whole) << cut;
  }
}

// The definition, one bit at a time (reflected Castagnoli polynomial, inverted in and out).
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

// Every length 0..200 at every start offset 0..15 (the 8-byte loop's head and tail), and a few
// MiB: the path in use (SSE4.2's instruction, or the tables under MXTRAIN_TEST_CRC32C_TABLES,
// ctest Crc32c.TablesPath) against the definition.
TEST(Crc32c, MatchesTheBitwiseDefinition) {
  std::vector<unsigned char> buf(3 << 20);
  uint32_t x = 12345;
  for (auto& b : buf) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 16);
  for (size_t off = 0; off < 16; ++off)
    for (size_t n = 0; n <= 200; ++n)
      ASSERT_EQ(crc32c(buf.data() + off, n), crc32c_bitwise(buf.data() + off, n)) << off << " " << n;
  EXPECT_EQ(crc32c(buf.data() + 3, buf.size() - 3), crc32c_bitwise(buf.data() + 3, buf.size() - 3));
}

TEST(Crc32c, FileMatchesBuffer) {
  auto path = std::filesystem::temp_directory_path() / "mx_crc32c_test.bin";
  std::vector<char> data(3 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = char(i * 2654435761u >> 13);
  { std::ofstream(path, std::ios::binary).write(data.data(), std::streamsize(data.size())); }
  uint64_t n = 0;
  EXPECT_EQ(crc32c_file(path.string(), &n), crc32c(data.data(), data.size()));
  EXPECT_EQ(n, data.size());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace mx
