#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace mx {

Checkpointing parse_checkpointing(const std::string& s) {
  if (s == "none") return Checkpointing::kNone;
  if (s == "selective") return Checkpointing::kSelective;
  if (s == "full") return Checkpointing::kFull;
  throw UserError(str("unknown activation checkpointing '", s,
                      "' (memory.activation_checkpointing: none, selective or full)"));
}

const char* checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::kNone: return "none";
    case Checkpointing::kSelective: return "selective";
    case Checkpointing::kFull: return "full";
  }
  return "?";
}

int64_t head_chunk_rows(const ModelConfig& c, int64_t tokens, bool device) {
  // CPU: 32M floats (128 MiB) of logits at a time: about 1000 rows at a 32K vocabulary, where
  // the head's three GEMMs reach the full SGEMM rate (at 256 rows they ran ~20% slower), and
  // still a bounded workspace at Llama 3's 128K vocabulary (256 rows).
  // GPU: 64M floats (256 MiB, MXTRAIN_CUDA_HEAD_CHUNK_MB): about 520 rows at 128K. Every
  // chunk's GEMMs read all of W (V x C), so with 256 rows the head's GEMMs do 256
  // multiply-adds per bf16 weight read, about an H200's FLOP:byte balance (~200), and would
  // run near memory-bound; twice that keeps them compute-bound for 128 MiB more of a 141-268
  // GB device. (Each chunk's weight gradient also reads and writes all of dW in fp32: larger
  // chunks move less; cuda_head_chunk_bytes.)
  const int64_t budget =
      device ? int64_t(cuda_head_chunk_bytes() / sizeof(float)) : int64_t(32) << 20;
  int64_t rows = budget / c.vocab_size;
  // Tests: a planned device chunk of a few rows, so that spare_head_chunk_rows has something to
  // grow at the small shapes an emulated device trains.
  if (const char* t = std::getenv("MXTRAIN_TEST_HEAD_CHUNK_ROWS"); device && t && *t)
    rows = std::atoll(t);
  return std::clamp<int64_t>(rows, 1, std::max<int64_t>(tokens, 1));
}

int64_t head_rows_in(int64_t floats, const ModelConfig& c, int64_t tokens,
                     HeadOperands operands) {
  // head_workspace_floats grows with the rows: the largest that fits, by bisection
  int64_t lo = 0, hi = std::max<int64_t>(tokens, 0);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (head_workspace_floats(mid, c.hidden_size, c.vocab_size, operands) <= floats)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

int64_t spare_head_chunk_rows(const ModelConfig& c, int64_t tokens, HeadOperands operands,
                              int64_t free_bytes, int64_t total_bytes) {
  const int64_t planned = head_chunk_rows(c, tokens, true);
  const int64_t reserve = (int64_t(4) << 30) + total_bytes / 32;
  for (int64_t logits_mib : {4096, 2048, 1024, 512}) {
    const int64_t rows =
        std::min(tokens, (logits_mib << 20) / int64_t(sizeof(float)) / c.vocab_size);
    if (rows <= planned) continue;
    const int64_t bytes = int64_t(sizeof(float)) *
                          head_workspace_floats(rows, c.hidden_size, c.vocab_size, operands);
    if (bytes + reserve <= free_bytes) return rows;
  }
  return 0;
}

// What one block allocates, as counts of floats, so that forward, backward and the arena
// sizing below agree on one list.
namespace {
struct BlockSizes {
  int64_t h1, rstd1, q, k, v, o, lse, x_mid, h2, rstd2, g, u, s;
  BlockSizes(const ModelConfig& c, int64_t B, int64_t T) {
    int64_t N = B * T;
    h1 = N * c.hidden_size;
    rstd1 = N;
    q = N * c.q_dim();
    k = v = N * c.kv_dim();
    o = N * c.q_dim();
    lse = B * c.num_attention_heads * T;
    x_mid = h2 = N * c.hidden_size;
    rstd2 = N;
    g = u = s = N * c.intermediate_size;
  }
  // Which tensors a policy keeps for backward: (is a norm output / SwiGLU product, is a GEMM
  // output / attention statistic).
  static bool keeps(Checkpointing p, bool cheap) {
    if (p == Checkpointing::kNone) return true;
    if (p == Checkpointing::kSelective) return !cheap;
    return false;
  }
};

size_t bytes_f32(int64_t n) { return Arena::round_up(sizeof(float) * size_t(n)); }
size_t bytes_bf16(int64_t n) { return Arena::round_up(sizeof(uint16_t) * size_t(n)); }
}  // namespace

struct LlamaModel::BlockActs {
  float *h1 = nullptr, *rstd1 = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr,
        *lse = nullptr, *x_mid = nullptr, *h2 = nullptr, *rstd2 = nullptr, *g = nullptr,
        *u = nullptr, *s = nullptr;
  // precision.activations = bf16: the kept bf16 copies in `saved` (null: not kept as bf16).
  // In the bf16 path (LlamaModel::bf16_path) the nine tensors exist only as codes, kept (in
  // `saved`) or not (in scratch); their fp32 pointers stay null.
  uint16_t *h1_16 = nullptr, *q_16 = nullptr, *k_16 = nullptr, *v_16 = nullptr,
           *o_16 = nullptr, *h2_16 = nullptr, *g_16 = nullptr, *u_16 = nullptr, *s_16 = nullptr;
  // x^T's FP8 codes kept in place of h1's, h2's and s's bf16 codes (LlamaModel::saves_xt)
  SavedXt h1_xt{}, h2_xt{}, s_xt{};
  bool bf16_path = false;  // forward took the bf16 path; backward takes it too
  bool native16 = false;   // ... with its Linears on the backend's native bf16 GEMMs
  // After forward, forget what lived in scratch (it is released) so backward recomputes it
  // (or, bf16, widens the kept copy again).
  void drop_unsaved(Checkpointing p, bool bf16) {
    if (!BlockSizes::keeps(p, true)) {
      h1 = rstd1 = h2 = rstd2 = s = nullptr;
      h1_16 = h2_16 = s_16 = nullptr;
      h1_xt = h2_xt = s_xt = {};
    }
    if (!BlockSizes::keeps(p, false)) {
      q = k = v = o = lse = x_mid = g = u = nullptr;
      q_16 = k_16 = v_16 = o_16 = g_16 = u_16 = nullptr;
    }
    if (bf16) h1 = q = k = v = o = h2 = g = u = s = nullptr;
  }
};

namespace {
// Scratch of the bf16 path (every block on it), from LlamaModel's allocations in scratch:
// block_forward's under a policy (evaluation runs full) and block_backward's (recompute, then
// the MLP's or the attention's gradients, one after the other), beside the head's.
size_t bf16_path_scratch(const ModelConfig& c, int64_t B, int64_t T, Checkpointing policy,
                         size_t head) {
  const int64_t N = B * T, C = c.hidden_size;
  BlockSizes z(c, B, T);
  auto forward = [&](Checkpointing p) {
    const bool cheap = BlockSizes::keeps(p, true), gemm = BlockSizes::keeps(p, false);
    // q, k (the output projections add their residual themselves: no proj, no down)
    size_t s = bytes_f32(z.q) + bytes_f32(z.k);
    if (!cheap)  // h1, rstd1, h2, rstd2, s
      s += 2 * bytes_bf16(z.h1) + 2 * bytes_f32(z.rstd1) + bytes_bf16(z.s);
    if (!gemm)  // q, k, v, o, g, u as codes; lse, x_mid
      s += bytes_bf16(z.q) + 2 * bytes_bf16(z.k) + bytes_bf16(z.o) + 2 * bytes_bf16(z.g) +
           bytes_f32(z.lse) + bytes_f32(z.x_mid);
    return s;
  };
  size_t recompute = 0;
  if (policy == Checkpointing::kFull) recompute = bytes_f32(N * C) + forward(policy);  // + y
  if (policy == Checkpointing::kSelective)
    recompute = 2 * bytes_f32(z.rstd1) + 2 * bytes_bf16(z.h1) + bytes_bf16(z.s);
  // ds, dg and du as codes, dh2, the output gradient's codes (down's: N x C)
  const size_t mlp = 3 * bytes_bf16(z.g) + bytes_f32(N * C) + bytes_bf16(N * C);
  // d_o, dq, dk, dv, dh1, one output gradient's codes at a time (o's N x C, q's N x Q, ...)
  const size_t attention = 2 * bytes_f32(z.q) + 2 * bytes_f32(z.k) + bytes_f32(N * C) +
                           bytes_bf16(N * std::max(C, c.q_dim()));
  const size_t backward = recompute + std::max(mlp, attention);
  return bytes_f32(N * C) +  // the residual gradient
         std::max({forward(policy), forward(Checkpointing::kFull), backward, head});
}
}  // namespace

size_t fp8_xt_scale_bytes(int64_t n, bool blocks) {
  return blocks ? size_t(n / 32) : sizeof(float);
}
size_t fp8_xt_bytes(int64_t n, bool blocks) {
  return Arena::round_up(Arena::round_up(size_t(n)) + fp8_xt_scale_bytes(n, blocks));
}

namespace {
// A feature switch: on unless the variable is exactly "0" (each caller reads it once).
bool switched_off(const char* var) {
  const char* e = std::getenv(var);
  return e && std::strcmp(e, "0") == 0;
}
}  // namespace

bool fp8_save_xt_enabled() {
  static const bool off = switched_off("MXTRAIN_FP8_SAVE_XT");
  return !off;
}
bool fp8_norm_amax_enabled() {
  static const bool off = switched_off("MXTRAIN_FP8_NORM_AMAX");
  return !off;
}
bool fp8_weight_amax_enabled() {
  static const bool off = switched_off("MXTRAIN_FP8_WEIGHT_AMAX");
  return !off;
}
bool fp8_fuse_swiglu_enabled() {
  static const bool off = switched_off("MXTRAIN_FP8_FUSE_SWIGLU");
  return !off;
}

namespace {
// The x^T codes a recipe's forward can keep (kNone: none, nvfp4 included).
XtCodes xt_codes_of(Recipe r) {
  switch (r) {
    case Recipe::kFp8Current:
    case Recipe::kFp8Delayed: return XtCodes::kPerTensor;
    case Recipe::kFp8Block: return XtCodes::kFp8Block;
    case Recipe::kMxfp8: return XtCodes::kMxfp8;
    default: return XtCodes::kNone;
  }
}
}  // namespace

XtCodes fp8_xt_only_applies(const ModelConfig& c, int64_t N, const std::string& recipe,
                            bool bf16_activations, Checkpointing policy) {
  const XtCodes x = xt_codes_of(parse_recipe(recipe));
  if (x == XtCodes::kNone || !bf16_activations || !BlockSizes::keeps(policy, true) ||
      !fp8_save_xt_enabled())
    return XtCodes::kNone;
  // (LlamaModel::native_fp8_multiple's)
  const int64_t m = x == XtCodes::kFp8Block ? 128 : x == XtCodes::kMxfp8 ? 32 : 16;
  for (int64_t d : {N, c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim()})
    if (d % m != 0) return XtCodes::kNone;
  return x;
}

bool xt_codes_native(XtCodes x, const Backend& backend) {
  switch (x) {
    case XtCodes::kPerTensor: return backend.fp8_tensor_cores();
    case XtCodes::kFp8Block: return backend.fp8_block_tensor_cores();
    case XtCodes::kMxfp8: return backend.mxfp8_tensor_cores();
    default: return false;
  }
}

ActivationBytes activation_bytes(const ModelConfig& c, int64_t B, int64_t T,
                                 Checkpointing policy, bool quantized, bool device,
                                 bool bf16_activations, bool bf16_path, XtCodes fp8_xt_only) {
  const int64_t N = B * T, C = c.hidden_size, L = c.num_hidden_layers;
  BlockSizes z(c, B, T);
  // act: a tensor that precision.activations = bf16 keeps as bf16 codes (statistics and x_mid,
  // the residual stream, stay fp32).
  auto act = [](int64_t n, bool bf16) { return bf16 ? bytes_bf16(n) : bytes_f32(n); };
  // (x^T's FP8 codes in place of the inputs' bf16 codes: LlamaModel::set_xt_only)
  auto input = [&](int64_t n, bool bf16) {
    return bf16 && fp8_xt_only != XtCodes::kNone ? fp8_xt_bytes(n, xt_blocks(fp8_xt_only))
                                                 : act(n, bf16);
  };
  auto cheap = [&](Checkpointing p, bool bf16) {
    return BlockSizes::keeps(p, true) ? input(z.h1, bf16) + bytes_f32(z.rstd1) +
                                            input(z.h2, bf16) + bytes_f32(z.rstd2) +
                                            input(z.s, bf16)
                                      : 0;
  };
  auto gemm = [&](Checkpointing p, bool bf16) {
    return BlockSizes::keeps(p, false)
               ? act(z.q, bf16) + act(z.k, bf16) + act(z.v, bf16) + act(z.o, bf16) +
                     bytes_f32(z.lse) + bytes_f32(z.x_mid) + act(z.g, bf16) + act(z.u, bf16)
               : 0;
  };
  // Every fp32 tensor of one block (with bf16 activations, the working copies in scratch).
  const size_t block_all =
      cheap(Checkpointing::kNone, false) + gemm(Checkpointing::kNone, false);
  ActivationBytes out;
  // saved: token ids, rope tables, the residual stream x_0..x_L, each block's kept tensors.
  out.saved = 2 * Arena::round_up(sizeof(int32_t) * N) + 2 * bytes_f32(T * c.head_dim / 2) +
              size_t(L + 1) * bytes_f32(N * C) +
              size_t(L) * (cheap(policy, bf16_activations) + gemm(policy, bf16_activations));
  // scratch (upper bound): the backward's residual gradient, plus the larger of a block's
  // forward temporaries and its backward (recomputed tensors + gradient temporaries), plus
  // the head's norm output, logits chunk and gradient. With bf16 activations the fp32 working
  // copies of the kept tensors (forward) and their widened copies (backward) are part of a
  // block's tensors, which both terms already count.
  const size_t forward_temps = block_all + 2 * bytes_f32(N * C);
  const size_t backward_grads =
      std::max(2 * bytes_f32(z.g) + bytes_f32(N * C),
               2 * bytes_f32(z.q) + 2 * bytes_f32(z.k) + bytes_f32(N * C));
  // a full recompute keeps the block's output and both projection temporaries in scratch too
  const size_t backward = block_all + 3 * bytes_f32(N * C) + backward_grads;
  // (with a recipe, room for the head's operand copies: the bf16 head of
  // precision.high_precision or either FP8 one of precision.fp8_head, whichever is larger)
  const int64_t head_rows = head_chunk_rows(c, N, device);
  const size_t head =
      2 * bytes_f32(N * C) + bytes_f32(N) +
      bytes_f32(quantized
                    ? std::max({head_workspace_floats(head_rows, C, c.vocab_size, HeadOperands::kBf16),
                                head_workspace_floats(head_rows, C, c.vocab_size, HeadOperands::kFp8),
                                head_workspace_floats(head_rows, C, c.vocab_size,
                                                      HeadOperands::kFp8Bf16Dgrad)})
                    : head_workspace_floats(head_rows, C, c.vocab_size, HeadOperands::kFp32));
  if (bf16_path && bf16_activations) {  // no fp32 working copies, no operand copies
    out.scratch = bf16_path_scratch(c, B, T, policy, head);
    return out;
  }
  out.scratch = bytes_f32(N * C) + std::max({forward_temps, backward, head});
  // The bf16 path (native bf16 GEMMs, LlamaModel::bf16_path) never makes fp32 gate, up and
  // SwiGLU product (forward, recompute or widened), nor most of the other fp32 copies the terms
  // above count, and instead holds codes in scratch: of what the policy does not keep (at most
  // all nine tensors, as in a full recompute or an evaluation) and one Linear's output
  // gradient (read by its two GEMMs). So it fits in these terms plus whatever the codes exceed
  // the three fp32 MLP tensors by: nothing at Llama shapes (intermediate about 3x hidden),
  // something at small test shapes.
  if (bf16_activations) {
    const size_t codes = bytes_bf16(z.h1) + bytes_bf16(z.q) + 2 * bytes_bf16(z.k) +
                         bytes_bf16(z.o) + bytes_bf16(z.h2) + 3 * bytes_bf16(z.g) +
                         bytes_bf16(N * std::max(C, c.q_dim()));
    const size_t fp32_mlp = 3 * bytes_f32(z.g);
    if (codes > fp32_mlp) out.scratch += codes - fp32_mlp;
  }
  if (quantized) {  // a Linear's quantized operand copies (NVFP4 wgrad: two transposes more)
    const int64_t widest = std::max({c.hidden_size, c.intermediate_size, c.q_dim()});
    const int64_t operand = std::max(N * widest, widest * widest);
    out.scratch += 4 * bytes_f32(operand);
  }
  return out;
}

LlamaModel::LlamaModel(const ModelConfig& config, const ParamLayout& layout, Backend& backend,
                       Checkpointing policy, Arena& saved, Arena& scratch)
    : c_(config), layout_(layout), be_(backend), policy_(policy), saved_(saved),
      scratch_(scratch) {}

LlamaModel::~LlamaModel() {
  for (Slots* s : {&amax_mem_, &norm_amax_mem_, &weight_amax_mem_})
    if (s->owned && be_.memory()) be_.memory()->deallocate(s->p);
}

float* LlamaModel::slots(Slots& s, size_t n, const char* arena) {
  if (s.p) return s.p;
  if (MemoryResource* mem = be_.memory()) {
    s.p = static_cast<float*>(mem->allocate(sizeof(float) * n, arena));
    s.owned = true;
  } else {
    s.host.assign(n, 0.0f);
    s.p = s.host.data();
  }
  return s.p;
}

float* LlamaModel::norm_amax(const uint16_t* codes, bool reads_codes) {
  norm_amax_x_ = nullptr;
  // current scaling's and nvfp4's forward rows' amax pass (the global scale's); the block
  // recipes scale each block from its own elements, fp8-delayed takes its history's scale
  if (!fp8_norm_amax_enabled() || !reads_codes || !recipe_ || !recipe_->active(layer_) ||
      (recipe_->recipe() != Recipe::kFp8Current && recipe_->recipe() != Recipe::kNvfp4))
    return nullptr;
  // [0] h1's or h2's, [1] the residual gradient's (resid_amax)
  norm_amax_x_ = codes;
  ++norm_amax_uses_;
  return slots(norm_amax_mem_, 2, "fp8 norm amax");
}

void LlamaModel::weight_amax(int linear, Backend::Fp8Operand& wq) {
  // fp8-current's W (per-tensor, current scaling, no slot of its own) and nvfp4's (16x16
  // blocks, whose global scale is W's amax): the first quantization of it since the weights
  // changed takes its amax into the Linear's slot, the later ones (the recompute's, the data
  // gradient's W^T, the next micro-batches') take it from there. W does not change within a
  // micro-batch, nor, where the UnitAccess tracks it (weights_key_), until an optimizer step
  // or a load.
  const bool current = wq.per_tensor() && wq.current;
  if ((!current && !wq.nvfp4_2d()) || wq.amax || wq.x_amax || !fp8_weight_amax_enabled()) return;
  const size_t n = size_t(c_.num_hidden_layers) * 7;
  float* amax = slots(weight_amax_mem_, n, "fp8 weight amax");
  weight_amax_of_.resize(n, 0);  // (the weights' key when each was written; 0: none)
  const size_t slot = size_t(layer_) * 7 + size_t(linear);
  if (weight_amax_of_[slot] == weights_key_) {
    wq.x_amax = amax + slot;
    ++weight_amax_uses_;
  } else {
    wq.amax = amax + slot;
    weight_amax_of_[slot] = weights_key_;
  }
}

float* LlamaModel::resid_amax() const {
  // current scaling's dy of o and down: the forward's norm_amax made the slot where this
  // block's Linears read codes on tensor cores (the backward's Linears use it where dy is
  // the residual gradient the slot was written for: linear_bwd)
  if (!norm_amax_mem_.p || !fp8_norm_amax_enabled() || !recipe_ ||
      recipe_->recipe() != Recipe::kFp8Current)
    return nullptr;
  return norm_amax_mem_.p + 1;
}

void LlamaModel::split_tokens(const int32_t* tokens, int64_t B, int64_t T, int32_t* inputs,
                              int32_t* targets) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      inputs[b * T + t] = tokens[b * (T + 1) + t];
      targets[b * T + t] = tokens[b * (T + 1) + t + 1];
    }
}

