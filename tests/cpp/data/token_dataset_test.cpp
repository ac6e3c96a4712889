// TokenDataset against files written here byte by byte from the format specs (not by the reader).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/token_dataset.h"

namespace mx {
namespace {

class TokenDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("mx_data_") + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    if (!bytes.empty()) {
      EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    }
    std::fclose(f);
    return path;
  }

  std::filesystem::path dir_;
};

// Little-endian encodings, spelled out so the test does not share code with the reader.
void put_u16(std::vector<uint8_t>& b, uint32_t v) {
  b.push_back(v & 0xFF);
  b.push_back((v >> 8) & 0xFF);
}
void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int k = 0; k < 4; ++k) b.push_back((v >> (8 * k)) & 0xFF);
}
std::vector<uint8_t> u16_bytes(const std::vector<uint32_t>& ids) {
  std::vector<uint8_t> b;
  for (uint32_t v : ids) put_u16(b, v);
  return b;
}
std::vector<uint8_t> u32_bytes(const std::vector<uint32_t>& ids) {
  std::vector<uint8_t> b;
  for (uint32_t v : ids) put_u32(b, v);
  return b;
}
// llm.c: 256 int32 header {magic, version, count, 0...} then the tokens.
std::vector<uint8_t> llmc_bytes(int32_t magic, int32_t version, int32_t count,
                                const std::vector<uint32_t>& ids) {
  std::vector<uint8_t> b;
  put_u32(b, static_cast<uint32_t>(magic));
  put_u32(b, static_cast<uint32_t>(version));
  put_u32(b, static_cast<uint32_t>(count));
  for (int k = 3; k < 256; ++k) put_u32(b, 0);
  for (uint32_t v : ids) version == 1 ? put_u16(b, v) : put_u32(b, v);
  return b;
}

std::vector<int32_t> read_all(const TokenDataset& ds) {
  std::vector<int32_t> out(static_cast<size_t>(ds.size()));
  ds.copy(0, ds.size(), out.data());
  return out;
}

std::vector<int32_t> as_i32(const std::vector<uint32_t>& v) { return {v.begin(), v.end()}; }

// Expects a UserError whose message names the file and contains `what`.
template <typename F>
void expect_user_error(F&& f, const std::string& path, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no UserError for " << path << " (" << what << ")";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(TokenFormatTest, ParsesEveryNameAndRejectsOthers) {
  EXPECT_EQ(parse_token_format("auto"), TokenFormat::kAuto);
  EXPECT_EQ(parse_token_format("u16"), TokenFormat::kU16);
  EXPECT_EQ(parse_token_format("u32"), TokenFormat::kU32);
  EXPECT_EQ(parse_token_format("llmc"), TokenFormat::kLlmc);
  EXPECT_EQ(parse_token_format("text"), TokenFormat::kText);
  EXPECT_EQ(parse_token_format("random"), TokenFormat::kRandom);
  try {
    parse_token_format("bin");
    FAIL();
  } catch (const UserError& e) {
    const std::string msg = e.what();
    for (const char* name : {"bin", "auto", "u16", "u32", "llmc", "text", "random"})
      EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
}

TEST_F(TokenDatasetTest, U16ReadsExactIds) {
  const std::vector<uint32_t> ids = {0, 1, 255, 256, 65535, 12345, 7};
  const std::string path = write("a.bin", u16_bytes(ids));
  TokenDataset ds = TokenDataset::open(path, TokenFormat::kU16, 65536);
  EXPECT_EQ(ds.size(), 7);
  EXPECT_EQ(read_all(ds), as_i32(ids));
  EXPECT_EQ(ds.at(4), 65535);
  EXPECT_EQ(ds.path(), path);
  EXPECT_EQ(ds.format(), TokenFormat::kU16);
}

TEST_F(TokenDatasetTest, U32ReadsExactIds) {
  const std::vector<uint32_t> ids = {0, 70000, 128255, 3, 1u << 30};
  const std::string path = write("a.bin", u32_bytes(ids));
  TokenDataset ds = TokenDataset::open(path, TokenFormat::kU32, int64_t{1} << 31);
  EXPECT_EQ(read_all(ds), as_i32(ids));
  std::vector<int32_t> mid(2);
  ds.copy(1, 2, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{70000, 128255}));
}

