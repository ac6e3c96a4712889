// Hugging Face config.json for Llama models: how weights from the Hub describe their shape, and
// how ours describe theirs so that transformers' LlamaConfig / LlamaForCausalLM load them.
#pragma once
#include <string>

#include "model/config.h"

namespace mx {

// Reads a Llama config.json. UserError naming the file for: unreadable JSON, a model_type other
// than "llama", a missing required field or a field of the wrong JSON type (naming the field),
// and features the engine does not model (rope_scaling, attention/MLP biases, an activation
// other than silu, attention dropout). The result is finalize()d and validate()d.
ModelConfig read_hf_config(const std::string& path);
// The same from config.json's text; `path` names it in errors.
ModelConfig parse_hf_config(const std::string& text, const std::string& path);

// Writes config.json for LlamaForCausalLM (no rope scaling, no biases),
// atomically: path + ".tmp.<pid>", fsync, rename. StorageError on I/O failure; UserError if the
// config does not validate.
// torch_dtype: what the weights beside it are stored as ("float32" or "bfloat16").
void write_hf_config(const ModelConfig& c, const std::string& path,
                     const std::string& torch_dtype = "float32");
// The text write_hf_config writes.
std::string hf_config_text(const ModelConfig& c, const std::string& torch_dtype = "float32");

}  // namespace mx
