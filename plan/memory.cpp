#include "plan/memory.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "plan/recipe.h"
#include "precision/recipe.h"

namespace mx::plan {

bool plan_high_precision_bf16(const PlanInput& in) {
  const Recipe r = parse_recipe(in.recipe);
  return r != Recipe::kFp32 && high_precision_bf16(r, in.high_precision);
}

bool plan_bf16_activations(const PlanInput& in, const std::string& recipe,
                           const std::string& device) {
  const Recipe r = parse_recipe(recipe);
  return r != Recipe::kFp32 && bf16_activations(r, in.activations, device);
}

ActivationDtypes cpu_dtypes() { return ActivationDtypes{}; }

ActivationDtypes gpu_dtypes() {
  ActivationDtypes d;
  d.act = 2;
  d.stat = 4;
  d.logits = 4;
  d.attention_workspace = true;
  d.device = true;
  return d;
}

namespace {

// The engine's tracker and arenas, without memory: the same 64-byte rounding, mark/release.
struct Tracker {
  int64_t current = 0, peak = 0;
  int64_t saved_at_peak = 0, scratch_at_peak = 0;
  std::string where;
  const std::string* phase = nullptr;
  int64_t* saved_used = nullptr;
  int64_t* scratch_used = nullptr;
  void add(int64_t n) {
    current += n;
    if (current > peak) {
      peak = current;
      saved_at_peak = *saved_used;
      scratch_at_peak = *scratch_used;
      where = *phase;
    }
  }
};

struct SimArena {
  Tracker* t;
  int64_t used = 0;
  void alloc(int64_t bytes) {
    int64_t size = int64_t(Arena::round_up(size_t(bytes)));
    used += size;
    t->add(size);
  }
  int64_t mark() const { return used; }
  void release(int64_t m) {
    t->current -= used - m;
    used = m;
  }
};

// Mirrors model/llama.cpp. Every allocation there has a line here, in the same order; a
// change to the model's allocations must be made here too (tests/python/test_plan.py compares
// against the engine's measured peak). The model's bf16 path (LlamaModel::bf16_path) has no
// lines here: it needs native bf16 GEMMs, which the CPU has only under the test knob
// MXTRAIN_TEST_BF16_GEMM; on CUDA the arenas are activation_bytes' bounds, which cover it.
class Replay {
 public:
  Replay(const ModelConfig& c, int64_t B, int64_t T, Checkpointing policy,
         const ActivationDtypes& dt)
      : c_(c), B_(B), T_(T), N_(B * T), policy_(policy), dt_(dt) {
    if (!dt.emulated_recipe.empty() && dt.emulated_recipe != "fp32") {
      recipe_ = std::make_unique<LinearRecipe>(parse_recipe(dt.emulated_recipe),
                                               c.num_hidden_layers, dt.high_precision_first,
                                               dt.high_precision_last, 0, 0);
      recipe_->set_high_precision_bf16(dt.high_precision_bf16);
    }
    saved_.t = &tr_;
    scratch_.t = &tr_;
    tr_.phase = &phase_;
    tr_.saved_used = &saved_.used;
    tr_.scratch_used = &scratch_.used;
  }

  ActivationPeak run(bool training) {
    forward(training ? policy_ : Checkpointing::kFull, training);
    return ActivationPeak{tr_.peak, tr_.saved_at_peak, tr_.scratch_at_peak, tr_.where};
  }

 private:
  // BlockSizes::keeps
  static bool keeps(Checkpointing p, bool cheap) {
    if (p == Checkpointing::kNone) return true;
    if (p == Checkpointing::kSelective) return !cheap;
    return false;
  }
  int64_t act(int64_t n) const { return n * dt_.act; }
  int64_t stat(int64_t n) const { return n * dt_.stat; }

