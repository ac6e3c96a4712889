// Per-rank memory model.
//
// On the CPU backend with one process it is exact: it replays the allocation sequence of
// model/llama.cpp's forward/backward on the two activation arenas (`saved`, a stack pushed in
// forward and popped in backward; `scratch`, per-op temporaries), with core/arena.h's 64-byte
// rounding, and adds the persistent arenas of train/engine.cpp (fp32 master weights, gradients,
// AdamW m and v, the batch's token ids). The engine's reported peak_mem_bytes is the maximum
// over time of the sum of all arenas, and so is this.
//
// On GPUs the same replay runs with bf16 activations (statistics and logits in fp32) plus what
// a CUDA engine with FSDP holds besides: gathered compute-dtype weights, an unsharded gradient
// unit, the recipe's quantized weight copies, library workspaces, NCCL buffers, the CUDA context
// and a fragmentation allowance. Those parts are predictions (the CUDA engine and FSDP do not
// exist yet); docs/plan.md gives every formula.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/llama.h"
#include "model/params.h"
#include "parallel/fsdp_sizes.h"
#include "plan/gpus.h"

namespace mx::plan {

// The run being planned: the parts of a RunConfig the models read.
struct PlanInput {
  ModelConfig model;  // finalized and validated
  std::string model_name;  // preset name or "custom", for reports
  int64_t micro_batch = 1;
  int64_t seq_len = 1;
  int64_t grad_accum = 1;
  Checkpointing checkpointing = Checkpointing::kNone;
  std::string sharding = "full";  // full | grad-op | none | hybrid
  int64_t shard_group = 0;        // hybrid: ranks per shard group (0: all ranks, as train)
  std::string gather_dtype = "auto";  // parallel.gather_dtype (the engine's FSDP weight slots)
  std::string recipe = "bf16";
  int64_t high_precision_first = 0;
  int64_t high_precision_last = 0;
  std::string high_precision;     // precision.high_precision ("": the recipe's default)
  std::string activations;        // precision.activations ("": the device's default)
  // precision.recipe as configured, when `recipe` is what the GPU model plans instead (fp32 is
  // planned as bf16); "" = recipe. What this build's CUDA engine allocates follows it.
  std::string configured_recipe;
  // The recipe this build's engine runs for this input: configured_recipe, else recipe (a
  // recommendation's candidates clear configured_recipe: taking one means running its recipe).
  const std::string& engine_recipe() const {
    return configured_recipe.empty() ? recipe : configured_recipe;
  }
  // precision.fp8_attention: the attention of the blocks the recipe covers runs in FP8 (the time
  // model's attention rate; on CUDA its codes live in the backend's scratch arena, in groups of
  // sequences when the batch's do not fit, so memory is unchanged).
  bool fp8_attention = false;
  // precision.fp8_head: the head's GEMMs in FP8 (the time model's head rate and casts; memory:
  // the head workspace of its FP8 codes, HeadOperands::kFp8 or kFp8Bf16Dgrad).
  bool fp8_head = false;
  bool fp8_head_dgrad = false;  // precision.fp8_head_dgrad = fp8 (else its dgrad in bf16)
  bool eval = false;              // validation passes run (forward only, full checkpointing)
  int64_t stats_every = 0;        // precision.stats_every (telemetry steps leave the bf16 path)
  // GPUs: `fits` and the recommendation go by what this build's CUDA engine allocates
  // (MemoryBreakdown::engine) instead of the bf16-activation model (plan --memory engine).
  bool engine_memory = false;
  int64_t gpus_per_node = 1;
  int64_t nodes = 1;
  int64_t world_size() const { return gpus_per_node * nodes; }
};

// precision.high_precision for a planned recipe: the recommendation also plans recipes other
// than the configured one, so recipe fp32 plans fp32 whatever the key says (no error here:
// the configured pair was validated with the config).
bool plan_high_precision_bf16(const PlanInput& in);
// precision.activations for `recipe` on `device` ("cpu" or "cuda"), likewise (false under fp32).
bool plan_bf16_activations(const PlanInput& in, const std::string& recipe,
                           const std::string& device);

// Element sizes of the activation replay.
struct ActivationDtypes {
  int64_t act = 4;     // activations and their gradients (fp32 on CPU, bf16 on GPU)
  int64_t stat = 4;    // RMSNorm rstd, attention log-sum-exp
  int64_t logits = 4;  // the head's logits chunk
  // GPU attention backward (FlashAttention-2 style) keeps an fp32 dQ accumulator [B,T,H,D] and
  // the row statistic D = rowsum(dO * O) [B,H,T] while it runs. The CPU kernel keeps per-thread
  // tiles on the heap instead (not in any arena), so this is off there.
  bool attention_workspace = false;
  // Device memory: the head's larger logits chunks (model/llama.h, head_chunk_rows).
  bool device = false;
  // The CPU engine's emulated precision recipe (precision/recipe.h): every Linear of an active
  // block copies its two GEMM operands, quantized and dequantized, into fp32 scratch for the
  // GEMM (NVFP4's weight gradient: both operands transposed and Hadamard-transformed first).
  // Empty or "fp32": no copies. The GPU model counts quantized copies separately instead.
  std::string emulated_recipe;
  int64_t high_precision_first = 0;
  int64_t high_precision_last = 0;
  // precision.high_precision = bf16 under a recipe: the head's workspace holds its operands'
  // bf16 copies (Backend::head_cross_entropy), and on the CPU every Linear of a
  // high-precision block copies its two operands, rounded, into scratch for the GEMM.
  bool high_precision_bf16 = false;
  bool fp8_head = false;  // precision.fp8_head (the head's workspace holds its FP8 codes)
  bool fp8_head_dgrad = false;  // precision.fp8_head_dgrad = fp8 (HeadOperands::kFp8)
  // precision.activations = bf16 on the CPU engine: a kept block tensor (norm outputs, q, k,
  // v, attention output, gate, up, SwiGLU product) is a 2-byte copy in `saved` beside its fp32
  // working copy in scratch, widened into scratch again at the start of the block's backward.
  // (The GPU model's act = 2 describes an engine that keeps everything in bf16 instead.)
  bool bf16_activations = false;
  // The GPU engine keeps x^T's FP8 codes of h1, h2 and the SwiGLU product (1 byte an element
  // and their scales: a 4-byte one, or the block recipes' n / 32 bytes) in place of their bf16
  // copies (model/llama.h, fp8_xt_only_applies); their bf16 codes live in scratch during the
  // block's forward.
  XtCodes fp8_xt = XtCodes::kNone;
};
ActivationDtypes cpu_dtypes();
ActivationDtypes gpu_dtypes();

struct ActivationPeak {
  int64_t peak = 0;              // max over time of saved + scratch
  int64_t saved_at_peak = 0;
  int64_t scratch_at_peak = 0;
  std::string where;             // the phase at the peak ("head", "backward block 31 mlp", ...)
};

// Replays one forward+backward (training = true) or one forward_loss (training = false, which
// the engine always runs with full checkpointing) on [B, T].
ActivationPeak simulate_activations(const ModelConfig& c, int64_t B, int64_t T,
                                    Checkpointing policy, const ActivationDtypes& dt,
                                    bool training);

// Ranks that share one copy of the sharded state: full / grad-op: the world; hybrid: the shard
// group; none: 1. UserError when hybrid's shard_group does not divide the world.
int64_t shard_count(const PlanInput& in);
// Per-rank elements of the flat parameter buffer when every FSDP unit is split into
// `shards` equal parts (each unit padded to a multiple of `shards`).
int64_t sharded_numel(const ParamLayout& layout, int64_t shards);
int64_t largest_unit_numel(const ParamLayout& layout);
// parallel.sharding as the engine's enum (UserError for unknown names).
Sharding sharding_of(const PlanInput& in);

// GPU constants (documented in docs/plan.md).
constexpr int64_t kCublasLtWorkspaceBytes = int64_t(32) << 20;  // cuBLAS docs: 32 MiB on Hopper+
constexpr int64_t kCudaContextBytes = int64_t(1) << 30;         // context + loaded kernels
constexpr int64_t kNcclBufferBytes = int64_t(512) << 20;        // channels x buffers, multi-rank
constexpr double kFragmentation = 0.05;  // of the dynamic part (activations + gathered units)

// What this build's CUDA engine (run.device = cuda) allocates on each GPU, as opposed to the
// model below of an engine with bf16 activations and bf16 gathered units (the GPU terms of
// MemoryBreakdown): the CPU engine's arenas in device memory, each one cudaMalloc of its whole
// capacity at start-up. Activations are fp32 at the capacity activation_bytes() gives them
// (the head's device-sized chunks); FSDP's state, weight and gradient slots are fp32 as
// parallel/fsdp_sizes.h sizes them; fp8-delayed adds its amax slots. Then the backend's own
// scratch arena and the allowances for the CUDA context and NCCL (as below).
struct CudaEngineBytes {
  int64_t fsdp = 0;             // 4 state shards + gathered weights + unit gradients + RS out
  int64_t activations = 0;      // the saved and scratch arenas (capacities)
  int64_t amax_slots = 0;       // fp8-delayed: 4 bytes x 7 Linears x 6 operands per block;
                                // fp8-current, nvfp4: 8 (the RMSNorms' amaxes);
                                // fp8-current, nvfp4: + 4 x 7 x L (the weights' amaxes)
  int64_t backend_scratch = 0;  // cuda_scratch_bytes(): MXTRAIN_CUDA_SCRATCH_MB, 1 GiB
  int64_t allowances = 0;       // CUDA context + NCCL buffers
  // Through Backend::memory(): what the trainer's summary reports as device_mem_bytes.
  int64_t arenas() const { return fsdp + activations + amax_slots; }
  int64_t total() const { return arenas() + backend_scratch + allowances; }
};

struct MemoryBreakdown {
  int64_t master_weights = 0;    // fp32 master shard
  int64_t gradients = 0;         // fp32 gradient shard
  int64_t adam_m = 0;
  int64_t adam_v = 0;
  int64_t compute_weights = 0;   // compute-dtype copies (gathered units / full copy); on CPU
                                 // FSDP's fp32 gathered-weight slots
  int64_t unsharded_gradient = 0;  // full-unit gradients before reduce-scatter (CPU: FSDP's
                                   // gradient slots)
  int64_t reduce_scatter = 0;      // FSDP's reduce-scatter output (one shard of a unit)
  int64_t quantized_weights = 0;   // the recipe's low-precision copies + scales
  int64_t recipe_state = 0;        // scaling state (amax histories)
  int64_t activations = 0;         // peak of saved + scratch (replayed)
  int64_t activations_saved = 0;   // ... of which in the saved stack at that moment
  int64_t activations_scratch = 0;
  std::string activation_peak_at;
  int64_t batch_tokens = 0;        // int32 [B, T+1]
  int64_t library_workspace = 0;   // cuBLASLt
  int64_t nccl_buffers = 0;
  int64_t cuda_context = 0;
  int64_t fragmentation = 0;
  int64_t total = 0;               // rank 0
  int64_t total_max_rank = 0;      // the largest rank (FSDP pads every shard to equal length,
                                   // so on the CPU engine every rank holds the same arenas)
  int64_t shards = 1;              // shard count used for the sharded state
  bool exact = false;              // true: the CPU engine's own accounting, replayed
  FsdpBufferSizes fsdp;            // the FSDP arenas as parallel/fsdp_sizes.h sizes them
  CudaEngineBytes engine;          // GPUs: this build's CUDA engine (zero on the CPU)
};

MemoryBreakdown plan_memory(const PlanInput& in, const GpuSpec& gpu);

}  // namespace mx::plan
