// make_backend and the default (host memory) implementations of the Backend memory calls.
#include "backend/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "numerics/formats.h"
#include "numerics/quantize.h"

namespace mx {

namespace {
BackendFactory g_cuda_factory = nullptr;

// The CUDA backend of a build that has one lives in libmxcuda.so beside the program
// (backend/cuda/plugin.cpp), loaded here on first use: every CUDA library comes with it.
// `given` names the setting in errors. A program that links the backend itself (the emulated
// build, the op checks) has registered it already.
void load_cuda_plugin(const std::string& given) {
#ifdef MXTRAIN_CUDA_PLUGIN
  std::string dir = ".";
  if (const char* over = std::getenv("MXTRAIN_CUDA_PLUGIN_DIR"); over && *over) {
    dir = over;
  } else {
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = '\0';
      dir = std::string(exe, size_t(n));
      dir = dir.substr(0, dir.rfind('/'));
    }
  }
  const std::string path = dir + "/libmxcuda.so";
  if (::access(path.c_str(), F_OK) != 0)
    throw UserError(str(given, "cuda: the CUDA backend of this mxtrain, ", path, ", is missing (",
                        "keep libmxcuda.so in the same directory as the mxtrain program)"));
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    throw UserError(str(given, "cuda: cannot load the CUDA backend ", path, ": ",
                        why ? why : "unknown error", " (it needs the CUDA runtime, cuBLASLt and ",
                        "NCCL libraries on the library path; see docs/cuda.md)"));
  }
  using Register = int (*)();
  const auto reg = reinterpret_cast<Register>(::dlsym(lib, "mxtrain_cuda_plugin_register"));
  if (!reg)
    throw UserError(str(given, "cuda: ", path, " is not mxtrain's CUDA backend (no ",
                        "mxtrain_cuda_plugin_register)"));
  reg();  // (the library stays loaded: its factories are in use)
#else
  (void)given;
#endif
}
}  // namespace

void register_cuda_backend_factory(BackendFactory factory) { g_cuda_factory = factory; }

size_t cuda_scratch_bytes() {
  const char* mb = std::getenv("MXTRAIN_CUDA_SCRATCH_MB");
  if (!mb) return size_t(1) << 30;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(mb, &end, 10);
  MX_REQUIRE(*mb >= '0' && *mb <= '9' && end && *end == '\0' && v > 0 && v < (1ull << 24),
             "MXTRAIN_CUDA_SCRATCH_MB must be a positive whole number of mebibytes (got '", mb,
             "')");
  return size_t(v) << 20;
}

size_t cuda_head_chunk_bytes() {
  const char* mb = std::getenv("MXTRAIN_CUDA_HEAD_CHUNK_MB");
  if (!mb) return size_t(256) << 20;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(mb, &end, 10);
  MX_REQUIRE(*mb >= '0' && *mb <= '9' && end && *end == '\0' && v >= 16 && v <= (1ull << 16),
             "MXTRAIN_CUDA_HEAD_CHUNK_MB must be a whole number of mebibytes from 16 to 65536 "
             "(got '", mb, "')");
  return size_t(v) << 20;
}

bool Backend::host_addressable() const {
  static const bool staged = [] {
    const char* e = std::getenv("MXTRAIN_TEST_STAGING");
    return e && std::strcmp(e, "1") == 0;
  }();
  return !staged;
}

void Backend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  OpScope scope(*this, "copy_to_host");
  if (bytes) std::memcpy(host_dst, src, bytes);
}

void Backend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  OpScope scope(*this, "copy_from_host");
  if (bytes) std::memcpy(dst, host_src, bytes);
}

bool Backend::fp8_tensor_cores() const {
  static const bool forced = [] {
    const char* e = std::getenv("MXTRAIN_TEST_FP8_OPS");
    return e && std::strcmp(e, "1") == 0;
  }();
  return forced;
}

