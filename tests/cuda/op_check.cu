// Every CUDA backend op against the CPU backend (the reference), and the CUDA quantizers against
// the CPU quantizers byte for byte. On a GPU it is a program run by bench/gpu/check.sh; CI (no
// GPU) runs the same cases under mxemu (tests/cuda_emu: the kernels executed on the CPU,
// cuBLASLt and NCCL by reference stand-ins, cuDNN not at all), ctest cuda_emu_op_check_sm*.
//
//   cuda_op_check [--json PATH] [--filter SUBSTRING[,SUBSTRING...]]
//
// Each case: random inputs (several shapes, odd sizes included), outputs that the op writes are
// poisoned with NaN (all bytes 0xFF) before the run so an element left unwritten fails; outputs
// that the op accumulates into start from the same random values on both sides. Comparison:
// err = |cuda - cpu| / (atol + rtol |cpu|) per element; PASS when max err <= 1 and no NaN
// appears where the CPU has none. One line per case; JSON summary; exit 1 on any FAIL.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/blas_core.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_arena.h"
#include "backend/cuda/quantize_kernels.h"
#include "numerics/block_scale_layout.h"
#include "numerics/formats.h"
#include "numerics/fp8_block_mx.h"
#include "numerics/attention_fp8.h"
#include "numerics/quantize.h"

using namespace mx;
using numerics::Format;