TEST_F(TokenDatasetTest, LlmcVersion1And2ReadExactIds) {
  const std::vector<uint32_t> ids = {50256, 1, 2, 3, 50000};
  const std::string p1 = write("v1.bin", llmc_bytes(20240520, 1, 5, ids));
  TokenDataset d1 = TokenDataset::open(p1, TokenFormat::kLlmc, 50257);
  EXPECT_EQ(read_all(d1), as_i32(ids));
  const std::vector<uint32_t> big = {128000, 0, 128255};
  const std::string p2 = write("v2.bin", llmc_bytes(20240520, 2, 3, big));
  TokenDataset d2 = TokenDataset::open(p2, TokenFormat::kLlmc, 128256);
  EXPECT_EQ(read_all(d2), as_i32(big));
}

TEST_F(TokenDatasetTest, TextBytesAreTheTokens) {
  const std::string text = "hi \xE3\x81\x82\n";  // "hi あ\n"
  const std::string path = write("t.txt", std::vector<uint8_t>(text.begin(), text.end()));
  TokenDataset ds = TokenDataset::open(path, TokenFormat::kText, 256);
  EXPECT_EQ(read_all(ds), (std::vector<int32_t>{'h', 'i', ' ', 0xE3, 0x81, 0x82, '\n'}));
}

TEST_F(TokenDatasetTest, AutoDetectsByMagicThenExtension) {
  const std::vector<uint32_t> ids = {1, 2, 3};
  // llm.c magic wins over any extension.
  EXPECT_EQ(TokenDataset::open(write("x.txt", llmc_bytes(20240520, 1, 3, ids)), TokenFormat::kAuto, 256)
                .format(),
            TokenFormat::kLlmc);
  EXPECT_EQ(TokenDataset::open(write("x.bin", llmc_bytes(20240520, 2, 3, ids)), TokenFormat::kAuto, 256)
                .format(),
            TokenFormat::kLlmc);
  for (const char* name : {"a.txt", "a.md", "a.text", "A.TXT"}) {
    TokenDataset ds = TokenDataset::open(write(name, {'a', 'b'}), TokenFormat::kAuto, 256);
    EXPECT_EQ(ds.format(), TokenFormat::kText) << name;
    EXPECT_EQ(read_all(ds), (std::vector<int32_t>{'a', 'b'}));
  }
  TokenDataset d16 = TokenDataset::open(write("a.u16", u16_bytes(ids)), TokenFormat::kAuto, 256);
  EXPECT_EQ(d16.format(), TokenFormat::kU16);
  EXPECT_EQ(read_all(d16), as_i32(ids));
  TokenDataset d32 = TokenDataset::open(write("a.u32", u32_bytes(ids)), TokenFormat::kAuto, 256);
  EXPECT_EQ(d32.format(), TokenFormat::kU32);
  EXPECT_EQ(read_all(d32), as_i32(ids));
  const std::string unknown = write("a.bin", u16_bytes(ids));
  expect_user_error([&] { TokenDataset::open(unknown, TokenFormat::kAuto, 256); }, unknown,
                    "data.format");
}

TEST_F(TokenDatasetTest, RandomIsDeterministicAndInVocab) {
  TokenDataset a = TokenDataset::open("", TokenFormat::kRandom, 1000, 10000);
  TokenDataset b = TokenDataset::open("ignored", TokenFormat::kRandom, 1000, 10000);
  EXPECT_EQ(a.size(), 10000);
  const auto va = read_all(a);
  EXPECT_EQ(va, read_all(b));
  std::vector<int> seen(1000, 0);
  for (int32_t v : va) {
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 1000);
    seen[v] = 1;
  }
  int distinct = 0;
  for (int s : seen) distinct += s;
  EXPECT_GT(distinct, 990);  // 10 draws per id on average: all but a handful appear
}

