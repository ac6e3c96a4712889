// safetensors: files built byte by byte from the format's spec are read; files the writer makes
// are parsed back by hand (nlohmann::json on the header, raw byte comparison on the data), so
// neither side is only checked against itself.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace {

namespace fs = std::filesystem;
using mx::SafeTensorsReader;
using mx::SafeTensorsWriter;

using Bytes = std::vector<unsigned char>;

// A fresh directory per test, removed afterwards.
class SafeTensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mx_safetensors_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

void write_bytes(const std::string& path, const void* data, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (n) {
    ASSERT_EQ(std::fwrite(data, 1, n, f), n);
  }
  ASSERT_EQ(std::fclose(f), 0);
}

// The spec's layout, by hand: u64 LE header length, the header text, then the data bytes.
void write_safetensors_by_hand(const std::string& path, const std::string& header,
                               const Bytes& data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  uint64_t n = header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = (unsigned char)(n >> (8 * i));  // little-endian
  ASSERT_EQ(std::fwrite(len, 1, 8, f), 8u);
  ASSERT_EQ(std::fwrite(header.data(), 1, header.size(), f), header.size());
  if (!data.empty()) {
    ASSERT_EQ(std::fwrite(data.data(), 1, data.size(), f), data.size());
  }
  ASSERT_EQ(std::fclose(f), 0);
}

Bytes read_all(const std::string& path) {
  Bytes out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return out;
  unsigned char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  return out;
}

