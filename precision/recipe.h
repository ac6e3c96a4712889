// Precision recipes applied to the Linear layers of the transformer blocks (the q/k/v/o
// projections and the three MLP matrices). What a recipe leaves in high precision, the output
// head's GEMMs and the Linears of the blocks named by high_precision_first / _last, runs in
// precision.high_precision: bf16 (the default of every recipe but fp32: operands rounded RNE,
// fp32 sums, as under torch autocast in Transformer Engine and torchtitan runs) or fp32.
// Embeddings, norms, attention, the softmax and the optimizer stay in fp32 (on CUDA, cuDNN's
// attention is bf16). On the CPU backend a recipe is emulated exactly: each operand of
// the forward, data-gradient and weight-gradient GEMMs is quantized as Transformer Engine does
// for that recipe and dequantized, and the GEMM runs in fp32 on the dequantized values.
//
//   bf16         operands rounded to bf16 (RNE)
//   fp8-current  per-tensor current scaling, HYBRID: E4M3 inputs and weights, E5M2 gradients
//   fp8-delayed  per-tensor delayed scaling from an amax history (1024, max), HYBRID
//   fp8-block    E4M3, 1x128 blocks along the reduction dimension (inputs, gradients),
//                128x128 blocks for weights, power-of-two scales (DeepSeek-V3 / TE)
//   mxfp8        E4M3 in 1x32 blocks along each GEMM's reduction dimension, E8M0 scales (TE's
//                round-up rule); rowwise and columnwise copies each from the fp32 tensor
//   nvfp4        E2M1 in 1x16 blocks with E4M3 scales and a per-tensor fp32 scale; 16x16
//                blocks for weights; stochastic rounding for gradients; a 16-point random
//                Hadamard transform on both operands of the weight-gradient GEMM
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "numerics/attention_fp8.h"
#include "numerics/quantize.h"
#include "precision/numerics_stats.h"

