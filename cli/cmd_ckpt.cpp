// mxtrain ckpt: inspect checkpoints and export them as Hugging Face models.
#include <cstdio>

#include "checkpoint/local.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/hf_weights.h"

namespace mx::cli {

namespace {
int export_hf(const std::string& checkpoint, const std::string& out_dir, std::string dtype) {
  for (auto& ch : dtype) ch = char(std::toupper(ch));
  MX_REQUIRE(dtype == "F32" || dtype == "BF16", "--dtype must be f32 or bf16 (got ", dtype, ")");
  std::string step_dir = resolve_checkpoint(checkpoint);
  ModelConfig cfg = checkpoint_model_config(step_dir);
  ParamLayout layout(cfg);
  std::vector<float> params(layout.total_numel());
  load_local_checkpoint(step_dir, layout, params.data(), nullptr, nullptr);
  save_hf_model(out_dir, cfg, layout, params.data(), dtype);
  std::printf("exported %s -> %s (%s)\n", step_dir.c_str(), out_dir.c_str(), dtype.c_str());
  return 0;
}
}  // namespace

void add_ckpt(CLI::App& app, Action& action) {
  auto* ckpt = app.add_subcommand("ckpt", "checkpoint tools");
  ckpt->require_subcommand(1);
  auto* exp = ckpt->add_subcommand("export-hf", "write a checkpoint as a Hugging Face model");
  auto checkpoint = std::make_shared<std::string>();
  auto out_dir = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("f32");
  exp->add_option("CHECKPOINT", *checkpoint, "step directory, or a root (its newest step)")
      ->required();
  exp->add_option("OUT_DIR", *out_dir, "output directory")->required();
  exp->add_option("--dtype", *dtype, "f32 | bf16");
  exp->callback([&action, checkpoint, out_dir, dtype] {
    action = [=] { return export_hf(*checkpoint, *out_dir, *dtype); };
  });
  auto* ls = ckpt->add_subcommand("ls", "list the committed steps under a checkpoint root");
  auto root = std::make_shared<std::string>();
  ls->add_option("ROOT", *root, "checkpoint root")->required();
  ls->callback([&action, root] {
    action = [root] {
      std::string latest = latest_checkpoint(*root);
      MX_REQUIRE(!latest.empty(), "no committed checkpoints under ", *root);
      auto state = checkpoint_state(latest);
      std::printf("%s\tstep %lld (newest)\n", latest.c_str(),
                  static_cast<long long>(state["step"].get<int64_t>()));
      return 0;
    };
  });
}

}  // namespace mx::cli
