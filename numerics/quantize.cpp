// Quantizers: the block bookkeeping around the codecs of numerics/formats.h.
#include "numerics/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "core/error.h"

namespace mx::numerics {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Loops parallelize above this many elements (below it an OpenMP fork costs more than it saves).
constexpr int64_t kParallelMin = int64_t(1) << 15;

void check_shape(int64_t rows, int64_t cols) {
  MX_REQUIRE(rows >= 0 && cols >= 0, "quantize: negative shape [", rows, ", ", cols, "]");
}

void check_fp8_format(Format fmt) {
  MX_REQUIRE(fmt == Format::kE4M3 || fmt == Format::kE5M2,
             "FP8 quantizers take E4M3 or E5M2 elements");
}

// Decoding is exact, so a table of every code's value gives the same bits as the decoders.
struct DecodeTables {
  float e4m3[256], e5m2[256], e2m1[16];
  DecodeTables() {
    for (int c = 0; c < 256; ++c) {
      e4m3[c] = decode_e4m3(uint8_t(c));
      e5m2[c] = decode_e5m2(uint8_t(c));
    }
    for (int c = 0; c < 16; ++c) e2m1[c] = decode_e2m1(uint8_t(c));
  }
};
const DecodeTables& tables() {
  static const DecodeTables t;
  return t;
}

// The element codec of one quantizer, specialized on the format and the rounding mode so the
// inner loops carry no per-element branches on either.
template <Format F, bool SR>
struct Elem {
  const float* lut;
  explicit Elem(const DecodeTables& t)
      : lut(F == Format::kE4M3 ? t.e4m3 : F == Format::kE5M2 ? t.e5m2 : t.e2m1) {}
  static uint8_t encode(float v, uint32_t rand) {
    if constexpr (F == Format::kE4M3) return encode_e4m3(v, Saturation::kSatFinite, SR, rand);
    else if constexpr (F == Format::kE5M2) return encode_e5m2(v, Saturation::kSatFinite, SR, rand);
    else return encode_e2m1(v, Saturation::kSatFinite, SR, rand);
  }
  float decode(uint8_t code) const { return lut[code]; }
};

// Element i's random bits, rng.bits(i), computing each Philox block once for runs of
// consecutive indices (one block serves four elements).
struct RandCache {
  const RandomStream* rng;
  uint64_t group = ~uint64_t(0);
  Philox4 p{};
  uint32_t bits(uint64_t i) {
    if ((i >> 2) != group) {
      group = i >> 2;
      p = rng->block(group);
    }
    return p.v[i & 3];
  }
};

// The NaN-skipping amax fold of amax_fold (fmaxf(m, |x|) with m never NaN) without the libm
// call: a NaN |x| compares false and leaves m.
inline float fold(float m, float x) {
  const float a = std::fabs(x);
  return a > m ? a : m;
}

// decode(encode(v)) of format F, round-to-nearest-even with SATFINITE, as fp32 arithmetic on
// the value instead of a code: branch-free, so the compiler vectorizes the loops around it. Bit
// for bit the decoders' result (tests/cpp/numerics/test_quantize.cpp compares the two):
//   |v| >= max (and inf) -> max: every value past max rounds to max or beyond it, and
//     SATFINITE clamps those to max;
//   normal range: RNE of the fp32 mantissa to M bits on the bits (a carry moves the exponent);
//   below the smallest normal 2^emin: RNE to the subnormal quantum 2^(emin - M), done by the
//     fp32 adder: |v| + 2^(emin + 23 - M) has exactly that quantum as its ulp;
//   the sign is put back (so -0 stays -0); NaN gives what its code decodes to: +qNaN
//     0x7FC00000 for the FP8 formats, +6 for E2M1 (which has no NaN).
template <Format F>
__attribute__((always_inline)) inline float fake_rne(float v) {
  constexpr int kMan = F == Format::kE4M3 ? 3 : F == Format::kE5M2 ? 2 : 1;
  constexpr float kMax = F == Format::kE4M3 ? kE4M3Max : F == Format::kE5M2 ? kE5M2Max : kE2M1Max;
  constexpr float kMinNormal = F == Format::kE4M3 ? 0x1p-6f : F == Format::kE5M2 ? 0x1p-14f : 1.0f;
  constexpr float kMagic = kMinNormal * float(1u << (23 - kMan));
  constexpr int kShift = 23 - kMan;
  // Integer compares on the magnitude bits (which order like the values, NaN above inf) keep the
  // loop free of float compares, which the vectorizer would not if-convert.
  const uint32_t bits = float_bits(v);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t mag = bits & 0x7FFFFFFFu;
  const bool nan = mag > 0x7F800000u;
  const uint32_t ab = mag < float_bits(kMax) ? mag : float_bits(kMax);
  const uint32_t nb =
      (ab + ((1u << (kShift - 1)) - 1u) + ((ab >> kShift) & 1u)) & ~((1u << kShift) - 1u);
  const float sub = (bits_float(ab) + kMagic) - kMagic;
  // selects as masks: the vectorizer does not if-convert ?: between bit-cast values
  const uint32_t sub_mask = 0u - uint32_t(ab < float_bits(kMinNormal));
  const uint32_t rb = ((sub_mask & float_bits(sub)) | (~sub_mask & nb)) | sign;
  // E2M1 has no NaN: SATFINITE encodes NaN as +6 (formats.h)
  constexpr uint32_t kNanValue = F == Format::kE2M1 ? 0x40C00000u : 0x7FC00000u;
  const uint32_t nan_mask = 0u - uint32_t(nan);
  return bits_float((nan_mask & kNanValue) | (~nan_mask & rb));
}

// The 8-lane NaN-skipping amax of n contiguous values, starting from m (exact: max is
// order-free, so the lanes give the same value as a sequential fold).
inline float amax_run(float m, const float* x, int64_t n) {
  float lane[8] = {m, m, m, m, m, m, m, m};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] = fold(lane[j], x[i + j]);
  for (; i < n; ++i) lane[0] = fold(lane[0], x[i]);
  for (int j = 1; j < 8; ++j) lane[0] = lane[j] > lane[0] ? lane[j] : lane[0];
  return lane[0];
}