void LlamaModel::make_rope_tables(int64_t T, float* cos, float* sin) {
  // Hugging Face: inv_freq[i] = theta^(-2i/D), angle = position * inv_freq[i].
  const int64_t half = c_.head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    double inv_freq = std::pow(c_.rope_theta, -double(2 * i) / double(c_.head_dim));
    for (int64_t t = 0; t < T; ++t) {
      double angle = double(t) * inv_freq;
      cos[t * half + i] = float(std::cos(angle));
      sin[t * half + i] = float(std::sin(angle));
    }
  }
}

void LlamaModel::round_activation(float* t, uint16_t* codes, int64_t n) {
  if (bf16_acts_) be_.pack_bf16(t, codes, n);
}

bool LlamaModel::bf16_path() { return bf16_acts_ && be_.has_bf16_gemms(); }

bool LlamaModel::native16() {
  if (!lowered(layer_) || !native_bf16(true)) return false;
  native_bf16(false);
  return true;
}

BlockParams LlamaModel::block_weights(UnitAccess& access, int64_t layer, bool backward) {
  const int u = layout_.block_unit(layer);
  w16_.fill(nullptr);
  layer_ = layer;
  if (const float* base = access.acquire(u, backward))
    return layout_.block_in_unit(const_cast<float*>(base), layer);  // accessors take float*
  const UnitAccess::BlockCodes bc = access.block_codes(u);
  MX_ASSERT(bc.codes && bc.input_norm && bc.post_norm, "unit ", u, " acquired as nothing");
  MX_ASSERT(bf16_path() && native16(),
            "block ", layer, " gathered as bf16 codes off the native bf16 GEMMs");
  const std::array<int64_t, 9> o = layout_.block_offsets_in_unit(layer);
  const int matrix[7] = {1, 2, 3, 4, 6, 7, 8};  // BlockParams order: q k v o, gate up down
  for (size_t i = 0; i < 7; ++i) w16_[i] = bc.codes + o[size_t(matrix[i])];
  BlockParams w{};  // matrices null: only their codes are here
  w.input_norm = const_cast<float*>(bc.input_norm);
  w.post_norm = const_cast<float*>(bc.post_norm);
  return w;
}

float* LlamaModel::widened(const uint16_t* codes, int64_t n) {
  float* x = scratch_.alloc_f32(n);
  be_.unpack_bf16(x, codes, n);
  return x;
}

