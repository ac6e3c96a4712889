// mxtrain debug grads: one forward+backward on given tokens from given weights, every
// parameter's gradient out under its Hugging Face name (the hook for reference checks).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "checkpoint/safetensors.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"
#include "precision/recipe.h"
#include "train/engine.h"

namespace mx::cli {

namespace {

struct GradsArgs {
  std::string init, tokens, out, checkpointing = "none", device = "cpu", recipe = "fp32";
  std::string high_precision;  // "": the recipe's default
  std::string activations;     // "": the device's default
  int64_t batch = 0, seq = 0, hp_first = 0, hp_last = 0;
  bool fp8_attention = false;
  bool fp8_head = false;
  std::string fp8_head_dgrad = "bf16";
};

std::vector<int32_t> read_tokens(const std::string& path, int64_t count, int64_t vocab) {
  std::error_code ec;
  MX_REQUIRE(std::filesystem::exists(path, ec), "token file ", path, " does not exist");
  MX_REQUIRE(std::filesystem::is_regular_file(path, ec), "token file ", path,
             " is not a regular file");
  auto size = std::filesystem::file_size(path, ec);
  MX_REQUIRE(!ec && size == uint64_t(count) * 4, "token file ", path, " has ", size,
             " bytes; --batch x (--seq + 1) int32 tokens need ", count * 4);
  std::vector<int32_t> tokens(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(tokens.data()), std::streamsize(count * 4));
  if (!in) throw StorageError(str("cannot read ", path));
  for (int64_t i = 0; i < count; ++i)
    MX_REQUIRE(tokens[i] >= 0 && tokens[i] < vocab, "token file ", path, ": token ", tokens[i],
               " at position ", i, " is outside the vocabulary [0, ", vocab, ")");
  return tokens;
}

int run_grads(const GradsArgs& a) {
  MX_REQUIRE(a.batch >= 1 && a.seq >= 1, "--batch and --seq must be at least 1");
  // (seq + 1) x batch int32 tokens, far above any use: no product below overflows
  MX_REQUIRE(a.seq < (int64_t(1) << 31), "--seq must be below 2^31 (got ", a.seq, ")");
  MX_REQUIRE(a.batch <= (int64_t(1) << 40) / (a.seq + 1), "--batch x (--seq + 1) (", a.batch,
             " x ", a.seq + 1, ") is more than 2^40 tokens");
  require_distinct_output(a.out, "--out", a.tokens, "--tokens");
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(a.init, ec))  // the weights, config
    require_distinct_output(a.out, "--out", e.path().string(), "--init directory's");
  MX_REQUIRE(is_hf_dir(a.init), "--init ", a.init, " is not a Hugging Face model directory ",
             "(no config.json)");
  ModelConfig cfg = read_hf_config(a.init + "/config.json");
  auto tokens = read_tokens(a.tokens, a.batch * (a.seq + 1), cfg.vocab_size);
  EngineOptions eo;
  eo.device = a.device;
  eo.checkpointing = parse_checkpointing(a.checkpointing);
  eo.micro_batch = a.batch;
  eo.seq_len = a.seq;
  eo.optimizer = false;
  const Recipe recipe = parse_recipe(a.recipe);
  const bool hp_bf16 = high_precision_bf16(recipe, a.high_precision);
  eo.quantized = recipe != Recipe::kFp32;
  eo.bf16_activations = bf16_activations(recipe, a.activations, a.device);
  MX_REQUIRE(a.hp_first >= 0 && a.hp_last >= 0,
             "--high-precision-first / --high-precision-last must be >= 0");
  eo.bf16_path_only =
      bf16_path_only(recipe, eo.bf16_activations, hp_bf16, a.hp_first, a.hp_last, 0);
  const std::string covers_all =
      high_precision_covers_all(recipe, a.hp_first, a.hp_last, cfg.num_hidden_layers, hp_bf16,
                                "--high-precision-first + --high-precision-last",
                                str("--recipe ", a.recipe));
  if (!covers_all.empty()) warn(covers_all);  // (as `train` says it)
  Engine engine(cfg, eo);
  LinearRecipe linear_recipe(recipe, cfg.num_hidden_layers, a.hp_first, a.hp_last, 0, 0);
  linear_recipe.set_high_precision_bf16(hp_bf16);
  MX_REQUIRE(!a.fp8_attention || recipe != Recipe::kFp32,
             "--fp8-attention needs a --recipe other than fp32");
  linear_recipe.set_fp8_attention(a.fp8_attention);
  MX_REQUIRE(!a.fp8_head || recipe != Recipe::kFp32, "--fp8-head needs a --recipe other than fp32");
  MX_REQUIRE(a.fp8_head_dgrad == "bf16" || a.fp8_head_dgrad == "fp8",
             "--fp8-head-dgrad must be bf16 or fp8 (got '", a.fp8_head_dgrad, "')");
  linear_recipe.set_fp8_head(a.fp8_head, a.fp8_head_dgrad == "fp8");
  if (recipe != Recipe::kFp32) engine.model->set_recipe(&linear_recipe);
  // The engine's parameters and gradients live in the backend's memory (the GPU's on cuda):
  // the weights go in and the gradients come out through host copies.
  const size_t bytes = sizeof(float) * size_t(engine.layout.total_numel());
  std::vector<float> host(size_t(engine.layout.total_numel()));
  load_hf_weights(a.init, engine.layout, host.data());
  prepare_output_file(a.out, "--out");  // every input checked; before the forward-backward
  engine.backend->copy_from_host(engine.param_data(), host.data(), bytes);
  double loss = engine.model->forward_backward(engine.param_data(), engine.grad_data(),
                                               tokens.data(), a.batch, a.seq, 1.0f);
  engine.backend->copy_to_host(host.data(), engine.grad_data(), bytes);
  SafeTensorsWriter w;
  for (const ParamTensor& t : engine.layout.tensors())
    w.add_f32(t.hf_name, t.shape, host.data() + t.offset);
  w.write(a.out);
  std::printf("loss %.9g\npeak_mem_bytes %lld\n", loss,
              static_cast<long long>(engine.tracker.peak()));
  return 0;
}

}  // namespace

