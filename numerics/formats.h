// Low-precision number formats: encode from fp32 and decode to fp32, for host and device code.
//
// Every function here is inline, MX_HOST_DEVICE, and uses no std:: containers, so the CPU
// emulation and CUDA kernels include this one header and round identically. The rules (and why
// each one is what it is) are in docs/numerics.md; in short:
//   E4M3  (float8_e4m3fn): bias 7, max 448, no inf, NaN = 0x7F/0xFF
//   E5M2  (float8_e5m2):   bias 15, max 57344, inf = 0x7C/0xFC, NaN = 0x7D..0x7F (and negatives)
//   E2M1  (float4_e2m1fn): bias 1, values 0 0.5 1 1.5 2 3 4 6 (and negatives), no inf, no NaN;
//                          a code is the low 4 bits of a byte (sign = bit 3)
//   E8M0  (float8_e8m0fnu): 2^(code-127), no sign, no zero, 0xFF = NaN
//   UE4M3: E4M3 with the sign bit always 0 (NVFP4 block scales)
//   BF16:  the high half of an fp32
// Saturation::kSatFinite is cuda_fp8.h's __NV_SATFINITE (finite overflow and +-inf clamp to
// +-max, NaN -> the canonical positive NaN); Saturation::kNoSat is ml_dtypes' astype (overflow
// -> NaN for E4M3, inf for E5M2 and BF16; E2M1 always clamps since it has neither).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MX_HOST_DEVICE __host__ __device__
#else
#define MX_HOST_DEVICE
#endif

namespace mx::numerics {

enum class Saturation : uint8_t { kSatFinite, kNoSat };

// Element formats of the quantizers; also the --format names of `mxtrain numerics codec`.
enum class Format : uint8_t { kE4M3, kE5M2, kE2M1, kE8M0, kUE4M3, kBF16 };

MX_HOST_DEVICE inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

MX_HOST_DEVICE inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
constexpr float kE2M1Max = 6.0f;

// ---------------------------------------------------------------------------------------------
// The rounding core shared by every sign-magnitude minifloat (E4M3, E5M2, E2M1, BF16).
//
// `abs_bits` is a finite non-negative fp32 (bits). The target has `man_bits` mantissa bits and
// smallest normal exponent `emin` (and subnormals below it). Returns the target's magnitude code
// (exponent field << man_bits | mantissa) of the rounded value, which may exceed the format's
// largest finite code: the caller decides what overflow means.
//
// The value is mant * 2^(e-23) (mant has 24 bits for a normal fp32). The target's quantum at
// this exponent is 2^(max(e, emin) - man_bits); `shift` is how many low bits of mant lie below
// it. Kept bits k = mant >> shift, remainder r = the rest.
//   round-to-nearest-even: k += (r > half) || (r == half && k odd)
//   stochastic: the remainder as a 32-bit fraction of one quantum, r32 = r * 2^32 / 2^shift
//     (truncated when shift > 32), plus the 32-bit random number `rand`; a carry out of 32 bits
//     rounds up. So P(round up) = r32 / 2^32, exactly r / 2^shift whenever shift <= 32 (always
//     for normal-range inputs of every format here).
// Adding one to the code carries correctly into the exponent field (and from subnormal to
// normal), which is why code = ((max(e, emin) - emin) << man_bits) + k.
MX_HOST_DEVICE inline uint32_t round_to_minifloat_code(uint32_t abs_bits, int man_bits, int emin,
                                                       bool stochastic, uint32_t rand) {
  const int biased = static_cast<int>(abs_bits >> 23);
  const int e = biased ? biased - 127 : -126;
  const uint64_t mant = biased ? ((abs_bits & 0x7FFFFFu) | 0x800000u) : (abs_bits & 0x7FFFFFu);
  const int e_kept = e > emin ? e : emin;
  const int shift = e_kept - e + 23 - man_bits;  // >= 16 for every format here
  if (shift >= 56) return 0;  // below 2^-32 of a quantum: RNE gives 0, and so does r32 + rand
  const uint64_t k = mant >> shift;
  const uint64_t r = mant & ((uint64_t(1) << shift) - 1);
  uint64_t up;
  if (stochastic) {
    const uint64_t r32 = shift <= 32 ? (r << (32 - shift)) : (r >> (shift - 32));
    up = (r32 + rand) >> 32;
  } else {
    const uint64_t half = uint64_t(1) << (shift - 1);
    up = (r > half || (r == half && (k & 1))) ? 1 : 0;
  }
  return (static_cast<uint32_t>(e_kept - emin) << man_bits) + static_cast<uint32_t>(k + up);
}

// ---------------------------------------------------------------------------------------------
// FP8 E4M3 (fn): 1 sign, 4 exponent (bias 7), 3 mantissa. Max 448 (0x7E), NaN 0x7F / 0xFF.
MX_HOST_DEVICE inline uint8_t encode_e4m3(float x, Saturation sat = Saturation::kSatFinite,
                                          bool stochastic = false, uint32_t rand = 0) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sat == Saturation::kSatFinite ? 0x7F : uint8_t(sign | 0x7F);
  if (a == 0x7F800000u) return uint8_t(sign | (sat == Saturation::kSatFinite ? 0x7E : 0x7F));
  uint32_t mag = round_to_minifloat_code(a, 3, -6, stochastic, rand);
  if (mag > 0x7E) mag = sat == Saturation::kSatFinite ? 0x7E : 0x7F;
  return uint8_t(sign | mag);
}

