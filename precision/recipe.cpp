#include "precision/recipe.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/log.h"

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

namespace {
// A precision.<key> that is bf16 or fp32 where "" is resolved by the caller: true for bf16;
// UserError for another value, and for bf16 under recipe fp32.
bool bf16_setting(const char* key, Recipe recipe, const std::string& value) {
  MX_REQUIRE(value == "bf16" || value == "fp32", "precision.", key,
             " must be bf16 or fp32 (got '", value, "')");
  MX_REQUIRE(!(value == "bf16" && recipe == Recipe::kFp32), "precision.", key,
             " = bf16 needs a low-precision recipe: recipe fp32 computes everything in fp32 "
             "(set precision.recipe = bf16 for bf16 throughout)");
  return value == "bf16";
}
}  // namespace

bool high_precision_bf16(Recipe recipe, const std::string& high_precision) {
  if (high_precision.empty()) return recipe != Recipe::kFp32;
  return bf16_setting("high_precision", recipe, high_precision);
}

bool bf16_activations(Recipe recipe, const std::string& activations, const std::string& device) {
  if (activations.empty()) return device == "cuda" && recipe != Recipe::kFp32;
  return bf16_setting("activations", recipe, activations);
}

bool bf16_path_only(Recipe recipe, bool bf16_activations, bool high_precision_bf16,
                    int64_t hp_first, int64_t hp_last, int64_t stats_every) {
  return recipe == Recipe::kBf16 && bf16_activations && stats_every == 0 &&
         (high_precision_bf16 || hp_first + hp_last == 0);
}

std::string high_precision_covers_all(Recipe recipe, int64_t first, int64_t last, int64_t blocks,
                                      bool high_precision_bf16, const std::string& first_last,
                                      const std::string& recipe_given) {
  if (recipe == Recipe::kFp32 || recipe == Recipe::kBf16 || first + last < blocks) return "";
  return str(first_last, " = ", first + last, " covers all ", blocks, " blocks: ", recipe_given,
             " quantizes no Linear (every one runs in ", high_precision_bf16 ? "bf16" : "fp32",
             ")");
}

namespace {
const char* kGatherNeeds =
    "parallel.gather_dtype = bf16 needs every block on native bf16 GEMMs: precision.recipe = "
    "bf16 with bf16 activations, precision.stats_every = 0 and no fp32 high-precision blocks";
}  // namespace

void check_gather_dtype(const std::string& g, bool config_path_only) {
  MX_REQUIRE(g.empty() || g == "auto" || g == "fp32" || g == "bf16",
             "parallel.gather_dtype must be auto, fp32 or bf16 (got '", g, "')");
  MX_REQUIRE(g != "bf16" || config_path_only, kGatherNeeds);
}

bool bf16_gathers(const std::string& g, bool path_only) {
  check_gather_dtype(g, true);
  if (g == "fp32") return false;
  MX_REQUIRE(g != "bf16" || path_only, kGatherNeeds, ", on a device that has them (cuda)");
  return path_only;
}

