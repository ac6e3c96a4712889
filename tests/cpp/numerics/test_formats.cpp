// Exact-math checks of the codecs and Philox: known-answer vectors, exhaustive round trips,
// and round-to-nearest-even against a brute-force nearest-value search in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "numerics/formats.h"

using namespace mx::numerics;

namespace {

TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    Philox4 ctr;
    uint32_t k0, k1;
    uint32_t out[4];
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    Philox4 r = philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.out[i]) << "word " << i;
  }
}

TEST(Philox, StreamIsAPureFunctionOfItsFields) {
  RandomStream a{5, 1, 2, 3};
  // element i = word i % 4 of the block for counter i / 4, whatever order they are asked in
  for (uint64_t i : {7ull, 0ull, 1000001ull, 3ull, (1ull << 33) + 2}) {
    Philox4 b = philox4x32_10(Philox4{{uint32_t(i >> 2), uint32_t(i >> 34), 1, 3}}, 5, 2);
    EXPECT_EQ(a.bits(i), b.v[i & 3]);
  }
  RandomStream other_seed{6, 1, 2, 3}, other_step{5, 2, 2, 3}, other_rank{5, 1, 3, 3},
      other_tensor{5, 1, 2, 4};
  int same = 0;
  for (uint64_t i = 0; i < 64; ++i)
    same += (a.bits(i) == other_seed.bits(i)) + (a.bits(i) == other_step.bits(i)) +
            (a.bits(i) == other_rank.bits(i)) + (a.bits(i) == other_tensor.bits(i));
  EXPECT_EQ(same, 0);
}

// Brute force: the nearest finite value among `values` (double distance), ties to the even
// code; beyond max + half an ulp the caller's saturation applies.
int nearest_code(double x, const std::vector<double>& values, const std::vector<int>& codes) {
  int best = -1;
  double best_d = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double d = std::fabs(values[i] - x);
    if (best < 0 || d < best_d || (d == best_d && (codes[i] & 1) == 0 && (best & 1))) {
      best = codes[i];
      best_d = d;
    }
  }
  return best;
}

struct MiniSpec {
  const char* name;
  int ncodes, sign_bit, max_code;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float, Saturation, bool, uint32_t);
};

const MiniSpec kSpecs[] = {
    {"e4m3", 256, 0x80, 0x7E, decode_e4m3, encode_e4m3},
    {"e5m2", 256, 0x80, 0x7B, decode_e5m2, encode_e5m2},
    {"e2m1", 16, 0x8, 0x7, decode_e2m1, encode_e2m1},
};