void append_u16(Bytes& b, uint16_t v) {
  b.push_back(uint8_t(v));
  b.push_back(uint8_t(v >> 8));
}
void append_f32(Bytes& b, float f) {
  uint32_t v = std::bit_cast<uint32_t>(f);
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
void append_f64(Bytes& b, double d) {
  uint64_t v = std::bit_cast<uint64_t>(d);
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

// Opening `path` must throw UserError whose message names the file (and `also`, if given).
void expect_reader_user_error(const std::string& path, const std::string& also = "") {
  try {
    SafeTensorsReader r(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const mx::UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    if (!also.empty()) {
      EXPECT_NE(msg.find(also), std::string::npos) << msg;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Scalar conversions against exact math

uint16_t bf16(uint32_t f32_bits) { return mx::f32_to_bf16_rne(std::bit_cast<float>(f32_bits)); }

TEST(Bf16Conversion, RoundsToNearestTiesToEven) {
  EXPECT_EQ(bf16(0x3F800000), 0x3F80);  // 1.0 exact
  EXPECT_EQ(bf16(0x3F808000), 0x3F80);  // tie between 0x3F80 (even) and 0x3F81: down
  EXPECT_EQ(bf16(0x3F818000), 0x3F82);  // tie between 0x3F81 and 0x3F82 (even): up
  EXPECT_EQ(bf16(0x3F808001), 0x3F81);  // just above the tie: up
  EXPECT_EQ(bf16(0x3F807FFF), 0x3F80);  // just below the tie: down
  EXPECT_EQ(bf16(0x3F81FFFF), 0x3F82);  // carry within the mantissa
  EXPECT_EQ(bf16(0x3FFF8000), 0x4000);  // tie, odd lsb: carry into the exponent (2.0)
  EXPECT_EQ(bf16(0xBF808000), 0xBF80);  // negative tie to even
  EXPECT_EQ(bf16(0xBF818000), 0xBF82);
  EXPECT_EQ(bf16(0xC0490FDB), 0xC049);  // -pi = -3.14159274 -> -3.140625
  EXPECT_EQ(bf16(0x00000000), 0x0000);
  EXPECT_EQ(bf16(0x80000000), 0x8000);  // -0 keeps its sign
  EXPECT_EQ(bf16(0x00018000), 0x0002);  // subnormal tie, odd lsb: up to even
}

TEST(Bf16Conversion, InfinityOverflowAndNan) {
  EXPECT_EQ(bf16(0x7F800000), 0x7F80);  // +inf
  EXPECT_EQ(bf16(0xFF800000), 0xFF80);  // -inf
  // FLT_MAX is above bf16's largest finite value (0x7F7F) by more than half an ulp: inf.
  EXPECT_EQ(bf16(0x7F7FFFFF), 0x7F80);
  EXPECT_EQ(bf16(0xFF7FFFFF), 0xFF80);
  EXPECT_EQ(bf16(0x7F7F8000), 0x7F80);  // tie at the top, odd lsb: rounds to inf
  EXPECT_EQ(bf16(0x7F7F7FFF), 0x7F7F);  // below the tie: stays the largest finite
  // NaNs stay NaN, even a payload that only lives in the low 16 bits (rounding would carry it
  // into an infinity), and keep their sign.
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFF800001u, 0xFFC00000u}) {
    uint16_t b = bf16(nan);
    EXPECT_TRUE(std::isnan(mx::bf16_to_f32(b))) << std::hex << nan << " -> " << b;
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
  }
}

TEST(Bf16Conversion, ToF32IsABitShift) {
  for (uint32_t b : {0x0000u, 0x8000u, 0x3F80u, 0xC000u, 0x7F80u, 0xFF80u, 0x0001u, 0x7F7Fu, 0x1234u}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(mx::bf16_to_f32(uint16_t(b))), b << 16) << std::hex << b;
  }
  EXPECT_EQ(mx::bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(mx::bf16_to_f32(0xC000), -2.0f);
  EXPECT_TRUE(std::isnan(mx::bf16_to_f32(0x7FC0)));
}

TEST(F16Conversion, KnownBitPatterns) {
  EXPECT_EQ(mx::f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(mx::f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(mx::f16_to_f32(0x3800), 0.5f);
  EXPECT_EQ(mx::f16_to_f32(0x7BFF), 65504.0f);                 // largest finite
  EXPECT_EQ(mx::f16_to_f32(0x0001), std::ldexp(1.0f, -24));    // smallest subnormal
  EXPECT_EQ(mx::f16_to_f32(0x03FF), std::ldexp(1023.0f, -24)); // largest subnormal
  EXPECT_EQ(mx::f16_to_f32(0x0400), std::ldexp(1.0f, -14));    // smallest normal
  EXPECT_EQ(mx::f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(mx::f16_to_f32(0x3555), (1.0f + 0x155 / 1024.0f) * 0.25f);  // 0.333251953125
  EXPECT_EQ(std::bit_cast<uint32_t>(mx::f16_to_f32(0x0000)), 0x00000000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(mx::f16_to_f32(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(mx::f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(mx::f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(mx::f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(mx::f16_to_f32(0x7C01)));  // signalling NaN payload stays a NaN
}

// ---------------------------------------------------------------------------------------------
// Reader on files built from the spec

TEST_F(SafeTensorsTest, ReadsAHandBuiltFile) {
  // Entries listed out of data order on purpose; tensors() must come back by offset.
  Bytes data;
  append_f32(data, 1.0f);  // "w" F32 [2, 2] at [0, 16)
  append_f32(data, -2.5f);
  append_f32(data, 3.0e-8f);
  append_f32(data, 1024.0f);
  append_u16(data, 0x3F80);  // "b" BF16 [3] at [16, 22): 1, -2, 0.5
  append_u16(data, 0xC000);
  append_u16(data, 0x3F00);
  append_u16(data, 0x3C00);  // "h" F16 [2] at [22, 26): 1, 65504
  append_u16(data, 0x7BFF);
  append_f64(data, 0.1);     // "d" F64 [1] at [26, 34)
  data.push_back(7);         // "s" U8 scalar [] at [34, 35)
  ASSERT_EQ(data.size(), 35u);
  std::string header = R"({"h": {"dtype": "F16", "shape": [2], "data_offsets": [22, 26]},
    "__metadata__": {"format": "pt", "step": "12"},
    "s": {"dtype": "U8", "shape": [], "data_offsets": [34, 35]},
    "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [16, 16]},
    "d": {"dtype": "F64", "shape": [1], "data_offsets": [26, 34]},
    "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}})";
  std::string path = file("model.safetensors");
  write_safetensors_by_hand(path, header, data);

  SafeTensorsReader r(path);
  EXPECT_EQ(r.path(), path);
  std::vector<std::string> order;
  for (const auto& t : r.tensors()) order.push_back(t.name);
  // "e" and "b" both begin at 16; the empty one sorts first (shorter range).
  EXPECT_EQ(order, (std::vector<std::string>{"w", "e", "b", "h", "d", "s"}));

  const auto& w = r.entry("w");
  EXPECT_EQ(w.dtype, "F32");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(w.begin, 0u);
  EXPECT_EQ(w.end, 16u);
  EXPECT_EQ(w.numel(), 4);
  EXPECT_EQ(r.read_f32("w"), (std::vector<float>{1.0f, -2.5f, 3.0e-8f, 1024.0f}));
  EXPECT_EQ(r.read_f32("b"), (std::vector<float>{1.0f, -2.0f, 0.5f}));
  EXPECT_EQ(r.read_f32("h"), (std::vector<float>{1.0f, 65504.0f}));
  EXPECT_EQ(r.read_f32("d"), (std::vector<float>{float(0.1)}));
  EXPECT_EQ(r.entry("e").numel(), 0);
  EXPECT_TRUE(r.read_f32("e").empty());
  EXPECT_EQ(r.entry("s").numel(), 1);
  EXPECT_EQ(*static_cast<const unsigned char*>(r.raw("s")), 7);
  EXPECT_EQ(std::memcmp(r.raw("b"), data.data() + 16, 6), 0);

  float into[3];
  r.read_f32("b", into, 3);
  EXPECT_EQ(into[2], 0.5f);

  EXPECT_TRUE(r.has("w"));
  EXPECT_FALSE(r.has("nope"));
  EXPECT_FALSE(r.has("__metadata__"));
  ASSERT_EQ(r.metadata().size(), 2u);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("step"), "12");

  // A moved reader keeps the mapping alive.
  SafeTensorsReader moved(std::move(r));
  EXPECT_EQ(moved.read_f32("h")[1], 65504.0f);
}

TEST_F(SafeTensorsTest, LookupErrorsNameFileAndTensor) {
  Bytes data(4, 0);
  std::string path = file("x.safetensors");
  write_safetensors_by_hand(path, R"({"u": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
                            data);
  SafeTensorsReader r(path);
  auto expect_error = [&](auto&& fn, const std::string& also) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const mx::UserError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(also), std::string::npos) << msg;
    }
  };
  expect_error([&] { r.entry("missing"); }, "missing");
  expect_error([&] { r.read_f32("missing"); }, "missing");
  expect_error([&] { r.read_f32("u"); }, "U8");  // not convertible to fp32
  std::vector<float> buf(3);
  expect_error([&] { r.read_f32("u", buf.data(), 3); }, "u");  // count != numel
}

TEST_F(SafeTensorsTest, HeaderOnlyFileWithNoTensors) {
  std::string path = file("empty.safetensors");
  write_safetensors_by_hand(path, "{}", {});
  SafeTensorsReader r(path);
  EXPECT_TRUE(r.tensors().empty());
  EXPECT_TRUE(r.metadata().empty());
}

TEST_F(SafeTensorsTest, RejectsMissingAndTruncatedFiles) {
  expect_reader_user_error(file("does_not_exist.safetensors"));
  std::string empty = file("empty.safetensors");
  write_bytes(empty, "", 0);
  expect_reader_user_error(empty, "shorter");
  std::string seven = file("seven.safetensors");
  write_bytes(seven, "\x02\0\0\0\0\0\0", 7);
  expect_reader_user_error(seven, "shorter");
}

TEST_F(SafeTensorsTest, RejectsHeaderLengthBeyondTheFile) {
  // Claims a 64-byte header but only 2 bytes follow.
  std::string path = file("long_header.safetensors");
  unsigned char bytes[10] = {64, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  write_bytes(path, bytes, sizeof bytes);
  expect_reader_user_error(path, "header length");
  // A length near 2^64 must not wrap around any arithmetic.
  std::string huge = file("huge_header.safetensors");
  unsigned char all_ones[10] = {255, 255, 255, 255, 255, 255, 255, 255, '{', '}'};
  write_bytes(huge, all_ones, sizeof all_ones);
  expect_reader_user_error(huge, "header length");
}

TEST_F(SafeTensorsTest, RejectsHeaderOver100MB) {
  // A sparse file just larger than the header it claims, so only the 100 MB limit can fire.
  std::string path = file("big_header.safetensors");
  uint64_t n = 100'000'001;
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = (unsigned char)(n >> (8 * i));
  write_bytes(path, len, 8);
  ASSERT_EQ(::truncate(path.c_str(), off_t(8 + n + 8)), 0);
  expect_reader_user_error(path, "limit");
}

struct BadHeader {
  const char* label;
  std::string header;
  size_t data_bytes;
  const char* expect_in_message;
};

TEST_F(SafeTensorsTest, RejectsEveryMalformedHeader) {
  const std::vector<BadHeader> cases = {
      {"not_json", R"({"a": {"dtype": "F32",)", 4, "JSON"},
      {"not_json_garbage", "\xff\xfe garbage", 4, "JSON"},
      {"not_object_array", R"([1, 2, 3])", 4, "object"},
      {"not_object_string", R"("hello")", 4, "object"},
      {"entry_not_object", R"({"a": 5})", 4, "'a'"},
      {"missing_dtype", R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4, "dtype"},
      {"missing_shape", R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, "shape"},
      {"missing_offsets", R"({"a": {"dtype": "F32", "shape": [1]}})", 4, "data_offsets"},
      {"dtype_not_string", R"({"a": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4,
       "dtype"},
      {"shape_not_array", R"({"a": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4,
       "shape"},
      {"shape_float", R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
       "shape"},
      {"shape_string", R"({"a": {"dtype": "F32", "shape": ["1"], "data_offsets": [0, 4]}})", 4,
       "shape"},
      {"offsets_not_array", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": 0}})", 4,
       "data_offsets"},
      {"offsets_one", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", 4,
       "data_offsets"},
      {"offsets_three", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 8,
       "data_offsets"},
      {"offsets_negative", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
       "data_offsets"},
      {"offsets_float", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4]}})", 4,
       "data_offsets"},
      {"offsets_backwards", R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", 4,
       "backwards"},
      {"unknown_dtype", R"({"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})", 16,
       "F128"},
      {"lowercase_dtype", R"({"a": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", 4,
       "f32"},
      {"negative_dim", R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
       "shape"},
      {"negative_dims_cancel", R"({"a": {"dtype": "F32", "shape": [-1, -1], "data_offsets": [0, 4]}})",
       4, "shape"},
      // 2^62 * 4 elements overflows int64 as a count; 2^61 * 4 bytes overflows as a size.
      {"numel_overflow",
       R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 4]}})", 4,
       "overflow"},
      {"bytes_overflow",
       R"({"a": {"dtype": "F32", "shape": [2305843009213693952], "data_offsets": [0, 0]}})", 4,
       "overflow"},
      {"dim_beyond_int64",
       R"({"a": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 4]}})", 4,
       "shape"},
      {"size_mismatch", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8,
       "needs 8 bytes"},
      {"size_mismatch_bf16", R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 8]}})",
       8, "needs 4 bytes"},
      {"outside_buffer", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 8,
       "outside"},
      {"offset_huge",
       R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [18446744073709551614, 18446744073709551615]}})",
       8, "data_offsets"},
      {"overlap",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "overlap"},
      {"overlap_same_range",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
       4, "overlap"},
      {"overlap_contained",
       R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
           "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]},
           "c": {"dtype": "U8", "shape": [2], "data_offsets": [5, 7]}})",
       8, "overlap"},
      {"metadata_not_object", R"({"__metadata__": [1]})", 0, "__metadata__"},
      {"metadata_value_not_string", R"({"__metadata__": {"step": 12}})", 0, "step"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    std::string path = file(std::string(c.label) + ".safetensors");
    write_safetensors_by_hand(path, c.header, Bytes(c.data_bytes, 0));
    expect_reader_user_error(path, c.expect_in_message);
  }
}