namespace {

// ---- device buffers ---------------------------------------------------------------------------
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    MX_CUDA_CHECK("op_check alloc", cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)));
    poison();
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { upload(h); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  // Both finish before returning: the backend's kernels run on a non-blocking stream, which
  // does not wait for the legacy default stream these calls use (cudaMemset and a pageable
  // cudaMemcpy may return early).
  void upload(const std::vector<T>& h) {
    MX_CUDA_CHECK("op_check upload", cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    MX_CUDA_CHECK("op_check upload", cudaDeviceSynchronize());
  }
  void poison() {
    MX_CUDA_CHECK("op_check poison", cudaMemset(p, 0xFF, std::max<size_t>(1, n) * sizeof(T)));
    MX_CUDA_CHECK("op_check poison", cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    MX_CUDA_CHECK("op_check sync", cudaDeviceSynchronize());
    std::vector<T> h(n);
    MX_CUDA_CHECK("op_check download", cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

std::mt19937_64 rng(1234);
std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> uniform(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<int32_t> randint(size_t n, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(0, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- results ----------------------------------------------------------------------------------
struct Result {
  std::string op, shape;
  bool pass = true;
  double max_abs = 0, max_ratio = 0;
  std::string note;
};
std::vector<Result> results;
std::string filter;
// SIGTERM (check.sh's `timeout` at the op check's time limit): the cases not yet run are skipped,
// and main writes the JSON of those that ran, marked stopped, and exits 124 (the time limit's
// status), instead of dying with the whole record in memory.
volatile std::sig_atomic_t stop_signal = 0;
void on_stop_signal(int sig) { stop_signal = sig; }

struct Tol {
  double atol, rtol;
};

// Folds one output tensor into r.
void compare(Result& r, const char* what, const std::vector<float>& got,
             const std::vector<float>& want, Tol tol) {
  if (got.size() != want.size()) {
    r.pass = false;
    r.note += std::string(what) + ": size mismatch; ";
    return;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) && std::isnan(g)) continue;
    if (std::isnan(g) || std::isnan(w)) {
      if (r.pass) r.note += std::string(what) + ": NaN at " + std::to_string(i) + "; ";
      r.pass = false;
      r.max_ratio = INFINITY;
      continue;
    }
    const double e = std::fabs(g - w);
    r.max_abs = std::max(r.max_abs, e);
    const double ratio = e / (tol.atol + tol.rtol * std::fabs(w));
    r.max_ratio = std::max(r.max_ratio, ratio);
  }
  if (r.max_ratio > 1.0) r.pass = false;
}

void run_case(const std::string& op, const std::string& shape, const std::function<void(Result&)>& body) {
  if (stop_signal) return;
  if (!filter.empty()) {  // comma-separated substrings: a case runs if its op has any of them
    bool match = false;
    for (size_t b = 0; b <= filter.size();) {
      const size_t e = std::min(filter.find(',', b), filter.size());
      if (e > b && op.find(filter.substr(b, e - b)) != std::string::npos) match = true;
      b = e + 1;
    }
    if (!match) return;
  }
  Result r;
  r.op = op;
  r.shape = shape;
  try {
    body(r);
  } catch (const std::exception& e) {
    r.pass = false;
    r.note += std::string("exception: ") + e.what();
  }
  std::printf("%-4s %-28s %-34s max_abs=%-11.3g err/tol=%-9.3g %s\n", r.pass ? "PASS" : "FAIL",
              op.c_str(), shape.c_str(), r.max_abs, r.max_ratio, r.note.c_str());
  std::fflush(stdout);
  results.push_back(r);
}

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (auto x : d) {  // appended piece by piece: g++ 12 warns (-Wrestrict) on "x" + to_string
    if (!s.empty()) s += 'x';
    s += std::to_string(x);
  }
  return s;
}

// what + the index, appended piece by piece (as dims(): g++ 12's -Wrestrict).
std::string tagged(const char* what, int64_t i) {
  std::string s(what);
  s += std::to_string(i);
  return s;
}

const Tol kElementwise{1e-6, 1e-5};  // expf vs the CPU's vector exp: a few ulp
const Tol kReduction{1e-5, 1e-4};    // different summation order
const Tol kGemm{1e-4, 1e-4};         // fp32 GEMM, different blocking
const Tol kAttention{2e-5, 2e-4};

// ---- op checks ------------------------------------------------------------------------------------
void expect_floats(Result& r, const char* what, const std::vector<float>& got, const std::vector<float>& want);
bool same_bits(const std::vector<float>& a, const std::vector<float>& b, std::string& note);
// max |v| with NaN skipped, by a plain loop: what an amax of v must be.
float host_amax(const std::vector<float>& v) {
  float m = 0.0f;
  for (float f : v)
    if (!std::isnan(f)) m = std::max(m, std::fabs(f));
  return m;
}
// The operand with its amax given as x's producer took it (Fp8Operand::x_amax).
Backend::Fp8Operand given_amax(Backend::Fp8Operand q, const float* amax) {
  q.x_amax = amax;
  return q;
}
// What an output made with a given amax (`got`) must be: bit for bit `own`, the output of the
// operand's own amax pass, and not `three_x`, the output with an amax 3x too large (so the one
// given is the one used; not 4x: a power of two scales every code exactly).
void expect_given_amax(Result& r, const char* what, const std::vector<float>& got,
                       const std::vector<float>& own, const std::vector<float>& three_x) {
  expect_floats(r, what, got, own);
  std::string note;
  if (same_bits(three_x, got, note)) {
    r.pass = false;
    r.note += std::string("an amax 3x too large gave the same ") + what + ": x_amax unused; ";
  }
}
void expect_bytes(Result& r, const char* what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want);

std::vector<uint16_t> bf16_codes(const std::vector<float>& x);  // RNE codes (below)
// An operand that saves x^T's codes (Fp8Operand::save_t, scales into sc), that is made from
// SwiGLU's operands (swiglu_g / swiglu_u), or that takes x^T's kept codes (codes_t).
Backend::Fp8Operand saving(Backend::Fp8Operand q, uint8_t* t, float* sc) {
  q.save_t = t;
  q.save_t_scale_inv = sc;
  return q;
}
Backend::Fp8Operand with_swiglu(Backend::Fp8Operand q, const uint16_t* g, const uint16_t* u) {
  q.swiglu_g = g;
  q.swiglu_u = u;
  return q;
}
Backend::Fp8Operand from_codes(Backend::Fp8Operand q, const uint8_t* t, const float* sc) {
  q.codes_t = t;
  q.codes_t_scale_inv = sc;
  return q;
}
// Backend b's saving forward (first: its call), alone or, shared, as the first Linear of the
// shared input id with a second Linear (second: its call) that reads the kept codes.
template <class A, class B>
void saving_forward(Backend& b, bool shared, const void* id, int64_t N, int64_t I, int64_t O,
                    A&& first, B&& second) {
  if (shared) b.begin_shared_input(id, N, I, O);
  first();
  if (!shared) return;
  second();
  b.end_shared_input();
}
// The first n bytes of scales kept in floats (the block recipes' x^T scales).
std::vector<uint8_t> scale_bytes(const std::vector<float>& v, int64_t n) {
  const auto* b = reinterpret_cast<const uint8_t*>(v.data());
  return std::vector<uint8_t>(b, b + n);
}
std::vector<float> widen(const std::vector<uint16_t>& codes);     // exact (below)

// A Linear's input given as bf16 codes (the bf16 path; Backend::Fp8Operand::bf16, the fp32
// pointer null): x rounded to bf16 once, its codes on the device for the CUDA quantizers,
// which read them directly, and the widened values (exact) for the CPU reference. So the
// codes, scales and tolerances are those of the fp32 cases.
// The calls of backend op `op` while f() runs, profiled on the device.
template <class F>
int64_t profiled_calls(CudaBackend& gpu, const char* op, F&& f) {
  gpu.set_profiling(true);
  gpu.reset_op_profile();
  f();
  int64_t calls = 0;
  for (const auto& row : gpu.op_profile())
    if (row.op == op) calls += row.calls;
  gpu.set_profiling(false);
  return calls;
}

// The shared-input operands each backend took since its count was cpu0 / gpu0: 2 (one
// Linear quantized, two took its kept quantization).
void expect_two_shared(Result& r, Backend& cpu, CudaBackend& gpu, int64_t cpu0, int64_t gpu0) {
  const int64_t c = cpu.shared_input_hits() - cpu0, g = gpu.shared_input_hits() - gpu0;
  if (c != 2 || g != 2) {
    r.pass = false;
    r.note += "shared operands: cpu " + std::to_string(c) + ", gpu " + std::to_string(g) +
              " (want 2); ";
  }
}

struct Bf16Input {
  std::vector<uint16_t> codes;
  std::vector<float> wide;
  Dev<uint16_t> dev;
  explicit Bf16Input(const std::vector<float>& x)
      : codes(bf16_codes(x)), wide(widen(codes)), dev(codes) {}
  Backend::Fp8Operand on_gpu(Backend::Fp8Operand q) const {
    q.bf16 = dev.p;
    return q;
  }
  Backend::Fp8Operand on_host(Backend::Fp8Operand q) const {  // the CPU twin's codes form
    q.bf16 = codes.data();
    return q;
  }
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m > 0 ? m : 1.0;
}

// One bf16 ulp, relative. Two results that agree in fp32 up to a few fp32 ulps (CUDA's expf vs
// the CPU's exp, a different summation order) round to the same bf16 code unless they straddle
// a rounding boundary, and then to adjacent codes: one bf16 ulp apart. bf16 keeps 8 significant
// bits, so in [2^e, 2^(e+1)) the ulp is 2^(e-7): between 2^-8 |x| (just below 2^(e+1)) and
// 2^-7 |x| (at x = 2^e, e.g. 1 and its upper neighbour 1 + 2^-7). The bound relative to the
// CPU's code is therefore 2^-7, not 2^-8 (which would fail a legitimate flip just above a power
// of two); it is added to the fp32 tolerance of the same computation.
constexpr double kBf16Ulp = 1.0 / 128;

// The FP8 and FP4 GEMMs' tolerance, relative to the output's max |value|. Both sides multiply
// the same codes and scales exactly; under mxemu both sum in fp32, so only the order differs
// (1e-5). Real tensor cores add FP8 products in an accumulator narrower than fp32 between
// cuBLASLt's promotions to fp32 (DeepSeek-V3's report measured about 14 bits on Hopper), which
// alone can pass 1e-5 at K = 2048: 2^-10 there. A wrong scale, layout or code is off by a whole
// block or row's worth, far outside either.
#ifdef MXTRAIN_CUDA_EMU
constexpr double kFp8Gemm = 1e-5;
#else
constexpr double kFp8Gemm = 1.0 / 1024;
#endif

// An FP8 / FP4 GEMM's output against the CPU twin's, `cols` to a row: each element within
// `scale` x kFp8Gemm of its own row's max |value| (+ rtol |want|). Per row, not per tensor: the
// inputs' rows differ in magnitude by up to 2^6, and an error confined to a small row (one
// block's scale wrong there) passed a bound taken from the largest.
void compare_rows(Result& r, const char* what, const std::vector<float>& got,
                  const std::vector<float>& want, int64_t cols, double scale = 1.0,
                  double rtol = 0.0) {
  if (cols <= 0 || got.size() != want.size() || want.size() % size_t(cols) != 0) {
    compare(r, what, got, want, {scale * kFp8Gemm * max_abs(want), rtol});
    return;
  }
  for (size_t at = 0; at < want.size(); at += size_t(cols)) {
    const std::vector<float> g(got.begin() + at, got.begin() + at + cols),
        w(want.begin() + at, want.begin() + at + cols);
    compare(r, what, g, w, {scale * kFp8Gemm * max_abs(w), rtol});
  }
}

// Runs body(r) as two cases of op: " epilogue", as the trainer runs it, and `fallback` with the
// backend's switch off (set(false): the form taken where cuBLASLt has no algorithm for the
// epilogue's), the switch on again after. The first notes `fell_back` where the backend fell
// back anyway (fallbacks() grew: no such algorithm at the shape).
// must_fall_back: the first run must have fallen back (mxemu told to refuse the epilogue's call).
template <class Set, class Count, class F>
void epilogue_and_fallback(const char* op, const std::string& shape, const char* fallback,
                           Set set, Count fallbacks, const char* fell_back, F&& body,
                           bool must_fall_back = false) {
  for (int fb = 0; fb < 2; ++fb)
    run_case(op, shape + (fb ? fallback : " epilogue"), [&](Result& r) {
      struct Restore {
        Set& set;
        ~Restore() { set(true); }
      } restore{set};
      set(!fb);
      const int64_t before = fallbacks();
      body(r);
      if (!fb && fallbacks() > before) r.note += fell_back;
      if (!fb && must_fall_back && fallbacks() == before)
        r.pass = false, r.note += "expected the fallback (MXEMU_LT_REFUSE_OUT_OF_PLACE); ";
    });
}

// mxemu's cuBLASLt refusing out-of-place low-precision calls at the call itself
// (MXEMU_LT_REFUSE_OUT_OF_PLACE=1, after its heuristic offered an algorithm): the residual
// epilogue's GEMM (C read apart from D) must then fall back instead of failing.
bool lt_refuses_out_of_place() {
#ifdef MXTRAIN_CUDA_EMU
  return mxemu::env_choice("MXEMU_LT_REFUSE_OUT_OF_PLACE", {"0", "1"}) == 1;  // (its reading)
#else
  return false;
#endif
}

// The forward's bf16 output (Backend::fp8_linear_forward's y16: the bf16 path's v, gate and up,
// whose input comes as codes too, as the trainer calls it): CUDA writes the codes from
// cuBLASLt's epilogue, the CPU twin computes y in fp32 and rounds it (to_bf16). Run twice: as
// the trainer runs it ("epilogue"), and with set_fp8_bf16_output(false) ("fp32+round", the
// fallback: fp32 into y, then rounded). y and y16 are poisoned before; tolerance: the fp32
// case's (kFp8Gemm of each row's max |y|) plus one bf16 ulp. The note says when the first run fell
// back (no bf16-output algorithm at the shape). fwd(on_gpu, y, y16) runs the Linear on one backend.
// scale: the tolerance's multiple (nvfp4's 3, as its fp32 cases).
template <class F>
void check_fp8_bf16_output(const char* op, const std::string& shape, CudaBackend& gpu, int64_t n,
                           int64_t cols, F&& fwd, double scale = 1.0) {
  epilogue_and_fallback(
      op, shape, " fp32+round", [&](bool on) { gpu.set_fp8_bf16_output(on); },
      [&] { return gpu.fp8_bf16_output_fallbacks(); },
      "no bf16-output algorithm at this shape: fp32 + round; ", [&](Result& r) {
        std::vector<float> y(n);
        std::vector<uint16_t> y16(n);
        Dev<float> dY(n);
        Dev<uint16_t> dY16(n);
        fwd(false, y.data(), y16.data());
        fwd(true, dY.p, dY16.p);
        const std::vector<float> want = widen(y16);
        compare_rows(r, "y16", widen(dY16.download()), want, cols, scale, kBf16Ulp);
      });
}

// The forward with a residual (Backend::fp8_linear_forward's `residual`: the bf16 path's o and
// down projections, x as codes as the trainer calls them): CUDA reads R as the GEMM's C with
// beta 1 and writes R + product to y (nvfp4: beta 1 from the device), the CPU twin computes
// the product and adds. y is poisoned before; R, a unit normal (the residual stream's size
// beside the product's), must come out unchanged bit for bit. Tolerance: the plain forward's,
// kFp8Gemm of each row's max |y| (times `scale`). fwd(on_gpu, y, R) runs the Linear on one
// backend.
// The data gradient as bf16 codes (fp8_linear_dgrad's dx16, dy given as codes: the bf16 path's
// gradients): CUDA's epilogue codes against the CPU twin's rounded product, at the fp32
// tolerance plus one bf16 ulp; dx (scratch) and dx16 poisoned. dgrad(on_gpu, dx, dx16); then
// `also` (e.g. the amax slots).
template <class F, class A = void (*)(Result&)>
void check_fp8_dgrad_codes(const char* op, const std::string& shape, int64_t N, int64_t I,
                           F&& dgrad, A also = [](Result&) {}) {
  run_case(op, shape + " dx16", [&](Result& r) {
    std::vector<float> dx(N * I);
    std::vector<uint16_t> dx16(N * I);
    Dev<float> dDX(N * I);
    Dev<uint16_t> dDX16(N * I);
    dgrad(false, dx.data(), dx16.data());
    dgrad(true, dDX.p, dDX16.p);
    compare_rows(r, "dx16", widen(dDX16.download()), widen(dx16), I, 1, kBf16Ulp);
    also(r);
  });
}

// (check_fp8_residual, described above) Run twice, as check_fp8_bf16_output: through the
// epilogue, and with set_fp8_residual_epilogue(false) ("fp32+add", the fallback where
// cuBLASLt has no algorithm reading a C apart from D: the product into y, then add).
template <class F>
void check_fp8_residual(const char* op, const std::string& shape, CudaBackend& gpu, int64_t n,
                        int64_t cols, double scale, F&& fwd) {
  epilogue_and_fallback(
      op, shape, " fp32+add", [&](bool on) { gpu.set_fp8_residual_epilogue(on); },
      [&] { return gpu.fp8_residual_fallbacks(); },
      "no residual-reading algorithm at this shape: fp32 + add; ", [&](Result& r) {
        const std::vector<float> R = randn(n);
        std::vector<float> y(n);
        Dev<float> dY(n), dR(R);
        fwd(false, y.data(), R.data());
        fwd(true, dY.p, dR.p);
        compare_rows(r, "y", dY.download(), y, cols, scale);
        expect_floats(r, "R", dR.download(), R);
      },
      lt_refuses_out_of_place());
}

// The CPU twin's side of a fused SwiGLU backward case: its swiglu_backward_bf16 codes within one
// bf16 ulp of the device's dg, du codes (gdgu; its vectorised exp against CUDA's expf), then its
// two Linear backwards on the device's codes (dyq, wq, xq as the CPU takes them; their amax
// slots written through them) against the device's dx and dw at the Linears' tolerance.
void check_swiglu_backward_twin(Result& r, Backend& cpu, const std::vector<uint16_t>& gdgu,
                                const Bf16Input& dsb, const Bf16Input& gb, const Bf16Input& ub,
                                const Backend::Fp8Operand (&dyq)[2][2], const float* const cw[2],
                                const Backend::Fp8Operand (&wq)[2],
                                const Backend::Fp8Operand (&xq)[2],
                                const std::array<std::vector<float>, 2>& dw0, int64_t N,
                                int64_t I, int64_t O, std::vector<float>& cpu_work,
                                Dev<float>& fdx, Dev<float>& fdw0, Dev<float>& fdw1) {
  std::vector<uint16_t> cdgu(2 * N * O);
  cpu.swiglu_backward_bf16(cdgu.data(), cdgu.data() + N * O, dsb.codes.data(), gb.codes.data(),
                           ub.codes.data(), N * O);
  compare_rows(r, "dg, du codes", widen(gdgu), widen(cdgu), O, 1, kBf16Ulp);
  std::vector<float> cdx(N * I);
  auto cdw = dw0;
  for (int k = 0; k < 2; ++k) {
    Backend::Fp8Operand dgrad = dyq[k][0], wgrad = dyq[k][1];
    dgrad.bf16 = wgrad.bf16 = gdgu.data() + k * N * O;
    cpu.fp8_linear_backward(cdx.data(), cdw[k].data(), nullptr, dgrad, cw[k], wq[k], wgrad,
                            nullptr, xq[k], N, I, O, k == 1, cpu_work.data());
  }
  compare_rows(r, "dx", fdx.download(), cdx, I);
  compare_rows(r, "dw gate", fdw0.download(), cdw[0], I);
  compare_rows(r, "dw up", fdw1.download(), cdw[1], I);
}

// The per-tensor FP8 Linears (recipes fp8-current / fp8-delayed): CUDA's quantize kernels +
// cuBLASLt FP8 GEMMs against the CPU backend's reference form (the recipe's exact emulation:
// fp32 GEMM over the dequantized operands) on the same inputs. Both quantize to the same codes
// and scales (checked byte for byte in check_quantizers), so only the accumulation order
// differs: tolerance kFp8Gemm of each row's max |value| (compare_rows). Delayed scaling (a given
// scale, amax reported) and current scaling; the amax must be the CPU's exactly.
void check_fp8_linears(Backend& cpu, CudaBackend& gpu) {
  if (!gpu.fp8_tensor_cores()) {
    run_case("fp8_linear", "skipped", [&](Result& r) { r.note = "no FP8 tensor cores (sm < 8.9)"; });
    return;
  }
  for (auto [N, I, O] : std::vector<std::array<int64_t, 3>>{{16, 16, 16}, {64, 96, 48}, {512, 256, 768}, {256, 2048, 512}})
    for (int delayed = 0; delayed < 2; ++delayed) {
      const std::string shape = "N=" + std::to_string(N) + " in=" + std::to_string(I) +
                                " out=" + std::to_string(O) + (delayed ? " delayed" : " current");
      auto x = randn(N * I), w = randn(O * I, 0.05f), dy = randn(N * O, 1e-3f);
      Dev<float> dX(x), dW(w), dDY(dy);
      // Delayed scaling quantizes with a scale from earlier steps: take ones that saturate a
      // little (x) and underuse the range (w, dy), as stale scales do.
      auto op = [&](Format f, const std::vector<float>& v, float* amax) {
        Backend::Fp8Operand q;
        q.fmt = f;
        q.current = !delayed;
        q.scale = numerics::fp8_scale_from_amax(float(max_abs(v)), numerics::fp8_max(f)) *
                  (&v == &x ? 1.5f : 0.25f);
        q.amax = amax;
        return q;
      };
      Dev<float> gpu_work(size_t(N * I + O * I + N * O)), gpu_amax(2);
      std::vector<float> cpu_work(size_t(N * I + O * I + N * O)), cpu_amax(2);
      auto check_amax = [&](Result& r) {
        expect_floats(r, "amax", gpu_amax.download(), cpu_amax);
      };
      run_case("fp8_linear_forward", shape, [&](Result& r) {
        std::vector<float> y(N * O);
        Dev<float> dY(N * O);
        gpu_amax.poison();
        cpu.fp8_linear_forward(y.data(), x.data(), op(Format::kE4M3, x, &cpu_amax[0]), w.data(),
                               op(Format::kE4M3, w, &cpu_amax[1]), N, I, O, cpu_work.data());
        gpu.fp8_linear_forward(dY.p, dX.p, op(Format::kE4M3, x, gpu_amax.p), dW.p,
                               op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O, gpu_work.p);
        compare_rows(r, "y", dY.download(), y, O);
        check_amax(r);
      });
      for (int acc = 0; acc < 2; ++acc)
        run_case("fp8_linear_dgrad", shape + (acc ? " +=" : " ="), [&](Result& r) {
          auto dx = randn(N * I);
          Dev<float> dDX(N * I);
          if (acc) dDX.upload(dx);
          gpu_amax.poison();
          cpu.fp8_linear_dgrad(dx.data(), dy.data(), op(Format::kE5M2, dy, &cpu_amax[0]), w.data(),
                               op(Format::kE4M3, w, &cpu_amax[1]), N, I, O, acc, cpu_work.data());
          gpu.fp8_linear_dgrad(dDX.p, dDY.p, op(Format::kE5M2, dy, gpu_amax.p), dW.p,
                               op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O, acc, gpu_work.p);
          compare_rows(r, "dx", dDX.download(), dx, I);
          check_amax(r);
        });
      run_case("fp8_linear_wgrad", shape, [&](Result& r) {
        auto dw = randn(O * I, 1e-3f);
        Dev<float> dDW(dw);  // accumulates
        gpu_amax.poison();
        cpu.fp8_linear_wgrad(dw.data(), dy.data(), op(Format::kE5M2, dy, &cpu_amax[0]), x.data(),
                             op(Format::kE4M3, x, &cpu_amax[1]), N, I, O, cpu_work.data());
        gpu.fp8_linear_wgrad(dDW.p, dDY.p, op(Format::kE5M2, dy, gpu_amax.p), dX.p,
                             op(Format::kE4M3, x, gpu_amax.p + 1), N, I, O, gpu_work.p);
        compare_rows(r, "dw", dDW.download(), dw, I);
        check_amax(r);
      });
      const Bf16Input xb(x);  // x as bf16 codes: forward and the weight gradient read it
      run_case("fp8_linear_forward_bf16x", shape, [&](Result& r) {
        std::vector<float> y(N * O);
        Dev<float> dY(N * O);
        gpu_amax.poison();
        cpu.fp8_linear_forward(y.data(), xb.wide.data(), op(Format::kE4M3, x, &cpu_amax[0]),
                               w.data(), op(Format::kE4M3, w, &cpu_amax[1]), N, I, O,
                               cpu_work.data());
        gpu.fp8_linear_forward(dY.p, nullptr, xb.on_gpu(op(Format::kE4M3, x, gpu_amax.p)), dW.p,
                               op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O, gpu_work.p);
        compare_rows(r, "y", dY.download(), y, O);
        check_amax(r);
      });
      // x's amax as its producer took it (Fp8Operand::x_amax, the RMSNorm's; current scaling):
      // y and the amax slots bit for bit those of the operand's own pass, y against the CPU
      // twin (which checks that the amax given is x's); an amax 3x too large changes y, so the
      // one given is the one used (not 4x: a power of two scales every code exactly).
      if (!delayed)
        run_case("fp8_linear_forward_x_amax", shape, [&](Result& r) {
          const std::vector<float> amax{host_amax(xb.wide)}, amax3{3 * amax[0]};
          Dev<float> dA(amax), dA3(amax3), dY(N * O), dY0(N * O), dY3(N * O);
          std::vector<float> y(N * O);
          cpu.fp8_linear_forward(y.data(), nullptr,
                                 given_amax(xb.on_host(op(Format::kE4M3, x, &cpu_amax[0])),
                                            amax.data()),
                                 w.data(), op(Format::kE4M3, w, &cpu_amax[1]), N, I, O,
                                 cpu_work.data());
          gpu_amax.poison();
          gpu.fp8_linear_forward(dY0.p, nullptr, xb.on_gpu(op(Format::kE4M3, x, gpu_amax.p)),
                                 dW.p, op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O, gpu_work.p);
          const auto slots0 = gpu_amax.download();
          gpu_amax.poison();
          gpu.fp8_linear_forward(dY.p, nullptr,
                                 given_amax(xb.on_gpu(op(Format::kE4M3, x, gpu_amax.p)), dA.p),
                                 dW.p, op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O, gpu_work.p);
          const auto got = dY.download();
          expect_floats(r, "amax slots", gpu_amax.download(), slots0);
          compare_rows(r, "y vs cpu", got, y, O);
          check_amax(r);
          gpu.fp8_linear_forward(dY3.p, nullptr,
                                 given_amax(xb.on_gpu(op(Format::kE4M3, x, nullptr)), dA3.p),
                                 dW.p, op(Format::kE4M3, w, nullptr), N, I, O, gpu_work.p);
          expect_given_amax(r, "y", got, dY0.download(), dY3.download());
        });
      check_fp8_residual("fp8_linear_forward_residual", shape, gpu, N * O, O, 1,
                         [&](bool on_gpu, float* y, const float* R) {
        if (on_gpu)
          gpu.fp8_linear_forward(y, nullptr, xb.on_gpu(op(Format::kE4M3, x, gpu_amax.p)), dW.p,
                                 op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O, gpu_work.p,
                                 nullptr, R);
        else
          cpu.fp8_linear_forward(y, xb.wide.data(), op(Format::kE4M3, x, &cpu_amax[0]), w.data(),
                                 op(Format::kE4M3, w, &cpu_amax[1]), N, I, O, cpu_work.data(),
                                 nullptr, R);
      });
      check_fp8_bf16_output("fp8_linear_forward_bf16out", shape, gpu, N * O, O,
                            [&](bool on_gpu, float* y, uint16_t* y16) {
        if (on_gpu)
          gpu.fp8_linear_forward(y, nullptr, xb.on_gpu(op(Format::kE4M3, x, gpu_amax.p)), dW.p,
                                 op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O, gpu_work.p, y16);
        else
          cpu.fp8_linear_forward(y, xb.wide.data(), op(Format::kE4M3, x, &cpu_amax[0]), w.data(),
                                 op(Format::kE4M3, w, &cpu_amax[1]), N, I, O, cpu_work.data(), y16);
      });
      run_case("fp8_linear_wgrad_bf16x", shape, [&](Result& r) {
        auto dw = randn(O * I, 1e-3f);
        Dev<float> dDW(dw);
        gpu_amax.poison();
        cpu.fp8_linear_wgrad(dw.data(), dy.data(), op(Format::kE5M2, dy, &cpu_amax[0]),
                             xb.wide.data(), op(Format::kE4M3, x, &cpu_amax[1]), N, I, O,
                             cpu_work.data());
        gpu.fp8_linear_wgrad(dDW.p, dDY.p, op(Format::kE5M2, dy, gpu_amax.p), nullptr,
                             xb.on_gpu(op(Format::kE4M3, x, gpu_amax.p + 1)), N, I, O,
                             gpu_work.p);
        compare_rows(r, "dw", dDW.download(), dw, I);
        check_amax(r);
      });
      // The whole backward in one call: on CUDA dy's amax once and its codes in both layouts
      // from one read (fp8_codes_both), the amax recorded for both of dy's operands; the CPU
      // twin runs dgrad then wgrad. x as fp32, then as codes (the bf16 path).
      for (int codes = 0; codes < 2; ++codes)
        run_case("fp8_linear_backward", shape + (codes ? " x bf16" : ""), [&](Result& r) {
          auto dx = randn(N * I), dw = randn(O * I, 1e-3f);
          Dev<float> dDX(dx), dDW(dw), amax4(4);  // both accumulate (dx +=)
          std::vector<float> camax(4);
          const std::vector<float>& xin = codes ? xb.wide : x;
          cpu.fp8_linear_backward(dx.data(), dw.data(), dy.data(),
                                  op(Format::kE5M2, dy, &camax[0]), w.data(),
                                  op(Format::kE4M3, w, &camax[1]),
                                  op(Format::kE5M2, dy, &camax[2]), xin.data(),
                                  op(Format::kE4M3, x, &camax[3]), N, I, O, true,
                                  cpu_work.data());
          auto gx = op(Format::kE4M3, x, amax4.p + 3);
          if (codes) gx = xb.on_gpu(gx);
          gpu.fp8_linear_backward(dDX.p, dDW.p, dDY.p, op(Format::kE5M2, dy, amax4.p), dW.p,
                                  op(Format::kE4M3, w, amax4.p + 1),
                                  op(Format::kE5M2, dy, amax4.p + 2), codes ? nullptr : dX.p,
                                  gx, N, I, O, true, gpu_work.p);
          compare_rows(r, "dx", dDX.download(), dx, I);
          compare_rows(r, "dw", dDW.download(), dw, I);
          expect_floats(r, "amax", amax4.download(), camax);
        });
      // The bf16 path's gradients as codes: dy given as bf16 codes (Fp8Operand::bf16; the CPU
      // twin reads host codes through the same field), dx wanted as codes (dx16, out of the
      // GEMM's epilogue on CUDA; dx poisoned scratch). dx16 at the fp32 result's tolerance plus
      // one bf16 ulp; the amaxes exactly (of the codes' values).
      const Bf16Input dyb(dy);
      gpu_amax.poison();
      check_fp8_dgrad_codes("fp8_linear_dgrad_bf16dy", shape, N, I,
                            [&](bool on_gpu, float* dx, uint16_t* dx16) {
        if (on_gpu)
          gpu.fp8_linear_dgrad(dx, nullptr, dyb.on_gpu(op(Format::kE5M2, dy, gpu_amax.p)), dW.p,
                               op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O, false, gpu_work.p,
                               dx16);
        else
          cpu.fp8_linear_dgrad(dx, nullptr, dyb.on_host(op(Format::kE5M2, dy, &cpu_amax[0])),
                               w.data(), op(Format::kE4M3, w, &cpu_amax[1]), N, I, O, false,
                               cpu_work.data(), dx16);
      }, check_amax);
      run_case("fp8_linear_wgrad_bf16dy", shape, [&](Result& r) {
        auto dw = randn(O * I, 1e-3f);
        Dev<float> dDW(dw);
        gpu_amax.poison();
        cpu.fp8_linear_wgrad(dw.data(), nullptr, dyb.on_host(op(Format::kE5M2, dy, &cpu_amax[0])),
                             nullptr, xb.on_host(op(Format::kE4M3, x, &cpu_amax[1])), N, I, O,
                             cpu_work.data());
        gpu.fp8_linear_wgrad(dDW.p, nullptr, dyb.on_gpu(op(Format::kE5M2, dy, gpu_amax.p)),
                             nullptr, xb.on_gpu(op(Format::kE4M3, x, gpu_amax.p + 1)), N, I, O,
                             gpu_work.p);
        compare_rows(r, "dw", dDW.download(), dw, I);
        check_amax(r);
      });
      run_case("fp8_linear_backward", shape + " dy bf16 dx16", [&](Result& r) {
        auto dw = randn(O * I, 1e-3f);
        std::vector<float> dx(N * I), camax(4);
        std::vector<uint16_t> dx16(N * I);
        Dev<float> dDX(N * I), dDW(dw), amax4(4);
        Dev<uint16_t> dDX16(N * I);
        cpu.fp8_linear_backward(dx.data(), dw.data(), nullptr,
                                dyb.on_host(op(Format::kE5M2, dy, &camax[0])), w.data(),
                                op(Format::kE4M3, w, &camax[1]),
                                dyb.on_host(op(Format::kE5M2, dy, &camax[2])), nullptr,
                                xb.on_host(op(Format::kE4M3, x, &camax[3])), N, I, O, false,
                                cpu_work.data(), dx16.data());
        gpu.fp8_linear_backward(dDX.p, dDW.p, nullptr,
                                dyb.on_gpu(op(Format::kE5M2, dy, amax4.p)), dW.p,
                                op(Format::kE4M3, w, amax4.p + 1),
                                dyb.on_gpu(op(Format::kE5M2, dy, amax4.p + 2)), nullptr,
                                xb.on_gpu(op(Format::kE4M3, x, amax4.p + 3)), N, I, O, false,
                                gpu_work.p, dDX16.p);
        compare_rows(r, "dx16", widen(dDX16.download()), widen(dx16), I, 1, kBf16Ulp);
        compare_rows(r, "dw", dDW.download(), dw, I);
        expect_floats(r, "amax", amax4.download(), camax);
      });
      // x^T's codes saved by the forward (Fp8Operand::save_t: both layouts from one read of x
      // on CUDA) and taken by the backward (codes_t) in place of x: the saved bytes and decode
      // scale the CPU twin's, the forward's y and amax as without saving, and the backward's
      // dx, dw and amaxes (dy's; x's slot unwritten) as the backward reading x. x as fp32 and
      // as bf16 codes; alone, and as the first Linear of a shared input with a second reading
      // the kept codes (the bf16 path's q then k).
      for (int codes = 0; codes < 2; ++codes)
        for (int shared = 0; shared < 2; ++shared)
          run_case("fp8_linear_saved_xt", shape + (codes ? " x bf16" : "") +
                                              (shared ? " shared" : ""), [&](Result& r) {
            std::vector<float> y(N * O), y2(N * O), cscale(1), camax(2);
            std::vector<uint8_t> cxt(N * I);
            Dev<float> dY(N * O), dY2(N * O), gscale(1);
            Dev<uint8_t> gxt(N * I);
            gpu_amax.poison();
            const std::vector<float>& xin = codes ? xb.wide : x;
            saving_forward(cpu, shared, xin.data(), N, I, O, [&] {
              cpu.fp8_linear_forward(y.data(), xin.data(),
                                     saving(op(Format::kE4M3, x, &camax[0]), cxt.data(),
                                            cscale.data()),
                                     w.data(), op(Format::kE4M3, w, &camax[1]), N, I, O,
                                     cpu_work.data());
            }, [&] {
              cpu.fp8_linear_forward(y2.data(), xin.data(), op(Format::kE4M3, x, nullptr),
                                     w.data(), op(Format::kE4M3, w, nullptr), N, I, O,
                                     cpu_work.data());
            });
            const void* gid = codes ? static_cast<const void*>(xb.dev.p) : dX.p;
            auto gx = [&](Backend::Fp8Operand q) { return codes ? xb.on_gpu(q) : q; };
            const float* gxin = codes ? nullptr : dX.p;
            saving_forward(gpu, shared, gid, N, I, O, [&] {
              gpu.fp8_linear_forward(dY.p, gxin,
                                     saving(gx(op(Format::kE4M3, x, gpu_amax.p)), gxt.p,
                                            gscale.p),
                                     dW.p, op(Format::kE4M3, w, gpu_amax.p + 1), N, I, O,
                                     gpu_work.p);
            }, [&] {
              gpu.fp8_linear_forward(dY2.p, gxin, gx(op(Format::kE4M3, x, nullptr)), dW.p,
                                     op(Format::kE4M3, w, nullptr), N, I, O, gpu_work.p);
            });
            if (shared) compare_rows(r, "y (second)", dY2.download(), y2, O);
            compare_rows(r, "y", dY.download(), y, O);
            expect_bytes(r, "x^T codes", gxt.download(), cxt);
            expect_floats(r, "x^T scale_inv", gscale.download(), cscale);
            expect_floats(r, "amax", gpu_amax.download(), camax);
            // the backward: the saved codes for x (GPU's on the GPU, the CPU's on the CPU),
            // against the CPU twin reading x itself
            auto dx = randn(N * I), dw = randn(O * I, 1e-3f);
            std::vector<float> rdx = dx, rdw = dw, ramax(4, -1.0f), tamax(4, -1.0f);
            Dev<float> dDX(dx), dDW(dw), amax4(std::vector<float>(4, -1.0f));
            cpu.fp8_linear_backward(rdx.data(), rdw.data(), dy.data(),
                                    op(Format::kE5M2, dy, &ramax[0]), w.data(),
                                    op(Format::kE4M3, w, &ramax[1]),
                                    op(Format::kE5M2, dy, &ramax[2]), xin.data(),
                                    op(Format::kE4M3, x, nullptr), N, I, O, true,
                                    cpu_work.data());
            cpu.fp8_linear_backward(dx.data(), dw.data(), dy.data(),
                                    op(Format::kE5M2, dy, &tamax[0]), w.data(),
                                    op(Format::kE4M3, w, &tamax[1]),
                                    op(Format::kE5M2, dy, &tamax[2]), nullptr,
                                    from_codes(op(Format::kE4M3, x, &tamax[3]), cxt.data(),
                                               cscale.data()),
                                    N, I, O, true, cpu_work.data());
            // the CPU twin from the codes: the same dequantized values, so the same sums
            expect_floats(r, "cpu dx from codes", dx, rdx);
            expect_floats(r, "cpu dw from codes", dw, rdw);
            expect_floats(r, "cpu amax from codes", tamax, ramax);
            gpu.fp8_linear_backward(dDX.p, dDW.p, dDY.p, op(Format::kE5M2, dy, amax4.p), dW.p,
                                    op(Format::kE4M3, w, amax4.p + 1),
                                    op(Format::kE5M2, dy, amax4.p + 2), nullptr,
                                    from_codes(op(Format::kE4M3, x, amax4.p + 3), gxt.p,
                                               gscale.p),
                                    N, I, O, true, gpu_work.p);
            compare_rows(r, "dx", dDX.download(), rdx, I);
            compare_rows(r, "dw", dDW.download(), rdw, I);
            expect_floats(r, "backward amax", amax4.download(), ramax);
          });
      // The bf16 path's down projection with its input given as SwiGLU's operands
      // (Fp8Operand::swiglu_g / swiglu_u: the cast makes s = silu(g) u from g's and u's codes as
      // it reads them, x^T's codes saved): on CUDA bit for bit what swiglu_forward_bf16
      // followed by the forward on s's codes gives (y, x^T's codes, their scale, the amaxes),
      // the same math on the same device; that forward against the CPU twin on the GPU's own
      // s codes; and the twin's fused form against its unfused one, bit for bit.
      run_case("fp8_linear_forward_swiglu", shape, [&](Result& r) {
        const Bf16Input gb(randn(N * I, 2.0f)), ub(randn(N * I));
        auto sx = widen(gb.codes);  // stand-in values for the delayed scale: any will do
        Dev<float> dY(N * O), dY2(N * O), gs(1), gs2(1), amax_a(2), amax_b(2);
        Dev<uint8_t> gxt(N * I), gxt2(N * I);
        Dev<uint16_t> ds16(N * I);
        amax_a.poison();
        amax_b.poison();
        dY.poison();
        gxt.poison();
        gpu.fp8_linear_forward(dY.p, nullptr,
                               with_swiglu(saving(op(Format::kE4M3, sx, amax_a.p), gxt.p, gs.p),
                                           gb.dev.p, ub.dev.p),
                               dW.p, op(Format::kE4M3, w, amax_a.p + 1), N, I, O, gpu_work.p,
                               nullptr, dDY.p);  // (a residual [N, O], as the down projection adds)
        gpu.swiglu_forward_bf16(ds16.p, gb.dev.p, ub.dev.p, N * I);
        Backend::Fp8Operand sq = saving(op(Format::kE4M3, sx, amax_b.p), gxt2.p, gs2.p);
        sq.bf16 = ds16.p;
        gpu.fp8_linear_forward(dY2.p, nullptr, sq, dW.p, op(Format::kE4M3, w, amax_b.p + 1), N,
                               I, O, gpu_work.p, nullptr, dDY.p);
        expect_floats(r, "y (fused = unfused)", dY.download(), dY2.download());
        expect_bytes(r, "x^T codes (fused = unfused)", gxt.download(), gxt2.download());
        expect_floats(r, "x^T scale_inv (fused = unfused)", gs.download(), gs2.download());
        expect_floats(r, "amax (fused = unfused)", amax_a.download(), amax_b.download());
        // the CPU twin on the GPU's s codes, and its own fused form
        const std::vector<uint16_t> s16 = ds16.download();
        std::vector<float> y(N * O), y2(N * O), cs(1), cs2(1), camax(2), camax2(2);
        std::vector<uint8_t> cxt(N * I), cxt2(N * I);
        Backend::Fp8Operand cq = saving(op(Format::kE4M3, sx, &camax[0]), cxt.data(), cs.data());
        cq.bf16 = s16.data();
        cpu.fp8_linear_forward(y.data(), nullptr, cq, w.data(), op(Format::kE4M3, w, &camax[1]),
                               N, I, O, cpu_work.data(), nullptr, dy.data());
        compare_rows(r, "y", dY.download(), y, O);
        expect_bytes(r, "x^T codes", gxt.download(), cxt);
        expect_floats(r, "amax", amax_a.download(), camax);
        std::vector<uint16_t> cs16(N * I);
        cpu.swiglu_forward_bf16(cs16.data(), gb.codes.data(), ub.codes.data(), N * I);
        cq.bf16 = cs16.data();
        cpu.fp8_linear_forward(y.data(), nullptr, cq, w.data(), op(Format::kE4M3, w, &camax[1]),
                               N, I, O, cpu_work.data(), nullptr, dy.data());
        cpu.fp8_linear_forward(y2.data(), nullptr,
                               with_swiglu(saving(op(Format::kE4M3, sx, &camax2[0]),
                                                  cxt2.data(), cs2.data()),
                                           gb.codes.data(), ub.codes.data()),
                               w.data(), op(Format::kE4M3, w, &camax2[1]), N, I, O,
                               cpu_work.data(), nullptr, dy.data());
        expect_floats(r, "cpu y (fused = unfused)", y2, y);
        expect_bytes(r, "cpu x^T codes (fused = unfused)", cxt2, cxt);
        expect_floats(r, "cpu amax (fused = unfused)", camax2, camax);
      });
      // Gate's and up's backward from SwiGLU's (fp8_swiglu_backward; here C = in, I = out):
      // on CUDA dg's and du's FP8 operands in both layouts from one read of ds, g and u, bit
      // for bit what the reference form (swiglu_backward_bf16, then fp8_linear_backward twice)
      // gives on the same device: dx, both dw and every amax slot; against the CPU twin as
      // the block recipes' cases (check_swiglu_backward_twin): the twin's dg, du codes within
      // one bf16 ulp of the device's (a code one ulp apart flips that element's FP8 code, which
      // moved a row of dx 28x past the Linears' tolerance on one seed), then the twin's two
      // Linear backwards on the device's codes at that tolerance, every amax slot exactly. Under delayed scaling the weight gradients' scales differ from
      // the data gradients'. x as bf16 codes, then as x^T's kept codes (codes_t) from a saving
      // forward.
      for (int kept = 0; kept < 2; ++kept)
        run_case("fp8_swiglu_backward", shape + (kept ? " x^T kept" : ""), [&](Result& r) {
          const Bf16Input dsb(randn(N * O, 1e-3f)), gb(randn(N * O, 2.0f)), ub(randn(N * O));
          auto w2 = randn(O * I, 0.05f);
          Dev<float> dW2(w2);
          const float* const gw[2] = {dW.p, dW2.p};
          const float* const cw[2] = {w.data(), w2.data()};
          auto dws = [&] { return std::array<std::vector<float>, 2>{randn(O * I, 1e-3f),
                                                                    randn(O * I, 1e-3f)}; };
          const auto dw0 = dws();
          // x^T's kept codes (and their scale), made by a saving forward on each side
          Dev<uint8_t> gxt(N * I);
          Dev<float> gxs(1), scratch_y(N * O);
          std::vector<uint8_t> cxt(N * I);
          std::vector<float> cxs(1), cy(N * O);
          if (kept) {
            Backend::Fp8Operand q = op(Format::kE4M3, x, nullptr);
            q.save_t = gxt.p;
            q.save_t_scale_inv = gxs.p;
            gpu.fp8_linear_forward(scratch_y.p, nullptr, xb.on_gpu(q), dW.p,
                                   op(Format::kE4M3, w, nullptr), N, I, O, gpu_work.p);
            q.save_t = cxt.data();
            q.save_t_scale_inv = cxs.data();
            cpu.fp8_linear_forward(cy.data(), nullptr, xb.on_host(q), w.data(),
                                   op(Format::kE4M3, w, nullptr), N, I, O, cpu_work.data());
          }
          // slots: dy's [k][j] at 2k + j, W's at 4 + k, x's at 6 + k
          auto operands = [&](float* slots, bool on_gpu, Backend::Fp8Operand (&dyq)[2][2],
                              Backend::Fp8Operand (&wq)[2], Backend::Fp8Operand (&xq)[2]) {
            for (int k = 0; k < 2; ++k) {
              for (int j = 0; j < 2; ++j) {
                dyq[k][j] = op(Format::kE5M2, dy, slots + 2 * k + j);
                if (j == 1) dyq[k][j].scale *= 0.5f;  // (delayed: another scale)
              }
              wq[k] = op(Format::kE4M3, k ? w2 : w, slots + 4 + k);
              xq[k] = op(Format::kE4M3, x, slots + 6 + k);
              if (kept) {
                xq[k].codes_t = on_gpu ? gxt.p : cxt.data();
                xq[k].codes_t_scale_inv = on_gpu ? gxs.p : cxs.data();
                xq[k].amax = nullptr;  // (the model copies the forward's)
              } else {
                xq[k] = on_gpu ? xb.on_gpu(xq[k]) : xb.on_host(xq[k]);
              }
            }
          };
          Backend::Fp8Operand dyq[2][2], wq[2], xq[2];
          // the GPU, fused
          Dev<float> fdx(N * I), fdw0(dw0[0]), fdw1(dw0[1]), famax(std::vector<float>(8, -1.0f));
          Dev<uint16_t> dgu(2 * N * O);
          fdx.poison();
          operands(famax.p, true, dyq, wq, xq);
          float* const fdw[2] = {fdw0.p, fdw1.p};
          gpu.fp8_swiglu_backward(fdx.p, fdw, dsb.dev.p, gb.dev.p, ub.dev.p, gw, wq, dyq, xq, N, I,
                                  O, dgu.p, gpu_work.p);
          // the GPU, the reference form
          Dev<float> rdx(N * I), rdw0(dw0[0]), rdw1(dw0[1]), ramax(std::vector<float>(8, -1.0f));
          rdx.poison();
          operands(ramax.p, true, dyq, wq, xq);
          float* const rdw[2] = {rdw0.p, rdw1.p};
          gpu.Backend::fp8_swiglu_backward(rdx.p, rdw, dsb.dev.p, gb.dev.p, ub.dev.p, gw, wq, dyq,
                                           xq, N, I, O, dgu.p, gpu_work.p);
          expect_floats(r, "dx (fused = reference)", fdx.download(), rdx.download());
          expect_floats(r, "dw gate (fused = reference)", fdw0.download(), rdw0.download());
          expect_floats(r, "dw up (fused = reference)", fdw1.download(), rdw1.download());
          expect_floats(r, "amax (fused = reference)", famax.download(), ramax.download());
          // the CPU twin on the device's (the reference form's) dg, du codes
          std::vector<float> camax(8, -1.0f);
          operands(camax.data(), false, dyq, wq, xq);
          check_swiglu_backward_twin(r, cpu, dgu.download(), dsb, gb, ub, dyq, cw, wq, xq, dw0,
                                     N, I, O, cpu_work, fdx, fdw0, fdw1);
          expect_floats(r, "amax", famax.download(), camax);
        });
    }
}

// A Linear's whole backward in one call (fp8_linear_backward; CUDA: dy read once for both of
// its operands) against the CPU's two calls: dy in fp32 with dx accumulated, and dy as bf16
// codes with dx as codes (dx16); x as codes in both. dg, wg: dy's operands for the data and
// weight gradients; wq, xq: W's and x's.
void check_backward_once(const std::string& op, const std::string& shape, Backend& cpu,
                         CudaBackend& gpu, int64_t N, int64_t I, int64_t O,
                         const std::vector<float>& dy, const Dev<float>& dDY,
                         const std::vector<float>& w, const Dev<float>& dW, const Bf16Input& dyb,
                         const Bf16Input& xb, const Backend::Fp8Operand& dg,
                         const Backend::Fp8Operand& wq, const Backend::Fp8Operand& wg,
                         const Backend::Fp8Operand& xq) {
  Dev<float> gpu_work(size_t(N * I + O * I + N * O));
  std::vector<float> cpu_work(size_t(N * I + O * I + N * O));
  for (int codes = 0; codes < 2; ++codes)
    run_case(op, shape + (codes ? " dy bf16 dx16" : " +="), [&](Result& r) {
      auto dx = randn(N * I), dw = randn(O * I, 1e-3f);
      std::vector<uint16_t> dx16(N * I);
      Dev<float> dDX(dx), dDW(dw);
      Dev<uint16_t> dDX16(N * I);
      auto on = [&](const Backend::Fp8Operand& q, bool gpu_side) {
        return codes ? (gpu_side ? dyb.on_gpu(q) : dyb.on_host(q)) : q;
      };
      cpu.fp8_linear_backward(dx.data(), dw.data(), codes ? nullptr : dy.data(), on(dg, false),
                              w.data(), wq, on(wg, false), nullptr, xb.on_host(xq), N, I, O,
                              !codes, cpu_work.data(), codes ? dx16.data() : nullptr);
      gpu.fp8_linear_backward(dDX.p, dDW.p, codes ? nullptr : dDY.p, on(dg, true), dW.p, wq,
                              on(wg, true), nullptr, xb.on_gpu(xq), N, I, O, !codes, gpu_work.p,
                              codes ? dDX16.p : nullptr);
      if (codes) compare_rows(r, "dx16", widen(dDX16.download()), widen(dx16), I, 1, kBf16Ulp);
      else compare_rows(r, "dx", dDX.download(), dx, I);
      compare_rows(r, "dw", dDW.download(), dw, I);
    });
}

// x^T's codes kept by a block-scaled forward (Fp8Operand::save_t under fp8-block 1x128 or
// mxfp8 1x32: CUDA writes the weight gradient's 128x1 / 32x1 codes and raw scales from the same
// read as the row codes) and taken by the backward (codes_t) in place of x: the saved bytes and
// scales the CPU twin's byte for byte, y as the twin's (and, shared, a second Linear reading the
// kept row codes); the twin's backward from its codes bit for bit the twin reading x; the
// device's backward from its codes against that. x as fp32 and as bf16 codes. xf: the forward
// input's cut; wf, W's; dg, wg, wb, xb_q: the backward's dy (data, weight gradient), W and x.
void check_saved_xt_blocks(const std::string& op, const std::string& shape, Backend& cpu,
                           CudaBackend& gpu, int64_t N, int64_t I, int64_t O,
                           const std::vector<float>& x, const Dev<float>& dX, const Bf16Input& xb,
                           const std::vector<float>& w, const Dev<float>& dW,
                           const std::vector<float>& dy, const Dev<float>& dDY,
                           const Backend::Fp8Operand& xf, const Backend::Fp8Operand& wf,
                           const Backend::Fp8Operand& dg, const Backend::Fp8Operand& wb,
                           const Backend::Fp8Operand& wg, const Backend::Fp8Operand& xw) {
  Dev<float> gpu_work(size_t(N * I + O * I + N * O));
  std::vector<float> cpu_work(size_t(N * I + O * I + N * O));
  const int64_t sb = xf.xt_scale_bytes(N, I);
  for (int codes = 0; codes < 2; ++codes)
    for (int shared = 0; shared < 2; ++shared)
      run_case(op, shape + (codes ? " x bf16" : "") + (shared ? " shared" : ""), [&](Result& r) {
        if (sb <= 0) {
          r.pass = false;
          r.note = "the forward's cut saves no x^T";
          return;
        }
        std::vector<float> y(N * O), y2(N * O), cs(size_t((sb + 3) / 4));
        std::vector<uint8_t> cxt(N * I);
        Dev<float> dY(N * O), dY2(N * O), gs(size_t((sb + 3) / 4));
        Dev<uint8_t> gxt(N * I);
        gxt.poison();
        gs.poison();
        dY.poison();
        const std::vector<float>& xin = codes ? xb.wide : x;
        saving_forward(cpu, shared, xin.data(), N, I, O, [&] {
          cpu.fp8_linear_forward(y.data(), xin.data(), saving(xf, cxt.data(), cs.data()),
                                 w.data(), wf, N, I, O, cpu_work.data());
        }, [&] {
          cpu.fp8_linear_forward(y2.data(), xin.data(), xf, w.data(), wf, N, I, O,
                                 cpu_work.data());
        });
        const void* gid = codes ? static_cast<const void*>(xb.dev.p) : dX.p;
        auto gx = [&](Backend::Fp8Operand q) { return codes ? xb.on_gpu(q) : q; };
        const float* gxin = codes ? nullptr : dX.p;
        saving_forward(gpu, shared, gid, N, I, O, [&] {
          gpu.fp8_linear_forward(dY.p, gxin, saving(gx(xf), gxt.p, gs.p), dW.p, wf, N, I, O,
                                 gpu_work.p);
        }, [&] { gpu.fp8_linear_forward(dY2.p, gxin, gx(xf), dW.p, wf, N, I, O, gpu_work.p); });
        if (shared) compare_rows(r, "y (second)", dY2.download(), y2, O);
        compare_rows(r, "y", dY.download(), y, O);
        expect_bytes(r, "x^T codes", gxt.download(), cxt);
        expect_bytes(r, "x^T scales", scale_bytes(gs.download(), sb), scale_bytes(cs, sb));
        auto dx = randn(N * I), dw = randn(O * I, 1e-3f);
        std::vector<float> rdx = dx, rdw = dw;
        Dev<float> dDX(dx), dDW(dw);
        cpu.fp8_linear_backward(rdx.data(), rdw.data(), dy.data(), dg, w.data(), wb, wg,
                                xin.data(), xw, N, I, O, true, cpu_work.data());
        cpu.fp8_linear_backward(dx.data(), dw.data(), dy.data(), dg, w.data(), wb, wg, nullptr,
                                from_codes(xw, cxt.data(), cs.data()), N, I, O, true,
                                cpu_work.data());
        expect_floats(r, "cpu dx from codes", dx, rdx);
        expect_floats(r, "cpu dw from codes", dw, rdw);
        gpu.fp8_linear_backward(dDX.p, dDW.p, dDY.p, dg, dW.p, wb, wg, nullptr,
                                from_codes(xw, gxt.p, gs.p), N, I, O, true, gpu_work.p);
        compare_rows(r, "dx", dDX.download(), rdx, I);
        compare_rows(r, "dw", dDW.download(), rdw, I);
        // the weight gradient alone (fp8_linear_wgrad) from the kept codes too
        auto dw2 = randn(O * I, 1e-3f);
        std::vector<float> rdw2 = dw2;
        Dev<float> dDW2(dw2);
        cpu.fp8_linear_wgrad(rdw2.data(), dy.data(), wg, xin.data(), xw, N, I, O,
                             cpu_work.data());
        gpu.fp8_linear_wgrad(dDW2.p, dDY.p, wg, nullptr, from_codes(xw, gxt.p, gs.p), N, I, O,
                             gpu_work.p);
        compare_rows(r, "dw (wgrad)", dDW2.download(), rdw2, I);
      });
}

// The block recipes' down projection with its input given as SwiGLU's operands
// (Fp8Operand::swiglu_g / swiglu_u, x^T's codes kept: CUDA's swiglu_forward_fp8_block /
// swiglu_forward_mxfp8 make s = silu(g) u from g's and u's codes as they read them): on the
// device bit for bit what swiglu_forward_bf16 then the saving forward on s's codes give (y with
// the residual, x^T's codes and scales), without swiglu_forward_bf16 running; the CPU twin on
// the device's s codes (y at tolerance, x^T's codes and scales byte for byte); the twin's own
// fused form bit for bit its unfused one. group: the recipe's block width (each group of
// columns its own magnitude, so each block its own scale).
void check_swiglu_forward_blocks(const std::string& op, const std::string& shape, Backend& cpu,
                                 CudaBackend& gpu, int64_t N, int64_t I, int64_t O,
                                 const std::vector<float>& w, const Dev<float>& dW,
                                 const Backend::Fp8Operand& xf, const Backend::Fp8Operand& wf,
                                 int64_t group) {
  run_case(op, shape, [&](Result& r) {
    Dev<float> gpu_work(size_t(N * I + O * I + N * O));
    std::vector<float> cpu_work(size_t(N * I + O * I + N * O));
    auto uv = randn(N * I);
    for (int64_t i = 0; i < N * I; ++i)
      uv[i] *= std::ldexp(1.0f, int((i / I) % 5) - int((i % I) / group % 3));
    const Bf16Input gb(randn(N * I, 2.0f)), ub(uv);
    const auto res = randn(N * O);
    Dev<float> dR(res);
    const int64_t sb = xf.xt_scale_bytes(N, I);
    const size_t sf = size_t((sb + 3) / 4);
    Dev<float> dY(N * O), dY2(N * O), gs(sf), gs2(sf);
    Dev<uint8_t> gxt(N * I), gxt2(N * I);
    Dev<uint16_t> ds16(N * I);
    dY.poison();
    gxt.poison();
    gs.poison();
    if (profiled_calls(gpu, "swiglu_forward_bf16", [&] {
          gpu.fp8_linear_forward(dY.p, nullptr,
                                 with_swiglu(saving(xf, gxt.p, gs.p), gb.dev.p, ub.dev.p), dW.p,
                                 wf, N, I, O, gpu_work.p, nullptr, dR.p);
        }) != 0) {
      r.pass = false;
      r.note += "s's codes were written (swiglu_forward_bf16 ran); ";
    }
    gpu.swiglu_forward_bf16(ds16.p, gb.dev.p, ub.dev.p, N * I);
    Backend::Fp8Operand sq = saving(xf, gxt2.p, gs2.p);
    sq.bf16 = ds16.p;
    gpu.fp8_linear_forward(dY2.p, nullptr, sq, dW.p, wf, N, I, O, gpu_work.p, nullptr, dR.p);
    expect_floats(r, "y (fused = unfused)", dY.download(), dY2.download());
    expect_bytes(r, "x^T codes (fused = unfused)", gxt.download(), gxt2.download());
    expect_bytes(r, "x^T scales (fused = unfused)", scale_bytes(gs.download(), sb),
                 scale_bytes(gs2.download(), sb));
    // the CPU twin on the device's s codes, and its own fused form
    const std::vector<uint16_t> s16 = ds16.download();
    std::vector<float> y(N * O), y2(N * O), cs(sf), cs2(sf);
    std::vector<uint8_t> cxt(N * I), cxt2(N * I);
    Backend::Fp8Operand cq = saving(xf, cxt.data(), cs.data());
    cq.bf16 = s16.data();
    cpu.fp8_linear_forward(y.data(), nullptr, cq, w.data(), wf, N, I, O, cpu_work.data(),
                           nullptr, res.data());
    compare_rows(r, "y", dY.download(), y, O);
    expect_bytes(r, "x^T codes", gxt.download(), cxt);
    expect_bytes(r, "x^T scales", scale_bytes(gs.download(), sb), scale_bytes(cs, sb));
    std::vector<uint16_t> cs16(N * I);
    cpu.swiglu_forward_bf16(cs16.data(), gb.codes.data(), ub.codes.data(), N * I);
    cq.bf16 = cs16.data();
    cpu.fp8_linear_forward(y.data(), nullptr, cq, w.data(), wf, N, I, O, cpu_work.data(),
                           nullptr, res.data());
    cpu.fp8_linear_forward(y2.data(), nullptr,
                           with_swiglu(saving(xf, cxt2.data(), cs2.data()), gb.codes.data(),
                                 ub.codes.data()),
                           w.data(), wf, N, I, O, cpu_work.data(), nullptr, res.data());
    expect_floats(r, "cpu y (fused = unfused)", y2, y);
    expect_bytes(r, "cpu x^T codes (fused = unfused)", cxt2, cxt);
    expect_bytes(r, "cpu x^T scales (fused = unfused)", scale_bytes(cs2, sb), scale_bytes(cs, sb));
  });
}

// fp8-block: the same three Linears with 1x128 / 128x1 / 128x128 E4M3 blocks (the recipe's
// shapes per operand) on tensor cores, against the CPU reference. Hopper (9.x): cuBLASLt's
// VEC128 / BLK128x128 modes, so this is also the test of their assumed scale layouts
// (LtGemm::fp8_block_gemm). Blackwell (10.x, where mxfp8 runs natively: the backend's two flags
// have the same condition): the MXFP8 GEMM with the block scales rewritten as E8M0
// (numerics/fp8_block_mx.h), exact, so the same tolerance. Either way a wrong layout puts wrong
// scales on blocks, far outside the tolerance, since the inputs' block amaxes differ.
// Gate's and up's backward from SwiGLU's under a block-scaled recipe (fp8_swiglu_backward; here
// C = in, I = out; dg, wg: dy's operands for the data and weight gradients, wq, xq: W's and
// x's): CUDA quantizes dg and du in both layouts from one read of ds, g and u
// (swiglu_backward_fp8_block, swiglu_backward_mxfp8), which the profile must show ran, bit for
// bit what the reference form (swiglu_backward_bf16, then fp8_linear_backward twice) gives on
// the same device. Against the CPU: the reference form's dg and du codes within one bf16 ulp
// of the twin's swiglu_backward_bf16 (CUDA's expf against the CPU's exp), and the twin's two
// Linear backwards on the device's codes at the Linears' tolerance (on its own codes a
// one-ulp difference can move a block's scale, and with it the whole block's codes). ds scaled
// by row and `group`-column group, so the blocks' scales differ.
void check_swiglu_backward_blocks(const std::string& op, const std::string& shape, Backend& cpu,
                                  CudaBackend& gpu, int64_t N, int64_t I, int64_t O,
                                  const std::vector<float>& w, const Dev<float>& dW,
                                  const Bf16Input& xb, const Backend::Fp8Operand& dg,
                                  const Backend::Fp8Operand& wq1, const Backend::Fp8Operand& wg,
                                  const Backend::Fp8Operand& xq1, int64_t group,
                                  Dev<float>& gpu_work, std::vector<float>& cpu_work) {
  run_case(op, shape, [&](Result& r) {
    auto ds = randn(N * O, 1e-3f);
    for (int64_t i = 0; i < N * O; ++i)
      ds[i] *= std::ldexp(1.0f, int((i / O) % 5) - int((i % O) / group % 3));
    const Bf16Input dsb(ds), gb(randn(N * O, 2.0f)), ub(randn(N * O));
    auto w2 = randn(O * I, 0.05f);
    Dev<float> dW2(w2);
    const float* const gw[2] = {dW.p, dW2.p};
    const float* const cw[2] = {w.data(), w2.data()};
    const auto dw0 = std::array<std::vector<float>, 2>{randn(O * I, 1e-3f), randn(O * I, 1e-3f)};
    Backend::Fp8Operand dyq[2][2] = {{dg, wg}, {dg, wg}};
    Backend::Fp8Operand wq[2] = {wq1, wq1};
    Backend::Fp8Operand gxq[2] = {xb.on_gpu(xq1), xb.on_gpu(xq1)};
    Backend::Fp8Operand cxq[2] = {xb.on_host(xq1), xb.on_host(xq1)};
    Dev<float> fdx(N * I), fdw0(dw0[0]), fdw1(dw0[1]);
    Dev<uint16_t> dgu(2 * N * O);
    fdx.poison();
    float* const fdw[2] = {fdw0.p, fdw1.p};
    const int64_t fused_calls =
        profiled_calls(gpu, "fp8_swiglu_backward (dg, du operands)", [&] {
          gpu.fp8_swiglu_backward(fdx.p, fdw, dsb.dev.p, gb.dev.p, ub.dev.p, gw, wq, dyq, gxq, N,
                                  I, O, dgu.p, gpu_work.p);
        });
    if (fused_calls != 1) {
      r.pass = false;
      r.note += "the fused operands ran " + std::to_string(fused_calls) + " times; ";
    }
    Dev<float> rdx(N * I), rdw0(dw0[0]), rdw1(dw0[1]);
    rdx.poison();
    float* const rdw[2] = {rdw0.p, rdw1.p};
    gpu.Backend::fp8_swiglu_backward(rdx.p, rdw, dsb.dev.p, gb.dev.p, ub.dev.p, gw, wq, dyq, gxq,
                                     N, I, O, dgu.p, gpu_work.p);
    expect_floats(r, "dx (fused = reference)", fdx.download(), rdx.download());
    expect_floats(r, "dw gate (fused = reference)", fdw0.download(), rdw0.download());
    expect_floats(r, "dw up (fused = reference)", fdw1.download(), rdw1.download());
    // the CPU twin on the reference form's dg, du codes
    check_swiglu_backward_twin(r, cpu, dgu.download(), dsb, gb, ub, dyq, cw, wq, cxq, dw0, N, I,
                               O, cpu_work, fdx, fdw0, fdw1);
  });
}

void check_fp8_block_linears(Backend& cpu, CudaBackend& gpu) {
  if (!gpu.fp8_block_tensor_cores()) {
    run_case("fp8_block_linear", "skipped", [&](Result& r) {
      r.note = "neither Hopper (sm_9x) nor Blackwell (sm_10x)";
    });
    return;
  }
  const std::string path = gpu.mxfp8_tensor_cores() ? " (mxfp8 gemm)" : " (vec128 gemm)";
  for (auto [N, I, O] : std::vector<std::array<int64_t, 3>>{{128, 128, 128}, {256, 384, 512}, {512, 1024, 256}}) {
    const std::string shape = "N=" + std::to_string(N) + " in=" + std::to_string(I) + " out=" + std::to_string(O) + path;
    auto x = randn(N * I), w = randn(O * I, 0.05f), dy = randn(N * O, 1e-3f);
    // Rows and columns of very different magnitude, so every block has its own scale.
    for (int64_t i = 0; i < N * I; ++i) x[i] *= std::ldexp(1.0f, int((i / I) % 7) - int((i % I) / 128));
    for (int64_t i = 0; i < O * I; ++i) w[i] *= std::ldexp(1.0f, int((i / I) / 128) - int((i % I) / 128));
    Dev<float> dX(x), dW(w), dDY(dy);
    auto blocks = [](int br, int bc) {
      Backend::Fp8Operand q;
      q.block_rows = br;
      q.block_cols = bc;
      return q;
    };
    Dev<float> gpu_work(size_t(N * I + O * I + N * O));
    std::vector<float> cpu_work(size_t(N * I + O * I + N * O));
    run_case("fp8_block_linear_forward", shape, [&](Result& r) {
      std::vector<float> y(N * O);
      Dev<float> dY(N * O);
      cpu.fp8_linear_forward(y.data(), x.data(), blocks(1, 128), w.data(), blocks(128, 128), N, I, O, cpu_work.data());
      gpu.fp8_linear_forward(dY.p, dX.p, blocks(1, 128), dW.p, blocks(128, 128), N, I, O, gpu_work.p);
      compare_rows(r, "y", dY.download(), y, O);
    });
    run_case("fp8_block_linear_dgrad", shape + " +=", [&](Result& r) {
      auto dx = randn(N * I);
      Dev<float> dDX(dx);
      cpu.fp8_linear_dgrad(dx.data(), dy.data(), blocks(1, 128), w.data(), blocks(128, 128), N, I, O, true, cpu_work.data());
      gpu.fp8_linear_dgrad(dDX.p, dDY.p, blocks(1, 128), dW.p, blocks(128, 128), N, I, O, true, gpu_work.p);
      compare_rows(r, "dx", dDX.download(), dx, I);
    });
    run_case("fp8_block_linear_wgrad", shape, [&](Result& r) {
      auto dw = randn(O * I, 1e-3f);
      Dev<float> dDW(dw);
      cpu.fp8_linear_wgrad(dw.data(), dy.data(), blocks(128, 1), x.data(), blocks(128, 1), N, I, O, cpu_work.data());
      gpu.fp8_linear_wgrad(dDW.p, dDY.p, blocks(128, 1), dX.p, blocks(128, 1), N, I, O, gpu_work.p);
      compare_rows(r, "dw", dDW.download(), dw, I);
    });
    const Bf16Input xb(x);
    run_case("fp8_block_linear_forward_bf16x", shape, [&](Result& r) {
      std::vector<float> y(N * O);
      Dev<float> dY(N * O);
      cpu.fp8_linear_forward(y.data(), xb.wide.data(), blocks(1, 128), w.data(), blocks(128, 128), N, I, O, cpu_work.data());
      gpu.fp8_linear_forward(dY.p, nullptr, xb.on_gpu(blocks(1, 128)), dW.p, blocks(128, 128), N, I, O, gpu_work.p);
      compare_rows(r, "y", dY.download(), y, O);
    });
    check_fp8_residual("fp8_block_linear_forward_residual", shape, gpu, N * O, O, 1,
                       [&](bool on_gpu, float* y, const float* R) {
      if (on_gpu)
        gpu.fp8_linear_forward(y, nullptr, xb.on_gpu(blocks(1, 128)), dW.p, blocks(128, 128), N, I, O, gpu_work.p, nullptr, R);
      else
        cpu.fp8_linear_forward(y, xb.wide.data(), blocks(1, 128), w.data(), blocks(128, 128), N, I, O, cpu_work.data(), nullptr, R);
    });
    check_fp8_bf16_output("fp8_block_linear_forward_bf16out", shape, gpu, N * O, O,
                          [&](bool on_gpu, float* y, uint16_t* y16) {
      if (on_gpu)
        gpu.fp8_linear_forward(y, nullptr, xb.on_gpu(blocks(1, 128)), dW.p, blocks(128, 128), N, I, O, gpu_work.p, y16);
      else
        cpu.fp8_linear_forward(y, xb.wide.data(), blocks(1, 128), w.data(), blocks(128, 128), N, I, O, cpu_work.data(), y16);
    });
    run_case("fp8_block_linear_wgrad_bf16x", shape, [&](Result& r) {
      auto dw = randn(O * I, 1e-3f);
      Dev<float> dDW(dw);
      cpu.fp8_linear_wgrad(dw.data(), dy.data(), blocks(128, 1), xb.wide.data(), blocks(128, 1), N, I, O, cpu_work.data());
      gpu.fp8_linear_wgrad(dDW.p, dDY.p, blocks(128, 1), nullptr, xb.on_gpu(blocks(128, 1)), N, I, O, gpu_work.p);
      compare_rows(r, "dw", dDW.download(), dw, I);
    });
    // dy as bf16 codes (the CPU twin on host codes), dx as codes (dx16): as the per-tensor cases
    const Bf16Input dyb(dy);
    check_fp8_dgrad_codes("fp8_block_linear_dgrad_bf16dy", shape, N, I, [&](bool on_gpu, float* dx, uint16_t* dx16) {
      if (on_gpu)
        gpu.fp8_linear_dgrad(dx, nullptr, dyb.on_gpu(blocks(1, 128)), dW.p, blocks(128, 128), N, I, O, false, gpu_work.p, dx16);
      else
        cpu.fp8_linear_dgrad(dx, nullptr, dyb.on_host(blocks(1, 128)), w.data(), blocks(128, 128), N, I, O, false, cpu_work.data(), dx16);
    });
    run_case("fp8_block_linear_wgrad_bf16dy", shape, [&](Result& r) {
      auto dw = randn(O * I, 1e-3f);
      Dev<float> dDW(dw);
      cpu.fp8_linear_wgrad(dw.data(), nullptr, dyb.on_host(blocks(128, 1)), nullptr, xb.on_host(blocks(128, 1)), N, I, O, cpu_work.data());
      gpu.fp8_linear_wgrad(dDW.p, nullptr, dyb.on_gpu(blocks(128, 1)), nullptr, xb.on_gpu(blocks(128, 1)), N, I, O, gpu_work.p);
      compare_rows(r, "dw", dDW.download(), dw, I);
    });
    // both GEMMs in one call (CUDA: fp8_block_backward)
    check_backward_once("fp8_block_linear_backward", shape, cpu, gpu, N, I, O, dy, dDY, w, dW,
                        dyb, xb, blocks(1, 128), blocks(128, 128), blocks(128, 1),
                        blocks(128, 1));
    check_saved_xt_blocks("fp8_block_linear_saved_xt", shape, cpu, gpu, N, I, O, x, dX, xb, w,
                          dW, dy, dDY, blocks(1, 128), blocks(128, 128), blocks(1, 128),
                          blocks(128, 128), blocks(128, 1), blocks(128, 1));
    check_swiglu_forward_blocks("fp8_block_linear_forward_swiglu", shape, cpu, gpu, N, I, O, w,
                                dW, blocks(1, 128), blocks(128, 128), 128);
    check_swiglu_backward_blocks("fp8_block_swiglu_backward", shape, cpu, gpu, N, I, O, w, dW,
                                 xb, blocks(1, 128), blocks(128, 128), blocks(128, 1),
                                 blocks(128, 1), 128, gpu_work, cpu_work);
  }
}

// mxfp8 (Blackwell): the three Linears with E4M3 in 1x32 blocks along each GEMM's reduction
// (columnwise 32x1 copies where it runs down the columns) and E8M0 scales in cuBLASLt's
// swizzled layout (VEC32_UE8M0), against the CPU reference (the recipe's exact emulation) on the
// same inputs: the same codes and scales (check_quantizers), so only the accumulation order
// differs: kFp8Gemm of each row's max |out|. Rows and 32-column groups of very different magnitude
// give every block its own scale, so a wrong scale layout fails far outside the tolerance. Shapes
// include
// row counts that are not multiples of 128 (padded scale tiles).
void check_mxfp8_linears(Backend& cpu, CudaBackend& gpu) {
  if (!gpu.mxfp8_tensor_cores()) {
    run_case("mxfp8_linear", "skipped", [&](Result& r) { r.note = "not Blackwell (sm_10x)"; });
    return;
  }
  for (auto [N, I, O] : std::vector<std::array<int64_t, 3>>{{32, 64, 96}, {96, 160, 224}, {256, 384, 512}, {512, 1024, 256}}) {
    const std::string shape = "N=" + std::to_string(N) + " in=" + std::to_string(I) + " out=" + std::to_string(O);
    auto x = randn(N * I), w = randn(O * I, 0.05f), dy = randn(N * O, 1e-3f);
    for (int64_t i = 0; i < N * I; ++i) x[i] *= std::ldexp(1.0f, int((i / I) % 7) - int((i % I) / 32 % 5));
    for (int64_t i = 0; i < O * I; ++i) w[i] *= std::ldexp(1.0f, int((i / I) / 32 % 3) - int((i % I) / 32 % 4));
    for (int64_t i = 0; i < N * O; ++i) dy[i] *= std::ldexp(1.0f, int((i / O) / 32 % 4) - int((i % O) % 3));
    Dev<float> dX(x), dW(w), dDY(dy);
    auto mx = [](bool colwise) {
      Backend::Fp8Operand q;
      q.mx = true;
      q.block_rows = colwise ? 32 : 1;
      q.block_cols = colwise ? 1 : 32;
      return q;
    };
    Dev<float> gpu_work(size_t(N * I + O * I + N * O));
    std::vector<float> cpu_work(size_t(N * I + O * I + N * O));
    run_case("mxfp8_linear_forward", shape, [&](Result& r) {
      std::vector<float> y(N * O);
      Dev<float> dY(N * O);
      cpu.fp8_linear_forward(y.data(), x.data(), mx(false), w.data(), mx(false), N, I, O, cpu_work.data());
      gpu.fp8_linear_forward(dY.p, dX.p, mx(false), dW.p, mx(false), N, I, O, gpu_work.p);
      compare_rows(r, "y", dY.download(), y, O);
    });
    for (int acc = 0; acc < 2; ++acc)
      run_case("mxfp8_linear_dgrad", shape + (acc ? " +=" : " ="), [&](Result& r) {
        auto dx = randn(N * I);
        Dev<float> dDX(N * I);
        if (acc) dDX.upload(dx);
        cpu.fp8_linear_dgrad(dx.data(), dy.data(), mx(false), w.data(), mx(true), N, I, O, acc, cpu_work.data());
        gpu.fp8_linear_dgrad(dDX.p, dDY.p, mx(false), dW.p, mx(true), N, I, O, acc, gpu_work.p);
        compare_rows(r, "dx", dDX.download(), dx, I);
      });
    run_case("mxfp8_linear_wgrad", shape, [&](Result& r) {
      auto dw = randn(O * I, 1e-3f);
      Dev<float> dDW(dw);  // accumulates
      cpu.fp8_linear_wgrad(dw.data(), dy.data(), mx(true), x.data(), mx(true), N, I, O, cpu_work.data());
      gpu.fp8_linear_wgrad(dDW.p, dDY.p, mx(true), dX.p, mx(true), N, I, O, gpu_work.p);
      compare_rows(r, "dw", dDW.download(), dw, I);
    });
    const Bf16Input xb(x);
    run_case("mxfp8_linear_forward_bf16x", shape, [&](Result& r) {
      std::vector<float> y(N * O);
      Dev<float> dY(N * O);
      cpu.fp8_linear_forward(y.data(), xb.wide.data(), mx(false), w.data(), mx(false), N, I, O, cpu_work.data());
      gpu.fp8_linear_forward(dY.p, nullptr, xb.on_gpu(mx(false)), dW.p, mx(false), N, I, O, gpu_work.p);
      compare_rows(r, "y", dY.download(), y, O);
    });
    check_fp8_residual("mxfp8_linear_forward_residual", shape, gpu, N * O, O, 1,
                       [&](bool on_gpu, float* y, const float* R) {
      if (on_gpu)
        gpu.fp8_linear_forward(y, nullptr, xb.on_gpu(mx(false)), dW.p, mx(false), N, I, O, gpu_work.p, nullptr, R);
      else
        cpu.fp8_linear_forward(y, xb.wide.data(), mx(false), w.data(), mx(false), N, I, O, cpu_work.data(), nullptr, R);
    });
    check_fp8_bf16_output("mxfp8_linear_forward_bf16out", shape, gpu, N * O, O,
                          [&](bool on_gpu, float* y, uint16_t* y16) {
      if (on_gpu)
        gpu.fp8_linear_forward(y, nullptr, xb.on_gpu(mx(false)), dW.p, mx(false), N, I, O, gpu_work.p, y16);
      else
        cpu.fp8_linear_forward(y, xb.wide.data(), mx(false), w.data(), mx(false), N, I, O, cpu_work.data(), y16);
    });
    run_case("mxfp8_linear_wgrad_bf16x", shape, [&](Result& r) {
      auto dw = randn(O * I, 1e-3f);
      Dev<float> dDW(dw);
      cpu.fp8_linear_wgrad(dw.data(), dy.data(), mx(true), xb.wide.data(), mx(true), N, I, O, cpu_work.data());
      gpu.fp8_linear_wgrad(dDW.p, dDY.p, mx(true), nullptr, xb.on_gpu(mx(true)), N, I, O, gpu_work.p);
      compare_rows(r, "dw", dDW.download(), dw, I);
    });
    // dy as bf16 codes (the CPU twin on host codes), dx as codes (dx16): as the per-tensor cases
    const Bf16Input dyb(dy);
    check_fp8_dgrad_codes("mxfp8_linear_dgrad_bf16dy", shape, N, I, [&](bool on_gpu, float* dx, uint16_t* dx16) {
      if (on_gpu)
        gpu.fp8_linear_dgrad(dx, nullptr, dyb.on_gpu(mx(false)), dW.p, mx(true), N, I, O, false, gpu_work.p, dx16);
      else
        cpu.fp8_linear_dgrad(dx, nullptr, dyb.on_host(mx(false)), w.data(), mx(true), N, I, O, false, cpu_work.data(), dx16);
    });
    run_case("mxfp8_linear_wgrad_bf16dy", shape, [&](Result& r) {
      auto dw = randn(O * I, 1e-3f);
      Dev<float> dDW(dw);
      cpu.fp8_linear_wgrad(dw.data(), nullptr, dyb.on_host(mx(true)), nullptr, xb.on_host(mx(true)), N, I, O, cpu_work.data());
      gpu.fp8_linear_wgrad(dDW.p, nullptr, dyb.on_gpu(mx(true)), nullptr, xb.on_gpu(mx(true)), N, I, O, gpu_work.p);
      compare_rows(r, "dw", dDW.download(), dw, I);
    });
    // both GEMMs in one call (CUDA: mxfp8_backward)
    check_backward_once("mxfp8_linear_backward", shape, cpu, gpu, N, I, O, dy, dDY, w, dW, dyb,
                        xb, mx(false), mx(true), mx(true), mx(true));
    check_saved_xt_blocks("mxfp8_linear_saved_xt", shape, cpu, gpu, N, I, O, x, dX, xb, w, dW,
                          dy, dDY, mx(false), mx(false), mx(false), mx(true), mx(true), mx(true));
    check_swiglu_forward_blocks("mxfp8_linear_forward_swiglu", shape, cpu, gpu, N, I, O, w, dW,
                                mx(false), mx(false), 32);
    check_swiglu_backward_blocks("mxfp8_swiglu_backward", shape, cpu, gpu, N, I, O, w, dW, xb,
                                 mx(false), mx(true), mx(true), mx(true), 32, gpu_work,
                                 cpu_work);
  }
}

// nvfp4 (Blackwell): the three Linears with E2M1 codes in 16-element blocks along each GEMM's
// reduction (16x16 for the weight, transposed on the device for the data gradient), UE4M3
// scales swizzled for VEC16_UE4M3, the two global scales folded into alpha; stochastic rounding
// on the gradients and the 16-point RHT on both weight-gradient operands, as the recipe does
// them. Against the CPU reference form (the recipe's exact emulation): the same codes and
// scales (check_quantizers' quant_nvfp4_gemm_operand*), so only the accumulation order and the
// place of the global scale (alpha instead of each dequantized value) differ: 3 kFp8Gemm of
// each row's max |out|.
// Rows and 16-column groups of very different magnitude give each block its own scale, so a
// wrong scale layout fails far outside the tolerance.
void check_nvfp4_linears(Backend& cpu, CudaBackend& gpu) {
  if (!gpu.nvfp4_tensor_cores()) {
    run_case("nvfp4_linear", "skipped", [&](Result& r) { r.note = "not Blackwell (sm_10x)"; });
    return;
  }
  for (auto [N, I, O] : std::vector<std::array<int64_t, 3>>{{32, 64, 96}, {96, 160, 224}, {256, 384, 512}, {512, 1024, 256}}) {
    const std::string shape = "N=" + std::to_string(N) + " in=" + std::to_string(I) + " out=" + std::to_string(O);
    auto x = randn(N * I), w = randn(O * I, 0.05f), dy = randn(N * O, 1e-3f);
    for (int64_t i = 0; i < N * I; ++i) x[i] *= std::ldexp(1.0f, int((i / I) % 7) - int((i % I) / 16 % 5));
    for (int64_t i = 0; i < O * I; ++i) w[i] *= std::ldexp(1.0f, int((i / I) / 16 % 3) - int((i % I) / 16 % 4));
    for (int64_t i = 0; i < N * O; ++i) dy[i] *= std::ldexp(1.0f, int((i / O) / 16 % 4) - int((i % O) % 3));
    Dev<float> dX(x), dW(w), dDY(dy);
    auto fp4 = [](int br, int bc, bool gradient, uint32_t tensor_id) {
      Backend::Fp8Operand q;
      q.nvfp4 = true;
      q.block_rows = br;
      q.block_cols = bc;
      if (gradient) {
        q.rounding.stochastic = true;
        q.rounding.rng = {11, 2, 0, tensor_id};
      }
      return q;
    };
    auto rht = [](Backend::Fp8Operand q) {
      q.rht = true;
      q.rht_seed = 0x5eedu;
      return q;
    };
    Dev<float> gpu_work(size_t(N * I + O * I + N * O));
    std::vector<float> cpu_work(size_t(N * I + O * I + N * O));
    run_case("nvfp4_linear_forward", shape, [&](Result& r) {
      std::vector<float> y(N * O);
      Dev<float> dY(N * O);
      cpu.fp8_linear_forward(y.data(), x.data(), fp4(1, 16, false, 0), w.data(), fp4(16, 16, false, 1), N, I, O, cpu_work.data());
      gpu.fp8_linear_forward(dY.p, dX.p, fp4(1, 16, false, 0), dW.p, fp4(16, 16, false, 1), N, I, O, gpu_work.p);
      compare_rows(r, "y", dY.download(), y, O, 3);
    });
    check_fp8_residual("nvfp4_linear_forward_residual", shape, gpu, N * O, O, 3,
                       [&](bool on_gpu, float* y, const float* R) {
      if (on_gpu)
        gpu.fp8_linear_forward(y, dX.p, fp4(1, 16, false, 0), dW.p, fp4(16, 16, false, 1), N, I, O, gpu_work.p, nullptr, R);
      else
        cpu.fp8_linear_forward(y, x.data(), fp4(1, 16, false, 0), w.data(), fp4(16, 16, false, 1), N, I, O, cpu_work.data(), nullptr, R);
    });
    for (int acc = 0; acc < 2; ++acc)
      run_case("nvfp4_linear_dgrad", shape + (acc ? " +=" : " ="), [&](Result& r) {
        auto dx = randn(N * I);
        Dev<float> dDX(N * I);
        if (acc) dDX.upload(dx);
        cpu.fp8_linear_dgrad(dx.data(), dy.data(), fp4(1, 16, true, 2), w.data(), fp4(16, 16, false, 3), N, I, O, acc, cpu_work.data());
        gpu.fp8_linear_dgrad(dDX.p, dDY.p, fp4(1, 16, true, 2), dW.p, fp4(16, 16, false, 3), N, I, O, acc, gpu_work.p);
        compare_rows(r, "dx", dDX.download(), dx, I, 3);
      });
    run_case("nvfp4_linear_wgrad_rht", shape, [&](Result& r) {
      auto dw = randn(O * I, 1e-3f);
      Dev<float> dDW(dw);  // accumulates
      cpu.fp8_linear_wgrad(dw.data(), dy.data(), rht(fp4(16, 1, true, 4)), x.data(), rht(fp4(16, 1, false, 5)), N, I, O, cpu_work.data());
      gpu.fp8_linear_wgrad(dDW.p, dDY.p, rht(fp4(16, 1, true, 4)), dX.p, rht(fp4(16, 1, false, 5)), N, I, O, gpu_work.p);
      compare_rows(r, "dw", dDW.download(), dw, I, 3);
    });
    // x and dy as bf16 codes (the bf16 path: the quantizers read the codes, no widened copy),
    // against the CPU twin given the same codes
    const Bf16Input xb(x), dyb(dy);
    // y as bf16 codes out of the FP4 GEMM's epilogue (device-side beta 0: the codes zeroed
    // first), and the fp32 + round fallback
    check_fp8_bf16_output("nvfp4_linear_forward_bf16out", shape, gpu, N * O, O,
                          [&](bool on_gpu, float* y, uint16_t* y16) {
      const auto xq = fp4(1, 16, false, 0), wq = fp4(16, 16, false, 1);
      if (on_gpu)
        gpu.fp8_linear_forward(y, nullptr, xb.on_gpu(xq), dW.p, wq, N, I, O, gpu_work.p, y16);
      else
        cpu.fp8_linear_forward(y, nullptr, xb.on_host(xq), w.data(), wq, N, I, O,
                               cpu_work.data(), y16);
    }, 3);
    // A shared input (q, k and v reading one x): k and v take q's kept 1x16 quantization (codes,
    // scales, global scale) on both backends, 2 hits each, the outputs as the CPU's; x in fp32
    // and as codes
    for (int codes = 0; codes < 2; ++codes)
      run_case("nvfp4_linear_shared_input", shape + (codes ? " x bf16" : " x fp32"),
               [&](Result& r) {
        const int64_t cpu0 = cpu.shared_input_hits(), gpu0 = gpu.shared_input_hits();
        {
          SharedInputScope cs(cpu, codes ? static_cast<const void*>(xb.codes.data()) : x.data(),
                              N, I, O);
          SharedInputScope gs(gpu, codes ? static_cast<const void*>(xb.dev.p) : dX.p, N, I, O);
          for (int l = 0; l < 3; ++l) {
            const auto xq = fp4(1, 16, false, uint32_t(10 + l));  // each Linear its own stream
            std::vector<float> y(N * O);
            Dev<float> dY(N * O);
            cpu.fp8_linear_forward(y.data(), codes ? nullptr : x.data(),
                                   codes ? xb.on_host(xq) : xq, w.data(), fp4(16, 16, false, 1),
                                   N, I, O, cpu_work.data());
            gpu.fp8_linear_forward(dY.p, codes ? nullptr : dX.p, codes ? xb.on_gpu(xq) : xq,
                                   dW.p, fp4(16, 16, false, 1), N, I, O, gpu_work.p);
            compare_rows(r, tagged("y", l).c_str(), dY.download(), y, O, 3);
          }
        }
        expect_two_shared(r, cpu, gpu, cpu0, gpu0);
      });
    run_case("nvfp4_linear_forward", shape + " x bf16", [&](Result& r) {
      std::vector<float> y(N * O);
      Dev<float> dY(N * O);
      cpu.fp8_linear_forward(y.data(), nullptr, xb.on_host(fp4(1, 16, false, 0)), w.data(), fp4(16, 16, false, 1), N, I, O, cpu_work.data());
      gpu.fp8_linear_forward(dY.p, nullptr, xb.on_gpu(fp4(1, 16, false, 0)), dW.p, fp4(16, 16, false, 1), N, I, O, gpu_work.p);
      compare_rows(r, "y", dY.download(), y, O, 3);
    });
    // The global amax as x's producer took it (Fp8Operand::x_amax: the RMSNorm's), as in
    // check_fp8_linears: y bit for bit the operand's own pass's, against the CPU twin (which
    // checks the amax), and an amax 3x too large changes y.
    run_case("nvfp4_linear_forward", shape + " x bf16 x_amax", [&](Result& r) {
      const std::vector<float> amax{host_amax(xb.wide)}, amax3{3 * amax[0]};
      Dev<float> dA(amax), dA3(amax3), dY(N * O), dY0(N * O), dY3(N * O);
      std::vector<float> y(N * O);
      const auto xq = fp4(1, 16, false, 0), wq = fp4(16, 16, false, 1);
      cpu.fp8_linear_forward(y.data(), nullptr, given_amax(xb.on_host(xq), amax.data()), w.data(), wq, N, I, O, cpu_work.data());
      gpu.fp8_linear_forward(dY0.p, nullptr, xb.on_gpu(xq), dW.p, wq, N, I, O, gpu_work.p);
      gpu.fp8_linear_forward(dY.p, nullptr, given_amax(xb.on_gpu(xq), dA.p), dW.p, wq, N, I, O, gpu_work.p);
      gpu.fp8_linear_forward(dY3.p, nullptr, given_amax(xb.on_gpu(xq), dA3.p), dW.p, wq, N, I, O, gpu_work.p);
      const auto got = dY.download();
      expect_given_amax(r, "y", got, dY0.download(), dY3.download());
      compare_rows(r, "y vs cpu", got, y, O, 3);
    });
    // A weight's amax kept from the micro-batch's first cast of it (LlamaModel::weight_amax):
    // the forward's 16x16 cast writes max |W| into its slot (Fp8Operand::amax), y bit for bit
    // the forward's without one; the data gradient's W^T cast takes it (x_amax), dx bit for bit
    // its own amax pass's; both against the CPU twin (which writes the slot and checks the
    // amax it is given), and a given amax 3x too large changes dx.
    run_case("nvfp4_linear_weight_amax", shape, [&](Result& r) {
      const auto xq = fp4(1, 16, false, 0), dyq = fp4(1, 16, true, 2);
      auto wq = fp4(16, 16, false, 1), wq_host = wq;
      const std::vector<float> poison{-1.0f}, amax{host_amax(w)}, amax3{3 * amax[0]};
      Dev<float> dSlot(poison), dA3(amax3), dY(N * O), dY0(N * O);
      std::vector<float> slot = poison, y(N * O);
      wq.amax = dSlot.p;
      wq_host.amax = slot.data();
      gpu.fp8_linear_forward(dY0.p, dX.p, xq, dW.p, fp4(16, 16, false, 1), N, I, O, gpu_work.p);
      gpu.fp8_linear_forward(dY.p, dX.p, xq, dW.p, wq, N, I, O, gpu_work.p);
      cpu.fp8_linear_forward(y.data(), x.data(), xq, w.data(), wq_host, N, I, O, cpu_work.data());
      expect_floats(r, "y", dY.download(), dY0.download());
      compare_rows(r, "y vs cpu", dY.download(), y, O, 3);
      expect_floats(r, "W's amax", dSlot.download(), amax);
      expect_floats(r, "W's amax (cpu)", slot, amax);
      const auto wd = fp4(16, 16, false, 3);
      Dev<float> dDX(N * I), dDX0(N * I), dDX3(N * I);
      std::vector<float> dx(N * I);
      gpu.fp8_linear_dgrad(dDX0.p, dDY.p, dyq, dW.p, wd, N, I, O, false, gpu_work.p);
      gpu.fp8_linear_dgrad(dDX.p, dDY.p, dyq, dW.p, given_amax(wd, dSlot.p), N, I, O, false, gpu_work.p);
      gpu.fp8_linear_dgrad(dDX3.p, dDY.p, dyq, dW.p, given_amax(wd, dA3.p), N, I, O, false, gpu_work.p);
      cpu.fp8_linear_dgrad(dx.data(), dy.data(), dyq, w.data(), given_amax(wd, slot.data()), N, I, O, false, cpu_work.data());
      const auto got = dDX.download();
      expect_given_amax(r, "dx", got, dDX0.download(), dDX3.download());
      compare_rows(r, "dx vs cpu", got, dx, I, 3);
    });
    run_case("nvfp4_linear_dgrad", shape + " dy bf16 dx bf16", [&](Result& r) {
      std::vector<float> dx(N * I);
      std::vector<uint16_t> dx16(N * I);
      Dev<float> dDX(N * I);
      Dev<uint16_t> dDX16(N * I);
      cpu.fp8_linear_dgrad(dx.data(), nullptr, dyb.on_host(fp4(1, 16, true, 2)), w.data(), fp4(16, 16, false, 3), N, I, O, false, cpu_work.data(), dx16.data());
      gpu.fp8_linear_dgrad(dDX.p, nullptr, dyb.on_gpu(fp4(1, 16, true, 2)), dW.p, fp4(16, 16, false, 3), N, I, O, false, gpu_work.p, dDX16.p);
      compare_rows(r, "dx16", widen(dDX16.download()), widen(dx16), I, 3, kBf16Ulp);
    });
    // The whole backward in one call: dy's two operands from one read (quantize_nvfp4_both,
    // which the profile must show ran once), dx and dw bit for bit the two-call form's on the
    // same device (Backend::fp8_linear_backward: dgrad, then wgrad) and against the CPU's; dy
    // and x in fp32 (dx added to, or written) and as bf16 codes (dx as codes).
    for (int form = 0; form < 3; ++form)
      run_case("nvfp4_linear_backward", shape + (form == 0 ? " =" : form == 1 ? " +=" : " bf16"),
               [&](Result& r) {
        const bool codes = form == 2, acc = form == 1;
        const auto dyd = codes ? dyb.on_gpu(fp4(1, 16, true, 6)) : fp4(1, 16, true, 6);
        const auto dyw = codes ? dyb.on_gpu(rht(fp4(16, 1, true, 7))) : rht(fp4(16, 1, true, 7));
        const auto xw = codes ? xb.on_gpu(rht(fp4(16, 1, false, 8))) : rht(fp4(16, 1, false, 8));
        const auto wd = fp4(16, 16, false, 9);
        auto dx0 = randn(N * I);
        auto dw0 = randn(O * I, 1e-3f);
        std::vector<float> dx = dx0, dw = dw0;
        std::vector<uint16_t> dx16(N * I);
        cpu.fp8_linear_backward(dx.data(), dw.data(), codes ? nullptr : dy.data(),
                                codes ? dyb.on_host(fp4(1, 16, true, 6)) : fp4(1, 16, true, 6),
                                w.data(), wd,
                                codes ? dyb.on_host(rht(fp4(16, 1, true, 7))) : rht(fp4(16, 1, true, 7)),
                                codes ? nullptr : x.data(),
                                codes ? xb.on_host(rht(fp4(16, 1, false, 8))) : rht(fp4(16, 1, false, 8)),
                                N, I, O, acc, cpu_work.data(), codes ? dx16.data() : nullptr);
        auto run = [&](bool fused, Dev<float>& fdx, Dev<float>& fdw, Dev<uint16_t>& fdx16) {
          const float* dyp = codes ? nullptr : dDY.p;
          const float* xp = codes ? nullptr : dX.p;
          uint16_t* d16 = codes ? fdx16.p : nullptr;
          if (fused)
            gpu.fp8_linear_backward(fdx.p, fdw.p, dyp, dyd, dW.p, wd, dyw, xp, xw, N, I, O, acc,
                                    gpu_work.p, d16);
          else
            gpu.Backend::fp8_linear_backward(fdx.p, fdw.p, dyp, dyd, dW.p, wd, dyw, xp, xw, N, I,
                                             O, acc, gpu_work.p, d16);
        };
        Dev<float> fdx(dx0), fdw(dw0), rdx(dx0), rdw(dw0);
        Dev<uint16_t> fdx16(N * I), rdx16(N * I);
        const int64_t both =
            profiled_calls(gpu, "nvfp4_operand (dy both)", [&] { run(true, fdx, fdw, fdx16); });
        if (both != 1) {
          r.pass = false;
          r.note += "dy's two operands from one read ran " + std::to_string(both) + " times; ";
        }
        run(false, rdx, rdw, rdx16);
        if (codes) {
          expect_floats(r, "dx16 (one call vs two)", widen(fdx16.download()), widen(rdx16.download()));
          compare_rows(r, "dx16", widen(fdx16.download()), widen(dx16), I, 3, kBf16Ulp);
        } else {
          expect_floats(r, "dx (one call vs two)", fdx.download(), rdx.download());
          compare_rows(r, "dx", fdx.download(), dx, I, 3);
        }
        expect_floats(r, "dw (one call vs two)", fdw.download(), rdw.download());
        compare_rows(r, "dw", fdw.download(), dw, I, 3);
      });
    run_case("nvfp4_linear_wgrad_rht", shape + " x, dy bf16", [&](Result& r) {
      auto dw = randn(O * I, 1e-3f);
      Dev<float> dDW(dw);  // accumulates
      cpu.fp8_linear_wgrad(dw.data(), nullptr, dyb.on_host(rht(fp4(16, 1, true, 4))), nullptr, xb.on_host(rht(fp4(16, 1, false, 5))), N, I, O, cpu_work.data());
      gpu.fp8_linear_wgrad(dDW.p, nullptr, dyb.on_gpu(rht(fp4(16, 1, true, 4))), nullptr, xb.on_gpu(rht(fp4(16, 1, false, 5))), N, I, O, gpu_work.p);
      compare_rows(r, "dw", dDW.download(), dw, I, 3);
    });
  }
}

std::vector<float> round_bf16(const std::vector<float>& x) {  // RNE, as numerics/ rounds
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = numerics::bf16_rounded(x[i]);
  return y;
}

std::vector<uint16_t> bf16_codes(const std::vector<float>& x) {  // RNE codes
  std::vector<uint16_t> c(x.size());
  for (size_t i = 0; i < x.size(); ++i) c[i] = numerics::encode_bf16(x[i], numerics::Saturation::kNoSat);
  return c;
}
std::vector<float> widen(const std::vector<uint16_t>& codes) {  // exact
  std::vector<float> x(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) x[i] = numerics::decode_bf16(codes[i]);
  return x;
}

// Backend::gemm_bf16 (the bf16 path's GEMM: set_bf16_gemm_operands(true), each operand as bf16
// codes or fp32 rounded by the call, fp32 or bf16 result) against the CPU twin's gemm_bf16
// (MXTRAIN_TEST_BF16_GEMM=1, set at the start of main). Both multiply the same bf16 values
// exactly and sum in fp32, so fp32 results differ by the summation order only: the tolerance of
// the gemm_bf16 cases above. A bf16 result adds one bf16 ulp (kBf16Ulp). Every transpose,
// every operand form and every output on the odd 37x53x29; one operand form per (transposes,
// output) on the other shapes; and codes / outputs at one-element offsets (2-byte-aligned bf16
// pointers, 4-byte-aligned fp32 C), which cuBLASLt must be told of (LtGemm's alignment_of).
// Shared inputs (Backend::begin_shared_input): inside a bracket on each backend, three Linears
// (q, k, v: outputs 256, 128, 128) read one x; on CUDA k and v take the codes and scales that q's
// quantization of x kept (its amax into their slots), on the CPU the kept dequantized values.
// Forward, then the whole backward of each (its weight gradient's transposed copy of x kept in
// its own bracket), x as fp32 and as bf16 codes, for each recipe the GPU runs natively:
// per-tensor current and delayed (one amax slot per operand, all compared exactly; delayed's
// forward adds a fourth Linear whose x scale differs, quantized afresh beside the kept one),
// fp8-block, mxfp8. Outputs against the CPU twin with the separate calls' tolerances; the
// GPU's shared-operand count must rise by 2 a bracket, as the CPU's does.
void check_shared_inputs(Backend& cpu, CudaBackend& gpu) {
  if (!gpu.fp8_tensor_cores()) {
    run_case("shared_input", "skipped", [&](Result& r) { r.note = "no FP8 tensor cores (sm < 8.9)"; });
    return;
  }
  enum Role { kFwdX, kFwdW, kDgradDy, kDgradW, kWgradDy, kWgradX };
  struct Kind {
    std::string name;
    std::function<Backend::Fp8Operand(Role, const std::vector<float>&, float*)> op;
  };
  auto tensor = [](bool delayed) {
    return [delayed](Role role, const std::vector<float>& v, float* amax) {
      Backend::Fp8Operand q;
      q.fmt = role == kDgradDy || role == kWgradDy ? Format::kE5M2 : Format::kE4M3;
      q.current = !delayed;
      q.scale = numerics::fp8_scale_from_amax(float(max_abs(v)), numerics::fp8_max(q.fmt)) * 0.5f;
      q.amax = amax;
      return q;
    };
  };
  std::vector<Kind> kinds = {{"current", tensor(false)}, {"delayed", tensor(true)}};
  if (gpu.fp8_block_tensor_cores())
    kinds.push_back({"fp8-block", [](Role role, const std::vector<float>&, float*) {
                       Backend::Fp8Operand q;
                       const bool weight = role == kFwdW || role == kDgradW;
                       const bool down = role == kWgradDy || role == kWgradX;
                       q.block_rows = weight || down ? 128 : 1;
                       q.block_cols = weight || !down ? 128 : 1;
                       return q;
                     }});
  if (gpu.mxfp8_tensor_cores())
    kinds.push_back({"mxfp8", [](Role role, const std::vector<float>&, float*) {
                       Backend::Fp8Operand q;
                       const bool down = role == kDgradW || role == kWgradDy || role == kWgradX;
                       q.mx = true;
                       q.block_rows = down ? 32 : 1;
                       q.block_cols = down ? 1 : 32;
                       return q;
                     }});
  const int64_t N = 256, I = 256;
  const std::array<int64_t, 3> outs = {256, 128, 128};
  const auto x = randn(N * I);
  const Bf16Input xb(x);
  Dev<float> dX(x);
  std::vector<std::vector<float>> w, dy;
  std::vector<std::unique_ptr<Dev<float>>> dW, dDY;
  for (int64_t o : outs) {
    w.push_back(randn(o * I, 0.05f));
    dy.push_back(randn(N * o, 1e-3f));
    dW.push_back(std::make_unique<Dev<float>>(w.back()));
    dDY.push_back(std::make_unique<Dev<float>>(dy.back()));
  }
  const int64_t work_floats = N * I + 256 * I + N * 256;
  Dev<float> gpu_work(work_floats);
  std::vector<float> cpu_work(work_floats);
  for (const Kind& kind : kinds)
    for (int codes = 0; codes < 2; ++codes) {
      const std::string shape = kind.name + (codes ? " x bf16" : " x fp32");
      const std::vector<float>& xin = codes ? xb.wide : x;
      auto gx = [&](Backend::Fp8Operand q) { return codes ? xb.on_gpu(q) : q; };
      const void* cpu_id = xin.data();  // the pointers the Linears are given
      const void* gpu_id = codes ? static_cast<const void*>(xb.dev.p) : dX.p;
      const float* gpu_x = codes ? nullptr : dX.p;
      run_case("shared_input_forward", shape, [&](Result& r) {
        Dev<float> amax(8);
        std::vector<float> camax(8);
        const int64_t cpu0 = cpu.shared_input_hits(), gpu0 = gpu.shared_input_hits();
        {
          SharedInputScope cs(cpu, cpu_id, N, I, 256), gs(gpu, gpu_id, N, I, 256);
          // A fourth Linear (delayed only) with another scale for x: not the kept
          // quantization, so quantized afresh into its own buffer (no hit).
          const int linears = kind.name == "delayed" ? 4 : 3;
          for (int l = 0; l < linears; ++l) {
            const int wl = l % 3;
            const int64_t O = outs[size_t(wl)];
            std::vector<float> y(N * O);
            Dev<float> dY(N * O);
            auto xq = [&](float* slot) {
              Backend::Fp8Operand q = kind.op(kFwdX, x, slot);
              if (l == 3) q.scale *= 0.5f;
              return q;
            };
            cpu.fp8_linear_forward(y.data(), xin.data(), xq(&camax[2 * l]), w[wl].data(),
                                   kind.op(kFwdW, w[wl], &camax[2 * l + 1]), N, I, O,
                                   cpu_work.data());
            gpu.fp8_linear_forward(dY.p, gpu_x, gx(xq(amax.p + 2 * l)), dW[wl]->p,
                                   kind.op(kFwdW, w[wl], amax.p + 2 * l + 1), N, I, O,
                                   gpu_work.p);
            compare_rows(r, tagged("y", l).c_str(), dY.download(), y, O);
          }
        }
        if (kind.name == "current")
          camax.resize(6);  // slots 6 and 7 belong to the delayed case's fourth Linear
        if (kind.name == "current" || kind.name == "delayed") {
          std::vector<float> got = amax.download();
          got.resize(camax.size());
          expect_floats(r, "amax", got, camax);
        }
        expect_two_shared(r, cpu, gpu, cpu0, gpu0);
      });
      run_case("shared_input_backward", shape, [&](Result& r) {
        Dev<float> amax(12);
        std::vector<float> camax(12);
        auto dx = randn(N * I);
        Dev<float> dDX(dx);  // accumulates over the three
        const int64_t cpu0 = cpu.shared_input_hits(), gpu0 = gpu.shared_input_hits();
        {
          SharedInputScope cs(cpu, cpu_id, N, I, 256), gs(gpu, gpu_id, N, I, 256);
          for (int l = 0; l < 3; ++l) {
            const int64_t O = outs[size_t(l)];
            auto dw = randn(O * I, 1e-3f);
            Dev<float> dDW(dw);
            float* c = camax.data() + 4 * l;
            float* g = amax.p + 4 * l;
            cpu.fp8_linear_backward(dx.data(), dw.data(), dy[l].data(),
                                    kind.op(kDgradDy, dy[l], c), w[l].data(),
                                    kind.op(kDgradW, w[l], c + 1), kind.op(kWgradDy, dy[l], c + 2),
                                    xin.data(), kind.op(kWgradX, x, c + 3), N, I, O, true,
                                    cpu_work.data());
            gpu.fp8_linear_backward(dDX.p, dDW.p, dDY[l]->p, kind.op(kDgradDy, dy[l], g),
                                    dW[l]->p, kind.op(kDgradW, w[l], g + 1),
                                    kind.op(kWgradDy, dy[l], g + 2), gpu_x,
                                    gx(kind.op(kWgradX, x, g + 3)), N, I, O, true, gpu_work.p);
            compare_rows(r, tagged("dw", l).c_str(), dDW.download(), dw, I);
          }
        }
        compare_rows(r, "dx", dDX.download(), dx, I);
        if (kind.name == "current" || kind.name == "delayed")
          expect_floats(r, "amax", amax.download(), camax);
        expect_two_shared(r, cpu, gpu, cpu0, gpu0);
      });
    }
}

void check_gemm_bf16_operands(Backend& cpu, CudaBackend& gpu) {
  if (!cpu.set_bf16_gemm_operands(true)) {
    run_case("gemm_bf16", "operands", [&](Result& r) {
      r.pass = false;
      r.note = "the CPU backend refused set_bf16_gemm_operands(true) (MXTRAIN_TEST_BF16_GEMM=1 unseen)";
    });
    return;
  }
  gpu.set_bf16_gemm_operands(true);
  const float alpha = 0.5f;
  // out: 0 fp32 beta 0, 1 fp32 beta 1, 2 bf16; ops: bit 0 A as codes, bit 1 B as codes.
  auto one = [&](int64_t M, int64_t N, int64_t K, bool ta, bool tb, int out, int ops, int64_t off) {
    static const char* outs[] = {"C=f32 beta0", "C=f32 beta1", "C=bf16"};
    const std::string shape = dims({M, N, K}) + " ta" + std::to_string(ta) + " tb" + std::to_string(tb) +
                              ((ops & 1) ? " A=bf16" : " A=f32") + ((ops & 2) ? " B=bf16" : " B=f32") +
                              " " + outs[out] + (off ? " +1 offsets" : "");
    run_case("gemm_bf16", shape, [&](Result& r) {
      const bool a16 = ops & 1, b16 = ops & 2, c16 = out == 2;
      const float beta = out == 1 ? 1.0f : 0.0f;
      const auto A = randn(M * K), B = randn(K * N), C0 = randn(M * N);
      const auto A16 = bf16_codes(A), B16 = bf16_codes(B);
      // Device copies start `off` elements into their buffers.
      std::vector<float> Ah(off), Bh(off), Ch(off);
      std::vector<uint16_t> A16h(off), B16h(off);
      Ah.insert(Ah.end(), A.begin(), A.end());
      Bh.insert(Bh.end(), B.begin(), B.end());
      Ch.insert(Ch.end(), C0.begin(), C0.end());
      A16h.insert(A16h.end(), A16.begin(), A16.end());
      B16h.insert(B16h.end(), B16.begin(), B16.end());
      Dev<float> dA(Ah), dB(Bh), dC(size_t(off + M * N));
      Dev<uint16_t> dA16(A16h), dB16(B16h), dC16(size_t(off + M * N));
      if (beta != 0.0f) dC.upload(Ch);
      std::vector<float> C = C0;
      std::vector<uint16_t> C16(M * N);
      cpu.gemm_bf16(ta, tb, M, N, K, alpha, a16 ? nullptr : A.data(), a16 ? A16.data() : nullptr,
                    b16 ? nullptr : B.data(), b16 ? B16.data() : nullptr, beta,
                    c16 ? nullptr : C.data(), c16 ? C16.data() : nullptr);
      gpu.gemm_bf16(ta, tb, M, N, K, alpha, a16 ? nullptr : dA.p + off, a16 ? dA16.p + off : nullptr,
                    b16 ? nullptr : dB.p + off, b16 ? dB16.p + off : nullptr, beta,
                    c16 ? nullptr : dC.p + off, c16 ? dC16.p + off : nullptr);
      const Tol tol{kGemm.atol * std::sqrt(double(K)), kGemm.rtol + (c16 ? kBf16Ulp : 0.0)};
      if (c16) {
        auto got = dC16.download();
        got.erase(got.begin(), got.begin() + off);
        compare(r, "C16", widen(got), widen(C16), tol);
      } else {
        auto got = dC.download();
        got.erase(got.begin(), got.begin() + off);
        compare(r, "C", got, C, tol);
      }
    });
  };
  const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {37, 53, 29}, {256, 512, 384}};
  for (auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int out = 0; out < 3; ++out)
          for (int ops = 0; ops < 4; ++ops)
            if (s[0] == 37 || ops == (2 * ta + tb + out) % 4) one(s[0], s[1], s[2], ta, tb, out, ops, 0);
  for (int out = 0; out < 3; ++out) one(37, 53, 29, false, true, out, 3, 1);
  one(37, 53, 29, true, false, 2, 0, 1);
  // gemm_bf16_residual (C = alpha op(A) op(B) + R, R read by cuBLASLt's epilogue) against the
  // CPU twin's (gemm_bf16, then add). C is poisoned first: the call must write every element
  // without reading it. R and C at offsets r_off / c_off (4-byte-aligned fp32 pointers), and
  // K = 0 (C = R).
  auto residual = [&](int64_t M, int64_t N, int64_t K, bool ta, bool tb, int ops, int64_t r_off,
                      int64_t c_off) {
    const std::string shape = dims({M, N, K}) + " ta" + std::to_string(ta) + " tb" + std::to_string(tb) +
                              ((ops & 1) ? " A=bf16" : " A=f32") + ((ops & 2) ? " B=bf16" : " B=f32") +
                              " R+" + std::to_string(r_off) + " C+" + std::to_string(c_off);
    run_case("gemm_bf16_residual", shape, [&](Result& r) {
      const bool a16 = ops & 1, b16 = ops & 2;
      const auto A = randn(M * K), B = randn(K * N), R = randn(M * N);
      const auto A16 = bf16_codes(A), B16 = bf16_codes(B);
      std::vector<float> Rh(static_cast<size_t>(r_off));
      Rh.insert(Rh.end(), R.begin(), R.end());
      Dev<float> dA(A), dB(B), dR(Rh), dC(std::vector<float>(size_t(c_off + M * N), std::nanf("")));
      Dev<uint16_t> dA16(A16), dB16(B16);
      std::vector<float> C(size_t(M * N), std::nanf(""));
      cpu.gemm_bf16_residual(ta, tb, M, N, K, alpha, a16 ? nullptr : A.data(),
                             a16 ? A16.data() : nullptr, b16 ? nullptr : B.data(),
                             b16 ? B16.data() : nullptr, R.data(), C.data());
      gpu.gemm_bf16_residual(ta, tb, M, N, K, alpha, a16 ? nullptr : dA.p, a16 ? dA16.p : nullptr,
                             b16 ? nullptr : dB.p, b16 ? dB16.p : nullptr, dR.p + r_off,
                             dC.p + c_off);
      auto got = dC.download();
      got.erase(got.begin(), got.begin() + c_off);
      compare(r, "C", got, C, {kGemm.atol * std::sqrt(double(std::max<int64_t>(K, 1))), kGemm.rtol});
      auto r_after = dR.download();  // the residual is only read
      r_after.erase(r_after.begin(), r_after.begin() + r_off);
      expect_floats(r, "R", r_after, R);
    });
  };
  for (auto& s : shapes) residual(s[0], s[1], s[2], false, true, 1, 0, 0);
  residual(37, 53, 29, false, false, 3, 0, 0);
  residual(37, 53, 29, true, true, 0, 0, 0);
  residual(256, 512, 384, false, true, 3, 1, 0);
  residual(256, 512, 384, false, true, 3, 0, 3);
  residual(37, 53, 0, false, true, 3, 1, 2);
  cpu.set_bf16_gemm_operands(false);
  gpu.set_bf16_gemm_operands(false);
}

void check_gemm(Backend& cpu, CudaBackend& gpu) {
  const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 64, 64}, {127, 33, 257}, {256, 512, 384}};
  for (auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 1.0f}) {
          const int64_t M = s[0], N = s[1], K = s[2];
          run_case("gemm", dims({M, N, K}) + " ta" + std::to_string(ta) + " tb" + std::to_string(tb) +
                               " beta" + std::to_string(int(beta)),
                   [&](Result& r) {
                     auto A = randn(M * K), B = randn(K * N), C = randn(M * N);
                     Dev<float> dA(A), dB(B), dC(M * N);
                     if (beta != 0.0f) dC.upload(C);
                     cpu.gemm(ta, tb, M, N, K, 0.5f, A.data(), B.data(), beta, C.data());
                     gpu.gemm(ta, tb, M, N, K, 0.5f, dA.p, dB.p, beta, dC.p);
                     compare(r, "C", dC.download(), C, {kGemm.atol * std::sqrt(double(K)), kGemm.rtol});
                   });
        }
  // bf16 path: against the CPU GEMM of the bf16-rounded operands (products of bf16 values are
  // exact in fp32, so only the summation order differs).
  for (auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    run_case("gemm_bf16", dims({M, N, K}) + " tb1", [&](Result& r) {
      auto A = randn(M * K), B = randn(N * K), C = std::vector<float>(M * N);
      Dev<float> dA(A), dB(B), dC(M * N);
      const auto Ab = round_bf16(A), Bb = round_bf16(B);
      cpu.gemm(false, true, M, N, K, 1.0f, Ab.data(), Bb.data(), 0.0f, C.data());
      gpu.set_gemm_precision(CudaGemmPrecision::kBf16);
      gpu.gemm(false, true, M, N, K, 1.0f, dA.p, dB.p, 0.0f, dC.p);
      gpu.set_gemm_precision(CudaGemmPrecision::kFp32);
      compare(r, "C", dC.download(), C, {kGemm.atol * std::sqrt(double(K)), kGemm.rtol});
    });
  }
  check_gemm_bf16_operands(cpu, gpu);
  // Per-tensor FP8 GEMM on tensor cores over given codes: against the CPU fp32 GEMM of the
  // dequantized operands (FP8 products are exact in fp32; only the accumulation order differs):
  // tolerance kFp8Gemm of each row's max |value|.
  for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{16, 16, 16}, {48, 64, 80}, {256, 512, 384}, {128, 96, 2048}})
    for (Format af : {Format::kE4M3, Format::kE5M2})
      for (float beta : {0.0f, 1.0f})
        run_case(af == Format::kE4M3 ? "fp8_gemm_e4m3xe4m3" : "fp8_gemm_e5m2xe4m3",
                 dims({M, N, K}) + " beta" + std::to_string(int(beta)), [&](Result& r) {
          auto a = randn(M * K), b = randn(N * K, 0.05f), c = randn(M * N);
          const auto qa = numerics::quantize_fp8_current(a.data(), M, K, af);
          const auto qb = numerics::quantize_fp8_current(b.data(), N, K, Format::kE4M3);
          Dev<uint8_t> da(qa.codes), db(qb.codes);
          Dev<float> das(qa.scales_f32), dbs(qb.scales_f32), dc(M * N);
          if (beta != 0.0f) dc.upload(c);
          cpu.gemm(false, true, M, N, K, 1.0f, qa.dequant.data(), qb.dequant.data(), beta, c.data());
          gpu.fp8_gemm(M, N, K, da.p, af, das.p, db.p, Format::kE4M3, dbs.p, beta, dc.p);
          compare_rows(r, "C", dc.download(), c, N);
        });
  check_fp8_linears(cpu, gpu);
  check_fp8_block_linears(cpu, gpu);
  check_mxfp8_linears(cpu, gpu);
  check_nvfp4_linears(cpu, gpu);
  check_shared_inputs(cpu, gpu);
  run_case("linear_backward", "N=67 in=96 out=80", [&](Result& r) {
    const int64_t N = 67, I = 96, O = 80;
    auto x = randn(N * I), w = randn(O * I), dy = randn(N * O), dx = randn(N * I), dw = randn(O * I);
    Dev<float> dX(x), dW(w), dDY(dy), dDX(dx), dDW(dw);
    cpu.linear_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), N, I, O, true);
    gpu.linear_backward(dDX.p, dDW.p, dDY.p, dX.p, dW.p, N, I, O, true);
    compare(r, "dx", dDX.download(), dx, {1e-4 * 10, 1e-4});
    compare(r, "dw", dDW.download(), dw, {1e-4 * 10, 1e-4});
  });
}

