#include "train/engine.h"

namespace mx {

Engine::Engine(const ModelConfig& cfg, const EngineOptions& opt)
    : config(cfg), options(opt), layout(cfg), backend(make_backend(opt.device)) {
  const size_t param_bytes = sizeof(float) * size_t(layout.total_numel());
  // Model state and activations in the backend's memory (device memory on CUDA); the token
  // batch stays on the host, where the sampler writes it (the model copies it over).
  MemoryResource* mem = backend->memory();
  auto persistent = [&](const char* name, bool wanted, void** base) {
    auto arena = std::make_unique<Arena>(name, wanted ? param_bytes : 0, &tracker, mem);
    if (wanted) {
      *base = arena->alloc_f32_zero(layout.total_numel());
    }
    return arena;
  };
  params = persistent("master_weights", opt.params, &params_base_);
  grads = persistent("gradients", opt.gradients, &grads_base_);
  adam_m = persistent("adam_m", opt.optimizer, &m_base_);
  adam_v = persistent("adam_v", opt.optimizer, &v_base_);
  // the path needs the backend's own bf16 GEMMs
  options.bf16_path_only = options.bf16_path_only && backend->has_bf16_gemms();
  if (!opt.bf16_activations || !backend->has_bf16_gemms() ||
      !xt_codes_native(options.fp8_xt_only, *backend))
    options.fp8_xt_only = XtCodes::kNone;
  ActivationBytes act =
      activation_bytes(cfg, opt.micro_batch, opt.seq_len, opt.checkpointing, opt.quantized,
                       mem != nullptr, opt.bf16_activations, options.bf16_path_only,
                       options.fp8_xt_only);
  saved = std::make_unique<Arena>("activations", act.saved, &tracker, mem);
  scratch = std::make_unique<Arena>("scratch", act.scratch, &tracker, mem);
  const size_t batch_count = size_t(opt.micro_batch) * size_t(opt.seq_len + 1);
  batch = std::make_unique<Arena>("batch", sizeof(int32_t) * batch_count, &tracker);
  batch_base_ = static_cast<int32_t*>(batch->alloc(sizeof(int32_t) * batch_count));
  model = std::make_unique<LlamaModel>(config, layout, *backend, opt.checkpointing, *saved,
                                       *scratch);
  model->set_bf16_activations(opt.bf16_activations);
  model->set_residual_codes(options.bf16_path_only);
  model->set_xt_only(options.fp8_xt_only != XtCodes::kNone);
}

}  // namespace mx