// Calls f(Format, stochastic) as a compile-time pair.
template <class F>
void dispatch(Format fmt, bool sr, F&& f) {
  auto go = [&](auto fc) {
    if (sr) f(fc, std::true_type{});
    else f(fc, std::false_type{});
  };
  switch (fmt) {
    case Format::kE4M3: go(std::integral_constant<Format, Format::kE4M3>{}); break;
    case Format::kE5M2: go(std::integral_constant<Format, Format::kE5M2>{}); break;
    case Format::kE2M1: go(std::integral_constant<Format, Format::kE2M1>{}); break;
    default: MX_REQUIRE(false, "quantize: unsupported element format");
  }
}

// The blocked quantizers (FP8 block, MXFP8, NVFP4) share one loop nest. Blocks are br x bc;
// one task is a row of blocks (br rows) across a chunk of columns of about 64 elements, so a
// 1x32 block walks contiguous memory and a 32x1 block's column stays in L1 across the task.
// Per task: every block's amax, then its scale (scale_of(amax, block index) -> {encode
// multiplier, decode scale}, storing the scale byte or float), then the elements row by row.
// Element (r, c) writes dequant[r * cols + c] and, when codes is set, its code through
// put_code(r, c, code); its random bits are rng.bits(index(r, c)).
struct BlockScale {
  float multiplier, decode;
};