TEST_F(TokenDatasetTest, MoveKeepsTheData) {
  const std::vector<uint32_t> ids = {5, 6, 7};
  TokenDataset a = TokenDataset::open(write("m.u16", u16_bytes(ids)), TokenFormat::kU16, 256);
  TokenDataset b = std::move(a);
  EXPECT_EQ(read_all(b), as_i32(ids));
  TokenDataset c = TokenDataset::open(write("m.txt", {'q'}), TokenFormat::kText, 256);
  c = std::move(b);
  EXPECT_EQ(read_all(c), as_i32(ids));
  TokenDataset d(TokenDataset::open(write("n.txt", {'x', 'y'}), TokenFormat::kText, 256));
  EXPECT_EQ(read_all(d), (std::vector<int32_t>{'x', 'y'}));
}

TEST_F(TokenDatasetTest, MissingFileAndDirectory) {
  const std::string missing = (dir_ / "nope.u16").string();
  expect_user_error([&] { TokenDataset::open(missing, TokenFormat::kU16, 256); }, missing, "cannot open");
  expect_user_error([&] { TokenDataset::open(missing, TokenFormat::kAuto, 256); }, missing, "cannot open");
  // A directory is its files' data: an empty one (or one of hidden files only) has none.
  std::filesystem::create_directories(dir_ / "empty" / ".git");
  write("empty/.git/HEAD", {1, 0});
  const std::string dir = (dir_ / "empty").string();
  expect_user_error([&] { TokenDataset::open(dir, TokenFormat::kU16, 256); }, dir, "holds no data files");
}

TEST_F(TokenDatasetTest, ShardsReadAsTheirConcatenationInSortedOrder) {
  // Three shards of other sizes (the middle one shorter than a window), written in another
  // order than they sort in; hidden files and directories are skipped.
  std::vector<uint32_t> a, b, c;
  for (uint32_t i = 0; i < 700; ++i) a.push_back((i * 31u) % 1000u);
  for (uint32_t i = 0; i < 5; ++i) b.push_back(900u + i);
  for (uint32_t i = 0; i < 300; ++i) c.push_back((i * 17u + 3u) % 1000u);
  std::filesystem::create_directories(dir_ / "d" / "sub");
  std::filesystem::create_directories(dir_ / "d" / ".cache");
  write("d/sub/c.u16", u16_bytes(c));
  write("d/b.u16", u16_bytes(b));
  write("d/a.u16", u16_bytes(a));
  write("d/.a.u16.swp", u16_bytes({999, 999}));
  write("d/.cache/x.u16", u16_bytes({998}));
  std::vector<int32_t> all = as_i32(a);
  for (uint32_t v : b) all.push_back(int32_t(v));
  for (uint32_t v : c) all.push_back(int32_t(v));

  TokenDataset ds = TokenDataset::open((dir_ / "d").string(), TokenFormat::kAuto, 1000);
  EXPECT_EQ(ds.num_files(), 3);
  EXPECT_EQ(ds.format(), TokenFormat::kU16);
  EXPECT_EQ(read_all(ds), all);
  // windows across one and two shard ends
  for (auto [start, count] : {std::pair<int64_t, int64_t>{690, 20}, {698, 10}, {699, 7}, {700, 5},
                              {695, 100}, {0, 1005}}) {
    std::vector<int32_t> got(size_t(count), -1);
    ds.copy(start, count, got.data());
    EXPECT_EQ(got, std::vector<int32_t>(all.begin() + start, all.begin() + start + count)) << start;
  }
  // the same ids in one file: the same fingerprint
  std::vector<uint32_t> joined(all.begin(), all.end());
  EXPECT_EQ(TokenDataset::open(write("one.u16", u16_bytes(joined)), TokenFormat::kU16, 1000)
                .fingerprint(), ds.fingerprint());

  // A pattern: its matches, sorted (sub/c.u16 is not one; * skips hidden names as the shell does).
  TokenDataset g = TokenDataset::open((dir_ / "d" / "*.u16").string(), TokenFormat::kU16, 1000);
  EXPECT_EQ(g.num_files(), 2);
  EXPECT_EQ(read_all(g), std::vector<int32_t>(all.begin(), all.begin() + 705));
  const std::string none = (dir_ / "d" / "*.bin").string();
  expect_user_error([&] { TokenDataset::open(none, TokenFormat::kAuto, 1000); }, none,
                    "matches no file");
  const std::string dirs = (dir_ / "d" / "s*").string();
  expect_user_error([&] { TokenDataset::open(dirs, TokenFormat::kAuto, 1000); }, "sub",
                    "must match data files only");

  // llm.c version 1 and 2 shards mix; llm.c and raw u16 do not.
  std::filesystem::create_directories(dir_ / "m");
  write("m/0.bin", llmc_bytes(20240520, 1, 5, b));
  write("m/1.bin", llmc_bytes(20240520, 2, 300, c));
  TokenDataset m = TokenDataset::open((dir_ / "m").string(), TokenFormat::kAuto, 1000);
  std::vector<int32_t> bc = as_i32(b);
  for (uint32_t v : c) bc.push_back(int32_t(v));
  EXPECT_EQ(read_all(m), bc);
  const std::string mixed = write("m/2.u16", u16_bytes(a));
  expect_user_error([&] { TokenDataset::open((dir_ / "m").string(), TokenFormat::kAuto, 1000); },
                    mixed, "must have one format");
  std::filesystem::remove(mixed);
  // A bad id in the second shard names that file and its own position there.
  std::vector<uint32_t> bad = c;
  bad[42] = 1000;
  const std::string bad_path = write("m/1.bin", llmc_bytes(20240520, 2, 300, bad));
  expect_user_error([&] { TokenDataset::open((dir_ / "m").string(), TokenFormat::kAuto, 1000); },
                    bad_path, "token 42 has id 1000");

  // Text shards: their bytes, concatenated.
  std::filesystem::create_directories(dir_ / "t");
  write("t/1.txt", {'c', 'd'});
  write("t/0.txt", {'a', 'b'});
  TokenDataset t = TokenDataset::open((dir_ / "t").string(), TokenFormat::kAuto, 256);
  EXPECT_EQ(read_all(t), (std::vector<int32_t>{'a', 'b', 'c', 'd'}));
}