  // LlamaModel::linear_fwd / linear_bwd of block layer_: the recipe's operand copies (or, in a
  // high-precision block under high_precision = bf16, the rounded ones, in the same pattern
  // without the Hadamard case) live in scratch only while the GEMM runs.
  bool quantized() const {
    return recipe_ && (recipe_->active(layer_) || recipe_->high_precision_bf16());
  }
  void linear_fwd(int64_t in, int64_t out) {
    if (!quantized()) return;
    const int64_t m = scratch_.mark();
    scratch_.alloc(4 * N_ * in);    // xq
    scratch_.alloc(4 * out * in);   // wq
    scratch_.release(m);
  }
  void linear_bwd(int64_t in, int64_t out) {
    if (!quantized()) return;
    const int64_t m = scratch_.mark();
    scratch_.alloc(4 * N_ * out);   // dyq (dgrad)
    scratch_.alloc(4 * out * in);   // wq
    scratch_.release(m);
    if (recipe_->active(layer_) && recipe_->hadamard_wgrad(N_)) {
      scratch_.alloc(4 * out * N_);  // dyt
      scratch_.alloc(4 * in * N_);   // xt
      scratch_.alloc(4 * out * N_);  // dyq
      scratch_.alloc(4 * in * N_);   // xq
    } else {
      scratch_.alloc(4 * N_ * out);  // dyq (wgrad)
      scratch_.alloc(4 * N_ * in);   // xq
    }
    scratch_.release(m);
  }

  void block_forward(Checkpointing p) {
    const int64_t N = N_, C = c_.hidden_size, I = c_.intermediate_size;
    auto keep = [&](bool cheap, int64_t bytes) {
      if (keeps(p, cheap)) saved_.alloc(bytes);
      else scratch_.alloc(bytes);
    };
    // A tensor precision.activations = bf16 keeps as bf16 codes (n elements).
    auto keep_act = [&](bool cheap, int64_t n) {
      if (cheap && dt_.fp8_xt != XtCodes::kNone && keeps(p, cheap)) {
        saved_.alloc(n + int64_t(fp8_xt_scale_bytes(n, xt_blocks(dt_.fp8_xt))));  // x^T's codes
        scratch_.alloc(act(n));  // the codes the forward's ops read
        return;
      }
      if (!keeps(p, cheap) || !dt_.bf16_activations) return keep(cheap, act(n));
      saved_.alloc(2 * n);    // the kept bf16 copy
      scratch_.alloc(act(n));  // the fp32 working copy
    };
    keep_act(true, N * C);                                 // h1
    keep(true, stat(N));                                   // rstd1
    keep_act(false, N * c_.q_dim());                       // q
    keep_act(false, N * c_.kv_dim());                      // k
    keep_act(false, N * c_.kv_dim());                      // v
    linear_fwd(C, c_.q_dim());                             // q, k, v projections
    linear_fwd(C, c_.kv_dim());
    linear_fwd(C, c_.kv_dim());
    keep_act(false, N * c_.q_dim());                       // o
    keep(false, stat(B_ * c_.num_attention_heads * T_));   // lse
    keep(false, act(N * C));                               // x_mid
    scratch_.alloc(act(N * C));                            // proj
    linear_fwd(c_.q_dim(), C);                             // o_proj
    keep_act(true, N * C);                                 // h2
    keep(true, stat(N));                                   // rstd2
    keep_act(false, N * I);                                // g
    keep_act(false, N * I);                                // u
    linear_fwd(C, I);                                      // gate, up
    linear_fwd(C, I);
    keep_act(true, N * I);                                 // s
    scratch_.alloc(act(N * C));                            // down
    linear_fwd(I, C);                                      // down_proj
  }

