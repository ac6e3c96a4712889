// The Llama decoder, forward and backward written by hand over backend ops (no autograd).
//
// Memory: the residual stream x_0..x_L and what each block keeps for its backward live in the
// `saved` arena (pushed block by block in forward, popped in backward); everything else in the
// `scratch` arena. Activation checkpointing decides what a block keeps:
//   none       everything backward reads (norm outputs, q/k/v, attention output and its
//              log-sum-exp, the MLP's gate/up/product)
//   selective  the GEMM outputs q, k, v, o, gate, up and the attention log-sum-exp; the cheap
//              parts (RMSNorm outputs, the SwiGLU product) are recomputed in backward
//   full       only the block's input; backward recomputes the whole block first
// The attention probabilities are never stored under any policy: the attention kernel
// recomputes them tile by tile.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "model/config.h"
#include "model/params.h"
#include "precision/recipe.h"

namespace mx {

enum class Checkpointing { kNone, kSelective, kFull };
Checkpointing parse_checkpointing(const std::string& s);  // UserError for unknown names
const char* checkpointing_name(Checkpointing c);

// Rows of the output head computed at once: the logits workspace is head_chunk_rows x vocab.
// device: the backend's memory is a device's (Backend::memory() not null), where the chunks are
// larger (model/llama.cpp says why).
int64_t head_chunk_rows(const ModelConfig& c, int64_t tokens, bool device = false);

// The head's GEMM operands under a recipe (null: none, fp32): FP8 under precision.fp8_head
// (its data gradient in bf16 unless precision.fp8_head_dgrad = fp8), else bf16 under
// precision.high_precision = bf16, else fp32.
inline HeadOperands head_operands(const LinearRecipe* recipe) {
  if (!recipe) return HeadOperands::kFp32;
  return recipe->fp8_head()              ? (recipe->fp8_head_dgrad() ? HeadOperands::kFp8
                                                                     : HeadOperands::kFp8Bf16Dgrad)
         : recipe->high_precision_bf16() ? HeadOperands::kBf16
                                         : HeadOperands::kFp32;
}

// A GPU run's larger head chunks (MXTRAIN_CUDA_HEAD_CHUNK_MB not set): the rows of a logits
// chunk to take in device memory the run leaves free once every arena is allocated, or 0 for
// none (the planned head_chunk_rows chunk, in the scratch arena, stays). Every chunk's weight
// gradient reads and writes all of the head's fp32 dW, so fewer chunks move less: the H200's
// head backward GEMMs ran at 455 TFLOP/s with 256 MiB chunks, 730 with 1 GiB (bench/RESULTS.md).
// Tried in turn: fp32 logits of 4 GiB, 2 GiB, 1 GiB and 512 MiB (capped at `tokens` rows); the
// first whose workspace (head_workspace_floats, 4 bytes each) fits in free_bytes less a reserve
// of 4 GiB + total_bytes / 32 (what the libraries and NCCL may still allocate) and has more
// rows than the planned chunk is taken.
int64_t spare_head_chunk_rows(const ModelConfig& c, int64_t tokens, HeadOperands operands,
                              int64_t free_bytes, int64_t total_bytes);
// The rows of a head workspace of `floats` floats (the largest chunk_rows, at most `tokens`,
// whose head_workspace_floats fits; 0 when not even one row does).
int64_t head_rows_in(int64_t floats, const ModelConfig& c, int64_t tokens,
                     HeadOperands operands);

// Bytes of the two arenas for one forward+backward on [B, T] (upper bounds that size them).
struct ActivationBytes {
  size_t saved = 0;
  size_t scratch = 0;
};
// Which x^T FP8 codes a run keeps alone (fp8_xt_only_applies): none, per-tensor FP8's (one
// float scale), fp8-block's or mxfp8's (block scales).
enum class XtCodes : uint8_t { kNone, kPerTensor, kFp8Block, kMxfp8 };
inline bool xt_blocks(XtCodes x) { return x == XtCodes::kFp8Block || x == XtCodes::kMxfp8; }
// bf16_activations: precision.activations = bf16 (the kept copies take 2 bytes an element).
// bf16_path: every block takes the bf16 path on every step (precision/recipe.h's
// bf16_path_only on a backend with native bf16 GEMMs): scratch sized for that path alone.
// fp8_xt_only (with bf16_activations): a policy that keeps h1, h2 and SwiGLU's product keeps
// x^T's FP8 codes of them instead (1 byte an element and their scales: fp8_xt_bytes;
// LlamaModel::set_xt_only), where fp8_xt_only_applies says so.
ActivationBytes activation_bytes(const ModelConfig& c, int64_t B, int64_t T, Checkpointing policy,
                                 bool quantized = false, bool device = false,
                                 bool bf16_activations = false, bool bf16_path = false,
                                 XtCodes fp8_xt_only = XtCodes::kNone);
// The bytes `saved` holds for x^T's FP8 codes of a tensor of n elements: the codes and their
// scales (fp8_xt_scale_bytes: per-tensor, one float; blocks, fp8-block's 128x1 floats or
// mxfp8's 32x1 E8M0 bytes, n / 32 either way, the tokens a multiple of the block), rounded.
size_t fp8_xt_scale_bytes(int64_t n, bool blocks);
size_t fp8_xt_bytes(int64_t n, bool blocks);
// Whether a run keeps x^T's FP8 codes alone (fp8_xt_only), and which: per-tensor FP8
// (fp8-current, fp8-delayed), fp8-block or mxfp8 with bf16 activations on a backend with
// that recipe's tensor cores and native bf16 GEMMs (the bf16 path; the caller checks the
// backend: xt_codes_native), policy none, and every block Linear's widths and the N tokens of
// a micro-batch multiples of the recipe's GEMMs' (16; fp8-block 128; mxfp8 32), unless
// MXTRAIN_FP8_SAVE_XT=0. kNone otherwise.
XtCodes fp8_xt_only_applies(const ModelConfig& c, int64_t N, const std::string& recipe,
                            bool bf16_activations, Checkpointing policy);
// Whether `backend` runs those codes' recipe on tensor cores (kNone: false).
bool xt_codes_native(XtCodes x, const Backend& backend);
// MXTRAIN_FP8_SAVE_XT is not 0.
bool fp8_save_xt_enabled();
// MXTRAIN_FP8_FUSE_SWIGLU is not 0: the down projection's FP8 cast reads SwiGLU's operands
// where it can (LlamaModel::SwigluInput), and gate's and up's backward take their gradients'
// operands from SwiGLU's backward (Backend::fp8_swiglu_backward).
bool fp8_fuse_swiglu_enabled();
// MXTRAIN_FP8_NORM_AMAX is not 0: under fp8-current and nvfp4 the RMSNorm kernels that write
// h1's and h2's codes take their amax too, so the Linears' quantizers skip their amax pass
// (Fp8Operand::x_amax).
bool fp8_norm_amax_enabled();
// MXTRAIN_FP8_WEIGHT_AMAX is not 0: under fp8-current and nvfp4 a weight's amax is taken by
// its first cast after the weights change (an optimizer step) and given to the later casts.
bool fp8_weight_amax_enabled();

// Where the model finds its weights and puts its gradients, one unit at a time (units as in
// ParamLayout: embedding, each block, head). One process hands out views of its flat buffers;
// FSDP gathers a unit's shards on acquire and reduce-scatters its gradients on grads_ready.
// Calls come in the order forward (embed, blocks ascending, head), then backward (head,
// blocks descending, embed), so an implementation can prefetch the next unit.
class UnitAccess {
 public:
  virtual ~UnitAccess() = default;
  // The unit's full parameters (ParamLayout's unit-relative offsets). Valid until release.
  virtual const float* acquire(int unit, bool backward) = 0;
  virtual void release(int unit, bool backward) {}
  // The unit's full gradient buffer; the model accumulates into it.
  virtual float* grads(int unit) = 0;
  // The model will not touch the unit's gradients again in this micro-batch.
  virtual void grads_ready(int unit) {}
  // FSDP's bf16 gathers (Fsdp, FsdpOptions::bf16_blocks): acquire() of a block unit returns
  // null, and this gives the block as bf16 codes (ParamLayout's unit-relative offsets; only
  // its matrices are read from them) and its two RMSNorm weights in fp32, valid until release.
  // The model reads such a block only on the bf16 path with native bf16 GEMMs.
  struct BlockCodes {
    const uint16_t* codes = nullptr;
    const float* input_norm = nullptr;
    const float* post_norm = nullptr;
  };
  virtual BlockCodes block_codes(int unit) { return {}; }
  // A count that changes whenever the weights acquire() hands out may have changed (an
  // optimizer step, a load: every rank's the same), or -1: not tracked, so they may change
  // between any two micro-batches. LlamaModel keeps the weights' amaxes while it stays the
  // same (weight_amax).
  virtual int64_t weights_version() const { return -1; }
};

// UnitAccess over one process's flat parameter and gradient buffers.
class FlatUnitAccess final : public UnitAccess {
 public:
  FlatUnitAccess(const ParamLayout& layout, const float* params, float* grads)
      : layout_(layout), params_(params), grads_(grads) {}
  const float* acquire(int unit, bool) override { return params_ + layout_.units()[unit].offset; }
  float* grads(int unit) override { return grads_ + layout_.units()[unit].offset; }