TEST(Codecs, RoundTripEveryFiniteCode) {
  for (const MiniSpec& s : kSpecs) {
    for (int c = 0; c < s.ncodes; ++c) {
      const float v = s.decode(uint8_t(c));
      if (!std::isfinite(v)) continue;
      if (v == 0.0f) {  // both zeros keep their sign
        EXPECT_EQ(s.encode(v, Saturation::kSatFinite, false, 0), c) << s.name;
        continue;
      }
      EXPECT_EQ(s.encode(v, Saturation::kSatFinite, false, 0), c) << s.name << " code " << c;
      EXPECT_EQ(s.encode(v, Saturation::kNoSat, false, 0), c) << s.name << " code " << c;
    }
  }
  for (uint32_t c = 0; c < 65536; ++c) {
    const float v = decode_bf16(uint16_t(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(encode_bf16(v, Saturation::kNoSat), c);
  }
  for (int c = 0; c < 255; ++c) {
    EXPECT_EQ(decode_e8m0(uint8_t(c)), std::ldexp(1.0f, c - 127));
    EXPECT_EQ(encode_e8m0(decode_e8m0(uint8_t(c))), c);
  }
}

TEST(Codecs, RoundToNearestEvenMatchesBruteForce) {
  std::mt19937 gen(1);
  for (const MiniSpec& s : kSpecs) {
    std::vector<double> values;
    std::vector<int> codes;
    double max_value = 0;
    for (int c = 0; c < s.ncodes; ++c) {
      const float v = s.decode(uint8_t(c));
      if (!std::isfinite(v)) continue;
      values.push_back(v);
      codes.push_back(c);
      max_value = std::fmax(max_value, v);
    }
    std::uniform_real_distribution<double> log_mag(std::log2(max_value) - 14, std::log2(max_value));
    std::vector<float> xs;
    for (int i = 0; i < 20000; ++i) {
      const float x = float(std::exp2(log_mag(gen)));
      xs.push_back(gen() & 1 ? x : -x);
    }
    for (size_t i = 0; i + 1 < values.size(); ++i)  // midpoints (exact in fp32) and +-1 ulp
      for (size_t j = 0; j < values.size(); ++j) {
        const float m = float((values[i] + values[j]) / 2);
        xs.push_back(m);
        xs.push_back(std::nextafter(m, 1e30f));
        xs.push_back(std::nextafter(m, -1e30f));
      }
    for (float x : xs) {
      if (std::fabs(x) > max_value) continue;  // overflow: tested with the saturation rules
      const int want = nearest_code(x, values, codes);
      const int got = s.encode(x, Saturation::kSatFinite, false, 0);
      // a zero result keeps the input's sign; the brute force sees one zero per sign
      if (s.decode(uint8_t(want)) == 0.0f && s.decode(uint8_t(got)) == 0.0f) {
        EXPECT_EQ(got & s.sign_bit, std::signbit(x) ? s.sign_bit : 0) << s.name << " " << x;
        continue;
      }
      ASSERT_EQ(got, want) << s.name << " x=" << x;
    }
  }
}

TEST(Codecs, SaturationRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(encode_e4m3(464.0f, Saturation::kNoSat), 0x7E);  // tie rounds to even 448
  EXPECT_EQ(encode_e4m3(464.1f, Saturation::kNoSat), 0x7F);
  EXPECT_EQ(encode_e4m3(464.1f, Saturation::kSatFinite), 0x7E);
  EXPECT_EQ(encode_e4m3(-1e9f, Saturation::kSatFinite), 0xFE);
  EXPECT_EQ(encode_e4m3(inf, Saturation::kSatFinite), 0x7E);
  EXPECT_EQ(encode_e4m3(-inf, Saturation::kNoSat), 0xFF);
  EXPECT_EQ(encode_e4m3(-nan, Saturation::kSatFinite), 0x7F);
  EXPECT_EQ(encode_e5m2(61440.0f, Saturation::kNoSat), 0x7C);  // tie to even = inf
  EXPECT_EQ(encode_e5m2(61440.0f, Saturation::kSatFinite), 0x7B);
  EXPECT_EQ(encode_e5m2(-inf, Saturation::kSatFinite), 0xFB);
  EXPECT_EQ(encode_e5m2(-inf, Saturation::kNoSat), 0xFC);
  EXPECT_EQ(encode_e2m1(7.0f), 0x7);
  EXPECT_EQ(encode_e2m1(-1e30f), 0xF);
  EXPECT_EQ(encode_e2m1(5.0f), 0x6);   // tie between 4 (even code 6) and 6 (code 7)
  EXPECT_EQ(encode_e2m1(0.25f), 0x0);  // tie between 0 and 0.5 -> 0
  EXPECT_EQ(encode_e2m1(0.75f), 0x2);  // tie between 0.5 and 1 -> 1 (even code 2)
  EXPECT_EQ(encode_bf16(3.4e38f, Saturation::kNoSat), 0x7F80);
  EXPECT_EQ(encode_bf16(3.4e38f, Saturation::kSatFinite), 0x7F7F);
  EXPECT_EQ(encode_e8m0(0.0f, E8M0Rounding::kUp, Saturation::kSatFinite), 0x00);
  EXPECT_EQ(encode_e8m0(0.0f), 0xFF);
  EXPECT_EQ(encode_e8m0(inf, E8M0Rounding::kUp, Saturation::kSatFinite), 0xFE);
  EXPECT_EQ(encode_e8m0(1.5f), 128);
  EXPECT_EQ(encode_e8m0(1.4999999f), 127);
  EXPECT_EQ(encode_e8m0(1.0000001f, E8M0Rounding::kUp, Saturation::kSatFinite), 128);
  EXPECT_EQ(encode_e8m0(1.9999999f, E8M0Rounding::kDown), 127);
  EXPECT_EQ(encode_ue4m3(-3.0f), 0x00);
  EXPECT_EQ(encode_ue4m3(1000.0f), 0x7E);
  EXPECT_TRUE(std::isnan(decode_e4m3(0xFF)));
  EXPECT_TRUE(std::isinf(decode_e5m2(0xFC)) && decode_e5m2(0xFC) < 0);
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode_e5m2(0x01), std::ldexp(1.0f, -16));
}

TEST(Codecs, StochasticRoundingThresholdIsExact) {
  // 1.1875 lies half way between E4M3 1.125 and 1.25: remainder fraction 1/2, so r32 = 2^31
  // and the carry happens exactly for rand >= 2^31.
  EXPECT_EQ(decode_e4m3(encode_e4m3(1.1875f, Saturation::kSatFinite, true, 0x7FFFFFFFu)), 1.125f);
  EXPECT_EQ(decode_e4m3(encode_e4m3(1.1875f, Saturation::kSatFinite, true, 0x80000000u)), 1.25f);
  // 1.03125 = 1 + ulp/4: rounds up iff rand >= 3 * 2^30
  EXPECT_EQ(decode_e4m3(encode_e4m3(1.03125f, Saturation::kSatFinite, true, 0xBFFFFFFFu)), 1.0f);
  EXPECT_EQ(decode_e4m3(encode_e4m3(1.03125f, Saturation::kSatFinite, true, 0xC0000000u)),
            1.125f);
  // negative values round away from zero with the same probability (magnitude rounding)
  EXPECT_EQ(decode_e2m1(encode_e2m1(-2.5f, Saturation::kSatFinite, true, 0x80000000u)), -3.0f);
  EXPECT_EQ(decode_e2m1(encode_e2m1(-2.5f, Saturation::kSatFinite, true, 0x7FFFFFFFu)), -2.0f);
  // an exact value never moves, whatever the random bits
  EXPECT_EQ(encode_e4m3(1.25f, Saturation::kSatFinite, true, 0xFFFFFFFFu), 0x3A);
  // SR past max saturates under SATFINITE
  EXPECT_EQ(encode_e4m3(447.9f * 1.05f, Saturation::kSatFinite, true, 0xFFFFFFFFu), 0x7E);
  // bf16: remainder below the kept bits is exactly the low 16 bits of the fp32
  const float x = std::ldexp(1.0f + 0x40 * std::ldexp(1.0f, -23), 0);  // 1 + 64 ulp(fp32)
  EXPECT_EQ(encode_bf16(x, Saturation::kNoSat, true, 0xFFBFFFFFu), 0x3F80);  // 64*2^16 + r < 2^32
  EXPECT_EQ(encode_bf16(x, Saturation::kNoSat, true, 0xFFC00000u), 0x3F81);
}

}  // namespace

