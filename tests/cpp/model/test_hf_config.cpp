// Hugging Face config.json: the published Llama-3.2-1B config parses to its known shape; bad
// configs are refused by field; what we write is checked by parsing it with nlohmann directly.
#include "model/hf_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/error.h"

namespace {

namespace fs = std::filesystem;

// meta-llama/Llama-3.2-1B config.json as published, less its rope_scaling block (llama3 RoPE
// scaling is not modelled) and with rope_scaling absent instead.
const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

class HfConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mx_hf_config_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_text(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // The 1B config with one field set to `value`, or removed when `remove` is true.
  std::string write_variant(const std::string& name, const std::string& field,
                            const nlohmann::json& value, bool remove = false) {
    nlohmann::json j = nlohmann::json::parse(kLlama32_1B);
    if (remove)
      j.erase(field);
    else
      j[field] = value;
    return write_text(name, j.dump());
  }
  // read_hf_config(path) must throw UserError naming the file and containing `also`.
  void expect_user_error(const std::string& path, const std::string& also) {
    try {
      mx::read_hf_config(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const mx::UserError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(also), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong exception type: " << e.what();
    }
  }

  fs::path dir_;
};

TEST_F(HfConfigTest, ReadsLlama32_1B) {
  mx::ModelConfig c = mx::read_hf_config(write_text("config.json", kLlama32_1B));
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  // The same shape as the built-in preset of that model.
  mx::ModelConfig preset = mx::model_preset("llama3.2-1b");
  preset.finalize();
  EXPECT_EQ(c.param_count(), preset.param_count());
  EXPECT_EQ(c.param_count(), 1235814400);  // Llama-3.2-1B's published parameter count
}

TEST_F(HfConfigTest, AppliesLlamaConfigDefaults) {
  std::string path = write_text("config.json", R"({
    "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 1000})");
  mx::ModelConfig c = mx::read_hf_config(path);  // no model_type: accepted
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 2048);
}

TEST_F(HfConfigTest, NullMeansDefault) {
  nlohmann::json j = nlohmann::json::parse(kLlama32_1B);
  j["num_key_value_heads"] = nullptr;
  j["head_dim"] = nullptr;
  j["rope_scaling"] = nullptr;
  mx::ModelConfig c = mx::read_hf_config(write_text("config.json", j.dump()));
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 64);
}

TEST_F(HfConfigTest, RejectsMissingRequiredFields) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size"}) {
    SCOPED_TRACE(field);
    expect_user_error(write_variant(std::string(field) + ".json", field, nullptr, true), field);
    // An explicit null is as missing as an absent key for a required field.
    expect_user_error(write_variant(std::string(field) + "_null.json", field, nullptr), field);
  }
}

TEST_F(HfConfigTest, RejectsWrongTypesNamingTheField) {
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"hidden_size", "2048"},
      {"hidden_size", 2048.0},
      {"intermediate_size", true},
      {"num_hidden_layers", nlohmann::json::array({16})},
      {"num_attention_heads", 32.5},
      {"num_key_value_heads", "8"},
      {"head_dim", 64.0},
      {"vocab_size", nlohmann::json::object()},
      {"rope_theta", "500000"},
      {"rms_norm_eps", false},
      {"tie_word_embeddings", 1},
      {"tie_word_embeddings", "true"},
      {"max_position_embeddings", 1.5},
      {"model_type", 5},
      {"attention_bias", 0},
      {"vocab_size", nlohmann::json(18446744073709551615ull)},  // beyond int64
  };
  int i = 0;
  for (const auto& [field, value] : cases) {
    SCOPED_TRACE(field + " = " + value.dump());
    expect_user_error(write_variant("type" + std::to_string(i++) + ".json", field, value), field);
  }
}

TEST_F(HfConfigTest, RejectsOtherModelTypes) {
  expect_user_error(write_variant("gpt2.json", "model_type", "gpt2"), "gpt2");
  expect_user_error(write_variant("mistral.json", "model_type", "mistral"), "mistral");
}

