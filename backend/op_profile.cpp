#include "backend/op_profile.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace mx {

void OpProfile::charge(Clock::time_point now, double flops_now) {
  if (!stack_.empty()) {
    Row& r = rows_[stack_.back()];
    r.seconds += std::chrono::duration<double>(now - mark_).count();
    r.flops += flops_now - flops_mark_;
  }
  mark_ = now;
  flops_mark_ = flops_now;
}

void OpProfile::begin(const char* op, double flops_now) {
  charge(Clock::now(), flops_now);  // the caller's time so far is the caller's
  stack_.emplace_back(op);
  Row& r = rows_[stack_.back()];
  r.op = stack_.back();
  ++r.calls;
}

void OpProfile::end(double flops_now) {
  if (stack_.empty()) return;  // begun before profiling was on (called from destructors)
  charge(Clock::now(), flops_now);
  stack_.pop_back();
}

void OpProfile::add(const std::string& op, double seconds, double flops) {
  Row& r = rows_[op];
  r.op = op;
  ++r.calls;
  r.seconds += seconds;
  r.flops += flops;
}

std::vector<OpProfile::Row> OpProfile::rows() const {
  std::vector<Row> out;
  for (const auto& [name, r] : rows_) out.push_back(r);
  std::stable_sort(out.begin(), out.end(),
                   [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
  return out;
}

void OpProfile::clear() {
  rows_.clear();  // ops still running keep running: their time from now on counts
  for (const std::string& op : stack_) rows_[op].op = op;
  mark_ = Clock::now();
}

namespace {
double share(double seconds, double wall) { return wall > 0 ? seconds / wall : 0.0; }
double gflops(const OpProfile::Row& r) { return r.seconds > 0 ? r.flops / r.seconds / 1e9 : 0.0; }
}  // namespace

std::string format_op_profile(const std::vector<OpProfile::Row>& rows, double wall_seconds,
                              size_t top) {
  std::string out;
  char line[200];
  std::snprintf(line, sizeof line, "  %-36s %8s %10s %7s %10s\n", "op", "calls", "seconds",
                "share", "GFLOP/s");
  out += line;
  double in_ops = 0, rest = 0;
  int64_t rest_calls = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const OpProfile::Row& r = rows[i];
    in_ops += r.seconds;
    if (i >= top) {
      rest += r.seconds;
      rest_calls += r.calls;
      continue;
    }
    char rate[16] = "";
    if (r.flops > 0) std::snprintf(rate, sizeof rate, "%.1f", gflops(r));
    std::snprintf(line, sizeof line, "  %-36s %8lld %10.4f %6.1f%% %10s\n", r.op.c_str(),
                  static_cast<long long>(r.calls), r.seconds,
                  100 * share(r.seconds, wall_seconds), rate);
    out += line;
  }
  if (rows.size() > top) {
    const std::string others = str("(", rows.size() - top, " other ops)");
    std::snprintf(line, sizeof line, "  %-36s %8lld %10.4f %6.1f%%\n", others.c_str(),
                  static_cast<long long>(rest_calls), rest, 100 * share(rest, wall_seconds));
    out += line;
  }
  const double outside = std::max(0.0, wall_seconds - in_ops);
  std::snprintf(line, sizeof line, "  %-36s %8s %10.4f %6.1f%%\n", "(outside backend ops)", "",
                outside, 100 * share(outside, wall_seconds));
  out += line;
  return out;
}

nlohmann::json op_profile_json(const std::vector<OpProfile::Row>& rows, double wall_seconds) {
  nlohmann::json out = nlohmann::json::array();
  for (const OpProfile::Row& r : rows)
    out.push_back({{"op", r.op},
                   {"calls", r.calls},
                   {"seconds", r.seconds},
                   {"share", share(r.seconds, wall_seconds)},
                   {"gflops", gflops(r)}});
  return out;
}

}  // namespace mx
