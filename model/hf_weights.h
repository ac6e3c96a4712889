// Hugging Face Llama weights in and out: config.json + model.safetensors (or a sharded set
// with model.safetensors.index.json), tensors under their HF names.
#pragma once
#include <string>

#include "model/config.h"
#include "model/params.h"

namespace mx {

// True if `dir` looks like a Hugging Face model directory (has config.json).
bool is_hf_dir(const std::string& dir);

// Reads the weights of `dir` into `params` (layout of `config`). Every tensor of the layout must
// be present with its exact shape; a tied model needs no lm_head.weight. UserError otherwise.
// `stoppable` (the trainer's start-up): a stop asked for by a signal throws StopRequested
// between tensors (core/load_progress.h).
void load_hf_weights(const std::string& dir, const ParamLayout& layout, float* params,
                     bool stoppable = false);

// load_hf_weights' checks of the files against the layout (every tensor present once with its
// shape, none the model lacks), from the headers alone: before memory is sized by config.json
// (a 48 KB model whose config.json claimed 2048 x 128256 filled 2 GB first).
void check_hf_weights(const std::string& dir, const ParamLayout& layout);

// Writes dir/config.json and dir/model.safetensors (dtype "F32" or "BF16"), creating `dir`.
// Files are written whole and renamed into place.
void save_hf_model(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                   const float* params, const std::string& dtype = "F32");

}  // namespace mx
