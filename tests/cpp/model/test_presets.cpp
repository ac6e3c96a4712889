// Presets against the parameter counts their published models report, and the shape checks.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "model/params.h"

namespace {

mx::ModelConfig preset(const char* name) {
  auto c = mx::model_preset(name);
  c.finalize();
  c.validate();
  return c;
}

TEST(Presets, ParameterCountsOfPublishedModels) {
  // Hugging Face model cards / safetensors totals of the published checkpoints.
  EXPECT_EQ(preset("llama3.2-1b").param_count(), 1235814400);  // meta-llama/Llama-3.2-1B
  EXPECT_EQ(preset("llama3.2-3b").param_count(), 3212749824);  // meta-llama/Llama-3.2-3B
  EXPECT_EQ(preset("llama3-8b").param_count(), 8030261248);    // meta-llama/Meta-Llama-3-8B
}

TEST(Presets, SizesAreWhatTheirNamesSay) {
  EXPECT_NEAR(double(preset("small").param_count()), 10.5e6, 1.0e6);
  EXPECT_NEAR(double(preset("125m").param_count()), 125e6, 25e6);
  EXPECT_NEAR(double(preset("14b").param_count()), 14e9, 1.5e9);
  EXPECT_NEAR(double(preset("32b").param_count()), 32e9, 2.5e9);
  EXPECT_NEAR(double(preset("64b").param_count()), 64e9, 4e9);
  EXPECT_THROW(mx::model_preset("7b"), mx::UserError);
}

TEST(Presets, LayoutCoversEveryParameterOnceInUnits) {
  for (const auto& name : mx::model_preset_names()) {
    auto c = preset(name.c_str());
    if (c.param_count() > 2e9) continue;  // the layout is metadata only, but keep it quick
    mx::ParamLayout layout(c);
    EXPECT_EQ(layout.total_numel(), c.param_count()) << name;
    EXPECT_EQ(int64_t(layout.units().size()), c.num_hidden_layers + 2) << name;
    int64_t offset = 0;
    for (const auto& u : layout.units()) {
      EXPECT_EQ(u.offset, offset) << name << " " << u.name;
      offset += u.numel;
    }
    EXPECT_EQ(offset, layout.total_numel());
  }
}

TEST(ModelConfig, ImpossibleShapesAreUserErrors) {
  auto c = preset("tiny");
  c.num_key_value_heads = 3;  // does not divide 4 heads
  EXPECT_THROW(c.validate(), mx::UserError);
  mx::ModelConfig d = mx::model_preset("tiny");
  d.hidden_size = 66;  // 4 heads do not divide 66 and head_dim is derived
  d.head_dim = 0;
  EXPECT_THROW(d.finalize(), mx::UserError);
}

}  // namespace