void Backend::gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                        const uint16_t*, const float*, const uint16_t*, float, float*,
                        uint16_t*) {
  throw std::logic_error(str("backend ", name(), " has no bf16 GEMM (gemm_bf16 called without "
                          "set_bf16_gemm_operands)"));
}

void Backend::swiglu_backward_bf16_fused(uint16_t* dgu16, const uint16_t* ds16,
                                         const uint16_t* g16, const uint16_t* u16, int64_t rows,
                                         int64_t cols) {
  const size_t n = size_t(rows * cols);
  std::vector<uint16_t> dg(n), du(n);
  swiglu_backward_bf16(dg.data(), du.data(), ds16, g16, u16, rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dgu16 + 2 * r * cols, dg.data() + r * cols, sizeof(uint16_t) * size_t(cols));
    std::memcpy(dgu16 + 2 * r * cols + cols, du.data() + r * cols, sizeof(uint16_t) * size_t(cols));
  }
}

void Backend::rope_backward_bf16_into(uint16_t* out, int64_t ld, const uint16_t* dx16,
                                      const float* cos, const float* sin, int64_t B, int64_t T,
                                      int64_t heads, int64_t D) {
  const int64_t cols = heads * D;
  std::vector<uint16_t> d(dx16, dx16 + B * T * cols);
  rope_backward_bf16(d.data(), cos, sin, B, T, heads, D);
  copy_rows_bf16(out, ld, d.data(), B * T, cols);
}

void Backend::copy_rows_bf16(uint16_t* out, int64_t ld, const uint16_t* in, int64_t rows,
                             int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out + r * ld, in + r * cols, sizeof(uint16_t) * size_t(cols));
}

void Backend::rmsnorm_backward_bf16(float* dx, uint16_t* dx16, float* dw, const float* dy,
                                    const float* x, const float* w, const float* rstd, int64_t N,
                                    int64_t C, float* amax) {
  rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
  if (dx16) to_bf16(dx16, dx, N * C);
  if (amax) *amax = numerics::abs_max(dx, N * C);  // (host memory: the reference form)
}

void Backend::gemm_bf16_residual(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                 float alpha, const float* A, const uint16_t* A16, const float* B,
                                 const uint16_t* B16, const float* R, float* C) {
  MX_ASSERT(R != C, "gemm_bf16_residual: the residual must not be the output");
  gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, A16, B, B16, 0.0f, C);
  add(C, R, C, M * N);
}