// ---------------------------------------------------------------------------------------------
// FP8 E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa. Max 57344 (0x7B), inf 0x7C.
// NaN: kSatFinite gives 0x7F (cuda_fp8.h's canonical NaN), kNoSat 0x7E | sign (ml_dtypes).
MX_HOST_DEVICE inline uint8_t encode_e5m2(float x, Saturation sat = Saturation::kSatFinite,
                                          bool stochastic = false, uint32_t rand = 0) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sat == Saturation::kSatFinite ? 0x7F : uint8_t(sign | 0x7E);
  if (a == 0x7F800000u) return uint8_t(sign | (sat == Saturation::kSatFinite ? 0x7B : 0x7C));
  uint32_t mag = round_to_minifloat_code(a, 2, -14, stochastic, rand);
  if (mag > 0x7B) mag = sat == Saturation::kSatFinite ? 0x7B : 0x7C;
  return uint8_t(sign | mag);
}

// ---------------------------------------------------------------------------------------------
// FP4 E2M1: 1 sign (bit 3), 2 exponent (bias 1), 1 mantissa. Max 6 (0x7). No inf, no NaN:
// overflow and +-inf clamp to +-6 in both modes. NaN: kSatFinite -> 0x7 (+6, our choice; see
// docs/numerics.md), kNoSat -> ml_dtypes' result, a zero with the NaN's sign flipped.
MX_HOST_DEVICE inline uint8_t encode_e2m1(float x, Saturation sat = Saturation::kSatFinite,
                                          bool stochastic = false, uint32_t rand = 0) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 28) & 0x8u;
  const uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sat == Saturation::kSatFinite ? 0x7 : uint8_t(sign ^ 0x8u);
  if (a == 0x7F800000u) return uint8_t(sign | 0x7);
  uint32_t mag = round_to_minifloat_code(a, 1, 0, stochastic, rand);
  if (mag > 0x7) mag = 0x7;
  return uint8_t(sign | mag);
}

// ---------------------------------------------------------------------------------------------
// BF16: round-to-nearest-even (or stochastic) from fp32. Overflow: kNoSat -> +-inf (ml_dtypes,
// IEEE), kSatFinite -> +-0x7F7F. NaN: kNoSat 0x7FC0 | sign (ml_dtypes), kSatFinite 0x7FFF
// (CUDA's canonical bf16 NaN).
MX_HOST_DEVICE inline uint16_t encode_bf16(float x, Saturation sat = Saturation::kNoSat,
                                           bool stochastic = false, uint32_t rand = 0) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sat == Saturation::kSatFinite ? 0x7FFF : uint16_t(sign | 0x7FC0);
  if (sat == Saturation::kNoSat && !stochastic) {
    // RNE without saturation, the common case (every bf16 activation and GEMM operand), in
    // three integer operations: bf16 keeps fp32's exponent range, so rounding is adding half a
    // quantum less one, plus the kept part's lowest bit (ties to even), to the bits and
    // dropping the low 16. A carry moves into the exponent as rounding up should (into inf
    // past the largest bf16, as kNoSat overflows), never into the sign (a <= 0x7F800000).
    // Identical to the general path below for every float (test_formats.cpp: all 2^32).
    return uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
  if (a == 0x7F800000u)
    return uint16_t(sign | (sat == Saturation::kSatFinite ? 0x7F7F : 0x7F80));
  uint32_t mag = round_to_minifloat_code(a, 7, -126, stochastic, rand);
  if (mag > 0x7F7F) mag = sat == Saturation::kSatFinite ? 0x7F7F : 0x7F80;
  return uint16_t(sign | mag);
}