 private:
  const ParamLayout& layout_;
  const float* params_;
  float* grads_;
};

class LlamaModel {
 public:
  LlamaModel(const ModelConfig& config, const ParamLayout& layout, Backend& backend,
             Checkpointing policy, Arena& saved, Arena& scratch);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // One forward + backward on tokens [B, T+1] (inputs [:, :T], targets [:, 1:]). Returns the
  // mean cross-entropy over the B*T tokens; ACCUMULATES grad_scale * d(mean loss)/d(param)
  // into `grads` (same layout as `params`). Both arenas are back where they started on return.
  double forward_backward(const float* params, float* grads, const int32_t* tokens, int64_t B,
                          int64_t T, float grad_scale);
  // Forward only: the mean loss.
  double forward_loss(const float* params, const int32_t* tokens, int64_t B, int64_t T);
  // The same through a UnitAccess (FSDP). grads are taken from `access` when `training`.
  double forward_backward(UnitAccess& access, const int32_t* tokens, int64_t B, int64_t T,
                          float grad_scale);
  double forward_loss(UnitAccess& access, const int32_t* tokens, int64_t B, int64_t T);
  // Low-precision Linear layers (null: fp32). The scratch arena must have room for the
  // quantized operand copies (activation_bytes(..., quantized = true)).
  void set_recipe(LinearRecipe* recipe) { recipe_ = recipe; }
  // precision.activations = bf16: the tensors a block makes between its ops (the norm outputs,
  // q, k and v after RoPE, the attention output, gate, up and the SwiGLU product) are rounded
  // to bf16 as they are made (Backend::pack_bf16), so forward, backward and every
  // checkpointing policy see the same values; what the policy keeps of them is stored as bf16
  // codes in `saved` (the fp32 working copy lives in scratch) and widened again in backward.
  // The residual stream, the RMSNorm and attention statistics and every gradient stay fp32.
  // The arenas must be sized for it (activation_bytes(..., bf16_activations = true)).
  void set_bf16_activations(bool on) { bf16_acts_ = on; }
  // Every block on the bf16 path, the arenas sized for it alone (Engine's bf16_path_only):
  // the backward keeps the residual gradient's bf16 codes beside it, written by the RMSNorm
  // backwards that update it (rmsnorm_backward_bf16) and read by the output projections'
  // backward, which otherwise rounded it themselves, twice a block.
  void set_residual_codes(bool on) { residual_codes_ = on; }
  // The `saved` arena is sized for x^T's FP8 codes in place of h1's, h2's and SwiGLU's
  // product's bf16 codes (activation_bytes' fp8_xt_only; Engine's): with policy none the
  // forward keeps those codes (saves_xt) and the bf16 codes only for itself, in scratch; a
  // block that cannot keep them (a high-precision block, a telemetry step) keeps neither and
  // its backward recomputes the bf16 codes, as under policy selective.
  void set_xt_only(bool on) { xt_only_ = on; }
  // A head workspace outside the scratch arena (spare_head_chunk_rows: a GPU's spare memory),
  // used instead of the planned one where it holds more rows; null: none.
  void set_head_workspace(float* workspace, int64_t floats) {
    head_ws_ = workspace;
    head_ws_floats_ = floats;
  }