LinearRecipe::LinearRecipe(Recipe recipe, int64_t num_layers, int64_t hp_first, int64_t hp_last,
                           uint32_t seed, uint32_t rank)
    : recipe_(recipe), num_layers_(num_layers), hp_first_(hp_first), hp_last_(hp_last),
      seed_(seed), rank_(rank) {
  if (const char* knob = std::getenv("MXTRAIN_TEST_SCALE_SHIFT")) {
    long long l = -1;
    int k = 0;
    MX_REQUIRE(std::sscanf(knob, "%lld:%d", &l, &k) == 2 && l >= 0 && k >= -126 && k <= 126,
               "MXTRAIN_TEST_SCALE_SHIFT must be LAYER:SHIFT (a test-only knob), got '", knob,
               "'");
    test_layer_ = l;
    test_shift_ = k;
  }
}

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
  // Tiles of 32 x 32 keep both sides in cache; tiles are independent, so threads split them.
  constexpr int64_t kTile = 32;
  const int64_t tr = (rows + kTile - 1) / kTile, tc = (cols + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t t = 0; t < tr * tc; ++t) {
    const int64_t r0 = (t / tc) * kTile, c0 = (t % tc) * kTile;
    const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

void LinearRecipe::quantize(float* out, const float* x, int64_t rows, int64_t cols,
                            bool reduce_along_cols, LinearOperand op, int64_t layer,
                            int linear) {
  // Every quantizer writes its dequantized result straight into `out` (the caller's arena
  // buffer): no codes are kept, and scales only while telemetry needs them (into members that
  // grow once), so a step allocates nothing outside the arenas.
  const int64_t n = rows * cols;
  const Format fp8 = is_gradient(op) ? Format::kE5M2 : Format::kE4M3;  // HYBRID
  // Telemetry: null unless this step collects (the zero-cost path is this one test).
  OperandStats* st =
      collect_ && !replay_ ? &stats_[std::make_tuple(layer, linear, int(op))] : nullptr;
  numerics::QuantizeInto into;
  into.dequant = out;
  switch (recipe_) {
    case Recipe::kFp32:
      std::memcpy(out, x, sizeof(float) * size_t(n));
      return;
    case Recipe::kBf16:
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) out[i] = numerics::bf16_rounded(x[i]);
      if (st) accumulate_stats(*st, x, out, rows, cols, Format::kBF16,
                               [](int64_t, int64_t) { return 1.0f; });
      return;
    case Recipe::kFp8Current: {
      // quantize_fp8_current with its scale spelled out, so the stats see it (and the test knob
      // can move it).
      float scale = numerics::fp8_scale_from_amax(numerics::abs_max(x, n), numerics::fp8_max(fp8));
      if (layer == test_layer_) scale = std::ldexp(scale, test_shift_);
      numerics::quantize_fp8_tensor_into(x, rows, cols, fp8, scale, into);
      if (st) accumulate_stats(*st, x, out, rows, cols, fp8,
                               [scale](int64_t, int64_t) { return scale; });
      return;
    }
    case Recipe::kFp8Delayed: {
      auto key = std::make_tuple(layer, linear, int(op));
      auto& ds = delayed_[key];
      if (!ds) ds = std::make_unique<numerics::DelayedScaling>(fp8);
      float scale = 0.0f;
      if (replay_) {  // the forward's scale again (the history's before any); nothing recorded
        const auto it = last_scale_.find(key);
        scale = it != last_scale_.end() ? it->second : ds->scale();
        numerics::quantize_fp8_tensor_into(x, rows, cols, fp8, scale, into);
      } else {
        record_pending(key);  // a second quantization of the key before a flush
        const float amax = numerics::abs_max(x, n);  // before `into` (which may be x) is written
        scale = last_scale_[key] = ds->scale();
        numerics::quantize_fp8_tensor_into(x, rows, cols, fp8, scale, into);
        hold_amax(key, amax);  // into the history at the end of the pass (flush_amaxes)
      }
      if (st) accumulate_stats(*st, x, out, rows, cols, fp8,
                               [scale](int64_t, int64_t) { return scale; });
      return;
    }
    case Recipe::kFp8Block: {
      int br = 0, bc = 0;
      fp8_block_shape(op, reduce_along_cols, br, bc);
      const int64_t scale_cols = (cols + bc - 1) / bc;
      if (st) {
        scale_f32_.resize(size_t(((rows + br - 1) / br) * scale_cols));
        into.scales_f32 = scale_f32_.data();
      }
      numerics::quantize_fp8_block_into(x, rows, cols, br, bc, true, into);
      // Power-of-two scales: the stored decode scale's reciprocal is the encode scale exactly.
      if (st) accumulate_stats(*st, x, out, rows, cols, Format::kE4M3,
                               [this, scale_cols, br, bc](int64_t r, int64_t c) {
                                 return 1.0f / scale_f32_[(r / br) * scale_cols + c / bc];
                               });
      return;
    }
    case Recipe::kMxfp8: {
      const bool columnwise = !reduce_along_cols;
      const int64_t scale_cols = columnwise ? cols : (cols + 31) / 32;
      if (st) {
        scale_u8_.resize(size_t((columnwise ? (rows + 31) / 32 : rows) * scale_cols));
        into.scales_u8 = scale_u8_.data();
      }
      numerics::quantize_mxfp8_into(x, rows, cols, columnwise, Format::kE4M3,
                                    numerics::MxScaleRule::kCeil, into);
      if (st) accumulate_stats(*st, x, out, rows, cols, Format::kE4M3,
                               [this, columnwise, scale_cols](int64_t r, int64_t c) {
                                 const uint8_t e8 = scale_u8_[columnwise
                                     ? (r / 32) * scale_cols + c
                                     : r * scale_cols + c / 32];
                                 // TE's exp2f_rcp, as quantize_mxfp8 applies it
                                 return e8 == 0 ? 1.0f
                                                : numerics::bits_float(uint32_t(254 - int(e8)) << 23);
                               });
      return;
    }
    case Recipe::kNvfp4: {
      const numerics::RoundingOptions rounding = nvfp4_rounding(op, layer, linear);
      const bool blocks_2d = is_weight(op);
      // 1x16 blocks down the columns: the rowwise quantization of x^T, transposed back (the
      // quantizer's column mode computes exactly that without the two transposes).
      const bool columnwise = !blocks_2d && !reduce_along_cols;
      const int64_t block_rows = blocks_2d || columnwise ? 16 : 1;
      const int64_t scale_cols = columnwise ? cols : (cols + 15) / 16;
      const int64_t scale_rows = (rows + block_rows - 1) / block_rows;
      if (st) {
        scale_u8_.resize(size_t(scale_rows * scale_cols));
        into.scales_u8 = scale_u8_.data();
      }
      const float s_enc =
          numerics::quantize_nvfp4_into(x, rows, cols, blocks_2d, columnwise, into, rounding);
      if (st) {
        const float s_dec = 1.0f / s_enc;  // the quantizer's own fp32 operations
        const int64_t col_block = columnwise ? 1 : 16;
        accumulate_stats(*st, x, out, rows, cols, Format::kE2M1,
                         [this, s_dec, block_rows, col_block, scale_cols](int64_t r, int64_t c) {
                           const float sb = numerics::decode_e4m3(
                               scale_u8_[(r / block_rows) * scale_cols + c / col_block]);
                           return std::fmin(1.0f / (sb * s_dec), FLT_MAX);
                         });
      }
      return;
    }
  }
}