void LlamaModel::linear_fwd16(int linear, float* y, uint16_t* y16, const uint16_t* x16,
                              const float* w, int64_t N, int64_t in, int64_t out, bool native,
                              const float* x_wide, const float* residual, SavedXt save,
                              SwigluInput swiglu) {
  MX_ASSERT(!residual || (y && !y16), "a residual goes with an fp32 output alone");
  MX_ASSERT(!save.codes || (!native && !x_wide), "x^T's codes kept off the FP8 Linears");
  MX_ASSERT(!swiglu.g || (save.codes && !x16), "SwiGLU's operands without x^T's codes kept");
  const uint16_t* w16 = w16_[size_t(linear)];
  if (native && residual) {
    be_.set_bf16_gemm_operands(true);
    be_.gemm_bf16_residual(false, true, N, out, in, 1.0f, nullptr, x16, w16 ? nullptr : w, w16,
                           residual, y);
    be_.set_bf16_gemm_operands(false);
    return;
  }
  if (native)
    return gemm16(false, true, N, out, in, nullptr, x16, w16 ? nullptr : w, w16, 0.0f, y, y16);
  MX_ASSERT(!w16, "a block gathered as bf16 codes off the native bf16 GEMMs");
  const size_t m = scratch_.mark();  // the recipe's (or fp32) Linear on the codes or widened
  const bool codes = !x_wide && fp8_reads_codes(N, in, out);
  const float* x = x_wide || swiglu.g ? x_wide : codes ? nullptr : widened(x16, N * in);
  float* result = y ? y : scratch_.alloc_f32(N * out);  // with y16 alone: the Linear's scratch
  linear_fwd(linear, result, x, w, N, in, out, codes ? x16 : nullptr, y ? nullptr : y16,
             residual, save, swiglu);
  if (y && y16) be_.to_bf16(y16, y, N * out);
  scratch_.release(m);
}

void LlamaModel::gemm16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const float* A, const uint16_t* A16, const float* B, const uint16_t* B16,
                        float beta, float* C, uint16_t* C16) {
  be_.set_bf16_gemm_operands(true);
  be_.gemm_bf16(trans_a, trans_b, M, N, K, 1.0f, A, A16, B, B16, beta, C, C16);
  be_.set_bf16_gemm_operands(false);
}

void LlamaModel::linear_bwd16(int linear, float* dx, float* dw, const float* dy,
                              const uint16_t* dy16, const uint16_t* x16, const float* w, int64_t N,
                              int64_t in, int64_t out, bool accumulate_dx, bool native,
                              const float* x_wide, uint16_t* dx16, SavedXt xt) {
  MX_ASSERT(!xt.codes || (!native && !x_wide && !x16), "x^T's codes kept off the FP8 Linears");
  const size_t m = scratch_.mark();
  const uint16_t* w16 = w16_[size_t(linear)];
  MX_ASSERT(!dx16 || (!dx && !accumulate_dx), "dx as codes: written, not added");
  if (!native) {  // the recipe's (or fp32) Linear: x as codes or widened from them
    MX_ASSERT((dy != nullptr) != (dy16 != nullptr), "one form of dy off the native GEMMs");
    MX_ASSERT(!w16, "a block gathered as bf16 codes off the native bf16 GEMMs");
    // The FP8 Linears read x and dy as codes and write dx as codes themselves; the others
    // (emulated recipes, nvfp4, fp32) take fp32 operands widened here, and dx is rounded after.
    const bool codes = fp8_reads_codes(N, in, out);
    const float* x = x_wide || xt.codes ? x_wide : codes ? nullptr : widened(x16, N * in);
    if (dy16 && !codes) dy = widened(dy16, N * out);
    float* dxf = dx16 ? scratch_.alloc_f32(N * in) : dx;
    linear_bwd(linear, dxf, dw, dy, x, w, N, in, out, accumulate_dx,
               codes && !x_wide ? x16 : nullptr, codes ? dy16 : nullptr,
               codes ? dx16 : nullptr, xt);
    if (dx16 && !codes) be_.to_bf16(dx16, dxf, N * in);
    return scratch_.release(m);
  }
  if (!dy16) {  // rounded once for both GEMMs
    uint16_t* codes = alloc_bf16(scratch_, N * out);
    be_.to_bf16(codes, dy, N * out);
    dy16 = codes;
  }
  gemm16(false, false, N, in, out, nullptr, dy16, w16 ? nullptr : w, w16,
         accumulate_dx ? 1.0f : 0.0f, dx, dx16);
  gemm16(true, false, out, in, N, nullptr, dy16, nullptr, x16, 1.0f, dw, nullptr);
  scratch_.release(m);
}

bool LlamaModel::fusable(const BlockParams& w, const BlockParams& dw, int first,
                         int count) const {
  // Linears first .. first + count - 1 (BlockParams order) as one matrix: each one's weight
  // (or its bf16 codes, where the GEMMs read those; the fp32 pointers are then null) and its
  // gradient start where the previous one's end (ParamLayout keeps q, k, v and gate, up so).
  const int64_t C = c_.hidden_size, I = c_.intermediate_size, q = c_.q_dim(), kv = c_.kv_dim();
  const float* ws[7] = {w.wq, w.wk, w.wv, w.wo, w.w_gate, w.w_up, w.w_down};
  const float* ds[7] = {dw.wq, dw.wk, dw.wv, dw.wo, dw.w_gate, dw.w_up, dw.w_down};
  const int64_t size[7] = {q * C, kv * C, kv * C, C * q, I * C, I * C, C * I};
  for (int i = first + 1; i < first + count; ++i) {
    const int64_t prev = size[i - 1];
    const bool weights = w16_[size_t(first)]
                             ? w16_[size_t(i)] == w16_[size_t(i - 1)] + prev
                             : ws[i - 1] && ws[i] == ws[i - 1] + prev;
    if (!weights || !ds[i - 1] || ds[i] != ds[i - 1] + prev) return false;
  }
  return true;
}

uint16_t* LlamaModel::alloc_bf16(Arena& arena, int64_t n) {
  return static_cast<uint16_t*>(arena.alloc(sizeof(uint16_t) * size_t(n)));
}

