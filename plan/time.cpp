#include "plan/time.h"

#include <algorithm>
#include <utility>

#include "model/params.h"
#include "plan/recipe.h"

namespace mx::plan {

int64_t block_matmul_params(const ModelConfig& c) {
  return c.block_param_count() - 2 * c.hidden_size;
}

double forward_gemm_flops(const ModelConfig& c, int64_t tokens) {
  return 2.0 * double(tokens) *
         (double(c.num_hidden_layers) * double(block_matmul_params(c)) +
          double(c.vocab_size) * double(c.hidden_size));
}

double attention_forward_flops(const ModelConfig& c, int64_t B, int64_t T) {
  return 2.0 * 2.0 * double(B) * double(T) * double(T) * double(c.num_attention_heads) *
         double(c.head_dim) / 2.0;
}

double attention_efficiency(int64_t D) {
  if (D <= 64) return kAttentionEfficiency;
  if (D >= 128) return kAttentionEfficiencyD128;
  return kAttentionEfficiency +
         (kAttentionEfficiencyD128 - kAttentionEfficiency) * double(D - 64) / 64.0;
}

TimeBreakdown plan_time(const PlanInput& in, const GpuSpec& gpu) {
  const ModelConfig& c = in.model;
  const RecipeModel r = recipe_model(in.recipe);
  const RecipeModel hp = recipe_model(gpu.is_cpu ? "fp32" : "bf16");
  const int64_t B = in.micro_batch, T = in.seq_len, n = B * T, A = in.grad_accum;
  const int64_t L = c.num_hidden_layers, C = c.hidden_size, I = c.intermediate_size;
  const int64_t W = in.world_size();
  const double saturation = double(n) / (double(n) + kGemmHalfTokens);
  const double hp_rate = gpu.bf16_flops * hp.gemm_efficiency * saturation;
  // The CPU engine emulates a recipe: fp32 GEMMs on dequantized operands, at fp32's rate.
  const double lp_rate =
      gpu.is_cpu ? hp_rate : recipe_gemm_flops(in.recipe, gpu) * r.gemm_efficiency * saturation;
  // Bytes per quantized element: on CPU the emulation reads fp32 and writes an fp32 copy, and
  // its per-element rounding work costs about as much again (a rough estimate).
  const double quantize_bytes = gpu.is_cpu ? kCpuQuantizeBytesPerElement : r.quantize_bytes_per_element;
  const double quantize_grad_bytes =
      gpu.is_cpu || r.quantize_grad_bytes_per_element == 0 ? quantize_bytes
                                                          : r.quantize_grad_bytes_per_element;
  const double quantize_xt_bytes = gpu.is_cpu ? 0.0 : r.quantize_xt_bytes_per_element;
  const double quantize_weight_bytes =
      gpu.is_cpu || r.quantize_weight_bytes_per_param == 0 ? quantize_bytes
                                                          : r.quantize_weight_bytes_per_param;
  const double attn_rate = gpu.bf16_flops * (gpu.is_cpu ? kCpuAttentionEfficiency
                                                       : attention_efficiency(c.head_dim));
  const int64_t hp_blocks = (!gpu.is_cpu && in.recipe == "bf16") || in.recipe == "fp32"
                                ? 0
                                : std::min(L, in.high_precision_first + in.high_precision_last);
  const double recompute = in.checkpointing == Checkpointing::kFull ? 1.0 : 0.0;
  const double act = gpu.is_cpu ? 4.0 : 2.0;

  // One block, one micro-batch, forward + backward (+ recompute).
  const double block_gemm = 2.0 * double(n) * double(block_matmul_params(c)) * (3.0 + recompute);
  const double block_attn = attention_forward_flops(c, B, T) * (1.0 + 2.5 + recompute);
  double fwd_bytes_per_token =
      act * double(10 * C + 2 * c.q_dim() + 2 * c.kv_dim() + 3 * I);
  double block_bytes = double(n) * fwd_bytes_per_token * (3.0 + recompute);
  if (in.checkpointing == Checkpointing::kSelective) block_bytes += double(n) * act * double(4 * C + 3 * I);
  // per token: the Linears' distinct inputs, each Linear's input (q, k, v and gate, up each
  // their own: quantize_xt_bytes), then their output gradients
  const double quant_input_elems = double(2 * C + c.q_dim() + I);
  const double quant_xt_elems = double(5 * C + c.q_dim() + I);
  const double quant_grad_elems = double(c.q_dim() + 2 * c.kv_dim() + 2 * C + 2 * I);
  const double block_quant_bytes =
      double(n) *
          (quantize_bytes * quant_input_elems + quantize_xt_bytes * quant_xt_elems +
           quantize_grad_bytes * quant_grad_elems) *
          (1.0 + recompute / 3.0) +
      quantize_weight_bytes * double(block_matmul_params(c));
  const double head_gemm = 2.0 * double(n) * double(c.vocab_size) * double(C) * 3.0;
  // precision.fp8_head: the head's GEMMs at the per-tensor FP8 rate, plus their casts per
  // micro-batch: W (V x C fp32) read for its amax, then read and written as codes in both
  // layouts (4 + 4 + 2 bytes an element); h (n x C) the same; the logits gradient's (n x V)
  // codes written by the cross-entropy kernel and transposed (1 + 1 + 1). On the CPU the twin's fp32 GEMMs and its rounding
  // passes over the same elements (kCpuQuantizeBytesPerElement each). With its data gradient
  // in bf16 (precision.fp8_head_dgrad = bf16, the default) that GEMM, a third of the head's,
  // runs at the bf16 rate; W's codes are written row-major only and its bf16 copy made
  // (4 + 4 + 1 + 4 + 2 bytes an element), the gradient's bf16 copy beside its codes (+2); the
  // twin rounds W and the gradient to bf16 too.
  const bool fp8_head =
      in.fp8_head && in.recipe != "fp32" && (gpu.is_cpu || gpu.fp8_flops > 0);
  const bool bf16_dgrad = fp8_head && !in.fp8_head_dgrad;
  const double head_rate =
      fp8_head && !gpu.is_cpu
          ? gpu.fp8_flops * recipe_model("fp8-current").gemm_efficiency * saturation
          : hp_rate;
  const double head_gemm_s = bf16_dgrad ? head_gemm * (2.0 / 3.0) / head_rate +
                                              head_gemm * (1.0 / 3.0) / hp_rate
                                        : head_gemm / head_rate;
  const double VC = double(c.vocab_size) * double(C), nC = double(n) * double(C),
               nV = double(n) * double(c.vocab_size);
  const double head_cast_bytes =
      !fp8_head    ? 0.0
      : gpu.is_cpu ? kCpuQuantizeBytesPerElement *
                         (VC + nC + nV + (bf16_dgrad ? VC + nV : 0.0))
      : bf16_dgrad ? 15.0 * VC + 10.0 * nC + 5.0 * nV
                   : 10.0 * VC + 10.0 * nC + 3.0 * nV;
  const double head_bytes = 16.0 * double(n) * double(c.vocab_size) + head_cast_bytes;

  // Achieved bandwidths: on GPUs the measured fractions of the datasheet's (memory-bound ops,
  // the recipe's casts); the CPU's figure is an assumed stream rate already.
  const double mem_bw = gpu.hbm_bytes_per_s * (gpu.is_cpu ? 1.0 : kMemoryBoundEfficiency);
  const double quant_bw = gpu.hbm_bytes_per_s * (gpu.is_cpu ? 1.0 : r.quantize_efficiency);
  auto block_time = [&](bool quantized) {
    double g = block_gemm / (quantized ? lp_rate : hp_rate);
    double m = block_bytes / mem_bw + (quantized ? block_quant_bytes / quant_bw : 0.0);
    return std::make_pair(g, m);
  };
  TimeBreakdown t;
  double mb_gemm = 0, mb_attn = 0, mb_mem = 0;
  for (int q = 0; q < 2; ++q) {
    const int64_t count = q == 0 ? L - hp_blocks : hp_blocks;
    auto [g, m] = block_time(q == 0 && hp_blocks < L && r.name != hp.name);
    mb_gemm += double(count) * g;
    mb_mem += double(count) * m;
  }
  // precision.fp8_attention: the blocks any recipe but fp32 covers (the high-precision ones
  // keep bf16 attention, whatever the recipe). On a GPU cuDNN's FP8 SDPA at its rate, plus its
  // own passes over q, k, v (and dO, O) per token: forward the amaxes (act bytes each), the
  // casts (act in, 1 out), O's decode (1 in, act out); backward the amaxes of q, k, v, dO, the
  // casts of q, k, v, O, dO and the decodes of dQ, dK, dV. On the CPU the twin is slower than
  // the plain kernel by kCpuFp8AttentionSlowdown.
  const int64_t fp8_blocks =
      in.fp8_attention && in.recipe != "fp32" && (gpu.is_cpu || gpu.fp8_flops > 0)
          ? L - std::min(L, in.high_precision_first + in.high_precision_last)
          : 0;
  const double fp8_attn_rate = gpu.is_cpu ? attn_rate * kCpuFp8AttentionSlowdown
                                          : attn_rate * kFp8AttentionSpeedup;
  const double Qd = double(c.q_dim()), Kd = double(c.kv_dim());
  const double fp8_fwd_bytes = act * (Qd + 2 * Kd) + (act + 1) * (Qd + 2 * Kd) + (1 + act) * Qd;
  const double fp8_bwd_bytes =
      act * (2 * Qd + 2 * Kd) + (act + 1) * (3 * Qd + 2 * Kd) + (1 + act) * (Qd + 2 * Kd);
  const double fp8_attn_bytes =
      gpu.is_cpu ? 0.0 : double(n) * (fp8_fwd_bytes * (1.0 + recompute) + fp8_bwd_bytes);
  mb_attn = double(L - fp8_blocks) * block_attn / attn_rate +
            double(fp8_blocks) * block_attn / fp8_attn_rate;
  mb_mem += double(fp8_blocks) * fp8_attn_bytes / mem_bw;
  mb_gemm += head_gemm_s;
  mb_mem += head_bytes / mem_bw;
  const double block_compute = (mb_gemm - head_gemm_s + mb_attn) / double(L) +
                               (mb_mem - head_bytes / mem_bw) / double(L);
  const double head_compute = head_gemm_s + head_bytes / mem_bw;

  // Collectives. A group inside one node runs at NVLink speed; one that spans nodes is limited
  // by each GPU's share of the instance's EFA bandwidth.
  ParamLayout layout(c);
  const int64_t S = shard_count(in);
  auto group_bw = [&](int64_t ranks, bool spans_nodes) {
    double bw = spans_nodes ? gpu.efa_bytes_per_s / double(std::min(gpu.gpus_per_node, W))
                            : gpu.nvlink_bytes_per_s;
    (void)ranks;
    return bw * kCollectiveEfficiency;
  };
  const bool shard_spans = S > in.gpus_per_node;
  const double shard_bw = group_bw(S, shard_spans);
  const double ring = S > 1 ? double(S - 1) / double(S) : 0.0;
  auto unit_numel = [&](const std::string& name) {
    for (auto& u : layout.units())
      if (u.name == name) return double(u.numel);
    return 0.0;
  };
  const double block_numel = double(c.block_param_count());
  double gathers = 0;  // all-gathers of each unit per micro-batch
  if (in.sharding == "full" || in.sharding == "hybrid") gathers = 2;
  else if (in.sharding == "grad-op") gathers = 1;
  const bool reduce_scatter = in.sharding != "none" && S > 1;
  auto unit_comm = [&](double numel) {
    if (S <= 1) return 0.0;
    return ring * numel * (gathers * 2.0 + (reduce_scatter ? 4.0 : 0.0)) / shard_bw;
  };
  const double comm_block = unit_comm(block_numel);
  const double comm_embed = unit_comm(unit_numel("embed"));
  const double comm_head = unit_comm(unit_numel("head"));
  double mb_comm = comm_embed + comm_head + double(L) * comm_block;
  double mb_exposed = comm_embed + double(L) * std::max(0.0, comm_block - block_compute) +
                      std::max(0.0, comm_head - head_compute);
  const double mb_compute = mb_gemm + mb_attn + mb_mem;

  // Once per step: DDP all-reduce of full gradients (none), or the cross-replica all-reduce
  // of the gradient shard (hybrid). Overlapped with the last micro-batch's backward (2/3 of
  // its compute), except the last block's bucket.
  double step_comm = 0, step_exposed = 0;
  if (in.sharding == "none" && W > 1) {
    const double bw = group_bw(W, in.nodes > 1);
    step_comm = 2.0 * 4.0 * double(layout.total_numel()) * double(W - 1) / double(W) / bw;
    step_exposed = std::max(0.0, step_comm - mb_compute * 2.0 / 3.0) +
                   step_comm * block_numel / double(layout.total_numel());
  } else if (in.sharding == "hybrid" && W > S) {
    const int64_t R = W / S;
    const double bw = group_bw(R, in.nodes > 1);
    step_comm = 2.0 * 4.0 * double(sharded_numel(layout, S)) * double(R - 1) / double(R) / bw;
    step_exposed = std::max(0.0, step_comm - mb_compute * 2.0 / 3.0) +
                   step_comm * block_numel / double(layout.total_numel());
  }

  t.gemm_flops = double(A) * (double(L) * block_gemm + head_gemm);
  t.attention_flops = double(A) * double(L) * block_attn;
  t.fp8_attention_blocks = fp8_blocks;
  t.fp8_head = fp8_head;
  t.gemm_s = double(A) * mb_gemm;
  t.attention_s = double(A) * mb_attn;
  // the weights' casts' once-a-step bytes (nvfp4's shared amax pass), in the quantized blocks
  const double quantized_blocks =
      gpu.is_cpu || r.name == hp.name ? 0.0 : double(L - hp_blocks);
  const double step_mem = r.quantize_weight_step_bytes_per_param * quantized_blocks *
                          double(block_matmul_params(c)) / quant_bw;
  t.memory_bound_s = double(A) * mb_mem + step_mem;
  t.optimizer_s = kOptimizerBytesPerParam * double(sharded_numel(layout, S)) / gpu.hbm_bytes_per_s;
  t.comm_s = double(A) * mb_comm + step_comm;
  t.exposed_comm_s = double(A) * mb_exposed + step_exposed;
  t.step_s = double(A) * (mb_compute + mb_exposed) + step_mem + t.optimizer_s + step_exposed;
  t.tokens_per_step = double(W) * double(A) * double(n);
  t.tokens_per_s = t.tokens_per_step / t.step_s;
  t.tokens_per_s_per_gpu = t.tokens_per_s / double(W);
  t.model_flops_per_token = c.flops_per_token(T);
  // MFU against the dense peak of the precision the recipe's GEMMs run in (so it stays a
  // utilization, <= 1), and against bf16's peak for comparison across recipes.
  t.mfu = t.model_flops_per_token * t.tokens_per_s / (double(W) * recipe_gemm_flops(in.recipe, gpu));
  t.mfu_bf16 = t.model_flops_per_token * t.tokens_per_s / (double(W) * gpu.bf16_flops);
  t.gemm_rate = lp_rate;
  return t;
}

}  // namespace mx::plan
