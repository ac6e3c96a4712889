// mxtrain generate: sample text from a checkpoint or a Hugging Face model directory.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "checkpoint/sharded.h"
#include "cli/commands.h"
#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "model/generate.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"

namespace mx::cli {

namespace {
struct GenerateArgs {
  std::string model, prompt = "The ", device = "cpu";
  SampleOptions options;
  int64_t seed = 0;  // options.seed, taken signed so that a negative one is an error, not 2^64 - 1
};

int run_generate(const GenerateArgs& a) {
  MX_REQUIRE(a.options.max_new_tokens >= 1, "--max-tokens must be at least 1");
  MX_REQUIRE(a.options.temperature >= 0 && std::isfinite(a.options.temperature),
             "--temperature must be a finite number >= 0 (got ", a.options.temperature, ")");
  MX_REQUIRE(a.seed >= 0, "--seed must be >= 0 (got ", a.seed, ")");
  SampleOptions options = a.options;
  options.seed = uint64_t(a.seed);
  MX_REQUIRE(a.options.top_k >= 0, "--top-k must be >= 0");
  MX_REQUIRE(!a.prompt.empty(), "--prompt must not be empty");
  ModelConfig cfg;
  std::vector<float> params;
  const bool hf = is_hf_dir(a.model) && !std::filesystem::exists(a.model + "/manifest.json");
  if (hf) cfg = read_hf_config(a.model + "/config.json");
  else cfg = load_checkpoint_weights(a.model, params);
  MX_REQUIRE(cfg.vocab_size >= 256, "generate uses the byte-level tokenizer; the model's ",
             "vocabulary (", cfg.vocab_size, ") is smaller than 256");
  ParamLayout layout(cfg);
  if (hf) {
    params.resize(size_t(layout.total_numel()));
    load_hf_weights(a.model, layout, params.data());
  }
  auto backend = make_backend(a.device);
  auto ids = generate_tokens(cfg, layout, *backend, params.data(), byte_encode(a.prompt),
                             options);
  std::printf("%s\n", byte_decode(ids).c_str());
  return 0;
}
}  // namespace

void add_generate(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("generate", "sample text from a checkpoint or HF model");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("--model", a->model, "checkpoint step/root or Hugging Face directory")
      ->required();
  cmd->add_option("--prompt", a->prompt, "prompt text");
  cmd->add_option("--max-tokens", a->options.max_new_tokens, "tokens to generate");
  cmd->add_option("--temperature", a->options.temperature, "0: greedy");
  cmd->add_option("--top-k", a->options.top_k, "0: whole vocabulary");
  cmd->add_option("--seed", a->seed, "sampling seed (>= 0)");
  cmd->add_option("--device", a->device, "cpu | cuda");
  cmd->callback([&action, a] { action = [a] { return run_generate(*a); }; });
}

}  // namespace mx::cli