namespace {
// A per-tensor operand's encode scale: current scaling's from max|x|, else the given one.
float per_tensor_scale(float amax, const Backend::Fp8Operand& q) {
  return q.current ? numerics::fp8_scale_from_amax(amax, numerics::fp8_max(q.fmt)) : q.scale;
}

// Fp8Operand::x_amax, the caller's word that it holds max |x| (its producer's), checked bit for
// bit.
void check_x_amax(const float* x, int64_t n, const Backend::Fp8Operand& q) {
  const float amax = numerics::abs_max(x, n);
  MX_ASSERT(std::memcmp(&amax, q.x_amax, sizeof amax) == 0, "Fp8Operand::x_amax: ", *q.x_amax,
            " given, max |x| is ", amax);
}

// LinearRecipe::quantize's FP8 / FP4 cases (per-tensor, fp8-block, mxfp8, nvfp4): the dequantized operand into `out`.
void fp8_emulate(float* out, const float* x, int64_t rows, int64_t cols,
                 const Backend::Fp8Operand& q) {
  numerics::QuantizeInto into;
  into.dequant = out;
  if (q.x_amax) {
    MX_ASSERT(q.per_tensor() ? q.current : q.nvfp4_2d() || (q.nvfp4 && q.block_rows == 1 && !q.rht),
              "Fp8Operand::x_amax: current scaling, nvfp4's 1x16 rows or 16x16 blocks only");
    check_x_amax(x, rows * cols, q);
  }
  if (q.nvfp4) {  // 1x16, 16x1 (columnwise) or 16x16 (weights) blocks
    if (q.nvfp4_2d() && q.amax && !q.x_amax) *q.amax = numerics::abs_max(x, rows * cols);
    numerics::quantize_nvfp4_into(x, rows, cols, q.nvfp4_2d(),
                                  q.block_rows == 16 && q.block_cols == 1, into, q.rounding);
    return;
  }
  if (q.mx) {  // mxfp8: 1x32 blocks, or 32x1 (columnwise)
    numerics::quantize_mxfp8_into(x, rows, cols, q.block_rows == 32, numerics::Format::kE4M3,
                                  numerics::MxScaleRule::kCeil, into);
    return;
  }
  if (q.block_rows > 0) {  // fp8-block
    numerics::quantize_fp8_block_into(x, rows, cols, q.block_rows, q.block_cols, true, into);
    return;
  }
  const int64_t n = rows * cols;
  const float amax = numerics::abs_max(x, n);
  if (q.amax) *q.amax = amax;
  numerics::quantize_fp8_tensor_into(x, rows, cols, q.fmt, per_tensor_scale(amax, q), into);
}

// nvfp4's weight-gradient operand with the Hadamard transform, as LlamaModel's emulation forms
// it: out[cols, rows] = q(RHT(x^T)) (transpose, transform along the rows, 1x16 quantization).
void nvfp4_rht_emulate(float* out, const float* x, int64_t rows, int64_t cols,
                       const Backend::Fp8Operand& q) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = x[r * cols + c];
  numerics::rht16_forward(out, cols, rows, q.rht_seed);
  numerics::QuantizeInto into;
  into.dequant = out;  // in place: every element is read before it is written
  numerics::quantize_nvfp4_into(out, cols, rows, false, false, into, q.rounding);
}
}  // namespace

bool Backend::quantize_dequantize(float* out, const float* x, int64_t rows, int64_t cols,
                                  const Fp8Operand& q, float* /*tmp: the host form works in place*/) {
  OpScope scope(*this, "quantize_dequantize");
  MX_REQUIRE(q.mx || q.nvfp4, "quantize_dequantize: mxfp8 or nvfp4 operands only");
  if (q.rht) nvfp4_rht_emulate(out, x, rows, cols, q);
  else fp8_emulate(out, x, rows, cols, q);
  return true;
}

// The reference forms (host memory): the recipe's emulation with the GEMM calls of
// linear_forward / linear_backward.
namespace {
// An operand given as bf16 codes (Fp8Operand::bf16), widened into `wide` (host memory: the
// reference forms run there); otherwise x itself.
const float* operand_values(const float* x, const Backend::Fp8Operand& q, int64_t n,
                            std::vector<float>& wide) {
  MX_REQUIRE(!q.swiglu_g, "SwiGLU's operands stand for a forward input alone");
  if (!q.bf16) return x;
  MX_ASSERT(!x, "an operand given both as fp32 and as bf16 codes");
  wide.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) wide[size_t(i)] = numerics::decode_bf16(q.bf16[i]);
  return wide.data();
}
}  // namespace

void Backend::begin_shared_input(const void* x, int64_t rows, int64_t cols,
                                 int64_t /*widest_out: the host needs no room check*/) {
  static const bool off = [] {
    const char* e = std::getenv("MXTRAIN_FP8_SHARED_INPUT");
    return e && std::strcmp(e, "0") == 0;
  }();
  MX_ASSERT(!shared_x_, "begin_shared_input: brackets do not nest");
  shared_full_ = false;
  if (off || !x) return;
  shared_x_ = x;
  shared_rows_ = rows;
  shared_cols_ = cols;
}

void Backend::end_shared_input() {
  shared_x_ = nullptr;
  shared_full_ = false;
}

Backend::SharedKey Backend::shared_key(const void* x, int64_t rows, int64_t cols,
                                       const Fp8Operand& q, bool transposed) {
  SharedKey k;
  k.x = x;
  k.rows = rows;
  k.cols = cols;
  k.transposed = transposed;
  k.fmt = q.fmt;
  k.current = q.current;
  k.scale = q.current ? 0.0f : q.scale;
  k.block_rows = q.block_rows;
  k.block_cols = q.block_cols;
  k.mx = q.mx;
  k.nvfp4 = q.nvfp4;
  return k;
}