TEST_F(TokenDatasetTest, UnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files regardless of permissions";
  const std::string path = write("locked.u16", u16_bytes({1}));
  std::filesystem::permissions(path, std::filesystem::perms::none);
  expect_user_error([&] { TokenDataset::open(path, TokenFormat::kU16, 256); }, path, "cannot open");
}

TEST_F(TokenDatasetTest, EmptyData) {
  for (auto [name, format] : {std::pair{"e.u16", TokenFormat::kU16}, {"e.u32", TokenFormat::kU32},
                              {"e.txt", TokenFormat::kText}, {"e2.txt", TokenFormat::kAuto}}) {
    const std::string path = write(name, {});
    expect_user_error([&] { TokenDataset::open(path, format, 256); }, path, "empty");
  }
  const std::string llmc = write("e.bin", llmc_bytes(20240520, 1, 0, {}));
  expect_user_error([&] { TokenDataset::open(llmc, TokenFormat::kLlmc, 256); }, llmc, "empty");
}

TEST_F(TokenDatasetTest, RawSizeNotMultipleOfWidth) {
  const std::string p16 = write("t.u16", {1, 0, 2});
  expect_user_error([&] { TokenDataset::open(p16, TokenFormat::kU16, 256); }, p16, "truncated");
  const std::string p32 = write("t.u32", {1, 0, 0, 0, 2, 0});
  expect_user_error([&] { TokenDataset::open(p32, TokenFormat::kAuto, 256); }, p32, "truncated");
}