namespace mx {

enum class Recipe { kFp32, kBf16, kFp8Current, kFp8Delayed, kFp8Block, kMxfp8, kNvfp4 };
Recipe parse_recipe(const std::string& s);  // UserError for unknown names
// precision.high_precision resolved for a recipe: "" means the default (bf16, or fp32 under
// recipe fp32). True for bf16. UserError for a value other than "", bf16 or fp32, and for bf16
// under recipe fp32 (which computes everything in fp32).
bool high_precision_bf16(Recipe recipe, const std::string& high_precision);
// precision.activations resolved: true when the blocks' activations are kept in bf16 (the
// tensors between a block's ops rounded to bf16 as they are made, and the copies a block keeps
// for its backward stored as bf16, half the bytes; the residual stream, the statistics and all
// gradients stay fp32). "" means the default: bf16 on run.device = cuda under every recipe
// but fp32 (the GPU's "BF16 compute"), fp32 elsewhere. UserError for a value other than "",
// bf16 or fp32, and for bf16 under recipe fp32.
bool bf16_activations(Recipe recipe, const std::string& activations, const std::string& device);
// Every block takes LlamaModel's bf16 path on every step, given a backend with native bf16
// GEMMs (CUDA): recipe bf16 with bf16 activations, no numerics telemetry steps (they take the
// emulated rounding path) and no block left in fp32 (precision.high_precision = fp32 with
// high-precision blocks). Then activation_bytes can size the arenas for that path alone.
bool bf16_path_only(Recipe recipe, bool bf16_activations, bool high_precision_bf16,
                    int64_t hp_first, int64_t hp_last, int64_t stats_every);
// The warning for high-precision blocks (first + last) that cover all `blocks` under a
// recipe that quantizes (fp8-*, mxfp8, nvfp4): then it quantizes no Linear, which the start-up
// line did not say. "" otherwise. `first_last` names the two settings as the user gave them,
// `recipe_given` the recipe (as "precision.recipe = nvfp4" or "--recipe nvfp4").
std::string high_precision_covers_all(Recipe recipe, int64_t first, int64_t last, int64_t blocks,
                                      bool high_precision_bf16, const std::string& first_last,
                                      const std::string& recipe_given);
// parallel.gather_dtype (auto | fp32 | bf16): whether FSDP gathers the blocks as bf16 codes
// (FsdpOptions::bf16_blocks), given path_only = bf16_path_only on a backend with native bf16
// GEMMs. Such a model's bf16 GEMMs round every weight they read to bf16, so gathering the
// rounded weights gives the same values at half the bytes. auto ("" too): exactly then; fp32:
// never; bf16: then, else UserError saying what it needs. UserError for another value.
bool bf16_gathers(const std::string& gather_dtype, bool path_only);
// The same check before the device is known: UserError for a bad value, and for bf16 where the
// configuration (not the device) rules the bf16 path out.
void check_gather_dtype(const std::string& gather_dtype, bool config_path_only);

// dst[cols, rows] = src[rows, cols]^T (operands quantized down their columns go through this).
void transpose(float* dst, const float* src, int64_t rows, int64_t cols);
const char* recipe_name(Recipe r);

// The operand of a Linear's GEMMs being quantized.
enum class LinearOperand : uint8_t {
  kFwdInput, kFwdWeight,      // y = x W^T          (reduction: in)
  kDgradGrad, kDgradWeight,   // dx = dy W          (reduction: out)
  kWgradGrad, kWgradInput,    // dW = dy^T x        (reduction: tokens)
};

class LinearRecipe {
 public:
  // Blocks [0, hp_first) and [num_layers - hp_last, num_layers) stay in fp32.
  LinearRecipe(Recipe recipe, int64_t num_layers, int64_t hp_first, int64_t hp_last,
               uint32_t seed, uint32_t rank);
  Recipe recipe() const { return recipe_; }
  bool active(int64_t layer) const;
  // precision.high_precision = bf16 (see high_precision_bf16()): the head's GEMMs and the
  // inactive blocks' Linears take bf16 operands. Off until set; never on under recipe fp32.
  void set_high_precision_bf16(bool on) { hp_bf16_ = on && recipe_ != Recipe::kFp32; }
  bool high_precision_bf16() const { return hp_bf16_; }
  // precision.fp8_attention: the attention of the blocks the recipe covers runs in FP8
  // (Backend::attention_*_fp8; docs/numerics.md, "FP8 attention"); high-precision blocks keep
  // theirs. Off until set; never on under recipe fp32.
  void set_fp8_attention(bool on) { fp8_attention_ = on && recipe_ != Recipe::kFp32; }
  bool fp8_attention(int64_t layer) const { return fp8_attention_ && active(layer); }
  bool fp8_attention_any() const { return fp8_attention_; }
  // precision.fp8_head: the output head's GEMMs in FP8 (E4M3 h and W, E5M2 logits gradient,
  // per-tensor scales; Backend's HeadOperands::kFp8 / kFp8Bf16Dgrad, docs/numerics.md, "FP8
  // head"), in place of precision.high_precision. Off until set; never on under recipe fp32.
  // fp8_dgrad (precision.fp8_head_dgrad = fp8): the data gradient's GEMM in FP8 too (kFp8);
  // else (bf16, the default) in bf16 (kFp8Bf16Dgrad).
  void set_fp8_head(bool on, bool fp8_dgrad = false) {
    fp8_head_ = on && recipe_ != Recipe::kFp32;
    fp8_head_dgrad_ = fp8_dgrad;
  }
  bool fp8_head() const { return fp8_head_; }
  bool fp8_head_dgrad() const { return fp8_head_dgrad_; }
  void set_step(int64_t step) {
    step_ = uint32_t(step);
    micro_batch_ = 0;
  }
  // The micro-batch of the step (0 .. grad_accum - 1) the next forward-backward is: nvfp4's
  // stochastic rounding draws other numbers for each (docs/numerics.md), so accumulating
  // micro-batches averages its noise as Transformer Engine's fresh draws per call do.
  void set_micro_batch(int64_t m) { micro_batch_ = uint32_t(m); }

  // out[rows, cols] = dequantize(quantize(x)). reduce_along_cols: the GEMM sums over this
  // matrix's columns (blocks run along rows); otherwise over its rows (blocks run down columns).
  void quantize(float* out, const float* x, int64_t rows, int64_t cols, bool reduce_along_cols,
                LinearOperand op, int64_t layer, int linear) ;

  // True when the weight-gradient GEMM takes the random Hadamard transform (NVFP4): both
  // operands are then transformed along the token dimension before quantization.
  bool hadamard_wgrad(int64_t tokens) const {
    return recipe_ == Recipe::kNvfp4 && tokens % 16 == 0;
  }
  uint32_t hadamard_seed(int64_t layer, int linear) const;