Backend::Share Backend::share(const SharedKey& k) {
  if (!shared_x_ || k.x != shared_x_ || k.rows * k.cols > shared_rows_ * shared_cols_)
    return Share::kNone;
  if (!shared_full_) return Share::kFill;
  if (!(k == shared_key_)) return Share::kNone;
  ++shared_hits_;
  return Share::kHit;
}

void Backend::fp8_input(float* out, const void* id, const float* x, int64_t rows, int64_t cols,
                        const Fp8Operand& q, bool transposed) {
  const Share s = shareable(q) ? share(shared_key(id, rows, cols, q, transposed)) : Share::kNone;
  const size_t n = size_t(rows * cols);
  if (s == Share::kHit) {
    MX_ASSERT(shared_values_.size() == n, "shared input: the kept operand has another size");
    std::memcpy(out, shared_values_.data(), sizeof(float) * n);
    if (q.amax && q.per_tensor()) *q.amax = shared_amax_;
    return;
  }
  fp8_emulate(out, x, rows, cols, q);
  if (s != Share::kFill) return;
  shared_values_.assign(out, out + n);
  shared_amax_ = numerics::abs_max(x, int64_t(n));
  shared_kept(shared_key(id, rows, cols, q, transposed));
}

namespace {
// Fp8Operand::save_t's reference form: x^T's codes [cols, rows] as the weight gradient
// quantizes x, and their decode scales: per-tensor at the operand's scale (fp8_emulate's: from
// max|x| or the given one); fp8-block in 128x1 blocks, mxfp8 in 32x1 (the forward's 1x128 and
// 1x32 turned down the columns).
void save_codes_t(const float* x, int64_t rows, int64_t cols, const Backend::Fp8Operand& q) {
  MX_REQUIRE(q.xt_scale_bytes(rows, cols) > 0 && q.save_t_scale_inv,
             "Fp8Operand::save_t: per-tensor FP8, fp8-block 1x128 or mxfp8 1x32, with room "
             "for its scales");
  std::vector<uint8_t> codes(size_t(rows * cols));
  std::vector<float> values(size_t(rows * cols));
  numerics::QuantizeInto into;
  into.dequant = values.data();
  into.codes = codes.data();
  if (q.mx) {
    into.scales_u8 = reinterpret_cast<uint8_t*>(q.save_t_scale_inv);
    numerics::quantize_mxfp8_into(x, rows, cols, true, q.fmt, numerics::MxScaleRule::kCeil,
                                  into);
  } else if (q.block_rows > 0) {
    into.scales_f32 = q.save_t_scale_inv;
    numerics::quantize_fp8_block_into(x, rows, cols, 128, 1, true, into);
  } else {
    const float scale =
        per_tensor_scale(q.current ? numerics::abs_max(x, rows * cols) : 0.0f, q);
    into.scales_f32 = q.save_t_scale_inv;
    numerics::quantize_fp8_tensor_into(x, rows, cols, q.fmt, scale, into);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) q.save_t[c * rows + r] = codes[size_t(r * cols + c)];
}

// Fp8Operand::codes_t's reference form: the dequantized operand [rows, cols] from x^T's saved
// codes [cols, rows] (decode(code) times its decode scale, as the quantizer's own dequantized
// values): per-tensor, or the weight gradient's fp8-block 128x1 / mxfp8 32x1 blocks.
void dequantize_codes_t(float* out, int64_t rows, int64_t cols, const Backend::Fp8Operand& q) {
  const bool blocks = !q.per_tensor();
  MX_REQUIRE(q.codes_t_scale_inv && !q.nvfp4 &&
                 (!blocks || (q.block_cols == 1 && q.block_rows == (q.mx ? 32 : 128))),
             "Fp8Operand::codes_t: per-tensor FP8, fp8-block 128x1 or mxfp8 32x1, with its "
             "decode scales");
  const auto* e8 = reinterpret_cast<const uint8_t*>(q.codes_t_scale_inv);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t b = blocks ? r / q.block_rows * cols + c : 0;
      const float s = q.mx ? numerics::decode_e8m0(e8[b]) : q.codes_t_scale_inv[b];
      out[r * cols + c] = numerics::decode_fp8_elem(q.codes_t[c * rows + r], q.fmt) * s;
    }
}
}  // namespace

