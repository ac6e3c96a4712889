#include "train/config.h"

#include <toml.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <variant>

#include "backend/backend.h"
#include "checkpoint/s3/uri.h"
#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "data/token_dataset.h"
#include "model/llama.h"
#include "parallel/fsdp.h"
#include "precision/recipe.h"

namespace mx {

namespace {

using Value = std::variant<int64_t, double, bool, std::string>;
enum class Kind { kInt, kFloat, kBool, kString };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "number";
    case Kind::kBool: return "boolean";
    case Kind::kString: return "string";
  }
  return "?";
}
const char* article(Kind k) { return k == Kind::kInt ? "an " : "a "; }

// Model fields are staged and applied on top of the preset once everything is read.
struct Staging {
  RunConfig cfg;
  std::optional<std::string> preset;
  std::map<std::string, Value> model_fields;
};

struct Field {
  std::string key;
  Kind kind;
  std::function<void(Staging&, const Value&)> set;
  std::string help;
};

int64_t as_int(const Value& v) { return std::get<int64_t>(v); }
double as_float(const Value& v) {
  return std::holds_alternative<int64_t>(v) ? double(std::get<int64_t>(v)) : std::get<double>(v);
}
bool as_bool(const Value& v) { return std::get<bool>(v); }
const std::string& as_string(const Value& v) { return std::get<std::string>(v); }

#define MX_INT(key, member, help) \
  Field{key, Kind::kInt, [](Staging& s, const Value& v) { s.cfg.member = as_int(v); }, help}
#define MX_FLOAT(key, member, help) \
  Field{key, Kind::kFloat, [](Staging& s, const Value& v) { s.cfg.member = as_float(v); }, help}
#define MX_BOOL(key, member, help) \
  Field{key, Kind::kBool, [](Staging& s, const Value& v) { s.cfg.member = as_bool(v); }, help}
#define MX_STRING(key, member, help) \
  Field{key, Kind::kString, [](Staging& s, const Value& v) { s.cfg.member = as_string(v); }, help}

