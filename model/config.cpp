#include "model/config.h"

#include <cmath>

#include "core/error.h"

namespace mx {

namespace {
// Parameter counts in T: int64_t for the counts, double for validate()'s bound (before it, the
// int64 products may overflow).
template <typename T>
T count_block_params(const ModelConfig& m) {
  const T C = T(m.hidden_size), I = T(m.intermediate_size);
  const T q = T(m.num_attention_heads) * T(m.head_dim);
  const T kv = T(m.num_key_value_heads) * T(m.head_dim);
  const T attn = C * q + 2 * C * kv + q * C;
  const T mlp = 3 * C * I;
  return attn + mlp + 2 * C;
}

template <typename T>
T count_params(const ModelConfig& m) {
  const T emb = T(m.vocab_size) * T(m.hidden_size);
  return emb + (m.tie_word_embeddings ? T(0) : emb) + T(m.hidden_size) +
         T(m.num_hidden_layers) * count_block_params<T>(m);
}
}  // namespace

void ModelConfig::finalize() {
  if (head_dim == 0 && num_attention_heads > 0) {
    MX_REQUIRE(hidden_size % num_attention_heads == 0, "model.num_attention_heads (",
               num_attention_heads, ") must divide model.hidden_size (", hidden_size,
               ") unless model.head_dim is given");
    head_dim = hidden_size / num_attention_heads;
  }
  if (num_key_value_heads == 0) num_key_value_heads = num_attention_heads;
}

void ModelConfig::validate() const {
  MX_REQUIRE(hidden_size > 0, "model.hidden_size must be positive (got ", hidden_size, ")");
  MX_REQUIRE(intermediate_size > 0, "model.intermediate_size must be positive (got ",
             intermediate_size, ")");
  MX_REQUIRE(num_hidden_layers > 0, "model.num_hidden_layers must be positive (got ",
             num_hidden_layers, ")");
  MX_REQUIRE(num_attention_heads > 0, "model.num_attention_heads must be positive (got ",
             num_attention_heads, ")");
  MX_REQUIRE(num_key_value_heads > 0, "model.num_key_value_heads must be positive (got ",
             num_key_value_heads, ")");
  MX_REQUIRE(vocab_size > 0, "model.vocab_size must be positive (got ", vocab_size, ")");
  MX_REQUIRE(num_attention_heads % num_key_value_heads == 0, "model.num_key_value_heads (",
             num_key_value_heads, ") must divide model.num_attention_heads (",
             num_attention_heads, ")");
  MX_REQUIRE(head_dim > 0, "model.head_dim must be positive (got ", head_dim, ")");
  MX_REQUIRE(head_dim % 2 == 0, "model.head_dim must be even for rotary embeddings (got ",
             head_dim, ")");
  // Hugging Face allows head_dim * heads != hidden_size when head_dim is explicit; so do we.
  // The model computes in float32: rms_norm_eps = 1e300 (or 1e39) is inf there, every
  // normalized activation 0, and a run trained to exit 0 with its loss stuck at ln(vocab) and
  // a grad_norm of 0; 1e-50 is 0 there. Refused as train.eps is.
  MX_REQUIRE(rope_theta > 0 && std::isfinite(float(rope_theta)),
             "model.rope_theta must be positive and finite as a float32 (got ", rope_theta, ")");
  MX_REQUIRE(rms_norm_eps > 0 && float(rms_norm_eps) > 0.0f &&
                 std::isfinite(float(rms_norm_eps)),
             "model.rms_norm_eps must be positive and finite as a float32, at least about "
             "1.4e-45 (got ", rms_norm_eps, ")");
  MX_REQUIRE(vocab_size <= (int64_t(1) << 31) - 1, "model.vocab_size too large");
  // Sizes far past any model this engine trains, so that no size product overflows int64 (an
  // intermediate_size of 2^62 made the MLP's 4 x 2^62 elements wrap to 0: a 2.2K-parameter
  // model that crashed generating its sample) and an absurd layer count fails here, not after
  // seconds of building per-layer tables.
  auto at_most = [](const char* key, int64_t v, int64_t cap) {
    MX_REQUIRE(v <= cap, "model.", key, " = ", v, " is more than the largest supported, ", cap);
  };
  at_most("hidden_size", hidden_size, int64_t(1) << 20);
  at_most("intermediate_size", intermediate_size, int64_t(1) << 22);
  at_most("head_dim", head_dim, int64_t(1) << 16);
  at_most("num_attention_heads", num_attention_heads, int64_t(1) << 16);
  at_most("num_hidden_layers", num_hidden_layers, int64_t(1) << 12);
  const double params = count_params<double>(*this);  // in double: it cannot overflow
  MX_REQUIRE(params <= double(int64_t(1) << 44), "the model has ", params,
             " parameters, more than the largest supported, 2^44 (17.6 trillion)");
}

int64_t ModelConfig::block_param_count() const { return count_block_params<int64_t>(*this); }

int64_t ModelConfig::param_count() const { return count_params<int64_t>(*this); }

double ModelConfig::flops_per_token(int64_t seq_len) const {
  double n = double(num_hidden_layers) * double(block_param_count() - 2 * hidden_size) +
             double(vocab_size) * double(hidden_size);
  return 6.0 * n + 12.0 * double(num_hidden_layers) * double(num_attention_heads) *
                       double(head_dim) * double(seq_len);
}

namespace {
ModelConfig make(int64_t C, int64_t I, int64_t L, int64_t H, int64_t KV, int64_t D, int64_t V,
                 double theta, bool tie, int64_t max_pos) {
  ModelConfig c;
  c.hidden_size = C;
  c.intermediate_size = I;
  c.num_hidden_layers = L;
  c.num_attention_heads = H;
  c.num_key_value_heads = KV;
  // Presets whose heads divide the hidden size leave head_dim derived, so that overriding
  // hidden_size or num_attention_heads on top of a preset keeps the shape consistent.
  c.head_dim = (D * H == C) ? 0 : D;
  c.vocab_size = V;
  c.rope_theta = theta;
  c.tie_word_embeddings = tie;
  c.max_position_embeddings = max_pos;
  return c;
}
}  // namespace

std::vector<std::string> model_preset_names() {
  return {"tiny", "small", "125m", "llama3.2-1b", "llama3.2-3b", "llama3-8b", "14b", "32b", "64b"};
}

ModelConfig model_preset(const std::string& name) {
  // Byte-level presets use vocab 256 (the built-in tokenizer); the rest use Llama 3's 128256
  // (or Llama 2's 32000 for 125m), with the shapes of the published models.
  if (name == "tiny") return make(64, 160, 2, 4, 2, 16, 256, 10000.0, false, 1024);
  if (name == "small") return make(384, 1152, 6, 6, 2, 64, 256, 10000.0, false, 2048);
  // GPT-3 Small's 125M shape as a Llama (12 x 768, 12 heads), Llama-2 vocabulary.
  if (name == "125m") return make(768, 2048, 12, 12, 12, 64, 32000, 10000.0, false, 2048);
  // meta-llama/Llama-3.2-1B and -3B config.json (rope scaling not modelled).
  if (name == "llama3.2-1b") return make(2048, 8192, 16, 32, 8, 64, 128256, 500000.0, true, 131072);
  if (name == "llama3.2-3b") return make(3072, 8192, 28, 24, 8, 128, 128256, 500000.0, true, 131072);
  // meta-llama/Meta-Llama-3-8B config.json.
  if (name == "llama3-8b") return make(4096, 14336, 32, 32, 8, 128, 128256, 500000.0, false, 8192);
  // 14B and 32B: the Llama-architecture shapes of Qwen2.5-14B / -32B (no Llama 3 model has these
  // sizes), with Llama 3's vocabulary.
  if (name == "14b") return make(5120, 13824, 48, 40, 8, 128, 128256, 500000.0, false, 8192);
  if (name == "32b") return make(5120, 27648, 64, 40, 8, 128, 128256, 500000.0, false, 8192);
  // 64B: Llama 2 70B's body (80 x 8192, 64 heads, 8 KV heads) with the MLP narrowed from 28672
  // to 25344 so that the total, with Llama 3's vocabulary, is 64.0B.
  if (name == "64b") return make(8192, 25344, 80, 64, 8, 128, 128256, 500000.0, false, 8192);
  std::string names;
  for (auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw UserError(str("unknown model preset '", name, "' (known: ", names, ")"));
}

}  // namespace mx
