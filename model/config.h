// The model's shape, in Hugging Face LlamaConfig field names, and its presets.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mx {

struct ModelConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // 0 = hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 8192;  // carried to config.json; the engine needs no limit

  int64_t q_dim() const { return num_attention_heads * head_dim; }   // width of q_proj's output
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }  // width of k_proj / v_proj
  // Throws UserError naming the first impossible field (heads not dividing, zero sizes...).
  void validate() const;
  // Fills head_dim when it is 0. Call before validate().
  void finalize();

  int64_t block_param_count() const;
  int64_t param_count() const;  // all parameters; a tied head counts once
  // Training FLOPs per token, PaLM appendix B: 6 N (non-embedding matmul params incl. head)
  // + 12 L H Dh T for attention (causal halves it in practice; we count as PaLM does).
  double flops_per_token(int64_t seq_len) const;
};

// Presets: tiny (tests), small (the CPU demo), then the real shapes of Llama-family models.
ModelConfig model_preset(const std::string& name);  // UserError for an unknown name
std::vector<std::string> model_preset_names();

}  // namespace mx
