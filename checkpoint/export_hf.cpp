#include "checkpoint/export_hf.h"

#include <cctype>
#include <vector>

#include "checkpoint/local.h"
#include "core/error.h"
#include "model/hf_weights.h"

namespace mx {

std::string export_checkpoint_hf(const std::string& checkpoint, const std::string& out_dir,
                                 std::string dtype) {
  for (auto& ch : dtype) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  MX_REQUIRE(dtype == "F32" || dtype == "BF16", "--dtype must be f32 or bf16 (got ", dtype, ")");
  std::string step_dir = resolve_checkpoint(checkpoint);
  ModelConfig cfg = checkpoint_model_config(step_dir);
  ParamLayout layout(cfg);
  std::vector<float> params(layout.total_numel());
  load_local_checkpoint(step_dir, layout, params.data(), nullptr, nullptr);
  save_hf_model(out_dir, cfg, layout, params.data(), dtype);
  return step_dir;
}

}  // namespace mx