MX_HOST_DEVICE inline float decode_bf16(uint16_t code) { return bits_float(uint32_t(code) << 16); }
// x rounded to the nearest bf16 (RNE, no saturation) and widened back: a bf16 GEMM operand's
// value, as the recipe's emulation, the backends' round_bf16 and the op check form it.
MX_HOST_DEVICE inline float bf16_rounded(float x) {
  return decode_bf16(encode_bf16(x, Saturation::kNoSat));
}

// ---------------------------------------------------------------------------------------------
// Decoders of the sign-magnitude minifloats: exact (every code is an fp32 value).
MX_HOST_DEVICE inline float decode_minifloat(uint32_t mag, int man_bits, int bias) {
  const uint32_t exp_field = mag >> man_bits;
  const uint32_t man = mag & ((1u << man_bits) - 1);
  if (exp_field == 0) {  // subnormal: man * 2^(1 - bias - man_bits), exact in fp32
    return static_cast<float>(man) * bits_float(uint32_t(127 + 1 - bias - man_bits) << 23);
  }
  return bits_float(((exp_field - bias + 127) << 23) | (man << (23 - man_bits)));
}

MX_HOST_DEVICE inline float decode_e4m3(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80) << 24;
  const uint32_t mag = code & 0x7Fu;
  if (mag == 0x7F) return bits_float(sign | 0x7FC00000u);  // NaN keeps its sign (ml_dtypes)
  return bits_float(sign | float_bits(decode_minifloat(mag, 3, 7)));
}

MX_HOST_DEVICE inline float decode_e5m2(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80) << 24;
  const uint32_t mag = code & 0x7Fu;
  if (mag == 0x7C) return bits_float(sign | 0x7F800000u);
  if (mag > 0x7C) return bits_float(sign | 0x7FC00000u);
  return bits_float(sign | float_bits(decode_minifloat(mag, 2, 15)));
}

MX_HOST_DEVICE inline float decode_e2m1(uint8_t code) {  // low 4 bits
  const uint32_t sign = uint32_t(code & 0x8) << 28;
  return bits_float(sign | float_bits(decode_minifloat(code & 0x7u, 1, 1)));
}

// ---------------------------------------------------------------------------------------------
// UE4M3: the NVFP4 block-scale format, E4M3 restricted to non-negative values. Encode is
// E4M3 kSatFinite of a value >= 0; negative inputs clamp to 0; NaN -> 0x7F.
MX_HOST_DEVICE inline uint8_t encode_ue4m3(float x, bool stochastic = false, uint32_t rand = 0) {
  const uint32_t bits = float_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7F;
  if (bits >> 31) return 0;
  return encode_e4m3(x, Saturation::kSatFinite, stochastic, rand);
}

MX_HOST_DEVICE inline float decode_ue4m3(uint8_t code) { return decode_e4m3(code & 0x7F); }

