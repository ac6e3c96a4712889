// The minimal local checkpoint: enough to resume a single-process run exactly. One directory
// per step under a root:
//   <root>/step_00000100/model.safetensors      fp32 master weights, Hugging Face names
//                        optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name>
//                        config.json            the model (Hugging Face LlamaConfig)
//                        state.json             step, data position, seed, format version
// A step is written into a temporary sibling directory and renamed into place, so a step
// directory that exists is complete (the rename is the commit). The sharded, asynchronous,
// S3-capable checkpoint system replaces this module later with the same commit rule.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "model/config.h"
#include "model/params.h"

namespace mx {

// Writes step `step`; returns its directory. `m`/`v` may be null (weights only).
std::string save_local_checkpoint(const std::string& root, int64_t step, const ModelConfig& config,
                                  const ParamLayout& layout, const float* params, const float* m,
                                  const float* v, const nlohmann::json& state);

// The newest committed step directory under `root`, or "" if there is none.
std::string latest_checkpoint(const std::string& root);

// CHECKPOINT as users give it: a step directory, or a root meaning its newest step.
// UserError if it is neither.
std::string resolve_checkpoint(const std::string& path);

ModelConfig checkpoint_model_config(const std::string& step_dir);
nlohmann::json checkpoint_state(const std::string& step_dir);

// Loads weights (and the moments when m/v are non-null) of a step directory.
void load_local_checkpoint(const std::string& step_dir, const ParamLayout& layout, float* params,
                           float* m, float* v);

// Deletes all but the newest `keep` committed steps (keep = 0: delete nothing).
void prune_checkpoints(const std::string& root, int64_t keep);

}  // namespace mx
