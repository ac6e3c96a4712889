#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"

namespace mx {

namespace {

class Decoder {
 public:
  Decoder(const ModelConfig& c, const ParamLayout& layout, Backend& be, const float* params,
          int64_t max_len)
      : c_(c), layout_(layout), be_(be), P_(const_cast<float*>(params)), max_len_(max_len) {
    const int64_t C = c.hidden_size;
    k_cache_.assign(c.num_hidden_layers, std::vector<float>(max_len * c.kv_dim()));
    v_cache_.assign(c.num_hidden_layers, std::vector<float>(max_len * c.kv_dim()));
    x_.resize(C);
    h_.resize(C);
    tmp_.resize(C);
    q_.resize(c.q_dim());
    o_.resize(c.q_dim());
    g_.resize(c.intermediate_size);
    u_.resize(c.intermediate_size);
    cos_.resize(c.head_dim / 2);
    sin_.resize(c.head_dim / 2);
    logits_.resize(c.vocab_size);
  }

  // Feeds the token at position `pos_` and returns the next-token logits.
  const std::vector<float>& step(int32_t token) {
    MX_ASSERT(pos_ < max_len_);
    const int64_t C = c_.hidden_size, I = c_.intermediate_size, D = c_.head_dim;
    const int64_t H = c_.num_attention_heads, KV = c_.num_key_value_heads;
    const float eps = float(c_.rms_norm_eps);
    float rstd;
    for (int64_t i = 0; i < D / 2; ++i) {  // the same angles as the trainer's tables
      double angle = double(pos_) * std::pow(c_.rope_theta, -double(2 * i) / double(D));
      cos_[i] = float(std::cos(angle));
      sin_[i] = float(std::sin(angle));
    }
    be_.embedding_forward(x_.data(), &token, layout_.embedding(P_), 1, C);
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      BlockParams w = layout_.block(P_, l);
      float* k = k_cache_[l].data() + pos_ * c_.kv_dim();
      float* v = v_cache_[l].data() + pos_ * c_.kv_dim();
      be_.rmsnorm_forward(h_.data(), &rstd, x_.data(), w.input_norm, 1, C, eps);
      be_.linear_forward(q_.data(), h_.data(), w.wq, 1, C, c_.q_dim());
      be_.linear_forward(k, h_.data(), w.wk, 1, C, c_.kv_dim());
      be_.linear_forward(v, h_.data(), w.wv, 1, C, c_.kv_dim());
      be_.rope_forward(q_.data(), cos_.data(), sin_.data(), 1, 1, H, D);
      be_.rope_forward(k, cos_.data(), sin_.data(), 1, 1, KV, D);
      be_.attention_decode(o_.data(), q_.data(), k_cache_[l].data(), v_cache_[l].data(),
                           pos_ + 1, H, KV, D);
      be_.linear_forward(tmp_.data(), o_.data(), w.wo, 1, c_.q_dim(), C);
      be_.add(x_.data(), x_.data(), tmp_.data(), C);
      be_.rmsnorm_forward(h_.data(), &rstd, x_.data(), w.post_norm, 1, C, eps);
      be_.linear_forward(g_.data(), h_.data(), w.w_gate, 1, C, I);
      be_.linear_forward(u_.data(), h_.data(), w.w_up, 1, C, I);
      be_.swiglu_forward(g_.data(), g_.data(), u_.data(), I);
      be_.linear_forward(tmp_.data(), g_.data(), w.w_down, 1, I, C);
      be_.add(x_.data(), x_.data(), tmp_.data(), C);
    }
    be_.rmsnorm_forward(h_.data(), &rstd, x_.data(), layout_.final_norm(P_), 1, C, eps);
    be_.head_logits(logits_.data(), h_.data(), layout_.head(P_), 1, C, c_.vocab_size);
    ++pos_;
    return logits_;
  }

 private:
  const ModelConfig& c_;
  const ParamLayout& layout_;
  Backend& be_;
  float* P_;
  int64_t max_len_, pos_ = 0;
  std::vector<std::vector<float>> k_cache_, v_cache_;
  std::vector<float> x_, h_, tmp_, q_, o_, g_, u_, cos_, sin_, logits_;
};

int32_t sample(const std::vector<float>& logits, const SampleOptions& o, std::mt19937_64& rng) {
  const int64_t V = int64_t(logits.size());
  if (o.temperature <= 0)
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = (o.top_k > 0 && o.top_k < V) ? o.top_k : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(k);
  double mx = logits[idx[0]], sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / o.temperature);
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (int64_t i = 0; i < k; ++i) {
    r -= p[i];
    if (r <= 0) return idx[i];
  }
  return idx[k - 1];
}

// The decoder keeps its KV cache and activations in host vectors: a backend with device memory
// (CUDA) hands generation to the CPU backend (params are host memory here in any case).
Backend& host_backend_for(Backend& backend, std::unique_ptr<Backend>& owned) {
  if (!backend.memory()) return backend;
  owned = make_cpu_backend();
  return *owned;
}

}  // namespace

std::vector<int32_t> generate_tokens(const ModelConfig& config, const ParamLayout& layout,
                                     Backend& backend, const float* params,
                                     const std::vector<int32_t>& prompt,
                                     const SampleOptions& options) {
  MX_REQUIRE(!prompt.empty(), "the prompt is empty");
  for (int32_t t : prompt)
    MX_REQUIRE(t >= 0 && t < config.vocab_size, "prompt token ", t, " is outside the vocabulary");
  std::unique_ptr<Backend> owned;
  Decoder dec(config, layout, host_backend_for(backend, owned), params,
              int64_t(prompt.size()) + options.max_new_tokens);
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> out = prompt;
  const std::vector<float>* logits = nullptr;
  for (int32_t t : prompt) logits = &dec.step(t);
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    int32_t next = sample(*logits, options, rng);
    out.push_back(next);
    if (i + 1 < options.max_new_tokens) logits = &dec.step(next);
  }
  return out;
}

std::vector<float> last_logits(const ModelConfig& config, const ParamLayout& layout,
                               Backend& backend, const float* params,
                               const std::vector<int32_t>& tokens) {
  std::unique_ptr<Backend> owned;
  Decoder dec(config, layout, host_backend_for(backend, owned), params, int64_t(tokens.size()));
  std::vector<float> out;
  for (int32_t t : tokens) out = dec.step(t);
  return out;
}

}  // namespace mx
