// Per-step time model: GEMMs at the recipe's dense rate times an achievable efficiency,
// causal attention at the bf16 rate times its own efficiency, memory-bound ops and casts at a
// measured fraction of HBM bandwidth (GPUs; the optimizer at all of it), FSDP collectives at NVLink (within a node) or EFA (across nodes) bandwidth,
// overlapped with the compute of neighbouring units except for the first and last unit.
// Every constant is documented in docs/plan.md. All of it is a prediction.
#pragma once
#include <cstdint>

#include "plan/gpus.h"
#include "plan/memory.h"

namespace mx::plan {

// GPU constants measured on an H200 (docs/plan.md, "Calibration"): cuDNN's bf16 flash
// attention (head dim 64) ran 30.8 TFLOP a step in 81.5 ms; the memory-bound ops moved the
// model's 112.6 GB a step in 61 ms.
constexpr double kAttentionEfficiency = 0.38;
constexpr double kMemoryBoundEfficiency = 0.4;
constexpr double kCpuAttentionEfficiency = 0.3;   // the CPU tiled kernel vs SGEMM
// precision.fp8_attention: cuDNN's fused FP8 SDPA at this fraction of the dense FP8 rate (1.6x
// the bf16 rate above on Hopper and Blackwell, where FP8 is twice bf16; not measured); on the CPU the twin
// (fp32 work plus rounding q, k, v, P, O, dS and the gradients) at this fraction of the plain
// kernel's rate. docs/plan.md gives the sources.
constexpr double kFp8AttentionEfficiency = 0.3;
constexpr double kCpuFp8AttentionSlowdown = 0.4;
constexpr double kGemmHalfTokens = 128;           // efficiency(n) = eff * n / (n + 128)
constexpr double kCollectiveEfficiency = 0.8;     // achieved / link bandwidth (NCCL rings)
constexpr double kOptimizerBytesPerParam = 38;    // AdamW r/w 30 B + clip 4 B + zero 4 B
constexpr double kCpuQuantizeBytesPerElement = 12;  // CPU recipe emulation: fp32 in, fp32 copy out, + rounding work

// Matmul parameters of one block (q, k, v, o, gate, up, down).
int64_t block_matmul_params(const ModelConfig& c);
// GEMM FLOPs of one forward of the whole model on n tokens: 2 n (L * block + V * C).
double forward_gemm_flops(const ModelConfig& c, int64_t tokens);
// Causal attention FLOPs of one forward of one block: 2 matmuls of 2 B T^2 H D, halved.
double attention_forward_flops(const ModelConfig& c, int64_t B, int64_t T);

struct TimeBreakdown {
  double gemm_flops = 0;       // per step, per rank, incl. backward (2x) and recompute
  double attention_flops = 0;  // per step, per rank
  int64_t fp8_attention_blocks = 0;  // blocks whose attention runs in FP8 (precision.fp8_attention)
  bool fp8_head = false;             // the head's GEMMs in FP8 (precision.fp8_head)
  double gemm_s = 0, attention_s = 0, memory_bound_s = 0;
  double comm_s = 0;           // all collective time per step (overlapped or not)
  double exposed_comm_s = 0;   // the part not hidden behind compute
  double optimizer_s = 0;
  double step_s = 0;
  double tokens_per_step = 0;  // global
  double tokens_per_s = 0;     // global
  double tokens_per_s_per_gpu = 0;
  double model_flops_per_token = 0;  // ModelConfig::flops_per_token (PaLM)
  double mfu = 0;       // model FLOPs / (ranks x dense peak of the recipe's GEMM precision)
  double mfu_bf16 = 0;  // model FLOPs / (ranks x dense bf16 peak; cpu: measured SGEMM)
  double gemm_rate = 0;              // achieved low-precision GEMM FLOP/s assumed
};

TimeBreakdown plan_time(const PlanInput& in, const GpuSpec& gpu);

}  // namespace mx::plan