  // How many of a block's 7 Linears (q, k, v, o, gate, up, down) take the backend's FP8 / FP4
  // GEMMs at N tokens a micro-batch, for a layer the recipe quantizes (what the trainer's
  // start-up line reports), and the multiple every dimension must be for that (0: the backend
  // has no such GEMMs for the recipe, or there is no FP8 / FP4 recipe).
  int native_fp8_linears(int64_t N) const;
  int64_t native_fp8_multiple() const;
  // Weight-gradient operands taken from x^T's FP8 codes kept by the forward (SavedXt), since
  // the model was made.
  int64_t saved_xt_operands() const { return saved_xt_uses_; }
  // Down projections whose FP8 input the cast made from SwiGLU's operands (SwigluInput), since
  // the model was made.
  int64_t fused_swiglu_inputs() const { return fused_swiglu_uses_; }
  // Gate-and-up backward passes whose FP8 operands of dg and du came straight from SwiGLU's
  // backward (Backend::fp8_swiglu_backward), since the model was made.
  int64_t fused_swiglu_grads() const { return fused_swiglu_grads_; }
  // RMSNorm outputs (h1, h2) whose amax the norm's kernel took for the FP8 Linears that read
  // them (Fp8Operand::x_amax: fp8-current, nvfp4), since the model was made.
  int64_t norm_amax_inputs() const { return norm_amax_uses_; }
  // Output projections (o, down) whose FP8 dy, the residual gradient, took its amax from the
  // RMSNorm backward that updated it (fp8-current), since the model was made.
  int64_t norm_amax_grads() const { return resid_amax_uses_; }
  // fp8-current and nvfp4 weight operands (the recompute's W, the data gradients' W^T, the
  // later micro-batches') that took W's amax from an earlier quantization of the same weights
  // (weight_amax), since the model was made.
  int64_t weight_amax_reuses() const { return weight_amax_uses_; }

