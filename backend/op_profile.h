// Per-op time (run.profile): where a step's time goes, op by op, on either backend.
//
// Exclusive attribution: each stretch of time belongs to exactly one op, the innermost one
// running, so a nested op's time (the GEMM inside a Linear) is its own and not its caller's
// too, and the rows add up to at most the time measured.
//   CPU: begin() / end() around each op on the host clock (the ops are synchronous); time
//     between ops (the model's own host code, e.g. the emulated recipes' quantizers) belongs to
//     no op: the report shows it as the remainder of the wall time.
//   CUDA: one event on the stream as each op finishes queueing its kernels; the device time from
//     the previous op's event to this one's is this op's (add()). Kernels of an op that records
//     no event count toward the next op that does, and so does time the GPU sat idle while the
//     host caught up after a synchronization.
// GEMM FLOPs are attributed the same way, from the backend's running FLOP count.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mx {

class OpProfile {
 public:
  struct Row {
    std::string op;
    int64_t calls = 0;
    double seconds = 0;
    double flops = 0;  // GEMM FLOPs counted while the op ran (0 for most)
  };

  // Host-clock form (CPU). flops_now: the backend's running FLOP count at that moment.
  void begin(const char* op, double flops_now);
  void end(double flops_now);
  // Device form (CUDA): one finished op with its measured time and FLOPs.
  void add(const std::string& op, double seconds, double flops);

  // Every op seen since clear(), by time, largest first (ties: by name).
  std::vector<Row> rows() const;
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  void charge(Clock::time_point now, double flops_now);
  std::map<std::string, Row> rows_;
  std::vector<std::string> stack_;  // the ops running, innermost last (CPU form)
  Clock::time_point mark_{};
  double flops_mark_ = 0;
};

// The report: the `top` ops by time, one line each (calls, seconds, share of wall_seconds,
// GFLOP/s where FLOPs were counted), then the rest summed, then the time outside every op.
std::string format_op_profile(const std::vector<OpProfile::Row>& rows, double wall_seconds,
                              size_t top);
// The same as JSON: [{op, calls, seconds, share, gflops}], every op.
nlohmann::json op_profile_json(const std::vector<OpProfile::Row>& rows, double wall_seconds);

}  // namespace mx