void LlamaModel::block_forward(const BlockParams& w, const float* x, float* y, BlockActs& a,
                               Checkpointing policy, int64_t B, int64_t T) {
  const int64_t N = B * T, C = c_.hidden_size, I = c_.intermediate_size;
  const int64_t H = c_.num_attention_heads, KV = c_.num_key_value_heads, D = c_.head_dim;
  const float eps = float(c_.rms_norm_eps);
  BlockSizes z(c_, B, T);
  const bool bp = a.bf16_path = bf16_path();
  const bool nat = a.native16 = bp && native16();
  // A tensor the policy keeps goes to `saved`; with bf16 activations (codes given) its bf16
  // copy goes there and the fp32 working copy to scratch.
  auto keep = [&](bool cheap, int64_t n, uint16_t** codes) {
    if (!BlockSizes::keeps(policy, cheap)) return scratch_.alloc_f32(n);
    if (!bf16_acts_ || !codes) return saved_.alloc_f32(n);
    *codes = alloc_bf16(saved_, n);
    return scratch_.alloc_f32(n);
  };
  // bf16 path: a tensor that exists only as codes, in `saved` if kept, else in scratch.
  auto codes_only = [&](bool cheap, int64_t n) {
    return alloc_bf16(BlockSizes::keeps(policy, cheap) ? saved_ : scratch_, n);
  };
  a.h1_16 = a.q_16 = a.k_16 = a.v_16 = a.o_16 = a.h2_16 = a.g_16 = a.u_16 = a.s_16 = nullptr;
  a.h1_xt = a.h2_xt = a.s_xt = {};
  // h1, h2 or SwiGLU's product on the bf16 path: its bf16 codes, kept (in `saved`) where the
  // policy keeps it, or x^T's FP8 codes kept in their place (saves_xt: save), the bf16 codes
  // then in scratch for the forward alone (transient: forgotten after their last use). With
  // the arena sized for x^T's codes alone (xt_only_) the bf16 codes are never kept: without
  // x^T's codes the backward recomputes them. Otherwise x^T's codes take the room the bf16
  // codes had (2 bytes an element: the codes' 1 and the scale, or the block recipes' scales,
  // 1/32 of a byte an element, fit).
  auto kept_input = [&](SavedXt& xt, int64_t n, bool save, bool& transient) {
    transient = false;
    if (!BlockSizes::keeps(policy, true)) return alloc_bf16(scratch_, n);
    void* room = nullptr;  // x^T's codes, then their scales
    if (xt_only_) {
      if (save) room = saved_.alloc(fp8_xt_bytes(n, xt_blocks()));
    } else {
      uint16_t* codes = alloc_bf16(saved_, n);
      if (!save) return codes;
      MX_ASSERT(bytes_bf16(n) >= Arena::round_up(size_t(n)) + fp8_xt_scale_bytes(n, xt_blocks()),
                "x^T's room");
      room = codes;
    }
    if (room) {
      xt.codes = static_cast<uint8_t*>(room);
      xt.scale_inv = reinterpret_cast<float*>(xt.codes + Arena::round_up(size_t(n)));
    }
    transient = true;
    return alloc_bf16(scratch_, n);
  };
  bool h1_transient = false, h2_transient = false, s_transient = false;
  // attention half: x_mid = x + o_proj(attention(rope(q), rope(k), v))
  if (bp) {  // every tensor between the ops as codes only; q and k fp32 until RoPE
    a.h1 = a.q = a.k = a.v = a.o = nullptr;
    a.h1_16 = kept_input(a.h1_xt, z.h1, saves_xt(0, 3, qkv_read_codes(N), policy), h1_transient);
    a.rstd1 = keep(true, z.rstd1, nullptr);
    be_.rmsnorm_forward_bf16(a.h1_16, a.rstd1, x, w.input_norm, N, C, eps,
                             norm_amax(a.h1_16, qkv_read_codes(N)));
    float* q = scratch_.alloc_f32(z.q);
    float* k = scratch_.alloc_f32(z.k);
    a.q_16 = codes_only(false, z.q);
    a.k_16 = codes_only(false, z.k);
    a.v_16 = codes_only(false, z.v);
    {  // (Linears off the bf16 GEMMs widen h1 once for all three)
      const size_t m = scratch_.mark();
      const float* h1 = nat || qkv_read_codes(N) ? nullptr : widened(a.h1_16, z.h1);
      const void* shared_x = h1 ? static_cast<const void*>(h1) : a.h1_16;
      const auto shared = shared_input(shared_x, N, false);
      linear_fwd16(0, q, nullptr, a.h1_16, w.wq, N, C, c_.q_dim(), nat, h1, nullptr, a.h1_xt);
      linear_fwd16(1, k, nullptr, a.h1_16, w.wk, N, C, c_.kv_dim(), nat, h1);
      linear_fwd16(2, nullptr, a.v_16, a.h1_16, w.wv, N, C, c_.kv_dim(), nat, h1);
      scratch_.release(m);
      norm_amax_x_ = nullptr;  // (h1's scratch may hold another tensor next)
    }
    if (h1_transient) a.h1_16 = nullptr;  // (scratch, released after the forward)
    be_.rope_forward_bf16(a.q_16, q, rope_cos_, rope_sin_, B, T, H, D);
    be_.rope_forward_bf16(a.k_16, k, rope_cos_, rope_sin_, B, T, KV, D);
    a.o_16 = codes_only(false, z.o);
    a.lse = keep(false, z.lse, nullptr);
    if (fp8_attention())
      be_.attention_forward_fp8_bf16(a.o_16, a.lse, a.q_16, a.k_16, a.v_16, B, T, H, KV, D);
    else be_.attention_forward_bf16(a.o_16, a.lse, a.q_16, a.k_16, a.v_16, B, T, H, KV, D);
    record_attention_amax(false, T);
  } else {
    a.h1 = keep(true, z.h1, &a.h1_16);
    a.rstd1 = keep(true, z.rstd1, nullptr);
    be_.rmsnorm_forward(a.h1, a.rstd1, x, w.input_norm, N, C, eps);
    round_activation(a.h1, a.h1_16, z.h1);
    a.q = keep(false, z.q, &a.q_16);
    a.k = keep(false, z.k, &a.k_16);
    a.v = keep(false, z.v, &a.v_16);
    {
      const auto shared = shared_input(a.h1, N, false);
      linear_fwd(0, a.q, a.h1, w.wq, N, C, c_.q_dim());
      linear_fwd(1, a.k, a.h1, w.wk, N, C, c_.kv_dim());
      linear_fwd(2, a.v, a.h1, w.wv, N, C, c_.kv_dim());
    }
    be_.rope_forward(a.q, rope_cos_, rope_sin_, B, T, H, D);
    be_.rope_forward(a.k, rope_cos_, rope_sin_, B, T, KV, D);
    round_activation(a.q, a.q_16, z.q);
    round_activation(a.k, a.k_16, z.k);
    round_activation(a.v, a.v_16, z.v);
    a.o = keep(false, z.o, &a.o_16);
    a.lse = keep(false, z.lse, nullptr);
    if (fp8_attention()) be_.attention_forward_fp8(a.o, a.lse, a.q, a.k, a.v, B, T, H, KV, D);
    else be_.attention_forward(a.o, a.lse, a.q, a.k, a.v, B, T, H, KV, D);
    record_attention_amax(false, T);
    round_activation(a.o, a.o_16, z.o);
  }
  a.x_mid = keep(false, z.x_mid, nullptr);
  if (bp) {  // x_mid = x + o Wo^T (on the bf16 GEMMs the epilogue adds x)
    linear_fwd16(3, a.x_mid, nullptr, a.o_16, w.wo, N, c_.q_dim(), C, nat, nullptr, x);
  } else {
    float* proj = scratch_.alloc_f32(N * C);
    linear_fwd(3, proj, a.o, w.wo, N, c_.q_dim(), C);
    be_.add(a.x_mid, x, proj, N * C);
  }
  // MLP half: y = x_mid + down(silu(gate(h2)) * up(h2))
  if (bp) {  // the norm output, gate, up and their product as codes only
    a.h2 = a.g = a.u = a.s = nullptr;
    a.h2_16 = kept_input(a.h2_xt, z.h2, saves_xt(4, 2, mlp_read_codes(N), policy), h2_transient);
    a.rstd2 = keep(true, z.rstd2, nullptr);
    be_.rmsnorm_forward_bf16(a.h2_16, a.rstd2, a.x_mid, w.post_norm, N, C, eps,
                             norm_amax(a.h2_16, mlp_read_codes(N)));
    a.g_16 = codes_only(false, z.g);
    a.u_16 = codes_only(false, z.u);
    {
      const size_t m = scratch_.mark();
      const float* h2 = nat || mlp_read_codes(N) ? nullptr : widened(a.h2_16, z.h2);
      const void* shared_x = h2 ? static_cast<const void*>(h2) : a.h2_16;
      const auto shared = shared_input(shared_x, N, true);
      linear_fwd16(4, nullptr, a.g_16, a.h2_16, w.w_gate, N, C, I, nat, h2, nullptr, a.h2_xt);
      linear_fwd16(5, nullptr, a.u_16, a.h2_16, w.w_up, N, C, I, nat, h2);
      scratch_.release(m);
      norm_amax_x_ = nullptr;
    }
    if (h2_transient) a.h2_16 = nullptr;
    const size_t before_s = scratch_.mark();
    a.s_16 = kept_input(a.s_xt, z.s, saves_xt(6, 1, fp8_reads_codes(N, I, C), policy),
                        s_transient);
    // s's codes only for down's forward, which keeps x^T's codes: its cast makes s from g and
    // u itself (SwigluInput), so they are neither written nor read back
    SwigluInput swiglu{};
    if (s_transient && a.s_xt.codes && fp8_fuse_swiglu_enabled()) {
      scratch_.release(before_s);  // (s's codes were the last in scratch)
      a.s_16 = nullptr;
      swiglu = {a.g_16, a.u_16};
      ++fused_swiglu_uses_;
    } else {
      be_.swiglu_forward_bf16(a.s_16, a.g_16, a.u_16, N * I);
    }
    // y = x_mid + s W_down^T (on the bf16 GEMMs the epilogue adds x_mid)
    linear_fwd16(6, y, nullptr, a.s_16, w.w_down, N, I, C, nat, nullptr, a.x_mid, a.s_xt,
                 swiglu);
    if (s_transient) a.s_16 = nullptr;
  } else {
    a.h2 = keep(true, z.h2, &a.h2_16);
    a.rstd2 = keep(true, z.rstd2, nullptr);
    be_.rmsnorm_forward(a.h2, a.rstd2, a.x_mid, w.post_norm, N, C, eps);
    round_activation(a.h2, a.h2_16, z.h2);
    a.g = keep(false, z.g, &a.g_16);
    a.u = keep(false, z.u, &a.u_16);
    {
      const auto shared = shared_input(a.h2, N, true);
      linear_fwd(4, a.g, a.h2, w.w_gate, N, C, I);
      linear_fwd(5, a.u, a.h2, w.w_up, N, C, I);
    }
    round_activation(a.g, a.g_16, z.g);
    round_activation(a.u, a.u_16, z.u);
    a.s = keep(true, z.s, &a.s_16);
    be_.swiglu_forward(a.s, a.g, a.u, N * I);
    round_activation(a.s, a.s_16, z.s);
    float* down = scratch_.alloc_f32(N * C);
    linear_fwd(6, down, a.s, w.w_down, N, I, C);
    be_.add(y, a.x_mid, down, N * C);
  }
}