// ---------------------------------------------------------------------------------------------
// E8M0: a power of two 2^(code - 127), code 0..254; 0xFF is NaN. No zero, no sign.
//   kNearest: the nearest power of two on the linear scale, ties (x = 1.5 * 2^e) up: ml_dtypes.
//   kUp:      the smallest power of two >= x (ceil(log2 x)), clamped to [2^-127, 2^127];
//             with kSatFinite this is Transformer Engine's float_to_e8m0 (cvt.rp.satfinite).
//   kDown:    the largest power of two <= x (floor(log2 x)), clamped the same way.
// Special inputs:
//   kNoSat (ml_dtypes): NaN, +-0, negatives, +inf and overflow (> 2^127 after rounding) -> 0xFF.
//   kSatFinite (TE):    NaN and negatives -> 0xFF, +0 -> 0x00, +inf and overflow -> 0xFE.
// fp32 subnormals: kNearest (as ml_dtypes) and kUp give 1 above 2^-127 and 0 up to it; kDown 0.
enum class E8M0Rounding : uint8_t { kNearest, kUp, kDown };

MX_HOST_DEVICE inline uint8_t encode_e8m0(float x, E8M0Rounding rounding = E8M0Rounding::kNearest,
                                          Saturation sat = Saturation::kNoSat) {
  const uint32_t bits = float_bits(x);
  const bool satfinite = sat == Saturation::kSatFinite;
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0xFF;       // NaN
  if (bits == 0) return satfinite ? 0x00 : 0xFF;               // +0
  if (bits >> 31) return 0xFF;                                 // negative, -0
  if (bits == 0x7F800000u) return satfinite ? 0xFE : 0xFF;     // +inf
  // x = 1.f * 2^fl with f in [0, 1): fl = floor(log2 x), exact from the bits.
  const int biased = static_cast<int>(bits >> 23);
  int fl;
  uint32_t frac;  // the 23 bits after the leading one
  if (biased) {
    fl = biased - 127;
    frac = bits & 0x7FFFFFu;
  } else {  // subnormal: leading one at bit p of the 23-bit field
    const uint32_t m = bits & 0x7FFFFFu;
    int p = 22;
    while (!(m >> p)) --p;
    fl = p - 149;
    frac = (m << (23 - p)) & 0x7FFFFFu;
  }
  int e = fl;
  if (rounding == E8M0Rounding::kNearest && frac >= 0x400000u) e = fl + 1;  // >= 1.5 * 2^fl
  // Below 2^-126 ml_dtypes rounds as if code 0 were a subnormal step: (2^-127, 2^-126) -> 1.
  if (rounding == E8M0Rounding::kNearest && !biased) e = bits > 0x00400000u ? -126 : -127;
  if (rounding == E8M0Rounding::kUp && frac != 0) e = fl + 1;
  int code = e + 127;
  if (code < 0) code = 0;
  if (code > 254) return satfinite ? 0xFE : 0xFF;
  return static_cast<uint8_t>(code);
}

MX_HOST_DEVICE inline float decode_e8m0(uint8_t code) {
  if (code == 0xFF) return bits_float(0x7FC00000u);
  if (code == 0) return bits_float(0x00400000u);  // 2^-127, an fp32 subnormal
  return bits_float(uint32_t(code) << 23);
}

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
// Random123 reference): a counter-based generator, so element i's random number depends only
// on (key, counter(i)), never on which thread computes it or in which order.
struct Philox4 {
  uint32_t v[4];
};

MX_HOST_DEVICE inline Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * ctr.v[0];
    const uint64_t p1 = uint64_t(kMul1) * ctr.v[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    Philox4 next;
    next.v[0] = hi1 ^ ctr.v[1] ^ key0;
    next.v[1] = lo1;
    next.v[2] = hi0 ^ ctr.v[3] ^ key1;
    next.v[3] = lo0;
    ctr = next;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return ctr;
}

// The random stream of one quantization: key = (seed, rank); counter = (element / 4 as 64
// bits, step, tensor_id); element i takes word i % 4 of its counter's output. So the bits of
// element i are a pure function of (seed, rank, step, tensor_id, i).
struct RandomStream {
  uint32_t seed = 0, step = 0, rank = 0, tensor_id = 0;

  MX_HOST_DEVICE Philox4 block(uint64_t group) const {
    Philox4 c{{uint32_t(group), uint32_t(group >> 32), step, tensor_id}};
    return philox4x32_10(c, seed, rank);
  }
  MX_HOST_DEVICE uint32_t bits(uint64_t element) const {
    return block(element >> 2).v[element & 3];
  }
};

}  // namespace mx::numerics