Field model_field(const std::string& name, Kind kind, const std::string& help) {
  return Field{"model." + name, kind,
               [name](Staging& s, const Value& v) { s.model_fields[name] = v; }, help};
}

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = {
      Field{"model.preset", Kind::kString,
            [](Staging& s, const Value& v) { s.preset = as_string(v); },
            "tiny | small | 125m | llama3.2-1b | llama3.2-3b | llama3-8b | 14b | 32b | 64b"},
      model_field("hidden_size", Kind::kInt, "width of the residual stream"),
      model_field("intermediate_size", Kind::kInt, "width of the SwiGLU MLP"),
      model_field("num_hidden_layers", Kind::kInt, "transformer blocks"),
      model_field("num_attention_heads", Kind::kInt, "query heads"),
      model_field("num_key_value_heads", Kind::kInt, "key/value heads (GQA); divides the heads"),
      model_field("head_dim", Kind::kInt, "per-head width (default hidden_size / heads)"),
      model_field("vocab_size", Kind::kInt, "vocabulary (256 for the byte tokenizer)"),
      model_field("rope_theta", Kind::kFloat, "rotary embedding base"),
      model_field("rms_norm_eps", Kind::kFloat, "RMSNorm epsilon"),
      model_field("tie_word_embeddings", Kind::kBool, "output head shares the embedding"),
      MX_INT("train.steps", train.steps, "optimizer steps"),
      MX_INT("train.micro_batch", train.micro_batch, "sequences per micro-batch"),
      MX_INT("train.seq_len", train.seq_len, "tokens per sequence"),
      MX_INT("train.grad_accum", train.grad_accum, "micro-batches per step"),
      MX_FLOAT("train.lr", train.lr, "peak learning rate"),
      MX_FLOAT("train.min_lr", train.min_lr, "learning rate at the end of the cosine"),
      MX_INT("train.warmup_steps", train.warmup_steps, "linear warmup steps"),
      MX_FLOAT("train.weight_decay", train.weight_decay, "AdamW decay on matrices"),
      MX_FLOAT("train.grad_clip", train.grad_clip, "clip the global gradient norm (0: off)"),
      MX_INT("train.seed", train.seed,
             "seed of the initialization, the data order, stochastic rounding and the sample"),
      MX_FLOAT("train.beta1", train.beta1, "AdamW beta1"),
      MX_FLOAT("train.beta2", train.beta2, "AdamW beta2"),
      MX_FLOAT("train.eps", train.eps, "AdamW epsilon"),
      MX_INT("train.eval_every", train.eval_every, "validation every N steps (0: off)"),
      MX_INT("train.eval_batches", train.eval_batches,
             "micro-batches per rank per validation (eval_batches x micro_batch x ranks windows)"),
      MX_INT("train.log_every", train.log_every, "metrics line every N steps"),
      MX_FLOAT("train.hang_timeout_s", train.hang_timeout_s,
               "end the job (exit 4) when a rank makes no progress in training for this many "
               "seconds, or 10x its longest micro-batch so far if more: a hung peer, collective "
               "or device (0: off)"),
      MX_STRING("data.path", data.path, "token file, directory or glob of shards (empty: the bundled corpus)"),
      MX_STRING("data.val_path", data.val_path, "validation data of its own: file, directory or glob (empty: the tail of data.path, data.val_fraction)"),
      MX_STRING("data.format", data.format, "auto | u16 | u32 | llmc | text | random"),
      MX_BOOL("data.shuffle", data.shuffle, "random window order per epoch"),
      MX_FLOAT("data.val_fraction", data.val_fraction, "tail of the data held out"),
      MX_STRING("precision.recipe", precision.recipe, "fp32 | bf16 | fp8-current | fp8-delayed | fp8-block | mxfp8 | nvfp4"),
      MX_INT("precision.high_precision_first", precision.high_precision_first,
             "first N blocks kept in high precision"),
      MX_INT("precision.high_precision_last", precision.high_precision_last,
             "last N blocks kept in high precision"),
      MX_STRING("precision.high_precision", precision.high_precision,
                "bf16 | fp32: the output head and the high-precision blocks (default: bf16 "
                "under every recipe but fp32)"),
      MX_STRING("precision.activations", precision.activations,
                "bf16 | fp32: the blocks' activations and what they keep for backward (default: "
                "bf16 on run.device = cuda under every recipe but fp32, else fp32)"),
      MX_INT("precision.stats_every", precision.stats_every, "numerics telemetry every N steps (0: off)"),
      MX_BOOL("precision.fp8_attention", precision.fp8_attention,
              "attention in FP8 (E4M3 q, k, v, probabilities, output; E5M2 gradients) in the "
              "blocks the recipe covers; cuDNN's FP8 SDPA on cuda (default false)"),
      MX_BOOL("precision.fp8_head", precision.fp8_head,
              "the output head's GEMMs in FP8 (E4M3 h and W, E5M2 logits gradient, per-tensor "
              "scales) instead of precision.high_precision (default false)"),
      MX_STRING("precision.fp8_head_dgrad", precision.fp8_head_dgrad,
                "bf16 | fp8: the FP8 head's data-gradient GEMM (dh = g W, the gradient every "
                "block gets) on bf16 roundings (default) or in FP8 too"),
      MX_STRING("memory.activation_checkpointing", memory.activation_checkpointing,
                "none | selective | full"),
      MX_STRING("parallel.sharding", parallel.sharding, "full | grad-op | none | hybrid"),
      MX_INT("parallel.shard_group", parallel.shard_group, "processes per shard group (hybrid)"),
      MX_STRING("parallel.gather_dtype", parallel.gather_dtype,
                "auto | fp32 | bf16: the blocks' weight gathers (auto: bf16 where every block "
                "runs on bf16 GEMMs, recipe bf16 on cuda: the same values at half the bytes)"),
      MX_STRING("checkpoint.dir", checkpoint.dir, "directory (default <out_dir>/checkpoints)"),
      MX_STRING("checkpoint.s3_uri", checkpoint.s3_uri, "s3://bucket/prefix: write checkpoints there instead of dir"),
      MX_INT("checkpoint.every", checkpoint.every, "checkpoint every N steps (0: at the end)"),
      MX_INT("checkpoint.keep", checkpoint.keep, "keep the newest K (0: all)"),
      MX_BOOL("checkpoint.async", checkpoint.async, "write in the background (default true)"),
      MX_STRING("checkpoint.resume", checkpoint.resume, "auto (newest verified, local or S3) | none | PATH or s3:// URI"),
      MX_STRING("init.from", init.from, "Hugging Face Llama directory to start from"),
      MX_STRING("run.name", run.name, "run name"),
      MX_STRING("run.out_dir", run.out_dir, "output directory (default runs/<name>)"),
      MX_STRING("run.metrics", run.metrics, "metrics file (default <out_dir>/metrics.jsonl)"),
      MX_STRING("run.device", run.device, "cpu | cuda"),
      MX_INT("run.sample_tokens", run.sample_tokens, "tokens of sample text at the end"),
      MX_STRING("run.sample_prompt", run.sample_prompt, "prompt of the sample"),
      MX_INT("run.threads", run.threads, "CPU threads (0: OMP_NUM_THREADS or all cores)"),
      MX_BOOL("run.profile", run.profile,
              "time each backend op over the training steps after the first; a table at the "
              "end and op_profile in the summary"),
      MX_BOOL("run.deterministic", run.deterministic,
              "the same bits run to run and across a resume: on cuda, no GEMM tuning, cuDNN's "
              "deterministic attention backward, the head's planned chunks"),
  };
  return fields;
}

