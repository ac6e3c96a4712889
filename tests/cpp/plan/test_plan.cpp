// The planner's models: exact arithmetic of the state terms, sharding division, the activation
// replay against the engine's real arenas, the time model's FLOP counts, the catalogue.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/fsdp_sizes.h"
#include "plan/gpus.h"
#include "plan/memory.h"
#include "plan/planner.h"
#include "plan/recipe.h"
#include "plan/time.h"
#include "precision/recipe.h"
#include "train/engine.h"

namespace {

using mx::Checkpointing;
using namespace mx::plan;

mx::ModelConfig preset(const char* name) {
  auto c = mx::model_preset(name);
  c.finalize();
  c.validate();
  return c;
}

PlanInput input(const char* name, int64_t B, int64_t T, Checkpointing p, const char* sharding,
                int64_t gpus, int64_t nodes, const char* recipe) {
  PlanInput in;
  in.model = preset(name);
  in.model_name = name;
  in.micro_batch = B;
  in.seq_len = T;
  in.checkpointing = p;
  in.sharding = sharding;
  in.gpus_per_node = gpus;
  in.nodes = nodes;
  in.recipe = recipe;
  return in;
}

GpuSpec fake_cpu() {  // cpu without measuring (the tests need no rate)
  GpuSpec g;
  g.name = "cpu";
  g.is_cpu = true;
  g.gpus_per_node = 1 << 20;
  g.memory_bytes = 1e12;
  g.bf16_flops = 1e11;
  g.hbm_bytes_per_s = 2e10;
  g.nvlink_bytes_per_s = 5e9;
  g.efa_bytes_per_s = 1e9;
  return g;
}

TEST(PlanMemory, StateIsFourBytesPerParameterEach) {
  for (const char* name : {"tiny", "small", "125m", "llama3-8b"}) {
    PlanInput in = input(name, 1, 16, Checkpointing::kNone, "none", 1, 1, "bf16");
    const int64_t P = in.model.param_count();
    MemoryBreakdown g = plan_memory(in, find_gpu("h100"));
    EXPECT_EQ(g.master_weights, 4 * P) << name;
    EXPECT_EQ(g.gradients, 4 * P) << name;
    EXPECT_EQ(g.adam_m, 4 * P) << name;
    EXPECT_EQ(g.adam_v, 4 * P) << name;
    EXPECT_EQ(g.compute_weights, 2 * P) << name;  // replicated bf16 copy
    in.recipe = "fp32";
    MemoryBreakdown c = plan_memory(in, fake_cpu());
    EXPECT_EQ(c.master_weights, int64_t(mx::Arena::round_up(size_t(4 * P)))) << name;
    EXPECT_EQ(c.compute_weights, 0) << name;  // the CPU computes on the fp32 master weights
    EXPECT_TRUE(c.exact);
  }
}

TEST(PlanMemory, ShardingDividesTheState) {
  PlanInput in = input("llama3-8b", 1, 1024, Checkpointing::kFull, "full", 8, 1, "bf16");
  mx::ParamLayout layout(in.model);
  const int64_t P = in.model.param_count();
  MemoryBreakdown full = plan_memory(in, find_gpu("b200"));
  EXPECT_EQ(full.shards, 8);
  // Each unit padded to a multiple of 8: per-rank = sum ceil(unit / 8).
  int64_t expect = 0;
  for (auto& u : layout.units()) expect += (u.numel + 7) / 8;
  EXPECT_EQ(full.master_weights, 4 * expect);
  EXPECT_LE(full.master_weights, 4 * P / 8 + 4 * int64_t(layout.units().size()));
  EXPECT_GE(full.master_weights, 4 * P / 8);
  // Two gathered units in bf16 (the largest is the head here: lm_head + final norm) + one fp32
  // gradient unit.
  const int64_t unit = largest_unit_numel(layout);
  EXPECT_EQ(unit, in.model.vocab_size * in.model.hidden_size + in.model.hidden_size);
  EXPECT_EQ(full.compute_weights, 2 * 2 * unit);
  EXPECT_EQ(full.unsharded_gradient, 4 * unit);

  // grad-op keeps every gathered weight through backward; none replicates everything.
  in.sharding = "grad-op";
  MemoryBreakdown gop = plan_memory(in, find_gpu("b200"));
  EXPECT_EQ(gop.master_weights, full.master_weights);
  EXPECT_EQ(gop.compute_weights, 2 * P);
  in.sharding = "none";
  MemoryBreakdown none = plan_memory(in, find_gpu("b200"));
  EXPECT_EQ(none.master_weights, 4 * P);
  EXPECT_EQ(none.unsharded_gradient, 0);
  EXPECT_LT(full.total, gop.total);
  EXPECT_LT(gop.total, none.total);
  EXPECT_EQ(full.activations, none.activations);  // sharding does not change activations

  // hybrid over 2 nodes, sharded within the node: the same per-rank state as full on 8.
  in.sharding = "hybrid";
  in.nodes = 2;
  in.shard_group = 8;
  MemoryBreakdown hyb = plan_memory(in, find_gpu("b200"));
  EXPECT_EQ(hyb.shards, 8);
  EXPECT_EQ(hyb.master_weights, full.master_weights);
  // shard_group 0 is every rank, as the engine's Fsdp reads it (it was a node's GPUs here).
  in.shard_group = 0;
  EXPECT_EQ(plan_memory(in, find_gpu("b200")).shards, 16);
  EXPECT_EQ(mx::fsdp_shard_size(mx::Sharding::kHybrid, 16, 0), 16);
  in.shard_group = 3;  // does not divide 16
  EXPECT_THROW(plan_memory(in, find_gpu("b200")), mx::UserError);
}

TEST(PlanMemory, FullShardingOnFourRanksIsAQuarterPlusGatheredUnits) {
  PlanInput one = input("14b", 1, 2048, Checkpointing::kFull, "full", 1, 1, "bf16");
  PlanInput four = one;
  four.gpus_per_node = 4;
  MemoryBreakdown m1 = plan_memory(one, find_gpu("h200"));
  MemoryBreakdown m4 = plan_memory(four, find_gpu("h200"));
  const int64_t state1 = m1.master_weights + m1.gradients + m1.adam_m + m1.adam_v;
  const int64_t state4 = m4.master_weights + m4.gradients + m4.adam_m + m4.adam_v;
  mx::ParamLayout layout(one.model);
  EXPECT_LE(state4, state1 / 4 + 16 * int64_t(layout.units().size()));
  EXPECT_LE(m4.total, m1.total / 4 + m4.compute_weights + m4.unsharded_gradient +
                          m4.activations + m4.fragmentation + m4.nccl_buffers +
                          m4.cuda_context + m4.library_workspace + m4.batch_tokens);
}

TEST(PlanMemory, ReplayStaysWithinTheEngineArenaCapacities) {
  for (const char* name : {"tiny", "small", "125m"})
    for (Checkpointing p : {Checkpointing::kNone, Checkpointing::kSelective, Checkpointing::kFull})
      for (int64_t B : {1, 3}) {
        mx::ModelConfig c = preset(name);
        for (bool bf16 : {false, true}) {
          ActivationDtypes dt = cpu_dtypes();
          dt.bf16_activations = bf16;
          ActivationPeak a = simulate_activations(c, B, 48, p, dt, true);
          mx::ActivationBytes cap = mx::activation_bytes(c, B, 48, p, false, false, bf16);
          EXPECT_LE(a.saved_at_peak, int64_t(cap.saved)) << name << " " << bf16;
          EXPECT_LE(a.scratch_at_peak, int64_t(cap.scratch)) << name << " " << bf16;
          EXPECT_LE(a.peak, int64_t(cap.saved + cap.scratch)) << name << " " << bf16;
          EXPECT_GT(a.peak, 0);
        }
      }
}

// The GPU replay keeps x^T's FP8 codes of h1, h2 and the SwiGLU product in place of their
// bf16 codes (dt.fp8_xt): n bytes and a 4-byte scale each, or the block recipes' n / 32 bytes
// of scales (fp8_xt_scale_bytes), each allocation rounded to 64 bytes as the arenas round.
// Worked out by hand from the shapes: at the peak the saved bytes differ by L blocks' sums of
// those sizes.
TEST(PlanMemory, ReplayKeepsTheXtCodesAndTheirScales) {
  mx::ModelConfig c = preset("small");
  const int64_t B = 2, T = 128, N = B * T, L = c.num_hidden_layers;
  const int64_t kept[3] = {N * c.hidden_size, N * c.hidden_size, N * c.intermediate_size};
  auto r64 = [](int64_t v) { return (v + 63) / 64 * 64; };
  auto block = [&](auto bytes) {
    int64_t sum = 0;
    for (int64_t n : kept) sum += r64(bytes(n));
    return L * sum;
  };
  auto saved = [&](mx::XtCodes x) {
    ActivationDtypes d = gpu_dtypes();
    d.fp8_xt = x;
    return simulate_activations(c, B, T, Checkpointing::kNone, d, true);
  };
  const ActivationPeak none = saved(mx::XtCodes::kNone), per = saved(mx::XtCodes::kPerTensor),
                       mx8 = saved(mx::XtCodes::kMxfp8), blk = saved(mx::XtCodes::kFp8Block);
  // (the last block's MLP backward: every block's kept tensors still live)
  const std::string last = "backward block " + std::to_string(L - 1) + " mlp";
  EXPECT_EQ(none.where, last);
  EXPECT_EQ(per.where, last);
  EXPECT_EQ(mx8.where, last);
  EXPECT_EQ(mx8.saved_at_peak, blk.saved_at_peak);
  EXPECT_EQ(mx8.saved_at_peak - per.saved_at_peak,
            block([](int64_t n) { return n + n / 32; }) - block([](int64_t n) { return n + 4; }));
  EXPECT_EQ(none.saved_at_peak - mx8.saved_at_peak,
            block([](int64_t n) { return 2 * n; }) - block([](int64_t n) { return n + n / 32; }));
}

// The reference: the engine itself, one forward+backward, its tracker's peak.
TEST(PlanMemory, CpuPredictionEqualsTheEnginePeak) {
  struct Case {
    mx::ModelConfig c;
    int64_t B, T;
  };
  mx::ModelConfig odd;
  odd.hidden_size = 96;
  odd.intermediate_size = 200;
  odd.num_hidden_layers = 2;
  odd.num_attention_heads = 6;
  odd.num_key_value_heads = 2;
  odd.vocab_size = 300;
  odd.finalize();
  odd.validate();
  std::vector<Case> cases = {{preset("tiny"), 2, 37}, {odd, 3, 17}, {preset("tiny"), 1, 128}};
  for (auto& k : cases)
    for (Checkpointing p : {Checkpointing::kNone, Checkpointing::kSelective, Checkpointing::kFull}) {
      mx::EngineOptions eo;
      eo.checkpointing = p;
      eo.micro_batch = k.B;
      eo.seq_len = k.T;
      mx::Engine engine(k.c, eo);
      mx::init_params(engine.layout, engine.param_data(), 7);
      std::mt19937 gen(3);
      int32_t* tok = engine.batch_tokens();
      for (int64_t i = 0; i < k.B * (k.T + 1); ++i) tok[i] = int32_t(gen() % k.c.vocab_size);
      engine.model->forward_backward(engine.param_data(), engine.grad_data(), tok, k.B, k.T, 1.0f);
      PlanInput in;
      in.model = k.c;
      in.micro_batch = k.B;
      in.seq_len = k.T;
      in.checkpointing = p;
      in.recipe = "fp32";
      MemoryBreakdown m = plan_memory(in, fake_cpu());
      EXPECT_EQ(m.total, engine.tracker.peak())
          << mx::checkpointing_name(p) << " B=" << k.B << " T=" << k.T;
    }
}

// Recipes: the engine emulates each one with quantized operand copies in scratch; the replay
// must see them at the same moments (NVFP4 with T % 16 == 0 takes the Hadamard path).
TEST(PlanMemory, CpuPredictionEqualsTheEnginePeakUnderRecipes) {
  struct Case {
    const char* recipe;
    int64_t B, T, hp_first, hp_last;
    Checkpointing p;
    const char* high_precision;  // precision.high_precision ("": the default, bf16)
    const char* activations = "";  // precision.activations ("": the CPU's default, fp32)
  };
  const Case cases[] = {{"bf16", 2, 24, 0, 0, Checkpointing::kNone, ""},
                        {"fp8-delayed", 1, 40, 1, 0, Checkpointing::kSelective, ""},
                        {"fp8-delayed", 1, 40, 1, 0, Checkpointing::kSelective, "fp32"},
                        {"mxfp8", 2, 32, 0, 0, Checkpointing::kFull, "fp32"},
                        {"nvfp4", 2, 32, 0, 0, Checkpointing::kNone, ""},
                        {"nvfp4", 1, 24, 0, 1, Checkpointing::kFull, ""},
                        {"fp8-block", 3, 16, 0, 0, Checkpointing::kSelective, ""},
                        {"bf16", 2, 24, 0, 0, Checkpointing::kNone, "", "bf16"},
                        {"bf16", 3, 17, 0, 0, Checkpointing::kSelective, "", "bf16"},
                        {"bf16", 1, 24, 0, 0, Checkpointing::kFull, "", "bf16"},
                        {"mxfp8", 2, 32, 1, 0, Checkpointing::kSelective, "", "bf16"},
                        {"nvfp4", 2, 32, 0, 0, Checkpointing::kNone, "fp32", "bf16"}};
  const mx::ModelConfig c = preset("tiny");
  for (const Case& k : cases) {
    mx::EngineOptions eo;
    eo.checkpointing = k.p;
    eo.micro_batch = k.B;
    eo.seq_len = k.T;
    eo.quantized = true;
    eo.bf16_activations = mx::bf16_activations(mx::parse_recipe(k.recipe), k.activations, "cpu");
    mx::Engine engine(c, eo);
    mx::LinearRecipe recipe(mx::parse_recipe(k.recipe), c.num_hidden_layers, k.hp_first,
                            k.hp_last, 1, 0);
    recipe.set_high_precision_bf16(mx::high_precision_bf16(recipe.recipe(), k.high_precision));
    engine.model->set_recipe(&recipe);
    mx::init_params(engine.layout, engine.param_data(), 7);
    std::mt19937 gen(3);
    int32_t* tok = engine.batch_tokens();
    for (int64_t i = 0; i < k.B * (k.T + 1); ++i) tok[i] = int32_t(gen() % c.vocab_size);
    engine.model->forward_backward(engine.param_data(), engine.grad_data(), tok, k.B, k.T, 1.0f);
    PlanInput in;
    in.model = c;
    in.micro_batch = k.B;
    in.seq_len = k.T;
    in.checkpointing = k.p;
    in.recipe = k.recipe;
    in.high_precision_first = k.hp_first;
    in.high_precision_last = k.hp_last;
    in.high_precision = k.high_precision;
    in.activations = k.activations;
    MemoryBreakdown m = plan_memory(in, fake_cpu());
    EXPECT_EQ(m.total, engine.tracker.peak()) << k.recipe << " " << mx::checkpointing_name(k.p)
                                              << " " << k.high_precision << " " << k.activations;
    if (std::string(k.activations) == "bf16" && k.p != Checkpointing::kFull) {
      // the kept copies are really half: fp32 activations need more
      PlanInput f = in;
      f.activations = "fp32";
      EXPECT_GT(plan_memory(f, fake_cpu()).activations_saved, m.activations_saved) << k.recipe;
    }
    in.activations = "";
    in.recipe = "fp32";  // and the copies are really there: fp32 needs less
    EXPECT_LT(plan_memory(in, fake_cpu()).total, m.total) << k.recipe;
  }
}

// The planner's FSDP arenas are parallel/fsdp_sizes.h's, rank by rank: grad-op keeps one slot
// per unit (each its unit's size), full three of the largest; none and one process have no slots.
TEST(PlanMemory, CpuFsdpArenasPerStrategy) {
  PlanInput in = input("tiny", 1, 16, Checkpointing::kNone, "full", 4, 1, "fp32");
  mx::ParamLayout layout(in.model);
  const int64_t units = int64_t(layout.units().size());
  int64_t max_padded = 0, local = 0, max_shard = 0, block_padded = 0;
  for (auto& u : layout.units()) {
    const int64_t shard = (u.numel + 3) / 4;
    local += shard;
    max_padded = std::max(max_padded, 4 * shard);
    max_shard = std::max(max_shard, shard);
  }
  for (int64_t l = 0; l < in.model.num_hidden_layers; ++l)  // untied: blocks only
    block_padded = std::max(block_padded, 4 * ((layout.units()[size_t(layout.block_unit(l))].numel + 3) / 4));
  auto r64 = [](int64_t b) { return int64_t(mx::Arena::round_up(size_t(b))); };
  MemoryBreakdown full = plan_memory(in, fake_cpu());
  EXPECT_EQ(full.master_weights, r64(4 * local));
  // one slot of the largest unit, two of a block
  const int64_t three = r64(4 * max_padded) + 2 * r64(4 * block_padded);
  EXPECT_EQ(full.compute_weights, three);
  EXPECT_EQ(full.unsharded_gradient, three);
  EXPECT_EQ(full.reduce_scatter, r64(4 * max_shard));
  EXPECT_TRUE(full.exact);
  EXPECT_EQ(full.total_max_rank, full.total);
  in.sharding = "grad-op";
  MemoryBreakdown gop = plan_memory(in, fake_cpu());
  int64_t own_slots = 0;  // grad-op: every unit's own slot, its padded size
  for (auto& u : layout.units()) own_slots += r64(4 * 4 * ((u.numel + 3) / 4));
  EXPECT_EQ(gop.compute_weights, own_slots);
  EXPECT_LT(gop.compute_weights, units * r64(4 * max_padded));
  EXPECT_EQ(gop.total - full.total, own_slots - three);
  in.sharding = "none";
  MemoryBreakdown none = plan_memory(in, fake_cpu());
  EXPECT_EQ(none.master_weights, r64(4 * layout.total_numel()));
  EXPECT_EQ(none.compute_weights + none.unsharded_gradient + none.reduce_scatter, 0);
  in.sharding = "hybrid";
  in.shard_group = 2;
  MemoryBreakdown hyb = plan_memory(in, fake_cpu());
  EXPECT_EQ(hyb.shards, 2);
  int64_t local2 = 0;
  for (auto& u : layout.units()) local2 += (u.numel + 1) / 2;
  EXPECT_EQ(hyb.master_weights, r64(4 * local2));
  EXPECT_EQ(full.activations, hyb.activations);
}

TEST(PlanMemory, FitsFlipsAsMicroBatchGrowsOnH100) {
  PlanInput in = input("llama3-8b", 1, 8192, Checkpointing::kNone, "full", 8, 1, "bf16");
  GpuSpec h100 = find_gpu("h100");
  bool was_fitting = true;
  int flips = 0;
  for (int64_t B : {1, 2, 4, 8, 16}) {
    in.micro_batch = B;
    bool fits = evaluate(in, h100).fits;
    if (was_fitting && !fits) ++flips;
    EXPECT_FALSE(!was_fitting && fits) << "fits again at micro_batch " << B;
    was_fitting = fits;
  }
  in.micro_batch = 1;
  EXPECT_TRUE(evaluate(in, h100).fits);
  EXPECT_EQ(flips, 1);
}

// The product names cudaGetDeviceProperties reports, against the datasheets' BF16 rates with
// sparsity (dense is half): H100 SXM 1979, H100 PCIe 1513, H100 NVL and H200 NVL 1671, GH200
// 1979; B200 and B300 (HGX) 4500, GB200 and GB300 (NVL72) 5000 TFLOP/s.
TEST(GpuNames, MfuDenominatorIsTheVariantsDatasheetRate) {
  const struct {
    const char* name;
    double sparse_tflops;
  } cases[] = {
      {"NVIDIA H100 80GB HBM3", 1979}, {"NVIDIA H100 PCIe", 1513},
      {"NVIDIA H100 NVL", 1671},         {"NVIDIA H200", 1979},
      {"NVIDIA H200 NVL", 1671},         {"NVIDIA GH200 480GB", 1979},
      {"NVIDIA B200", 4500},             {"NVIDIA GB200", 5000},
      {"NVIDIA B300 SXM6 AC", 4500},     {"NVIDIA GB300", 5000},
      {"nvidia h100 pcie", 1513},
  };
  for (const auto& c : cases)
    EXPECT_NEAR(datasheet_bf16_flops(c.name), c.sparse_tflops / 2 * 1e12, 0.5e12) << c.name;  // quoted to 1 TFLOP/s
  // Not in the list: the trainer measures instead.
  for (const char* other : {"", "NVIDIA A100-SXM4-80GB", "NVIDIA H20", "NVIDIA L40S"})
    EXPECT_EQ(datasheet_bf16_flops(other), 0.0) << other;
  // The SXM parts agree with `mxtrain plan`'s table.
  EXPECT_EQ(datasheet_bf16_flops("NVIDIA H100 80GB HBM3"), find_gpu("h100").bf16_flops);
  EXPECT_EQ(datasheet_bf16_flops("NVIDIA B300 SXM6 AC"), find_gpu("b300").bf16_flops);
}

TEST(PlanTime, FlopCounts) {
  mx::ModelConfig c = preset("tiny");
  // tiny: C 64, I 160, L 2, H 4, KV 2, D 16, V 256: block matmuls 64*64 + 2*64*32 + 64*64 + 3*64*160
  EXPECT_EQ(block_matmul_params(c), 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 160);
  EXPECT_DOUBLE_EQ(forward_gemm_flops(c, 10), 2.0 * 10 * (2.0 * block_matmul_params(c) + 256 * 64));
  EXPECT_DOUBLE_EQ(attention_forward_flops(c, 2, 8), 2.0 * 2 * 8 * 8 * 4 * 16);
  PlanInput in = input("tiny", 2, 8, Checkpointing::kNone, "full", 1, 1, "bf16");
  GpuSpec g = find_gpu("h100");
  TimeBreakdown none = plan_time(in, g);
  EXPECT_DOUBLE_EQ(none.gemm_flops, 3.0 * forward_gemm_flops(c, 16));
  in.checkpointing = Checkpointing::kFull;
  TimeBreakdown full = plan_time(in, g);
  EXPECT_DOUBLE_EQ(full.gemm_flops - none.gemm_flops,
                   2.0 * 16 * 2 * double(block_matmul_params(c)));  // one more block forward
  EXPECT_GT(full.step_s, none.step_s);
  in.checkpointing = Checkpointing::kSelective;
  EXPECT_DOUBLE_EQ(plan_time(in, g).gemm_flops, none.gemm_flops);
  EXPECT_DOUBLE_EQ(none.model_flops_per_token, c.flops_per_token(8));
  EXPECT_NEAR(none.tokens_per_s, none.tokens_per_step / none.step_s, 1e-9 * none.tokens_per_s);
}

// nvfp4's casts by the bytes its kernels move (plan/recipe.cpp): a distinct input's forward
// rows 2 + 2 + 0.5 + 1/16 (an amax pass, then a read for codes and scales), each Linear's own
// Hadamard-transformed x^T the same (q, k, v and gate, up each theirs: 5C + q + I elements a
// token), an output gradient 2 + 2 + 2 x (0.5 + 1/16) (one amax pass and one read for both
// layouts), a weight 2 x (4 + 0.5 + 1/16) a micro-batch (W's and W^T's codes, each a read of
// the fp32 W) and 4 a step (one amax pass, which every cast of W until the optimizer step
// takes), against mxfp8's 2 x (2 + 1 + 1/32) for every element of the distinct inputs, the
// output gradients and the weights; the rest of the memory-bound time is the same for the
// two recipes. By hand: per block and token the distinct inputs 2C + q + I and output
// gradients q + 2kv + 2C + 2I, at 0.25 of HBM bandwidth (both recipes' assumed share).
TEST(PlanTime, Nvfp4CastsCountTheirKernelsBytes) {
  PlanInput in = input("llama3-8b", 2, 8192, Checkpointing::kNone, "full", 8, 1, "nvfp4");
  in.grad_accum = 3;
  PlanInput mx = in;
  mx.recipe = "mxfp8";
  const GpuSpec b200 = find_gpu("b200");
  const auto& c = in.model;
  const double n = 2.0 * 8192, C = double(c.hidden_size), I = double(c.intermediate_size);
  const double q = double(c.q_dim()), kv = double(c.kv_dim());
  const double fp4_rows = 2 + 2 + 0.5 + 1.0 / 16, fp4_grad = 2 + 2 + 2 * (0.5 + 1.0 / 16);
  const double fp4_weight = 2 * (4 + 0.5 + 1.0 / 16), fp4_weight_step = 4;
  const double mx_bytes = 2 * (2 + 1 + 1.0 / 32);
  const double per_block = n * ((fp4_rows - mx_bytes) * (2 * C + q + I) +
                                fp4_rows * (5 * C + q + I) +
                                (fp4_grad - mx_bytes) * (q + 2 * kv + 2 * C + 2 * I)) +
                           (fp4_weight - mx_bytes) * double(block_matmul_params(c));
  const double per_step =
      3 * per_block + fp4_weight_step * double(block_matmul_params(c));  // 3 micro-batches
  const double want = double(c.num_hidden_layers) * per_step / (b200.hbm_bytes_per_s * 0.25);
  const TimeBreakdown fp4 = plan_time(in, b200), mx8 = plan_time(mx, b200);
  EXPECT_NEAR(fp4.memory_bound_s - mx8.memory_bound_s, want, 1e-9 * std::abs(want));
  EXPECT_NEAR(fp4.step_s - mx8.step_s, fp4.memory_bound_s - mx8.memory_bound_s + fp4.gemm_s -
                                           mx8.gemm_s + fp4.exposed_comm_s - mx8.exposed_comm_s,
              1e-9 * fp4.step_s);
  EXPECT_GT(want, 0.0);
}

TEST(PlanTime, LowPrecisionIsFasterAndCommunicationCosts) {
  PlanInput in = input("llama3-8b", 1, 8192, Checkpointing::kFull, "full", 8, 1, "bf16");
  GpuSpec b200 = find_gpu("b200");
  TimeBreakdown bf16 = plan_time(in, b200);
  in.recipe = "mxfp8";
  TimeBreakdown fp8 = plan_time(in, b200);
  in.recipe = "nvfp4";
  TimeBreakdown fp4 = plan_time(in, b200);
  EXPECT_GT(fp8.tokens_per_s, bf16.tokens_per_s);
  EXPECT_GT(fp4.tokens_per_s, fp8.tokens_per_s);
  EXPECT_GT(bf16.mfu, 0.3);
  EXPECT_LT(bf16.mfu, 0.8);
  in.recipe = "bf16";
  in.nodes = 4;  // the shard group spans nodes: EFA instead of NVLink
  TimeBreakdown multi = plan_time(in, b200);
  EXPECT_GT(multi.comm_s, bf16.comm_s);
}

// precision.fp8_attention, by the formulas of docs/plan.md: llama3-8b's head dim is 128, so the
// bf16 attention runs at 0.5 x the bf16 dense rate (0.38 at head dim 64, linear between); the
// covered blocks' FP8 attention at 1.6 x that, the high-precision blocks' at it; per covered block
// and token the FP8 attention's own passes (2-byte activations, at 0.4 of HBM bandwidth): forward the amaxes of q, k, v
// (2 bytes each), their casts (2 in, 1 out) and O's decode (1 in, 2 out); backward the amaxes of
// q, k, v, dO, the casts of q, k, v, O, dO and the decodes of dQ, dK, dV; the recomputed
// forward once more under full checkpointing.
TEST(PlanTime, Fp8AttentionAtItsRateWithItsCasts) {
  PlanInput in = input("llama3-8b", 2, 8192, Checkpointing::kFull, "full", 8, 1, "fp8-delayed");
  in.high_precision_first = 1;
  in.high_precision_last = 2;
  const mx::ModelConfig& c = in.model;
  const GpuSpec h200 = find_gpu("h200");
  const TimeBreakdown off = plan_time(in, h200);
  in.fp8_attention = true;
  const TimeBreakdown on = plan_time(in, h200);
  const int64_t L = c.num_hidden_layers, covered = L - 3;
  EXPECT_EQ(on.fp8_attention_blocks, covered);
  EXPECT_EQ(off.fp8_attention_blocks, 0);
  const double per_block = attention_forward_flops(c, 2, 8192) * (1.0 + 2.5 + 1.0);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(attention_efficiency(64), 0.38);
  EXPECT_DOUBLE_EQ(attention_efficiency(32), 0.38);
  EXPECT_DOUBLE_EQ(attention_efficiency(96), 0.44);
  EXPECT_DOUBLE_EQ(attention_efficiency(256), 0.5);
  EXPECT_NEAR(off.attention_s, double(L) * per_block / (0.5 * h200.bf16_flops),
              1e-9 * off.attention_s);
  const double want = double(covered) * per_block / (1.6 * 0.5 * h200.bf16_flops) +
                      3.0 * per_block / (0.5 * h200.bf16_flops);
  EXPECT_NEAR(on.attention_s, want, 1e-9 * want);
  const double Q = double(c.q_dim()), K = double(c.kv_dim());
  const double fwd = 2 * (Q + 2 * K) + 3 * (Q + 2 * K) + 3 * Q;
  const double bwd = 2 * (2 * Q + 2 * K) + 3 * (3 * Q + 2 * K) + 3 * (Q + 2 * K);
  const double bytes = double(covered) * 2.0 * 8192 * (2 * fwd + bwd);
  const double bw = 0.4 * h200.hbm_bytes_per_s;
  EXPECT_NEAR(on.memory_bound_s - off.memory_bound_s, bytes / bw, 1e-6 * bytes / bw);
  EXPECT_EQ(on.gemm_s, off.gemm_s);
  EXPECT_GT(on.tokens_per_s, off.tokens_per_s);
  // recipe bf16: its Linears are bf16 whatever the blocks, the attention still FP8 in the
  // blocks outside high_precision_first / last
  in.recipe = "bf16";
  EXPECT_EQ(plan_time(in, h200).fp8_attention_blocks, covered);
  // recipe fp32 (the CPU engine's): no FP8 attention; the CPU twin is slower than the kernel
  const GpuSpec cpu = fake_cpu();
  in.recipe = "fp32";
  EXPECT_EQ(plan_time(in, cpu).fp8_attention_blocks, 0);
  in.recipe = "fp8-current";
  const TimeBreakdown twin = plan_time(in, cpu);
  in.fp8_attention = false;
  const TimeBreakdown plain = plan_time(in, cpu);
  EXPECT_EQ(twin.fp8_attention_blocks, covered);
  EXPECT_NEAR(twin.attention_s - plain.attention_s,
              double(covered) * per_block / (0.3 * 1e11) * (1.0 / 0.4 - 1.0),
              1e-9 * twin.attention_s);
  EXPECT_EQ(twin.memory_bound_s, plain.memory_bound_s);
}

TEST(PlanTime, Fp8HeadAtThePerTensorFp8RateWithItsCasts) {
  // precision.fp8_head (docs/plan.md): the head's three GEMMs at the per-tensor FP8 rate (0.65
  // of the FP8 peak) instead of bf16's (0.72 of the bf16 peak), both times the tokens'
  // saturation n / (n + 128); plus per micro-batch W's amax and casts (10 bytes an element),
  // h's (10) and the logits gradient's codes and their transpose (3) at 0.4 of HBM bandwidth.
  // precision.fp8_head_dgrad = bf16 (the default): the data gradient's GEMM, a third, stays at
  // the bf16 rate; W's codes row-major only plus its bf16 copy (15), the gradient's bf16 copy
  // beside its codes (5).
  PlanInput in = input("llama3.2-1b", 2, 8192, Checkpointing::kNone, "full", 8, 1, "fp8-delayed");
  const mx::ModelConfig& c = in.model;
  const GpuSpec h200 = find_gpu("h200");
  const TimeBreakdown off = plan_time(in, h200);
  in.fp8_head = true;
  const TimeBreakdown hybrid = plan_time(in, h200);
  in.fp8_head_dgrad = true;
  const TimeBreakdown on = plan_time(in, h200);
  EXPECT_FALSE(off.fp8_head);
  EXPECT_TRUE(on.fp8_head);
  const double n = 2.0 * 8192, V = double(c.vocab_size), C = double(c.hidden_size);
  const double sat = n / (n + 128), head = 2.0 * n * V * C * 3.0;
  const double saved = head / (0.72 * h200.bf16_flops * sat) - head / (0.65 * h200.fp8_flops * sat);
  EXPECT_NEAR(off.gemm_s - on.gemm_s, saved, 1e-9 * saved);
  const double bw = 0.4 * h200.hbm_bytes_per_s;
  const double casts = (10.0 * V * C + 10.0 * n * C + 3.0 * n * V) / bw;
  EXPECT_NEAR(on.memory_bound_s - off.memory_bound_s, casts, 1e-9 * casts);
  EXPECT_GT(on.tokens_per_s, off.tokens_per_s);
  EXPECT_EQ(on.attention_s, off.attention_s);
  EXPECT_TRUE(hybrid.fp8_head);
  EXPECT_NEAR(off.gemm_s - hybrid.gemm_s, saved * 2.0 / 3.0, 1e-9 * saved);
  const double hybrid_casts = (15.0 * V * C + 10.0 * n * C + 5.0 * n * V) / bw;
  EXPECT_NEAR(hybrid.memory_bound_s - off.memory_bound_s, hybrid_casts, 1e-9 * hybrid_casts);
  EXPECT_GT(hybrid.tokens_per_s, off.tokens_per_s);
  EXPECT_LT(hybrid.tokens_per_s, on.tokens_per_s);
  // recipe fp32: no FP8 head (the config refuses it; the planner's candidates may meet it)
  in.recipe = "fp32";
  EXPECT_FALSE(plan_time(in, h200).fp8_head);
  // the CPU twin: fp32 GEMMs as before, plus its rounding passes over W, h and the gradient
  const GpuSpec cpu = fake_cpu();
  in.recipe = "fp8-current";
  const TimeBreakdown twin = plan_time(in, cpu);
  in.fp8_head_dgrad = false;  // and the bf16 roundings of W and the gradient for dh
  const TimeBreakdown twin_hybrid = plan_time(in, cpu);
  in.fp8_head = false;
  const TimeBreakdown plain = plan_time(in, cpu);
  EXPECT_TRUE(twin.fp8_head);
  EXPECT_EQ(twin.gemm_s, plain.gemm_s);
  EXPECT_NEAR(twin_hybrid.gemm_s, plain.gemm_s, 1e-12 * plain.gemm_s);
  const double rounding = 12.0 * (V * C + n * C + n * V) / cpu.hbm_bytes_per_s;
  EXPECT_NEAR(twin.memory_bound_s - plain.memory_bound_s, rounding, 1e-9 * rounding);
  const double rounding_hybrid = 12.0 * (2 * V * C + n * C + 2 * n * V) / cpu.hbm_bytes_per_s;
  EXPECT_NEAR(twin_hybrid.memory_bound_s - plain.memory_bound_s, rounding_hybrid,
              1e-9 * rounding_hybrid);
}

// The calibration (docs/plan.md): the model's tokens/s for the shape the H200 ran, against
// what that H200 measured (bench/RESULTS.md, "sixth H200 run", 2026-12-04: Llama-3.2-1B, one
// GPU, 2 x 8192 tokens a step, no checkpointing). The constants came from that run's and the
// fifth's per-op profiles (GEMM, attention, cast and memory-bound times), not from these
// totals, so the totals check that the parts add up; and the model ranks the recipes as the
// GPU did.
TEST(PlanTime, MatchesTheH200Runs) {
  const GpuSpec h200 = find_gpu("h200");
  const std::pair<const char*, double> measured[] = {
      {"bf16", 50210}, {"fp8-delayed", 55950}, {"fp8-current", 54605}, {"fp8-block", 38450}};
  std::vector<double> modelled;
  for (const auto& [recipe, tok_s] : measured) {
    PlanInput in = input("llama3.2-1b", 2, 8192, Checkpointing::kNone, "full", 1, 1, recipe);
    const double t = plan_time(in, h200).tokens_per_s;
    EXPECT_NEAR(t / tok_s, 1.0, 0.06) << recipe << ": modelled " << t << " tok/s";
    EXPECT_TRUE(recipe_model(recipe).calibrated) << recipe;
    modelled.push_back(t);
  }
  EXPECT_GT(modelled[1], modelled[2]);  // fp8-delayed > fp8-current > bf16 > fp8-block
  EXPECT_GT(modelled[2], modelled[0]);
  EXPECT_GT(modelled[0], modelled[3]);
  EXPECT_FALSE(recipe_model("mxfp8").calibrated);
  EXPECT_FALSE(recipe_model("nvfp4").calibrated);
}

TEST(PlanCatalogue, NamesAndErrors) {
  GpuSpec h100 = find_gpu("h100");
  EXPECT_DOUBLE_EQ(h100.memory_bytes, 80e9);
  EXPECT_DOUBLE_EQ(h100.bf16_flops, 989.4e12);
  EXPECT_DOUBLE_EQ(h100.fp8_flops, 1978.9e12);
  EXPECT_EQ(h100.fp4_flops, 0);
  EXPECT_DOUBLE_EQ(find_gpu("b200").memory_bytes, 180e9);
  EXPECT_DOUBLE_EQ(find_gpu("b300").memory_bytes, 268e9);
  EXPECT_EQ(find_gpu("b300").instance, "ml.p6-b300.48xlarge");
  EXPECT_THROW(find_gpu("a100"), mx::UserError);
  EXPECT_THROW(recipe_model("fp6"), mx::UserError);
  EXPECT_FALSE(recipe_supported("nvfp4", h100));
  EXPECT_TRUE(recipe_supported("fp8-current", h100));
  EXPECT_TRUE(recipe_supported("nvfp4", find_gpu("b300")));
  EXPECT_GT(cpu_memory_total_bytes(), 0);
}

TEST(PlanRecommend, FindsAFittingConfigWithReasons) {
  PlanInput in = input("llama3-8b", 8, 8192, Checkpointing::kNone, "full", 8, 1, "bf16");
  Recommendation r = recommend(in, find_gpu("h100"), {"bf16"});
  ASSERT_TRUE(r.found);
  EXPECT_TRUE(r.best.fits);
  EXPECT_EQ(r.best.input.micro_batch * r.best.input.grad_accum, 8);  // global batch kept
  EXPECT_FALSE(r.reasons.empty());
  // micro_batch 8 without checkpointing needs ~8 x 36 GiB of activations: not what it picks.
  EXPECT_FALSE(r.best.input.micro_batch == 8 && r.best.input.checkpointing == Checkpointing::kNone);
  bool explains = false;
  for (auto& s : r.reasons) explains |= s.find("needs") != std::string::npos;
  EXPECT_TRUE(explains);
  // 64b on one H100 can not fit at all.
  PlanInput big = input("64b", 1, 8192, Checkpointing::kFull, "full", 1, 1, "bf16");
  Recommendation none = recommend(big, find_gpu("h100"), {"bf16"});
  EXPECT_FALSE(none.found);
  EXPECT_FALSE(none.best.fits);
}

}  // namespace