TEST_F(SafeTensorsTest, AcceptsEveryKnownDtype) {
  const std::vector<std::pair<std::string, size_t>> dtypes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},     {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  std::string header = "{";
  size_t offset = 0;
  for (const auto& [dtype, size] : dtypes) {
    EXPECT_EQ(mx::safetensors_dtype_size(dtype), size) << dtype;
    header += (offset ? ", \"" : "\"") + dtype + "\": {\"dtype\": \"" + dtype +
              "\", \"shape\": [3], \"data_offsets\": [" + std::to_string(offset) + ", " +
              std::to_string(offset + 3 * size) + "]}";
    offset += 3 * size;
  }
  header += "}";
  std::string path = file("all.safetensors");
  write_safetensors_by_hand(path, header, Bytes(offset, 0));
  SafeTensorsReader r(path);
  ASSERT_EQ(r.tensors().size(), dtypes.size());
  for (const auto& [dtype, size] : dtypes) {
    EXPECT_EQ(r.entry(dtype).dtype, dtype);
    EXPECT_EQ(r.entry(dtype).end - r.entry(dtype).begin, 3 * size);
  }
  EXPECT_EQ(mx::safetensors_dtype_size("F128"), 0u);
}

// ---------------------------------------------------------------------------------------------
// Writer, checked by parsing its bytes by hand