// GEMM tuning (MXTRAIN_CUDA_GEMM_TUNE=all, LtGemm::fastest): a backend that times the
// heuristic's candidates at every shape's first call, on the call's own operands. The trials
// write the call's output where the call does not read it (beta 0: overwritten by the call
// after them) and a stand-in where it does (beta 1): a trial that wrote C there would add the
// product to C several times over, which the beta-1 cases' comparison with the CPU catches.
// Under mxemu the heuristic offers three candidates, the third refused at run time (left out).
void check_gemm_tuned(Backend& cpu) {
  CudaBackendOptions o;
  o.sync_after_each_op = true;
  o.gemm_tune = CudaGemmTune::kAll;
  auto tuned = make_cuda_backend(o);
  for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{64, 64, 64}, {127, 33, 257}})
    for (int t = 0; t < 2; ++t)
      for (float beta : {0.0f, 1.0f})  // each shape's first call is beta 0, then beta 1
        run_case("gemm_tuned", dims({M, N, K}) + " ta" + std::to_string(t) + " beta" + std::to_string(int(beta)),
                 [&](Result& r) {
                   auto A = randn(M * K), B = randn(K * N), C = randn(M * N);
                   Dev<float> dA(A), dB(B), dC(M * N);
                   if (beta != 0.0f) dC.upload(C);
                   cpu.gemm(t, false, M, N, K, 0.5f, A.data(), B.data(), beta, C.data());
                   tuned->gemm(t, false, M, N, K, 0.5f, dA.p, dB.p, beta, dC.p);
                   compare(r, "C", dC.download(), C, {kGemm.atol * std::sqrt(double(K)), kGemm.rtol});
                 });
  // A shape whose first call reads C (beta 1): its trials all go to the stand-in.
  run_case("gemm_tuned", "96x80x48 beta1 first", [&](Result& r) {
    const int64_t M = 96, N = 80, K = 48;
    auto A = randn(M * K), B = randn(K * N), C = randn(M * N);
    Dev<float> dA(A), dB(B), dC(C);
    cpu.gemm(false, true, M, N, K, 1.0f, A.data(), B.data(), 1.0f, C.data());
    tuned->gemm(false, true, M, N, K, 1.0f, dA.p, dB.p, 1.0f, dC.p);
    compare(r, "C", dC.download(), C, {kGemm.atol * std::sqrt(double(K)), kGemm.rtol});
  });
  // The bf16 path's GEMM: bf16 output (cuBLASLt's epilogue), then fp32 accumulating.
  if (cpu.set_bf16_gemm_operands(true)) {
    tuned->set_bf16_gemm_operands(true);
    const int64_t M = 37, N = 53, K = 29;
    for (int out = 0; out < 2; ++out)
      run_case("gemm_tuned", dims({M, N, K}) + (out ? " bf16 C=f32 beta1" : " bf16 C=bf16"), [&](Result& r) {
        const auto A = randn(M * K), B = randn(N * K), C0 = randn(M * N);
        const auto A16 = bf16_codes(A), B16 = bf16_codes(B);
        Dev<uint16_t> dA16(A16), dB16(B16), dC16(M * N);
        Dev<float> dC(C0);
        std::vector<float> C = C0;
        std::vector<uint16_t> C16(M * N);
        cpu.gemm_bf16(false, true, M, N, K, 1.0f, nullptr, A16.data(), nullptr, B16.data(), out ? 1.0f : 0.0f,
                      out ? C.data() : nullptr, out ? nullptr : C16.data());
        tuned->gemm_bf16(false, true, M, N, K, 1.0f, nullptr, dA16.p, nullptr, dB16.p, out ? 1.0f : 0.0f,
                         out ? dC.p : nullptr, out ? nullptr : dC16.p);
        const Tol tol{kGemm.atol * std::sqrt(double(K)), kGemm.rtol + (out ? 0.0 : kBf16Ulp)};
        if (out) compare(r, "C", dC.download(), C, tol);
        else compare(r, "C16", widen(dC16.download()), widen(C16), tol);
      });
    // A shape whose first call adds a residual (gemm_bf16_residual): the trials read R and
    // write the call's own output, which the call then overwrites; R must come out unchanged.
    run_case("gemm_tuned", "41x56x24 bf16 residual first", [&](Result& r) {
      const int64_t m = 41, n = 56, k = 24;
      const auto A = randn(m * k), B = randn(n * k), R = randn(m * n);
      const auto A16 = bf16_codes(A), B16 = bf16_codes(B);
      Dev<uint16_t> dA16(A16), dB16(B16);
      Dev<float> dR(R), dC(std::vector<float>(size_t(m * n), std::nanf("")));
      std::vector<float> C(size_t(m * n));
      cpu.gemm_bf16_residual(false, true, m, n, k, 1.0f, nullptr, A16.data(), nullptr, B16.data(),
                             R.data(), C.data());
      tuned->gemm_bf16_residual(false, true, m, n, k, 1.0f, nullptr, dA16.p, nullptr, dB16.p, dR.p,
                                dC.p);
      compare(r, "C", dC.download(), C, {kGemm.atol * std::sqrt(double(k)), kGemm.rtol});
      expect_floats(r, "R", dR.download(), R);
    });
    cpu.set_bf16_gemm_operands(false);
    tuned->set_bf16_gemm_operands(false);
  }
  // The per-tensor FP8 GEMM (scaled_tn_gemm), accumulating into C.
  if (tuned->fp8_tensor_cores()) {
    const int64_t M = 48, N = 64, K = 80;
    for (float beta : {1.0f, 0.0f})
      run_case("gemm_tuned", dims({M, N, K}) + " fp8 beta" + std::to_string(int(beta)), [&](Result& r) {
        auto a = randn(M * K), b = randn(N * K, 0.05f), c = randn(M * N);
        const auto qa = numerics::quantize_fp8_current(a.data(), M, K, Format::kE4M3);
        const auto qb = numerics::quantize_fp8_current(b.data(), N, K, Format::kE4M3);
        Dev<uint8_t> da(qa.codes), db(qb.codes);
        Dev<float> das(qa.scales_f32), dbs(qb.scales_f32), dc(c);
        cpu.gemm(false, true, M, N, K, 1.0f, qa.dequant.data(), qb.dequant.data(), beta, c.data());
        tuned->fp8_gemm(M, N, K, da.p, Format::kE4M3, das.p, db.p, Format::kE4M3, dbs.p, beta, dc.p);
        compare_rows(r, "C", dc.download(), c, N);
      });
  }
  // Every shape above is a key of its own (shape, transposes, types), timed once whatever was
  // chosen; under mxemu every one (three candidates offered), on a GPU those where the
  // heuristic offered more than one.
  run_case("gemm_tuned", "shapes timed", [&](Result& r) {
    const int64_t want = 4 + 1 + 3 + (tuned->fp8_tensor_cores() ? 1 : 0);
    const int64_t timed = tuned->gemm_shapes_timed();
    r.note = "timed " + std::to_string(timed) + ", retuned " +
             std::to_string(tuned->gemm_shapes_retuned()) + ", keys " + std::to_string(want);
#ifdef MXTRAIN_CUDA_EMU
    r.pass = timed == want;
#else
    r.pass = timed >= 1 && timed <= want;
#endif
  });
}