const Field* find_field(const std::string& key) {
  for (auto& f : schema())
    if (f.key == key) return &f;
  return nullptr;
}

std::string known_keys_of(const std::string& section) {
  std::string out;
  for (auto& f : schema())
    if (f.key.rfind(section + ".", 0) == 0)
      out += (out.empty() ? "" : ", ") + f.key.substr(section.size() + 1);
  return out;
}

std::string known_sections() {
  std::string out;
  std::string last;
  for (auto& f : schema()) {
    std::string s = f.key.substr(0, f.key.find('.'));
    if (s != last && out.find(s) == std::string::npos) out += (out.empty() ? "" : ", ") + s;
    last = s;
  }
  return out;
}

const Field& require_field(const std::string& key, const std::string& where) {
  const Field* f = find_field(key);
  if (f) return *f;
  auto dot = key.find('.');
  std::string section = dot == std::string::npos ? key : key.substr(0, dot);
  std::string keys = known_keys_of(section);
  if (keys.empty())
    throw UserError(str("unknown config section '", section, "'", where, " (known: ",
                        known_sections(), ")"));
  throw UserError(str("unknown config key '", key, "'", where, " (known in [", section, "]: ",
                      keys, ")"));
}

// A number as the file spells it: toml11 (3.7) reads integers and floats through an istream,
// which gives the largest value and no error on overflow (warmup_steps = 10^20 trained with a
// warmup of 2^63 - 1; lr = 1e400 read as 1.79769e+308). TOML's integers are 64-bit and a value
// that cannot be represented is an error (toml.io, v1.0.0), as `--set` says too.
std::string toml_number_text(const toml::value& v) {
  const auto* region = toml::detail::get_region(v);
  std::string text = region ? region->str() : "";
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  return text;
}

UserError out_of_range(const Field& f, const std::string& where, const std::string& text,
                       const char* limit) {
  return UserError(str("config key '", f.key, "'", where, " is out of range: ",
                       shortened(text, 60), " does not fit ", limit));
}

int64_t toml_integer(const Field& f, const toml::value& v, const std::string& where) {
  std::string text = toml_number_text(v);
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'o' || text[1] == 'b')) {
    base = text[1] == 'x' ? 16 : text[1] == 'o' ? 8 : 2;
    text = text.substr(2);
  } else if (!text.empty() && text[0] == '+') {
    text = text.substr(1);
  }
  int64_t x = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), x, base);
  if (r.ec == std::errc::result_out_of_range)
    throw out_of_range(f, where, toml_number_text(v), "in a 64-bit integer");
  // (toml11's value where its text is not at hand)
  return r.ec == std::errc() && r.ptr == text.data() + text.size() ? x : int64_t(v.as_integer());
}

double toml_floating(const Field& f, const toml::value& v, const std::string& where) {
  const double x = v.as_floating();
  if (!std::isfinite(x))  // TOML's inf and nan: no key takes them (--set refuses them too)
    throw UserError(str("config key '", f.key, "'", where, " must be a finite number (got ",
                        toml_number_text(v), ")"));
  const std::string text = toml_number_text(v);
  if (text.empty()) return x;
  char* end = nullptr;
  const double parsed = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return x;
  if (!std::isfinite(parsed)) throw out_of_range(f, where, text, "in a double");
  return parsed;  // (a subnormal as strtod reads it: the istream failed on those too)
}