  void block_backward(int64_t layer) {
    const int64_t N = N_, C = c_.hidden_size, I = c_.intermediate_size;
    phase_ = str("backward block ", layer, " recompute");
    if (dt_.bf16_activations) {  // the kept bf16 copies widened: h1, q, k, v, o, h2, g, u, s
      const bool cheap = keeps(policy_, true), gemm = keeps(policy_, false);
      const int64_t Q = c_.q_dim(), K = c_.kv_dim();
      const std::pair<bool, int64_t> tensors[] = {{cheap, N * C}, {gemm, N * Q}, {gemm, N * K},
                                                  {gemm, N * K},  {gemm, N * Q}, {cheap, N * C},
                                                  {gemm, N * I},  {gemm, N * I}, {cheap, N * I}};
      for (const auto& [kept, n] : tensors)
        if (kept) scratch_.alloc(act(n));
    }
    if (policy_ == Checkpointing::kFull) {
      scratch_.alloc(act(N * C));  // y
      block_forward(Checkpointing::kFull);
    } else if (policy_ == Checkpointing::kSelective) {
      scratch_.alloc(act(N * C));  // h1
      scratch_.alloc(stat(N));     // rstd1
      scratch_.alloc(act(N * C));  // h2
      scratch_.alloc(stat(N));     // rstd2
      scratch_.alloc(act(N * I));  // s
    }
    phase_ = str("backward block ", layer, " mlp");
    {
      int64_t m = scratch_.mark();
      scratch_.alloc(act(N * I));  // dg
      scratch_.alloc(act(N * I));  // du
      scratch_.alloc(act(N * C));  // dh2
      linear_bwd(I, C);            // down
      linear_bwd(C, I);            // gate
      linear_bwd(C, I);            // up
      scratch_.release(m);
    }
    phase_ = str("backward block ", layer, " attention");
    {
      int64_t m = scratch_.mark();
      scratch_.alloc(act(N * c_.q_dim()));   // d_o
      scratch_.alloc(act(N * c_.q_dim()));   // dq
      scratch_.alloc(act(N * c_.kv_dim()));  // dk
      scratch_.alloc(act(N * c_.kv_dim()));  // dv
      scratch_.alloc(act(N * C));            // dh1
      linear_bwd(c_.q_dim(), C);             // o
      linear_bwd(C, c_.q_dim());             // q
      linear_bwd(C, c_.kv_dim());            // k
      linear_bwd(C, c_.kv_dim());            // v
      if (dt_.attention_workspace) {
        int64_t w = scratch_.mark();
        scratch_.alloc(4 * N * c_.q_dim());                        // dQ accumulator, fp32
        scratch_.alloc(4 * B_ * c_.num_attention_heads * T_);      // rowsum(dO * O)
        scratch_.release(w);
      }
      scratch_.release(m);
    }
  }

  void forward(Checkpointing policy, bool grads) {
    const int64_t N = N_, C = c_.hidden_size, V = c_.vocab_size, L = c_.num_hidden_layers;
    phase_ = "forward";
    const int64_t saved_start = saved_.mark(), scratch_start = scratch_.mark();
    saved_.alloc(4 * N);                    // inputs (int32)
    saved_.alloc(4 * N);                    // targets
    saved_.alloc(4 * (T_ * c_.head_dim / 2));  // rope cos (fp32)
    saved_.alloc(4 * (T_ * c_.head_dim / 2));  // rope sin
    std::vector<int64_t> marks(L);
    saved_.alloc(act(N * C));  // x_0
    for (int64_t l = 0; l < L; ++l) {
      phase_ = str("forward block ", l);
      layer_ = l;
      marks[l] = saved_.mark();
      saved_.alloc(act(N * C));  // x_{l+1}
      int64_t sm = scratch_.mark();
      block_forward(policy);
      scratch_.release(sm);
    }
    phase_ = "head";
    if (grads) scratch_.alloc(act(N * C));  // dresid
    int64_t head_mark = scratch_.mark();
    scratch_.alloc(act(N * C));  // hf
    scratch_.alloc(stat(N));     // rstdf
    if (dt_.fp8_head || dt_.high_precision_bf16)  // logits + the operands' copies (fp32 logits)
      scratch_.alloc(4 * head_workspace_floats(head_chunk_rows(c_, N, dt_.device), C, V,
                                               !dt_.fp8_head        ? HeadOperands::kBf16
                                               : dt_.fp8_head_dgrad ? HeadOperands::kFp8
                                                                    : HeadOperands::kFp8Bf16Dgrad));
    else
      scratch_.alloc(dt_.logits * head_chunk_rows(c_, N, dt_.device) * V);  // logits workspace
    if (grads) scratch_.alloc(act(N * C));  // dh
    scratch_.release(head_mark);
    if (grads) {
      for (int64_t l = L - 1; l >= 0; --l) {
        int64_t sm = scratch_.mark();
        layer_ = l;
        block_backward(l);
        scratch_.release(sm);
        saved_.release(marks[l]);
      }
    }
    saved_.release(saved_start);
    scratch_.release(scratch_start);
  }