struct ParsedFile {
  uint64_t header_len = 0;
  std::string header_text;
  nlohmann::json header;
  Bytes buffer;
};

ParsedFile parse_by_hand(const std::string& path) {
  ParsedFile p;
  Bytes all = read_all(path);
  EXPECT_GE(all.size(), 8u);
  if (all.size() < 8) return p;
  for (int i = 0; i < 8; ++i) p.header_len |= uint64_t(all[i]) << (8 * i);
  EXPECT_LE(8 + p.header_len, all.size());
  p.header_text.assign(all.begin() + 8, all.begin() + 8 + p.header_len);
  p.header = nlohmann::json::parse(p.header_text);
  p.buffer.assign(all.begin() + 8 + p.header_len, all.end());
  return p;
}

TEST_F(SafeTensorsTest, WriterBytesMatchTheSpec) {
  const float w[6] = {1.0f, -2.0f, 0.5f, 3.0e-8f, 65504.0f, -0.0f};
  const float b[3] = {1.0f, std::bit_cast<float>(0x3F808000u), std::bit_cast<float>(0x3F818000u)};
  const int32_t ids[2] = {-1, 128255};
  const uint8_t mask[3] = {1, 0, 255};

  SafeTensorsWriter wr;
  wr.add_f32("model.embed.weight", {2, 3}, w);                // F32 [0, 24)
  wr.add_f32("model.norm.weight", {3}, b, "BF16");            // BF16 [24, 30)
  wr.add_raw("mask", "U8", {3}, mask, sizeof mask);           // U8 [30, 33)
  wr.add_raw("ids", "I32", {2}, ids, sizeof ids);             // I32 [33, 41)
  wr.add_raw("scalar", "U8", {}, mask, 1);                    // U8 [41, 42)
  wr.set_metadata("format", "pt");
  wr.set_metadata("note", "quote \" and ünïcode");
  std::string path = file("out.safetensors");
  wr.write(path);

  ParsedFile p = parse_by_hand(path);
  EXPECT_EQ(p.header_len % 8, 0u) << "header must be padded to 8 bytes";
  // Any padding is trailing spaces after the JSON object.
  size_t close = p.header_text.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_LT(p.header_text.size() - close - 1, 8u);
  for (size_t i = close + 1; i < p.header_text.size(); ++i) EXPECT_EQ(p.header_text[i], ' ');

  ASSERT_TRUE(p.header.is_object());
  EXPECT_EQ(p.header.size(), 6u);  // 5 tensors + __metadata__
  EXPECT_EQ(p.header["__metadata__"], (nlohmann::json{{"format", "pt"}, {"note", "quote \" and ünïcode"}}));

  auto expect_entry = [&](const char* name, const char* dtype, std::vector<int64_t> shape,
                          uint64_t begin, uint64_t end) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.header.contains(name));
    const auto& e = p.header[name];
    EXPECT_EQ(e["dtype"], dtype);
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), shape);
    EXPECT_EQ(e["data_offsets"], (nlohmann::json{begin, end}));
  };
  // Back to back, in the order added, no gaps (the format forbids them).
  expect_entry("model.embed.weight", "F32", {2, 3}, 0, 24);
  expect_entry("model.norm.weight", "BF16", {3}, 24, 30);
  expect_entry("mask", "U8", {3}, 30, 33);
  expect_entry("ids", "I32", {2}, 33, 41);
  expect_entry("scalar", "U8", {}, 41, 42);
  ASSERT_EQ(p.buffer.size(), 42u);

  Bytes expect;
  for (float f : w) append_f32(expect, f);
  append_u16(expect, 0x3F80);  // 1.0
  append_u16(expect, 0x3F80);  // tie to even: down
  append_u16(expect, 0x3F82);  // tie to even: up
  expect.insert(expect.end(), {1, 0, 255});
  for (uint8_t v : {0xFF, 0xFF, 0xFF, 0xFF}) expect.push_back(v);  // -1 as little-endian i32
  for (uint8_t v : {0xFF, 0xF4, 0x01, 0x00}) expect.push_back(v);  // 128255 = 0x0001F4FF
  expect.push_back(1);
  EXPECT_EQ(p.buffer, expect);

  // And our own reader agrees with the hand parse.
  SafeTensorsReader r(path);
  EXPECT_EQ(r.read_f32("model.norm.weight"), (std::vector<float>{1.0f, 1.0f, 1.015625f}));
  EXPECT_EQ(r.metadata().at("note"), "quote \" and ünïcode");
}

