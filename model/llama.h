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
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "model/config.h"
#include "model/params.h"

namespace mx {

enum class Checkpointing { kNone, kSelective, kFull };
Checkpointing parse_checkpointing(const std::string& s);  // UserError for unknown names
const char* checkpointing_name(Checkpointing c);

// Rows of the output head computed at once: the logits workspace is head_chunk_rows x vocab.
int64_t head_chunk_rows(const ModelConfig& c, int64_t tokens);

// Bytes of the two arenas for one forward+backward on [B, T] (upper bounds that size them).
struct ActivationBytes {
  size_t saved = 0;
  size_t scratch = 0;
};
ActivationBytes activation_bytes(const ModelConfig& c, int64_t B, int64_t T, Checkpointing policy);

class LlamaModel {
 public:
  LlamaModel(const ModelConfig& config, const ParamLayout& layout, Backend& backend,
             Checkpointing policy, Arena& saved, Arena& scratch);

  // One forward + backward on tokens [B, T+1] (inputs [:, :T], targets [:, 1:]). Returns the
  // mean cross-entropy over the B*T tokens; ACCUMULATES grad_scale * d(mean loss)/d(param)
  // into `grads` (same layout as `params`). Both arenas are back where they started on return.
  double forward_backward(const float* params, float* grads, const int32_t* tokens, int64_t B,
                          int64_t T, float grad_scale);
  // Forward only: the mean loss.
  double forward_loss(const float* params, const int32_t* tokens, int64_t B, int64_t T);

 private:
  struct BlockActs;
  void split_tokens(const int32_t* tokens, int64_t B, int64_t T, int32_t* inputs,
                    int32_t* targets);
  void make_rope_tables(int64_t T, float* cos, float* sin);
  // Forward of block `layer` from x to y; tensors land in `saved` or `scratch` per `policy`.
  void block_forward(const BlockParams& w, const float* x, float* y, BlockActs& a,
                     Checkpointing policy, int64_t B, int64_t T);
  // dresid holds dL/dy on entry and dL/dx on return.
  void block_backward(const BlockParams& w, const BlockParams& dw, const float* x, BlockActs& a,
                      float* dresid, int64_t B, int64_t T);
  double forward(const float* params, const int32_t* tokens, int64_t B, int64_t T,
                 Checkpointing policy, float* grads, float grad_scale);

  ModelConfig c_;
  const ParamLayout& layout_;
  Backend& be_;
  Checkpointing policy_;
  Arena& saved_;
  Arena& scratch_;
  const float* rope_cos_ = nullptr;
  const float* rope_sin_ = nullptr;
};

}  // namespace mx