TEST_F(TokenDatasetTest, LlmcHeaderErrors) {
  const std::vector<uint32_t> ids = {1, 2, 3, 4};
  const std::string magic = write("magic.bin", llmc_bytes(20240521, 1, 4, ids));
  expect_user_error([&] { TokenDataset::open(magic, TokenFormat::kLlmc, 256); }, magic, "magic");
  const std::string version = write("version.bin", llmc_bytes(20240520, 3, 4, ids));
  expect_user_error([&] { TokenDataset::open(version, TokenFormat::kLlmc, 256); }, version, "version");
  // Header says 5 tokens, the file holds 4: truncated.
  const std::string shortfile = write("short.bin", llmc_bytes(20240520, 1, 5, ids));
  expect_user_error([&] { TokenDataset::open(shortfile, TokenFormat::kAuto, 256); }, shortfile,
                    "truncated");
  // Header says 3 tokens, the file holds 4.
  const std::string longfile = write("long.bin", llmc_bytes(20240520, 1, 3, ids));
  expect_user_error([&] { TokenDataset::open(longfile, TokenFormat::kLlmc, 256); }, longfile,
                    "header says 3 tokens");
  // Not even a whole header.
  std::vector<uint8_t> stub = llmc_bytes(20240520, 1, 4, ids);
  stub.resize(100);
  const std::string stubfile = write("stub.bin", stub);
  expect_user_error([&] { TokenDataset::open(stubfile, TokenFormat::kAuto, 256); }, stubfile,
                    "truncated");
  const std::string negative = write("neg.bin", llmc_bytes(20240520, 1, -1, ids));
  expect_user_error([&] { TokenDataset::open(negative, TokenFormat::kLlmc, 256); }, negative,
                    "negative");
}

TEST_F(TokenDatasetTest, TokenOutOfVocabNamesPositionAndValue) {
  std::vector<uint32_t> ids(100000, 3);
  ids[77777] = 999;
  ids[88888] = 1000;  // later offenders are not the one reported
  const std::string p16 = write("v.u16", u16_bytes(ids));
  expect_user_error([&] { TokenDataset::open(p16, TokenFormat::kU16, 500); }, p16,
                    "token 77777 has id 999");
  const std::string p32 = write("v.u32", u32_bytes(ids));
  expect_user_error([&] { TokenDataset::open(p32, TokenFormat::kU32, 500); }, p32,
                    "token 77777 has id 999");
  const std::string pl = write("v.bin", llmc_bytes(20240520, 2, 100000, ids));
  expect_user_error([&] { TokenDataset::open(pl, TokenFormat::kLlmc, 500); }, pl,
                    "token 77777 has id 999");
  // An id of 2^31 or more would be negative as int32: rejected against any vocab.
  const std::string huge = write("h.u32", u32_bytes({1, 0x80000000u}));
  expect_user_error([&] { TokenDataset::open(huge, TokenFormat::kU32, int64_t{1} << 31); }, huge,
                    "token 1 has id 2147483648");
  // The boundary: id == vocab_size - 1 is fine.
  EXPECT_EQ(TokenDataset::open(p16, TokenFormat::kU16, 1001).size(), 100000);
}

TEST_F(TokenDatasetTest, TextNeedsByteVocab) {
  const std::string path = write("small.txt", {'a'});
  expect_user_error([&] { TokenDataset::open(path, TokenFormat::kText, 255); }, path, "vocab_size");
  expect_user_error([&] { TokenDataset::open(path, TokenFormat::kAuto, 100); }, path, "vocab_size");
}

}  // namespace
// The file is read as windows are asked for: ranges inside it (u16 widened in place, offsets
// past an llm.c header) give the ids written; a file cut short or rewritten with an id past
// vocab_size after opening is a UserError naming it (it was a mapping: SIGBUS, or the bad id
// used as an embedding row).
TEST_F(TokenDatasetTest, WindowsAreReadAndCheckedAsAskedFor) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1000; ++i) ids.push_back((i * 7919u) % 300u);
  const std::string u16 = write("w.u16", u16_bytes(ids));
  const std::string llmc = write("w.bin", llmc_bytes(20240520, 2, 1000, ids));
  for (const auto& [path, fmt] : {std::pair{u16, TokenFormat::kU16}, {llmc, TokenFormat::kLlmc}}) {
    TokenDataset ds = TokenDataset::open(path, fmt, 300);
    for (int64_t start : {0, 1, 333, 999}) {
      for (int64_t count : {1, 2, 17}) {
        if (start + count > 1000) continue;
        std::vector<int32_t> got(size_t(count), -7);
        ds.copy(start, count, got.data());
        for (int64_t k = 0; k < count; ++k)
          EXPECT_EQ(got[size_t(k)], int32_t(ids[size_t(start + k)])) << path << " " << start + k;
      }
    }
  }
  TokenDataset ds = TokenDataset::open(u16, TokenFormat::kU16, 300);
  std::vector<uint32_t> changed = ids;
  changed[500] = 300;  // one past the vocabulary, the same file size
  write("w.u16", u16_bytes(changed));
  std::vector<int32_t> got(20);
  ds.copy(480, 20, got.data());  // before it: fine
  expect_user_error([&] { ds.copy(490, 20, got.data()); }, u16, "token 500 has id 300");
  std::filesystem::resize_file(u16, 2 * 600);
  expect_user_error([&] { ds.copy(590, 20, got.data()); }, u16, "shrank during the run");
}