void LlamaModel::block_backward(const BlockParams& w, const BlockParams& dw, const float* x,
                                BlockActs& a, float* dresid, int64_t B, int64_t T) {
  const int64_t N = B * T, C = c_.hidden_size, I = c_.intermediate_size;
  const int64_t H = c_.num_attention_heads, KV = c_.num_key_value_heads, D = c_.head_dim;
  const float eps = float(c_.rms_norm_eps);
  const bool bp = a.bf16_path;
  // bf16 activations: widen the kept bf16 copies into scratch (the values forward used). The
  // bf16 path's ops read the codes themselves (the FP8 Linears too, as in block_forward).
  BlockSizes z(c_, B, T);
  auto widen = [&](float*& t, const uint16_t* codes, int64_t n) {
    if (codes && !bp) t = widened(codes, n);
  };
  widen(a.h1, a.h1_16, z.h1);
  widen(a.q, a.q_16, z.q);
  widen(a.k, a.k_16, z.k);
  widen(a.v, a.v_16, z.v);
  widen(a.o, a.o_16, z.o);
  widen(a.h2, a.h2_16, z.h2);
  widen(a.g, a.g_16, z.g);
  widen(a.u, a.u_16, z.u);
  widen(a.s, a.s_16, z.s);
  // Recompute what the policy did not keep. The same ops on the same inputs give the same
  // bits (rounded to bf16 where forward rounded), so every policy produces identical gradients.
  if (bp ? !a.q_16 : !a.q) {
    float* y = scratch_.alloc_f32(N * C);
    // fp8-delayed: the forward's scales again, no amax recorded (LinearRecipe::set_replay)
    const LinearRecipe::ReplayScope replay(recipe_);
    block_forward(w, x, y, a, Checkpointing::kFull, B, T);
  } else if (bp) {
    // selective: the norms' codes and the product's; policy none with the arena sized for
    // x^T's FP8 codes alone (xt_only_): those of them a block kept no x^T's codes of
    if (!a.h1_16 && !a.h1_xt.codes) {
      a.rstd1 = scratch_.alloc_f32(N);
      a.h1_16 = alloc_bf16(scratch_, N * C);
      be_.rmsnorm_forward_bf16(a.h1_16, a.rstd1, x, w.input_norm, N, C, eps, nullptr);
    }
    if (!a.h2_16 && !a.h2_xt.codes) {
      a.rstd2 = scratch_.alloc_f32(N);
      a.h2_16 = alloc_bf16(scratch_, N * C);
      be_.rmsnorm_forward_bf16(a.h2_16, a.rstd2, a.x_mid, w.post_norm, N, C, eps, nullptr);
    }
    if (!a.s_16 && !a.s_xt.codes) {
      a.s_16 = alloc_bf16(scratch_, N * I);
      be_.swiglu_forward_bf16(a.s_16, a.g_16, a.u_16, N * I);
    }
  } else if (!a.h1) {
    a.h1 = scratch_.alloc_f32(N * C);
    a.rstd1 = scratch_.alloc_f32(N);
    be_.rmsnorm_forward(a.h1, a.rstd1, x, w.input_norm, N, C, eps);
    round_activation(a.h1, nullptr, N * C);
    a.h2 = scratch_.alloc_f32(N * C);
    a.rstd2 = scratch_.alloc_f32(N);
    be_.rmsnorm_forward(a.h2, a.rstd2, a.x_mid, w.post_norm, N, C, eps);
    round_activation(a.h2, nullptr, N * C);
    a.s = scratch_.alloc_f32(N * I);
    be_.swiglu_forward(a.s, a.g, a.u, N * I);
    round_activation(a.s, nullptr, N * I);
  }
  // MLP half. dresid = dL/dy = dL/d(down output).
  const bool nat = a.native16;
  // The bf16 path's residual gradient as codes (set_residual_codes): made here when the last
  // update did not make them, then kept current by the norms' backward.
  auto dresid_codes = [&]() -> const uint16_t* {
    if (!dresid16_) return nullptr;
    if (!dresid16_valid_) be_.to_bf16(dresid16_, dresid, N * C);
    dresid16_valid_ = true;
    return dresid16_;
  };
  auto norm_backward = [&](float* dw_norm, const float* dh, const float* xin, const float* wn,
                           const float* rstd) {
    // (fp8-current on tensor cores: with the updated residual gradient's amax for the next
    // output projection's FP8 dy, resid_amax_of_)
    float* amax = resid_amax();
    if (dresid16_ || amax)
      be_.rmsnorm_backward_bf16(dresid, dresid16_, dw_norm, dh, xin, wn, rstd, N, C, amax);
    else be_.rmsnorm_backward(dresid, dw_norm, dh, xin, wn, rstd, N, C);
    dresid16_valid_ = dresid16_ != nullptr;
    resid_amax_of_ = amax ? dresid : nullptr;
  };
  // With bf16 activations, the gradients between a lowered block's ops are bf16 (as autocast's
  // bf16 GEMMs and Transformer Engine's FP8 Linears return them): ds, dg, du, d_o, dq, dk, dv.
  const bool grads16 = bf16_acts_ && lowered(layer_);
  if (bp && grads16) {
    // ds out of down's data-gradient GEMM as codes (its epilogue rounds the fp32 product), the
    // gradients of gate and up straight to codes: SwiGLU's backward reads and writes 2 bytes an
    // element each way, and gate's and up's Linears read them as codes (the bf16 GEMMs, the FP8
    // quantizers) or widened (the emulated recipes). The rounding path rounds at these places.
    size_t m = scratch_.mark();
    uint16_t* ds16 = alloc_bf16(scratch_, N * I);
    uint16_t* dgu16 = alloc_bf16(scratch_, 2 * N * I);  // dg then du, or fused row by row
    float* dh2 = scratch_.alloc_f32(N * C);
    // (the FP8 Linears quantize dresid itself: its codes would round it once more)
    linear_bwd16(6, nullptr, dw.w_down, dresid, nat ? dresid_codes() : nullptr, a.s_16, w.w_down,
                 N, I, C, false, nat, nullptr, ds16, a.s_xt);
    if (nat && be_.fuse_linear_backward() && fusable(w, dw, 4, 2)) {
      // one GEMM pair over [w_gate; w_up] ([2I, C]): dh2 written once, h2 read once for both
      // weight gradients (Backend::fuse_linear_backward)
      be_.swiglu_backward_bf16_fused(dgu16, ds16, a.g_16, a.u_16, N, I);
      linear_bwd16(4, dh2, dw.w_gate, nullptr, dgu16, a.h2_16, w.w_gate, N, C, 2 * I, false,
                   true);
    } else {
      uint16_t* dg16 = dgu16;
      uint16_t* du16 = dgu16 + N * I;
      const float* h2 = nat || mlp_read_codes(N) ? nullptr : widened(a.h2_16, z.h2);  // once
      const void* shared_x = h2 ? static_cast<const void*>(h2) : a.h2_16;
      const auto shared = shared_input(shared_x, N, true);
      if (!nat && fused_swiglu_backward(N)) {
        // gate's and up's FP8 operands of dg and du straight from ds, g and u
        // (Backend::fp8_swiglu_backward: their bf16 codes are not written and read back)
        MX_ASSERT(!w16_[4] && !w16_[5],
                  "a block gathered as bf16 codes off the native bf16 GEMMs");
        const size_t mw = scratch_.mark();
        float* work = scratch_.alloc_f32(std::max(N * I + I * C, N * I + N * C));
        Backend::Fp8Operand dyq[2][2], wq[2], xq[2];
        for (int k = 0; k < 2; ++k)
          fp8_backward_operands(4 + k, N, true, true, nullptr, a.h2_xt.codes ? nullptr : a.h2_16,
                                a.h2_xt, dyq[k][0], wq[k], dyq[k][1], xq[k]);
        float* const dws[2] = {dw.w_gate, dw.w_up};
        const float* const ws[2] = {w.w_gate, w.w_up};
        be_.fp8_swiglu_backward(dh2, dws, ds16, a.g_16, a.u_16, ws, wq, dyq, xq, N, C, I, dgu16,
                                work);
        ++fused_swiglu_grads_;
        scratch_.release(mw);
      } else {
        be_.swiglu_backward_bf16(dg16, du16, ds16, a.g_16, a.u_16, N * I);
        linear_bwd16(4, dh2, dw.w_gate, nullptr, dg16, a.h2_16, w.w_gate, N, C, I, false, nat,
                     h2, nullptr, a.h2_xt);
        linear_bwd16(5, dh2, dw.w_up, nullptr, du16, a.h2_16, w.w_up, N, C, I, true, nat, h2,
                     nullptr, a.h2_xt);
      }
    }
    norm_backward(dw.post_norm, dh2, a.x_mid, w.post_norm, a.rstd2);
    scratch_.release(m);
  } else if (bp) {  // a block left in fp32 (precision.high_precision = fp32): fp32 gradients
    size_t m = scratch_.mark();
    float* dg = scratch_.alloc_f32(N * I);  // first holds dL/ds, then dL/dg (same element)
    float* du = scratch_.alloc_f32(N * I);
    float* dh2 = scratch_.alloc_f32(N * C);
    linear_bwd16(6, dg, dw.w_down, dresid, nullptr, a.s_16, w.w_down, N, I, C, false, false);
    // (from the codes: no widened copies of g and u; the H200 spent 21 ms a step of
    // fp8-delayed on the two unpacks and the fp32 kernel's wider reads)
    be_.swiglu_backward_codes(dg, du, dg, a.g_16, a.u_16, N * I);
    const float* h2 = mlp_read_codes(N) ? nullptr : widened(a.h2_16, z.h2);  // once for both
    const void* shared_x = h2 ? static_cast<const void*>(h2) : a.h2_16;
    const auto shared = shared_input(shared_x, N, true);
    linear_bwd16(4, dh2, dw.w_gate, dg, nullptr, a.h2_16, w.w_gate, N, C, I, false, false, h2);
    linear_bwd16(5, dh2, dw.w_up, du, nullptr, a.h2_16, w.w_up, N, C, I, true, false, h2);
    norm_backward(dw.post_norm, dh2, a.x_mid, w.post_norm, a.rstd2);
    scratch_.release(m);
  } else {
    size_t m = scratch_.mark();
    float* dg = scratch_.alloc_f32(N * I);  // first holds dL/ds, then dL/dg (same element)
    float* du = scratch_.alloc_f32(N * I);
    float* dh2 = scratch_.alloc_f32(N * C);
    linear_bwd(6, dg, dw.w_down, dresid, a.s, w.w_down, N, I, C, false);
    // where the bf16 path has ds, dg and du as codes (bf16 activations, a lowered block), the
    // same roundings here: the same gradients bit for bit
    if (grads16) be_.round_bf16(dg, dg, N * I);
    be_.swiglu_backward(dg, du, dg, a.g, a.u, N * I);
    if (grads16) {
      be_.round_bf16(dg, dg, N * I);
      be_.round_bf16(du, du, N * I);
    }
    {
      const auto shared = shared_input(a.h2, N, true);
      linear_bwd(4, dh2, dw.w_gate, dg, a.h2, w.w_gate, N, C, I, false);
      linear_bwd(5, dh2, dw.w_up, du, a.h2, w.w_up, N, C, I, true);
    }
    // dresid becomes dL/dx_mid: the residual path plus the norm's input gradient.
    norm_backward(dw.post_norm, dh2, a.x_mid, w.post_norm, a.rstd2);
    scratch_.release(m);
  }
  // Attention half.
  if (bp && grads16) {
    // The attention's gradients stay codes: d_o out of its GEMM (the epilogue rounds the fp32
    // product, as attention would round it), dq, dk, dv out of attention (cuDNN writes bf16),
    // RoPE's backward on them in place, and the Linears read them as they are (the bf16 GEMMs'
    // operands, the FP8 quantizers' input) or widened. The rounding path rounds at the same
    // places.
    size_t m = scratch_.mark();
    float* dh1 = scratch_.alloc_f32(N * C);
    uint16_t* d_o16 = alloc_bf16(scratch_, N * c_.q_dim());
    uint16_t* dq16 = alloc_bf16(scratch_, N * c_.q_dim());
    uint16_t* dk16 = alloc_bf16(scratch_, N * c_.kv_dim());
    uint16_t* dv16 = alloc_bf16(scratch_, N * c_.kv_dim());
    linear_bwd16(3, nullptr, dw.wo, dresid, nat ? dresid_codes() : nullptr, a.o_16, w.wo, N,
                 c_.q_dim(), C, false, nat, nullptr, d_o16);
    if (fp8_attention())
      be_.attention_backward_fp8_codes(dq16, dk16, dv16, d_o16, a.q_16, a.k_16, a.v_16, a.o_16,
                                       a.lse, B, T, H, KV, D);
    else be_.attention_backward_codes(dq16, dk16, dv16, d_o16, a.q_16, a.k_16, a.v_16, a.o_16,
                                      a.lse, B, T, H, KV, D);
    record_attention_amax(true, T);
    if (nat && be_.fuse_linear_backward() && fusable(w, dw, 0, 3)) {
      // dq and dk rotated back straight into a [N, q + 2 kv] operand and dv copied beside
      // them: one GEMM pair over [wq; wk; wv] writes dh1 once (two fp32 read-and-writes of
      // it fewer) and reads h1 once for the three weight gradients
      const int64_t Q = c_.q_dim(), K = c_.kv_dim(), ld = Q + 2 * K;
      uint16_t* dqkv16 = alloc_bf16(scratch_, N * ld);
      be_.rope_backward_bf16_into(dqkv16, ld, dq16, rope_cos_, rope_sin_, B, T, H, D);
      be_.rope_backward_bf16_into(dqkv16 + Q, ld, dk16, rope_cos_, rope_sin_, B, T, KV, D);
      be_.copy_rows_bf16(dqkv16 + Q + K, ld, dv16, N, K);
      linear_bwd16(0, dh1, dw.wq, nullptr, dqkv16, a.h1_16, w.wq, N, C, ld, false, true);
    } else {
      be_.rope_backward_bf16(dq16, rope_cos_, rope_sin_, B, T, H, D);
      be_.rope_backward_bf16(dk16, rope_cos_, rope_sin_, B, T, KV, D);
      const float* h1 = nat || qkv_read_codes(N) ? nullptr : widened(a.h1_16, z.h1);  // once
      const void* shared_x = h1 ? static_cast<const void*>(h1) : a.h1_16;
      const auto shared = shared_input(shared_x, N, false);
      linear_bwd16(0, dh1, dw.wq, nullptr, dq16, a.h1_16, w.wq, N, C, c_.q_dim(), false, nat, h1,
                   nullptr, a.h1_xt);
      linear_bwd16(1, dh1, dw.wk, nullptr, dk16, a.h1_16, w.wk, N, C, c_.kv_dim(), true, nat, h1,
                   nullptr, a.h1_xt);
      linear_bwd16(2, dh1, dw.wv, nullptr, dv16, a.h1_16, w.wv, N, C, c_.kv_dim(), true, nat, h1,
                   nullptr, a.h1_xt);
    }
    norm_backward(dw.input_norm, dh1, x, w.input_norm, a.rstd1);
    scratch_.release(m);
  } else {
    size_t m = scratch_.mark();
    float* d_o = scratch_.alloc_f32(N * c_.q_dim());
    float* dq = scratch_.alloc_f32(N * c_.q_dim());
    float* dk = scratch_.alloc_f32(N * c_.kv_dim());
    float* dv = scratch_.alloc_f32(N * c_.kv_dim());
    float* dh1 = scratch_.alloc_f32(N * C);
    if (bp)
      linear_bwd16(3, d_o, dw.wo, dresid, nullptr, a.o_16, w.wo, N, c_.q_dim(), C, false, nat);
    else linear_bwd(3, d_o, dw.wo, dresid, a.o, w.wo, N, c_.q_dim(), C, false);
    // The rounding path rounds where the bf16 path keeps these gradients as codes (bf16
    // activations, a lowered block): d_o before attention, dq, dk and dv after it, dq and dk
    // again after RoPE's backward. The same values, so the same gradients bit for bit.
    const bool as_codes = !bp && grads16;
    if (as_codes) be_.round_bf16(d_o, d_o, N * c_.q_dim());
    // (FP8 attention runs only in the blocks the recipe lowers, which take the branch above
    // on the bf16 path)
    MX_ASSERT(!(bp && fp8_attention()), "FP8 attention off the bf16 path's codes");
    if (bp)
      be_.attention_backward_bf16(dq, dk, dv, d_o, a.q_16, a.k_16, a.v_16, a.o_16, a.lse, B, T,
                                  H, KV, D);
    else if (fp8_attention())
      be_.attention_backward_fp8(dq, dk, dv, d_o, a.q, a.k, a.v, a.o, a.lse, B, T, H, KV, D);
    else be_.attention_backward(dq, dk, dv, d_o, a.q, a.k, a.v, a.o, a.lse, B, T, H, KV, D);
    record_attention_amax(true, T);
    if (as_codes) {
      be_.round_bf16(dq, dq, N * c_.q_dim());
      be_.round_bf16(dk, dk, N * c_.kv_dim());
      be_.round_bf16(dv, dv, N * c_.kv_dim());
    }
    be_.rope_backward(dq, rope_cos_, rope_sin_, B, T, H, D);
    be_.rope_backward(dk, rope_cos_, rope_sin_, B, T, KV, D);
    if (as_codes) {
      be_.round_bf16(dq, dq, N * c_.q_dim());
      be_.round_bf16(dk, dk, N * c_.kv_dim());
    }
    if (bp) {
      // once for all three
      const float* h1 = nat || qkv_read_codes(N) ? nullptr : widened(a.h1_16, z.h1);
      const void* shared_x = h1 ? static_cast<const void*>(h1) : a.h1_16;
      const auto shared = shared_input(shared_x, N, false);
      linear_bwd16(0, dh1, dw.wq, dq, nullptr, a.h1_16, w.wq, N, C, c_.q_dim(), false, nat, h1);
      linear_bwd16(1, dh1, dw.wk, dk, nullptr, a.h1_16, w.wk, N, C, c_.kv_dim(), true, nat, h1);
      linear_bwd16(2, dh1, dw.wv, dv, nullptr, a.h1_16, w.wv, N, C, c_.kv_dim(), true, nat, h1);
    } else {
      const auto shared = shared_input(a.h1, N, false);
      linear_bwd(0, dh1, dw.wq, dq, a.h1, w.wq, N, C, c_.q_dim(), false);
      linear_bwd(1, dh1, dw.wk, dk, a.h1, w.wk, N, C, c_.kv_dim(), true);
      linear_bwd(2, dh1, dw.wv, dv, a.h1, w.wv, N, C, c_.kv_dim(), true);
    }
    norm_backward(dw.input_norm, dh1, x, w.input_norm, a.rstd1);
    scratch_.release(m);
  }
}