TEST_F(SafeTensorsTest, WriterWithoutMetadataOrTensors) {
  std::string path = file("empty.safetensors");
  SafeTensorsWriter().write(path);
  ParsedFile p = parse_by_hand(path);
  EXPECT_EQ(p.header, nlohmann::json::object());
  EXPECT_EQ(p.header_len % 8, 0u);
  EXPECT_TRUE(p.buffer.empty());
}

TEST_F(SafeTensorsTest, WriterRejectsBadInput) {
  float x[4] = {};
  SafeTensorsWriter wr;
  wr.add_f32("a", {4}, x);
  EXPECT_THROW(wr.add_f32("a", {4}, x), mx::UserError);              // duplicate
  EXPECT_THROW(wr.add_raw("a", "U8", {1}, x, 1), mx::UserError);     // duplicate
  EXPECT_THROW(wr.add_f32("__metadata__", {1}, x), mx::UserError);   // reserved
  EXPECT_THROW(wr.add_f32("b", {4}, x, "I32"), mx::UserError);       // add_f32 is F32/BF16
  EXPECT_THROW(wr.add_f32("b", {-1}, x), mx::UserError);             // negative dim
  EXPECT_THROW(wr.add_raw("b", "I32", {2}, x, 4), mx::UserError);    // 2 x I32 is 8 bytes
  EXPECT_THROW(wr.add_raw("b", "F128", {1}, x, 16), mx::UserError);  // unknown dtype
}