  const ModelConfig& c_;
  int64_t B_, T_, N_;
  Checkpointing policy_;
  ActivationDtypes dt_;
  std::unique_ptr<LinearRecipe> recipe_;  // null: fp32 Linears
  int64_t layer_ = 0;
  Tracker tr_;
  SimArena saved_, scratch_;
  std::string phase_;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t rounded(int64_t bytes) { return int64_t(Arena::round_up(size_t(bytes))); }

}  // namespace

ActivationPeak simulate_activations(const ModelConfig& c, int64_t B, int64_t T,
                                    Checkpointing policy, const ActivationDtypes& dt,
                                    bool training) {
  Replay r(c, B, T, policy, dt);
  return r.run(training);
}

int64_t shard_count(const PlanInput& in) {
  const int64_t world = in.world_size();
  if (in.sharding == "none") return 1;
  if (in.sharding == "full" || in.sharding == "grad-op") return world;
  if (in.sharding == "hybrid") {
    // 0 is every rank, as the engine reads it (parallel/fsdp_sizes.cpp fsdp_shard_size): the
    // planner took it for the GPUs of a node and predicted another run than train makes.
    int64_t g = in.shard_group > 0 ? in.shard_group : world;
    MX_REQUIRE(g <= world && world % g == 0, "parallel.shard_group (", g,
               ") must divide the number of ranks (", world, ")");
    return g;
  }
  throw UserError(str("parallel.sharding must be full, grad-op, none or hybrid (got '",
                      in.sharding, "')"));
}

Sharding sharding_of(const PlanInput& in) { return parse_sharding(in.sharding); }

int64_t sharded_numel(const ParamLayout& layout, int64_t shards) {
  if (shards <= 1) return layout.total_numel();
  int64_t n = 0;
  for (const ParamUnit& u : layout.units()) n += ceil_div(u.numel, shards);
  return n;
}

int64_t largest_unit_numel(const ParamLayout& layout) {
  int64_t n = 0;
  for (const ParamUnit& u : layout.units()) n = std::max(n, u.numel);
  return n;
}

MemoryBreakdown plan_memory(const PlanInput& in, const GpuSpec& gpu) {
  const ModelConfig& c = in.model;
  ParamLayout layout(c);
  MemoryBreakdown m;
  m.shards = shard_count(in);
  const int64_t B = in.micro_batch, T = in.seq_len;

  if (gpu.is_cpu) {
    // train/trainer.cpp: the Engine's batch and activation arenas (its own state arenas are
    // off), then Fsdp's arenas (the fp32 state shards; with S > 1 the gathered-weight slots,
    // the gradient slots and the reduce-scatter output), sized by the same
    // fsdp_buffer_sizes Fsdp's constructor calls. All of them are allocated before the first
    // step and stay, so the peak is their sum plus the activation replay's peak.
    m.fsdp = fsdp_buffer_sizes(layout, int(m.shards), sharding_of(in));
    m.master_weights = m.gradients = m.adam_m = m.adam_v = int64_t(m.fsdp.state_bytes);
    m.compute_weights = int64_t(m.fsdp.gathered_bytes);
    m.unsharded_gradient = int64_t(m.fsdp.unit_grad_bytes);
    m.reduce_scatter = int64_t(m.fsdp.reduce_scatter_bytes);
    m.batch_tokens = rounded(4 * B * (T + 1));
    ActivationDtypes dt = cpu_dtypes();
    dt.emulated_recipe = in.recipe;
    dt.high_precision_first = in.high_precision_first;
    dt.high_precision_last = in.high_precision_last;
    dt.high_precision_bf16 = plan_high_precision_bf16(in);
    dt.fp8_head = in.fp8_head && in.recipe != "fp32";
    dt.fp8_head_dgrad = in.fp8_head_dgrad;
    dt.bf16_activations = plan_bf16_activations(in, in.recipe, "cpu");
    ActivationPeak train = simulate_activations(c, B, T, in.checkpointing, dt, true);
    ActivationPeak peak = train;
    if (in.eval) {
      ActivationPeak ev = simulate_activations(c, B, T, in.checkpointing, dt, false);
      if (ev.peak > peak.peak) peak = ev;
    }
    m.activations = peak.peak;
    m.activations_saved = peak.saved_at_peak;
    m.activations_scratch = peak.scratch_at_peak;
    m.activation_peak_at = peak.where;
    m.exact = true;
    m.total = m.master_weights + m.gradients + m.adam_m + m.adam_v + m.compute_weights +
              m.unsharded_gradient + m.reduce_scatter + m.batch_tokens + m.activations;
    m.total_max_rank = m.total;  // equal shards (padding included) on every rank
    return m;
  }

  // The CUDA engine's activations keep x^T's FP8 codes of the FP8 Linears' inputs
  // (model/llama.h): its arenas and the replay below
  const XtCodes fp8_xt = fp8_xt_only_applies(
      c, B * T, in.engine_recipe(), plan_bf16_activations(in, in.engine_recipe(), "cuda"),
      in.checkpointing);
  // GPU: this build's CUDA engine, allocation by allocation (train/trainer.cpp, Engine, Fsdp,
  // LlamaModel's amax slots; CudaEngineBytes says what is left out of the model below).
  {
    const std::string& rc = in.engine_recipe();
    const bool bf16_acts = plan_bf16_activations(in, rc, "cuda");
    const Recipe r = parse_recipe(rc);
    const bool path_only =  // the CUDA backend always has native bf16 GEMMs
        r == Recipe::kBf16 &&
        bf16_path_only(r, bf16_acts, high_precision_bf16(r, in.high_precision),
                       in.high_precision_first, in.high_precision_last, in.stats_every);
    // parallel.gather_dtype as the trainer resolves it (bf16 where it cannot apply: the
    // trainer refuses that run; here the recipe candidates other than bf16 just gather fp32)
    const bool bf16_blocks = path_only && in.gather_dtype != "fp32";
    const FsdpBufferSizes z =
        fsdp_buffer_sizes(layout, int(m.shards), sharding_of(in), bf16_blocks);
    m.engine.fsdp = int64_t(z.total_bytes());
    const ActivationBytes cap =
        activation_bytes(c, B, T, in.checkpointing, rc != "fp32", true, bf16_acts, path_only,
                         fp8_xt);
    m.engine.activations =
        int64_t(Arena::round_up(cap.saved)) + int64_t(Arena::round_up(cap.scratch));
    const int64_t lp_blocks = std::max<int64_t>(
        0, c.num_hidden_layers - in.high_precision_first - in.high_precision_last);
    if (rc == "fp8-delayed" && lp_blocks > 0)  // allocated on the first FP8 tensor-core Linear
      m.engine.amax_slots = 4 * 7 * 6 * c.num_hidden_layers;
    // fp8-current's and nvfp4's two floats for the RMSNorms' amaxes (LlamaModel::norm_amax:
    // h1's and h2's, the residual gradient's), allocated on the first forward whose Linears
    // read h1's or h2's codes on tensor cores
    if ((rc == "fp8-current" || rc == "nvfp4") && lp_blocks > 0 && bf16_acts &&
        fp8_norm_amax_enabled())
      m.engine.amax_slots += 8;
    // fp8-current's and nvfp4's weights' amaxes, a float per block and Linear
    // (LlamaModel::weight_amax), allocated on the first FP8 / FP4 tensor-core Linear
    if ((rc == "fp8-current" || rc == "nvfp4") && lp_blocks > 0 && fp8_weight_amax_enabled())
      m.engine.amax_slots += 4 * 7 * c.num_hidden_layers;
    m.engine.backend_scratch = int64_t(cuda_scratch_bytes());
    m.engine.allowances = kCudaContextBytes + (in.world_size() > 1 ? kNcclBufferBytes : 0);
  }

  // GPU (modelled).
  const RecipeModel r = recipe_model(in.recipe);
  const int64_t S = m.shards;
  const int64_t shard = sharded_numel(layout, S);
  const int64_t total = layout.total_numel();
  const int64_t unit = largest_unit_numel(layout);
  const int64_t compute_bytes = 2;  // bf16
  m.master_weights = 4 * shard;
  m.gradients = 4 * shard;
  m.adam_m = 4 * shard;
  m.adam_v = 4 * shard;
  // Parameters whose compute-dtype (and quantized) copies are live at the activation peak.
  int64_t live_params = 0;
  if (in.sharding == "full" || in.sharding == "hybrid") {
    live_params = std::min<int64_t>(2 * unit, total);  // the unit in use + the prefetched one
  } else {
    live_params = total;  // grad-op: gathered weights kept through backward; none: replicated
  }
  m.compute_weights = compute_bytes * live_params;
  if (in.sharding != "none" && S > 1) m.unsharded_gradient = 4 * unit;  // fp32 reduce-scatter input
  if (in.recipe != "bf16") {
    // High-precision first/last blocks and the head keep no quantized copy; approximate by
    // scaling the live parameters with the fraction of quantized Linear parameters.
    const double L = double(c.num_hidden_layers);
    const double hp = double(std::min<int64_t>(in.high_precision_first + in.high_precision_last,
                                               c.num_hidden_layers));
    const double frac = (L - hp) / L;
    m.quantized_weights =
        int64_t(r.quantized_weight_bytes_per_param * double(live_params) * frac);
    m.recipe_state = int64_t(r.scaling_state_bytes_per_linear * 7.0 * (L - hp));
  }
  ActivationDtypes gpu_dt = gpu_dtypes();
  gpu_dt.high_precision_bf16 = plan_high_precision_bf16(in);
  gpu_dt.fp8_head = in.fp8_head && in.recipe != "fp32";
  gpu_dt.fp8_head_dgrad = in.fp8_head_dgrad;
  gpu_dt.fp8_xt = fp8_xt;
  ActivationPeak train = simulate_activations(c, B, T, in.checkpointing, gpu_dt, true);
  m.activations = train.peak;
  m.activations_saved = train.saved_at_peak;
  m.activations_scratch = train.scratch_at_peak;
  m.activation_peak_at = train.where;
  m.batch_tokens = rounded(4 * B * (T + 1));
  m.library_workspace = kCublasLtWorkspaceBytes;
  m.nccl_buffers = in.world_size() > 1 ? kNcclBufferBytes : 0;
  m.cuda_context = kCudaContextBytes;
  m.fragmentation = int64_t(kFragmentation * double(m.activations + m.compute_weights +
                                                    m.unsharded_gradient + m.quantized_weights));
  m.exact = false;
  m.total = m.master_weights + m.gradients + m.adam_m + m.adam_v + m.compute_weights +
            m.unsharded_gradient + m.quantized_weights + m.recipe_state + m.activations +
            m.batch_tokens + m.library_workspace + m.nccl_buffers + m.cuda_context +
            m.fragmentation;
  m.total_max_rank = m.total;
  return m;
}

}  // namespace mx::plan