  // Per-tensor FP8 (fp8-current, fp8-delayed) on a backend's FP8 Linears
  // (Backend::fp8_linear_*): the format of an operand (HYBRID: E5M2 for gradients, E4M3
  // otherwise) and, for fp8-delayed, the scale the next quantization of (layer, linear, op)
  // uses and the recording of its amax afterwards (held until flush_amaxes, below), so the
  // bookkeeping is the same as on the emulated path.
  bool per_tensor_fp8() const {
    return recipe_ == Recipe::kFp8Current || recipe_ == Recipe::kFp8Delayed;
  }
  static numerics::Format fp8_format(LinearOperand op);
  // fp8-block's blocks for an operand: 128x128 for weights, else 1x128 along the GEMM's
  // reduction (1 x 128 when it runs along the matrix's columns, 128 x 1 when down them).
  static void fp8_block_shape(LinearOperand op, bool reduce_along_cols, int& block_rows,
                              int& block_cols);
  // nvfp4's rounding of an operand: stochastic for gradients (this step's random stream of
  // (layer, linear, op)), RNE otherwise; the same options quantize() uses.
  numerics::RoundingOptions nvfp4_rounding(LinearOperand op, int64_t layer, int linear) const;
  float delayed_scale(int64_t layer, int linear, LinearOperand op);
  void delayed_record(int64_t layer, int linear, LinearOperand op, float amax);

  // fp8-delayed amaxes wait until the end of the pass that measured them (quantize() and
  // delayed_record() hold them; the scale a quantization uses is never moved by its own pass,
  // since a pass quantizes each (layer, linear, operand) once), then flush_amaxes() reduces
  // them over the data-parallel ranks (max) and pushes them into the histories: every rank
  // holds the same scales and histories, as Transformer Engine's amax reduction makes them, so
  // a checkpoint restores them exactly under any sharding and process count. The reduction is
  // a collective: the trainer sets it on multi-process runs, and every rank reaches
  // flush_amaxes() once per forward pass (LlamaModel's forward ends with it) with the same
  // keys. Values go through it in key order; NaN travels as -1 (below every amax), so a rank's
  // NaN is ignored where another rank measured a number, as the history's fmax ignores it.
  // A key quantized again before a flush (no training pass does) records its last amax
  // unreduced first.
  using AmaxReduction = std::function<void(float* amaxes, int64_t n)>;
  void set_amax_reduction(AmaxReduction reduce) { reduce_amax_ = std::move(reduce); }
  void flush_amaxes();

  // A recomputed forward (activation checkpointing) replays the forward it repeats: fp8-delayed
  // quantizes with the scale that forward used and records no amax (Transformer Engine's
  // checkpoint does the same), and telemetry does not count the operands twice. Without it a
  // full recompute quantized with the scale the forward's own amax had already moved and
  // pushed every amax twice: losses diverged from `none` / `selective` after the first step.
  void set_replay(bool on) { replay_ = on; }
  bool replaying() const { return replay_; }
  // set_replay(true) for a scope: a recompute, a validation forward (nothing when r is null).
  class ReplayScope {
   public:
    explicit ReplayScope(LinearRecipe* r) : r_(r) { if (r_) r_->set_replay(true); }
    ~ReplayScope() { if (r_) r_->set_replay(false); }
    ReplayScope(const ReplayScope&) = delete;
    ReplayScope& operator=(const ReplayScope&) = delete;

   private:
    LinearRecipe* r_;
  };

  // fp8-delayed state for checkpoints: every (layer, linear, operand)'s scale and amax
  // history, so that a resumed run quantizes exactly as the uninterrupted one would.
  struct DelayedState {
    int64_t layer = 0;
    int linear = 0;
    int op = 0;
    float scale = 1.0f;
    std::vector<float> amax_history;
  };
  std::vector<DelayedState> delayed_state() const;
  // Restores the states of operands this recipe quantizes with delayed scaling (fp8-delayed,
  // blocks not left in high precision); the rest are dropped: they would be carried, unused,
  // into every later checkpoint. Returns how many it restored.
  int64_t restore_delayed_state(const std::vector<DelayedState>& states);
  // The operands fp8-delayed keeps a history for: 6 per Linear of every quantized block.
  int64_t delayed_operand_count() const;