template <Format F, bool SR, class ScaleOf, class PutCode, class Index>
void blocked_kernel(const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                    float* dequant, ScaleOf scale_of, PutCode put_code, bool write_codes,
                    Index index, const RoundingOptions& ro) {
  const Elem<F, SR> elem(tables());
  const int64_t srows = ceil_div(rows, br), scols = ceil_div(cols, bc);
  constexpr int64_t kChunk = 64;
  const int64_t per_task = bc >= kChunk ? 1 : kChunk / bc;  // column blocks per task (<= 64)
  const int64_t chunks = ceil_div(scols, per_task);
  const int64_t tasks = srows * chunks;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t rb = t / chunks, b0 = (t % chunks) * per_task;
    const int64_t b1 = std::min(scols, b0 + per_task);
    const int64_t r0 = rb * br, r1 = std::min(rows, r0 + br);
    float amax[kChunk];
    BlockScale bs[kChunk];
    for (int64_t b = b0; b < b1; ++b) amax[b - b0] = 0.0f;
    if (bc == 1) {  // column blocks: one amax per column, contiguous along the row
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * cols + b0;
        for (int64_t j = 0; j < b1 - b0; ++j) amax[j] = fold(amax[j], xr[j]);
      }
    } else {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * cols;
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t c0 = b * bc, c1 = std::min(cols, c0 + bc);
          amax[b - b0] = amax_run(amax[b - b0], xr + c0, c1 - c0);
        }
      }
    }
    for (int64_t b = b0; b < b1; ++b) bs[b - b0] = scale_of(amax[b - b0], rb * scols + b);
    if constexpr (!SR) {
      if (!write_codes) {  // the training path: values only, vectorized
        if (bc == 1) {
          float mult[kChunk], dec[kChunk];
          for (int64_t j = 0; j < b1 - b0; ++j) mult[j] = bs[j].multiplier, dec[j] = bs[j].decode;
          for (int64_t r = r0; r < r1; ++r) {
            const float* xr = x + r * cols + b0;
            float* dr = dequant + r * cols + b0;
            for (int64_t j = 0; j < b1 - b0; ++j) dr[j] = fake_rne<F>(xr[j] * mult[j]) * dec[j];
          }
        } else {
          for (int64_t r = r0; r < r1; ++r) {
            const float* xr = x + r * cols;
            float* dr = dequant + r * cols;
            for (int64_t b = b0; b < b1; ++b) {
              const int64_t c0 = b * bc, c1 = std::min(cols, c0 + bc);
              const float mult = bs[b - b0].multiplier, dec = bs[b - b0].decode;
              for (int64_t c = c0; c < c1; ++c) dr[c] = fake_rne<F>(xr[c] * mult) * dec;
            }
          }
        }
        continue;
      }
    }
    RandCache rc{&ro.rng};
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      float* dr = dequant + r * cols;
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t c0 = b * bc, c1 = std::min(cols, c0 + bc);
        const float mult = bs[b - b0].multiplier, dec = bs[b - b0].decode;
        for (int64_t c = c0; c < c1; ++c) {
          const uint32_t rand = SR ? rc.bits(uint64_t(index(r, c))) : 0u;
          const uint8_t code = elem.encode(xr[c] * mult, rand);
          if (write_codes) put_code(r, c, code);
          dr[c] = elem.decode(code) * dec;
        }
      }
    }
  }
}

void init_result(Quantized& q, int64_t rows, int64_t cols, int64_t code_cols) {
  q.rows = rows;
  q.cols = cols;
  q.code_cols = code_cols;
  q.codes.assign(size_t(rows * code_cols), 0);
  q.dequant.resize(size_t(rows * cols));
}

}  // namespace

float rne_satfinite_value(float v, Format fmt) {
  switch (fmt) {
    case Format::kE4M3: return fake_rne<Format::kE4M3>(v);
    case Format::kE5M2: return fake_rne<Format::kE5M2>(v);
    case Format::kE2M1: return fake_rne<Format::kE2M1>(v);
    default: MX_REQUIRE(false, "rne_satfinite_value: E4M3, E5M2 or E2M1");
  }
  return 0.0f;
}

float abs_max(const float* x, int64_t n) {
  // max is exact and order-free, so threads give the same bits; NaN is skipped in each part.
  float m = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) m = fold(m, x[i]);
  return m;
}

float fp8_max(Format fmt) {
  check_fp8_format(fmt);
  return fmt == Format::kE5M2 ? kE5M2Max : kE4M3Max;
}

void quantize_fp8_tensor_into(const float* x, int64_t rows, int64_t cols, Format fmt,
                              float scale, const QuantizeInto& out, const RoundingOptions& ro) {
  check_shape(rows, cols);
  check_fp8_format(fmt);
  const float scale_inv = 1.0f / scale;
  if (out.scales_f32) out.scales_f32[0] = scale_inv;
  const int64_t n = rows * cols;
  float* dq = out.dequant;
  uint8_t* codes = out.codes;
  dispatch(fmt, ro.stochastic, [&](auto fc, auto sc) {
    constexpr Format F = decltype(fc)::value;
    constexpr bool SR = decltype(sc)::value;
    const Elem<F, SR> elem(tables());
    // chunks of 4096 (a multiple of 4: one Philox block never straddles two threads' chunks)
    constexpr int64_t kChunk = 4096;
    const int64_t chunks = ceil_div(n, kChunk);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      if constexpr (!SR) {
        if (!codes) {  // the training path: values only, vectorized
          const int64_t j1 = std::min(n, (ch + 1) * kChunk);
          for (int64_t i = ch * kChunk; i < j1; ++i) dq[i] = fake_rne<F>(x[i] * scale) * scale_inv;
          continue;
        }
      }
      RandCache rc{&ro.rng};
      const int64_t i1 = std::min(n, (ch + 1) * kChunk);
      for (int64_t i = ch * kChunk; i < i1; ++i) {
        const uint32_t rand = SR ? rc.bits(uint64_t(i)) : 0u;
        const uint8_t code = elem.encode(x[i] * scale, rand);
        if (codes) codes[i] = code;
        dq[i] = elem.decode(code) * scale_inv;
      }
    }
  });
}