void check_rows(Backend& cpu, CudaBackend& gpu) {
  // (rmsnorm_backward's one-pass kernel: 1100 rows take blocks of several rows and a partial
  // last round; 6144 columns its 512-thread form with 3 of 4 float4s a thread, in 170 blocks,
  // the partials' 8 MiB bound, for 200 rows)
  for (auto [N, C] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {5, 33}, {64, 256}, {129, 2049}, {1100, 64}, {200, 6144}}) {
    run_case("rmsnorm_forward", dims({N, C}), [&](Result& r) {
      auto x = randn(N * C), w = uniform(C, 0.5f, 1.5f);
      std::vector<float> y(N * C), rstd(N);
      Dev<float> dx(x), dw(w), dy(N * C), dr(N);
      cpu.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
      gpu.rmsnorm_forward(dy.p, dr.p, dx.p, dw.p, N, C, 1e-5f);
      compare(r, "y", dy.download(), y, kReduction);
      compare(r, "rstd", dr.download(), rstd, kReduction);
    });
    run_case("rmsnorm_backward", dims({N, C}), [&](Result& r) {
      auto x = randn(N * C), w = uniform(C, 0.5f, 1.5f), g = randn(N * C), dxv = randn(N * C),
           dwv = randn(C);
      std::vector<float> y(N * C), rstd(N);
      cpu.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
      Dev<float> dX(x), dW(w), dG(g), dR(rstd), dDX(dxv), dDW(dwv);
      cpu.rmsnorm_backward(dxv.data(), dwv.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
      gpu.rmsnorm_backward(dDX.p, dDW.p, dG.p, dX.p, dW.p, dR.p, N, C);
      compare(r, "dx", dDX.download(), dxv, kReduction);
      compare(r, "dw", dDW.download(), dwv, kReduction);
    });
    // With the updated dx's codes (the bf16 path's residual gradient): dx and dw as above,
    // the codes against the CPU twin's (rmsnorm_backward, to_bf16) within one bf16 ulp more,
    // and against the GPU's own dx (each code the RNE rounding of the dx beside it), with and
    // without dw (the one-pass kernel, and the dx kernel followed by a rounding pass). With the
    // amax (an FP8 operand's, Fp8Operand::x_amax: the output projections' dy), max |dx| of the
    // updated dx the device wrote, bit for bit a host loop (host_amax), a NaN in the incoming
    // dx skipped; the CPU twin's of its own dx likewise.
    // dx16 null: no codes, the amax alone (fp8-current's residual gradient off the bf16 path).
    for (int form = 0; form < 6; ++form)
      run_case("rmsnorm_backward_bf16",
               dims({N, C}) + (form & 1 ? " no dw" : "") + (form & 2 ? " amax nan" : "") +
                   (form & 4 ? " amax no codes" : ""),
               [&](Result& r) {
        const bool with_dw = !(form & 1), amax = form & 6, codes = !(form & 4);
        auto x = randn(N * C), w = uniform(C, 0.5f, 1.5f), g = randn(N * C), dxv = randn(N * C),
             dwv = randn(C);
        if (amax) dxv[(N * C) / 2] = NAN;
        std::vector<float> y(N * C), rstd(N), camax{-1.0f};
        std::vector<uint16_t> dx16(N * C);
        cpu.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
        Dev<float> dX(x), dW(w), dG(g), dR(rstd), dDX(dxv), dDW(dwv), dA(1);
        Dev<uint16_t> dDX16(std::vector<uint16_t>(N * C, 0x7FC1));
        cpu.rmsnorm_backward_bf16(dxv.data(), codes ? dx16.data() : nullptr,
                                  with_dw ? dwv.data() : nullptr, g.data(), x.data(), w.data(),
                                  rstd.data(), N, C, amax ? camax.data() : nullptr);
        gpu.rmsnorm_backward_bf16(dDX.p, codes ? dDX16.p : nullptr, with_dw ? dDW.p : nullptr,
                                  dG.p, dX.p, dW.p, dR.p, N, C, amax ? dA.p : nullptr);
        const auto got_dx = dDX.download();
        if (amax) {
          expect_floats(r, "amax", dA.download(), {host_amax(got_dx)});
          expect_floats(r, "cpu amax", camax, {host_amax(dxv)});
        }
        if (!codes) {
          compare(r, "dx", got_dx, dxv, kReduction);
          if (with_dw) compare(r, "dw", dDW.download(), dwv, kReduction);
          if (dDX16.download() != std::vector<uint16_t>(N * C, 0x7FC1)) {
            r.pass = false;
            r.note += "codes written though none were asked for; ";
          }
          return;
        }
        compare(r, "dx", got_dx, dxv, kReduction);
        if (with_dw) compare(r, "dw", dDW.download(), dwv, kReduction);
        const auto got16 = dDX16.download();
        compare(r, "dx16", widen(got16), widen(dx16), {kReduction.atol, kReduction.rtol + kBf16Ulp});
        if (got16 != bf16_codes(got_dx)) {
          r.pass = false;
          r.note = "the codes are not the RNE rounding of the dx written beside them";
        }
      });
    // The bf16 path's RMSNorm: y as RNE codes, rstd fp32, against the CPU twin (rmsnorm_forward
    // then to_bf16). Tolerance: the fp32 op's plus one bf16 ulp (fp32 results a few ulps apart
    // can round to adjacent codes); rstd as the fp32 op's; x unchanged.
    run_case("rmsnorm_forward_bf16", dims({N, C}), [&](Result& r) {
      auto x = randn(N * C), w = uniform(C, 0.5f, 1.5f);
      std::vector<uint16_t> y16(N * C);
      std::vector<float> rstd(N);
      Dev<float> dx(x), dw(w), dr(N);
      Dev<uint16_t> dy(N * C);
      cpu.rmsnorm_forward_bf16(y16.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, nullptr);
      gpu.rmsnorm_forward_bf16(dy.p, dr.p, dx.p, dw.p, N, C, 1e-5f, nullptr);
      compare(r, "y", widen(dy.download()), widen(y16), {kReduction.atol, kReduction.rtol + kBf16Ulp});
      compare(r, "rstd", dr.download(), rstd, kReduction);
      compare(r, "x", dx.download(), x, {0, 0});
    });
    // With the amax an FP8 operand of y takes (Fp8Operand::x_amax: the fp8-current and nvfp4
    // Linears then skip their pass over h1 and h2): max |y| over the device's own codes bit for
    // bit (host_amax), the codes those written without it; a row of NaN (x NaN) is skipped, an
    // inf weight gives inf. Against the CPU twin's amax within the codes' tolerance.
    for (int form = 0; form < 3; ++form)
      run_case("rmsnorm_forward_bf16_amax",
               dims({N, C}) + (form == 1 ? " nan row" : form == 2 ? " inf weight" : ""),
               [&](Result& r) {
        auto x = randn(N * C), w = uniform(C, 0.5f, 1.5f);
        if (form == 1)
          for (int64_t c = 0; c < C; ++c) x[(N / 2) * C + c] = NAN;
        if (form == 2) w[C - 1] = INFINITY;
        std::vector<uint16_t> y16(N * C);
        std::vector<float> rstd(N), camax{-1.0f};
        Dev<float> dx(x), dw(w), dr(N), damax(1);
        Dev<uint16_t> dy(N * C), dy0(N * C);
        cpu.rmsnorm_forward_bf16(y16.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f,
                                 camax.data());
        gpu.rmsnorm_forward_bf16(dy.p, dr.p, dx.p, dw.p, N, C, 1e-5f, damax.p);
        gpu.rmsnorm_forward_bf16(dy0.p, dr.p, dx.p, dw.p, N, C, 1e-5f, nullptr);
        const auto codes = widen(dy.download());
        expect_floats(r, "codes", codes, widen(dy0.download()));
        const auto gamax = damax.download();
        expect_floats(r, "amax", gamax, {host_amax(codes)});
        expect_floats(r, "cpu amax", camax, {host_amax(widen(y16))});
        if (form == 2) expect_floats(r, "amax (inf)", gamax, {INFINITY});
        else compare(r, "amax vs cpu", gamax, camax, {0, kReduction.rtol + kBf16Ulp});
      });
  }
  for (auto [B, T, Hh, D] : std::vector<std::array<int64_t, 4>>{{1, 1, 1, 2}, {2, 17, 3, 64}, {1, 100, 8, 128}}) {
    for (int bwd = 0; bwd < 2; ++bwd)
      run_case(bwd ? "rope_backward" : "rope_forward", dims({B, T, Hh, D}), [&](Result& r) {
        auto x = randn(B * T * Hh * D), c = uniform(T * D / 2, -1, 1), s = uniform(T * D / 2, -1, 1);
        Dev<float> dx(x), dc(c), ds(s);
        if (bwd) {
          cpu.rope_backward(x.data(), c.data(), s.data(), B, T, Hh, D);
          gpu.rope_backward(dx.p, dc.p, ds.p, B, T, Hh, D);
        } else {
          cpu.rope_forward(x.data(), c.data(), s.data(), B, T, Hh, D);
          gpu.rope_forward(dx.p, dc.p, ds.p, B, T, Hh, D);
        }
        compare(r, "x", dx.download(), x, kElementwise);
      });
    // RoPE from fp32 x (not changed) into RNE codes, against the CPU twin (rope_forward on a
    // copy, then to_bf16): the fp32 op's tolerance plus one bf16 ulp; x bit for bit unchanged.
    run_case("rope_forward_bf16", dims({B, T, Hh, D}), [&](Result& r) {
      auto x = randn(B * T * Hh * D), c = uniform(T * D / 2, -1, 1), s = uniform(T * D / 2, -1, 1);
      std::vector<uint16_t> y16(x.size());
      Dev<float> dx(x), dc(c), ds(s);
      Dev<uint16_t> dy(x.size());
      cpu.rope_forward_bf16(y16.data(), x.data(), c.data(), s.data(), B, T, Hh, D);
      gpu.rope_forward_bf16(dy.p, dx.p, dc.p, ds.p, B, T, Hh, D);
      compare(r, "y", widen(dy.download()), widen(y16), {kElementwise.atol, kElementwise.rtol + kBf16Ulp});
      expect_floats(r, "x", dx.download(), x);  // an input: unchanged, bit for bit
    });
    // RoPE's backward in place on codes (the bf16 path's dq, dk), against the CPU twin
    // (widen, rope_backward, to_bf16): the fp32 op's tolerance plus one bf16 ulp.
    run_case("rope_backward_bf16", dims({B, T, Hh, D}), [&](Result& r) {
      const auto x16 = bf16_codes(randn(B * T * Hh * D));
      auto c = uniform(T * D / 2, -1, 1), s = uniform(T * D / 2, -1, 1);
      std::vector<uint16_t> y16 = x16;
      Dev<uint16_t> dx(x16);
      Dev<float> dc(c), ds(s);
      cpu.rope_backward_bf16(y16.data(), c.data(), s.data(), B, T, Hh, D);
      gpu.rope_backward_bf16(dx.p, dc.p, ds.p, B, T, Hh, D);
      compare(r, "x", widen(dx.download()), widen(y16), {kElementwise.atol, kElementwise.rtol + kBf16Ulp});
    });
    // Out of place into rows `off` elements into a buffer ld = Hh D + 2 D + 3 wide (the fused
    // q, k, v gradient): the rotated rows against the CPU twin, every element outside them
    // left as it was (poison), and the input unchanged.
    run_case("rope_backward_bf16_into", dims({B, T, Hh, D}), [&](Result& r) {
      const auto x16 = bf16_codes(randn(B * T * Hh * D));
      auto c = uniform(T * D / 2, -1, 1), s = uniform(T * D / 2, -1, 1);
      const int64_t ld = Hh * D + 2 * D + 3, off = D + 1, N = B * T;
      std::vector<uint16_t> out(size_t(N * ld), 0x7FC1);
      Dev<uint16_t> dx(x16), dout(out);
      Dev<float> dc(c), ds(s);
      cpu.rope_backward_bf16_into(out.data() + off, ld, x16.data(), c.data(), s.data(), B, T, Hh, D);
      gpu.rope_backward_bf16_into(dout.p + off, ld, dx.p, dc.p, ds.p, B, T, Hh, D);
      compare(r, "out", widen(dout.download()), widen(out), {kElementwise.atol, kElementwise.rtol + kBf16Ulp});
      std::vector<uint16_t> y16 = x16;  // the twin's rows are the in-place op's
      cpu.rope_backward_bf16(y16.data(), c.data(), s.data(), B, T, Hh, D);
      for (int64_t n = 0; n < N && r.pass; ++n)
        for (int64_t j = 0; j < Hh * D; ++j)
          if (out[size_t(n * ld + off + j)] != y16[size_t(n * Hh * D + j)]) {
            r.pass = false;
            r.note = "the CPU twin's row " + std::to_string(n) + " is not the in-place op's";
            break;
          }
      compare(r, "dx", widen(dx.download()), widen(x16), {0, 0});  // an input: unchanged
    });
  }
  // copy_rows_bf16 (dv beside dq and dk): rows into a wider buffer, 8-byte pieces and not
  // (cols % 4, ld % 4, pointer offsets), the rest of the buffer untouched.
  for (auto [rows, cols, ld, off] : std::vector<std::array<int64_t, 4>>{
           {1, 1, 1, 0}, {5, 8, 20, 4}, {5, 8, 20, 1}, {7, 13, 40, 3}, {300, 64, 192, 128}})
    run_case("copy_rows_bf16", dims({rows, cols, ld}) + " +" + std::to_string(off), [&](Result& r) {
      std::vector<uint16_t> in(size_t(rows * cols));
      for (size_t i = 0; i < in.size(); ++i) in[i] = uint16_t(i * 2654435761u >> 16);
      std::vector<uint16_t> want(size_t(off + rows * ld), 0x7FC1);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) want[size_t(off + i * ld + j)] = in[size_t(i * cols + j)];
      std::vector<uint16_t> cpu_out(want.size(), 0x7FC1);
      Dev<uint16_t> din(in), dout(std::vector<uint16_t>(want.size(), 0x7FC1));
      cpu.copy_rows_bf16(cpu_out.data() + off, ld, in.data(), rows, cols);
      gpu.copy_rows_bf16(dout.p + off, ld, din.p, rows, cols);
      r.pass = dout.download() == want && cpu_out == want;
      if (!r.pass) r.note = "codes differ from the definition";
    });
  for (int64_t n : {1, 7, 1000, 65537}) {
    run_case("swiglu_forward", dims({n}), [&](Result& r) {
      auto g = randn(n, 3.0f), u = randn(n);
      std::vector<float> s(n);
      Dev<float> dg(g), du(u), dsv(n);
      cpu.swiglu_forward(s.data(), g.data(), u.data(), n);
      gpu.swiglu_forward(dsv.p, dg.p, du.p, n);
      compare(r, "s", dsv.download(), s, kElementwise);
    });
    run_case("swiglu_backward", dims({n}), [&](Result& r) {
      auto g = randn(n, 3.0f), u = randn(n), ds = randn(n);
      std::vector<float> dg(n), du(n);
      Dev<float> dG(g), dU(u), dDS(ds), dDG(n), dDU(n);
      cpu.swiglu_backward(dg.data(), du.data(), ds.data(), g.data(), u.data(), n);
      gpu.swiglu_backward(dDG.p, dDU.p, dDS.p, dG.p, dU.p, n);
      compare(r, "dg", dDG.download(), dg, kElementwise);
      compare(r, "du", dDU.download(), du, kElementwise);
    });
  }
  // SwiGLU on bf16 codes (the bf16 path's MLP) against the CPU twin: g, u as codes (a few
  // specials: 0, -0, +-100 where exp overflows or vanishes, inf), results as codes, compared
  // widened. Tolerance: the fp32 swiglu's (kElementwise: CUDA's expf vs the CPU's exp, which
  // also covers the cancellation in dg's 1 + g (1 - sig) near g = -1.28) plus one bf16 ulp
  // (kBf16Ulp: fp32 results a few ulps apart can round to adjacent codes).
  for (int64_t n : {1, 7, 1000, 65537}) {
    auto gv = randn(n, 3.0f);
    const float specials[] = {0.0f, -0.0f, 100.0f, -100.0f, std::numeric_limits<float>::infinity()};
    for (size_t i = 0; i < std::size(specials) && i < size_t(n); ++i) gv[i] = specials[i];
    const auto g16 = bf16_codes(gv), u16 = bf16_codes(randn(n));
    const Tol tol{kElementwise.atol, kElementwise.rtol + kBf16Ulp};
    run_case("swiglu_forward_bf16", dims({n}), [&](Result& r) {
      std::vector<uint16_t> s16(n);
      Dev<uint16_t> dG(g16), dU(u16), dS(n);
      cpu.swiglu_forward_bf16(s16.data(), g16.data(), u16.data(), n);
      gpu.swiglu_forward_bf16(dS.p, dG.p, dU.p, n);
      compare(r, "s", widen(dS.download()), widen(s16), tol);
    });
    run_case("swiglu_backward_bf16", dims({n}), [&](Result& r) {
      const auto ds16 = bf16_codes(randn(n));
      std::vector<uint16_t> dg16(n), du16(n);
      Dev<uint16_t> dG(g16), dU(u16), dDG(n), dDU(n), dDS(ds16);
      cpu.swiglu_backward_bf16(dg16.data(), du16.data(), ds16.data(), g16.data(), u16.data(), n);
      gpu.swiglu_backward_bf16(dDG.p, dDU.p, dDS.p, dG.p, dU.p, n);
      compare(r, "dg", widen(dDG.download()), widen(dg16), tol);
      compare(r, "du", widen(dDU.download()), widen(du16), tol);
      compare(r, "ds", widen(dDS.download()), widen(ds16), {0, 0});  // an input: unchanged
    });
    // dg and du side by side, row by row (the bf16 path's one GEMM over gate and up): the
    // codes against the CPU twin's, with rows x cols = n split as the vec and scalar forms
    // need (cols a multiple of 4, or not), and outputs poisoned first.
    for (int64_t cols : std::set<int64_t>{1, 4, n % 4 == 0 ? n / 4 : n})
      if (n % cols == 0)
        run_case("swiglu_backward_bf16_fused", dims({n / cols, cols}), [&](Result& r) {
          const int64_t rows = n / cols;
          const auto ds16 = bf16_codes(randn(n));
          std::vector<uint16_t> dgu16(2 * n, 0x7FC1);
          Dev<uint16_t> dG(g16), dU(u16), dDS(ds16), dDGU(dgu16);
          cpu.swiglu_backward_bf16_fused(dgu16.data(), ds16.data(), g16.data(), u16.data(), rows, cols);
          gpu.swiglu_backward_bf16_fused(dDGU.p, dDS.p, dG.p, dU.p, rows, cols);
          compare(r, "dgu", widen(dDGU.download()), widen(dgu16), tol);
        });
    // fp32 gradients from codes (the FP8 recipes' MLP backward), dg written over ds as the
    // model calls it: the fp32 swiglu's tolerance.
    run_case("swiglu_backward_codes", dims({n}), [&](Result& r) {
      const auto ds = randn(n);
      std::vector<float> dg = ds, du(n);
      Dev<uint16_t> dG(g16), dU(u16);
      Dev<float> dDG(ds), dDU(n);
      cpu.swiglu_backward_codes(dg.data(), du.data(), dg.data(), g16.data(), u16.data(), n);
      gpu.swiglu_backward_codes(dDG.p, dDU.p, dDG.p, dG.p, dU.p, n);
      compare(r, "dg", dDG.download(), dg, kElementwise);
      compare(r, "du", dDU.download(), du, kElementwise);
    });
  }
  // (the backward: few ids repeat at V = 1000; V = 3 makes runs of ~23000 positions; N = 70000
  // is past the 65535 limit of a grid's y and z dimensions)
  for (auto [N, C, V] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {33, 17, 10}, {512, 256, 1000}, {70000, 300, 3}, {4096, 2048, 32000}}) {
    run_case("embedding_forward", dims({N, C, V}), [&](Result& r) {
      auto table = randn(V * C);
      auto tok = randint(N, int32_t(V));
      std::vector<float> out(N * C);
      Dev<float> dT(table), dO(N * C);
      Dev<int32_t> dTok(tok);
      cpu.embedding_forward(out.data(), tok.data(), table.data(), N, C);
      gpu.embedding_forward(dO.p, dTok.p, dT.p, N, C);
      compare(r, "out", dO.download(), out, {0, 0});
    });
    run_case("embedding_backward", dims({N, C, V}), [&](Result& r) {
      auto dtable = randn(V * C), dout = randn(N * C);
      auto tok = randint(N, int32_t(V));
      Dev<float> dT(dtable), dO(dout);
      Dev<int32_t> dTok(tok);
      cpu.embedding_backward(dtable.data(), tok.data(), dout.data(), N, C);
      gpu.embedding_backward(dT.p, dTok.p, dO.p, N, C);
      // the same fp32 additions in the same order (a stable sort of the positions by id)
      compare(r, "dtable", dT.download(), dtable, {0, 0});
    });
  }
  for (auto [N, C, V, chunk] : std::vector<std::array<int64_t, 4>>{{1, 8, 5, 1}, {37, 64, 1000, 16}, {256, 128, 5003, 100}}) {
    // bf16: the head of precision.high_precision = bf16 (W's bf16 copy made once, the
    // cross-entropy kernel writing the gradient's bf16 copy, bf16 GEMMs) against the CPU twin
    // (fp32 copies of the same roundings). Both round identical fp32 values except where the
    // two fp32 logits sums differ in the last bits and land on either side of a bf16 midpoint
    // (a 2^-8 relative step of one gradient element), hence the looser element tolerance.
    for (bool bf16 : {false, true})
      run_case(bf16 ? "head_cross_entropy_bf16" : "head_cross_entropy", dims({N, C, V}) + " chunk" + std::to_string(chunk), [&](Result& r) {
        const HeadOperands ops = bf16 ? HeadOperands::kBf16 : HeadOperands::kFp32;
        auto h = randn(N * C), w = randn(V * C, 0.1f), dwv = randn(V * C);
        auto tgt = randint(N, int32_t(V));
        const int64_t wsn = head_workspace_floats(chunk, C, V, ops);
        std::vector<float> dh(N * C), ws(wsn);
        Dev<float> dH(h), dW(w), dDW(dwv), dDH(N * C), dWS(wsn);
        Dev<int32_t> dT(tgt);
        const float gs = 1.0f / float(N);
        const double lc = cpu.head_cross_entropy(dh.data(), dwv.data(), h.data(), w.data(), tgt.data(), N, C, V, gs, ws.data(), chunk, ops);
        const double lg = gpu.head_cross_entropy(dDH.p, dDW.p, dH.p, dW.p, dT.p, N, C, V, gs, dWS.p, chunk, ops);
        const Tol tol = bf16 ? Tol{1e-4, 1e-2} : Tol{1e-5, 1e-3};
        compare(r, "loss", {float(lg)}, {float(lc)}, kReduction);
        compare(r, "dh", dDH.download(), dh, tol);
        compare(r, "dw", dDW.download(), dwv, tol);
        compare(r, "h", dH.download(), h, {0, 0});  // the inputs stay as they were
        compare(r, "w", dW.download(), w, {0, 0});
      });
  }
  // precision.fp8_head: h and W E4M3 at their whole tensors' current scales, the logits
  // gradient E5M2 at its bound's, against the CPU twin (fp32 copies of the FP8 values, fp32
  // GEMMs). Shapes whose every dimension and chunk is a multiple of 16 take the FP8 GEMMs where
  // the GPU has them; the others (37 rows, V = 1000) the device's fp32 copies (fp8_round). The
  // quantized operands are the same values on both; the logits are sums in another order (and
  // on Hopper's FP8 tensor cores at their accumulator's precision), so a gradient element can
  // land on the other side of an E5M2 midpoint and move by a step (2^-2 of itself at most):
  // hence the element tolerances, and the case also requires the FP8 rounding to be visible
  // (the fp32 head's dh lies far outside them) and most of dh to agree to fp32 noise. The
  // telemetry's gradient amax (head_fp8_grad_amax) against the twin's; "peaked": each row's
  // target made likely (h_r += 24 w_t: p_t near 1), so the target element's value before its
  // - grad_scale (p_t grad_scale, far above the true amax then) must be left out of it.
  // "bf16 dgrad": HeadOperands::kFp8Bf16Dgrad (precision.fp8_head_dgrad = bf16, the default):
  // dh from the bf16 copies the kernel and the call write, a bf16 GEMM (the twin: fp32 copies
  // of the bf16 values, an fp32 GEMM).
  for (auto [N, C, V, chunk, peaked, bf16_dgrad] : std::vector<std::array<int64_t, 6>>{{37, 64, 1000, 16, 0, 0}, {64, 64, 1008, 16, 0, 0}, {256, 128, 5008, 96, 0, 0}, {256, 128, 5008, 256, 0, 0}, {37, 64, 1000, 16, 1, 0}, {64, 64, 1008, 16, 1, 0}, {37, 64, 1000, 16, 0, 1}, {256, 128, 5008, 96, 0, 1}, {64, 64, 1008, 16, 1, 1}})
    run_case("head_cross_entropy_fp8", dims({N, C, V}) + " chunk" + std::to_string(chunk) + (peaked ? " peaked" : "") + (bf16_dgrad ? " bf16 dgrad" : ""), [&](Result& r) {
      const HeadOperands ops = bf16_dgrad ? HeadOperands::kFp8Bf16Dgrad : HeadOperands::kFp8;
      // Each case's inputs from its own seed, not from wherever the shared generator stands:
      // "peaked" must hold for its draw (below), and cases added before these moved the draws
      // (a row whose target was not likely enough failed it)
      rng.seed(0x4ead0000u + uint64_t(N * 7 + C * 3 + V + chunk * 11 + peaked * 5 + bf16_dgrad));
      auto h = randn(N * C), w = randn(V * C, 0.1f), dw0 = randn(V * C);
      auto tgt = randint(N, int32_t(V));
      if (peaked)
        for (int64_t i = 0; i < N; ++i)
          for (int64_t c = 0; c < C; ++c) h[i * C + c] += 24.0f * w[tgt[i] * C + c];
      const int64_t wsn = head_workspace_floats(chunk, C, V, ops);
      std::vector<float> dh(N * C), dwv = dw0, ws(wsn), dh32(N * C), dw32 = dw0, ws32(chunk * V);
      Dev<float> dH(h), dW(w), dDW(dw0), dDH(N * C), dWS(wsn);  // (made poisoned)
      Dev<int32_t> dT(tgt);
      const float gs = 1.0f / float(N);
      const double lc = cpu.head_cross_entropy(dh.data(), dwv.data(), h.data(), w.data(), tgt.data(), N, C, V, gs, ws.data(), chunk, ops);
      const double lg = gpu.head_cross_entropy(dDH.p, dDW.p, dH.p, dW.p, dT.p, N, C, V, gs, dWS.p, chunk, ops);
      const float amax_c = cpu.head_fp8_grad_amax(), amax_g = gpu.head_fp8_grad_amax();
      cpu.head_cross_entropy(dh32.data(), dw32.data(), h.data(), w.data(), tgt.data(), N, C, V, gs, ws32.data(), chunk, HeadOperands::kFp32);
      compare(r, "loss", {float(lg)}, {float(lc)}, Tol{1e-5, 1e-4});
      compare(r, "gradient amax", {amax_g}, {amax_c}, Tol{0, 1e-3});
      r.note += str("gradient amax ", amax_c / gs, " of its bound; ");
      if (peaked && !(amax_c < 0.5f * gs)) r.pass = false;  // the case is what it says
      dWS.poison();  // forward only (validation): the same loss, no gradient
      const double le = gpu.head_cross_entropy(nullptr, nullptr, dH.p, dW.p, dT.p, N, C, V, gs, dWS.p, chunk, ops);
      compare(r, "loss (forward only)", {float(le)}, {float(lc)}, Tol{1e-5, 1e-4});
      const Tol tol{1e-3 * gs, 2e-2};
      const auto gdh = dDH.download(), gdw = dDW.download();
      compare(r, "dh", gdh, dh, tol);
      compare(r, "dw", gdw, dwv, tol);
      compare(r, "h", dH.download(), h, {0, 0});  // the inputs stay as they were
      compare(r, "w", dW.download(), w, {0, 0});
      int64_t close = 0, visible = 0;
      for (int64_t i = 0; i < N * C; ++i) {
        close += std::fabs(gdh[i] - dh[i]) <= 1e-5 * gs + 1e-4 * std::fabs(dh[i]);
        visible += std::fabs(dh32[i] - dh[i]) > tol.atol + tol.rtol * std::fabs(dh[i]);
      }
      r.note += str("dh within fp32 noise ", close, " of ", N * C, ", FP8 rounding visible at ",
                    visible, "; ");
      // (peaked rows' gradients are small beside the tolerance: the rounding hides in it there;
      // so does the logits' FP8 rounding alone, which is all a bf16 data gradient shows)
      if (close * 10 < N * C * 9 || (!peaked && !bf16_dgrad && visible * 10 < N * C))
        r.pass = false;
      if (bf16_dgrad) {  // the all-FP8 head's dh lies outside that noise: the mode is seen
        std::vector<float> dh8(N * C), dw8 = dw0, ws8(head_workspace_floats(chunk, C, V, HeadOperands::kFp8));
        cpu.head_cross_entropy(dh8.data(), dw8.data(), h.data(), w.data(), tgt.data(), N, C, V, gs, ws8.data(), chunk, HeadOperands::kFp8);
        int64_t apart = 0;
        for (int64_t i = 0; i < N * C; ++i)
          apart += std::fabs(dh8[i] - dh[i]) > 1e-5 * gs + 1e-4 * std::fabs(dh[i]);
        r.note += str("the all-FP8 dh apart at ", apart, "; ");
        if (apart * 10 < N * C) r.pass = false;
      }
    });
  run_case("round_bf16", dims({4099}), [&](Result& r) {
    auto x = randn(4099, 3.0f);
    x[0] = 1.0f + 1.0f / 256;  // ties to even
    x[1] = 1.0f + 3.0f / 256;
    std::vector<float> y(x.size());
    Dev<float> dX(x), dY(x.size());
    cpu.round_bf16(y.data(), x.data(), int64_t(x.size()));
    gpu.round_bf16(dY.p, dX.p, int64_t(x.size()));
    compare(r, "y", dY.download(), y, {0, 0});
    gpu.round_bf16(dX.p, dX.p, int64_t(x.size()));  // in place
    compare(r, "y in place", dX.download(), y, {0, 0});
  });
  // precision.activations = bf16: the rounded activation in place and its kept codes, then the
  // codes widened back, bit for bit as the CPU twin (NaN, infinities and ties included).
  run_case("pack_bf16", dims({4099}), [&](Result& r) {
    auto x = randn(4099, 3.0f);
    x[0] = 1.0f + 1.0f / 256;
    x[1] = 1.0f + 3.0f / 256;
    x[2] = std::numeric_limits<float>::infinity();
    x[3] = -3.4e38f;  // rounds to -inf
    x[4] = 1e-40f;    // subnormal
    x[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> y = x;
    std::vector<uint16_t> codes(x.size());
    cpu.pack_bf16(y.data(), codes.data(), int64_t(x.size()));
    Dev<float> dX(x);
    Dev<uint16_t> dC(x.size());
    gpu.pack_bf16(dX.p, dC.p, int64_t(x.size()));
    compare(r, "x rounded", dX.download(), y, {0, 0});
    const auto got = dC.download();
    std::vector<uint8_t> gb(got.size() * 2), wb(codes.size() * 2);
    std::memcpy(gb.data(), got.data(), gb.size());
    std::memcpy(wb.data(), codes.data(), wb.size());
    expect_bytes(r, "codes", gb, wb);
    Dev<float> dW(x.size());
    std::vector<float> w(x.size());
    cpu.unpack_bf16(w.data(), codes.data(), int64_t(x.size()));
    gpu.unpack_bf16(dW.p, dC.p, int64_t(x.size()));
    compare(r, "unpacked", dW.download(), w, {0, 0});
    Dev<float> dX2(x);
    gpu.pack_bf16(dX2.p, nullptr, int64_t(x.size()));  // no codes: rounding only
    compare(r, "x rounded, no codes", dX2.download(), y, {0, 0});
  });
  // The codes alone (the bf16 path's GEMM operands), x untouched: bit for bit as the CPU twin,
  // NaN, infinities, overflow to inf, ties and subnormals included.
  run_case("to_bf16", dims({4099}), [&](Result& r) {
    auto x = randn(4099, 3.0f);
    x[0] = 1.0f + 1.0f / 256;  // tie, to even (down)
    x[1] = 1.0f + 3.0f / 256;  // tie, to even (up)
    x[2] = -std::numeric_limits<float>::infinity();
    x[3] = 3.4e38f;  // rounds to +inf
    x[4] = 1e-40f;   // subnormal
    x[5] = -1e-45f;  // smallest subnormal
    x[6] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint16_t> codes(x.size());
    cpu.to_bf16(codes.data(), x.data(), int64_t(x.size()));
    Dev<float> dX(x);
    Dev<uint16_t> dC(x.size());
    gpu.to_bf16(dC.p, dX.p, int64_t(x.size()));
    const auto got = dC.download();
    std::vector<uint8_t> gb(got.size() * 2), wb(codes.size() * 2);
    std::memcpy(gb.data(), got.data(), gb.size());
    std::memcpy(wb.data(), codes.data(), wb.size());
    expect_bytes(r, "codes", gb, wb);
    expect_floats(r, "x", dX.download(), x);  // unchanged, bit for bit
  });
}