// encode_bf16's RNE fast path (kNoSat, not stochastic: integer add and shift) against the
// general minifloat rounding (round_to_minifloat_code with bf16's 7 mantissa bits and emin
// -126, inf past 0x7F7F, NaN to sign | 0x7FC0), which the other formats use. The result
// depends on the sign, the exponent, the kept mantissa's lowest bit and carry (its 7 bits: all
// ones or not) and the 16 dropped bits: every sign and exponent (subnormals, inf and NaN
// included) x kept mantissas 0, 1, 0x3E, 0x3F, 0x40, 0x7E, 0x7F x all 65536 dropped patterns,
// then every 65519th float of all 2^32.
TEST(Formats, Bf16FastRoundingMatchesTheGeneralPath) {
  auto general = [](uint32_t bits) -> uint16_t {
    const uint32_t sign = (bits >> 16) & 0x8000u, a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return uint16_t(sign | 0x7FC0);
    if (a == 0x7F800000u) return uint16_t(sign | 0x7F80);
    uint32_t mag = mx::numerics::round_to_minifloat_code(a, 7, -126, false, 0);
    if (mag > 0x7F7F) mag = 0x7F80;
    return uint16_t(sign | mag);
  };
  int64_t bad = 0;
  auto check = [&](uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, 4);
    const uint16_t got = encode_bf16(x, Saturation::kNoSat), want = general(bits);
    if (got != want && ++bad <= 5) ADD_FAILURE() << std::hex << "bits 0x" << bits << ": 0x" << got << ", want 0x" << want;
  };
  for (uint32_t se = 0; se < 512; ++se)
    for (uint32_t hi : {0u, 1u, 0x3Eu, 0x3Fu, 0x40u, 0x7Eu, 0x7Fu})
      for (uint32_t lo = 0; lo < 65536; ++lo) check(se << 23 | hi << 16 | lo);
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 65519) check(uint32_t(b));
  EXPECT_EQ(bad, 0);
}
