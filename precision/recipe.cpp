#include "precision/recipe.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace mx {

using numerics::Format;

Recipe parse_recipe(const std::string& s) {
  if (s == "fp32") return Recipe::kFp32;
  if (s == "bf16") return Recipe::kBf16;
  if (s == "fp8-current") return Recipe::kFp8Current;
  if (s == "fp8-delayed") return Recipe::kFp8Delayed;
  if (s == "fp8-block") return Recipe::kFp8Block;
  if (s == "mxfp8") return Recipe::kMxfp8;
  if (s == "nvfp4") return Recipe::kNvfp4;
  throw UserError(str("unknown precision.recipe '", s,
                      "' (fp32, bf16, fp8-current, fp8-delayed, fp8-block, mxfp8, nvfp4)"));
}

const char* recipe_name(Recipe r) {
  switch (r) {
    case Recipe::kFp32: return "fp32";
    case Recipe::kBf16: return "bf16";
    case Recipe::kFp8Current: return "fp8-current";
    case Recipe::kFp8Delayed: return "fp8-delayed";
    case Recipe::kFp8Block: return "fp8-block";
    case Recipe::kMxfp8: return "mxfp8";
    case Recipe::kNvfp4: return "nvfp4";
  }
  return "?";
}

LinearRecipe::LinearRecipe(Recipe recipe, int64_t num_layers, int64_t hp_first, int64_t hp_last,
                           uint32_t seed, uint32_t rank)
    : recipe_(recipe), num_layers_(num_layers), hp_first_(hp_first), hp_last_(hp_last),
      seed_(seed), rank_(rank) {}

bool LinearRecipe::active(int64_t layer) const {
  return recipe_ != Recipe::kFp32 && layer >= hp_first_ && layer < num_layers_ - hp_last_;
}

uint32_t LinearRecipe::hadamard_seed(int64_t layer, int linear) const {
  return seed_ ^ uint32_t(layer * 131 + linear * 7 + 1);
}

namespace {
bool is_gradient(LinearOperand op) {
  return op == LinearOperand::kDgradGrad || op == LinearOperand::kWgradGrad;
}
bool is_weight(LinearOperand op) {
  return op == LinearOperand::kFwdWeight || op == LinearOperand::kDgradWeight;
}
}  // namespace

void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

void LinearRecipe::quantize(float* out, const float* x, int64_t rows, int64_t cols,
                            bool reduce_along_cols, LinearOperand op, int64_t layer,
                            int linear) {
  const int64_t n = rows * cols;
  const Format fp8 = is_gradient(op) ? Format::kE5M2 : Format::kE4M3;  // HYBRID
  numerics::Quantized q;
  switch (recipe_) {
    case Recipe::kFp32:
      std::memcpy(out, x, sizeof(float) * size_t(n));
      return;
    case Recipe::kBf16:
      for (int64_t i = 0; i < n; ++i) out[i] = numerics::decode_bf16(numerics::encode_bf16(x[i]));
      return;
    case Recipe::kFp8Current:
      q = numerics::quantize_fp8_current(x, rows, cols, fp8);
      break;
    case Recipe::kFp8Delayed: {
      auto key = std::make_tuple(layer, linear, int(op));
      auto& ds = delayed_[key];
      if (!ds) ds = std::make_unique<numerics::DelayedScaling>(fp8);
      q = ds->quantize(x, rows, cols);
      break;
    }
    case Recipe::kFp8Block:
      q = is_weight(op) ? numerics::quantize_fp8_block(x, rows, cols, 128, 128)
          : reduce_along_cols ? numerics::quantize_fp8_block(x, rows, cols, 1, 128)
                              : numerics::quantize_fp8_block(x, rows, cols, 128, 1);
      break;
    case Recipe::kMxfp8:
      q = numerics::quantize_mxfp8(x, rows, cols, /*columnwise=*/!reduce_along_cols);
      break;
    case Recipe::kNvfp4: {
      numerics::RoundingOptions rounding;
      if (is_gradient(op)) {  // stochastic rounding for gradients only
        rounding.stochastic = true;
        rounding.rng = numerics::RandomStream{seed_, step_, rank_,
                                              uint32_t(layer * 64 + linear * 8 + int(op))};
      }
      if (is_weight(op)) {
        q = numerics::quantize_nvfp4(x, rows, cols, /*blocks_2d=*/true, rounding);
      } else if (reduce_along_cols) {
        q = numerics::quantize_nvfp4(x, rows, cols, false, rounding);
      } else {  // 1x16 blocks down the columns: quantize the transpose rowwise
        std::vector<float> t(static_cast<size_t>(n));
        transpose(t.data(), x, rows, cols);
        q = numerics::quantize_nvfp4(t.data(), cols, rows, false, rounding);
        transpose(out, q.dequant.data(), cols, rows);
        return;
      }
      break;
    }
  }
  std::memcpy(out, q.dequant.data(), sizeof(float) * size_t(n));
}

std::vector<LinearRecipe::DelayedState> LinearRecipe::delayed_state() const {
  std::vector<DelayedState> out;
  for (const auto& [key, ds] : delayed_) {
    if (!ds) continue;
    out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), ds->scale(),
                   ds->amax_history()});
  }
  return out;
}

void LinearRecipe::restore_delayed_state(const std::vector<DelayedState>& states) {
  for (const DelayedState& st : states) {
    const auto op = LinearOperand(st.op);
    const Format fp8 = is_gradient(op) ? Format::kE5M2 : Format::kE4M3;  // as quantize() makes it
    auto& ds = delayed_[std::make_tuple(st.layer, st.linear, st.op)];
    ds = std::make_unique<numerics::DelayedScaling>(fp8);
    ds->restore(st.amax_history, st.scale);
  }
}

}  // namespace mx
