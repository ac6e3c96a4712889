// Autoregressive sampling with a KV cache: one token at a time through the same backend ops
// the trainer uses (rows of one), so a trained model can be looked at right away.
#pragma once
#include <atomic>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/params.h"

namespace mx {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: whole vocabulary
  uint64_t seed = 0;
  // Checked before each token: non-zero ends the generation there (what was generated is
  // returned). The trainer's end-of-run sample passes its signal flag, so SIGTERM / Ctrl-C stop
  // a long sample as they stop training.
  const std::atomic<int>* stop = nullptr;
};

// The most positions (prompt + generated) one generation may span: 2^32, far past what fits in
// memory for any preset; a request above it is an error, not an overflow.
constexpr int64_t kMaxGeneratePositions = int64_t(1) << 32;

// Returns prompt + generated ids. `prompt` must be non-empty.
std::vector<int32_t> generate_tokens(const ModelConfig& config, const ParamLayout& layout,
                                     Backend& backend, const float* params,
                                     const std::vector<int32_t>& prompt,
                                     const SampleOptions& options);

// Logits of the last position for `tokens`, through the KV-cache path (for tests).
std::vector<float> last_logits(const ModelConfig& config, const ParamLayout& layout,
                               Backend& backend, const float* params,
                               const std::vector<int32_t>& tokens);

}  // namespace mx
