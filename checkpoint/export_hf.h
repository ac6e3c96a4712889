// A checkpoint as a Hugging Face model: what `mxtrain ckpt export-hf` and the SageMaker
// entrypoint's final export (to /opt/ml/model) both run.
#pragma once
#include <string>

namespace mx {

// CHECKPOINT: a step (local or s3://), or a root (its newest committed step); it must verify.
// Writes OUT_DIR/config.json + model.safetensors in `dtype` ("f32" | "bf16", any case).
// Returns the step exported. UserError for bad input.
std::string export_checkpoint_hf(const std::string& checkpoint, const std::string& out_dir,
                                 std::string dtype);

}  // namespace mx
