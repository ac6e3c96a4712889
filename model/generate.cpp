#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "core/arena.h"
#include "core/error.h"
#include "core/log.h"

namespace mx {

namespace {

// Buffers in the backend's memory: MemoryResource allocations where it has one (CUDA; the CPU
// under MXTRAIN_TEST_DEVICE_MEMORY), else host vectors. Freed on destruction.
class BackendBuffers {
 public:
  explicit BackendBuffers(Backend& be) : mem_(be.memory()) {}
  ~BackendBuffers() {
    for (void* p : device_) mem_->deallocate(p);
  }
  BackendBuffers(const BackendBuffers&) = delete;
  BackendBuffers& operator=(const BackendBuffers&) = delete;
  float* floats(int64_t n) { return static_cast<float*>(bytes(sizeof(float) * size_t(n))); }
  void* bytes(size_t n) {
    if (mem_) {
      device_.push_back(mem_->allocate(std::max<size_t>(n, 16), "generate"));
      return device_.back();
    }
    host_.emplace_back((n + sizeof(float) - 1) / sizeof(float) + 1, 0.0f);
    return host_.back().data();
  }

 private:
  MemoryResource* mem_;
  std::vector<void*> device_;
  std::vector<std::vector<float>> host_;
};

// One token at a time, every tensor in the backend's memory (weights, KV cache, activations).
// On a backend the host cannot address (CUDA; the CPU under MXTRAIN_TEST_STAGING), the weights
// are copied over once and only the token, the RoPE angles and the logits cross per step.
class Decoder {
 public:
  Decoder(const ModelConfig& c, const ParamLayout& layout, Backend& be, const float* params,
          int64_t max_len)
      : c_(c), layout_(layout), be_(be), buf_(be), max_len_(max_len) {
    const int64_t C = c.hidden_size;
    if (be.host_addressable()) {
      P_ = const_cast<float*>(params);
    } else {
      P_ = buf_.floats(layout.total_numel());
      be.copy_from_host(P_, params, sizeof(float) * size_t(layout.total_numel()));
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      k_cache_.push_back(buf_.floats(max_len * c.kv_dim()));
      v_cache_.push_back(buf_.floats(max_len * c.kv_dim()));
    }
    x_ = buf_.floats(C);
    h_ = buf_.floats(C);
    tmp_ = buf_.floats(C);
    rstd_ = buf_.floats(1);
    q_ = buf_.floats(c.q_dim());
    o_ = buf_.floats(c.q_dim());
    g_ = buf_.floats(c.intermediate_size);
    u_ = buf_.floats(c.intermediate_size);
    cos_ = buf_.floats(c.head_dim / 2);
    sin_ = buf_.floats(c.head_dim / 2);
    token_ = static_cast<int32_t*>(buf_.bytes(sizeof(int32_t)));
    logits_dev_ = buf_.floats(c.vocab_size);
    logits_.resize(size_t(c.vocab_size));
    host_cos_.resize(size_t(c.head_dim / 2));
    host_sin_.resize(size_t(c.head_dim / 2));
  }

  // Feeds the token at position `pos_` and returns the next-token logits.
  const std::vector<float>& step(int32_t token) {
    MX_ASSERT(pos_ < max_len_);
    const int64_t C = c_.hidden_size, I = c_.intermediate_size, D = c_.head_dim;
    const int64_t H = c_.num_attention_heads, KV = c_.num_key_value_heads;
    const float eps = float(c_.rms_norm_eps);
    for (int64_t i = 0; i < D / 2; ++i) {  // the same angles as the trainer's tables
      double angle = double(pos_) * std::pow(c_.rope_theta, -double(2 * i) / double(D));
      host_cos_[size_t(i)] = float(std::cos(angle));
      host_sin_[size_t(i)] = float(std::sin(angle));
    }
    be_.copy_from_host(cos_, host_cos_.data(), sizeof(float) * host_cos_.size());
    be_.copy_from_host(sin_, host_sin_.data(), sizeof(float) * host_sin_.size());
    be_.copy_from_host(token_, &token, sizeof(int32_t));
    be_.embedding_forward(x_, token_, layout_.embedding(P_), 1, C);
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      BlockParams w = layout_.block(P_, l);
      float* k = k_cache_[size_t(l)] + pos_ * c_.kv_dim();
      float* v = v_cache_[size_t(l)] + pos_ * c_.kv_dim();
      be_.rmsnorm_forward(h_, rstd_, x_, w.input_norm, 1, C, eps);
      be_.linear_forward(q_, h_, w.wq, 1, C, c_.q_dim());
      be_.linear_forward(k, h_, w.wk, 1, C, c_.kv_dim());
      be_.linear_forward(v, h_, w.wv, 1, C, c_.kv_dim());
      be_.rope_forward(q_, cos_, sin_, 1, 1, H, D);
      be_.rope_forward(k, cos_, sin_, 1, 1, KV, D);
      be_.attention_decode(o_, q_, k_cache_[size_t(l)], v_cache_[size_t(l)], pos_ + 1, H, KV, D);
      be_.linear_forward(tmp_, o_, w.wo, 1, c_.q_dim(), C);
      be_.add(x_, x_, tmp_, C);
      be_.rmsnorm_forward(h_, rstd_, x_, w.post_norm, 1, C, eps);
      be_.linear_forward(g_, h_, w.w_gate, 1, C, I);
      be_.linear_forward(u_, h_, w.w_up, 1, C, I);
      be_.swiglu_forward(g_, g_, u_, I);
      be_.linear_forward(tmp_, g_, w.w_down, 1, I, C);
      be_.add(x_, x_, tmp_, C);
    }
    be_.rmsnorm_forward(h_, rstd_, x_, layout_.final_norm(P_), 1, C, eps);
    be_.head_logits(logits_dev_, h_, layout_.head(P_), 1, C, c_.vocab_size);
    be_.copy_to_host(logits_.data(), logits_dev_, sizeof(float) * logits_.size());
    ++pos_;
    return logits_;
  }