namespace {
// The block-scaled recipes' operands (mxfp8, nvfp4) for the backend, cut as
// LinearRecipe::quantize cuts them: blocks along the GEMM's reduction (reduce_along_cols: along
// the matrix's rows, else down its columns), nvfp4 weights in 16x16, nvfp4 gradients with the
// recipe's stochastic rounding.
Backend::Fp8Operand block_operand(const LinearRecipe& recipe, LinearOperand op,
                                  bool reduce_along_cols, int64_t layer, int linear) {
  Backend::Fp8Operand q;
  if (recipe.recipe() == Recipe::kMxfp8) {
    q.mx = true;
    q.block_rows = reduce_along_cols ? 1 : 32;
    q.block_cols = reduce_along_cols ? 32 : 1;
  } else {
    const bool weight = op == LinearOperand::kFwdWeight || op == LinearOperand::kDgradWeight;
    q.nvfp4 = true;
    q.block_rows = weight || !reduce_along_cols ? 16 : 1;
    q.block_cols = weight || reduce_along_cols ? 16 : 1;
    q.rounding = recipe.nvfp4_rounding(op, layer, linear);
  }
  return q;
}
bool reduces_along_cols(LinearOperand op) {  // the Linears' GEMMs, as linear_fwd/bwd call them
  return op == LinearOperand::kFwdInput || op == LinearOperand::kFwdWeight ||
         op == LinearOperand::kDgradGrad;
}
}  // namespace

void LlamaModel::quantize(float* out, const float* x, int64_t rows, int64_t cols,
                          bool reduce_along_cols, LinearOperand op, int linear) {
  // A block left out of the recipe, with precision.high_precision = bf16: bf16 rounding.
  if (!recipe_->active(layer_)) return be_.round_bf16(out, x, rows * cols);
  if (!amax_pending_.empty()) fp8_flush();  // the recipe's delayed state must be current
  if (be_.host_addressable())
    return recipe_->quantize(out, x, rows, cols, reduce_along_cols, op, layer_, linear);
  // mxfp8 / nvfp4 off their tensor cores (e.g. on Hopper): the backend's quantize kernels,
  // same bytes, no host round trip (telemetry steps need the recipe's own calls).
  if ((recipe_->recipe() == Recipe::kMxfp8 || recipe_->recipe() == Recipe::kNvfp4) &&
      !recipe_->collecting_stats() &&
      be_.quantize_dequantize(out, x, rows, cols,
                              block_operand(*recipe_, op, reduce_along_cols, layer_, linear)))
    return;
  // The recipes' quantizers are host code: the operand goes to the host and its quantized copy
  // comes back (exact, slow).
  const size_t n = size_t(rows * cols);
  std::vector<float> host_x(n), host_out(n);
  be_.copy_to_host(host_x.data(), x, sizeof(float) * n);
  recipe_->quantize(host_out.data(), host_x.data(), rows, cols, reduce_along_cols, op, layer_,
                    linear);
  be_.copy_from_host(out, host_out.data(), sizeof(float) * n);
}

bool LlamaModel::native_fp8(int64_t N, int64_t in, int64_t out) const {
  // Telemetry and the test scale knob need the emulation's quantize() calls.
  if (recipe_->collecting_stats() || !recipe_->active(layer_)) return false;
  if (recipe_->per_tensor_fp8() && layer_ == recipe_->test_shift_layer()) return false;
  return native_fp8_shape(N, in, out);
}

int64_t LlamaModel::native_fp8_multiple() const {
  if (!recipe_) return 0;
  switch (recipe_->recipe()) {
    // fp8-block: cuBLASLt's 1x128 / 128x128 scale modes (Hopper) or, on Blackwell, the MXFP8
    // GEMM with the block scales as E8M0 (each 1x32 piece inside one 128-wide block).
    case Recipe::kFp8Block: return be_.fp8_block_tensor_cores() ? 128 : 0;
    case Recipe::kMxfp8: return be_.mxfp8_tensor_cores() ? 32 : 0;  // 1x32 along every reduction
    // nvfp4: two E2M1 codes a byte, so a K-major row of K / 2 bytes is 16-byte aligned when K is
    // a multiple of 32; tokens a multiple of 16 also means the weight gradient takes the RHT.
    case Recipe::kNvfp4: return be_.nvfp4_tensor_cores() ? 32 : 0;
    default:  // cuBLASLt's FP8 GEMMs want every dimension (each is some GEMM's reduction) % 16
      return recipe_->per_tensor_fp8() && be_.fp8_tensor_cores() ? 16 : 0;
  }
}

bool LlamaModel::native_fp8_shape(int64_t N, int64_t in, int64_t out) const {
  const int64_t m = native_fp8_multiple();
  return m > 0 && N % m == 0 && in % m == 0 && out % m == 0;
}

int LlamaModel::native_fp8_linears(int64_t N) const {
  const int64_t C = c_.hidden_size, I = c_.intermediate_size, q = c_.q_dim(), kv = c_.kv_dim();
  int n = 0;
  for (auto [in, out] : {std::pair{C, q}, {C, kv}, {C, kv}, {q, C}, {C, I}, {C, I}, {I, C}})
    n += native_fp8_shape(N, in, out);
  return n;
}

Backend::Fp8Operand LlamaModel::fp8_operand(LinearOperand op, int linear) {
  Backend::Fp8Operand q;
  if (recipe_->recipe() == Recipe::kFp8Block) {  // E4M3 throughout, blocks as the recipe cuts them
    const bool reduce_along_cols = op == LinearOperand::kFwdInput ||
                                   op == LinearOperand::kFwdWeight ||
                                   op == LinearOperand::kDgradGrad;
    LinearRecipe::fp8_block_shape(op, reduce_along_cols, q.block_rows, q.block_cols);
    return q;
  }
  // mxfp8: E4M3 throughout, 1x32 along the reduction. nvfp4: the weight gradient's RHT is set
  // by linear_bwd, which knows the token count.
  if (recipe_->recipe() == Recipe::kMxfp8 || recipe_->recipe() == Recipe::kNvfp4)
    return block_operand(*recipe_, op, reduces_along_cols(op), layer_, linear);
  q.fmt = LinearRecipe::fp8_format(op);
  if (recipe_->recipe() != Recipe::kFp8Delayed) return q;  // current scaling
  if (recipe_->replaying()) {  // a recompute: the forward's scale, and no amax to record
    q.current = false;
    q.scale = recipe_->delayed_scale(layer_, linear, op);
    return q;
  }
  const int slots = int(c_.num_hidden_layers) * 7 * 6;
  if (!amax_mem_.p) {
    this->slots(amax_mem_, size_t(slots), "fp8 amax");
    amax_is_pending_.assign(size_t(slots), 0);
  }
  const int slot = (int(layer_) * 7 + linear) * 6 + int(op);
  if (amax_is_pending_[size_t(slot)]) fp8_flush();  // this key's last amax must be recorded
  q.current = false;
  q.scale = recipe_->delayed_scale(layer_, linear, op);
  q.amax = amax_mem_.p + slot;
  amax_is_pending_[size_t(slot)] = 1;
  amax_pending_.push_back(slot);
  return q;
}

void LlamaModel::fp8_flush() {
  if (amax_pending_.empty()) return;
  std::vector<float>& host = amax_read_;  // sized once
  host.resize(amax_is_pending_.size());
  be_.copy_to_host(host.data(), amax_mem_.p, sizeof(float) * host.size());
  for (int slot : amax_pending_) {
    const int op = slot % 6, linear = (slot / 6) % 7;
    const int64_t layer = slot / 42;
    recipe_->delayed_record(layer, linear, LinearOperand(op), host[size_t(slot)]);
    amax_is_pending_[size_t(slot)] = 0;
  }
  amax_pending_.clear();
}

bool LlamaModel::native_bf16(bool on) {
  // bf16 is a rounding of each GEMM operand (RNE) before an fp32 GEMM: a backend whose GEMM
  // does that itself (CUDA) runs it natively, for the blocks whose Linears are bf16 GEMMs.
  // (Its callers have checked lowered().)
  if (on && !bf16_linears()) return false;
  return be_.set_bf16_gemm_operands(on);
}

bool LlamaModel::bf16_linears() const {
  // A block left out of the recipe (precision.high_precision = bf16: no telemetry), or recipe
  // bf16 off its telemetry steps (which need the quantize() calls).
  if (!lowered(layer_)) return false;
  return !recipe_->active(layer_) ||
         (recipe_->recipe() == Recipe::kBf16 && !recipe_->collecting_stats());
}

bool LlamaModel::fp8_attention() const {
  return recipe_ && recipe_->fp8_attention(layer_);
}

void LlamaModel::record_attention_amax(bool backward, int64_t T) {
  if (!fp8_attention() || !recipe_->collecting_stats()) return;
  const int64_t H = c_.num_attention_heads, KV = c_.num_key_value_heads, D = c_.head_dim;
  recipe_->record_attention_amax(layer_, be_.attention_fp8_amax(), backward, D, T * (H / KV),
                                 1.0f / std::sqrt(float(D)));
}

bool LlamaModel::lowered(int64_t layer) const {
  return recipe_ && (recipe_->active(layer) || recipe_->high_precision_bf16());
}