Value from_toml(const Field& f, const toml::value& v, const std::string& where) {
  switch (f.kind) {
    case Kind::kInt:
      if (v.is_integer()) return toml_integer(f, v, where);
      if (v.is_floating()) {
        const double x = toml_floating(f, v, where);
        if (std::floor(x) == x && std::fabs(x) < 9e15) return int64_t(x);
      }
      break;
    case Kind::kFloat:
      if (v.is_floating()) return toml_floating(f, v, where);
      if (v.is_integer()) return double(toml_integer(f, v, where));
      break;
    case Kind::kBool:
      if (v.is_boolean()) return bool(v.as_boolean());
      break;
    case Kind::kString:
      if (v.is_string()) {
        MX_REQUIRE(v.as_string().str.find('\0') == std::string::npos, "config key '", f.key, "'",
                   where, " holds a NUL character (\\u0000): paths and messages end there");
        return std::string(v.as_string().str);
      }
      break;
  }
  throw UserError(str("config key '", f.key, "'", where, " must be ", article(f.kind),
                      kind_name(f.kind)));
}

Value from_text(const Field& f, std::string text, const std::string& origin = "--set") {
  const std::string shown = shortened(text, 220);
  auto bad = [&]() -> UserError {
    return UserError(str(origin, " ", f.key, "=", shown, ": expected ", article(f.kind),
                         kind_name(f.kind)));
  };
  // A NUL character (a SageMaker hyperparameter's "\u0000"): paths and messages end there.
  if (text.find('\0') != std::string::npos)
    throw UserError(str(origin, " ", f.key, "=", one_line(shown), ": holds a NUL character"));
  // stoll and strtod skip leading white space: "train.lr= 1e-3" was taken while "1e-3 " was
  // refused. A number is its digits alone, at either end.
  if (f.kind != Kind::kString && !text.empty() && std::isspace(static_cast<unsigned char>(text[0])))
    throw bad();
  switch (f.kind) {
    case Kind::kInt: {
      try {
        size_t used = 0;
        // Base 10: "010" was read as octal 8 and "0x10" as 16 (TOML refuses both spellings).
        long long x = std::stoll(text, &used, 10);
        if (used != text.size()) throw bad();
        return int64_t(x);
      } catch (const std::logic_error&) {
        throw bad();
      }
    }
    case Kind::kFloat: {
      // strtod, not stod: a subnormal (1e-320) is a number (stod called its underflow "not a
      // number"); what a key can take is validate()'s to say.
      if (text.empty()) throw bad();
      char* end = nullptr;
      const double x = std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size()) throw bad();
      if (!std::isfinite(x))
        throw UserError(str(origin, " ", f.key, "=", shown, ": expected a finite number"));
      return x;
    }
    case Kind::kBool:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      throw bad();
    case Kind::kString:
      if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
          text.back() == text.front())
        text = text.substr(1, text.size() - 2);
      return text;
  }
  throw bad();
}

std::string joined_lines(std::string s) {  // toml11's messages span several lines
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::string out;
  for (char c : s)
    if (!(c == ' ' && !out.empty() && out.back() == ' ')) out += c;
  return out;
}

void apply_model_fields(Staging& s) {
  ModelConfig& m = s.cfg.model;
  m = model_preset(s.preset.value_or(s.cfg.model_preset));
  if (s.preset) s.cfg.model_preset = *s.preset;
  for (auto& [name, v] : s.model_fields) {
    // 0 is the presets' "derive it" (head_dim: hidden_size / heads; num_key_value_heads: the
    // heads), not a value to give: given, it must be a real size.
    if (name == "num_key_value_heads" || name == "head_dim")
      MX_REQUIRE(as_int(v) >= 1, "model.", name, " must be positive (got ", as_int(v),
                 "; leave it out for ",
                 name == "head_dim" ? "hidden_size / num_attention_heads" : "num_attention_heads",
                 ")");
    if (name == "hidden_size") m.hidden_size = as_int(v);
    else if (name == "intermediate_size") m.intermediate_size = as_int(v);
    else if (name == "num_hidden_layers") m.num_hidden_layers = as_int(v);
    else if (name == "num_attention_heads") m.num_attention_heads = as_int(v);
    else if (name == "num_key_value_heads") m.num_key_value_heads = as_int(v);
    else if (name == "head_dim") m.head_dim = as_int(v);
    else if (name == "vocab_size") m.vocab_size = as_int(v);
    else if (name == "rope_theta") m.rope_theta = as_float(v);
    else if (name == "rms_norm_eps") m.rms_norm_eps = as_float(v);
    else if (name == "tie_word_embeddings") m.tie_word_embeddings = as_bool(v);
  }
  MX_REQUIRE(m.num_attention_heads > 0, "model.num_attention_heads must be positive (got ",
             m.num_attention_heads, ")");
  MX_REQUIRE(m.hidden_size > 0, "model.hidden_size must be positive (got ", m.hidden_size, ")");
  m.finalize();
  m.validate();
}