 private:
  const ModelConfig& c_;
  const ParamLayout& layout_;
  Backend& be_;
  BackendBuffers buf_;
  float* P_ = nullptr;
  int64_t max_len_, pos_ = 0;
  std::vector<float*> k_cache_, v_cache_;
  float *x_, *h_, *tmp_, *rstd_, *q_, *o_, *g_, *u_, *cos_, *sin_, *logits_dev_;
  int32_t* token_;
  std::vector<float> logits_, host_cos_, host_sin_;
};

int32_t sample(const std::vector<float>& logits, const SampleOptions& o, std::mt19937_64& rng,
               int64_t position) {
  const int64_t V = int64_t(logits.size());
  // Finite weights can still overflow float32 on the way (the head's sums): a NaN or inf
  // logit made max_element and the sort pick arbitrary tokens, silently.
  for (int64_t v = 0; v < V; ++v)
    if (!std::isfinite(logits[size_t(v)]))
      throw UserError(str("the model's logit of token ", v, " at position ", position, " is ",
                          logits[size_t(v)], ": the model's weights are not finite or ",
                          "overflow float32 there, so no token can be chosen"));
  if (o.temperature <= 0)
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = (o.top_k > 0 && o.top_k < V) ? o.top_k : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  // Top-k keeps every token whose logit is not below the k-th (as Hugging Face's top-k
  // filter): of two tokens tied at the k-th logit, the lower id alone was ever picked.
  if (k < V) {
    const float kth = logits[size_t(idx[size_t(k - 1)])];
    const auto tied = std::partition(idx.begin() + k, idx.end(),
                                     [&](int32_t a) { return logits[size_t(a)] >= kth; });
    k = tied - idx.begin();
  }
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

// A decoder on `backend`, or, when the backend's memory cannot hold the weights' copy and the
// KV cache (a GPU whose arenas the training run still holds), on the CPU backend, said once.
std::unique_ptr<Decoder> make_decoder(const ModelConfig& c, const ParamLayout& layout,
                                      Backend& backend, std::unique_ptr<Backend>& owned,
                                      const float* params, int64_t max_len) {
  if (!backend.memory()) return std::make_unique<Decoder>(c, layout, backend, params, max_len);
  try {
    return std::make_unique<Decoder>(c, layout, backend, params, max_len);
  } catch (const UserError& e) {
    warn(str("generation: ", e.what(), "; decoding on the CPU instead"));
  }
  owned = make_host_backend();
  return std::make_unique<Decoder>(c, layout, *owned, params, max_len);
}

}  // namespace

std::vector<int32_t> generate_tokens(const ModelConfig& config, const ParamLayout& layout,
                                     Backend& backend, const float* params,
                                     const std::vector<int32_t>& prompt,
                                     const SampleOptions& options) {
  MX_REQUIRE(!prompt.empty(), "the prompt is empty");
  for (int32_t t : prompt)
    MX_REQUIRE(t >= 0 && t < config.vocab_size, "prompt token ", t, " is outside the vocabulary");
  // (the sum overflowed to a negative length for --max-tokens near 2^63)
  MX_REQUIRE(options.max_new_tokens <= kMaxGeneratePositions - int64_t(prompt.size()),
             "the prompt (", prompt.size(), " tokens) and the tokens to generate (",
             options.max_new_tokens, ") exceed ", kMaxGeneratePositions, " positions");
  std::unique_ptr<Backend> owned;
  auto dec = make_decoder(config, layout, backend, owned, params,
                          int64_t(prompt.size()) + options.max_new_tokens);
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> out = prompt;
  const std::vector<float>* logits = nullptr;
  for (int32_t t : prompt) logits = &dec->step(t);
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (options.stop && options.stop->load() != 0) break;
    int32_t next = sample(*logits, options, rng, int64_t(out.size()));
    out.push_back(next);
    if (i + 1 < options.max_new_tokens) logits = &dec->step(next);
  }
  return out;
}

std::vector<float> last_logits(const ModelConfig& config, const ParamLayout& layout,
                               Backend& backend, const float* params,
                               const std::vector<int32_t>& tokens) {
  std::unique_ptr<Backend> owned;
  auto dec = make_decoder(config, layout, backend, owned, params, int64_t(tokens.size()));
  std::vector<float> out;
  for (int32_t t : tokens) out = dec->step(t);
  return out;
}

}  // namespace mx