 private:
  struct BlockActs;
  // x^T's FP8 codes, kept by the forward for the weight gradient in place of a kept tensor's
  // bf16 codes (Backend::Fp8Operand::save_t / codes_t; h1, h2 and SwiGLU's product on the bf16
  // path): the codes and their decode scales (per-tensor, one float; fp8-block's and mxfp8's
  // block scales in that memory: fp8_xt_scale_bytes), in the room the bf16 codes had in
  // `saved`. The backward then reads neither x nor writes its transposed codes. Null: not kept.
  struct SavedXt {  // (no member initializers: `= {}` as a default argument below)
    uint8_t* codes;
    float* scale_inv;
  };
  // The down projection's input given as SwiGLU's operands (g, u: bf16 codes) where its x^T's
  // codes are kept and its bf16 codes would serve the forward alone: the FP8 cast makes s from
  // them as it reads them (Backend::Fp8Operand::swiglu_g), s's codes never written. Null: x16.
  struct SwigluInput {
    const uint16_t* g;
    const uint16_t* u;
  };
  void split_tokens(const int32_t* tokens, int64_t B, int64_t T, int32_t* inputs,
                    int32_t* targets);
  void make_rope_tables(int64_t T, float* cos, float* sin);
  // Forward of block `layer` from x to y; tensors land in `saved` or `scratch` per `policy`.
  void block_forward(const BlockParams& w, const float* x, float* y, BlockActs& a,
                     Checkpointing policy, int64_t B, int64_t T);
  // bf16 activations: a finished tensor rounded in place, and its kept copy written where codes
  // is not null (forward, and backward's recompute, which keeps nothing); else nothing.
  void round_activation(float* t, uint16_t* codes, int64_t n);
  // The bf16 path: bf16 activations on a backend with native bf16 GEMMs (CUDA; the CPU under
  // MXTRAIN_TEST_BF16_GEMM). The nine tensors between a block's ops exist only as codes,
  // written by the ops that make them (RMSNorm, RoPE, the GEMMs of v, gate and up, attention,
  // SwiGLU) and read by the ops after them; backward widens nothing. Where the block's Linears
  // run on those bf16 GEMMs (native16: recipe bf16 without telemetry, or a block kept in bf16
  // by high_precision) they read the codes themselves and each output gradient is rounded once
  // for its two GEMMs; other Linears (FP8 and FP4 recipes, fp32 blocks, telemetry steps) take
  // their operand widened from the codes, and their gradients stay fp32. The same values as
  // the rounding path (the same roundings, no packing passes), bit for bit on the CPU.
  bool bf16_path();
  bool native16();
  // Backend::gemm_bf16 in native bf16 mode, alpha 1.
  void gemm16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
              const uint16_t* A16, const float* B, const uint16_t* B16, float beta, float* C,
              uint16_t* C16);
  // Linears first .. first + count - 1 (weights or their codes, and gradients) form one
  // matrix (Backend::fuse_linear_backward): q, k, v (0, 3) and gate, up (4, 2).
  bool fusable(const BlockParams& w, const BlockParams& dw, int first, int count) const;
  // A block Linear in the bf16 path, x as codes: y fp32, or (y null) its codes into y16.
  // Off the bf16 GEMMs (native false) x is widened from x16, or taken from x_wide when the
  // caller widened it once for several Linears.
  // residual (fp32, with y, not y16): y = x W^T + residual, the block's residual add (on the
  // bf16 GEMMs in their epilogue: Backend::gemm_bf16_residual; otherwise linear_fwd's).
  void linear_fwd16(int linear, float* y, uint16_t* y16, const uint16_t* x16, const float* w,
                    int64_t N, int64_t in, int64_t out, bool native,
                    const float* x_wide = nullptr, const float* residual = nullptr,
                    SavedXt save = {}, SwigluInput swiglu = {});
  // Its backward: dx (= or +=) dy W, dW += dy^T x, x as codes (or x_wide, as above). native: dy
  // as codes (dy16) or fp32 (rounded once into scratch for both GEMMs); otherwise dy fp32 or
  // (dy null) codes, which the FP8 Linears' quantizers read (fp8_reads_codes) and the others
  // widen. dx16 (dx null, not accumulating): dx as codes, out of the GEMM's epilogue (native,
  // and the FP8 Linears that read codes), else the fp32 product rounded.
  void linear_bwd16(int linear, float* dx, float* dw, const float* dy, const uint16_t* dy16,
                    const uint16_t* x16, const float* w, int64_t N, int64_t in, int64_t out,
                    bool accumulate_dx, bool native, const float* x_wide = nullptr,
                    uint16_t* dx16 = nullptr, SavedXt xt = {});
  // Whether the forward keeps them for the input of Linears first .. first + count - 1 (q, k,
  // v: 0, 3; gate, up: 4, 2; down: 6, 1): per-tensor FP8, fp8-block or mxfp8 on the backend's
  // FP8 Linears reading the codes (reads_codes), a policy that keeps the input, not a
  // telemetry step or a recompute, and under fp8-delayed every one of those Linears'
  // forward-input and weight-gradient-input scales the same (the codes are then each weight
  // gradient's own quantization; the block recipes' always are). MXTRAIN_FP8_SAVE_XT=0 turns
  // it off (comparisons).
  bool saves_xt(int first, int count, bool reads_codes, Checkpointing policy) const;
  // The amax slot for an RMSNorm output written as `codes` (rmsnorm_forward_bf16's amax), or
  // null: fp8-current or nvfp4 in this block, its Linears reading the codes (reads_codes),
  // MXTRAIN_FP8_NORM_AMAX not 0. Marks the codes as the slot's (norm_amax_x_) until the caller
  // clears it.
  float* norm_amax(const uint16_t* codes, bool reads_codes);
  // The residual gradient's amax slot for the bf16 path's RMSNorm backward (fp8-current, the
  // slot made by a forward's norm_amax, MXTRAIN_FP8_NORM_AMAX not 0), or null.
  float* resid_amax() const;
  // fp8-current's and nvfp4's (16x16) weight operand wq of Linear `linear` in this block: the
  // first quantization of W since the weights last changed (UnitAccess::weights_version; where
  // it is not tracked, in this micro-batch) writes W's amax into the Linear's slot (wq.amax),
  // the later ones take it (wq.x_amax). MXTRAIN_FP8_WEIGHT_AMAX=0 turns it off. Other
  // operands are left as they are.
  void weight_amax(int linear, Backend::Fp8Operand& wq);
  // x^T's kept codes carry block scales (fp8-block, mxfp8: fp8_xt_scale_bytes' blocks).
  bool xt_blocks() const;
  // Block `layer`'s weights through `access`: fp32 pointers, or (bf16 gathers) the RMSNorm
  // weights with null matrices and the matrices' codes in w16_.
  BlockParams block_weights(UnitAccess& access, int64_t layer, bool backward);
  // n fp32 values widened from codes into scratch (the caller's scope).
  float* widened(const uint16_t* codes, int64_t n);
  static uint16_t* alloc_bf16(Arena& arena, int64_t n);
  // dresid holds dL/dy on entry and dL/dx on return.
  void block_backward(const BlockParams& w, const BlockParams& dw, const float* x, BlockActs& a,
                      float* dresid, int64_t B, int64_t T);
  double forward(UnitAccess& access, const int32_t* tokens, int64_t B, int64_t T,
                 Checkpointing policy, bool training, float grad_scale);

