// Everything one process needs to run the model: backend, parameter layout and the arenas,
// sized up front for a given micro-batch shape and checkpointing policy. Shared by `train`,
// `debug grads` and evaluation.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/arena.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/params.h"

namespace mx {

struct EngineOptions {
  std::string device = "cpu";
  Checkpointing checkpointing = Checkpointing::kNone;
  int64_t micro_batch = 1;
  int64_t seq_len = 1;
  bool params = true;     // allocate full master weights (false: FSDP holds shards)
  bool gradients = true;  // allocate gradients
  bool optimizer = true;  // allocate AdamW moments
  bool quantized = false;  // a precision recipe needs room for quantized operand copies
  bool bf16_activations = false;  // precision.activations = bf16 (precision/recipe.h)
  // bf16_path_only (precision/recipe.h): the arenas are sized for LlamaModel's bf16 path alone
  // when the backend has native bf16 GEMMs (Engine resolves it: false on the CPU without the
  // test knob MXTRAIN_TEST_BF16_GEMM).
  bool bf16_path_only = false;
  // fp8_xt_only (model/llama.h, fp8_xt_only_applies): the `saved` arena holds x^T's FP8 codes
  // in place of h1's, h2's and SwiGLU's product's bf16 codes. Engine resolves it: kNone on a
  // backend without the recipe's tensor cores (xt_codes_native) or native bf16 GEMMs.
  XtCodes fp8_xt_only = XtCodes::kNone;
};

class Engine {
 public:
  Engine(const ModelConfig& config, const EngineOptions& options);

  ModelConfig config;
  EngineOptions options;
  ParamLayout layout;
  std::unique_ptr<Backend> backend;
  MemoryTracker tracker;
  std::unique_ptr<Arena> params, grads, adam_m, adam_v, saved, scratch, batch;
  std::unique_ptr<LlamaModel> model;

  // In the backend's memory: host code reads them through backend->copy_to_host.
  float* param_data() const { return static_cast<float*>(params_base_); }
  float* grad_data() const { return static_cast<float*>(grads_base_); }
  float* m_data() const { return static_cast<float*>(m_base_); }
  float* v_data() const { return static_cast<float*>(v_base_); }
  int32_t* batch_tokens() const { return batch_base_; }  // [micro_batch, seq_len + 1], host

 private:
  void* params_base_ = nullptr;
  void* grads_base_ = nullptr;
  void* m_base_ = nullptr;
  void* v_base_ = nullptr;
  int32_t* batch_base_ = nullptr;
};

}  // namespace mx