  // Numerics telemetry (precision.stats_every; docs/numerics.md). While collecting, every
  // quantize() adds its operand's amax / saturated / flushed / SQNR sums under (layer, linear,
  // operand); off (the default) it costs one branch. finish_stats stops collecting and returns
  // {"layers.L.<linear>.<gemm>.<operand>": {...}} (null when nothing was quantized), and warns
  // (core/log.h) naming every operand whose SQNR collapsed (SqnrMonitor's rule).
  // FP8 attention's amaxes of one block's forward or backward (Backend::attention_fp8_amax),
  // while collecting: finish_stats adds "layers.L.self_attn.fp8_attention.<tensor>" entries
  // with each tensor's format, amax, encode scale and headroom (the format's largest value
  // over amax x scale: below 1 its encoding saturated, which it warns about). D, rows_per_key
  // and attn_scale as numerics::attn_fp8_backward_scales takes them.
  void record_attention_amax(int64_t layer, const numerics::AttnFp8Amax& a, bool backward,
                             int64_t D, int64_t rows_per_key, float attn_scale);
  // precision.fp8_head while collecting: the head's forward operands as the FP8 head quantizes
  // them (E4M3 at current per-tensor scales, numerics::fp8_scale_from_amax of the whole
  // tensor; Backend's HeadOperands::kFp8), h [N, C] and W [V, C] in host memory: finish_stats
  // adds "head.fwd.input" and "head.fwd.weight" entries (summed over micro-batches, as the
  // Linears' operands) and checks their SQNR as theirs.
  void record_head_stats(const float* h, int64_t N, int64_t C, const float* w, int64_t V);
  // The FP8 head's logits gradient, which exists only inside the head's op a chunk at a time:
  // its amax (Backend::head_fp8_grad_amax) and the grad_scale the op took (its E5M2 scale is
  // head_fp8_scale(|grad_scale|)): finish_stats adds a "head.bwd.grad_output" entry with FP8
  // attention's fields (format, amax, scale, headroom; the largest amax of the micro-batches).
  void record_head_grad_amax(float amax, float grad_scale);
  void set_collect_stats(bool on) { collect_ = on; }
  bool collecting_stats() const { return collect_; }
  nlohmann::json finish_stats(int64_t step);

  // Test-only (to force an SQNR collapse): MXTRAIN_TEST_SCALE_SHIFT="L:K" multiplies the
  // fp8-current encode scale of every operand of block L by 2^K. Read once, at construction.
  int64_t test_shift_layer() const { return test_layer_; }

 private:
  Recipe recipe_;
  bool hp_bf16_ = false;
  bool fp8_attention_ = false;
  std::map<std::string, OperandStats> head_stats_;  // record_head_stats's, by entry name
  bool fp8_head_ = false, fp8_head_dgrad_ = false;
  int64_t num_layers_, hp_first_, hp_last_;
  uint32_t seed_, rank_, step_ = 0, micro_batch_ = 0;
  std::map<std::tuple<int64_t, int, int>, std::unique_ptr<numerics::DelayedScaling>> delayed_;
  // The scale each fp8-delayed operand's latest (non-replayed) quantization used.
  std::map<std::tuple<int64_t, int, int>, float> last_scale_;
  // fp8-delayed amaxes measured this pass, waiting for flush_amaxes().
  std::map<std::tuple<int64_t, int, int>, float> pending_amax_;
  AmaxReduction reduce_amax_;
  std::vector<float> reduce_buf_;
  void hold_amax(const std::tuple<int64_t, int, int>& key, float amax);
  void record_pending(const std::tuple<int64_t, int, int>& key);
  bool replay_ = false;
  bool collect_ = false;
  std::map<std::tuple<int64_t, int, int>, OperandStats> stats_;
  struct AttnEntry {
    const char* format;
    double amax = 0, scale = 0;
  };
  std::map<std::pair<int64_t, std::string>, AttnEntry> attn_stats_;  // (layer, tensor)
  std::optional<AttnEntry> head_grad_stats_;  // record_head_grad_amax's (head.bwd.grad_output)
  SqnrMonitor monitor_;
  // Block scales of the operand being quantized, kept only while telemetry reads them.
  std::vector<float> scale_f32_;
  std::vector<uint8_t> scale_u8_;
  int64_t test_layer_ = -1;
  int test_shift_ = 0;
};

}  // namespace mx