  // recipe_->quantize for the current layer, staged through the host when the backend's
  // memory is not host-addressable.
  void quantize(float* out, const float* x, int64_t rows, int64_t cols, bool reduce_along_cols,
                LinearOperand op, int linear);
  // Recipe bf16 on the backend's own bf16 GEMM (on/off around a Linear); false: emulate.
  bool native_bf16(bool on);
  // Block `layer`'s Linears are not plain fp32: the recipe is active there, or the block is
  // left out of it with precision.high_precision = bf16 (then the same paths round to bf16: the
  // backend's bf16 GEMMs where it has them, else Backend::round_bf16 copies in quantize()'s
  // place, with no recipe state and no telemetry).
  bool lowered(int64_t layer) const;
  // This block's Linears are bf16 GEMMs (native or rounded): native_bf16(true)'s rule, the
  // backend aside (native_bf16 asks it).
  bool bf16_linears() const;
  // The block Linears, through the recipe when one is active for the current layer.
  // linear: 0..6 = q, k, v, o, gate, up, down.
  // x16 (with x null): the input as bf16 codes, only where fp8_reads_codes() holds.
  // y16 (not null): the output is wanted as bf16 codes there (to_bf16's); y is then scratch
  // whose contents after are unspecified (the FP8 Linears on CUDA write y16 straight from the
  // GEMM: Backend::fp8_linear_forward).
  // residual (with y, not y16): y = residual + x W^T, the block's residual add (the FP8
  // Linears on tensor cores add it in their GEMM's epilogue; otherwise a separate add).
  void linear_fwd(int linear, float* y, const float* x, const float* w, int64_t N, int64_t in,
                  int64_t out, const uint16_t* x16 = nullptr, uint16_t* y16 = nullptr,
                  const float* residual = nullptr, SavedXt save = {},
                  SwigluInput swiglu = {});
  // dy16 / dx16 (only where fp8_reads_codes: the FP8 Linears): dy as codes (dy null), dx
  // wanted as codes too (dx then scratch), as Backend::fp8_linear_backward takes them.
  void linear_bwd(int linear, float* dx, float* dw, const float* dy, const float* x,
                  const float* w, int64_t N, int64_t in, int64_t out, bool accumulate_dx,
                  const uint16_t* x16 = nullptr, const uint16_t* dy16 = nullptr,
                  uint16_t* dx16 = nullptr, SavedXt xt = {});
  // This Linear of the current layer runs on the backend's FP8 / FP4 Linears (native_fp8;
  // per-tensor, fp8-block, mxfp8, nvfp4), whose quantizers read a bf16-code input directly
  // (Backend::Fp8Operand::bf16): on the bf16 path its input is never widened.
  bool fp8_reads_codes(int64_t N, int64_t in, int64_t out) const;
  // The current layer's attention runs in FP8 (LinearRecipe::fp8_attention).
  bool fp8_attention() const;
  // On a telemetry step, the current layer's FP8 attention amaxes into the recipe's stats.
  void record_attention_amax(bool backward, int64_t T);
  // ... for all of q, k, v (their shared input h1) / gate and up (h2): off the bf16 GEMMs that
  // input is widened, once for the Linears sharing it, only where one of them does not.
  bool qkv_read_codes(int64_t N) const;
  bool mlp_read_codes(int64_t N) const;
  // Whether gate's and up's backward take dg's and du's FP8 operands straight from SwiGLU's
  // backward (Backend::fp8_swiglu_backward): the FP8 recipes but nvfp4 (per-tensor,
  // fp8-block, mxfp8) on the backend's FP8 Linears reading codes, unless
  // MXTRAIN_FP8_FUSE_SWIGLU=0.
  bool fused_swiglu_backward(int64_t N) const;
  // The operands of Linear `linear`'s FP8 backward on tensor cores (fp8_linear_backward's):
  // dy's for the data gradient and W's (dx), dy's for the weight gradient and x's (dw), dy and
  // x as codes (dy16, x16: null for none) or x^T's kept codes (xt: the forward-input amax
  // copied into the weight-gradient input's slot, counted in saved_xt_operands).
  void fp8_backward_operands(int linear, int64_t N, bool dx, bool dw, const uint16_t* dy16,
                             const uint16_t* x16, SavedXt xt, Backend::Fp8Operand& dyq_dgrad,
                             Backend::Fp8Operand& wq, Backend::Fp8Operand& dyq_wgrad,
                             Backend::Fp8Operand& xq);
  // The bracket (Backend::begin_shared_input) for the Linears that read h1 (q, k, v) or, with
  // mlp, h2 (gate, up), given as x, the pointer they read: open where they all take the
  // backend's FP8 / FP4 Linears, else none.
  SharedInputScope shared_input(const void* x, int64_t N, bool mlp) const;