bool LlamaModel::fp8_reads_codes(int64_t N, int64_t in, int64_t out) const {
  // nvfp4 included: its device quantizers read the codes too (the 1x16 rows, and x^T's
  // Hadamard-transformed blocks made in registers)
  return lowered(layer_) && recipe_->recipe() != Recipe::kBf16 && native_fp8(N, in, out);
}

bool LlamaModel::saves_xt(int first, int count, bool reads_codes, Checkpointing policy) const {
  if (!fp8_save_xt_enabled() || !reads_codes || !BlockSizes::keeps(policy, true) || !recipe_ ||
      !recipe_->active(layer_) || recipe_->collecting_stats() || recipe_->replaying())
    return false;
  if (recipe_->recipe() == Recipe::kFp8Current) return true;  // x's own amax, every operand
  // the block recipes scale each block from its own elements: x^T's blocks are the weight
  // gradient's, whatever the step (not nvfp4's: its weight gradient transforms x^T first)
  if (xt_blocks()) return true;
  if (recipe_->recipe() != Recipe::kFp8Delayed) return false;
  const float s = recipe_->delayed_scale(layer_, first, LinearOperand::kFwdInput);
  for (int l = first; l < first + count; ++l)
    if (recipe_->delayed_scale(layer_, l, LinearOperand::kFwdInput) != s ||
        recipe_->delayed_scale(layer_, l, LinearOperand::kWgradInput) != s)
      return false;
  return true;
}

bool LlamaModel::xt_blocks() const {
  return recipe_ && mx::xt_blocks(xt_codes_of(recipe_->recipe()));
}

bool LlamaModel::fused_swiglu_backward(int64_t N) const {
  // per-tensor FP8, fp8-block or mxfp8 on tensor cores for gate and up (not nvfp4: its
  // gradients' operands are Hadamard-transformed and stochastically rounded), not on a
  // telemetry step (native_fp8 says so) nor in a block left in high precision
  return fp8_fuse_swiglu_enabled() && recipe_ && recipe_->recipe() != Recipe::kNvfp4 &&
         mlp_read_codes(N);
}

bool LlamaModel::qkv_read_codes(int64_t N) const {
  const int64_t C = c_.hidden_size;
  return fp8_reads_codes(N, C, c_.q_dim()) && fp8_reads_codes(N, C, c_.kv_dim());
}

bool LlamaModel::mlp_read_codes(int64_t N) const {
  return fp8_reads_codes(N, c_.hidden_size, c_.intermediate_size);
}

SharedInputScope LlamaModel::shared_input(const void* x, int64_t N, bool mlp) const {
  const int64_t C = c_.hidden_size;
  const int64_t a = mlp ? c_.intermediate_size : c_.q_dim(), b = mlp ? a : c_.kv_dim();
  // native_fp8 is false off the FP8 recipes (bf16 included) and for a block left out of one;
  // under nvfp4 the backend shares the forward's 1x16 inputs only (Backend::shareable)
  const bool on = lowered(layer_) && native_fp8(N, C, a) && native_fp8(N, C, b);
  return SharedInputScope(be_, on ? x : nullptr, N, C, std::max(a, b));
}

void LlamaModel::linear_fwd(int linear, float* y, const float* x, const float* w, int64_t N,
                            int64_t in, int64_t out, const uint16_t* x16, uint16_t* y16,
                            const float* residual, SavedXt save, SwigluInput swiglu) {
  MX_ASSERT(!x16 || (!x && fp8_reads_codes(N, in, out)), "bf16-code input off the FP8 Linears");
  MX_ASSERT(!swiglu.g || (!x && !x16 && save.codes), "SwiGLU's operands stand for x alone");
  MX_ASSERT(!residual || (y && !y16), "a residual goes with an fp32 output alone");
  MX_ASSERT(!save.codes || fp8_reads_codes(N, in, out), "x^T's codes kept off the FP8 Linears");
  if (!lowered(layer_)) {
    be_.linear_forward(y, x, w, N, in, out);
  } else if (native_bf16(true)) {
    be_.linear_forward(y, x, w, N, in, out);
    native_bf16(false);
  } else if (native_fp8(N, in, out)) {
    const size_t m = scratch_.mark();
    float* work = scratch_.alloc_f32(N * in + out * in);
    auto xq = fp8_operand(LinearOperand::kFwdInput, linear);
    xq.bf16 = x16;
    xq.save_t = save.codes;  // x^T's codes kept for the weight gradient (saves_xt)
    MX_ASSERT(!save.codes || size_t(xq.xt_scale_bytes(N, in)) ==
                                 fp8_xt_scale_bytes(N * in, xt_blocks()),
              "x^T's scales: the room kept for them is not the operand's");
    xq.save_t_scale_inv = save.scale_inv;
    xq.swiglu_g = swiglu.g;  // x made from SwiGLU's operands by the cast (SwigluInput)
    xq.swiglu_u = swiglu.u;
    if (x16 && x16 == norm_amax_x_) xq.x_amax = norm_amax_mem_.p;  // the norm took x's amax
    auto wq = fp8_operand(LinearOperand::kFwdWeight, linear);
    weight_amax(linear, wq);
    // writes y16 itself; adds the residual itself (residual + product, as the add below)
    be_.fp8_linear_forward(y, x, xq, w, wq, N, in, out, work, y16, residual);
    scratch_.release(m);
    return;
  } else {
    const size_t m = scratch_.mark();
    float* xq = scratch_.alloc_f32(N * in);
    float* wq = scratch_.alloc_f32(out * in);
    quantize(xq, x, N, in, true, LinearOperand::kFwdInput, linear);
    quantize(wq, w, out, in, true, LinearOperand::kFwdWeight, linear);
    be_.linear_forward(y, xq, wq, N, in, out);
    scratch_.release(m);
  }
  if (y16) be_.to_bf16(y16, y, N * out);
  if (residual) be_.add(y, residual, y, N * out);  // residual + product, as gemm_bf16_residual
}

void LlamaModel::fp8_backward_operands(int linear, int64_t N, bool dx, bool dw,
                                       const uint16_t* dy16, const uint16_t* x16, SavedXt xt,
                                       Backend::Fp8Operand& dyq_dgrad, Backend::Fp8Operand& wq,
                                       Backend::Fp8Operand& dyq_wgrad,
                                       Backend::Fp8Operand& xq) {
  if (dx) {
    dyq_dgrad = fp8_operand(LinearOperand::kDgradGrad, linear);
    dyq_dgrad.bf16 = dy16;
    wq = fp8_operand(LinearOperand::kDgradWeight, linear);
    weight_amax(linear, wq);
  }
  if (!dw) return;
  dyq_wgrad = fp8_operand(LinearOperand::kWgradGrad, linear);
  dyq_wgrad.bf16 = dy16;
  xq = fp8_operand(LinearOperand::kWgradInput, linear);
  xq.bf16 = x16;
  if (xt.codes) {  // the forward's codes of x^T (saves_xt): x is not read again
    xq.codes_t = xt.codes;
    xq.codes_t_scale_inv = xt.scale_inv;
    // fp8-delayed: this operand's history takes x's amax, which the forward's slot holds
    if (xq.amax)
      be_.copy(xq.amax,
               amax_mem_.p + (int(layer_) * 7 + linear) * 6 + int(LinearOperand::kFwdInput), 1);
    ++saved_xt_uses_;
  }
  if (recipe_->hadamard_wgrad(N)) {  // nvfp4: both operands transformed along the tokens
    dyq_wgrad.rht = xq.rht = true;
    dyq_wgrad.rht_seed = xq.rht_seed = recipe_->hadamard_seed(layer_, linear);
  }
}

void LlamaModel::linear_bwd(int linear, float* dx, float* dw, const float* dy, const float* x,
                            const float* w, int64_t N, int64_t in, int64_t out,
                            bool accumulate_dx, const uint16_t* x16, const uint16_t* dy16,
                            uint16_t* dx16, SavedXt xt) {
  MX_ASSERT(!xt.codes || (!x && !x16 && fp8_reads_codes(N, in, out)),
            "x^T's kept codes off the FP8 Linears, or given with x");
  MX_ASSERT(!x16 || (!x && fp8_reads_codes(N, in, out)), "bf16-code input off the FP8 Linears");
  MX_ASSERT((!dy16 || !dy) && ((!dy16 && !dx16) || fp8_reads_codes(N, in, out)) &&
                (!dx16 || (dx && !accumulate_dx)),
            "bf16-code gradients off the FP8 Linears");
  if (!lowered(layer_)) return be_.linear_backward(dx, dw, dy, x, w, N, in, out, accumulate_dx);
  if (native_bf16(true)) {
    be_.linear_backward(dx, dw, dy, x, w, N, in, out, accumulate_dx);
    native_bf16(false);
    return;
  }
  if (native_fp8(N, in, out)) {  // both GEMMs in one call (dy quantized once where it can be)
    const size_t m = scratch_.mark();
    float* work = scratch_.alloc_f32(std::max(dx ? N * out + out * in : 0,
                                              dw ? N * out + N * in : 0));
    Backend::Fp8Operand dyq_dgrad, wq, dyq_wgrad, xq;
    fp8_backward_operands(linear, N, dx != nullptr, dw != nullptr, dy16, x16, xt, dyq_dgrad, wq,
                          dyq_wgrad, xq);
    // dy is the residual gradient whose amax the norm's backward took (resid_amax)
    if (dy && dy == resid_amax_of_ && dyq_dgrad.per_tensor() && dyq_dgrad.current &&
        dyq_wgrad.per_tensor() && dyq_wgrad.current) {
      dyq_dgrad.x_amax = dyq_wgrad.x_amax = resid_amax();
      ++resid_amax_uses_;
    }
    be_.fp8_linear_backward(dx, dw, dy, dyq_dgrad, w, wq, dyq_wgrad, x, xq, N, in, out,
                            accumulate_dx, work, dx16);
    scratch_.release(m);
    return;
  }
  const size_t m = scratch_.mark();
  if (dx) {  // dx[N,in] = dy[N,out] W[out,in]: reduction over `out`
    float* dyq = scratch_.alloc_f32(N * out);
    float* wq = scratch_.alloc_f32(out * in);
    quantize(dyq, dy, N, out, true, LinearOperand::kDgradGrad, linear);
    quantize(wq, w, out, in, false, LinearOperand::kDgradWeight, linear);
    be_.gemm(false, false, N, in, out, 1.0f, dyq, wq, accumulate_dx ? 1.0f : 0.0f, dx);
    scratch_.release(m);
  }
  if (dw) {  // dW[out,in] += dy^T x: reduction over the N tokens
    if (recipe_->active(layer_) && recipe_->hadamard_wgrad(N)) {
      // NVFP4: transform both operands along the tokens with the same random Hadamard matrix
      // (orthogonal, so dy^T x is unchanged in exact math), then quantize in 1x16 blocks.
      float* dyq = scratch_.alloc_f32(out * N);
      float* xq = scratch_.alloc_f32(in * N);
      auto rht_operand = [&](LinearOperand op) {
        auto q = block_operand(*recipe_, op, true, layer_, linear);
        q.rht = true;
        q.rht_seed = recipe_->hadamard_seed(layer_, linear);
        return q;
      };
      // Host code throughout (transpose, transform, quantizers), or, on a backend the host
      // cannot address, the backend's kernels (same bytes); failing those, the operands come
      // over to the host first and the quantized ones go back.
      bool on_backend = false;
      if (!be_.host_addressable() && !recipe_->collecting_stats()) {
        float* tmp = scratch_.alloc_f32(std::max(out, in) * N);  // where dyt / xt go below
        on_backend =
            be_.quantize_dequantize(dyq, dy, N, out, rht_operand(LinearOperand::kWgradGrad), tmp) &&
            be_.quantize_dequantize(xq, x, N, in, rht_operand(LinearOperand::kWgradInput), tmp);
      }
      if (!on_backend) {
        const bool direct = be_.host_addressable();
        std::vector<float> host_dy, host_x, host_dyt, host_xt, host_dyq, host_xq;
        if (!direct) {
          host_dy.resize(size_t(N * out));
          host_x.resize(size_t(N * in));
          be_.copy_to_host(host_dy.data(), dy, sizeof(float) * host_dy.size());
          be_.copy_to_host(host_x.data(), x, sizeof(float) * host_x.size());
          host_dyt.resize(host_dy.size());
          host_xt.resize(host_x.size());
          host_dyq.resize(host_dy.size());
          host_xq.resize(host_x.size());
        }
        const float* dy_h = direct ? dy : host_dy.data();
        const float* x_h = direct ? x : host_x.data();
        float* dyt = direct ? scratch_.alloc_f32(out * N) : host_dyt.data();
        float* xt = direct ? scratch_.alloc_f32(in * N) : host_xt.data();
        float* dyq_h = direct ? dyq : host_dyq.data();
        float* xq_h = direct ? xq : host_xq.data();
        transpose(dyt, dy_h, N, out);
        transpose(xt, x_h, N, in);
        const uint32_t seed = recipe_->hadamard_seed(layer_, linear);
        numerics::rht16_forward(dyt, out, N, seed);
        numerics::rht16_forward(xt, in, N, seed);
        recipe_->quantize(dyq_h, dyt, out, N, true, LinearOperand::kWgradGrad, layer_, linear);
        recipe_->quantize(xq_h, xt, in, N, true, LinearOperand::kWgradInput, layer_, linear);
        if (!direct) {
          be_.copy_from_host(dyq, host_dyq.data(), sizeof(float) * host_dyq.size());
          be_.copy_from_host(xq, host_xq.data(), sizeof(float) * host_xq.size());
        }
      }
      be_.gemm(false, true, out, in, N, 1.0f, dyq, xq, 1.0f, dw);
    } else {
      float* dyq = scratch_.alloc_f32(N * out);
      float* xq = scratch_.alloc_f32(N * in);
      quantize(dyq, dy, N, out, false, LinearOperand::kWgradGrad, linear);
      quantize(xq, x, N, in, false, LinearOperand::kWgradInput, linear);
      be_.gemm(true, false, out, in, N, 1.0f, dyq, xq, 1.0f, dw);
    }
  }
  scratch_.release(m);
}