void add_debug(CLI::App& app, Action& action) {
  auto* debug = app.add_subcommand("debug", "developer tools");
  debug->require_subcommand(1);
  auto* grads = debug->add_subcommand(
      "grads", "one forward+backward; writes every parameter's gradient (HF names)");
  auto a = std::make_shared<GradsArgs>();
  grads->add_option("--init", a->init, "Hugging Face model directory")->required();
  grads->add_option("--tokens", a->tokens, "int32 tokens [batch, seq+1]")->required();
  grads->add_option("--batch", a->batch, "sequences")->required();
  grads->add_option("--seq", a->seq, "tokens per sequence (inputs)")->required();
  grads->add_option("--out", a->out, "gradients .safetensors")->required();
  grads->add_option("--checkpointing", a->checkpointing, "none | selective | full");
  grads->add_option("--device", a->device, "cpu | cuda");
  grads->add_option("--recipe", a->recipe, "precision recipe of the block Linears (default fp32)");
  grads->add_option("--high-precision-first", a->hp_first,
                    "first N blocks left in high precision (precision.high_precision_first)");
  grads->add_option("--high-precision-last", a->hp_last,
                    "last N blocks left in high precision (precision.high_precision_last)");
  grads->add_option("--high-precision", a->high_precision,
                    "bf16 | fp32: the output head under a recipe (default: bf16 unless the "
                    "recipe is fp32), as precision.high_precision");
  grads->add_flag("--fp8-attention", a->fp8_attention,
                  "attention in FP8 in the blocks the recipe covers (precision.fp8_attention)");
  grads->add_flag("--fp8-head", a->fp8_head,
                  "the output head's GEMMs in FP8 (precision.fp8_head)");
  grads->add_option("--fp8-head-dgrad", a->fp8_head_dgrad,
                    "bf16 | fp8: the FP8 head's data-gradient GEMM, as precision.fp8_head_dgrad "
                    "(default bf16)");
  grads->add_option("--activations", a->activations,
                    "bf16 | fp32: the blocks' activations, as precision.activations (default: "
                    "bf16 on --device cuda under a recipe, else fp32)");
  grads->callback([&action, a] { action = [a] { return run_grads(*a); }; });
}

}  // namespace mx::cli