  // FP8 recipes on the backend's FP8 Linears (per-tensor: Backend::fp8_tensor_cores();
  // fp8-block: fp8_block_tensor_cores(); mxfp8: mxfp8_tensor_cores(); nvfp4:
  // nvfp4_tensor_cores()): true when this Linear
  // of the current layer goes that way (otherwise the emulation above).
  bool native_fp8(int64_t N, int64_t in, int64_t out) const;
  // The shape's part of that, for any layer: the backend has the recipe's GEMMs and N, in and
  // out are multiples of native_fp8_multiple() (0: the backend has none for this recipe).
  bool native_fp8_shape(int64_t N, int64_t in, int64_t out) const;
  // The operand's quantization for the backend: current scaling, or (fp8-delayed) the
  // history's scale and a slot for its amax, recorded into the history by fp8_flush().
  Backend::Fp8Operand fp8_operand(LinearOperand op, int linear);
  // Hands every pending fp8-delayed amax to the recipe (one copy of the slots to the host),
  // where it waits for the end of the pass as the emulated path's do. Called before a pending
  // (layer, linear, operand) is quantized again, before the emulated path quantizes, and at the
  // end of every forward(), which then has the recipe reduce and record them
  // (LinearRecipe::flush_amaxes): its state is then what the emulation leaves.
  void fp8_flush();