void Backend::fp8_linear_forward(float* y, const float* x, const Fp8Operand& xq, const float* w,
                                 const Fp8Operand& wq, int64_t N, int64_t in, int64_t out,
                                 float* work, uint16_t* y16, const float* residual) {
  OpScope scope(*this, "fp8_linear_forward");
  MX_REQUIRE(!residual || (y && !y16), "fp8_linear_forward: a residual takes an fp32 y alone");
  std::vector<float> wide;
  std::vector<uint16_t> s16;  // SwiGLU's operands given (Fp8Operand::swiglu_g): s's codes
  if (xq.swiglu_g) {
    MX_REQUIRE(xq.swiglu_u && xq.save_t && !x && !xq.bf16,
               "fp8_linear_forward: SwiGLU's operands stand for x, with x^T's codes saved");
    s16.resize(size_t(N * in));
    swiglu_forward_bf16(s16.data(), xq.swiglu_g, xq.swiglu_u, N * in);
  }
  const void* id = xq.bf16 ? static_cast<const void*>(xq.bf16) : x;
  Fp8Operand sq = xq;
  if (xq.swiglu_g) {
    sq.bf16 = s16.data();
    sq.swiglu_g = sq.swiglu_u = nullptr;
    id = xq.swiglu_g;
  }
  x = operand_values(x, sq, N * in, wide);
  float* xd = work;
  float* wd = work + N * in;
  if (xq.save_t) save_codes_t(x, N, in, xq);
  fp8_input(xd, id, x, N, in, xq, false);
  fp8_emulate(wd, w, out, in, wq);
  gemm(false, true, N, out, in, 1.0f, xd, wd, 0.0f, y);
  if (y16) to_bf16(y16, y, N * out);
  if (residual) add(y, residual, y, N * out);
}

void Backend::fp8_swiglu_backward(float* dx, float* const dw[2], const uint16_t* ds16,
                                  const uint16_t* g16, const uint16_t* u16,
                                  const float* const w[2], const Fp8Operand wq[2],
                                  const Fp8Operand dyq[2][2], const Fp8Operand xq[2], int64_t N,
                                  int64_t C, int64_t I, uint16_t* dgu16, float* work) {
  swiglu_backward_bf16(dgu16, dgu16 + N * I, ds16, g16, u16, N * I);
  for (int k = 0; k < 2; ++k) {
    Fp8Operand dgrad = dyq[k][0], wgrad = dyq[k][1];
    dgrad.bf16 = wgrad.bf16 = dgu16 + k * N * I;
    fp8_linear_backward(dx, dw[k], nullptr, dgrad, w[k], wq[k], wgrad, nullptr, xq[k], N, C, I,
                        k == 1, work);
  }
}

void Backend::fp8_linear_dgrad(float* dx, const float* dy, const Fp8Operand& dyq, const float* w,
                               const Fp8Operand& wq, int64_t N, int64_t in, int64_t out,
                               bool accumulate_dx, float* work, uint16_t* dx16) {
  OpScope scope(*this, "fp8_linear_dgrad");
  MX_REQUIRE(!dx16 || (dx && !accumulate_dx),
             "fp8_linear_dgrad: bf16 codes of dx are written, not added, with dx as scratch");
  std::vector<float> wide;
  dy = operand_values(dy, dyq, N * out, wide);
  float* dyd = work;
  float* wd = work + N * out;
  fp8_emulate(dyd, dy, N, out, dyq);
  fp8_emulate(wd, w, out, in, wq);
  gemm(false, false, N, in, out, 1.0f, dyd, wd, accumulate_dx ? 1.0f : 0.0f, dx);
  if (dx16) to_bf16(dx16, dx, N * in);
}

