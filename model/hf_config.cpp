#include "model/hf_config.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_input.h"

namespace mx {

namespace {

using nlohmann::json;

// Field access with errors that name the file and the field. A null counts as absent: HF writes
// null for "use the default" (e.g. num_key_value_heads, head_dim).
class ConfigFields {
 public:
  ConfigFields(const std::string& path, const json& j) : path_(path), j_(j) {}

  const json* find(const char* field) const {
    auto it = j_.find(field);
    return (it == j_.end() || it->is_null()) ? nullptr : &*it;
  }

  UserError error(const char* field, const std::string& why) const {
    return UserError(str("Hugging Face config '", path_, "': field '", field, "' ", why));
  }

  int64_t required_int(const char* field) const {
    const json* v = find(field);
    if (!v) throw error(field, "is required but missing");
    return as_int(field, *v);
  }
  int64_t optional_int(const char* field, int64_t fallback) const {
    const json* v = find(field);
    return v ? as_int(field, *v) : fallback;
  }
  double optional_number(const char* field, double fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_number()) throw error(field, str("must be a number, got ", json_excerpt(*v)));
    return v->get<double>();
  }
  bool optional_bool(const char* field, bool fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_boolean()) throw error(field, str("must be true or false, got ", json_excerpt(*v)));
    return v->get<bool>();
  }
  std::string optional_string(const char* field, const std::string& fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_string()) throw error(field, str("must be a string, got ", json_excerpt(*v)));
    return v->get<std::string>();
  }

 private:
  int64_t as_int(const char* field, const json& v) const {
    // is_number_integer() covers both signed and unsigned JSON integers, not 2048.0.
    if (!v.is_number_integer())
      throw error(field, str("must be an integer, got ", json_excerpt(v)));
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      throw error(field, str("is out of range: ", json_excerpt(v)));
    return v.get<int64_t>();
  }

  const std::string& path_;
  const json& j_;
};

}  // namespace

ModelConfig read_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(str("cannot open Hugging Face config '", path, "': ", strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw StorageError(str("cannot read Hugging Face config '", path, "'"));
  return parse_hf_config(text.str(), path);
}

ModelConfig parse_hf_config(const std::string& text, const std::string& path) {
  std::string why;
  const json j = parse_json_input(text, &why);
  if (j.is_discarded()) throw UserError(str("Hugging Face config '", path, "' ", why));
  if (!j.is_object())
    throw UserError(str("Hugging Face config '", path, "' is not a JSON object"));

  ConfigFields f(path, j);
  // A missing model_type is accepted: hand-written configs often leave it out.
  std::string model_type = f.optional_string("model_type", "llama");
  if (model_type != "llama")
    throw UserError(str("Hugging Face config '", path, "': model_type ", json_excerpt(model_type),
                        " is not supported (only 'llama')"));

  // Features that change the model's function: loading such weights into our Llama would run
  // without error and compute something else, so refuse them.
  if (f.find("rope_scaling"))
    throw f.error("rope_scaling", "is set; RoPE scaling is not supported (it must be null)");
  if (f.optional_bool("attention_bias", false))
    throw f.error("attention_bias", "is true; attention biases are not supported");
  if (f.optional_bool("mlp_bias", false))
    throw f.error("mlp_bias", "is true; MLP biases are not supported");
  std::string act = f.optional_string("hidden_act", "silu");
  if (act != "silu")
    throw f.error("hidden_act",
                  str("is ", json_excerpt(act), "; only 'silu' (SwiGLU) is supported"));
  // (transformers rotates only this fraction of each head's dimensions; ours rotate all)
  const double partial = f.optional_number("partial_rotary_factor", 1.0);
  if (partial != 1.0)
    throw f.error("partial_rotary_factor",
                  str("is ", partial, "; only full RoPE (1.0) is supported"));
  if (f.optional_number("attention_dropout", 0.0) != 0.0)
    throw f.error("attention_dropout", "is non-zero; attention dropout is not supported");

  ModelConfig c;
  c.hidden_size = f.required_int("hidden_size");
  c.intermediate_size = f.required_int("intermediate_size");
  c.num_hidden_layers = f.required_int("num_hidden_layers");
  c.num_attention_heads = f.required_int("num_attention_heads");
  c.vocab_size = f.required_int("vocab_size");
  c.num_key_value_heads = f.optional_int("num_key_value_heads", c.num_attention_heads);
  if (c.num_key_value_heads < 1)  // (0 would read as "as many as the heads" in finalize())
    throw f.error("num_key_value_heads", str("must be at least 1, got ", c.num_key_value_heads));
  c.head_dim = f.optional_int("head_dim", 0);  // 0: finalize() derives hidden / heads, as HF does
  if (f.find("head_dim") && c.head_dim < 1)
    throw f.error("head_dim", str("must be at least 1, got ", c.head_dim));
  c.rope_theta = f.optional_number("rope_theta", 10000.0);
  // Newer transformers write RoPE's settings as one object, rope_parameters = {rope_type,
  // rope_theta, and the scaling's own fields}: its theta counts, and only plain RoPE loads.
  if (const json* rp = f.find("rope_parameters")) {
    if (!rp->is_object())
      throw f.error("rope_parameters", str("must be an object, got ", json_excerpt(*rp)));
    ConfigFields r(path, *rp);
    const std::string type = r.optional_string("rope_type", "default");
    if (type != "default")
      throw f.error("rope_parameters", str("has rope_type ", json_excerpt(type),
                                           "; RoPE scaling is not supported (only 'default')"));
    const double rp_partial = r.optional_number("partial_rotary_factor", 1.0);
    if (rp_partial != 1.0)
      throw f.error("rope_parameters", str("has partial_rotary_factor ", rp_partial,
                                           "; only full RoPE (1.0) is supported"));
    const double theta = r.optional_number("rope_theta", c.rope_theta);
    if (f.find("rope_theta") && theta != c.rope_theta)
      throw f.error("rope_parameters", str("has rope_theta ", theta,
                                           " but the config's rope_theta is ", c.rope_theta));
    c.rope_theta = theta;
  }
  c.rms_norm_eps = f.optional_number("rms_norm_eps", 1e-6);  // LlamaConfig's default
  c.tie_word_embeddings = f.optional_bool("tie_word_embeddings", false);
  c.max_position_embeddings = f.optional_int("max_position_embeddings", 2048);
  if (c.max_position_embeddings < 1)
    throw f.error("max_position_embeddings",
                  str("must be at least 1, got ", c.max_position_embeddings));

  try {
    c.finalize();
    c.validate();
  } catch (const UserError& e) {
    throw UserError(str("Hugging Face config '", path, "': ", e.what()));
  }
  return c;
}

void write_hf_config(const ModelConfig& config, const std::string& path,
                     const std::string& torch_dtype) {
  write_file_atomic(path, hf_config_text(config, torch_dtype));
}

std::string hf_config_text(const ModelConfig& config, const std::string& torch_dtype) {
  ModelConfig c = config;
  c.finalize();
  c.validate();
  // Key order follows the fields' meaning, not the alphabet, so the file reads well.
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["rope_scaling"] = nullptr;
  // bos/eos token ids are left out: they belong to a tokenizer, which the engine does not fix.
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  j["initializer_range"] = 0.02;
  return j.dump(2) + "\n";
}

}  // namespace mx
