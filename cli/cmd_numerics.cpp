// mxtrain numerics: the low-precision formats and quantizers from the command line.
//   quantize: per input tensor x, writes x.codes, x.scales, x.dequant (and x.global_scale).
//   codec (hidden; for the ml_dtypes reference tests): element-wise encode/decode of one format.
//   stats (hidden; for the telemetry reference tests): each tensor through a recipe's quantizer
//     as one GEMM operand, printing the telemetry (amax, saturated, flushed, SQNR) as JSON.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "cli/commands.h"
#include "core/error.h"
#include "numerics/formats.h"
#include "numerics/quantize.h"
#include "precision/recipe.h"

namespace mx::cli {

namespace {

using namespace mx::numerics;

struct QuantizeArgs {
  std::string format, in, out, block, scale_rule = "ceil", mx_elem = "e4m3";
  bool stochastic = false, no_pow2_scales = false;
  uint64_t seed = 0;
  float margin = 0.0f;
  std::set<std::string> given;  // the format-specific options on the command line
};

struct CodecArgs {
  std::string format, in, out, saturation = "satfinite", rounding;  // rounding: rne / nearest
  uint64_t seed = 0;
};

struct StatsArgs {
  std::string recipe, operand, in;
};

std::vector<std::string> names_in_order(const SafeTensorsReader& reader) {
  std::vector<std::string> names;
  for (const TensorEntry& e : reader.tensors()) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

uint32_t seed32(uint64_t seed) {
  MX_REQUIRE(seed <= 0xFFFFFFFFull, "--seed must be in [0, 2^32), got ", seed);
  return uint32_t(seed);
}

int run_quantize(const QuantizeArgs& a) {
  require_distinct_output(a.out, "--out", a.in, "--in");
  const std::string& f = a.format;
  MX_REQUIRE(f == "e4m3" || f == "e5m2" || f == "fp8-block" || f == "mxfp8" || f == "nvfp4",
             "--format must be e4m3, e5m2, fp8-block, mxfp8 or nvfp4, got '", f, "'");
  std::string block = a.block;
  if (!a.given.count("--block")) block = f == "fp8-block" ? "1x128" : f == "mxfp8" ? "1x32" : "1x16";
  if (f == "fp8-block")
    MX_REQUIRE(block == "1x128" || block == "128x128",
               "--block for fp8-block must be 1x128 or 128x128, got '", block, "'");
  if (f == "mxfp8")
    MX_REQUIRE(block == "1x32" || block == "32x1",
               "--block for mxfp8 must be 1x32 (rowwise) or 32x1 (columnwise), got '", block, "'");
  if (f == "nvfp4")
    MX_REQUIRE(block == "1x16" || block == "16x16",
               "--block for nvfp4 must be 1x16 or 16x16, got '", block, "'");
  MX_REQUIRE(!a.given.count("--block") || f == "fp8-block" || f == "mxfp8" || f == "nvfp4",
             "--block does not apply to --format ", f);
  // An option the format does not use would be ignored silently: the output would not be what
  // the command line says.
  auto only_for = [&](const char* opt, bool applies, const char* formats) {
    MX_REQUIRE(!a.given.count(opt) || applies, opt, " does not apply to --format ", f,
               " (only ", formats, ")");
  };
  only_for("--no-pow2-scales", f == "fp8-block", "fp8-block");
  only_for("--scale-rule", f == "mxfp8", "mxfp8");
  only_for("--mx-elem", f == "mxfp8", "mxfp8");
  only_for("--margin", f == "e4m3" || f == "e5m2", "e4m3 and e5m2");
  MX_REQUIRE(!a.given.count("--seed") || a.stochastic, "--seed applies only with --stochastic");
  MX_REQUIRE(a.scale_rule == "ceil" || a.scale_rule == "floor",
             "--scale-rule must be ceil (TE/cuBLAS) or floor (OCP), got '", a.scale_rule, "'");
  MX_REQUIRE(a.mx_elem == "e4m3" || a.mx_elem == "e5m2",
             "--mx-elem must be e4m3 or e5m2, got '", a.mx_elem, "'");
  MX_REQUIRE(std::isfinite(a.margin) && a.margin >= 0.0f && a.margin <= 64.0f,
             "--margin must be in [0, 64]");
  RoundingOptions ro;
  ro.stochastic = a.stochastic;
  ro.rng.seed = seed32(a.seed);

  SafeTensorsReader reader(a.in);
  const std::vector<std::string> names = names_in_order(reader);
  MX_REQUIRE(!names.empty(), a.in, " holds no tensors");
  SafeTensorsWriter writer;
  for (size_t t = 0; t < names.size(); ++t) {
    const TensorEntry& e = reader.entry(names[t]);
    MX_REQUIRE(e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16", "tensor '", e.name,
               "' has dtype ", e.dtype, "; numerics quantize takes F32, BF16 or F16");
    const int64_t n = e.numel();
    MX_REQUIRE(n > 0, "tensor '", e.name, "' has no elements");
    const int64_t cols = e.shape.empty() ? 1 : e.shape.back();
    const int64_t rows = n / cols;
    std::vector<float> x = reader.read_f32(e.name);
    for (int64_t i = 0; i < n; ++i)
      MX_REQUIRE(std::isfinite(x[i]), "tensor '", e.name, "' has a non-finite value (", x[i],
                 ") at flat index ", i, "; the quantizers take finite tensors");
    ro.rng.tensor_id = uint32_t(t);
    Quantized q;
    if (f == "e4m3" || f == "e5m2")
      q = quantize_fp8_current(x.data(), rows, cols, f == "e4m3" ? Format::kE4M3 : Format::kE5M2,
                               a.margin, ro);
    else if (f == "fp8-block")
      q = quantize_fp8_block(x.data(), rows, cols, block == "1x128" ? 1 : 128, 128,
                             !a.no_pow2_scales, ro);
    else if (f == "mxfp8")
      q = quantize_mxfp8(x.data(), rows, cols, block == "32x1",
                         a.mx_elem == "e5m2" ? Format::kE5M2 : Format::kE4M3,
                         a.scale_rule == "floor" ? MxScaleRule::kFloor : MxScaleRule::kCeil, ro);
    else
      q = quantize_nvfp4(x.data(), rows, cols, block == "16x16", ro);

    // A 0-d tensor (shape []) is one row of one column: its dequant and codes keep shape [].
    const std::vector<int64_t>& shape = e.shape;
    std::vector<int64_t> code_shape = shape;
    if (!code_shape.empty()) code_shape.back() = q.code_cols;
    MX_ASSERT(!shape.empty() || q.code_cols == 1);
    // Wider dtypes first keeps every F32 tensor 4-byte aligned in the file.
    writer.add_f32(e.name + ".dequant", shape, q.dequant.data());
    if (!q.scales_f32.empty()) {
      std::vector<int64_t> sshape = (f == "e4m3" || f == "e5m2")
                                        ? std::vector<int64_t>{1}
                                        : std::vector<int64_t>{q.scale_rows, q.scale_cols};
      writer.add_f32(e.name + ".scales", sshape, q.scales_f32.data());
    }
    if (f == "nvfp4") writer.add_f32(e.name + ".global_scale", {1}, &q.global_scale);
    writer.add_raw(e.name + ".codes", "U8", code_shape, q.codes.data(), q.codes.size());
    if (!q.scales_u8.empty())
      writer.add_raw(e.name + ".scales", "U8", {q.scale_rows, q.scale_cols}, q.scales_u8.data(),
                     q.scales_u8.size());
  }
  writer.set_metadata("mxtrain_numerics_format", f);
  prepare_output_file(a.out, "--out");
  writer.write(a.out);
  return 0;
}

int run_codec(const CodecArgs& a) {
  require_distinct_output(a.out, "--out", a.in, "--in");
  const std::string& f = a.format;
  MX_REQUIRE(f == "e4m3" || f == "e5m2" || f == "e2m1" || f == "e8m0" || f == "ue4m3" ||
                 f == "bf16",
             "--format must be e4m3, e5m2, e2m1, e8m0, ue4m3 or bf16, got '", f, "'");
  MX_REQUIRE(a.saturation == "satfinite" || a.saturation == "nosat",
             "--saturation must be satfinite or nosat");
  const bool e8m0 = f == "e8m0";
  const std::string rounding = a.rounding.empty() ? (e8m0 ? "nearest" : "rne") : a.rounding;
  if (e8m0)
    MX_REQUIRE(rounding == "nearest" || rounding == "up" || rounding == "down",
               "--rounding for e8m0 must be nearest, up or down");
  else
    MX_REQUIRE(rounding == "rne" || rounding == "sr", "--rounding must be rne or sr");
  const Saturation sat = a.saturation == "satfinite" ? Saturation::kSatFinite : Saturation::kNoSat;
  const bool sr = rounding == "sr";
  const E8M0Rounding er = rounding == "up"     ? E8M0Rounding::kUp
                          : rounding == "down" ? E8M0Rounding::kDown
                                                 : E8M0Rounding::kNearest;
  RandomStream rng;
  rng.seed = seed32(a.seed);

  auto decode = [&](uint32_t code) -> float {
    if (f == "e4m3") return decode_e4m3(uint8_t(code));
    if (f == "e5m2") return decode_e5m2(uint8_t(code));
    if (f == "e2m1") return decode_e2m1(uint8_t(code));
    if (f == "e8m0") return decode_e8m0(uint8_t(code));
    if (f == "ue4m3") return decode_ue4m3(uint8_t(code));
    return decode_bf16(uint16_t(code));
  };
  auto encode = [&](float x, uint32_t rand) -> uint32_t {
    if (f == "e4m3") return encode_e4m3(x, sat, sr, rand);
    if (f == "e5m2") return encode_e5m2(x, sat, sr, rand);
    if (f == "e2m1") return encode_e2m1(x, sat, sr, rand);
    if (f == "e8m0") return encode_e8m0(x, er, sat);
    if (f == "ue4m3") return encode_ue4m3(x, sr, rand);
    return encode_bf16(x, sat, sr, rand);
  };
  const bool wide = f == "bf16";
  const std::string code_dtype = wide ? "I16" : "U8";

  SafeTensorsReader reader(a.in);
  SafeTensorsWriter writer;
  for (const std::string& name : names_in_order(reader)) {
    const TensorEntry& e = reader.entry(name);
    const int64_t n = e.numel();
    const unsigned char* raw = static_cast<const unsigned char*>(reader.raw(name));
    std::vector<float> decoded(static_cast<size_t>(n));
    if (e.dtype == "F32") {  // encode (raw bits: NaN payloads reach the codec unchanged)
      std::vector<uint8_t> codes8(wide ? 0 : size_t(n));
      std::vector<uint16_t> codes16(wide ? size_t(n) : 0);
      for (int64_t i = 0; i < n; ++i) {
        float x;
        std::memcpy(&x, raw + 4 * i, 4);
        const uint32_t code = encode(x, sr ? rng.bits(uint64_t(i)) : 0u);
        if (wide) codes16[i] = uint16_t(code); else codes8[i] = uint8_t(code);
        decoded[i] = decode(code);
      }
      writer.add_f32(name + ".decoded", e.shape, decoded.data());
      if (wide)
        writer.add_raw(name + ".codes", "I16", e.shape, codes16.data(), codes16.size() * 2);
      else
        writer.add_raw(name + ".codes", "U8", e.shape, codes8.data(), codes8.size());
    } else {
      MX_REQUIRE(e.dtype == code_dtype, "tensor '", name, "' has dtype ", e.dtype,
                 "; numerics codec encodes F32 and decodes ", code_dtype, " codes of ", f);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t code;
        if (wide) {
          uint16_t c;
          std::memcpy(&c, raw + 2 * i, 2);
          code = c;
        } else {
          code = raw[i];
          MX_REQUIRE(f != "e2m1" || code < 16, "tensor '", name, "': E2M1 code ", code,
                     " at index ", i, " is not a 4-bit value");
        }
        decoded[i] = decode(code);
      }
      writer.add_f32(name + ".decoded", e.shape, decoded.data());
    }
  }
  prepare_output_file(a.out, "--out");
  writer.write(a.out);
  return 0;
}

// Each tensor (viewed as [rows, cols], cols = the last dimension) is quantized by a fresh
// one-block LinearRecipe (seed 0, step 0, rank 0) as the named operand of Linear 0 of block 0,
// with the block layout that operand gets in training (llama.cpp's linear_fwd / linear_bwd; the
// weight-gradient operands without the NVFP4 Hadamard transform). Prints one JSON object:
// {tensor name: the operand's telemetry record}.
int run_stats(const StatsArgs& a) {
  const Recipe recipe = parse_recipe(a.recipe);
  MX_REQUIRE(recipe != Recipe::kFp32, "--recipe fp32 quantizes nothing");
  static const char* const kOperands[] = {"fwd.input",         "fwd.weight",
                                          "dgrad.grad_output", "dgrad.weight",
                                          "wgrad.grad_output", "wgrad.input"};
  static const LinearOperand kOps[] = {LinearOperand::kFwdInput,   LinearOperand::kFwdWeight,
                                       LinearOperand::kDgradGrad,  LinearOperand::kDgradWeight,
                                       LinearOperand::kWgradGrad,  LinearOperand::kWgradInput};
  static const bool kReduceAlongCols[] = {true, true, true, false, false, false};
  int k = -1;
  for (int i = 0; i < 6; ++i)
    if (a.operand == kOperands[i]) k = i;
  MX_REQUIRE(k >= 0, "--operand must be fwd.input, fwd.weight, dgrad.grad_output, dgrad.weight, "
             "wgrad.grad_output or wgrad.input, got '", a.operand, "'");
  SafeTensorsReader reader(a.in);
  const std::vector<std::string> names = names_in_order(reader);
  MX_REQUIRE(!names.empty(), a.in, " holds no tensors");
  nlohmann::json out = nlohmann::json::object();
  for (const std::string& name : names) {
    const TensorEntry& e = reader.entry(name);
    MX_REQUIRE(e.dtype == "F32", "tensor '", name, "' has dtype ", e.dtype,
               "; numerics stats takes F32");
    const int64_t n = e.numel();
    MX_REQUIRE(n > 0, "tensor '", name, "' has no elements");
    const int64_t cols = e.shape.empty() ? 1 : e.shape.back();
    const int64_t rows = n / cols;
    std::vector<float> x = reader.read_f32(name), q(static_cast<size_t>(n));
    // As `numerics quantize`: a training operand is finite (a non-finite loss ends the run),
    // and the statistics are defined for finite tensors (an infinity is no amax, and its SQNR
    // no number).
    for (int64_t i = 0; i < n; ++i)
      MX_REQUIRE(std::isfinite(x[i]), "tensor '", name, "' has a non-finite value (", x[i],
                 ") at flat index ", i, "; the quantizers take finite tensors");
    LinearRecipe lr(recipe, 1, 0, 0, 0, 0);
    lr.set_collect_stats(true);
    lr.quantize(q.data(), x.data(), rows, cols, kReduceAlongCols[k], kOps[k], 0, 0);
    nlohmann::json j = lr.finish_stats(0);
    out[name] = j.begin().value();
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

void add_numerics(CLI::App& app, Action& action) {
  auto* numerics = app.add_subcommand("numerics", "low-precision formats and quantizers");
  numerics->require_subcommand(1);

  auto* quantize = numerics->add_subcommand(
      "quantize", "quantize every tensor of a safetensors file (codes, scales, dequant)");
  auto q = std::make_shared<QuantizeArgs>();
  quantize->add_option("--format", q->format, "e4m3 | e5m2 | fp8-block | mxfp8 | nvfp4")
      ->required();
  quantize->add_option("--in", q->in, "input .safetensors (F32, BF16 or F16 tensors)")
      ->required();
  quantize->add_option("--out", q->out, "output .safetensors")->required();
  quantize->add_flag("--stochastic", q->stochastic, "stochastic rounding of the element codes");
  quantize->add_option("--seed", q->seed, "Philox seed for --stochastic (32-bit)");
  quantize->add_option("--block", q->block,
                       "fp8-block: 1x128 | 128x128; mxfp8: 1x32 | 32x1; nvfp4: 1x16 | 16x16");
  quantize->add_flag("--no-pow2-scales", q->no_pow2_scales,
                     "fp8-block: exact amax/448 scales instead of powers of two");
  quantize->add_option("--scale-rule", q->scale_rule,
                       "mxfp8 E8M0 scale: ceil (TE/cuBLAS, default) | floor (OCP)");
  quantize->add_option("--mx-elem", q->mx_elem, "mxfp8 element format: e4m3 | e5m2");
  quantize->add_option("--margin", q->margin, "e4m3/e5m2: scale = max / amax / 2^margin");
  quantize->callback([&action, q, quantize] {
    for (const char* opt :
         {"--seed", "--no-pow2-scales", "--scale-rule", "--mx-elem", "--margin", "--block"})
      if (quantize->get_option(opt)->count() > 0) q->given.insert(opt);
    action = [q] { return run_quantize(*q); };
  });

  auto* codec = numerics->add_subcommand(
      "codec", "element-wise encode (F32 tensors) / decode (code tensors) of one format");
  codec->group("");  // hidden: a hook for the reference tests
  auto c = std::make_shared<CodecArgs>();
  codec->add_option("--format", c->format, "e4m3 | e5m2 | e2m1 | e8m0 | ue4m3 | bf16")
      ->required();
  codec->add_option("--in", c->in, "input .safetensors")->required();
  codec->add_option("--out", c->out, "output .safetensors")->required();
  codec->add_option("--saturation", c->saturation, "satfinite | nosat");
  codec->add_option("--rounding", c->rounding, "rne | sr; e8m0: nearest | up | down");
  codec->add_option("--seed", c->seed, "Philox seed for --rounding sr");
  codec->callback([&action, c] { action = [c] { return run_codec(*c); }; });

  auto* stats = numerics->add_subcommand(
      "stats", "telemetry (amax, saturated, flushed, SQNR) of each tensor as one recipe operand");
  stats->group("");  // hidden: a hook for the reference tests
  auto st = std::make_shared<StatsArgs>();
  stats->add_option("--recipe", st->recipe, "bf16 | fp8-current | fp8-delayed | fp8-block | "
                    "mxfp8 | nvfp4")->required();
  stats->add_option("--operand", st->operand, "fwd.input | fwd.weight | dgrad.grad_output | "
                    "dgrad.weight | wgrad.grad_output | wgrad.input")->required();
  stats->add_option("--in", st->in, "input .safetensors (F32 tensors)")->required();
  stats->callback([&action, st] { action = [st] { return run_stats(*st); }; });
}

}  // namespace mx::cli
