#include "checkpoint/export_hf.h"

#include <cctype>
#include <vector>

#include "checkpoint/sharded.h"
#include "checkpoint/storage.h"
#include "core/error.h"
#include "model/hf_weights.h"

namespace mx {

std::string export_checkpoint_hf(const std::string& checkpoint, const std::string& out_dir,
                                 std::string dtype) {
  const std::string given = dtype;
  for (auto& ch : dtype) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  MX_REQUIRE(dtype == "F32" || dtype == "BF16", "--dtype must be f32 or bf16 (got ", given, ")");
  const std::string inside = enclosing_step_dir(out_dir);
  MX_REQUIRE(inside.empty(), "export-hf: the output directory ", out_dir, " lies inside the ",
             "checkpoint ", inside, ": its config.json and model.safetensors would change that ",
             "checkpoint's files (export to a directory of its own)");
  // a root with config.json reads as a Hugging Face model: generate --model ROOT then loaded
  // the export instead of the newest step
  MX_REQUIRE(!holds_checkpoint_steps(out_dir), "export-hf: the output directory ", out_dir,
             " is a checkpoint root (it holds checkpoint steps): its config.json would make ",
             "the root read as a Hugging Face model (export to a directory of its own)");
  std::vector<float> params;
  std::string step_location;
  ModelConfig cfg = load_checkpoint_weights(checkpoint, params, &step_location);
  ParamLayout layout(cfg);
  save_hf_model(out_dir, cfg, layout, params.data(), dtype);
  return step_location;
}

}  // namespace mx