TEST_F(HfConfigTest, RejectsUnsupportedFeatures) {
  nlohmann::json llama3_scaling = {{"factor", 32.0},
                                   {"high_freq_factor", 4.0},
                                   {"low_freq_factor", 1.0},
                                   {"original_max_position_embeddings", 8192},
                                   {"rope_type", "llama3"}};
  expect_user_error(write_variant("rope.json", "rope_scaling", llama3_scaling), "not supported");
  expect_user_error(write_variant("abias.json", "attention_bias", true), "attention_bias");
  expect_user_error(write_variant("mbias.json", "mlp_bias", true), "mlp_bias");
  expect_user_error(write_variant("act.json", "hidden_act", "gelu"), "hidden_act");
  expect_user_error(write_variant("drop.json", "attention_dropout", 0.1), "attention_dropout");
  expect_user_error(write_variant("partial.json", "partial_rotary_factor", 0.5),
                    "partial_rotary_factor");
  // 1.0 is full RoPE, what the model computes: loaded
  EXPECT_NO_THROW(mx::read_hf_config(write_variant("full.json", "partial_rotary_factor", 1.0)));
}

TEST_F(HfConfigTest, RejectsImpossibleShapesAndBadFiles) {
  // validate() runs: 8 KV heads cannot divide 12 heads.
  expect_user_error(write_variant("kv.json", "num_attention_heads", 12), "num_key_value_heads");
  expect_user_error(write_variant("zero.json", "hidden_size", 0), "hidden_size");
  expect_user_error(write_text("broken.json", "{\"hidden_size\": "), "JSON");
  expect_user_error(write_text("array.json", "[1, 2]"), "object");
  std::string missing = (dir_ / "nope.json").string();
  expect_user_error(missing, "nope.json");
}

TEST_F(HfConfigTest, WritesWhatLlamaConfigLoads) {
  mx::ModelConfig c = mx::model_preset("llama3.2-1b");
  c.finalize();
  c.rms_norm_eps = 1e-5;
  std::string path = (dir_ / "config.json").string();
  mx::write_hf_config(c, path);

  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str());
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["hidden_size"], 2048);
  EXPECT_EQ(j["intermediate_size"], 8192);
  EXPECT_EQ(j["num_hidden_layers"], 16);
  EXPECT_EQ(j["num_attention_heads"], 32);
  EXPECT_EQ(j["num_key_value_heads"], 8);
  EXPECT_EQ(j["head_dim"], 64);
  EXPECT_EQ(j["vocab_size"], 128256);
  EXPECT_EQ(j["max_position_embeddings"], 131072);
  EXPECT_TRUE(j["rope_theta"].is_number());
  EXPECT_EQ(j["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(j["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["mlp_bias"], false);
  ASSERT_TRUE(j.contains("rope_scaling"));
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["pretraining_tp"], 1);
  EXPECT_EQ(j["use_cache"], true);
  EXPECT_EQ(j["initializer_range"].get<double>(), 0.02);
  EXPECT_FALSE(j.contains("bos_token_id"));
  EXPECT_FALSE(j.contains("eos_token_id"));

  // And it reads back to the same shape.
  mx::ModelConfig back = mx::read_hf_config(path);
  EXPECT_EQ(back.param_count(), c.param_count());
  EXPECT_EQ(back.num_key_value_heads, 8);
  EXPECT_EQ(back.rms_norm_eps, 1e-5);
  EXPECT_EQ(back.max_position_embeddings, 131072);
}

TEST_F(HfConfigTest, WriteFillsHeadDimAndIsAtomic) {
  mx::ModelConfig c = mx::model_preset("tiny");
  c.head_dim = 0;  // written as the derived value
  std::string path = (dir_ / "config.json").string();
  std::ofstream(path) << "old contents that are much longer than nothing at all, and not JSON";
  mx::write_hf_config(c, path);
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);  // the old bytes are gone entirely
  EXPECT_EQ(j["head_dim"], c.hidden_size / c.num_attention_heads);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);  // no temp file left beside it

  std::string bad = (dir_ / "no_such_dir" / "config.json").string();
  EXPECT_THROW(mx::write_hf_config(c, bad), mx::StorageError);
  EXPECT_FALSE(fs::exists(dir_ / "no_such_dir"));

  mx::ModelConfig invalid = c;
  invalid.vocab_size = 0;
  EXPECT_THROW(mx::write_hf_config(invalid, (dir_ / "bad.json").string()), mx::UserError);
  EXPECT_FALSE(fs::exists(dir_ / "bad.json"));
}

}  // namespace