numerics::RoundingOptions LinearRecipe::nvfp4_rounding(LinearOperand op, int64_t layer,
                                                       int linear) const {
  numerics::RoundingOptions rounding;
  if (is_gradient(op)) {  // stochastic rounding for gradients only
    rounding.stochastic = true;
    // tensor_id: the operand's own number below 2^18 (layers < 4096, 8 Linears, 8 operands),
    // the micro-batch above it (mod 2^14: micro-batches 16384 apart in one step share draws).
    rounding.rng = numerics::RandomStream{
        seed_, step_, rank_,
        uint32_t(layer * 64 + linear * 8 + int(op)) | ((micro_batch_ & 0x3FFFu) << 18)};
  }
  return rounding;
}

numerics::Format LinearRecipe::fp8_format(LinearOperand op) {
  return is_gradient(op) ? Format::kE5M2 : Format::kE4M3;  // HYBRID, as quantize() does
}

void LinearRecipe::fp8_block_shape(LinearOperand op, bool reduce_along_cols, int& block_rows,
                                   int& block_cols) {
  block_rows = is_weight(op) ? 128 : reduce_along_cols ? 1 : 128;
  block_cols = is_weight(op) ? 128 : reduce_along_cols ? 128 : 1;
}

float LinearRecipe::delayed_scale(int64_t layer, int linear, LinearOperand op) {
  const auto key = std::make_tuple(layer, linear, int(op));
  if (auto it = last_scale_.find(key); replay_ && it != last_scale_.end()) return it->second;
  auto& ds = delayed_[key];
  if (!ds) ds = std::make_unique<numerics::DelayedScaling>(fp8_format(op));
  if (replay_) return ds->scale();  // a replay before any forward: nothing to remember
  record_pending(key);  // a second quantization of the key before a flush
  return last_scale_[key] = ds->scale();
}

void LinearRecipe::delayed_record(int64_t layer, int linear, LinearOperand op, float amax) {
  if (replay_) return;  // a recompute's amax: the forward it repeats recorded it
  const auto key = std::make_tuple(layer, linear, int(op));
  MX_ASSERT(delayed_[key] != nullptr);  // delayed_scale() made it
  hold_amax(key, amax);
}