Quantized quantize_fp8_tensor(const float* x, int64_t rows, int64_t cols, Format fmt,
                              float scale, const RoundingOptions& ro) {
  check_shape(rows, cols);
  check_fp8_format(fmt);
  Quantized q;
  init_result(q, rows, cols, cols);
  q.scales_f32 = {0.0f};
  q.scale_rows = q.scale_cols = 1;
  quantize_fp8_tensor_into(x, rows, cols, fmt, scale,
                           QuantizeInto{q.dequant.data(), q.codes.data(), q.scales_f32.data()}, ro);
  return q;
}

Quantized quantize_fp8_current(const float* x, int64_t rows, int64_t cols, Format fmt,
                               float margin, const RoundingOptions& ro) {
  check_shape(rows, cols);
  const float scale = fp8_scale_from_amax(abs_max(x, rows * cols), fp8_max(fmt), margin);
  return quantize_fp8_tensor(x, rows, cols, fmt, scale, ro);
}

DelayedScaling::DelayedScaling(Format fmt, int history_len, AmaxAlgo algo, float margin)
    : fmt_(fmt), algo_(algo), margin_(margin) {
  check_fp8_format(fmt);
  MX_REQUIRE(history_len >= 1, "amax history length must be at least 1, got ", history_len);
  amax_history_.assign(size_t(history_len), 0.0f);
}

void DelayedScaling::record(float amax) {
  for (size_t i = amax_history_.size() - 1; i > 0; --i) amax_history_[i] = amax_history_[i - 1];
  amax_history_[0] = amax;
  float reduced = amax_history_[0];
  if (algo_ == AmaxAlgo::kMax)
    for (float a : amax_history_) reduced = std::fmax(reduced, a);
  if (reduced > 0.0f && std::isfinite(reduced))
    scale_ = fp8_scale_from_amax(reduced, fp8_max(fmt_), margin_);
}

void DelayedScaling::restore(const std::vector<float>& history, float scale) {
  MX_REQUIRE(history.size() == amax_history_.size(), "amax history of length ", history.size(),
             " does not fit a history of length ", amax_history_.size());
  MX_REQUIRE(std::isfinite(scale) && scale > 0.0f, "saved FP8 scale ", scale,
             " is not a positive finite number");
  amax_history_ = history;
  scale_ = scale;
}

Quantized DelayedScaling::quantize(const float* x, int64_t rows, int64_t cols,
                                   const RoundingOptions& ro) {
  const float amax = abs_max(x, rows * cols);
  Quantized q = quantize_fp8_tensor(x, rows, cols, fmt_, scale_, ro);
  record(amax);
  return q;
}

void quantize_fp8_block_into(const float* x, int64_t rows, int64_t cols, int block_rows,
                             int block_cols, bool pow2_scales, const QuantizeInto& out,
                             const RoundingOptions& ro) {
  check_shape(rows, cols);
  MX_REQUIRE(block_rows >= 1 && block_cols >= 1, "block shape must be positive");
  float* scales = out.scales_f32;
  uint8_t* codes = out.codes;
  auto scale_of = [scales, pow2_scales](float amax, int64_t b) {
    const float scale = fp8_scale_from_amax(amax, kE4M3Max, 0.0f, pow2_scales);
    const float scale_inv = 1.0f / scale;
    if (scales) scales[b] = scale_inv;
    return BlockScale{scale, scale_inv};
  };
  auto put = [codes, cols](int64_t r, int64_t c, uint8_t code) { codes[r * cols + c] = code; };
  auto index = [cols](int64_t r, int64_t c) { return r * cols + c; };
  dispatch(Format::kE4M3, ro.stochastic, [&](auto, auto sc) {
    blocked_kernel<Format::kE4M3, decltype(sc)::value>(x, rows, cols, block_rows, block_cols,
                                                       out.dequant, scale_of, put,
                                                       codes != nullptr, index, ro);
  });
}

