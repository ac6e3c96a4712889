// The run's configuration: one TOML file plus `--set section.key=value` overrides, checked
// against a schema so that an unknown key or a wrong type is an error, never ignored.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace mx {

// Limits on the run's sizes (validate() enforces them), far above any real run: with them no
// size derived from the config (arena bytes, tokens of a step or of the run times the ranks,
// data sample indices) overflows 64 bits.
inline constexpr int64_t kMaxMicroBatchTokens = int64_t(1) << 32;   // micro_batch x seq_len
inline constexpr int64_t kMaxStepTokensPerRank = int64_t(1) << 40;  // ... x grad_accum
inline constexpr int64_t kMaxRunTokensPerRank = int64_t(1) << 48;   // ... x steps
// run.threads: more than any machine has cores (an int64 was cut to int: 2^32 + 2 ran 2)
inline constexpr int64_t kMaxThreads = 4096;
inline constexpr int64_t kMaxSampleTokens = int64_t(1) << 20;  // run.sample_tokens: a sample
inline constexpr double kMaxHangTimeoutS = 1e7;  // train.hang_timeout_s: about 116 days

struct RunConfig {
  std::string model_preset = "small";
  ModelConfig model;  // the preset with any Hugging Face fields applied, finalized, validated

  struct Train {
    int64_t steps = 200;
    int64_t micro_batch = 8;
    int64_t seq_len = 256;
    int64_t grad_accum = 1;
    double lr = 2e-3;
    double min_lr = 2e-4;
    int64_t warmup_steps = 20;
    double weight_decay = 0.1;
    double grad_clip = 1.0;
    int64_t seed = 1234;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    int64_t eval_every = 50;
    int64_t eval_batches = 4;
    int64_t log_every = 1;
    // A rank with no progress in training for this long ends the job (train/watchdog.h); 0: off
    double hang_timeout_s = 1800;
  } train;

  struct Data {
    std::string path;  // empty: the corpus the build prepared (build/corpus.txt)
    std::string val_path;  // validation data of its own (empty: the tail of `path`)
    std::string format = "auto";
    bool shuffle = true;
    double val_fraction = 0.05;
  } data;

  struct Precision {
    std::string recipe = "fp32";
    int64_t high_precision_first = 0;
    int64_t high_precision_last = 0;
    // The head and the high-precision blocks: bf16 or fp32; "" is the recipe's default.
    std::string high_precision;
    // The blocks' activations: bf16 or fp32; "" is the default (bf16 on cuda under a recipe).
    std::string activations;
    int64_t stats_every = 0;
    // The attention of the blocks the recipe covers in FP8 (docs/numerics.md, "FP8 attention").
    bool fp8_attention = false;
    // The output head's GEMMs in FP8 (docs/numerics.md, "FP8 head").
    bool fp8_head = false;
    // Its data-gradient GEMM (dh = g W): "bf16" (the default) or "fp8".
    std::string fp8_head_dgrad = "bf16";
  } precision;

  struct Memory {
    std::string activation_checkpointing = "none";
  } memory;

  struct Parallel {
    std::string sharding = "full";
    int64_t shard_group = 0;
    std::string gather_dtype = "auto";
  } parallel;

  struct Checkpoint {
    std::string dir;  // empty: <run.out_dir>/checkpoints
    std::string s3_uri;
    int64_t every = 0;  // 0: only at the end of the run
    int64_t keep = 0;   // 0: keep all
    bool async = true;  // write in the background while training goes on
    std::string resume = "auto";  // auto | none | PATH
  } checkpoint;

  struct Init {
    std::string from;
  } init;

  struct Run {
    std::string name = "default";
    std::string out_dir;  // empty: runs/<name>
    std::string metrics;  // empty: <out_dir>/metrics.jsonl
    std::string device = "cpu";
    int64_t sample_tokens = 200;
    std::string sample_prompt = "The ";
    int64_t threads = 0;  // 0: OpenMP's default (OMP_NUM_THREADS or all cores)
    bool profile = false;  // per-op time of the training steps (backend/op_profile.h)
    // The same bits run to run (and in a resumed run) on every device: ops that choose by
    // timing or by free memory, or whose reductions' order varies, take their fixed forms
    // (Backend::set_deterministic; docs/config.md, "Determinism").
    bool deterministic = false;
  } run;

  // Paths with their defaults filled in.
  // What the config was built from, in order: {label, content} of the config file (its parsed
  // TOML, reformatted) and of each --set. Ranks of one job compare these (train/trainer.cpp).
  std::vector<std::pair<std::string, std::string>> sources;
  std::string config_file;  // the --config file's path (empty: none)

  std::string out_dir() const;
  std::string metrics_path() const;
  std::string checkpoint_dir() const;
};

// Reads `path` (may be empty: defaults only), applies `sets` ("section.key=value"), validates.
// Every problem is a UserError naming the key (and file); `origin` is what errors call the
// overrides ("--set"; "hyperparameters" in a SageMaker job).
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& sets,
                          const std::string& origin = "--set");

// Each "section.key=value" names a key of the schema and its value parses as that key's type,
// as load_run_config reads a --set; nothing else is checked (no config file, no validation of
// the whole). For overrides of a config file that is not at hand (`mxtrain sagemaker check`).
void check_sets(const std::vector<std::string>& sets, const std::string& origin = "--set");

// The keys whose value is one of a fixed set: model.preset, precision.recipe, data.format,
// run.device, parallel.sharding, memory.activation_checkpointing. UserError unless `value` is
// one of `key`'s, through the engine's own reading of each (naming the valid ones); nothing
// for any other key. validate() checks a config's with it, and `mxtrain sagemaker check` the
// overrides of a config file it does not have.
void check_fixed_value(const std::string& key, const std::string& value);

// One `section.key=value` override's value as the key's type reads it, spelled one way: an
// integer in decimal ("02" and "+2" are "2"), a number as the shortest text that reads back,
// a boolean as true / false, a string unquoted. UserError for an unknown key or a value of the
// wrong type, its message starting with `origin` (e.g. "--grid"). The sweep validates its grid
// with it before expanding (and tells equal values apart from equal spellings).
std::string canonical_value(const std::string& key, const std::string& value,
                            const std::string& origin = "--set");

// The documented keys, for `mxtrain train --help-config` and the docs: "section.key  type  help".
std::vector<std::string> config_reference();

}  // namespace mx