void LinearRecipe::hold_amax(const std::tuple<int64_t, int, int>& key, float amax) {
  record_pending(key);
  pending_amax_[key] = amax;
}

void LinearRecipe::record_pending(const std::tuple<int64_t, int, int>& key) {
  const auto it = pending_amax_.find(key);
  if (it == pending_amax_.end()) return;
  delayed_[key]->record(it->second);  // unreduced: only a key quantized twice in a pass
  pending_amax_.erase(it);
}

void LinearRecipe::flush_amaxes() {
  if (pending_amax_.empty()) return;
  if (reduce_amax_) {
    reduce_buf_.clear();
    for (const auto& [key, amax] : pending_amax_)
      reduce_buf_.push_back(std::isnan(amax) ? -1.0f : amax);  // NaN: lost to any number
    reduce_amax_(reduce_buf_.data(), int64_t(reduce_buf_.size()));
    size_t i = 0;
    for (auto& [key, amax] : pending_amax_) {
      const float v = reduce_buf_[i++];
      amax = v < 0.0f ? std::numeric_limits<float>::quiet_NaN() : v;
    }
  }
  for (const auto& [key, amax] : pending_amax_) delayed_[key]->record(amax);
  pending_amax_.clear();
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

int64_t LinearRecipe::delayed_operand_count() const {
  if (recipe_ != Recipe::kFp8Delayed) return 0;
  int64_t n = 0;
  for (int64_t layer = 0; layer < num_layers_; ++layer) n += active(layer) ? 7 * 6 : 0;
  return n;
}

int64_t LinearRecipe::restore_delayed_state(const std::vector<DelayedState>& states) {
  int64_t restored = 0;
  for (const DelayedState& st : states) {
    if (recipe_ != Recipe::kFp8Delayed || !active(st.layer)) continue;
    ++restored;
    const auto op = LinearOperand(st.op);
    const Format fp8 = is_gradient(op) ? Format::kE5M2 : Format::kE4M3;  // as quantize() makes it
    auto& ds = delayed_[std::make_tuple(st.layer, st.linear, st.op)];
    ds = std::make_unique<numerics::DelayedScaling>(fp8);
    ds->restore(st.amax_history, st.scale);
  }
  return restored;
}

void LinearRecipe::record_attention_amax(int64_t layer, const numerics::AttnFp8Amax& a,
                                         bool backward, int64_t D, int64_t rows_per_key,
                                         float attn_scale) {
  if (!collect_) return;
  const numerics::AttnFp8ForwardScales f = numerics::attn_fp8_forward_scales(a.q, a.k, a.v);
  auto put = [&](const char* name, const char* format, float amax, float scale) {
    AttnEntry& e = attn_stats_[{layer, name}];
    e.format = format;
    // (several micro-batches: the largest amax, with the scale it was encoded at)
    if (double(amax) >= e.amax) e.amax = amax, e.scale = scale;
  };
  if (!backward) {
    put("q", "e4m3", a.q, f.q);
    put("k", "e4m3", a.k, f.k);
    put("v", "e4m3", a.v, f.v);
    put("p", "e4m3", a.p, f.s);
    put("o", "e4m3", a.o, f.o);
    return;
  }
  const numerics::AttnFp8BackwardScales b =
      numerics::attn_fp8_backward_scales(a.q, a.k, a.v, a.dO, D, rows_per_key, attn_scale);
  put("do", "e5m2", a.dO, b.dO);
  put("ds", "e5m2", a.dS, b.dP);
  put("dq", "e5m2", a.dQ, b.dQ);
  put("dk", "e5m2", a.dK, b.dK);
  put("dv", "e5m2", a.dV, b.dV);
}

void LinearRecipe::record_head_stats(const float* h, int64_t N, int64_t C, const float* w,
                                     int64_t V) {
  if (!collect_ || replay_) return;
  auto one = [&](const char* name, const float* x, int64_t rows, int64_t cols) {
    // the head's own rule (backend.h), so the record describes what the head quantizes
    const float scale = head_fp8_scale(numerics::abs_max(x, rows * cols), Format::kE4M3);
    std::vector<float> d(size_t(rows * cols));
    numerics::quantize_fp8_tensor_into(x, rows, cols, Format::kE4M3, scale,
                                       numerics::QuantizeInto{d.data()});
    accumulate_stats(head_stats_[name], x, d.data(), rows, cols, Format::kE4M3,
                     [scale](int64_t, int64_t) { return scale; });
  };
  one("head.fwd.input", h, N, C);
  one("head.fwd.weight", w, V, C);
}

void LinearRecipe::record_head_grad_amax(float amax, float grad_scale) {
  if (!collect_ || replay_) return;
  AttnEntry& e = head_grad_stats_ ? *head_grad_stats_ : head_grad_stats_.emplace(AttnEntry{"e5m2"});
  if (double(amax) >= e.amax)
    e.amax = amax, e.scale = head_fp8_scale(std::fabs(grad_scale), Format::kE5M2);
}

nlohmann::json LinearRecipe::finish_stats(int64_t step) {
  collect_ = false;
  std::vector<std::string> saturated;
  nlohmann::json attn = nlohmann::json::object();
  // an entry of a tensor that exists only inside an op: format, amax, scale and headroom (the
  // format's largest value over amax x scale), which it returns
  auto put = [&attn](const std::string& name, const AttnEntry& e) {
    const double max = std::strcmp(e.format, "e5m2") == 0 ? 57344.0 : 448.0;
    const double headroom = e.amax > 0 ? max / (e.amax * e.scale) : INFINITY;
    attn[name] = {{"format", e.format}, {"amax", e.amax}, {"scale", e.scale},
                  {"headroom", std::isfinite(headroom) ? nlohmann::json(headroom) : nullptr}};
    return headroom;
  };
  for (const auto& [key, e] : attn_stats_) {
    const std::string name = str("layers.", key.first, ".self_attn.fp8_attention.", key.second);
    if (put(name, e) < 1.0) saturated.push_back(name);
  }
  attn_stats_.clear();
  if (const auto& e = head_grad_stats_) {
    // (headroom |grad_scale| / amax: at least 1 by the bound, up to the fp32 rounding of the
    // scale; only SATFINITE's clamp, at E5M2's saturation threshold, counts as saturated)
    put("head.bwd.grad_output", *e);
    if (e->amax * e->scale >= double(saturation_threshold(Format::kE5M2)))
      warn(str("numerics: the FP8 head's logits gradient saturated at step ", step,
               ": amax ", e->amax, " past its bound |grad_scale| (docs/numerics.md, \"FP8 "
               "head\")"));
  }
  head_grad_stats_.reset();
  std::vector<std::pair<std::string, OperandStats>> operands(head_stats_.begin(),
                                                             head_stats_.end());
  head_stats_.clear();
  if (!saturated.empty())
    warn(str("numerics: FP8 attention saturated at step ", step, " in ", saturated.front(),
             saturated.size() > 1 ? str(" and ", saturated.size() - 1, " more") : std::string(),
             ": an amax passed its bound-derived scale's range (docs/numerics.md, \"FP8 "
             "attention\")"));
  for (const auto& [key, s] : stats_)
    operands.emplace_back(operand_name(std::get<0>(key), std::get<1>(key), std::get<2>(key)), s);
  if (operands.empty()) return attn.empty() ? nlohmann::json(nullptr) : attn;
  nlohmann::json j = attn;
  std::vector<std::string> collapsed;
  for (const auto& [name, s] : operands) {
    j[name] = s.to_json();
    const std::string reason = monitor_.check(name, s.format, s.sqnr_db());
    if (!reason.empty()) {
      char v[32];
      std::snprintf(v, sizeof v, "%.1f dB", s.sqnr_db());
      collapsed.push_back(str(name, " ", v, " (", s.format, ", ", reason, ")"));
    }
  }
  stats_.clear();
  if (!collapsed.empty()) {
    constexpr size_t kShown = 6;
    std::string msg = str("numerics: SQNR collapsed at step ", step, " in ", collapsed.size(),
                          " operand(s): ");
    for (size_t i = 0; i < collapsed.size() && i < kShown; ++i)
      msg += (i ? "; " : "") + collapsed[i];
    if (collapsed.size() > kShown) msg += str("; and ", collapsed.size() - kShown, " more");
    warn(msg);
  }
  return j;
}

}  // namespace mx