Quantized quantize_fp8_block(const float* x, int64_t rows, int64_t cols, int block_rows,
                             int block_cols, bool pow2_scales, const RoundingOptions& ro) {
  check_shape(rows, cols);
  MX_REQUIRE(block_rows >= 1 && block_cols >= 1, "block shape must be positive");
  Quantized q;
  init_result(q, rows, cols, cols);
  q.scale_rows = ceil_div(rows, block_rows);
  q.scale_cols = ceil_div(cols, block_cols);
  q.scales_f32.assign(size_t(q.scale_rows * q.scale_cols), 0.0f);
  quantize_fp8_block_into(x, rows, cols, block_rows, block_cols, pow2_scales,
                          QuantizeInto{q.dequant.data(), q.codes.data(), q.scales_f32.data()},
                          ro);
  return q;
}

void quantize_mxfp8_into(const float* x, int64_t rows, int64_t cols, bool columnwise,
                         Format elem, MxScaleRule rule, const QuantizeInto& out,
                         const RoundingOptions& ro) {
  check_shape(rows, cols);
  check_fp8_format(elem);
  constexpr int64_t kBlock = 32;
  uint8_t* scales = out.scales_u8;
  uint8_t* codes = out.codes;
  // Block index b of the kernel is (row block) * ceil(cols / bc) + column block: for 1x32 that
  // is r * ceil(cols / 32) + c / 32 and for 32x1 (r / 32) * cols + c, Quantized's layouts.
  auto scale_of = [scales, elem, rule](float amax, int64_t b) {
    const Mxfp8BlockScale s = mxfp8_block_scale(amax, elem, rule);
    if (scales) scales[b] = s.code;
    return BlockScale{s.encode_multiplier, s.decode_scale};
  };
  auto put = [codes, cols](int64_t r, int64_t c, uint8_t code) { codes[r * cols + c] = code; };
  auto index = [cols](int64_t r, int64_t c) { return r * cols + c; };
  dispatch(elem, ro.stochastic, [&](auto fc, auto sc) {
    blocked_kernel<decltype(fc)::value, decltype(sc)::value>(
        x, rows, cols, columnwise ? kBlock : 1, columnwise ? 1 : kBlock, out.dequant, scale_of,
        put, codes != nullptr, index, ro);
  });
}

Quantized quantize_mxfp8(const float* x, int64_t rows, int64_t cols, bool columnwise,
                         Format elem, MxScaleRule rule, const RoundingOptions& ro) {
  check_shape(rows, cols);
  check_fp8_format(elem);
  constexpr int kBlock = 32;
  Quantized q;
  init_result(q, rows, cols, cols);
  q.scale_rows = columnwise ? ceil_div(rows, kBlock) : rows;
  q.scale_cols = columnwise ? cols : ceil_div(cols, kBlock);
  q.scales_u8.assign(size_t(q.scale_rows * q.scale_cols), 0);
  quantize_mxfp8_into(x, rows, cols, columnwise, elem, rule,
                      QuantizeInto{q.dequant.data(), q.codes.data(), nullptr, q.scales_u8.data()},
                      ro);
  return q;
}

