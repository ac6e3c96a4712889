#include "precision/numerics_stats.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace mx {

using numerics::Format;

void OperandStats::merge(const OperandStats& o) {
  if (o.numel == 0) return;
  format = o.format;
  amax = std::max(amax, o.amax);
  numel += o.numel;
  saturated += o.saturated;
  flushed += o.flushed;
  signal += o.signal;
  noise += o.noise;
}

double OperandStats::sqnr_db() const {
  if (!(signal > 0)) return NAN;
  if (noise == 0) return INFINITY;
  return 10.0 * std::log10(signal / noise);
}

nlohmann::json OperandStats::to_json() const {
  const double s = sqnr_db();
  nlohmann::json j = {{"format", format},
                      {"amax", amax},
                      {"saturated", saturated_share()},
                      {"flushed", flushed_share()},
                      {"numel", numel}};
  j["sqnr_db"] = std::isfinite(s) ? nlohmann::json(s) : nlohmann::json(nullptr);
  return j;
}

float saturation_threshold(Format fmt) {
  switch (fmt) {
    // 464 itself is a tie that rounds to even 448: the first clamped value is the next float.
    case Format::kE4M3: return std::nextafter(464.0f, INFINITY);
    case Format::kE5M2: return 61440.0f;  // 57344 + 8192 / 2
    case Format::kE2M1: return 7.0f;      // 6 + 2 / 2
    case Format::kBF16: return numerics::bits_float(0x7F7F8000u);  // (2 - 2^-8) * 2^127
    default: break;
  }
  MX_ASSERT(false, "numerics stats: no saturation threshold for format ", int(fmt));
  return 0.0f;
}

const char* format_name(Format fmt) {
  switch (fmt) {
    case Format::kE4M3: return "e4m3";
    case Format::kE5M2: return "e5m2";
    case Format::kE2M1: return "e2m1";
    case Format::kBF16: return "bf16";
    default: return "?";
  }
}

double SqnrMonitor::floor_db(const std::string& format) {
  if (format == "bf16") return 40.0;
  if (format == "e4m3") return 16.0;
  if (format == "e5m2") return 10.0;
  if (format == "e2m1") return 5.0;
  return 0.0;
}

std::string SqnrMonitor::check(const std::string& name, const std::string& format,
                               double sqnr_db) {
  if (std::isnan(sqnr_db)) return "";
  auto& h = history_[name];
  std::string reason;
  char buf[160];
  if (sqnr_db < floor_db(format)) {
    std::snprintf(buf, sizeof buf, "below the %s floor of %.0f dB", format.c_str(),
                  floor_db(format));
    reason = buf;
  } else if (h.size() >= kMinHistory && std::isfinite(sqnr_db)) {
    std::vector<double> v(h.begin(), h.end());
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    const double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    if (sqnr_db < median - kDropDb) {
      std::snprintf(buf, sizeof buf, "%.1f dB below its running median %.1f dB",
                    median - sqnr_db, median);
      reason = buf;
    }
  }
  h.push_back(sqnr_db);
  if (h.size() > kHistory) h.pop_front();
  return reason;
}

std::string operand_name(int64_t layer, int linear, int op) {
  static const char* const kLinears[] = {"self_attn.q_proj", "self_attn.k_proj",
                                         "self_attn.v_proj", "self_attn.o_proj",
                                         "mlp.gate_proj",    "mlp.up_proj",
                                         "mlp.down_proj"};
  // LinearOperand order: kFwdInput, kFwdWeight, kDgradGrad, kDgradWeight, kWgradGrad, kWgradInput
  static const char* const kOperands[] = {"fwd.input",         "fwd.weight",
                                          "dgrad.grad_output", "dgrad.weight",
                                          "wgrad.grad_output", "wgrad.input"};
  const char* lin = linear >= 0 && linear < 7 ? kLinears[linear] : "linear?";
  const char* opn = op >= 0 && op < 6 ? kOperands[op] : "operand?";
  return str("layers.", layer, ".", lin, ".", opn);
}

}  // namespace mx
