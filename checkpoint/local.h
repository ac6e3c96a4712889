// The local checkpoint: enough to resume a run exactly, on any number of processes. One
// directory per step under a root:
//   <root>/step_00000100/model.safetensors      fp32 master weights, Hugging Face names
//                        optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name>
//                        config.json            the model (Hugging Face LlamaConfig)
//                        state.json             step, data position, seed
//                        manifest.json          the commit: every file's name, size and CRC32C,
//                                               every tensor's global shape, the model config
// Every file is written and fsynced into a temporary sibling directory; manifest.json is
// written last (temporary name, fsync, rename), then the directory is renamed into place and the
// root fsynced. A step directory without a manifest that verifies does not exist: resume and
// export skip or refuse it. See docs/checkpoints.md.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace mx {

inline constexpr int kCheckpointFormatVersion = 1;

// Writes step `step`; returns its directory. `m`/`v` may be null (weights only). The manifest
// records state["world_size"] and state["sharding"] when present (1 and "none" otherwise).
std::string save_local_checkpoint(const std::string& root, int64_t step, const ModelConfig& config,
                                  const ParamLayout& layout, const float* params, const float* m,
                                  const float* v, const nlohmann::json& state);

// Committed step directories under `root` (step_NNNNNNNN holding a manifest.json), oldest
// first. Not verified: see verify_checkpoint.
std::vector<std::string> committed_checkpoints(const std::string& root);

// The newest committed step directory under `root`, or "" if there is none (not verified).
std::string latest_checkpoint(const std::string& root);

// Checks a step directory against its manifest: the manifest parses and names only plain files
// (no '/', no '..'); every file exists with the manifest's size (checked before it is read) and
// CRC32C; every safetensors file parses and holds the tensors the manifest lists, with their
// shapes. Returns "" when it verifies, else one line naming the bad file and the problem.
std::string verify_checkpoint(const std::string& step_dir);

// The parsed manifest.json of a step directory; UserError if unreadable (not verified).
nlohmann::json checkpoint_manifest(const std::string& step_dir);

// The newest committed step under `root` that verifies, or "" if none does. Each newer one that
// does not verify is reported with warn() (naming it and why) when `report` is true.
std::string latest_verified_checkpoint(const std::string& root, bool report = true);

// CHECKPOINT as users give it: a step directory, or a root meaning its newest committed step.
// It must verify: UserError (exit 2) naming the bad file otherwise, or if it is neither.
std::string resolve_checkpoint(const std::string& path);

ModelConfig checkpoint_model_config(const std::string& step_dir);
nlohmann::json checkpoint_state(const std::string& step_dir);

// Loads weights (and the moments when m/v are non-null) of a step directory.
void load_local_checkpoint(const std::string& step_dir, const ParamLayout& layout, float* params,
                           float* m, float* v);

// Deletes all but the newest `keep` committed steps (keep = 0: delete nothing), and temporary
// directories that other (dead) writers left behind.
void prune_checkpoints(const std::string& root, int64_t keep);

}  // namespace mx