TEST_F(TokenDatasetTest, FingerprintTellsCopiesApartWhereItSamples) {
  // 200,000 ids: more than the 64 windows of 1024 cover, so some positions are not sampled.
  const int64_t n = 200000;
  std::vector<uint32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(uint32_t((i * 2654435761u) % 50000u));
  auto fp = [&](const std::vector<uint32_t>& v, const std::string& name) {
    return TokenDataset::open(write(name, u16_bytes(v)), TokenFormat::kU16, 50000).fingerprint();
  };
  const uint64_t base = fp(ids, "a.u16");
  // The ids, not the encoding: the same ids as u32 and as llm.c v2 hash alike.
  EXPECT_EQ(TokenDataset::open(write("a.u32", u32_bytes(ids)), TokenFormat::kU32, 50000)
                .fingerprint(), base);
  EXPECT_EQ(TokenDataset::open(write("a.bin", llmc_bytes(20240520, 2, int32_t(n), ids)),
                               TokenFormat::kLlmc, 50000).fingerprint(), base);
  EXPECT_EQ(fp(ids, "again.u16"), base);
  // Window w starts at (n - 1024) w / 63 (the header's "evenly, first and last included").
  auto window_start = [&](int64_t w) { return (n - 1024) * w / 63; };
  for (int64_t pos : {int64_t{0}, n - 1, window_start(31) + 500, window_start(62) + 1023}) {
    std::vector<uint32_t> changed = ids;
    changed[size_t(pos)] = (changed[size_t(pos)] + 1) % 50000u;
    EXPECT_NE(fp(changed, "b.u16"), base) << "a change at sampled position " << pos;
  }
  // Two ids swapped inside one window: the same multiset, other positions.
  std::vector<uint32_t> swapped = ids;
  std::swap(swapped[size_t(window_start(10) + 3)], swapped[size_t(window_start(10) + 4)]);
  EXPECT_NE(fp(swapped, "c.u16"), base);
  // Between windows nothing is read: the limit the header states.
  const int64_t gap = window_start(1) + 1024 + 10;
  ASSERT_LT(gap, window_start(2));
  std::vector<uint32_t> unsampled = ids;
  unsampled[size_t(gap)] = (unsampled[size_t(gap)] + 1) % 50000u;
  EXPECT_EQ(fp(unsampled, "d.u16"), base);
  // One id more: another fingerprint, though every sampled window but the last holds the same ids.
  std::vector<uint32_t> longer = ids;
  longer.push_back(7);
  EXPECT_NE(fp(longer, "e.u16"), base);
  // Data shorter than a window: every id is sampled (64 times over).
  std::vector<uint32_t> small(ids.begin(), ids.begin() + 100);
  const uint64_t small_fp = fp(small, "f.u16");
  for (size_t pos = 0; pos < small.size(); pos += 9) {
    std::vector<uint32_t> changed = small;
    changed[pos] ^= 1u;
    EXPECT_NE(fp(changed, "g.u16"), small_fp) << pos;
  }
}

}  // namespace mx