  ModelConfig c_;
  LinearRecipe* recipe_ = nullptr;
  bool bf16_acts_ = false;
  bool residual_codes_ = false;
  bool xt_only_ = false;
  uint16_t* dresid16_ = nullptr;  // during a backward (set_residual_codes): dresid's codes,
  bool dresid16_valid_ = false;   // valid: made from dresid as it is now
  float* head_ws_ = nullptr;  // set_head_workspace
  int64_t head_ws_floats_ = 0;
  // Floats of backend memory made once and freed with the model (the backend's
  // MemoryResource, or `host` where it has none, i.e. host memory): the recipes' amax slots.
  struct Slots {
    float* p = nullptr;
    bool owned = false;
    std::vector<float> host;
  };
  // s.p, made with n zeroed floats (named `arena` in the memory tracker) on the first call.
  float* slots(Slots& s, size_t n, const char* arena);
  // fp8-delayed amax slots, one per (layer, linear, operand).
  Slots amax_mem_;
  std::vector<float> amax_read_;    // fp8_flush's host copy of the slots
  std::vector<int> amax_pending_;   // slot indices waiting for fp8_flush
  std::vector<char> amax_is_pending_;
  int64_t layer_ = 0;  // the block being computed
  int64_t saved_xt_uses_ = 0;
  int64_t fused_swiglu_uses_ = 0;
  int64_t fused_swiglu_grads_ = 0;
  int64_t norm_amax_uses_ = 0;
  int64_t resid_amax_uses_ = 0;
  int64_t weight_amax_uses_ = 0;
  // fp8-current, nvfp4: W's amax per block and Linear (layer x 7 + linear; backend memory, made
  // on first use), and the weights' key (weights_key_) when the first quantization of W wrote
  // it; 0: none. forward() sets the key: odd, 2 x the UnitAccess's weights_version() + 1, where
  // it tracks one (so an amax serves every micro-batch until the weights change); even, 2 x the
  // micro-batches forward() has counted (micro_batch_serial_), where it does not.
  Slots weight_amax_mem_;
  std::vector<int64_t> weight_amax_of_;
  int64_t micro_batch_serial_ = 0;
  int64_t weights_key_ = 0;
  // The residual gradient (block_backward's dresid) whose amax the last RMSNorm backward wrote
  // into norm_amax_mem_.p[1], or null: cleared wherever dresid changes without it.
  const float* resid_amax_of_ = nullptr;
  // The bf16 codes of the last RMSNorm output whose amax its kernel wrote (norm_amax), and that
  // float (backend memory, made once): the forward inputs of the Linears reading those codes
  // take it (linear_fwd).
  const uint16_t* norm_amax_x_ = nullptr;
  Slots norm_amax_mem_;
  // The current block's matrices as bf16 codes (FSDP's bf16 gathers; linear 0..6 = q, k, v, o,
  // gate, up, down), or all null: the native bf16 GEMMs read them instead of the fp32 weights.
  std::array<const uint16_t*, 7> w16_{};
  const ParamLayout& layout_;
  Backend& be_;
  Checkpointing policy_;
  Arena& saved_;
  Arena& scratch_;
  const float* rope_cos_ = nullptr;
  // The host's RoPE tables of the last sequence length, kept: making them (2 x T x head_dim / 2
  // double sines and cosines: some milliseconds at T = 8192) every step left a GPU idle while
  // the host worked, the step's inputs not yet copied.
  std::vector<float> rope_host_cos_, rope_host_sin_;
  int64_t rope_host_T_ = -1;
  const float* rope_sin_ = nullptr;
};

}  // namespace mx