double LlamaModel::forward(UnitAccess& access, const int32_t* tokens, int64_t B, int64_t T,
                           Checkpointing policy, bool training, float grad_scale) {
  // (weight_amax: the weights' amaxes are taken anew when the weights may have changed)
  ++micro_batch_serial_;
  const int64_t version = access.weights_version();
  weights_key_ = version >= 0 ? 2 * version + 1 : 2 * micro_batch_serial_;
  const int64_t N = B * T, C = c_.hidden_size, V = c_.vocab_size, L = c_.num_hidden_layers;
  const float eps = float(c_.rms_norm_eps);
  const bool tied = layout_.tied();
  const int embed_u = layout_.embed_unit(), head_u = layout_.head_unit();
  auto weights = [&](int unit, bool backward) {
    return const_cast<float*>(access.acquire(unit, backward));  // accessors take float*
  };
  const size_t saved_start = saved_.mark(), scratch_start = scratch_.mark();

  // tokens are on the host; the ids and rope tables are made there and copied to the
  // backend's memory (a memcpy on the CPU).
  auto* inputs = static_cast<int32_t*>(saved_.alloc(sizeof(int32_t) * N));
  auto* targets = static_cast<int32_t*>(saved_.alloc(sizeof(int32_t) * N));
  float* cos = saved_.alloc_f32(T * c_.head_dim / 2);
  float* sin = saved_.alloc_f32(T * c_.head_dim / 2);
  {
    std::vector<int32_t> host_in(static_cast<size_t>(N)), host_tg(static_cast<size_t>(N));
    split_tokens(tokens, B, T, host_in.data(), host_tg.data());
    be_.copy_from_host(inputs, host_in.data(), sizeof(int32_t) * size_t(N));
    be_.copy_from_host(targets, host_tg.data(), sizeof(int32_t) * size_t(N));
    const size_t table = size_t(T * c_.head_dim / 2);
    if (rope_host_T_ != T) {
      rope_host_cos_.assign(table, 0.0f);
      rope_host_sin_.assign(table, 0.0f);
      make_rope_tables(T, rope_host_cos_.data(), rope_host_sin_.data());
      rope_host_T_ = T;
    }
    be_.copy_from_host(cos, rope_host_cos_.data(), sizeof(float) * table);
    be_.copy_from_host(sin, rope_host_sin_.data(), sizeof(float) * table);
  }
  rope_cos_ = cos;
  rope_sin_ = sin;

  std::vector<float*> xs(L + 1);
  std::vector<BlockActs> acts(L);
  std::vector<size_t> marks(L);
  xs[0] = saved_.alloc_f32(N * C);
  // A tied head reuses the embedding, so its unit stays acquired until the embedding backward.
  float* embed = weights(embed_u, false);
  be_.embedding_forward(xs[0], inputs, embed, N, C);
  if (!tied) access.release(embed_u, false);
  for (int64_t l = 0; l < L; ++l) {
    marks[l] = saved_.mark();
    xs[l + 1] = saved_.alloc_f32(N * C);
    size_t sm = scratch_.mark();
    const int u = layout_.block_unit(l);
    block_forward(block_weights(access, l, false), xs[l], xs[l + 1], acts[l], policy, B, T);
    w16_.fill(nullptr);
    access.release(u, false);
    scratch_.release(sm);
    acts[l].drop_unsaved(policy, bf16_acts_);
  }

  // Final norm + head + cross-entropy, fused with their backward when training.
  float* head_w = weights(head_u, false);
  float* head_g = training ? access.grads(head_u) : nullptr;
  float* dresid = training ? scratch_.alloc_f32(N * C) : nullptr;
  size_t head_mark = scratch_.mark();
  float* hf = scratch_.alloc_f32(N * C);
  float* rstdf = scratch_.alloc_f32(N);
  be_.rmsnorm_forward(hf, rstdf, xs[L], layout_.final_norm_in_unit(head_w), N, C, eps);
  int64_t chunk = head_chunk_rows(c_, N, be_.memory() != nullptr);
  const HeadOperands head_ops = head_operands(recipe_);
  float* workspace = nullptr;
  if (head_ws_) {  // spare device memory (set_head_workspace), where it holds more rows
    const int64_t rows = head_rows_in(head_ws_floats_, c_, N, head_ops);
    if (rows > chunk) {
      chunk = rows;
      workspace = head_ws_;
    }
  }
  if (!workspace) workspace = scratch_.alloc_f32(head_workspace_floats(chunk, C, V, head_ops));
  float* dh = training ? scratch_.alloc_f32(N * C) : nullptr;
  float* head_matrix = tied ? embed : layout_.lm_head_in_unit(head_w);
  float* head_matrix_grad =
      !training ? nullptr : tied ? access.grads(embed_u) : layout_.lm_head_in_unit(head_g);
  if (head_is_fp8(head_ops) && recipe_->collecting_stats()) {
    // telemetry of the FP8 head's forward operands (host copies where the backend's memory is
    // not the host's: a telemetry step's cost, as the Linears' there)
    std::vector<float> host_h, host_w;
    const float *hh = hf, *hw = head_matrix;
    if (!be_.host_addressable()) {
      host_h.resize(size_t(N * C));
      host_w.resize(size_t(V * C));
      be_.copy_to_host(host_h.data(), hf, sizeof(float) * host_h.size());
      be_.copy_to_host(host_w.data(), head_matrix, sizeof(float) * host_w.size());
      hh = host_h.data();
      hw = host_w.data();
    }
    recipe_->record_head_stats(hh, N, C, hw, V);
  }
  double loss_sum = be_.head_cross_entropy(dh, head_matrix_grad, hf, head_matrix, targets, N, C,
                                           V, grad_scale / float(N), workspace, chunk,
                                           head_ops);
  if (training && head_is_fp8(head_ops) && recipe_->collecting_stats())
    recipe_->record_head_grad_amax(be_.head_fp8_grad_amax(), grad_scale / float(N));
  if (training) {
    be_.fill(dresid, 0.0f, N * C);
    be_.rmsnorm_backward(dresid, layout_.final_norm_in_unit(head_g), dh, xs[L],
                         layout_.final_norm_in_unit(head_w), rstdf, N, C);
    access.grads_ready(head_u);
  }
  access.release(head_u, false);
  scratch_.release(head_mark);

  if (training) {
    // (after the head, whose scratch the arenas' bound does not count them beside; each
    // block's output projections then read these instead of rounding dresid into scratch)
    dresid16_ = residual_codes_ ? alloc_bf16(scratch_, N * C) : nullptr;
    dresid16_valid_ = false;
    resid_amax_of_ = nullptr;  // (the final norm's backward wrote dresid without its amax)
    for (int64_t l = L - 1; l >= 0; --l) {
      size_t sm = scratch_.mark();
      const int u = layout_.block_unit(l);
      const BlockParams w = block_weights(access, l, true);
      block_backward(w, layout_.block_in_unit(access.grads(u), l), xs[l], acts[l], dresid, B,
                     T);
      w16_.fill(nullptr);
      access.release(u, true);
      access.grads_ready(u);
      scratch_.release(sm);
      saved_.release(marks[l]);
    }
    dresid16_ = nullptr;
    resid_amax_of_ = nullptr;
    be_.embedding_backward(access.grads(embed_u), inputs, dresid, N, C);
    access.grads_ready(embed_u);
  }
  if (tied) access.release(embed_u, false);
  saved_.release(saved_start);
  scratch_.release(scratch_start);
  // fp8-delayed: the pass's amaxes, reduced over the ranks, into the histories, which are then
  // complete between steps (checkpoints). Every rank ends every forward here.
  fp8_flush();
  if (recipe_) recipe_->flush_amaxes();
  return loss_sum / double(N);
}

double LlamaModel::forward_backward(const float* params, float* grads, const int32_t* tokens,
                                    int64_t B, int64_t T, float grad_scale) {
  MX_ASSERT(grads != nullptr);
  FlatUnitAccess access(layout_, params, grads);
  return forward(access, tokens, B, T, policy_, true, grad_scale);
}

double LlamaModel::forward_loss(const float* params, const int32_t* tokens, int64_t B,
                                int64_t T) {
  FlatUnitAccess access(layout_, params, nullptr);
  return forward(access, tokens, B, T, Checkpointing::kFull, false, 0.0f);
}

double LlamaModel::forward_backward(UnitAccess& access, const int32_t* tokens, int64_t B,
                                    int64_t T, float grad_scale) {
  return forward(access, tokens, B, T, policy_, true, grad_scale);
}

double LlamaModel::forward_loss(UnitAccess& access, const int32_t* tokens, int64_t B, int64_t T) {
  return forward(access, tokens, B, T, Checkpointing::kFull, false, 0.0f);
}

}  // namespace mx