void validate(const RunConfig& c) {
  const auto& t = c.train;
  MX_REQUIRE(t.steps >= 1, "train.steps must be at least 1 (got ", t.steps, ")");
  // Checkpoint steps are named with 8 digits (step_NNNNNNNN): a step of 10^8 would be written
  // but not found again (no listing, resume or export).
  MX_REQUIRE(t.steps <= 99999999, "train.steps must be at most 99999999 (got ", t.steps,
             "): checkpoint steps are named with 8 digits");
  MX_REQUIRE(t.micro_batch >= 1, "train.micro_batch must be at least 1 (got ", t.micro_batch, ")");
  MX_REQUIRE(t.seq_len >= 1, "train.seq_len must be at least 1 (got ", t.seq_len, ")");
  MX_REQUIRE(t.grad_accum >= 1, "train.grad_accum must be at least 1 (got ", t.grad_accum, ")");
  // Caps far above any real run, so that no size computed from them (arena bytes, tokens per
  // step times ranks, sample counts) can overflow 64 bits: an overflowed product reads as a
  // tiny or a wrapped-around size (a huge grad_accum once gave 0 tokens a step and a step that
  // never ended).
  int64_t micro_tokens = 0, step_tokens = 0;
  MX_REQUIRE(!__builtin_mul_overflow(t.micro_batch, t.seq_len, &micro_tokens) &&
                 micro_tokens <= kMaxMicroBatchTokens,
             "train.micro_batch x train.seq_len (", t.micro_batch, " x ", t.seq_len,
             ") is more than ", kMaxMicroBatchTokens, " tokens per micro-batch");
  MX_REQUIRE(!__builtin_mul_overflow(micro_tokens, t.grad_accum, &step_tokens) &&
                 step_tokens <= kMaxStepTokensPerRank,
             "train.micro_batch x train.seq_len x train.grad_accum (", t.micro_batch, " x ",
             t.seq_len, " x ", t.grad_accum, ") is more than ", kMaxStepTokensPerRank,
             " tokens per step and process");
  int64_t run_tokens = 0;
  MX_REQUIRE(!__builtin_mul_overflow(step_tokens, t.steps, &run_tokens) &&
                 run_tokens <= kMaxRunTokensPerRank,
             "train.steps x tokens per step (", t.steps, " x ", step_tokens, ") is more than ",
             kMaxRunTokensPerRank, " tokens per process");
  // The optimizer runs in fp32: a value that float32 rounds to 0 or to infinity (eps = 1e-50
  // became 0: 0 / 0 at step 2, reported as divergence) is refused here.
  MX_REQUIRE(t.lr > 0 && std::isfinite(float(t.lr)) && float(t.lr) > 0.0f,
             "train.lr must be positive and finite as a float32 (got ", t.lr, ")");
  MX_REQUIRE(t.min_lr >= 0 && t.min_lr <= t.lr, "train.min_lr must be in [0, train.lr] (got ",
             t.min_lr, ")");
  MX_REQUIRE(t.warmup_steps >= 0, "train.warmup_steps must be >= 0 (got ", t.warmup_steps, ")");
  MX_REQUIRE(t.weight_decay >= 0 && std::isfinite(float(t.weight_decay)),
             "train.weight_decay must be >= 0 and finite as a float32 (got ", t.weight_decay, ")");
  MX_REQUIRE(t.grad_clip >= 0, "train.grad_clip must be >= 0 (got ", t.grad_clip, ")");
  // The optimizer runs in fp32: a beta within 2^-25 of 1 rounds to 1.0f, whose bias correction
  // 1 - beta^t is 0 (the first update was 0 / 0: NaN at step 2).
  auto exact = [](double v) {  // the shortest that reads back: 0.9999999702 at 6 digits was "1"
    char b[40];
    const auto r = std::to_chars(b, b + sizeof b, v);
    return std::string(b, r.ptr);
  };
  MX_REQUIRE(t.beta1 >= 0 && float(t.beta1) < 1.0f, "train.beta1 must be in [0, 1) and below 1 as ",
             "a float32, 1 - 2^-25 (got ", exact(t.beta1), ")");
  MX_REQUIRE(t.beta2 >= 0 && float(t.beta2) < 1.0f, "train.beta2 must be in [0, 1) and below 1 as ",
             "a float32, 1 - 2^-25 (got ", exact(t.beta2), ")");
  MX_REQUIRE(t.eps > 0 && float(t.eps) > 0.0f && std::isfinite(float(t.eps)),
             "train.eps must be positive and finite as a float32, at least about 1.4e-45 (got ",
             t.eps, ")");
  MX_REQUIRE(t.eval_every >= 0, "train.eval_every must be >= 0 (got ", t.eval_every, ")");
  MX_REQUIRE(t.eval_batches >= 1, "train.eval_batches must be >= 1 (got ", t.eval_batches, ")");
  // A validation reads eval_batches micro-batches on each rank, as a step of that grad_accum
  // would: the same cap (1e11 was taken, and a run that validated would never end a step).
  int64_t eval_tokens = 0;
  MX_REQUIRE(!__builtin_mul_overflow(micro_tokens, t.eval_batches, &eval_tokens) &&
                 eval_tokens <= kMaxStepTokensPerRank,
             "train.micro_batch x train.seq_len x train.eval_batches (", t.micro_batch, " x ",
             t.seq_len, " x ", t.eval_batches, ") is more than ", kMaxStepTokensPerRank,
             " tokens per rank a validation");
  MX_REQUIRE(t.log_every >= 1, "train.log_every must be >= 1 (got ", t.log_every, ")");
  MX_REQUIRE(t.hang_timeout_s >= 0 && t.hang_timeout_s <= kMaxHangTimeoutS,
             "train.hang_timeout_s must be in [0, ", kMaxHangTimeoutS, "] seconds (0: off; got ",
             t.hang_timeout_s, ")");
  MX_REQUIRE(c.data.val_fraction >= 0 && c.data.val_fraction < 1,
             "data.val_fraction must be in [0, 1) (got ", c.data.val_fraction, ")");
  // UserError naming the valid recipes, then for a bad or contradictory high_precision
  high_precision_bf16(parse_recipe(c.precision.recipe), c.precision.high_precision);
  bf16_activations(parse_recipe(c.precision.recipe), c.precision.activations, c.run.device);
  MX_REQUIRE(c.precision.high_precision_first >= 0 && c.precision.high_precision_last >= 0,
             "precision.high_precision_first / high_precision_last must be >= 0");
  MX_REQUIRE(c.precision.stats_every >= 0, "precision.stats_every must be >= 0 (0: off; got ",
             c.precision.stats_every, ")");
  MX_REQUIRE(!c.precision.fp8_attention || parse_recipe(c.precision.recipe) != Recipe::kFp32,
             "precision.fp8_attention needs a low-precision recipe: it runs in the blocks "
             "precision.recipe covers, and recipe fp32 covers none");
  MX_REQUIRE(!c.precision.fp8_head || parse_recipe(c.precision.recipe) != Recipe::kFp32,
             "precision.fp8_head needs a low-precision recipe (recipe fp32 keeps every GEMM "
             "in fp32)");
  MX_REQUIRE(c.precision.fp8_head_dgrad == "bf16" || c.precision.fp8_head_dgrad == "fp8",
             "precision.fp8_head_dgrad must be bf16 or fp8 (got '", c.precision.fp8_head_dgrad,
             "')");
  check_fixed_value("parallel.sharding", c.parallel.sharding);
  check_fixed_value("data.format", c.data.format);
  check_fixed_value("run.device", c.run.device);
  MX_REQUIRE(c.parallel.shard_group >= 0, "parallel.shard_group must be >= 0");
  {
    const Recipe r = parse_recipe(c.precision.recipe);
    const bool acts = bf16_activations(r, c.precision.activations, c.run.device);
    check_gather_dtype(c.parallel.gather_dtype,
                       bf16_path_only(r, acts, high_precision_bf16(r, c.precision.high_precision),
                                      c.precision.high_precision_first,
                                      c.precision.high_precision_last, c.precision.stats_every));
  }
  MX_REQUIRE(c.checkpoint.every >= 0, "checkpoint.every must be >= 0 (got ", c.checkpoint.every,
             ")");
  MX_REQUIRE(c.checkpoint.keep >= 0, "checkpoint.keep must be >= 0 (got ", c.checkpoint.keep, ")");
  if (!c.checkpoint.s3_uri.empty()) {
    try {
      s3::parse_s3_uri(c.checkpoint.s3_uri);
    } catch (const UserError& e) {
      throw UserError(str("checkpoint.s3_uri: ", e.what()));
    }
  }
  MX_REQUIRE(c.run.sample_tokens >= 0 && c.run.sample_tokens <= kMaxSampleTokens,
             "run.sample_tokens must be between 0 and ", kMaxSampleTokens, " (got ",
             c.run.sample_tokens, "; mxtrain generate writes longer text)");
  MX_REQUIRE(c.run.threads >= 0 && c.run.threads <= kMaxThreads, "run.threads must be in [0, ",
             kMaxThreads, "] (0: one a core; got ", c.run.threads, ")");
  // runs/NAME: "." and ".." would put the run's files in runs/ or beside it
  MX_REQUIRE(!c.run.name.empty() && c.run.name.find('/') == std::string::npos &&
                 c.run.name != "." && c.run.name != "..",
             "run.name must be a non-empty name without '/', not . or .. (got '", c.run.name,
             "')");
  check_fixed_value("memory.activation_checkpointing", c.memory.activation_checkpointing);
}

}  // namespace