TEST_F(SafeTensorsTest, FailedWriteLeavesNoFile) {
  float x[2] = {1, 2};
  SafeTensorsWriter wr;
  wr.add_f32("x", {2}, x);
  std::string path = file("missing_dir/out.safetensors");
  EXPECT_THROW(wr.write(path), mx::StorageError);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(file("missing_dir")));
  // Nothing at all was left in the test directory, temp files included.
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(SafeTensorsTest, OverwriteReplacesTheWholeFile) {
  std::string path = file("ckpt.safetensors");
  std::vector<float> big(1000, 3.0f);
  SafeTensorsWriter first;
  first.add_f32("big", {1000}, big.data());
  first.set_metadata("step", "1");
  first.write(path);
  ASSERT_EQ(fs::file_size(path), 8 + parse_by_hand(path).header_len + 4000);

  float small[2] = {5.0f, 6.0f};
  SafeTensorsWriter second;
  second.add_f32("small", {2}, small);
  second.write(path);

  // The new file in full, with no tail of the old one.
  ParsedFile p = parse_by_hand(path);
  EXPECT_EQ(fs::file_size(path), 8 + p.header_len + 8);
  EXPECT_FALSE(p.header.contains("big"));
  EXPECT_FALSE(p.header.contains("__metadata__"));
  Bytes expect;
  append_f32(expect, 5.0f);
  append_f32(expect, 6.0f);
  EXPECT_EQ(p.buffer, expect);
  // Only the target remains: the temp file was renamed, not copied.
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "ckpt.safetensors");
  }
  EXPECT_EQ(entries, 1u);
}

}  // namespace