// A backend with a small scratch arena (and no cuBLASLt workspace), for the attention cases
// that run in groups of sequences, and the error where not even one fits: `call` must throw
// an error naming MXTRAIN_CUDA_SCRATCH_MB.
std::unique_ptr<CudaBackend> small_scratch_backend(size_t scratch, CudaAttention attention) {
  CudaBackendOptions o;
  o.sync_after_each_op = true;
  o.attention = attention;
  o.scratch_bytes = scratch;
  o.gemm_workspace_bytes = 0;
  return make_cuda_backend(o);
}
void expect_scratch_error(Result& r, const std::function<void()>& call) {
  try {
    call();
    r.pass = false;
    r.note = "no error";
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("MXTRAIN_CUDA_SCRATCH_MB") == std::string::npos) {
      r.pass = false;
      r.note = std::string("wrong error: ") + e.what();
    }
  }
}

// The bf16 entry points' fp32-kernel fallback, a group of sequences at a time
// (in_sequence_groups): on a backend whose scratch holds one sequence's widened operands
// (about 1.0 MB at 200 x 8 x 64 with 2 KV heads), 3 sequences take 3 groups, against the CPU
// twin at attention_forward_bf16's tolerances; with a scratch too small for one sequence, an
// error naming MXTRAIN_CUDA_SCRATCH_MB.
void check_attention_groups(Backend& cpu) {
  const int64_t B = 3, T = 200, H = 8, KV = 2, D = 64;
  const std::string sh = dims({B, T, H, KV, D});
  auto q = randn(B * T * H * D), k = randn(B * T * KV * D), v = randn(B * T * KV * D);
  const auto q16 = bf16_codes(q), k16 = bf16_codes(k), v16 = bf16_codes(v);
  std::vector<uint16_t> out16(q.size());
  std::vector<float> lse(B * H * T);
  cpu.attention_forward_bf16(out16.data(), lse.data(), q16.data(), k16.data(), v16.data(), B, T, H, KV, D);
  auto backend = [](size_t scratch) { return small_scratch_backend(scratch, CudaAttention::kFp32); };
  const size_t one_sequence = 4 * (2 * T * H * D + 2 * T * KV * D + H * T);  // backward's
  auto gpu = backend(one_sequence + one_sequence / 2);
  run_case("attention_bf16_groups", sh + " fwd", [&](Result& r) {
    Dev<uint16_t> dq(q16), dk(k16), dv(v16), dout(out16.size());
    Dev<float> dlse(lse.size());
    gpu->attention_forward_bf16(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
    compare(r, "out", widen(dout.download()), widen(out16), {kAttention.atol, kAttention.rtol + kBf16Ulp});
    compare(r, "lse", dlse.download(), lse, kAttention);
  });
  run_case("attention_bf16_groups", sh + " bwd", [&](Result& r) {
    const auto g = randn(out16.size());
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    cpu.attention_backward_bf16(dq.data(), dk.data(), dv.data(), g.data(), q16.data(), k16.data(), v16.data(), out16.data(), lse.data(), B, T, H, KV, D);
    Dev<uint16_t> dQ(q16), dK(k16), dV(v16), dO(out16);
    Dev<float> dL(lse), dG(g), dDQ(dq.size()), dDK(dk.size()), dDV(dv.size());
    gpu->attention_backward_bf16(dDQ.p, dDK.p, dDV.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H, KV, D);
    const Tol t{1e-4, 1e-3};
    compare(r, "dq", dDQ.download(), dq, t);
    compare(r, "dk", dDK.download(), dk, t);
    compare(r, "dv", dDV.download(), dv, t);
  });
  run_case("attention_bf16_groups", sh + " no room", [&](Result& r) {
    auto small = backend(one_sequence / 2);
    Dev<uint16_t> dq(q16), dk(k16), dv(v16), dout(out16.size());
    Dev<float> dlse(lse.size());
    expect_scratch_error(r, [&] {
      small->attention_forward_bf16(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
    });
  });
}

// One cuDNN attention shape against its CPU twin: random q, k, v, the twin's forward on them
// rounded to bf16 (RNE, what cuDNN reads), and the two checks at the attention_cudnn_*
// tolerances: out 2e-2 of max |out|, lse 1e-3 of max |lse|; dq, dk, dv 3e-2 of each tensor's
// max (the twin's backward takes dout and out rounded to bf16, as cuDNN sees them).
struct CudnnAttentionCase {
  int64_t B, T, H, KV, D;
  std::vector<float> q, k, v, qb, kb, vb, out, lse;
  CudnnAttentionCase(Backend& cpu, int64_t B_, int64_t T_, int64_t H_, int64_t KV_, int64_t D_)
      : B(B_), T(T_), H(H_), KV(KV_), D(D_), q(randn(B * T * H * D)), k(randn(B * T * KV * D)),
        v(randn(B * T * KV * D)), qb(round_bf16(q)), kb(round_bf16(k)), vb(round_bf16(v)),
        out(B * T * H * D), lse(B * H * T) {
    cpu.attention_forward(out.data(), lse.data(), qb.data(), kb.data(), vb.data(), B, T, H, KV, D);
  }
  void forward(Result& r, CudaBackend& gpu) const {
    Dev<float> dq(q), dk(k), dv(v), dout(out.size()), dlse(lse.size());
    gpu.attention_forward(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
    compare(r, "out", dout.download(), out, {2e-2 * max_abs(out), 0.0});
    compare(r, "lse", dlse.download(), lse, {1e-3 * max_abs(lse), 0.0});
  }
  void backward(Result& r, Backend& cpu, CudaBackend& gpu) const {
    const auto g = randn(out.size());
    const auto gb = round_bf16(g), ob = round_bf16(out);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    cpu.attention_backward(dq.data(), dk.data(), dv.data(), gb.data(), qb.data(), kb.data(),
                           vb.data(), ob.data(), lse.data(), B, T, H, KV, D);
    Dev<float> dQ(q), dK(k), dV(v), dO(out), dL(lse), dG(g), dDQ(dq.size()), dDK(dk.size()),
        dDV(dv.size());
    gpu.attention_backward(dDQ.p, dDK.p, dDV.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H, KV, D);
    compare(r, "dq", dDQ.download(), dq, {3e-2 * max_abs(dq), 0.0});
    compare(r, "dk", dDK.download(), dk, {3e-2 * max_abs(dk), 0.0});
    compare(r, "dv", dDV.download(), dv, {3e-2 * max_abs(dv), 0.0});
  }
};

// FP8 fast accumulation (MXTRAIN_CUDA_FP8_FAST_ACCUM, CudaFp8FastAccum): the per-tensor FP8
// GEMMs of fp8_gemm_* on a backend with it on every GEMM ("all"), against the same CPU GEMM of
// the dequantized operands at 8 times kFp8Gemm of each row's max |value| (2^-7 on a GPU: the
// partial sums are no longer promoted to fp32, so a K = 2048 row's error grows past the
// promoting GEMMs' 2^-10; a wrong scale or code is still a whole row off). Then which GEMMs
// took it, counted by the backend: every one under "all"; under "fprop" the E4M3 x E4M3 ones
// (the recipes' forward GEMMs) and not E5M2 x E4M3 (their gradients'). The note has each
// form's worst error, for the record of what fast accumulation costs on the GPU that ran it.
void check_fp8_fast_accum(Backend& cpu) {
  for (CudaFp8FastAccum mode : {CudaFp8FastAccum::kAll, CudaFp8FastAccum::kForward}) {
    CudaBackendOptions o;
    o.sync_after_each_op = true;
    o.fp8_fast_accum = mode;
    auto fast = make_cuda_backend(o);
    if (!fast->fp8_tensor_cores()) return;
    const std::string form = mode == CudaFp8FastAccum::kAll ? "all" : "fprop";
    int64_t want = 0;
    for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{48, 64, 80}, {128, 96, 2048}})
      for (Format af : {Format::kE4M3, Format::kE5M2}) {
        want += mode == CudaFp8FastAccum::kAll || af == Format::kE4M3;
        run_case("fp8_gemm_fast_accum",
                 form + (af == Format::kE4M3 ? " e4m3xe4m3 " : " e5m2xe4m3 ") + dims({M, N, K}),
                 [&](Result& r) {
          auto a = randn(M * K), b = randn(N * K, 0.05f), c = randn(M * N);
          const auto qa = numerics::quantize_fp8_current(a.data(), M, K, af);
          const auto qb = numerics::quantize_fp8_current(b.data(), N, K, Format::kE4M3);
          Dev<uint8_t> da(qa.codes), db(qb.codes);
          Dev<float> das(qa.scales_f32), dbs(qb.scales_f32), dc(c);
          cpu.gemm(false, true, M, N, K, 1.0f, qa.dequant.data(), qb.dequant.data(), 1.0f, c.data());
          fast->fp8_gemm(M, N, K, da.p, af, das.p, db.p, Format::kE4M3, dbs.p, 1.0f, dc.p);
          compare_rows(r, "C", dc.download(), c, N, 8.0);
        });
      }
    run_case("fp8_gemm_fast_accum", form + " gemms counted", [&](Result& r) {
      const int64_t got = fast->fp8_fast_accum_gemms();
      r.note = "fast " + std::to_string(got) + " of 4, expected " + std::to_string(want);
      r.pass = got == want;
    });
  }
}

// run.deterministic (Backend::set_deterministic) on a backend that would time every GEMM
// shape's candidates (MXTRAIN_CUDA_GEMM_TUNE=all): after it no shape is timed, a GEMM matches
// the CPU and repeats its bits; the attention backward (cuDNN's deterministic algorithm where
// cuDNN runs the shape, on a GPU; the fp32 kernel under mxemu) matches the CPU twin at
// attention_cudnn_*'s tolerances and gives the same bits twice on the same inputs. The note
// names the attention that ran.
void check_deterministic(Backend& cpu) {
  CudaBackendOptions o;
  o.sync_after_each_op = true;
  o.gemm_tune = CudaGemmTune::kAll;
  auto det = make_cuda_backend(o);
  bool set = false;
  run_case("deterministic", "set_deterministic", [&](Result& r) {
    r.note = det->set_deterministic();
    set = true;
  });
  if (!set) return;  // (its error is the case's note)
  run_case("deterministic", "gemm 64x48x80, twice", [&](Result& r) {
    const int64_t M = 64, N = 48, K = 80;
    const auto A = randn(M * K), B = randn(K * N);
    std::vector<float> C(M * N);
    cpu.gemm(false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
    Dev<float> dA(A), dB(B), dC(M * N);
    det->gemm(false, false, M, N, K, 1.0f, dA.p, dB.p, 0.0f, dC.p);
    const auto first = dC.download();
    det->gemm(false, false, M, N, K, 1.0f, dA.p, dB.p, 0.0f, dC.p);
    compare(r, "C", first, C, {kGemm.atol * std::sqrt(double(K)), kGemm.rtol});
    r.note += "shapes timed " + std::to_string(det->gemm_shapes_timed());
    if (det->gemm_shapes_timed() != 0) r.pass = false;
    if (dC.download() != first) r.pass = false, r.note += "; the second call's bits differ";
  });
  const int64_t B = 2, T = 128, H = 4, KV = 2, D = 64;
  det->set_attention(CudaAttention::kCudnn);
  run_case("deterministic", "attention_backward " + dims({B, T, H, KV, D}) + ", twice", [&](Result& r) {
    r.note = "attention " + det->attention_path(B, T, H, KV, D) + "; ";
    const CudnnAttentionCase c(cpu, B, T, H, KV, D);
    c.backward(r, cpu, *det);
    const auto g = randn(c.out.size());
    Dev<float> dQ(c.q), dK(c.k), dV(c.v), dO(c.out), dL(c.lse), dG(g);
    std::vector<float> got[2][3];
    for (auto& run : got) {
      Dev<float> dDQ(c.q.size()), dDK(c.k.size()), dDV(c.v.size());
      det->attention_backward(dDQ.p, dDK.p, dDV.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H,
                              KV, D);
      run[0] = dDQ.download(), run[1] = dDK.download(), run[2] = dDV.download();
    }
    const char* names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i)
      if (got[0][i] != got[1][i]) r.pass = false, r.note += std::string(names[i]) + ": two runs differ; ";
  });
}

// FP8 attention (Backend::attention_forward_fp8 / _backward_fp8: cuDNN's fused FP8 SDPA) against
// the CPU twin on the same fp32 inputs. Both cast q, k, v with the same per-tensor power-of-two
// scales (the same codes), but cuDNN rounds the probabilities as its tiles make them (from a
// running maximum, before the division by the row sum), where the twin rounds the normalized
// ones, so the two differ by FP8 noise, not by fp32 rounding. Tolerances (guesses before any
// run): out one E4M3 step (2^-3 relative) + 3e-2 of max |out|; lse 1e-3 of max |lse| (fp32
// scores of the same codes); dq, dk, dv one E5M2 step (2^-2) + 5e-2 of each tensor's max. The
// note gives each side's largest error against fp32 attention on the same inputs, the scale of
// the FP8 noise itself. Then, at the Llama-3.2-1B shape (B=2 T=8192 H=32 KV=8 D=64), the time
// of a forward + backward through the fp32 entry points, bf16 cuDNN against FP8 cuDNN (each with
// its casts), the first measure of what FP8 attention saves.
const std::string kFp8OnCudnn = "on cuDNN's fused FP8 SDPA";  // attention_fp8_path's
// The GPU's compute capability (major); 0 where it cannot be read.
int gpu_major() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return cudaGetLastError(), 0;
  return prop.major;
}
[[maybe_unused]] void check_attention_fp8(Backend& cpu, CudaBackend& gpu) {
  gpu.set_attention(CudaAttention::kCudnn);
  // (T = 77, not a multiple of 64, may be refused by cuDNN's FP8 engines, and below compute
  // capability 10 cuDNN's FP8 backward takes head dim 128 only (the frontend's
  // sdpa_fp8_bwd.h): a refusal there is a pass with the reason in its note, as the trainer
  // would refuse the shape at start-up; the others must run)
  const bool d128_only = gpu_major() < 10;
  for (auto [B, T, H, KV, D] : std::vector<std::array<int64_t, 5>>{
           {2, 256, 8, 2, 64}, {1, 128, 4, 4, 128}, {2, 192, 8, 1, 64}, {2, 77, 8, 1, 64},
           {2, 256, 8, 2, 128}}) {
    const std::string sh = dims({B, T, H, KV, D});
    // "" on cuDNN, else the path that would run instead (the fp32 kernel: its own case)
    const std::string path = gpu.attention_fp8_path(B, T, H, KV, D);
    const std::string why = path == kFp8OnCudnn ? "" : path;
    if (!why.empty() && (T % 64 != 0 || (d128_only && D != 128))) {
      run_case("attention_fp8_forward", sh, [&](Result& r) { r.note = "refused: " + why; });
      continue;
    }
    const size_t nq = B * T * H * D, nk = B * T * KV * D;
    const auto q = randn(nq), k = randn(nk), v = randn(nk), g = randn(nq);
    std::vector<float> out(nq), lse(B * H * T), out32(nq), lse32(B * H * T);
    cpu.attention_forward_fp8(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
    cpu.attention_forward(out32.data(), lse32.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
    auto max_err = [](const std::vector<float>& a, const std::vector<float>& b) {
      double e = 0;
      for (size_t i = 0; i < a.size(); ++i) e = std::max(e, double(std::fabs(a[i] - b[i])));
      return e;
    };
    run_case("attention_fp8_forward", sh, [&](Result& r) {
      if (!why.empty()) {
        r.pass = false;
        r.note = "not on cuDNN: " + why;
        return;
      }
      Dev<float> dq(q), dk(k), dv(v), dout(nq), dlse(lse.size());
      gpu.attention_forward_fp8(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
      const auto got = dout.download();
      compare(r, "out", got, out, {3e-2 * max_abs(out), 0.125});
      compare(r, "lse", dlse.download(), lse, {1e-3 * max_abs(lse), 0.0});
      r.note += "max |out - fp32 attention|: gpu " + std::to_string(max_err(got, out32)) +
                ", twin " + std::to_string(max_err(out, out32)) + " (max |out| " +
                std::to_string(max_abs(out32)) + ")";
    });
    run_case("attention_fp8_backward", sh, [&](Result& r) {
      if (!why.empty()) {
        r.pass = false;
        r.note = "not on cuDNN: " + why;
        return;
      }
      std::vector<float> dq(nq), dk(nk), dv(nk), dq32(nq), dk32(nk), dv32(nk);
      cpu.attention_backward_fp8(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(),
                                 v.data(), out.data(), lse.data(), B, T, H, KV, D);
      cpu.attention_backward(dq32.data(), dk32.data(), dv32.data(), g.data(), q.data(), k.data(),
                             v.data(), out32.data(), lse32.data(), B, T, H, KV, D);
      Dev<float> dQ(q), dK(k), dV(v), dO(out), dL(lse), dG(g), dDQ(nq), dDK(nk), dDV(nk);
      gpu.attention_backward_fp8(dDQ.p, dDK.p, dDV.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T,
                                 H, KV, D);
      const auto gq = dDQ.download();
      compare(r, "dq", gq, dq, {5e-2 * max_abs(dq), 0.25});
      compare(r, "dk", dDK.download(), dk, {5e-2 * max_abs(dk), 0.25});
      compare(r, "dv", dDV.download(), dv, {5e-2 * max_abs(dv), 0.25});
      r.note += "max |dq - fp32 attention's|: gpu " + std::to_string(max_err(gq, dq32)) +
                ", twin " + std::to_string(max_err(dq, dq32)) + " (max |dq| " +
                std::to_string(max_abs(dq32)) + ")";
    });
    // The bf16 path's forms (codes in, codes out) against the twin's on the same codes, at the
    // same tolerances: the same kernels behind other casts and decodes.
    run_case("attention_fp8_bf16", sh, [&](Result& r) {
      if (!why.empty()) {
        r.pass = false;
        r.note = "not on cuDNN: " + why;
        return;
      }
      const auto q16 = bf16_codes(q), k16 = bf16_codes(k), v16 = bf16_codes(v), g16 = bf16_codes(g);
      std::vector<uint16_t> o16(nq), dq16(nq), dk16(nk), dv16(nk);
      std::vector<float> l(B * H * T);
      cpu.attention_forward_fp8_bf16(o16.data(), l.data(), q16.data(), k16.data(), v16.data(), B,
                                     T, H, KV, D);
      cpu.attention_backward_fp8_codes(dq16.data(), dk16.data(), dv16.data(), g16.data(),
                                       q16.data(), k16.data(), v16.data(), o16.data(), l.data(),
                                       B, T, H, KV, D);
      Dev<uint16_t> dq(q16), dk(k16), dv(v16), dg(g16), dout(nq), ddq(nq), ddk(nk), ddv(nk);
      Dev<float> dl(l.size());
      gpu.attention_forward_fp8_bf16(dout.p, dl.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
      const auto out_w = widen(o16);
      compare(r, "out", widen(dout.download()), out_w, {3e-2 * max_abs(out_w), 0.125});
      compare(r, "lse", dl.download(), l, {1e-3 * max_abs(l), 0.0});
      Dev<uint16_t> o_twin(o16);
      Dev<float> l_twin(l);
      gpu.attention_backward_fp8_codes(ddq.p, ddk.p, ddv.p, dg.p, dq.p, dk.p, dv.p, o_twin.p,
                                       l_twin.p, B, T, H, KV, D);
      for (auto [name, dev, want] : {std::tuple{"dq", &ddq, &dq16}, std::tuple{"dk", &ddk, &dk16},
                                     std::tuple{"dv", &ddv, &dv16}}) {
        const auto w = widen(*want);
        compare(r, name, widen(dev->download()), w, {5e-2 * max_abs(w), 0.25});
      }
    });
  }
  // The timing at the 1B shape (below compute capability 10, where cuDNN's FP8 backward takes
  // head dim 128 only, with its widths as 16 heads of 128: the same FLOPs).
  const int64_t B = 2, T = 8192, H = d128_only ? 16 : 32, KV = d128_only ? 4 : 8,
                D = d128_only ? 128 : 64;
  run_case("attention_fp8_speed", dims({B, T, H, KV, D}), [&](Result& r) {
    const std::string fp8_path = gpu.attention_fp8_path(B, T, H, KV, D);
    const std::string why = fp8_path == kFp8OnCudnn ? "" : fp8_path;
    const std::string path = gpu.attention_path(B, T, H, KV, D);
    if (!why.empty() || path != "cudnn") {
      r.pass = false;
      r.note = "not on cuDNN: " + (why.empty() ? path : why);
      return;
    }
    const size_t nq = B * T * H * D, nk = B * T * KV * D;
    Dev<float> q(randn(nq)), k(randn(nk)), v(randn(nk)), g(randn(nq)), out(nq), lse(B * H * T),
        dq(nq), dk(nk), dv(nk);
    auto time_ms = [&](auto&& fn) {
      fn();  // warm-up (graph building on the first call)
      gpu.synchronize();
      const int reps = 5;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) fn();
      gpu.synchronize();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count() / reps;
    };
    const double bf_f = time_ms([&] {
      gpu.attention_forward(out.p, lse.p, q.p, k.p, v.p, B, T, H, KV, D);
    });
    const double bf_b = time_ms([&] {
      gpu.attention_backward(dq.p, dk.p, dv.p, g.p, q.p, k.p, v.p, out.p, lse.p, B, T, H, KV, D);
    });
    const double f8_f = time_ms([&] {
      gpu.attention_forward_fp8(out.p, lse.p, q.p, k.p, v.p, B, T, H, KV, D);
    });
    const double f8_b = time_ms([&] {
      gpu.attention_backward_fp8(dq.p, dk.p, dv.p, g.p, q.p, k.p, v.p, out.p, lse.p, B, T, H, KV,
                                 D);
    });
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "ms, fp32 entry points with their casts: bf16 fwd %.2f bwd %.2f; fp8 fwd %.2f "
                  "bwd %.2f; fp8 / bf16 time %.3f",
                  bf_f, bf_b, f8_f, f8_b, (f8_f + f8_b) / (bf_f + bf_b));
    r.note = buf;
    std::printf("attention_fp8_speed %s: %s\n", dims({B, T, H, KV, D}).c_str(), buf);
  });
}

// cuDNN's attention in groups of sequences (cudnn_in_groups): on a backend whose scratch arena
// holds the bf16 copies and workspace of two sequences (backward's, from
// cudnn_attention_scratch_bytes) but not three, B = 3 runs as 2 + 1, against the CPU twin at
// attention_cudnn_*'s tolerances (fp32 entry points, and the bf16 path's forward); with room for
// less than one sequence's forward, an error naming MXTRAIN_CUDA_SCRATCH_MB.
[[maybe_unused]] void check_attention_cudnn_groups(Backend& cpu, CudaBackend& gpu) {
  const int64_t B = 3, T = 200, H = 8, KV = 2, D = 64;
  const std::string sh = dims({B, T, H, KV, D});
  gpu.set_attention(CudaAttention::kCudnn);
  const size_t two = gpu.cudnn_attention_scratch_bytes(2, T, H, KV, D, true);
  const size_t three = gpu.cudnn_attention_scratch_bytes(3, T, H, KV, D, true);
  const size_t one = gpu.cudnn_attention_scratch_bytes(1, T, H, KV, D, true);
  if (two == 0 || one == 0) {
    run_case("attention_cudnn_groups", sh, [&](Result& r) {
      r.pass = false;
      r.note = "cuDNN does not run the shape: " + gpu.attention_path(B, T, H, KV, D);
    });
    return;
  }
  auto backend = [](size_t scratch) { return small_scratch_backend(scratch, CudaAttention::kCudnn); };
  const CudnnAttentionCase c(cpu, B, T, H, KV, D);
  const std::vector<float>&q = c.q, &k = c.k, &v = c.v, &out = c.out, &lse = c.lse;
  auto small = backend(two);
  const std::string note = "scratch " + std::to_string(two) + " B: two sequences (" +
                           std::to_string(three) + " for three)";
  run_case("attention_cudnn_groups", sh + " fwd", [&](Result& r) {
    r.note = note;
    c.forward(r, *small);
  });
  run_case("attention_cudnn_groups", sh + " bwd", [&](Result& r) {
    r.note = note;
    c.backward(r, cpu, *small);
  });
  run_case("attention_cudnn_groups", sh + " fwd bf16", [&](Result& r) {
    r.note = note;
    const auto q16 = bf16_codes(q), k16 = bf16_codes(k), v16 = bf16_codes(v);
    Dev<uint16_t> dq(q16), dk(k16), dv(v16), dout(out.size());
    Dev<float> dlse(lse.size());
    small->attention_forward_bf16(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
    compare(r, "out", widen(dout.download()), out, {2e-2 * max_abs(out), kBf16Ulp});
    compare(r, "lse", dlse.download(), lse, {1e-3 * max_abs(lse), 0.0});
  });
  run_case("attention_cudnn_groups", sh + " no room", [&](Result& r) {
    // Half of what the forward needs for one sequence (its own size: on an H200 the forward
    // ran in half of the backward's, and this case saw no error).
    auto tiny = backend(gpu.cudnn_attention_scratch_bytes(1, T, H, KV, D, false) / 2);
    Dev<float> dq(q), dk(k), dv(v), dout(out.size()), dlse(lse.size());
    expect_scratch_error(r, [&] {
      tiny->attention_forward(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
    });
  });
}

// FP8 attention on the fp32 kernel (MXTRAIN_CUDA_ATTENTION=fp32, or where cuDNN's FP8 SDPA
// does not take a shape): the CPU twin's steps on the device, so against the twin both the
// values (attention_fp8_*'s tolerances) and the bits: the only difference is the fp32 sums'
// order and expf, which moves a value across an FP8 rounding boundary rarely, so at least 98%
// of each output must be the twin's exact value. The amaxes (telemetry) within 1e-3 of the
// twin's. fp32 and bf16-code forms; B = 3 on a scratch arena with room for one sequence runs
// the groups (in_sequence_groups) with the same bits. Runs under mxemu too.
void check_attention_fp8_kernel(Backend& cpu, CudaBackend& gpu) {
  gpu.set_attention(CudaAttention::kFp32);
  auto same_share = [](Result& r, const char* what, const std::vector<float>& got,
                       const std::vector<float>& want) {
    size_t same = 0;
    for (size_t i = 0; i < got.size(); ++i) same += got[i] == want[i];
    const double share = got.empty() ? 1.0 : double(same) / double(got.size());
    r.note += std::string(what) + " " + std::to_string(share).substr(0, 6) + " exact; ";
    if (share < 0.98) r.pass = false;
  };
  auto near = [](Result& r, const char* what, float got, float want) {
    if (!(std::fabs(got - want) <= 1e-3f * std::fabs(want)) || !(want > 0.0f)) {
      r.pass = false;
      r.note += std::string(what) + " amax " + std::to_string(got) + " (twin " +
                std::to_string(want) + "); ";
    }
  };
  for (auto [B, T, H, KV, D] : std::vector<std::array<int64_t, 5>>{
           {2, 70, 4, 2, 16}, {1, 40, 2, 1, 64}, {3, 33, 3, 3, 96}}) {
    const std::string sh = dims({B, T, H, KV, D});
    const size_t nq = B * T * H * D, nk = B * T * KV * D;
    const auto q = randn(nq), k = randn(nk), v = randn(nk), g = randn(nq);
    std::vector<float> out(nq), lse(B * H * T), dq(nq), dk(nk), dv(nk);
    cpu.attention_forward_fp8(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
    const numerics::AttnFp8Amax fa = cpu.attention_fp8_amax();
    cpu.attention_backward_fp8(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(),
                               v.data(), out.data(), lse.data(), B, T, H, KV, D);
    const numerics::AttnFp8Amax ba = cpu.attention_fp8_amax();
    Dev<float> dQ(q), dK(k), dV(v), dG(g), dO(out), dL(lse);
    run_case("attention_fp8_kernel", sh + " fwd", [&](Result& r) {
      Dev<float> o(nq), l(lse.size());
      gpu.attention_forward_fp8(o.p, l.p, dQ.p, dK.p, dV.p, B, T, H, KV, D);
      const auto got = o.download();
      compare(r, "out", got, out, {3e-2 * max_abs(out), 0.125});
      compare(r, "lse", l.download(), lse, {1e-5 * max_abs(lse), 0.0});
      same_share(r, "out", got, out);
      const numerics::AttnFp8Amax a = gpu.attention_fp8_amax();
      near(r, "p", a.p, fa.p);
      near(r, "o", a.o, fa.o);
    });
    run_case("attention_fp8_kernel", sh + " bwd", [&](Result& r) {
      Dev<float> gq(nq), gk(nk), gv(nk);
      gpu.attention_backward_fp8(gq.p, gk.p, gv.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H,
                                 KV, D);
      const auto hq = gq.download(), hk = gk.download(), hv = gv.download();
      compare(r, "dq", hq, dq, {5e-2 * max_abs(dq), 0.25});
      compare(r, "dk", hk, dk, {5e-2 * max_abs(dk), 0.25});
      compare(r, "dv", hv, dv, {5e-2 * max_abs(dv), 0.25});
      same_share(r, "dq", hq, dq);
      same_share(r, "dk", hk, dk);
      same_share(r, "dv", hv, dv);
      const numerics::AttnFp8Amax a = gpu.attention_fp8_amax();
      near(r, "dS", a.dS, ba.dS);
      near(r, "dQ", a.dQ, ba.dQ);
      near(r, "dK", a.dK, ba.dK);
      near(r, "dV", a.dV, ba.dV);
    });
    run_case("attention_fp8_kernel", sh + " bf16", [&](Result& r) {
      const auto q16 = bf16_codes(q), k16 = bf16_codes(k), v16 = bf16_codes(v), g16 = bf16_codes(g);
      std::vector<uint16_t> o16(nq), dq16(nq), dk16(nk), dv16(nk);
      std::vector<float> l(B * H * T);
      cpu.attention_forward_fp8_bf16(o16.data(), l.data(), q16.data(), k16.data(), v16.data(), B,
                                     T, H, KV, D);
      cpu.attention_backward_fp8_codes(dq16.data(), dk16.data(), dv16.data(), g16.data(),
                                       q16.data(), k16.data(), v16.data(), o16.data(), l.data(),
                                       B, T, H, KV, D);
      Dev<uint16_t> cq(q16), ck(k16), cv(v16), cg(g16), co(nq), gq(nq), gk(nk), gv(nk);
      Dev<float> cl(l.size());
      gpu.attention_forward_fp8_bf16(co.p, cl.p, cq.p, ck.p, cv.p, B, T, H, KV, D);
      const auto out_w = widen(o16), got_o = widen(co.download());
      compare(r, "out", got_o, out_w, {3e-2 * max_abs(out_w), 0.125});
      same_share(r, "out", got_o, out_w);
      Dev<uint16_t> o_twin(o16);
      Dev<float> l_twin(l);
      gpu.attention_backward_fp8_codes(gq.p, gk.p, gv.p, cg.p, cq.p, ck.p, cv.p, o_twin.p,
                                       l_twin.p, B, T, H, KV, D);
      for (auto [name, dev, want] : {std::tuple{"dq", &gq, &dq16}, std::tuple{"dk", &gk, &dk16},
                                     std::tuple{"dv", &gv, &dv16}}) {
        const auto w = widen(*want), got_g = widen(dev->download());
        compare(r, name, got_g, w, {5e-2 * max_abs(w), 0.25});
        same_share(r, name, got_g, w);
      }
    });
    if (B < 3) continue;
    // groups: room for one sequence's forward (and not two), the batch's scales
    run_case("attention_fp8_kernel", sh + " groups", [&](Result& r) {
      const int64_t sq = T * H * D, sk = T * KV * D;
      const size_t one = size_t(20 * (sq + sk) + 4 * H * T) + 20 * 256 + 64 * 1024;
      auto small = small_scratch_backend(one + 8 * 1024 + 64 * 1024, CudaAttention::kFp32);
      Dev<float> o(nq), l(lse.size()), gq(nq), gk(nk), gv(nk);
      small->attention_forward_fp8(o.p, l.p, dQ.p, dK.p, dV.p, B, T, H, KV, D);
      const auto got = o.download();
      compare(r, "out", got, out, {3e-2 * max_abs(out), 0.125});
      same_share(r, "out", got, out);
      small->attention_backward_fp8(gq.p, gk.p, gv.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T,
                                    H, KV, D);
      const auto hq = gq.download();
      compare(r, "dq", hq, dq, {5e-2 * max_abs(dq), 0.25});
      same_share(r, "dq", hq, dq);
      const numerics::AttnFp8Amax a = small->attention_fp8_amax();
      near(r, "dQ", a.dQ, ba.dQ);
      near(r, "dS", a.dS, ba.dS);
    });
  }
}

// FP8 attention in groups of sequences (fp8_attention_groups): on a backend whose scratch holds
// the codes and cuDNN workspace of two sequences' backward (cudnn_attention_fp8_scratch_bytes,
// plus room for the scales) but not three's, B = 3 runs as 2 + 1. The scales stay the whole
// batch's, so the outputs are the CPU twin's on the whole batch (attention_fp8_*'s tolerances),
// and the amaxes cuDNN reports, folded over the groups, are those of the batch in one call on
// the full-size backend (within 1e-3 relative: the same kernels on the same rows). With room
// for less than one sequence: an error naming MXTRAIN_CUDA_SCRATCH_MB.
[[maybe_unused]] void check_attention_fp8_groups(Backend& cpu, CudaBackend& gpu) {
  const int64_t B = 3, T = 256, H = 8, KV = 2, D = 64;
  const std::string sh = dims({B, T, H, KV, D});
  gpu.set_attention(CudaAttention::kCudnn);
  const size_t two = gpu.cudnn_attention_fp8_scratch_bytes(2, T, H, KV, D, true);
  const size_t three = gpu.cudnn_attention_fp8_scratch_bytes(3, T, H, KV, D, true);
  const size_t one = gpu.cudnn_attention_fp8_scratch_bytes(1, T, H, KV, D, false);
  if (two == 0 || one == 0) {
    run_case("attention_fp8_groups", sh, [&](Result& r) {
      r.pass = false;
      r.note = "not on cuDNN: " + gpu.attention_fp8_path(B, T, H, KV, D);
    });
    return;
  }
  const size_t room = two + 16 * 1024;  // the scale slots, the groups' amaxes, abs_max's partials
  auto small = small_scratch_backend(room, CudaAttention::kCudnn);
  const std::string note = "scratch " + std::to_string(room) + " B: two sequences (" +
                           std::to_string(three) + " for three); ";
  const size_t nq = B * T * H * D, nk = B * T * KV * D;
  const auto q = randn(nq), k = randn(nk), v = randn(nk), g = randn(nq);
  std::vector<float> out(nq), lse(B * H * T), dq(nq), dk(nk), dv(nk);
  cpu.attention_forward_fp8(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
  cpu.attention_backward_fp8(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(),
                             v.data(), out.data(), lse.data(), B, T, H, KV, D);
  Dev<float> dQ(q), dK(k), dV(v), dG(g), dO(out), dL(lse);
  // the whole batch in one call on the full-size backend: its cuDNN amaxes
  Dev<float> o1(nq), l1(lse.size()), q1(nq), k1(nk), v1(nk);
  gpu.attention_forward_fp8(o1.p, l1.p, dQ.p, dK.p, dV.p, B, T, H, KV, D);
  gpu.attention_backward_fp8(q1.p, k1.p, v1.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H, KV, D);
  const numerics::AttnFp8Amax whole = gpu.attention_fp8_amax();
  auto same_amax = [](Result& r, const char* name, float got, float want) {
    if (std::fabs(got - want) > 1e-3f * std::fabs(want) || !(want > 0.0f)) {
      r.pass = false;
      r.note += std::string(name) + " amax " + std::to_string(got) + " (one call: " +
                std::to_string(want) + "); ";
    }
  };
  run_case("attention_fp8_groups", sh + " fwd", [&](Result& r) {
    r.note = note;
    Dev<float> o(nq), l(lse.size());
    small->attention_forward_fp8(o.p, l.p, dQ.p, dK.p, dV.p, B, T, H, KV, D);
    compare(r, "out", o.download(), out, {3e-2 * max_abs(out), 0.125});
    compare(r, "lse", l.download(), lse, {1e-3 * max_abs(lse), 0.0});
    const numerics::AttnFp8Amax a = small->attention_fp8_amax();
    same_amax(r, "p", a.p, whole.p);
    same_amax(r, "o", a.o, whole.o);
  });
  run_case("attention_fp8_groups", sh + " bwd", [&](Result& r) {
    r.note = note;
    Dev<float> gq(nq), gk(nk), gv(nk);
    small->attention_backward_fp8(gq.p, gk.p, gv.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H,
                                  KV, D);
    compare(r, "dq", gq.download(), dq, {5e-2 * max_abs(dq), 0.25});
    compare(r, "dk", gk.download(), dk, {5e-2 * max_abs(dk), 0.25});
    compare(r, "dv", gv.download(), dv, {5e-2 * max_abs(dv), 0.25});
    const numerics::AttnFp8Amax a = small->attention_fp8_amax();
    same_amax(r, "dQ", a.dQ, whole.dQ);
    same_amax(r, "dK", a.dK, whole.dK);
    same_amax(r, "dV", a.dV, whole.dV);
    same_amax(r, "dS", a.dS, whole.dS);
  });
  run_case("attention_fp8_groups", sh + " no room", [&](Result& r) {
    auto tiny = small_scratch_backend(one / 2, CudaAttention::kCudnn);
    Dev<float> o(nq), l(lse.size());
    expect_scratch_error(r, [&] {
      tiny->attention_forward_fp8(o.p, l.p, dQ.p, dK.p, dV.p, B, T, H, KV, D);
    });
  });
}

// The fp32 kernel (attention.cu), forced with set_attention(kFp32), against the CPU backend.
void check_attention(Backend& cpu, CudaBackend& gpu) {
  gpu.set_attention(CudaAttention::kFp32);
  for (auto [B, T, H, KV, D] : std::vector<std::array<int64_t, 5>>{
           {1, 1, 1, 1, 8}, {2, 37, 4, 2, 64}, {1, 130, 8, 8, 128}, {1, 65, 6, 2, 80},
           {1, 40, 2, 1, 96}, {2, 256, 8, 2, 64}, {5, 19, 3, 3, 32}}) {
    const std::string sh = dims({B, T, H, KV, D});
    auto q = randn(B * T * H * D), k = randn(B * T * KV * D), v = randn(B * T * KV * D);
    std::vector<float> out(B * T * H * D), lse(B * H * T);
    cpu.attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
    run_case("attention_forward", sh, [&](Result& r) {
      Dev<float> dq(q), dk(k), dv(v), dout(out.size()), dlse(lse.size());
      gpu.attention_forward(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
      compare(r, "out", dout.download(), out, kAttention);
      compare(r, "lse", dlse.download(), lse, kAttention);
    });
    run_case("attention_backward", sh, [&](Result& r) {
      auto g = randn(out.size());
      std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
      cpu.attention_backward(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), B, T, H, KV, D);
      Dev<float> dQ(q), dK(k), dV(v), dO(out), dL(lse), dG(g), dDQ(dq.size()), dDK(dk.size()), dDV(dv.size());
      gpu.attention_backward(dDQ.p, dDK.p, dDV.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H, KV, D);
      const Tol t{1e-4, 1e-3};
      compare(r, "dq", dDQ.download(), dq, t);
      compare(r, "dk", dDK.download(), dk, t);
      compare(r, "dv", dDV.download(), dv, t);
    });
    // The bf16 entry points on the fp32 kernel (what MXTRAIN_CUDA_ATTENTION=fp32 runs): codes
    // widened into scratch, the kernel, out rounded into codes, against the CPU twin (the same
    // steps around the CPU's attention): the fp32 cases' tolerances on the same fp32 values,
    // plus one bf16 ulp on out.
    const auto q16 = bf16_codes(q), k16 = bf16_codes(k), v16 = bf16_codes(v);
    std::vector<uint16_t> out16(q.size());
    std::vector<float> lse16(lse.size());
    cpu.attention_forward_bf16(out16.data(), lse16.data(), q16.data(), k16.data(), v16.data(), B, T, H, KV, D);
    run_case("attention_forward_bf16", sh, [&](Result& r) {
      Dev<uint16_t> dq(q16), dk(k16), dv(v16), dout(out16.size());
      Dev<float> dlse(lse16.size());
      gpu.attention_forward_bf16(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
      compare(r, "out", widen(dout.download()), widen(out16), {kAttention.atol, kAttention.rtol + kBf16Ulp});
      compare(r, "lse", dlse.download(), lse16, kAttention);
    });
    run_case("attention_backward_bf16", sh, [&](Result& r) {
      const auto g = randn(out16.size());
      std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
      cpu.attention_backward_bf16(dq.data(), dk.data(), dv.data(), g.data(), q16.data(), k16.data(), v16.data(), out16.data(), lse16.data(), B, T, H, KV, D);
      Dev<uint16_t> dQ(q16), dK(k16), dV(v16), dO(out16);
      Dev<float> dL(lse16), dG(g), dDQ(dq.size()), dDK(dk.size()), dDV(dv.size());
      gpu.attention_backward_bf16(dDQ.p, dDK.p, dDV.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H, KV, D);
      const Tol t{1e-4, 1e-3};
      compare(r, "dq", dDQ.download(), dq, t);
      compare(r, "dk", dDK.download(), dk, t);
      compare(r, "dv", dDV.download(), dv, t);
      compare(r, "dout", dG.download(), g, {0, 0});  // an input: unchanged
    });
    // The same on codes throughout (dout in, dq, dk, dv out: attention_backward_codes), the
    // fp32 kernel between the widening and the rounding: the fp32 cases' tolerances plus one
    // bf16 ulp, against the CPU twin (widen, attention_backward_bf16, to_bf16).
    run_case("attention_backward_codes", sh, [&](Result& r) {
      const auto g16 = bf16_codes(randn(out16.size()));
      std::vector<uint16_t> dq(q.size()), dk(k.size()), dv(v.size());
      cpu.attention_backward_codes(dq.data(), dk.data(), dv.data(), g16.data(), q16.data(), k16.data(), v16.data(), out16.data(), lse16.data(), B, T, H, KV, D);
      Dev<uint16_t> dQ(q16), dK(k16), dV(v16), dO(out16), dG(g16), dDQ(dq.size()), dDK(dk.size()), dDV(dv.size());
      Dev<float> dL(lse16);
      gpu.attention_backward_codes(dDQ.p, dDK.p, dDV.p, dG.p, dQ.p, dK.p, dV.p, dO.p, dL.p, B, T, H, KV, D);
      const Tol t{1e-4, 1e-3 + kBf16Ulp};
      compare(r, "dq", widen(dDQ.download()), widen(dq), t);
      compare(r, "dk", widen(dDK.download()), widen(dk), t);
      compare(r, "dv", widen(dDV.download()), widen(dv), t);
    });
  }
  for (auto [T, H, KV, D] : std::vector<std::array<int64_t, 4>>{{1, 1, 1, 16}, {33, 4, 2, 64}, {1000, 8, 2, 128}, {77, 2, 2, 100}}) {
    run_case("attention_decode", dims({T, H, KV, D}), [&](Result& r) {
      auto q = randn(H * D), kc = randn(T * KV * D), vc = randn(T * KV * D);
      std::vector<float> out(H * D);
      Dev<float> dq(q), dk(kc), dv(vc), dout(H * D);
      cpu.attention_decode(out.data(), q.data(), kc.data(), vc.data(), T, H, KV, D);
      gpu.attention_decode(dout.p, dq.p, dk.p, dv.p, T, H, KV, D);
      compare(r, "out", dout.download(), out, kAttention);
    });
  }
}

// The bf16 entry points on cuDNN (the bf16 path: q, k, v, out as codes cuDNN reads and writes
// as they are; dout fp32, rounded by the call; dq, dk, dv fp32) against the CPU twin's
// attention_forward_bf16 / _backward_bf16 on the same codes, i.e. the CPU attention on the
// bf16 values, as check_attention_cudnn's twin. The twin's backward takes dout rounded to bf16
// (what cuDNN sees; the GPU gets it unrounded) and both take the twin's out codes and lse.
// Tolerances: those of check_attention_cudnn, plus one bf16 ulp on out (the twin's out is now
// rounded too). off = 1: every code pointer one element into its buffer (the out16 buffer's
// first element must stay as poisoned).
void check_attention_cudnn_bf16(Backend& cpu, CudaBackend& gpu, int64_t B, int64_t T, int64_t H,
                                int64_t KV, int64_t D, const std::string& path, int64_t off) {
  std::string sh = dims({B, T, H, KV, D});
  if (off) sh += " +" + std::to_string(off);
  const int64_t nq = B * T * H * D, nk = B * T * KV * D;
  const auto q16 = bf16_codes(randn(nq)), k16 = bf16_codes(randn(nk)), v16 = bf16_codes(randn(nk));
  std::vector<uint16_t> out16(nq);
  std::vector<float> lse(B * H * T);
  cpu.attention_forward_bf16(out16.data(), lse.data(), q16.data(), k16.data(), v16.data(), B, T, H, KV, D);
  auto padded = [off](const std::vector<uint16_t>& x) {  // off poisoned codes, then x
    std::vector<uint16_t> y(size_t(off), uint16_t(0xFFFF));
    y.insert(y.end(), x.begin(), x.end());
    return y;
  };
  Dev<uint16_t> dq(padded(q16)), dk(padded(k16)), dv(padded(v16));
  run_case("attention_cudnn_forward_bf16", sh, [&](Result& r) {
    if (path != "cudnn") {
      r.pass = false;
      r.note = "did not run on cuDNN: " + path;
      return;
    }
    Dev<uint16_t> dout(size_t(nq + off));
    Dev<float> dlse(lse.size());
    gpu.attention_forward_bf16(dout.p + off, dlse.p, dq.p + off, dk.p + off, dv.p + off, B, T, H, KV, D);
    auto got = dout.download();
    if (off && got[0] != 0xFFFF) {
      r.pass = false;
      r.note += "out16: the element before the output was written; ";
    }
    got.erase(got.begin(), got.begin() + off);
    const auto want = widen(out16);
    compare(r, "out", widen(got), want, {2e-2 * max_abs(want), kBf16Ulp});
    compare(r, "lse", dlse.download(), lse, {1e-3 * max_abs(lse), 0.0});
  });
  run_case("attention_cudnn_backward_bf16", sh, [&](Result& r) {
    if (path != "cudnn") {
      r.pass = false;
      r.note = "did not run on cuDNN: " + path;
      return;
    }
    const auto g = randn(nq);
    const auto gb = round_bf16(g);
    std::vector<float> gq(nq), gk(nk), gv(nk);
    cpu.attention_backward_bf16(gq.data(), gk.data(), gv.data(), gb.data(), q16.data(), k16.data(), v16.data(), out16.data(), lse.data(), B, T, H, KV, D);
    Dev<uint16_t> dO(padded(out16));
    Dev<float> dL(lse), dG(g), dGQ(gq.size()), dGK(gk.size()), dGV(gv.size());
    gpu.attention_backward_bf16(dGQ.p, dGK.p, dGV.p, dG.p, dq.p + off, dk.p + off, dv.p + off, dO.p + off, dL.p, B, T, H, KV, D);
    compare(r, "dq", dGQ.download(), gq, {3e-2 * max_abs(gq), 0.0});
    compare(r, "dk", dGK.download(), gk, {3e-2 * max_abs(gk), 0.0});
    compare(r, "dv", dGV.download(), gv, {3e-2 * max_abs(gv), 0.0});
    compare(r, "dout", dG.download(), g, {0, 0});  // an input: unchanged
  });  // On codes throughout (the bf16 path's backward): dout, dq, dk, dv as codes, cuDNN reading
  // and writing them as they are; the same tolerance, against the same twin on the same
  // bf16 dout; the element before each output untouched.
  run_case("attention_cudnn_backward_codes", sh, [&](Result& r) {
    if (path != "cudnn") {
      r.pass = false;
      r.note = "did not run on cuDNN: " + path;
      return;
    }
    const auto g16 = bf16_codes(randn(nq));
    const auto gb = widen(g16);
    std::vector<float> gq(nq), gk(nk), gv(nk);
    cpu.attention_backward_bf16(gq.data(), gk.data(), gv.data(), gb.data(), q16.data(), k16.data(), v16.data(), out16.data(), lse.data(), B, T, H, KV, D);
    Dev<uint16_t> dO(padded(out16)), dG(padded(g16)), dGQ(size_t(nq + off)), dGK(size_t(nk + off)), dGV(size_t(nk + off));
    Dev<float> dL(lse);  // (the outputs start poisoned, 0xFFFF codes)
    gpu.attention_backward_codes(dGQ.p + off, dGK.p + off, dGV.p + off, dG.p + off, dq.p + off, dk.p + off, dv.p + off, dO.p + off, dL.p, B, T, H, KV, D);
    auto got = [&](Dev<uint16_t>& d, const char* name) {
      auto v = d.download();
      if (off && v[0] != 0xFFFF) {
        r.pass = false;
        r.note += std::string(name) + ": the element before it was written; ";
      }
      v.erase(v.begin(), v.begin() + off);
      return widen(v);
    };
    compare(r, "dq", got(dGQ, "dq"), gq, {3e-2 * max_abs(gq), 0.0});
    compare(r, "dk", got(dGK, "dk"), gk, {3e-2 * max_abs(gk), 0.0});
    compare(r, "dv", got(dGV, "dv"), gv, {3e-2 * max_abs(gv), 0.0});
  });
}

// cuDNN's SDPA (the default attention, bf16) against its CPU twin: the CPU backend's attention
// on the same inputs rounded to bf16 (RNE), so the rounding of the inputs, which dominates,
// is not part of the error. What remains is cuDNN's own bf16 steps: P (and, backward, dS)
// rounded to bf16 before their GEMMs, and out / dq / dk / dv rounded to bf16 on the way out,
// each a relative error of at most 2^-9 = 2e-3 per term; summed over keys with random signs
// they stay well below 1e-2 of the tensor's largest value. Tolerance: |cuda - twin| <= 2e-2
// (out) / 3e-2 (dq, dk, dv) of the twin tensor's max |value|. lse comes from fp32 scores of the
// same bf16 inputs (no rounding of its own): 1e-3 of max |lse| (would catch a base-2 log, a
// wrong scale or a shifted causal diagonal, each an error of order 1). The backward takes the
// twin's out and lse, so it is checked on its own.
[[maybe_unused]] void check_attention_cudnn(Backend& cpu, CudaBackend& gpu) {
  gpu.set_attention(CudaAttention::kCudnn);
  std::printf("attention path, Llama-3.2-1B shape B=2 T=8192 H=32 KV=8 D=64: %s\n",
              gpu.attention_path(2, 8192, 32, 8, 64).c_str());
  for (auto [B, T, H, KV, D] : std::vector<std::array<int64_t, 5>>{
           {2, 200, 8, 2, 64}, {2, 200, 8, 2, 128}, {1, 256, 4, 4, 64}, {2, 77, 8, 1, 128},
           {1, 2, 2, 1, 8}}) {
    const std::string sh = dims({B, T, H, KV, D});
    const std::string path = gpu.attention_path(B, T, H, KV, D);
    const CudnnAttentionCase c(cpu, B, T, H, KV, D);
    auto on_cudnn = [&](Result& r) {
      if (path == "cudnn") return true;
      r.pass = false;
      r.note = "did not run on cuDNN: " + path;
      return false;
    };
    run_case("attention_cudnn_forward", sh, [&](Result& r) {
      if (on_cudnn(r)) c.forward(r, gpu);
    });
    run_case("attention_cudnn_backward", sh, [&](Result& r) {
      if (on_cudnn(r)) c.backward(r, cpu, gpu);
    });
    check_attention_cudnn_bf16(cpu, gpu, B, T, H, KV, D, path, 0);
  }
  // Codes and out16 one element into their buffers (2-byte aligned, not the 16 bytes the
  // graphs declare): the copies through aligned scratch.
  check_attention_cudnn_bf16(cpu, gpu, 2, 77, 8, 1, 128, gpu.attention_path(2, 77, 8, 1, 128), 1);
  // A shape cuDNN's SDPA does not take (head dim not a multiple of 8): the default setting
  // falls back to the fp32 kernel, at the fp32 kernel's tolerance against the fp32 CPU backend.
  {
    const int64_t B = 1, T = 65, H = 6, KV = 2, D = 100;
    run_case("attention_cudnn_fallback", dims({B, T, H, KV, D}), [&](Result& r) {
      const std::string path = gpu.attention_path(B, T, H, KV, D);
      if (path.rfind("fp32 (", 0) != 0) {
        r.pass = false;
        r.note = "expected the fp32 kernel, got: " + path;
        return;
      }
      auto q = randn(B * T * H * D), k = randn(B * T * KV * D), v = randn(B * T * KV * D);
      std::vector<float> out(B * T * H * D), lse(B * H * T);
      cpu.attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
      Dev<float> dq(q), dk(k), dv(v), dout(out.size()), dlse(lse.size());
      gpu.attention_forward(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
      compare(r, "out", dout.download(), out, kAttention);
      compare(r, "lse", dlse.download(), lse, kAttention);
    });
    // The bf16 entry points at that shape: the same fallback (codes widened into scratch, the
    // fp32 kernel, out rounded), at the fp32 kernel's tolerances plus one bf16 ulp on out.
    run_case("attention_cudnn_fallback_bf16", dims({B, T, H, KV, D}), [&](Result& r) {
      const std::string path = gpu.attention_path(B, T, H, KV, D);
      if (path.rfind("fp32 (", 0) != 0) {
        r.pass = false;
        r.note = "expected the fp32 kernel, got: " + path;
        return;
      }
      const auto q16 = bf16_codes(randn(B * T * H * D)), k16 = bf16_codes(randn(B * T * KV * D)),
                 v16 = bf16_codes(randn(B * T * KV * D));
      std::vector<uint16_t> out16(q16.size());
      std::vector<float> lse(B * H * T);
      cpu.attention_forward_bf16(out16.data(), lse.data(), q16.data(), k16.data(), v16.data(), B, T, H, KV, D);
      Dev<uint16_t> dq(q16), dk(k16), dv(v16), dout(out16.size());
      Dev<float> dlse(lse.size());
      gpu.attention_forward_bf16(dout.p, dlse.p, dq.p, dk.p, dv.p, B, T, H, KV, D);
      compare(r, "out", widen(dout.download()), widen(out16), {kAttention.atol, kAttention.rtol + kBf16Ulp});
      compare(r, "lse", dlse.download(), lse, kAttention);
      const auto g = randn(out16.size());
      std::vector<float> gq(q16.size()), gk(k16.size()), gv(v16.size());
      cpu.attention_backward_bf16(gq.data(), gk.data(), gv.data(), g.data(), q16.data(), k16.data(), v16.data(), out16.data(), lse.data(), B, T, H, KV, D);
      Dev<uint16_t> dO(out16);
      Dev<float> dL(lse), dG(g), dGQ(gq.size()), dGK(gk.size()), dGV(gv.size());
      gpu.attention_backward_bf16(dGQ.p, dGK.p, dGV.p, dG.p, dq.p, dk.p, dv.p, dO.p, dL.p, B, T, H, KV, D);
      const Tol t{1e-4, 1e-3};
      compare(r, "dq", dGQ.download(), gq, t);
      compare(r, "dk", dGK.download(), gk, t);
      compare(r, "dv", dGV.download(), gv, t);
    });
  }
}

void check_vector_ops(Backend& cpu, CudaBackend& gpu) {
  for (int64_t n : {1, 31, 4097, 1 << 20}) {
    const std::string sh = dims({n});
    run_case("add", sh, [&](Result& r) {
      auto a = randn(n), b = randn(n);
      std::vector<float> y(n);
      Dev<float> da(a), db(b), dy(n);
      cpu.add(y.data(), a.data(), b.data(), n);
      gpu.add(dy.p, da.p, db.p, n);
      compare(r, "y", dy.download(), y, {0, 0});
      gpu.add(da.p, da.p, db.p, n);  // y aliasing a
      compare(r, "y(alias)", da.download(), y, {0, 0});
    });
    run_case("scale", sh, [&](Result& r) {
      auto x = randn(n);
      Dev<float> dx(x);
      cpu.scale(x.data(), 0.37f, n);
      gpu.scale(dx.p, 0.37f, n);
      compare(r, "x", dx.download(), x, {0, 0});
    });
    run_case("fill", sh, [&](Result& r) {
      std::vector<float> x(n);
      Dev<float> dx(n);
      cpu.fill(x.data(), -2.5f, n);
      gpu.fill(dx.p, -2.5f, n);
      compare(r, "x", dx.download(), x, {0, 0});
      // +0 (the memset) and -0 (the kernel) over the poisoned buffer: exact bits
      for (const float z : {0.0f, -0.0f}) {
        Dev<float> dz(n);
        gpu.fill(dz.p + 1, z, n - 1);
        const auto got = dz.download();
        int64_t bad = 0;
        for (int64_t i = 1; i < n; ++i) bad += std::memcmp(&got[size_t(i)], &z, 4) != 0;
        if (bad) {
          r.pass = false;
          r.note += std::to_string(bad);  // (appended apart: GCC 12's false -Wrestrict)
          r.note += std::signbit(z) ? " not -0; " : " not +0; ";
        }
      }
    });
    run_case("copy", sh, [&](Result& r) {
      auto x = randn(n);
      Dev<float> dx(x), dy(n);
      gpu.copy(dy.p, dx.p, n);
      compare(r, "y", dy.download(), x, {0, 0});
    });
    run_case("sum_squares", sh, [&](Result& r) {
      auto x = randn(n);
      Dev<float> dx(x);
      const double c = cpu.sum_squares(x.data(), n), g = gpu.sum_squares(dx.p, n);
      r.max_abs = std::fabs(c - g);
      r.max_ratio = r.max_abs / (1e-10 * std::fabs(c) + 1e-300);  // double sums, other order
      r.pass = r.max_ratio <= 1.0;
    });
    // Values over the whole float range (squares past float's, and too small to split exactly:
    // the kernel's double side sum), once from one element past 16 bytes (the scalar form).
    // The reference: the sum of the exact squares in long double.
    for (const int64_t off : {0, 1}) {
      if (off >= n) continue;
      run_case(off ? "sum_squares_wide_unaligned" : "sum_squares_wide", sh, [&](Result& r) {
        auto x = randn(n);
        const auto e = uniform(n, -70.0f, 70.0f);
        for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= std::exp2(std::round(e[size_t(i)]));
        Dev<float> dx(x);
        long double want = 0;
        for (int64_t i = off; i < n; ++i) want += (long double)(x[size_t(i)]) * x[size_t(i)];
        const double g = gpu.sum_squares(dx.p + off, n - off);
        r.max_abs = double(std::fabs((long double)g - want));
        r.max_ratio = r.max_abs / (1e-10 * double(want) + 1e-300);
        r.pass = r.max_ratio <= 1.0;
      });
    }
    run_case("adamw", sh, [&](Result& r) {
      auto p = randn(n), g = randn(n), m = randn(n, 0.1f), v = uniform(n, 0.0f, 0.1f);
      Dev<float> dp(p), dg(g), dm(m), dv(v);
      for (int64_t t = 1; t <= 3; ++t) {  // step 2 with a clipping factor
        const float s = t == 2 ? 0.37f : 1.0f;
        cpu.adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, s);
        gpu.adamw(dp.p, dg.p, dm.p, dv.p, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, s);
      }
      compare(r, "grad", dg.download(), g, {0, 0});  // unchanged
      compare(r, "param", dp.download(), p, kElementwise);
      compare(r, "m", dm.download(), m, kElementwise);
      compare(r, "v", dv.download(), v, kElementwise);
    });
    // The optional codes output (Fsdp's resident block codes): the codes of the device's own
    // updated parameters (the host's encode_bf16 on what came back), bit for bit; once with the
    // codes 8-byte aligned (the float4 form), once one element past (the scalar form).
    for (const int64_t off : {0, 1}) {
      run_case(off ? "adamw_codes_unaligned" : "adamw_codes", sh, [&](Result& r) {
        auto p = randn(n), g = randn(n), m = randn(n, 0.1f), v = uniform(n, 0.0f, 0.1f);
        Dev<float> dp(p), dg(g), dm(m), dv(v);
        Dev<uint16_t> dc(std::vector<uint16_t>(size_t(n + off), 0xFFFF));
        gpu.adamw(dp.p, dg.p, dm.p, dv.p, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 0.5f,
                  dc.p + off);
        const auto pd = dp.download();
        const auto cd = dc.download();
        int64_t bad = off && cd[0] != 0xFFFF;  // the element before the codes: untouched
        for (int64_t i = 0; i < n; ++i)
          bad += cd[size_t(i + off)] != numerics::encode_bf16(pd[size_t(i)]);
        r.max_abs = double(bad);
        r.max_ratio = bad ? 1e9 : 0.0;
        r.pass = bad == 0;
      });
    }
  }
}

// ---- quantizers: byte identity ---------------------------------------------------------------
// Inputs over a wide dynamic range, with zeros, a zero block, and (in one case) inf and NaN.
std::vector<float> quant_input(int64_t rows, int64_t cols, bool specials) {
  auto x = randn(rows * cols);
  auto e = uniform(rows * cols, -8.0f, 8.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::exp2(e[i]);
  for (int64_t c = 0; c < std::min<int64_t>(cols, 40); ++c) x[c] = 0.0f;  // a zero block
  if (specials && x.size() > 100) {
    x[50] = NAN;
    x[77] = -INFINITY;
    x[99] = 1e-42f;  // fp32 subnormal
  }
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, std::string& note) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;  // GPUs write the canonical NaN
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y) {
      note += "first diff at " + std::to_string(i) + "; ";
      return false;
    }
  }
  return true;
}

void expect_bytes(Result& r, const char* what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got != want) {
    r.pass = false;
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    r.note += std::string(what) + " differ at " + std::to_string(i) + "; ";
  }
}
void expect_floats(Result& r, const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  std::string note;
  if (got.size() != want.size() || !same_bits(got, want, note)) {
    r.pass = false;
    r.note += std::string(what) + ": " + note;
  }
}

// The kernels' FP8 encoder (quantize_kernels.cu's fp8_code: the hardware conversion on compute
// capability >= 8.9) against numerics::encode_fp8_elem, the CPU's, on every float: all 2^32 bit
// patterns on a GPU (a second or so), both formats. Under mxemu both sides are the numerics
// encoder, so it runs a sample there (the case's note says which).
void check_fp8_encoder(CudaBackend& gpu) {
  for (Format fmt : {Format::kE4M3, Format::kE5M2}) {
    run_case(std::string("fp8_encoder_") + (fmt == Format::kE4M3 ? "e4m3" : "e5m2"), "all floats",
             [&](Result& r) {
#ifdef MXTRAIN_CUDA_EMU
      const uint64_t first = 0x3F000000u, count = uint64_t(1) << 14;  // around 0.5 .. 1
      r.note = "emulated: 2^14 patterns, the numerics encoder on both sides";
#else
      const uint64_t first = 0, count = uint64_t(1) << 32;
      r.note = "2^32 patterns";
#endif
      uint32_t bad_bits = 0;
      const uint64_t bad = cuda::fp8_encoder_mismatches(fmt, first, count, &bad_bits, gpu.stream());
      r.pass = bad == 0;
      if (bad) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "; %llu differ, the first 0x%08x", (unsigned long long)bad,
                      bad_bits);
        r.note += buf;
      }
    });
  }
}

void check_quantizers(CudaBackend& gpu) {
  DeviceArena scratch("op_check-quant", size_t(64) << 20, nullptr);
  const cudaStream_t s = gpu.stream();
  scratch.set_stream(s);
  // (128 x 300: the transposing codes kernel's four-byte stores with a partial right tile;
  // 48 x 80: nvfp4's half-warps of 16 columns, a warp across two groups of rows)
  const int64_t shapes[][2] = {{1, 1}, {3, 37}, {37, 77}, {48, 80}, {128, 256}, {128, 300}, {130, 300}, {160, 416}};
  for (auto& sh : shapes)
    for (int stoch = 0; stoch < 2; ++stoch)
      for (int specials = 0; specials < 2; ++specials) {
        const int64_t R = sh[0], C = sh[1];
        const std::string name = dims({R, C}) + (stoch ? " sr" : "") + (specials ? " nan/inf" : "");
        const auto x = quant_input(R, C, specials);
        numerics::RoundingOptions ro;
        ro.stochastic = stoch;
        ro.rng = {7, 3, 1, 5};
        Dev<float> dx(x);
        for (Format fmt : {Format::kE4M3, Format::kE5M2})
          run_case(fmt == Format::kE4M3 ? "quant_fp8_current_e4m3" : "quant_fp8_current_e5m2", name, [&](Result& r) {
            const auto q = numerics::quantize_fp8_current(x.data(), R, C, fmt, 0.0f, ro);
            Dev<uint8_t> codes(R * C);
            Dev<float> sinv(1), deq(R * C);
            cuda::quantize_fp8_current(dx.p, R, C, fmt, 0.0f, ro, codes.p, sinv.p, deq.p, scratch, s);
            expect_bytes(r, "codes", codes.download(), q.codes);
            expect_floats(r, "scale", sinv.download(), q.scales_f32);
            expect_floats(r, "dequant", deq.download(), q.dequant);
          });
        // The codes-only quantizer of the tensor-core Linears (no stochastic rounding there):
        // current scaling (amax by abs_max first) and a given scale (delayed scaling: the amax
        // from the codes' own read, into a poisoned slot the call zeroes), row-major and
        // transposed; x in fp32, as bf16 codes (the bf16 path; against the widened values) and
        // in fp32 one element off its allocation (unaligned: the one-element-a-thread form
        // even where the count is a multiple of 4).
        const Bf16Input xb(x);
        std::vector<float> x_off(x.size() + 1, 0.0f);
        std::copy(x.begin(), x.end(), x_off.begin() + 1);
        const Dev<float> dx_off(x_off);
        if (!stoch)
          for (Format fmt : {Format::kE4M3, Format::kE5M2})
            for (int given = 0; given < 2; ++given)
              for (int tr = 0; tr < 2; ++tr)
                for (int form = 0; form < 3; ++form) {
                  std::string shape = name;  // piece by piece: g++ 12's -Wrestrict (dims())
                  shape += form == 1 ? " x bf16" : form == 2 ? " x+1" : "";
                  run_case(std::string("quant_fp8_codes_") + (fmt == Format::kE4M3 ? "e4m3" : "e5m2") +
                               (given ? "_given" : "_current") + (tr ? "_t" : ""),
                           shape, [&](Result& r) {
                    const float gs = 3.0f;
                    const std::vector<float>& xv = form == 1 ? xb.wide : x;
                    const auto q = given ? numerics::quantize_fp8_tensor(xv.data(), R, C, fmt, gs)
                                         : numerics::quantize_fp8_current(xv.data(), R, C, fmt);
                    std::vector<uint8_t> want = q.codes;
                    if (tr)
                      for (int64_t i = 0; i < R; ++i)
                        for (int64_t j = 0; j < C; ++j) want[j * R + i] = q.codes[i * C + j];
                    Dev<uint8_t> codes(R * C);
                    Dev<float> amax(1), sc(1), sinv(1);
                    auto quantize = [&](const auto* xp) {
                      if (!given) cuda::abs_max(amax.p, xp, R * C, scratch, s);
                      cuda::fp8_scales(sc.p, sinv.p, given ? nullptr : amax.p, gs, fmt, s);
                      cuda::fp8_codes(xp, R, C, fmt, sc.p, codes.p, tr, s,
                                      given ? amax.p : nullptr);
                    };
                    if (form == 1) quantize(xb.dev.p);
                    else quantize(form == 2 ? dx_off.p + 1 : dx.p);
                    expect_bytes(r, "codes", codes.download(), want);
                    expect_floats(r, "scale_inv", sinv.download(), q.scales_f32);
                    expect_floats(r, "amax", amax.download(), {numerics::abs_max(xv.data(), R * C)});
                  });
                }
        // Both layouts from one read (a Linear's output gradient), with the fused amax.
        if (!stoch)
          for (Format fmt : {Format::kE4M3, Format::kE5M2})
            run_case(std::string("quant_fp8_codes_both_") + (fmt == Format::kE4M3 ? "e4m3" : "e5m2"),
                     name, [&](Result& r) {
              const auto q = numerics::quantize_fp8_tensor(x.data(), R, C, fmt, 3.0f);
              std::vector<uint8_t> want_t(q.codes.size());
              for (int64_t i = 0; i < R; ++i)
                for (int64_t j = 0; j < C; ++j) want_t[j * R + i] = q.codes[i * C + j];
              Dev<uint8_t> codes(R * C), codes_t(R * C);
              Dev<float> amax(1), sc(1), sinv(1);
              cuda::fp8_scales(sc.p, sinv.p, nullptr, 3.0f, fmt, s);
              cuda::fp8_codes_both(dx.p, R, C, fmt, sc.p, codes.p, codes_t.p, s, amax.p);
              expect_bytes(r, "codes", codes.download(), q.codes);
              expect_bytes(r, "codes_t", codes_t.download(), want_t);
              expect_floats(r, "amax", amax.download(), {numerics::abs_max(x.data(), R * C)});
            });
        for (auto [br, bc] : std::vector<std::pair<int, int>>{{1, 128}, {128, 128}})
          run_case("quant_fp8_block_" + std::to_string(br) + "x" + std::to_string(bc), name, [&](Result& r) {
            const auto q = numerics::quantize_fp8_block(x.data(), R, C, br, bc, true, ro);
            Dev<uint8_t> codes(R * C);
            Dev<float> sc(q.scales_f32.size()), deq(R * C);
            cuda::quantize_fp8_block(dx.p, R, C, br, bc, true, ro, codes.p, sc.p, deq.p, s);
            expect_bytes(r, "codes", codes.download(), q.codes);
            expect_floats(r, "scales", sc.download(), q.scales_f32);
            expect_floats(r, "dequant", deq.download(), q.dequant);
          });
        // The transposed codes straight from the quantizer (quantize_fp8_block_t: fp8-block's
        // x^T, dy^T and W^T operands): the CPU's codes transposed, its scales as they are.
        for (auto [br, bc] : std::vector<std::pair<int, int>>{{128, 1}, {128, 128}})
          run_case("quant_fp8_block_t_" + std::to_string(br) + "x" + std::to_string(bc), name, [&](Result& r) {
            const auto q = numerics::quantize_fp8_block(x.data(), R, C, br, bc, true, ro);
            std::vector<uint8_t> want_t(R * C);
            for (int64_t i = 0; i < R; ++i)
              for (int64_t j = 0; j < C; ++j) want_t[j * R + i] = q.codes[i * C + j];
            Dev<uint8_t> codes_t(R * C);
            Dev<float> sc(q.scales_f32.size());
            cuda::quantize_fp8_block_t(dx.p, R, C, br, bc, true, ro, codes_t.p, sc.p, s);
            expect_bytes(r, "codes_t", codes_t.download(), want_t);
            expect_floats(r, "scales", sc.download(), q.scales_f32);
          });
        // fp8-block as the Blackwell GEMM's operand (any GPU: no tensor cores involved): the
        // K-major codes (x, or x^T for 128x1 and the transposed 128x128 weight) and the block
        // scales as E8M0 bytes in the swizzled layout, byte for byte against the CPU twin
        // numerics::fp8_block_scales_to_mx (itself tested against the index formula and the
        // fp8-block dequantization, tests/cpp/numerics/test_fp8_block_mx.cpp) over the CPU
        // quantizer's scales. K = the reduced dimension must be a multiple of 32.
        for (auto [br, bc, tr] : std::vector<std::array<int, 3>>{{1, 128, 0}, {128, 1, 1}, {128, 128, 0}, {128, 128, 1}})
          if (!stoch && (tr ? R : C) % 32 == 0)
            run_case("quant_fp8_block_mx_operand_" + std::to_string(br) + "x" + std::to_string(bc) + (tr ? "_t" : ""),
                     name, [&](Result& r) {
              const auto q = numerics::quantize_fp8_block(x.data(), R, C, br, bc, true);
              const int64_t OR = tr ? C : R, kb = (tr ? R : C) / 32;
              std::vector<uint8_t> want_codes(R * C);
              for (int64_t i = 0; i < R; ++i)
                for (int64_t j = 0; j < C; ++j) want_codes[tr ? j * R + i : i * C + j] = q.codes[i * C + j];
              std::vector<uint8_t> want_scales(size_t(numerics::swizzled_scale_bytes(OR, kb)));
              const int64_t bad = numerics::fp8_block_scales_to_mx(q.scales_f32.data(), R, C, br, bc, tr, want_scales.data());
              if (bad) r.note += "CPU twin: " + std::to_string(bad) + " scales not convertible; ";
              Dev<uint8_t> codes(R * C), sw(want_scales.size());
              Dev<float> raw(q.scales_f32.size());
              if (tr)  // as the backend's fp8_block_mx_operand makes x^T
                cuda::quantize_fp8_block_t(dx.p, R, C, br, bc, true, {}, codes.p, raw.p, s);
              else
                cuda::quantize_fp8_block(dx.p, R, C, br, bc, true, {}, codes.p, raw.p, nullptr, s);
              cuda::fp8_block_scales_to_mx(raw.p, R, C, br, bc, tr, sw.p, s);
              expect_bytes(r, "codes", codes.download(), want_codes);
              expect_bytes(r, "e8m0 scales", sw.download(), want_scales);
              if (bad) r.pass = false;
            });
        for (int colwise = 0; colwise < 2; ++colwise)
          for (auto rule : {numerics::MxScaleRule::kCeil, numerics::MxScaleRule::kFloor})
            run_case(std::string("quant_mxfp8") + (colwise ? "_col" : "_row") +
                         (rule == numerics::MxScaleRule::kCeil ? "_ceil" : "_floor"),
                     name, [&](Result& r) {
                       const auto q = numerics::quantize_mxfp8(x.data(), R, C, colwise, Format::kE4M3, rule, ro);
                       Dev<uint8_t> codes(R * C), sc(q.scales_u8.size());
                       Dev<float> deq(R * C);
                       cuda::quantize_mxfp8(dx.p, R, C, colwise, Format::kE4M3, rule, ro, codes.p, sc.p, deq.p, s);
                       expect_bytes(r, "codes", codes.download(), q.codes);
                       expect_bytes(r, "scales", sc.download(), q.scales_u8);
                       expect_floats(r, "dequant", deq.download(), q.dequant);
                     });
        // The mxfp8 GEMM operand (any GPU: no tensor cores involved): the K-major codes (x, or
        // x^T from the columnwise quantization) and the scale bytes in cuBLASLt's swizzled
        // 128x4-tile layout, against a host construction spelled out from the cuBLAS
        // documentation's description (zero padding to 128 rows x 4 scale columns; inside a
        // tile, scale (i, j) at byte 16 * (i % 32) + 4 * (i / 32) + j). K = the reduced
        // dimension must be a multiple of 32.
        for (int tr = 0; tr < 2; ++tr)
          if (!stoch && (tr ? R : C) % 32 == 0)
            run_case(std::string("quant_mxfp8_gemm_operand") + (tr ? "_t" : ""), name, [&](Result& r) {
              const auto q = numerics::quantize_mxfp8(x.data(), R, C, tr, Format::kE4M3, numerics::MxScaleRule::kCeil);
              const int64_t OR = tr ? C : R, K = tr ? R : C, kb = K / 32;
              std::vector<uint8_t> want_codes(R * C);
              for (int64_t i = 0; i < R; ++i)
                for (int64_t j = 0; j < C; ++j) want_codes[tr ? j * R + i : i * C + j] = q.codes[i * C + j];
              const int64_t col_tiles = (kb + 3) / 4;
              std::vector<uint8_t> want_scales(size_t((OR + 127) / 128 * 128 * col_tiles * 4), 0);
              for (int64_t row = 0; row < OR; ++row)
                for (int64_t k = 0; k < kb; ++k) {
                  const uint8_t v = tr ? q.scales_u8[k * OR + row] : q.scales_u8[row * kb + k];
                  const int64_t tile = (row / 128) * col_tiles + k / 4, i = row % 128;
                  want_scales[size_t(tile * 512 + 16 * (i % 32) + 4 * (i / 32) + k % 4)] = v;
                }
              Dev<uint8_t> tmp(R * C), codes(R * C), raw(OR * kb), sw(want_scales.size());
              if (tr)  // (as mxfp8_operand: codes^T from quantize_mxfp8_t)
                cuda::quantize_mxfp8_t(dx.p, R, C, Format::kE4M3, numerics::MxScaleRule::kCeil,
                                       tmp.p, codes.p, raw.p, s);
              else
                cuda::quantize_mxfp8(dx.p, R, C, false, Format::kE4M3, numerics::MxScaleRule::kCeil,
                                     {}, codes.p, raw.p, nullptr, s);
              cuda::swizzle_scales_u8(raw.p, tr, OR, kb, sw.p, s);
              expect_bytes(r, "codes", codes.download(), want_codes);
              expect_bytes(r, "swizzled scales", sw.download(), want_scales);
            });
        for (int b2d = 0; b2d < 2; ++b2d)
          run_case(b2d ? "quant_nvfp4_16x16" : "quant_nvfp4_1x16", name, [&](Result& r) {
            const auto q = numerics::quantize_nvfp4(x.data(), R, C, b2d, ro);
            Dev<uint8_t> codes(q.codes.size()), sc(q.scales_u8.size());
            Dev<float> gs(1), deq(R * C);
            cuda::quantize_nvfp4(dx.p, R, C, b2d, ro, codes.p, sc.p, gs.p, deq.p, scratch, s);
            expect_bytes(r, "codes", codes.download(), q.codes);
            expect_bytes(r, "scales", sc.download(), q.scales_u8);
            expect_floats(r, "global_scale", gs.download(), {q.global_scale});
            expect_floats(r, "dequant", deq.download(), q.dequant);
          });
        // x^T's 16x16 quantization read from x (the data gradient's W^T: quantize_nvfp4_16x16_t,
        // no transposed copy), byte for byte against numerics::quantize_nvfp4 of x^T built on the
        // host, stochastic bits (by the index in x^T) included
        if (R % 16 == 0 && C % 16 == 0)
          run_case("quant_nvfp4_16x16_t", name, [&](Result& r) {
            std::vector<float> xt(size_t(R * C));
            for (int64_t i = 0; i < R; ++i)
              for (int64_t j = 0; j < C; ++j) xt[size_t(j * R + i)] = x[size_t(i * C + j)];
            const auto q = numerics::quantize_nvfp4(xt.data(), C, R, true, ro);
            Dev<uint8_t> codes(q.codes.size()), sc(q.scales_u8.size());
            Dev<float> gs(1);
            cuda::quantize_nvfp4_16x16_t(dx.p, R, C, ro, codes.p, sc.p, gs.p, scratch, s);
            expect_bytes(r, "codes", codes.download(), q.codes);
            expect_bytes(r, "scales", sc.download(), q.scales_u8);
            expect_floats(r, "global_scale", gs.download(), {q.global_scale});
          });
        // nvfp4's whole-tensor operand kernels (nvfp4_operand's forms on Blackwell; any GPU runs
        // them): a thread a 1x16 block of x's rows (quantize_nvfp4_rows), and RHT(x^T) made in
        // registers from x's columns (quantize_nvfp4_rht_t: no fp32 transposed copy), x in fp32,
        // as bf16 codes (against the widened values) and one element off its allocation (the
        // rows kernel's element-a-load form), byte for byte against numerics::quantize_nvfp4 of
        // x and of rht16_forward(x^T), stochastic bits included.
        for (int rht = 0; rht < 2; ++rht)
          for (int form = 0; form < 3; ++form) {
            if ((rht ? R : C) % 16 != 0 || (rht && specials)) continue;
            std::string shape = name;  // piece by piece: g++ 12's -Wrestrict (dims())
            shape += form == 1 ? " x bf16" : form == 2 ? " x+1" : "";
            run_case(rht ? "quant_nvfp4_rht_t" : "quant_nvfp4_rows", shape, [&](Result& r) {
              const uint32_t seed = 0x5eedu;
              const std::vector<float>& xv = form == 1 ? xb.wide : x;
              std::vector<float> src = xv;
              const int64_t OR = rht ? C : R, K = rht ? R : C;
              if (rht) {
                for (int64_t i = 0; i < R; ++i)
                  for (int64_t j = 0; j < C; ++j) src[size_t(j * R + i)] = xv[size_t(i * C + j)];
                numerics::rht16_forward(src.data(), C, R, seed);
              }
              const auto q = numerics::quantize_nvfp4(src.data(), OR, K, false, ro);
              Dev<uint8_t> codes(q.codes.size()), sc(q.scales_u8.size());
              Dev<float> gs(1);
              auto quantize = [&](const auto* xp) {
                if (rht)
                  cuda::quantize_nvfp4_rht_t(xp, R, C, seed, ro, codes.p, sc.p, gs.p, scratch, s);
                else
                  cuda::quantize_nvfp4_rows(xp, R, C, ro, codes.p, sc.p, gs.p, scratch, s);
              };
              if (form == 1) quantize(xb.dev.p);
              else quantize(form == 2 ? dx_off.p + 1 : dx.p);
              expect_bytes(r, "codes", codes.download(), q.codes);
              expect_bytes(r, "scales", sc.download(), q.scales_u8);
              expect_floats(r, "global_scale", gs.download(), {q.global_scale});
            });
          }
        // Both of an output gradient's nvfp4 operands from one read (quantize_nvfp4_both: the
        // rows' four-shuffle block amax across a half-warp), each with its own rounding stream,
        // against the two quantizations above on the host.
        if (R % 16 == 0 && C % 16 == 0 && !specials)
          for (int form = 0; form < 3; ++form) {
            std::string shape = name;
            shape += form == 1 ? " x bf16" : form == 2 ? " x+1" : "";
            run_case("quant_nvfp4_both", shape, [&](Result& r) {
              const uint32_t seed = 0x5eedu;
              numerics::RoundingOptions ro_t = ro;
              ro_t.rng = {7, 3, 2, 6};  // the weight gradient's operand: another stream
              const std::vector<float>& xv = form == 1 ? xb.wide : x;
              std::vector<float> xt(xv.size());
              for (int64_t i = 0; i < R; ++i)
                for (int64_t j = 0; j < C; ++j) xt[size_t(j * R + i)] = xv[size_t(i * C + j)];
              numerics::rht16_forward(xt.data(), C, R, seed);
              const auto q = numerics::quantize_nvfp4(xv.data(), R, C, false, ro);
              const auto qt = numerics::quantize_nvfp4(xt.data(), C, R, false, ro_t);
              Dev<uint8_t> codes(q.codes.size()), sc(q.scales_u8.size());
              Dev<uint8_t> codes_t(qt.codes.size()), sc_t(qt.scales_u8.size());
              Dev<float> gs(1), gs_t(1);
              auto quantize = [&](const auto* xp) {
                cuda::quantize_nvfp4_both(xp, R, C, seed, ro, ro_t, {codes.p, sc.p, gs.p},
                                          {codes_t.p, sc_t.p, gs_t.p}, scratch, s);
              };
              if (form == 1) quantize(xb.dev.p);
              else quantize(form == 2 ? dx_off.p + 1 : dx.p);
              expect_bytes(r, "codes", codes.download(), q.codes);
              expect_bytes(r, "scales", sc.download(), q.scales_u8);
              expect_floats(r, "global_scale", gs.download(), {q.global_scale});
              expect_bytes(r, "codes_t", codes_t.download(), qt.codes);
              expect_bytes(r, "scales_t", sc_t.download(), qt.scales_u8);
              expect_floats(r, "global_scale_t", gs_t.download(), {qt.global_scale});
            });
          }
        // The emulated path's device quantize-dequantize (Backend::quantize_dequantize: mxfp8 and
        // nvfp4 off their tensor cores, e.g. on an H200), bit for bit against the CPU
        // quantizers: mxfp8 rows / columns, nvfp4 1x16 / 16x16, and nvfp4's weight-gradient
        // operand q(RHT(x^T)) formed on the host by numerics::rht16_forward.
        for (int kind = 0; kind < 5; ++kind) {
          if ((kind < 2 || kind == 3) && stoch) continue;  // mxfp8 and nvfp4 weights: RNE only
          if (kind == 4 && (R % 16 || specials)) continue;
          static const char* qd_names[] = {"quant_dequant_mxfp8_row", "quant_dequant_mxfp8_col",
                                           "quant_dequant_nvfp4_1x16", "quant_dequant_nvfp4_16x16",
                                           "quant_dequant_nvfp4_rht_t"};
          run_case(qd_names[kind], name, [&](Result& r) {
            Backend::Fp8Operand q;
            std::vector<float> want;
            if (kind < 2) {
              q.mx = true;
              q.block_rows = kind ? 32 : 1;
              q.block_cols = kind ? 1 : 32;
              want = numerics::quantize_mxfp8(x.data(), R, C, kind == 1, Format::kE4M3,
                                              numerics::MxScaleRule::kCeil).dequant;
            } else {
              q.nvfp4 = true;
              q.block_rows = kind == 3 ? 16 : 1;
              q.block_cols = 16;
              q.rounding = ro;
              q.rht = kind == 4;
              q.rht_seed = 0x5eedu;
              if (kind == 4) {
                std::vector<float> xt(size_t(R * C));
                for (int64_t i = 0; i < R; ++i)
                  for (int64_t j = 0; j < C; ++j) xt[size_t(j * R + i)] = x[size_t(i * C + j)];
                numerics::rht16_forward(xt.data(), C, R, q.rht_seed);
                want = numerics::quantize_nvfp4(xt.data(), C, R, false, ro).dequant;
              } else {
                want = numerics::quantize_nvfp4(x.data(), R, C, kind == 3, ro).dequant;
              }
            }
            Dev<float> out(R * C), tmp(R * C);
            if (!gpu.quantize_dequantize(out.p, dx.p, R, C, q, tmp.p)) {
              r.pass = false;
              r.note += "declined; ";
              return;
            }
            expect_floats(r, "dequant", out.download(), want);
          });
        }
        // The nvfp4 GEMM operand (any GPU: no tensor cores involved), as the backend forms it:
        // 1x16 rows of x; 16x16 blocks of x (a weight) and of x^T (the data gradient's W^T, made
        // by quantize_nvfp4_16x16_t from x, against the quantization of x itself, codes and block
        // scales transposed); and
        // x^T put through the 16-point RHT on the device, then 1x16 (the weight gradient's
        // operands; the transformed values bit for bit against numerics::rht16_forward). Codes
        // K-major, E2M1 two a byte low nibble first; scale bytes in the swizzled 128x4-tile
        // layout written out from the cuBLAS documentation's description (as for mxfp8 above),
        // a 16x16 block's scale repeated on each of its 16 rows.
        for (int mode = 0; mode < 4; ++mode) {  // 0: 1x16, 1: 16x16, 2: 16x16 of x^T, 3: RHT x^T
          const bool tr = mode >= 2, b2d = mode == 1 || mode == 2;
          const int64_t OR = tr ? C : R, K = tr ? R : C;
          if (OR % 16 || K % 32 || (b2d && stoch) || (mode == 3 && specials)) continue;
          static const char* names[] = {"quant_nvfp4_gemm_operand_1x16", "quant_nvfp4_gemm_operand_16x16",
                                        "quant_nvfp4_gemm_operand_16x16_t", "quant_nvfp4_gemm_operand_rht_t"};
          run_case(names[mode], name, [&](Result& r) {
            const uint32_t seed = 0x5eedu;
            const int64_t kb = K / 16, col_tiles = (kb + 3) / 4;
            std::vector<float> xt(size_t(R * C));
            for (int64_t i = 0; i < R; ++i)
              for (int64_t j = 0; j < C; ++j) xt[size_t(j * R + i)] = x[size_t(i * C + j)];
            if (mode == 3) numerics::rht16_forward(xt.data(), C, R, seed);
            const auto q = numerics::quantize_nvfp4(mode == 3 ? xt.data() : x.data(), mode == 3 ? C : R,
                                                    mode == 3 ? R : C, b2d, ro);
            std::vector<uint8_t> want_codes(size_t(OR * K / 2), 0);
            std::vector<uint8_t> want_scales(size_t((OR + 127) / 128 * 128 * col_tiles * 4), 0);
            auto nibble = [&](int64_t row, int64_t col) {  // code (row, col) of q
              return (q.codes[size_t(row * q.code_cols + col / 2)] >> (4 * (col % 2))) & 0xF;
            };
            for (int64_t row = 0; row < OR; ++row)
              for (int64_t k = 0; k < K; ++k) {
                const int code = mode == 2 ? nibble(k, row) : nibble(row, k);
                want_codes[size_t(row * K / 2 + k / 2)] |= uint8_t(code << (4 * (k % 2)));
              }
            for (int64_t row = 0; row < OR; ++row)
              for (int64_t k = 0; k < kb; ++k) {
                const uint8_t v = mode == 2 ? q.scales_u8[size_t(k * q.scale_cols + row / 16)]
                                : mode == 1 ? q.scales_u8[size_t((row / 16) * kb + k)]
                                            : q.scales_u8[size_t(row * kb + k)];
                const int64_t tile = (row / 128) * col_tiles + k / 4, i = row % 128;
                want_scales[size_t(tile * 512 + 16 * (i % 32) + 4 * (i / 32) + k % 4)] = v;
              }
            Dev<float> tmp(R * C), gs(1);
            Dev<uint8_t> codes(OR * K / 2), raw(b2d ? OR / 16 * kb : OR * kb), sw(want_scales.size());
            const float* src = dx.p;
            if (mode == 3) {
              cuda::transpose_f32(dx.p, R, C, tmp.p, s);
              cuda::rht16_forward(tmp.p, C, R, seed, s);
              src = tmp.p;
            }
            if (mode == 2)  // as nvfp4_operand forms W^T: from x, no transposed copy
              cuda::quantize_nvfp4_16x16_t(dx.p, R, C, ro, codes.p, raw.p, gs.p, scratch, s);
            else
              cuda::quantize_nvfp4(src, OR, K, b2d, ro, codes.p, raw.p, gs.p, nullptr, scratch, s);
            cuda::swizzle_scales_u8(raw.p, false, OR, kb, sw.p, s, b2d ? 16 : 1);
            if (mode == 3) expect_floats(r, "rht values", tmp.download(), xt);
            expect_bytes(r, "codes", codes.download(), want_codes);
            expect_bytes(r, "swizzled scales", sw.download(), want_scales);
            expect_floats(r, "global_scale", gs.download(), {q.global_scale});
          });
        }
      }
  // FP8 attention's helpers (they run under mxemu too): the scale slots computed on the device
  // from device amaxes against numerics::attn_fp8_scale_slots on the host (bits; amaxes of
  // every magnitude, 0, and a dO of 0 as in a forward), and fp8_decode against numerics'
  // decoders times the decode scale (every byte, both formats).
  {
    const float amaxes[][4] = {{3.7f, 0.02f, 1234.5f, 1e-5f}, {1.0f, 1.0f, 1.0f, 0.0f},
                               {0.0f, 5e-30f, 3e30f, 7.0f}};
    for (const auto& a : amaxes)
      run_case("attn_fp8_scales", std::to_string(a[0]) + "," + std::to_string(a[3]), [&](Result& r) {
        const int64_t n = numerics::kAttnFp8Slots * numerics::kAttnFp8SlotFloats;
        std::vector<float> want(n, 0.0f);
        numerics::attn_fp8_scale_slots(want.data(), a[0], a[1], a[2], a[3], 64, 8192 * 4, 0.125f);
        Dev<float> amax(std::vector<float>(a, a + 4)), slots(std::vector<float>(n, 0.0f));
        cuda::attn_fp8_scales(slots.p, amax.p, 64, 8192 * 4, 0.125f, s);
        expect_floats(r, "slots", slots.download(), want);
      });
    // max_into: the groups' cuDNN amaxes folded into the batch's, every 4th float (the
    // others untouched), against std::max.
    run_case("max_into", "n=4 stride=4", [&](Result& r) {
      std::vector<float> dst(16), src(16);
      for (int i = 0; i < 16; ++i) dst[i] = float(i % 3) * 1.5f, src[i] = float(i % 5) - 0.25f;
      std::vector<float> want = dst;
      for (int i = 0; i < 4; ++i) want[i * 4] = std::max(dst[i * 4], src[i * 4]);
      Dev<float> d(dst), sv(src);
      cuda::max_into(d.p, sv.p, 4, 4, s);
      expect_floats(r, "dst", d.download(), want);
    });
    std::vector<uint8_t> all(256);
    for (int i = 0; i < 256; ++i) all[i] = uint8_t(i);
    for (Format fmt : {Format::kE4M3, Format::kE5M2})
      run_case("fp8_decode", fmt == Format::kE4M3 ? "e4m3" : "e5m2", [&](Result& r) {
        const float inv = 0.0078125f;  // a power of two, as attention's decode scales
        std::vector<float> want(256);
        for (int i = 0; i < 256; ++i) want[i] = numerics::decode_fp8_elem(uint8_t(i), fmt) * inv;
        Dev<uint8_t> codes(all);
        Dev<float> sinv(std::vector<float>{inv}), out(256);
        cuda::fp8_decode(codes.p, 256, fmt, sinv.p, out.p, s);
        expect_floats(r, "values", out.download(), want);
      });
    for (Format fmt : {Format::kE4M3, Format::kE5M2})
      run_case("fp8_decode_bf16", fmt == Format::kE4M3 ? "e4m3" : "e5m2", [&](Result& r) {
        const float inv = 0.0078125f;
        std::vector<float> want(256);
        for (int i = 0; i < 256; ++i) want[i] = numerics::decode_fp8_elem(uint8_t(i), fmt) * inv;
        Dev<uint8_t> codes(all);
        Dev<float> sinv(std::vector<float>{inv});
        Dev<uint16_t> out(256);
        cuda::fp8_decode(codes.p, 256, fmt, sinv.p, out.p, s);
        // every value is a bf16 value: the codes widen back to it exactly
        expect_floats(r, "values", widen(out.download()), want);
      });
  }
}

void write_json(const std::string& path, const std::string& device) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "error: cannot write %s\n", path.c_str());
    return;
  }
  int passed = 0, failed = 0;
  for (auto& r : results) (r.pass ? passed : failed)++;
  std::fprintf(f, "{\"device\": \"%s\", \"passed\": %d, \"failed\": %d, ", device.c_str(), passed,
               failed);
  if (stop_signal)  // (the cases after the signal did not run)
    std::fprintf(f, "\"stopped\": \"signal %d after %zu cases: the rest did not run\", ",
                 int(stop_signal), results.size());
  std::fprintf(f, "\"results\": [\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    std::string note;
    for (char c : r.note) note += (c == '"' || c == '\\') ? '\'' : c;
    std::fprintf(f, "  {\"op\": \"%s\", \"shape\": \"%s\", \"pass\": %s, \"max_abs_err\": %.6g, \"err_over_tol\": %.6g, \"note\": \"%s\"}%s\n",
                 r.op.c_str(), r.shape.c_str(), r.pass ? "true" : "false", r.max_abs,
                 std::isfinite(r.max_ratio) ? r.max_ratio : 1e300, note.c_str(), i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

// The cast tuner's forms (cuda::force_cast_form: each family's form k, untimed), each against
// the CPU's quantizers byte for byte: fp8-block's 1x128 row-major and 128x1 transposed
// operands (the tiled kernel, fp8_block_row_kernel with 1 and 4 pieces a warp,
// fp8_col_t_kernel), both of those from one read (fp8_block_both_kernel, or the two calls),
// its 128x128 ones both ways (the tiled kernel, the two-pass fp8_block_square_kernel), MXFP8's
// 1x32 operands (a warp a block, or fp8_block_row_kernel's MX form) and 32x1 ones written
// transposed (the columnwise kernel and a byte transpose, or fp8_col_t_kernel's MX form), both
// from one read (fp8_col_t_kernel's MX form with the rowwise codes, or the two calls), and the
// per-tensor casts (1, 2, 4 vectors a thread; the
// plain and the tiled transposing kernels), x in fp32 and as bf16 codes, outputs poisoned,
// edges partial (rows not a multiple of 16 or 128, a last 1x128 block 4 wide). Then tuning
// itself (MXTRAIN_CUDA_CAST_TUNE=all): a shape timed once, its bytes (and the amax slot, which
// every trial zeroes again) right after the trials and on the next call.
void check_cast_forms(CudaBackend& gpu) {
  const cudaStream_t s = gpu.stream();
  const int64_t shapes[][2] = {{130, 300}, {160, 416}, {256, 132}, {48, 64}};
  auto transpose = [](const std::vector<uint8_t>& c, int64_t R, int64_t C) {
    std::vector<uint8_t> t(c.size());
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) t[j * R + i] = c[i * C + j];
    return t;
  };
  // One case of each family at x [R, C]: `form` forced (-1: as the tuner picks).
  auto run_families = [&](const std::string& tag, int64_t R, int64_t C, bool specials, int form) {
    const auto x = quant_input(R, C, specials);
    const Bf16Input xb(x);
    const Dev<float> dx(x);
    cuda::force_cast_form(form);
    for (int bf = 0; bf < 2; ++bf) {
      const std::vector<float>& xv = bf ? xb.wide : x;
      std::string name = dims({R, C});  // piece by piece: g++ 12's -Wrestrict (dims())
      name += bf ? " x bf16" : "";
      name += specials ? " nan/inf" : "";
      name += " " + tag;
      auto on = [&](auto&& f) { return bf ? f(xb.dev.p) : f(dx.p); };
      run_case("cast_form_fp8_block_1x128", name, [&](Result& r) {
        const auto q = numerics::quantize_fp8_block(xv.data(), R, C, 1, 128, true);
        Dev<uint8_t> codes(R * C);
        Dev<float> sc(q.scales_f32.size());
        on([&](const auto* xp) {
          cuda::quantize_fp8_block(xp, R, C, 1, 128, true, {}, codes.p, sc.p, nullptr, s);
        });
        expect_bytes(r, "codes", codes.download(), q.codes);
        expect_floats(r, "scales", sc.download(), q.scales_f32);
      });
      for (int tr = 0; tr < 2; ++tr)
        run_case(std::string("cast_form_fp8_block_128x128") + (tr ? "_t" : ""), name,
                 [&](Result& r) {
          const auto q = numerics::quantize_fp8_block(xv.data(), R, C, 128, 128, true);
          Dev<uint8_t> codes(R * C);
          Dev<float> sc(q.scales_f32.size());
          on([&](const auto* xp) {
            if (tr) cuda::quantize_fp8_block_t(xp, R, C, 128, 128, true, {}, codes.p, sc.p, s);
            else cuda::quantize_fp8_block(xp, R, C, 128, 128, true, {}, codes.p, sc.p, nullptr, s);
          });
          expect_bytes(r, tr ? "codes_t" : "codes", codes.download(),
                       tr ? transpose(q.codes, R, C) : q.codes);
          expect_floats(r, "scales", sc.download(), q.scales_f32);
        });
      // MXFP8's 1x32 blocks, and its 32x1 blocks with codes^T (the two-step form needs tmp);
      // E5M2 and the floor rule too
      for (auto [fmt, rule] : {std::pair{Format::kE4M3, numerics::MxScaleRule::kCeil},
                               std::pair{Format::kE5M2, numerics::MxScaleRule::kFloor}})
      {
        run_case(std::string("cast_form_mxfp8_1x32_") + (fmt == Format::kE4M3 ? "e4m3" : "e5m2"),
                 name, [&](Result& r) {
          const auto q = numerics::quantize_mxfp8(xv.data(), R, C, false, fmt, rule);
          Dev<uint8_t> codes(R * C), sc(q.scales_u8.size());
          on([&](const auto* xp) {
            cuda::quantize_mxfp8(xp, R, C, false, fmt, rule, {}, codes.p, sc.p, nullptr, s);
          });
          expect_bytes(r, "codes", codes.download(), q.codes);
          expect_bytes(r, "scales", sc.download(), q.scales_u8);
        });
        run_case(std::string("cast_form_mxfp8_32x1_t_") + (fmt == Format::kE4M3 ? "e4m3" : "e5m2"),
                 name, [&](Result& r) {
          const auto q = numerics::quantize_mxfp8(xv.data(), R, C, true, fmt, rule);
          Dev<uint8_t> tmp(R * C), codes_t(R * C), sc(q.scales_u8.size());
          on([&](const auto* xp) { cuda::quantize_mxfp8_t(xp, R, C, fmt, rule, tmp.p, codes_t.p, sc.p, s); });
          expect_bytes(r, "codes_t", codes_t.download(), transpose(q.codes, R, C));
          expect_bytes(r, "scales", sc.download(), q.scales_u8);
        });
        run_case(std::string("cast_form_mxfp8_both_") + (fmt == Format::kE4M3 ? "e4m3" : "e5m2"),
                 name, [&](Result& r) {
          const auto qr = numerics::quantize_mxfp8(xv.data(), R, C, false, fmt, rule);
          const auto qc = numerics::quantize_mxfp8(xv.data(), R, C, true, fmt, rule);
          Dev<uint8_t> tmp(R * C), codes(R * C), codes_t(R * C), sr(qr.scales_u8.size()),
              sc(qc.scales_u8.size());
          on([&](const auto* xp) {
            cuda::quantize_mxfp8_both(xp, R, C, fmt, rule, codes.p, sr.p, tmp.p, codes_t.p, sc.p, s);
          });
          expect_bytes(r, "codes", codes.download(), qr.codes);
          expect_bytes(r, "row scales", sr.download(), qr.scales_u8);
          expect_bytes(r, "codes_t", codes_t.download(), transpose(qc.codes, R, C));
          expect_bytes(r, "col scales", sc.download(), qc.scales_u8);
        });
      }
      run_case("cast_form_fp8_block_128x1_t", name, [&](Result& r) {
        const auto q = numerics::quantize_fp8_block(xv.data(), R, C, 128, 1, true);
        Dev<uint8_t> codes_t(R * C);
        Dev<float> sc(q.scales_f32.size());
        on([&](const auto* xp) {
          cuda::quantize_fp8_block_t(xp, R, C, 128, 1, true, {}, codes_t.p, sc.p, s);
        });
        expect_bytes(r, "codes_t", codes_t.download(), transpose(q.codes, R, C));
        expect_floats(r, "scales", sc.download(), q.scales_f32);
      });
      // A gradient's two fp8-block operands from one read (the fused kernel, or the two calls)
      run_case("cast_form_fp8_block_both", name, [&](Result& r) {
        const auto qr = numerics::quantize_fp8_block(xv.data(), R, C, 1, 128, true);
        const auto qc = numerics::quantize_fp8_block(xv.data(), R, C, 128, 1, true);
        Dev<uint8_t> codes(R * C), codes_t(R * C);
        Dev<float> sr(qr.scales_f32.size()), sc(qc.scales_f32.size());
        on([&](const auto* xp) {
          cuda::quantize_fp8_block_both(xp, R, C, true, codes.p, sr.p, codes_t.p, sc.p, s);
        });
        expect_bytes(r, "codes", codes.download(), qr.codes);
        expect_floats(r, "row scales", sr.download(), qr.scales_f32);
        expect_bytes(r, "codes_t", codes_t.download(), transpose(qc.codes, R, C));
        expect_floats(r, "col scales", sc.download(), qc.scales_f32);
      });
      for (int layout = 0; layout < 3; ++layout)  // row-major, transposed, both
        run_case(std::string("cast_form_fp8_codes") + (layout == 1 ? "_t" : layout == 2 ? "_both" : ""),
                 name, [&](Result& r) {
          const Format fmt = layout == 1 ? Format::kE5M2 : Format::kE4M3;
          const auto q = numerics::quantize_fp8_tensor(xv.data(), R, C, fmt, 3.0f);
          Dev<uint8_t> codes(R * C), codes_t(R * C);
          Dev<float> amax(1), sc(1), sinv(1);  // amax poisoned: the call zeroes it
          cuda::fp8_scales(sc.p, sinv.p, nullptr, 3.0f, fmt, s);
          on([&](const auto* xp) {
            if (layout == 2) cuda::fp8_codes_both(xp, R, C, fmt, sc.p, codes.p, codes_t.p, s, amax.p);
            else cuda::fp8_codes(xp, R, C, fmt, sc.p, layout ? codes_t.p : codes.p, layout == 1, s, amax.p);
          });
          if (layout != 1) expect_bytes(r, "codes", codes.download(), q.codes);
          if (layout != 0) expect_bytes(r, "codes_t", codes_t.download(), transpose(q.codes, R, C));
          expect_floats(r, "amax", amax.download(), {numerics::abs_max(xv.data(), R * C)});
        });
    }
    cuda::force_cast_form(-1);
  };
  for (int form = 0; form < 3; ++form)
    for (auto& sh : shapes)
      for (int specials = 0; specials < 2; ++specials)
        if (!specials || sh[0] == 130)
          run_families("form " + std::to_string(form), sh[0], sh[1], specials, form);
  // Tuning: every family's shape timed at its first call only (11 families x 2 element types),
  // the bytes right after the trials and again from the kept form.
  cuda::set_cast_tune(cuda::CastTune::kAll);
  const int before = cuda::cast_tune_stats().timed;
  run_families("tuned", 160, 416, false, -1);
  const int first = cuda::cast_tune_stats().timed - before;
  run_families("tuned again", 160, 416, false, -1);
  const int second = cuda::cast_tune_stats().timed - before - first;
  cuda::set_cast_tune(cuda::CastTune::kLarge);
  // (MXTRAIN_FP8_CAST_UNROLL set pins the row-major per-tensor casts' form, and
  // MXTRAIN_FP8_TILED_CASTS the transposing ones': those are not timed.)
  const int want = 22 - (std::getenv("MXTRAIN_FP8_CAST_UNROLL") ? 2 : 0) -
                   (std::getenv("MXTRAIN_FP8_TILED_CASTS") ? 4 : 0);
  run_case("cast_tune_count", "160x416", [&](Result& r) {
    r.pass = first == want && second == 0;
    r.note = "timed " + std::to_string(first) + " shapes, then " + std::to_string(second) +
             " (want " + std::to_string(want) + ", then 0)";
  });
}

int main(int argc, char** argv) {
  // The CPU twins' GEMMs on the CPU's own OpenBLAS kernels (backend/cpu/blas_core.h).
  mx::select_blas_core(argv);
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json = argv[++i];
    else if (a == "--filter" && i + 1 < argc) filter = argv[++i];
    else {
      std::fprintf(stderr, "usage: cuda_op_check [--json PATH] [--filter SUBSTRING[,SUBSTRING...]]\n");
      return 2;
    }
  }
  std::signal(SIGTERM, on_stop_signal);
  // Before any backend exists: the CPU backend reads this once, at its first use, and only
  // then lets set_bf16_gemm_operands(true) run its gemm_bf16 (the twin of the CUDA bf16 path).
  setenv("MXTRAIN_TEST_BF16_GEMM", "1", 1);
  std::string device = "unknown";
  try {
    cudaDeviceProp prop{};
    MX_CUDA_CHECK("op_check", cudaGetDeviceProperties(&prop, 0));
    device = std::string(prop.name) + " sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
    std::printf("device: %s\n", device.c_str());
    auto cpu = make_cpu_backend();
    CudaBackendOptions opt;
    opt.sync_after_each_op = true;  // a fault is reported at the op that caused it
    auto gpu = make_cuda_backend(opt);
    const auto t0 = std::chrono::steady_clock::now();
    check_vector_ops(*cpu, *gpu);
    check_gemm(*cpu, *gpu);
    check_gemm_tuned(*cpu);
    check_fp8_fast_accum(*cpu);
    check_deterministic(*cpu);
    check_rows(*cpu, *gpu);
    check_attention(*cpu, *gpu);
    check_attention_groups(*cpu);
    check_attention_fp8_kernel(*cpu, *gpu);
#ifdef MXTRAIN_CUDA_EMU
    // Under mxemu (tests/cuda_emu: CI's run of this program on the CPU) cuDNN is not emulated:
    // the library's graphs are its own code, not ours.
    run_case("attention_cudnn", "skipped", [&](Result& r) { r.note = "cuDNN is not emulated"; });
#else
    check_attention_cudnn(*cpu, *gpu);
    check_attention_cudnn_groups(*cpu, *gpu);
    check_attention_fp8(*cpu, *gpu);
    check_attention_fp8_groups(*cpu, *gpu);
#endif
    check_quantizers(*gpu);
    check_cast_forms(*gpu);
    check_fp8_encoder(*gpu);
    std::printf("%.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    Result r;
    r.op = "setup";
    r.pass = false;
    r.note = e.what();
    results.push_back(r);
  }
  int failed = 0;
  for (auto& r : results) failed += !r.pass;
  std::printf("%zu cases, %d failed\n", results.size(), failed);
  if (stop_signal) std::printf("stopped by signal %d: the cases after it did not run\n", int(stop_signal));
  if (!json.empty()) write_json(json, device);
  if (stop_signal) return 124;
  return failed ? 1 : 0;
}
