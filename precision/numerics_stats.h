// Numerics telemetry of the quantized GEMM operands (`precision.stats_every`): per operand, the
// amax, the share of values saturated (clamped at the format's largest finite value), the share
// flushed to zero and the signal-to-quantization-noise ratio, plus the rule that warns when an
// operand's SQNR collapses. Definitions and the reasons for the thresholds: docs/numerics.md.
#pragma once
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "numerics/formats.h"

namespace mx {

// Sums over the elements of one operand (over every quantization of it in one step: several
// micro-batches, a recomputed forward); merge() adds two of them.
struct OperandStats {
  const char* format = "";  // element format: bf16, e4m3, e5m2, e2m1
  double amax = 0;          // max |x| over the finite elements
  int64_t numel = 0;
  int64_t saturated = 0;    // |x * m| >= saturation_threshold(format) (m: the element's encode
                            // multiplier), or x = +-inf
  int64_t flushed = 0;      // x != 0 and dequant(q(x)) == 0
  double signal = 0;        // sum x^2 over the finite elements
  double noise = 0;         // sum (x - dequant(q(x)))^2 over the finite elements

  void merge(const OperandStats& o);
  double saturated_share() const { return numel ? double(saturated) / double(numel) : 0.0; }
  double flushed_share() const { return numel ? double(flushed) / double(numel) : 0.0; }
  // 10 log10(signal / noise); +inf when the quantization was exact, NaN when the signal is 0.
  double sqnr_db() const;
  nlohmann::json to_json() const;  // sqnr_db is null when not finite
};

// The smallest scaled magnitude that the SATFINITE clamp changes: where round-to-nearest-even
// without a maximum would round past the largest finite value (max + half its last ulp; a tie
// there rounds up unless max's mantissa is even). E4M3 the float after 464 (464 rounds to even
// 448), E5M2 61440, E2M1 7, BF16 (2 - 2^-8) * 2^127.
float saturation_threshold(numerics::Format fmt);
const char* format_name(numerics::Format fmt);

// Accumulates the stats of x[rows, cols] against its dequantized copy d. mult(r, c) is the
// fp32 multiplier the quantizer applied to x[r, c] before rounding (1 for bf16).
template <typename Mult>
void accumulate_stats(OperandStats& s, const float* x, const float* d, int64_t rows,
                      int64_t cols, numerics::Format fmt, Mult mult) {
  const float threshold = saturation_threshold(fmt);
  double amax = s.amax, signal = 0, noise = 0;
  int64_t saturated = 0, flushed = 0;
#pragma omp parallel for schedule(static) reduction(max : amax) \
    reduction(+ : signal, noise, saturated, flushed) if (rows * cols > (1 << 15))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[r * cols + c], q = d[r * cols + c];
      if (std::isinf(v)) {
        ++saturated;
        continue;
      }
      if (std::isnan(v)) continue;
      const double e = double(v) - double(q);
      amax = std::fmax(amax, double(std::fabs(v)));
      signal += double(v) * double(v);
      noise += e * e;
      if (std::fabs(v * mult(r, c)) >= threshold) ++saturated;
      if (v != 0.0f && q == 0.0f) ++flushed;
    }
  s.format = format_name(fmt);
  s.amax = amax;
  s.numel += rows * cols;
  s.saturated += saturated;
  s.flushed += flushed;
  s.signal += signal;
  s.noise += noise;
}

// The collapse rule. An operand's SQNR has collapsed when it is below the absolute floor of its
// format (the SQNR of well-scaled Gaussian data minus 15 dB: bf16 40, e4m3 16, e5m2 10, e2m1 5)
// or more than `drop_db` (10) below the median of that operand's previous (up to 16) values,
// once it has 3. NaN SQNR (an all-zero operand) is never a collapse; +inf (exact) neither.
class SqnrMonitor {
 public:
  static double floor_db(const std::string& format);
  // Records one value; returns a non-empty reason ("below the e4m3 floor of 16 dB",
  // "12.3 dB below its running median 31.0 dB") when it is a collapse.
  std::string check(const std::string& name, const std::string& format, double sqnr_db);

  static constexpr double kDropDb = 10.0;
  static constexpr size_t kHistory = 16;
  static constexpr size_t kMinHistory = 3;

 private:
  std::map<std::string, std::deque<double>> history_;
};

// "layers.3.mlp.down_proj.wgrad.grad_output": the Linear (0..6 = q, k, v, o, gate, up, down),
// the GEMM (fwd, dgrad, wgrad) and its operand.
std::string operand_name(int64_t layer, int linear, int op);

}  // namespace mx
