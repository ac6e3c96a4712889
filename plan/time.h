// Per-step time model: GEMMs at the recipe's dense rate times an achievable efficiency,
// causal attention at the bf16 rate times its own efficiency, memory-bound ops and casts at a
// measured fraction of HBM bandwidth (GPUs; the optimizer at all of it), FSDP collectives at
// NVLink (within a node) or EFA (across nodes) bandwidth, overlapped with the compute of
// neighbouring units except for the first and last unit.
// Every constant is documented in docs/plan.md. All of it is a prediction.
#pragma once
#include <cstdint>

#include "plan/gpus.h"
#include "plan/memory.h"

namespace mx::plan {

// GPU constants measured on an H200 (docs/plan.md, "Calibration"): cuDNN's bf16 flash
// attention at head dim 64 ran 30.8 TFLOP a step in 81.5 ms (0.38 of the bf16 peak); the
// memory-bound ops moved the model's 112.6 GB a step in 61 ms. At head dim 128 and more
// attention runs at 0.5 (assumed, not measured here: cuDNN's forward at 128 is about 1.45x its
// rate at 64 in FlashAttention-3's H100 figures; the backward's gain is taken smaller).
constexpr double kAttentionEfficiency = 0.38;      // head dim 64 and less
constexpr double kAttentionEfficiencyD128 = 0.5;   // head dim 128 and more; linear between
constexpr double kMemoryBoundEfficiency = 0.4;
constexpr double kCpuAttentionEfficiency = 0.3;   // the CPU tiled kernel vs SGEMM
// precision.fp8_attention: cuDNN's fused FP8 SDPA at this many times the bf16 attention's rate
// at the same head dim (not measured); on the CPU the twin
// (fp32 work plus rounding q, k, v, P, O, dS and the gradients) at this fraction of the plain
// kernel's rate. docs/plan.md gives the sources.
constexpr double kFp8AttentionSpeedup = 1.6;
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
// The bf16 flash attention's fraction of the bf16 peak on GPUs at head dim D (above).
double attention_efficiency(int64_t D);

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