std::string RunConfig::out_dir() const { return run.out_dir.empty() ? "runs/" + run.name : run.out_dir; }
std::string RunConfig::metrics_path() const {
  return run.metrics.empty() ? out_dir() + "/metrics.jsonl" : run.metrics;
}
std::string RunConfig::checkpoint_dir() const {
  return checkpoint.dir.empty() ? out_dir() + "/checkpoints" : checkpoint.dir;
}

namespace {
// The deepest nesting of arrays, inline tables and tables in TOML text (strings and comments
// skipped). toml11 parses and copies them recursively: 100000 nested `[` overflowed the stack
// (SIGSEGV), and so did a dotted key or a table header of 60000 parts (`a.a.a... = 1`, each
// part a table in the next). Each run of dots between separators counts as that many levels
// on top of the brackets open around it (a float's one dot included: an over-count of one).
// Real configs nest 3 levels at most.
constexpr int kMaxTomlDepth = 64;
int toml_nesting_depth(const std::string& text) {
  int depth = 0, deepest = 0, dots = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      deepest = std::max(deepest, depth + ++dots);
    } else if (c == '=' || c == ',' || c == '\n' || c == '[' || c == ']' || c == '{' ||
               c == '}' || c == '#') {
      dots = 0;
    }
    if (c == '#') {  // a comment, to the end of the line
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const size_t open = i;
      const bool multi = text.compare(i, 3, std::string(3, c)) == 0;
      const std::string end = multi ? std::string(3, c) : std::string(1, c);
      bool closed = false;
      for (i += end.size(); i < text.size(); ++i) {
        if (c == '"' && text[i] == '\\') {  // basic strings' escapes
          ++i;
          continue;
        }
        if (!multi && text[i] == '\n') break;
        if (text.compare(i, end.size(), end) == 0) {
          i += end.size() - 1;
          // a multi-line string may end in two more quotes: """x""""" is x"" (read as ending
          // at the first three, the last quote opened a string that hid the rest of the line)
          for (int more = 0; multi && more < 2 && i + 1 < text.size() && text[i + 1] == c; ++more)
            ++i;
          closed = true;
          break;
        }
      }
      // Unterminated by this reading: the rest is counted as if no string had begun, so no
      // reading of quotes that differs from the parser's can hide brackets from the count.
      if (!closed) i = open;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// `origin` names where the override came from in an error: "--set", or "hyperparameters" for
// the SageMaker entrypoint, whose overrides are the job's hyperparameters.
void apply_set(Staging& s, const std::string& item, const std::string& origin) {
  auto eq = item.find('=');
  MX_REQUIRE(eq != std::string::npos && eq > 0, origin, " expects section.key=value (got '", item,
             "')");
  std::string key = item.substr(0, eq);
  const Field& f = require_field(key, " (from " + origin + ")");
  f.set(s, from_text(f, item.substr(eq + 1), origin));
  s.cfg.sources.emplace_back(origin + " " + item, item);
}

}  // namespace

void check_sets(const std::vector<std::string>& sets, const std::string& origin) {
  Staging s;
  for (const std::string& item : sets) apply_set(s, item, origin);
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& sets,
                          const std::string& origin) {
  Staging s;
  if (!path.empty()) {
    toml::value root;
    std::error_code ec;
    MX_REQUIRE(!std::filesystem::is_directory(path, ec), "config file ", path,
               " is a directory, not a TOML file");
    {
      std::ifstream in(path, std::ios::binary);
      std::stringstream text;
      if (in) text << in.rdbuf();
      if (in && !in.bad()) {  // (an unreadable file: toml::parse says why, below)
        // TOML is UTF-8; toml11 read past its buffer on some invalid sequences (a 0x9F inside
        // a literal string: a heap over-read that surfaced as "basic_string::_M_create").
        const std::string bytes = text.str();
        const std::string valid = sanitize_utf8(bytes);
        if (valid != bytes) {
          const size_t at = size_t(
              std::mismatch(bytes.begin(), bytes.end(), valid.begin(), valid.end()).first -
              bytes.begin());
          throw UserError(str("config file ", path, " is not valid UTF-8 (line ",
                              1 + std::count(bytes.begin(), bytes.begin() + long(at), '\n'),
                              ", byte ", at, "); TOML files are UTF-8"));
        }
        MX_REQUIRE(toml_nesting_depth(bytes) <= kMaxTomlDepth, "config file ", path,
                   " nests arrays, tables or dotted keys deeper than ", kMaxTomlDepth,
                   " levels");
      }
    }
    try {
      root = toml::parse(path);
    } catch (const std::runtime_error& e) {  // file missing or unreadable
      throw UserError(str("cannot read config file ", path, ": ", joined_lines(e.what())));
    } catch (const std::exception& e) {  // syntax errors
      throw UserError(str("config file ", path, " is not valid TOML: ", joined_lines(e.what())));
    }
    if (!root.is_table()) throw UserError(str("config file ", path, " is not a TOML table"));
    for (auto& [section, body] : root.as_table()) {
      if (!body.is_table()) {
        if (known_keys_of(section).empty())
          throw UserError(str("unknown config section '", section, "' in ", path, " (known: ",
                              known_sections(), ")"));
        throw UserError(str("config section [", section, "] in ", path, " must be a table"));
      }
      for (auto& [key, v] : body.as_table()) {
        std::string full = section + "." + key;
        const Field& f = require_field(full, " in " + path);
        f.set(s, from_toml(f, v, " in " + path));
      }
    }
    std::ostringstream text;
    text << root;
    s.cfg.sources.emplace_back("config file " + path, text.str());
    s.cfg.config_file = path;
  }
  for (const std::string& item : sets) apply_set(s, item, origin);
  apply_model_fields(s);
  if (!s.cfg.init.from.empty()) {  // the model is init.from's config.json: a key would be ignored
    std::string given;
    if (s.preset) given = "model.preset";
    else if (!s.model_fields.empty()) given = "model." + s.model_fields.begin()->first;
    MX_REQUIRE(given.empty(), given, " is set, but init.from takes the model from ",
               s.cfg.init.from, "/config.json: leave the [model] keys out");
  }
  validate(s.cfg);
  return s.cfg;
}

void check_fixed_value(const std::string& key, const std::string& value) {
  if (key == "model.preset") model_preset(value);
  else if (key == "precision.recipe") parse_recipe(value);
  else if (key == "data.format") parse_token_format(value);
  else if (key == "run.device") check_device_name(value);
  else if (key == "parallel.sharding") parse_sharding(value);
  else if (key == "memory.activation_checkpointing") parse_checkpointing(value);
}

std::string canonical_value(const std::string& key, const std::string& value,
                            const std::string& origin) {
  const Field& f = require_field(key, " (from " + origin + ")");
  const Value v = from_text(f, value, origin);
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    if (*d == 0) return "0";  // -0 is 0
    char b[40];
    const auto r = std::to_chars(b, b + sizeof b, *d);
    return std::string(b, r.ptr);
  }
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return std::get<std::string>(v);
}

std::vector<std::string> config_reference() {
  std::vector<std::string> out;
  for (auto& f : schema()) out.push_back(str(f.key, "  (", kind_name(f.kind), ")  ", f.help));
  return out;
}

}  // namespace mx