void Backend::fp8_linear_wgrad(float* dw, const float* dy, const Fp8Operand& dyq, const float* x,
                               const Fp8Operand& xq, int64_t N, int64_t in, int64_t out,
                               float* work) {
  OpScope scope(*this, "fp8_linear_wgrad");
  MX_REQUIRE(!xq.codes_t || (!x && !xq.bf16 && !dyq.rht),
             "fp8_linear_wgrad: x^T's saved codes given with x, or with the Hadamard transform");
  std::vector<float> wide, wide_dy;
  const void* id = xq.bf16 ? static_cast<const void*>(xq.bf16) : x;
  x = operand_values(x, xq, N * in, wide);
  dy = operand_values(dy, dyq, N * out, wide_dy);
  float* dyd = work;
  float* xd = work + N * out;
  if (xq.codes_t) {
    fp8_emulate(dyd, dy, N, out, dyq);
    dequantize_codes_t(xd, N, in, xq);
    gemm(true, false, out, in, N, 1.0f, dyd, xd, 1.0f, dw);
    return;
  }
  if (dyq.rht) {  // nvfp4: dW += q(RHT(dy^T)) q(RHT(x^T))^T, the emulation's GEMM call
    nvfp4_rht_emulate(dyd, dy, N, out, dyq);
    nvfp4_rht_emulate(xd, x, N, in, xq);
    gemm(false, true, out, in, N, 1.0f, dyd, xd, 1.0f, dw);
    return;
  }
  fp8_emulate(dyd, dy, N, out, dyq);
  fp8_input(xd, id, x, N, in, xq, true);
  gemm(true, false, out, in, N, 1.0f, dyd, xd, 1.0f, dw);
}

void Backend::fp8_linear_backward(float* dx, float* dw, const float* dy,
                                  const Fp8Operand& dyq_dgrad, const float* w,
                                  const Fp8Operand& wq, const Fp8Operand& dyq_wgrad,
                                  const float* x, const Fp8Operand& xq, int64_t N, int64_t in,
                                  int64_t out, bool accumulate_dx, float* work,
                                  uint16_t* dx16) {
  MX_REQUIRE(!(dx && dw) || dyq_dgrad.bf16 == dyq_wgrad.bf16,
             "fp8_linear_backward: dy's two operands given as different codes");
  if (dx) fp8_linear_dgrad(dx, dy, dyq_dgrad, w, wq, N, in, out, accumulate_dx, work, dx16);
  if (dw) fp8_linear_wgrad(dw, dy, dyq_wgrad, x, xq, N, in, out, work);
}

std::unique_ptr<Backend> make_backend(const std::string& device, const std::string& key) {
  if (device == "cpu") return make_cpu_backend();
  // (a flag as it is typed, `--device cuda`; a config key as `run.device = cuda`)
  const std::string given = key.rfind("--", 0) == 0 ? key + " " : key + " = ";
  if (device == "cuda") {
    if (!g_cuda_factory) load_cuda_plugin(given);
    if (!g_cuda_factory)
      throw UserError(str(given, "cuda: this mxtrain was built without the CUDA backend (no "
                          "nvcc/NCCL found, or -DMXTRAIN_CUDA=OFF; see docs/cuda.md)"));
    // (the factory's errors name the setting as given: `bench sgemm --device cuda` once said
    // "run.device = cuda", a key that command does not have)
    return g_cuda_factory(given);
  }
  check_device_name(device, key);
  throw UserError(str("unknown ", key, " '", device, "'"));  // (check_device_name threw)
}

void check_device_name(const std::string& device, const std::string& key) {
  if (device != "cpu" && device != "cuda")
    throw UserError(str("unknown ", key, " '", device, "' (known: cpu, cuda)"));
}

}  // namespace mx