float quantize_nvfp4_into(const float* x, int64_t rows, int64_t cols, bool blocks_2d,
                          bool columnwise, const QuantizeInto& out, const RoundingOptions& ro) {
  check_shape(rows, cols);
  MX_REQUIRE(!(columnwise && (blocks_2d || out.codes)),
             "quantize_nvfp4_into: column blocks are 1-D and write no codes");
  constexpr int64_t kBlock = 16;
  const float s_enc = nvfp4_global_encode_scale(abs_max(x, rows * cols));
  uint8_t* scales = out.scales_u8;
  uint8_t* codes = out.codes;
  const int64_t code_cols = ceil_div(cols, 2);
  auto scale_of = [scales, s_enc](float amax, int64_t b) {
    const Nvfp4BlockScale s = nvfp4_block_scale(amax, s_enc);
    if (scales) scales[b] = s.code;
    return BlockScale{s.encode_multiplier, s.decode_scale};
  };
  // Columns 2j and 2j+1 share a byte and a block (16 is even), and one task writes a block's
  // elements in column order: the even column sets the byte, the odd one adds its nibble.
  auto put = [codes, code_cols](int64_t r, int64_t c, uint8_t code) {
    uint8_t& byte = codes[r * code_cols + c / 2];
    byte = (c & 1) ? uint8_t(byte | (code << 4)) : code;
  };
  const int64_t br = columnwise ? kBlock : blocks_2d ? kBlock : 1;
  const int64_t bc = columnwise ? 1 : kBlock;
  dispatch(Format::kE2M1, ro.stochastic, [&](auto, auto sc) {
    constexpr bool SR = decltype(sc)::value;
    if (columnwise) {
      auto index = [rows](int64_t r, int64_t c) { return c * rows + r; };
      blocked_kernel<Format::kE2M1, SR>(x, rows, cols, br, bc, out.dequant, scale_of, put, false,
                                        index, ro);
    } else {
      auto index = [cols](int64_t r, int64_t c) { return r * cols + c; };
      blocked_kernel<Format::kE2M1, SR>(x, rows, cols, br, bc, out.dequant, scale_of, put,
                                        codes != nullptr, index, ro);
    }
  });
  return s_enc;
}

Quantized quantize_nvfp4(const float* x, int64_t rows, int64_t cols, bool blocks_2d,
                         const RoundingOptions& ro) {
  check_shape(rows, cols);
  constexpr int kBlock = 16;
  Quantized q;
  init_result(q, rows, cols, ceil_div(cols, 2));
  const int block_rows = blocks_2d ? kBlock : 1;
  q.scale_rows = ceil_div(rows, block_rows);
  q.scale_cols = ceil_div(cols, kBlock);
  q.scales_u8.assign(size_t(q.scale_rows * q.scale_cols), 0);
  q.global_scale = quantize_nvfp4_into(
      x, rows, cols, blocks_2d, false,
      QuantizeInto{q.dequant.data(), q.codes.data(), nullptr, q.scales_u8.data()}, ro);
  return q;
}

void rht16_signs(uint32_t seed, float signs[16]) {
  const uint32_t word = philox4x32_10(Philox4{{0, 0, 0, 0}}, seed, 0x52485431u).v[0];
  for (int j = 0; j < 16; ++j) signs[j] = ((word >> j) & 1u) ? -1.0f : 1.0f;
}

namespace {

float hadamard16(int i, int j) { return (__builtin_popcount(unsigned(i & j)) & 1) ? -1.0f : 1.0f; }

struct Hadamard16 {
  float h[16][16];  // h[j][i] = H16[i][j] (symmetric anyway)
  Hadamard16() {
    for (int j = 0; j < 16; ++j)
      for (int i = 0; i < 16; ++i) h[j][i] = hadamard16(i, j);
  }
};

void rht16_apply(float* x, int64_t rows, int64_t cols, uint32_t seed, bool inverse) {
  MX_REQUIRE(rows >= 0 && cols >= 0 && cols % 16 == 0,
             "the 16-point Hadamard transform needs cols a multiple of 16, got ", cols);
  float s[16];
  rht16_signs(seed, s);
  static const Hadamard16 table;
  const int64_t groups = rows * (cols / 16);
#pragma omp parallel for schedule(static) if (groups > 4096)
  for (int64_t g = 0; g < groups; ++g) {
    float* v = x + g * 16;
    float in[16], acc[16];
    for (int j = 0; j < 16; ++j) in[j] = inverse ? v[j] : s[j] * v[j];
    // out_i = (sum over j = 0..15 in order of H[i][j] * in[j]) / 4; the 16 sums run side by side
    // (each in the same j order, so the bits are those of one sum at a time)
    for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
    for (int j = 0; j < 16; ++j)
      for (int i = 0; i < 16; ++i) acc[i] += table.h[j][i] * in[j];
    // forward: y = H D x / 4; inverse: x = D H y / 4 (H symmetric, H H = 16 I, D D = I).
    for (int i = 0; i < 16; ++i) v[i] = inverse ? s[i] * (0.25f * acc[i]) : 0.25f * acc[i];
  }
}

}  // namespace

void rht16_forward(float* x, int64_t rows, int64_t cols, uint32_t seed) {
  rht16_apply(x, rows, cols, seed, false);
}

void rht16_inverse(float* x, int64_t rows, int64_t cols, uint32_t seed) {
  rht16_apply(x, rows, cols, seed, true);
}

}  // namespace mx::numerics
