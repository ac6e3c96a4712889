// cuDNN SDPA for the CUDA backend (see cudnn_attention.h). Host code only: compiled by g++ with
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING (every cuDNN call of the frontend goes through
// dlsym on the handle opened here) and CUDNN_FRONTEND_SKIP_JSON_LIB (CMakeLists.txt).
//
// Facts relied on, from the frontend 1.32 headers and docs/operations/Attention.md:
// - the softmax statistics ("Stats", generate_stats) are max + ln(sum exp) of the scaled
//   scores, natural log (base 2 only with set_stats_use_log2), fp32, dims [B, H, T, 1]: our lse;
// - causal = diagonal band with TOP_LEFT alignment and right bound 0 (key j <= query i);
// - grouped-query attention: K / V with fewer heads than Q (H % KV == 0), dK / dV reduced over
//   each group by cuDNN;
// - head dims a multiple of 8, at most 256 on Hopper (128 elsewhere for the backward), and the
//   backward refuses s_q = s_kv = 1 (backend/attention_choice.cpp checks these first).
#include "backend/cuda/cudnn_attention.h"

#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/attention_choice.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "core/log.h"
#include "numerics/attention_fp8.h"

// The handle the frontend's dynamic-loading shim resolves every cuDNN symbol from.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace mx::cuda {
namespace fe = cudnn_frontend;
namespace {

std::once_flag g_load_once;
std::string g_load_problem;  // set by load_cudnn(): "" when loaded

void load_cudnn() {
  std::call_once(g_load_once, [] {
    // The frontend dlopens a CUDA runtime of its own for its few runtime calls: make it the
    // major this program links (libcudart.so.13 for CUDA 13), not the first one found, unless
    // the user chose (the frontend's own variable).
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME",
           str("libcudart.so.", CUDART_VERSION / 1000).c_str(), 0);
    // cuDNN 9 only (the unversioned libcudnn.so could be another major, with another ABI).
    dlerror();
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      const char* e = dlerror();
      g_load_problem = str("libcudnn could not be loaded (", e ? e : "libcudnn.so.9 not found",
                           "); put cuDNN 9's library directory on LD_LIBRARY_PATH");
      return;
    }
    fe::cudnn_dlhandle = h;
    const size_t version = fe::detail::get_backend_version();
    if (version < 90000) {
      g_load_problem = str("libcudnn.so.9 reports version ", version, ", not cuDNN 9");
      return;
    }
    g_load_problem.clear();
  });
}

// One-line errors naming the call, as MX_CUDA_CHECK does for the runtime.
void cudnn_check(cudnnStatus_t st, const char* op, const char* call) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw CudaError(str("cudnn: ", op, ": ", call, ": ", fe::detail::get_error_string(st),
                        " (status ", int(st), ")"));
}
void fe_check(fe::error_t e, const char* op, const char* call) {
  if (e.is_bad())
    throw CudaError(str("cudnn: ", op, ": ", call, ": ", e.get_message(), " (frontend code ",
                        int(e.get_code()), ")"));
}
#define MX_CUDNN_CHECK(op, expr) cudnn_check((expr), (op), #expr)
#define MX_CUDNN_FE_CHECK(op, expr) fe_check((expr), (op), #expr)

using Shape = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;  // B, T, H, KV, D
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor uids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };
// The FP8 graphs' further tensors: each scale slot of numerics::attn_fp8_scale_slots at
// kSlot0 + slot, and cuDNN's amax outputs.
constexpr int64_t kSlot0 = 100;
enum AmaxUid : int64_t { kAmax0 = 200, kAmax1, kAmax2, kAmax3 };

std::vector<int64_t> vec(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }

size_t bf16_bytes(int64_t n) { return DeviceArena::round_up(sizeof(uint16_t) * size_t(n)); }

// n bf16 values in scratch (the caller's scope): src rounded (RNE), or room only (src null).
void* bf16_copy(const float* src, int64_t n, DeviceArena& scratch, cudaStream_t s) {
  uint16_t* dst = scratch.alloc_as<uint16_t>(n);
  if (src) round_to_bf16(dst, src, n, s);
  return dst;
}

// The byte alignment the graphs' tensors declare (Tensor_attributes' default, 16) and the
// frontend's execute() checks every SDPA operand's pointer against.
bool graph_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The bf16 buffer cuDNN reads for one input of n values (scratch in the caller's scope): the
// caller's codes themselves where aligned, else an aligned copy of them; fp32 rounded (RNE).
void* bf16_input(const CudnnAttention::In& x, int64_t n, DeviceArena& scratch, cudaStream_t s,
                 const char* op) {
  MX_ASSERT((x.f32 != nullptr) != (x.codes != nullptr), op,
            ": a cuDNN input needs exactly one of fp32 values and bf16 codes");
  if (x.f32) return bf16_copy(x.f32, n, scratch, s);
  if (graph_aligned(x.codes)) return const_cast<uint16_t*>(x.codes);
  uint16_t* dst = scratch.alloc_as<uint16_t>(n);
  MX_CUDA_CHECK(op, cudaMemcpyAsync(dst, x.codes, sizeof(uint16_t) * size_t(n),
                                    cudaMemcpyDeviceToDevice, s));
  return dst;
}

// The bf16 buffer cuDNN writes one output of n values into: the caller's codes where aligned,
// else room in scratch, which finish_output() then moves to the caller.
void* bf16_output(const CudnnAttention::Out& y, int64_t n, DeviceArena& scratch,
                  const char* op) {
  MX_ASSERT((y.f32 != nullptr) != (y.codes != nullptr), op,
            ": a cuDNN output needs exactly one of an fp32 and a bf16 destination");
  if (y.codes && graph_aligned(y.codes)) return y.codes;
  return scratch.alloc_as<uint16_t>(n);
}
// After the graph ran (stream order): widen into the fp32 destination, or copy the codes over
// where cuDNN wrote them into scratch.
void finish_output(const CudnnAttention::Out& y, void* buf, int64_t n, cudaStream_t s,
                   const char* op) {
  if (y.f32) return widen_bf16(y.f32, static_cast<const uint16_t*>(buf), n, s);
  if (buf != y.codes)
    MX_CUDA_CHECK(op, cudaMemcpyAsync(y.codes, buf, sizeof(uint16_t) * size_t(n),
                                      cudaMemcpyDeviceToDevice, s));
}

// Every graph's attention attributes: named, scale 1/sqrt(D), causal (the diagonal band,
// top-left, right bound 0: key j <= query i).
template <class Attributes>
Attributes causal(Attributes a, const char* name, float scale) {
  a.set_name(name)
      .set_attn_scale(scale)
      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0);
  return a;
}

struct Entry {
  std::string problem;  // "" when both graphs are built
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  int64_t fwd_workspace = 0, bwd_workspace = 0;
};

}  // namespace

struct CudnnAttention::Impl {
  cudaStream_t stream;
  cudnnHandle_t handle = nullptr;
  std::map<Shape, Entry> cache;
  bool deterministic = false;
  int cc_major = -1;  // the GPU's compute capability (major), read at its first use
  int gpu_major() {
    if (cc_major < 0) {  // (0 where it cannot be read: no GPU, where nothing runs anyway)
      int device = 0;
      if (cudaGetDevice(&device) != cudaSuccess ||
          cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device) !=
              cudaSuccess) {
        cudaGetLastError();
        cc_major = 0;
      }
    }
    return cc_major;
  }

  ~Impl() {
    cache.clear();
    fp8_cache.clear();  // the graphs' plans were built against the handle: they go first
    if (handle) fe::detail::destroy_handle(handle);
  }

  std::shared_ptr<fe::graph::Graph> new_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  }
  static TensorPtr input(fe::graph::Graph& g, const char* name, Uid uid, const TensorView4& v) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim(vec(v.dim))
                        .set_stride(vec(v.stride)));
  }
  static void output(const TensorPtr& t, Uid uid, const TensorView4& v) {
    t->set_output(true).set_uid(uid).set_dim(vec(v.dim)).set_stride(vec(v.stride));
  }

  // Builds a graph for this GPU; a failure is returned as the reason (the shape then falls back).
  std::string build(fe::graph::Graph& g, int64_t& workspace) {
    auto step = [](fe::error_t e, const char* what) -> std::string {
      return e.is_good() ? "" : str(what, ": ", e.get_message());
    };
    std::string why;
    if (!(why = step(g.validate(), "validate")).empty()) return why;
    if (!(why = step(g.build_operation_graph(handle), "build_operation_graph")).empty()) return why;
    if (!(why = step(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                     "create_execution_plans")).empty())
      return why;
    if (!(why = step(g.check_support(), "check_support")).empty()) return why;
    if (!(why = step(g.build_plans(), "build_plans")).empty()) return why;
    return step(g.get_workspace_size(workspace), "get_workspace_size");
  }

  // The bf16 graphs, or with fp8 the FP8 ones (build_fp8_graphs).
  Entry make_entry(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, bool fp8 = false) {
    Entry e;
    load_cudnn();
    if (!g_load_problem.empty()) {
      e.problem = g_load_problem;
      return e;
    }
    if (!(e.problem = cudnn_sdpa_shape_problem(B, T, H, KV, D)).empty()) return e;
    // cuDNN's FP8 SDPA backward (the frontend's check, sdpa_fp8_bwd.h) takes head dims that
    // are multiples of 16, at most 128, on compute capability 10.x and newer, and 128 only
    // below (Hopper: not Llama-3.2-1B's 64), from cuDNN 9.1.
    if (fp8 && (D % 16 != 0 || D > 128)) {
      e.problem = str("FP8 attention needs a head dim that is a multiple of 16 and at most 128 (",
                      D, ")");
      return e;
    }
    if (fp8 && gpu_major() < 10 && D != 128) {
      e.problem = str("cuDNN's FP8 attention backward takes head dim 128 only on compute "
                      "capability ", gpu_major(), ".x (this shape's: ", D, "; 10.x takes "
                      "multiples of 16 up to 128)");
      return e;
    }
    // (the frontend's sdpa_fp8_bwd.h takes the attribute on 10.x only; elsewhere the FP8
    // backward would run its usual dQ accumulation, whose order varies run to run)
    if (fp8 && deterministic && gpu_major() != 10) {
      e.problem = str("run.deterministic: cuDNN's FP8 attention backward has a deterministic "
                      "form on compute capability 10.x only (this GPU: ", gpu_major(), ".x)");
      return e;
    }
    if (fp8 && fe::detail::get_backend_version() < 90100) {
      e.problem = str("FP8 attention needs cuDNN 9.1 or newer (this is ",
                      fe::detail::get_backend_version(), ")");
      return e;
    }
    // A cuDNN that loads but cannot be used here (no handle, a symbol the frontend needs
    // missing from an older library: the shim throws) is a reason to fall back, not a crash.
    try {
      if (!handle) {
        MX_CUDNN_CHECK("attention", fe::detail::create_handle(&handle));
        const cudnnStatus_t st = fe::detail::set_stream(handle, stream);
        if (st != CUDNN_STATUS_SUCCESS) {
          fe::detail::destroy_handle(handle);
          handle = nullptr;
          MX_CUDNN_CHECK("attention", st);
        }
      }
      if (fp8) build_fp8_graphs(e, B, T, H, KV, D);
      else build_graphs(e, B, T, H, KV, D);
    } catch (const std::exception& ex) {
      e.problem = str("cuDNN failed while building the ", fp8 ? "FP8 " : "", "graphs: ",
                      ex.what());
    }
    if (!e.problem.empty()) e.fwd.reset(), e.bwd.reset();
    return e;
  }

  void build_graphs(Entry& e, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    const float scale = 1.0f / std::sqrt(float(D));
    const TensorView4 qv = bshd_view(B, T, H, D), kv = bshd_view(B, T, KV, D),
                      sv = stats_view(B, H, T);
    {  // forward: O, Stats = sdpa(Q, K, V), causal
      e.fwd = new_graph();
      auto& g = *e.fwd;
      auto q = input(g, "q", kQ, qv), k = input(g, "k", kK, kv), v = input(g, "v", kV, kv);
      auto opts = causal(fe::graph::SDPA_attributes(), "mx_sdpa", scale);
      opts.set_generate_stats(true);
      auto [o, stats] = g.sdpa(q, k, v, opts);
      output(o, kO, qv);
      output(stats, kStats, sv);
      stats->set_data_type(fe::DataType_t::FLOAT);
      const std::string why = build(g, e.fwd_workspace);
      if (!why.empty()) e.problem = "cuDNN refuses the forward: " + why;
    }
    if (e.problem.empty()) {  // backward: dQ, dK, dV from Q, K, V, O, dO and Stats
      e.bwd = new_graph();
      auto& g = *e.bwd;
      auto q = input(g, "q", kQ, qv), k = input(g, "k", kK, kv), v = input(g, "v", kV, kv);
      auto o = input(g, "o", kO, qv), dout = input(g, "do", kDO, qv);
      auto stats = input(g, "stats", kStats, sv);
      stats->set_data_type(fe::DataType_t::FLOAT);
      auto opts = causal(fe::graph::SDPA_backward_attributes(), "mx_sdpa_backward", scale);
      opts.set_deterministic_algorithm(deterministic);
      auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, opts);
      output(dq, kDQ, qv);
      output(dk, kDK, kv);
      output(dv, kDV, kv);
      const std::string why = build(g, e.bwd_workspace);
      if (!why.empty()) e.problem = "cuDNN refuses the backward: " + why;
    }
  }

  std::map<Shape, Entry> fp8_cache;

  std::shared_ptr<fe::graph::Graph> new_fp8_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::FP8_E4M3)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  }
  static TensorPtr slot(fe::graph::Graph& g, numerics::AttnFp8Slot s, const char* name) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(kSlot0 + s)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
  }
  static void amax_output(const TensorPtr& t, int64_t uid) {
    t->set_output(true).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
        fe::DataType_t::FLOAT);
  }

  void build_fp8_graphs(Entry& e, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    namespace nm = numerics;
    const float scale = 1.0f / std::sqrt(float(D));
    const TensorView4 qv = bshd_view(B, T, H, D), kv = bshd_view(B, T, KV, D),
                      sv = stats_view(B, H, T);
    {  // forward: O (E4M3), Stats, amax(P), amax(O) = sdpa_fp8(Q, K, V), causal
      e.fwd = new_fp8_graph();
      auto& g = *e.fwd;
      auto q = input(g, "q", kQ, qv), k = input(g, "k", kK, kv), v = input(g, "v", kV, kv);
      auto opts = causal(fe::graph::SDPA_fp8_attributes(), "mx_sdpa_fp8", scale);
      opts.set_generate_stats(true);
      auto [o, stats, amax_s, amax_o] =
          g.sdpa_fp8(q, k, v, slot(g, nm::kAttnDescaleQ, "descale_q"),
                     slot(g, nm::kAttnDescaleK, "descale_k"), slot(g, nm::kAttnDescaleV, "descale_v"),
                     slot(g, nm::kAttnDescaleS, "descale_s"), slot(g, nm::kAttnScaleS, "scale_s"),
                     slot(g, nm::kAttnScaleO, "scale_o"), opts);
      output(o, kO, qv);
      o->set_data_type(fe::DataType_t::FP8_E4M3);
      output(stats, kStats, sv);
      stats->set_data_type(fe::DataType_t::FLOAT);
      amax_output(amax_s, kAmax0);
      amax_output(amax_o, kAmax1);
      const std::string why = build(g, e.fwd_workspace);
      if (!why.empty()) e.problem = "cuDNN refuses the FP8 forward: " + why;
    }
    if (e.problem.empty()) {  // backward: dQ, dK, dV (E5M2) and their amaxes, amax(dP)
      e.bwd = new_fp8_graph();
      auto& g = *e.bwd;
      auto q = input(g, "q", kQ, qv), k = input(g, "k", kK, kv), v = input(g, "v", kV, kv);
      auto o = input(g, "o", kO, qv), dout = input(g, "do", kDO, qv);
      dout->set_data_type(fe::DataType_t::FP8_E5M2);
      auto stats = input(g, "stats", kStats, sv);
      stats->set_data_type(fe::DataType_t::FLOAT);
      auto opts =
          causal(fe::graph::SDPA_fp8_backward_attributes(), "mx_sdpa_fp8_backward", scale);
      opts.set_deterministic_algorithm(deterministic);
      auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] = g.sdpa_fp8_backward(
          q, k, v, o, dout, stats, slot(g, nm::kAttnDescaleQ, "descale_q"),
          slot(g, nm::kAttnDescaleK, "descale_k"), slot(g, nm::kAttnDescaleV, "descale_v"),
          slot(g, nm::kAttnDescaleO, "descale_o"), slot(g, nm::kAttnDescaleDO, "descale_do"),
          slot(g, nm::kAttnDescaleS, "descale_s"),
          slot(g, nm::kAttnCudnnDescaleDP, "descale_dp"),  // (its dP is attn_scale dS)
          slot(g, nm::kAttnScaleS, "scale_s"), slot(g, nm::kAttnScaleDQ, "scale_dq"),
          slot(g, nm::kAttnScaleDK, "scale_dk"), slot(g, nm::kAttnScaleDV, "scale_dv"),
          slot(g, nm::kAttnCudnnScaleDP, "scale_dp"), opts);
      output(dq, kDQ, qv);
      output(dk, kDK, kv);
      output(dv, kDV, kv);
      for (const TensorPtr& t : {dq, dk, dv}) t->set_data_type(fe::DataType_t::FP8_E5M2);
      amax_output(amax_dq, kAmax0);
      amax_output(amax_dk, kAmax1);
      amax_output(amax_dv, kAmax2);
      amax_output(amax_dp, kAmax3);
      const std::string why = build(g, e.bwd_workspace);
      if (!why.empty()) e.problem = "cuDNN refuses the FP8 backward: " + why;
    }
  }

  Entry& fp8_entry(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    const Shape key{B, T, H, KV, D};
    auto it = fp8_cache.find(key);
    if (it != fp8_cache.end()) return it->second;
    Entry& e = fp8_cache.emplace(key, make_entry(B, T, H, KV, D, true)).first->second;
    const std::string shape = str("B=", B, " T=", T, " H=", H, " KV=", KV, " D=", D);
    if (e.problem.empty())
      info("cuda attention: cudnn FP8 SDPA (E4M3 q, k, v, P, O; E5M2 gradients",
           deterministic ? "; deterministic backward" : "", "; cuDNN ",
           fe::detail::get_backend_version(), ") for ", shape, "; workspace: forward ",
           format_bytes(double(e.fwd_workspace)), ", backward ",
           format_bytes(double(e.bwd_workspace)));
    else
      warn(str("cuda attention: no FP8 attention for ", shape, ": ", e.problem));
    return e;
  }

  // The variant pack's scale tensors and amax outputs.
  static void add_fp8_slots(std::unordered_map<int64_t, void*>& pack, const float* scales,
                            float* amax, bool backward) {
    namespace nm = numerics;
    const nm::AttnFp8Slot fwd[] = {nm::kAttnDescaleQ, nm::kAttnDescaleK, nm::kAttnDescaleV,
                                   nm::kAttnDescaleS, nm::kAttnScaleS, nm::kAttnScaleO};
    const nm::AttnFp8Slot bwd[] = {nm::kAttnDescaleQ,      nm::kAttnDescaleK,
                                   nm::kAttnDescaleV,      nm::kAttnDescaleO,
                                   nm::kAttnDescaleDO,     nm::kAttnDescaleS,
                                   nm::kAttnCudnnDescaleDP, nm::kAttnScaleS,
                                   nm::kAttnScaleDQ,       nm::kAttnScaleDK,
                                   nm::kAttnScaleDV,       nm::kAttnCudnnScaleDP};
    auto put = [&](nm::AttnFp8Slot s) {
      pack[kSlot0 + s] = const_cast<float*>(scales + s * nm::kAttnFp8SlotFloats);
    };
    if (backward)
      for (auto s : bwd) put(s);
    else
      for (auto s : fwd) put(s);
    for (int i = 0; i < (backward ? 4 : 2); ++i) pack[kAmax0 + i] = amax + i * 4;
  }

  Entry& entry(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    const Shape key{B, T, H, KV, D};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Entry& e = cache.emplace(key, make_entry(B, T, H, KV, D)).first->second;
    const std::string shape = str("B=", B, " T=", T, " H=", H, " KV=", KV, " D=", D);
    if (e.problem.empty())
      info("cuda attention: cudnn SDPA (bf16, fp32 accumulation",
           deterministic ? ", deterministic backward" : "", "; cuDNN ",
           fe::detail::get_backend_version(), ") for ", shape, "; scratch per call: forward ",
           format_bytes(double(forward_bytes(e, B, T, H, KV, D))), ", backward ",
           format_bytes(double(backward_bytes(e, B, T, H, KV, D))));
    else
      warn(str("cuda attention: fp32 kernel for ", shape, ": ", e.problem));
    return e;
  }

  static size_t forward_bytes(const Entry& e, int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t D) {
    const int64_t nq = B * T * H * D, nk = B * T * KV * D;
    return 2 * bf16_bytes(nq) + 2 * bf16_bytes(nk) +
           DeviceArena::round_up(size_t(e.fwd_workspace));
  }
  static size_t backward_bytes(const Entry& e, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t D) {
    const int64_t nq = B * T * H * D, nk = B * T * KV * D;
    return 4 * bf16_bytes(nq) + 4 * bf16_bytes(nk) +
           DeviceArena::round_up(size_t(e.bwd_workspace));
  }

  // The shape's entry, which must have been found usable (the backend asks problem() first).
  const Entry& ready(const char* op, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    const Entry& e = entry(B, T, H, KV, D);
    MX_ASSERT(e.problem.empty(), op, " on cuDNN for a shape it does not take: ", e.problem);
    return e;
  }

  void execute(const fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack,
               int64_t workspace_bytes, DeviceArena& scratch, const char* op) {
    void* ws = workspace_bytes > 0 ? scratch.alloc(size_t(workspace_bytes)) : nullptr;
    MX_CUDNN_FE_CHECK(op, g.execute(handle, pack, ws));
  }
};

CudnnAttention::CudnnAttention(cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
}
CudnnAttention::~CudnnAttention() = default;

void CudnnAttention::set_deterministic(bool on) {
  // The frontend reads the variable when it builds a backward graph (cuDNN 9.25 and newer on
  // 9.x): 0 bytes of dP workspace allowed, so the deterministic backward is the ordered-dQ
  // engine, whose workspace grows with T, not T^2. A value the user set stays.
  if (on) setenv("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT", "0", /*overwrite=*/0);
  impl_->deterministic = on;
  impl_->cache.clear();  // graphs built without it (none, when called before the first op)
  impl_->fp8_cache.clear();
}

const std::string& CudnnAttention::problem(int64_t B, int64_t T, int64_t H, int64_t KV,
                                           int64_t D) {
  return impl_->entry(B, T, H, KV, D).problem;
}

size_t CudnnAttention::forward_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t KV,
                                             int64_t D) {
  const Entry& e = impl_->entry(B, T, H, KV, D);
  return e.problem.empty() ? Impl::forward_bytes(e, B, T, H, KV, D) : 0;
}
size_t CudnnAttention::backward_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t KV,
                                              int64_t D) {
  const Entry& e = impl_->entry(B, T, H, KV, D);
  return e.problem.empty() ? Impl::backward_bytes(e, B, T, H, KV, D) : 0;
}

void CudnnAttention::forward(Out out, float* lse, In q, In k, In v, int64_t B, int64_t T,
                             int64_t H, int64_t KV, int64_t D, DeviceArena& scratch,
                             const char* op) {
  const Entry& e = impl_->ready(op, B, T, H, KV, D);
  const cudaStream_t s = impl_->stream;
  const int64_t nq = B * T * H * D, nk = B * T * KV * D;
  DeviceArenaScope scope(scratch);
  std::unordered_map<int64_t, void*> pack;
  pack[kQ] = bf16_input(q, nq, scratch, s, op);
  pack[kK] = bf16_input(k, nk, scratch, s, op);
  pack[kV] = bf16_input(v, nk, scratch, s, op);
  pack[kO] = bf16_output(out, nq, scratch, op);
  pack[kStats] = lse;
  impl_->execute(*e.fwd, pack, e.fwd_workspace, scratch, op);
  finish_output(out, pack[kO], nq, s, op);
}

void CudnnAttention::backward(Out dq, Out dk, Out dv, In dout, In q, In k, In v, In out,
                              const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t D, DeviceArena& scratch, const char* op) {
  const Entry& e = impl_->ready(op, B, T, H, KV, D);
  const cudaStream_t s = impl_->stream;
  const int64_t nq = B * T * H * D, nk = B * T * KV * D;
  DeviceArenaScope scope(scratch);
  std::unordered_map<int64_t, void*> pack;
  pack[kQ] = bf16_input(q, nq, scratch, s, op);
  pack[kK] = bf16_input(k, nk, scratch, s, op);
  pack[kV] = bf16_input(v, nk, scratch, s, op);
  pack[kO] = bf16_input(out, nq, scratch, s, op);
  pack[kDO] = bf16_input(dout, nq, scratch, s, op);
  pack[kDQ] = bf16_output(dq, nq, scratch, op);
  pack[kDK] = bf16_output(dk, nk, scratch, op);
  pack[kDV] = bf16_output(dv, nk, scratch, op);
  pack[kStats] = const_cast<float*>(lse);
  impl_->execute(*e.bwd, pack, e.bwd_workspace, scratch, op);
  finish_output(dq, pack[kDQ], nq, s, op);
  finish_output(dk, pack[kDK], nk, s, op);
  finish_output(dv, pack[kDV], nk, s, op);
}

const std::string& CudnnAttention::fp8_problem(int64_t B, int64_t T, int64_t H, int64_t KV,
                                               int64_t D) {
  return impl_->fp8_entry(B, T, H, KV, D).problem;
}

size_t CudnnAttention::fp8_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t KV,
                                           int64_t D, bool backward) {
  const Entry& e = impl_->fp8_entry(B, T, H, KV, D);
  if (!e.problem.empty()) return 0;
  return DeviceArena::round_up(size_t(backward ? e.bwd_workspace : e.fwd_workspace));
}

void CudnnAttention::forward_fp8(uint8_t* o8, float* lse, const uint8_t* q8, const uint8_t* k8,
                                 const uint8_t* v8, const float* scales, float* amax, int64_t B,
                                 int64_t T, int64_t H, int64_t KV, int64_t D,
                                 DeviceArena& scratch) {
  const char* op = "attention_forward_fp8";
  const Entry& e = impl_->fp8_entry(B, T, H, KV, D);
  MX_ASSERT(e.problem.empty(), op, " on cuDNN for a shape it does not take: ", e.problem);
  for (const void* p : {static_cast<const void*>(o8), static_cast<const void*>(q8),
                        static_cast<const void*>(k8), static_cast<const void*>(v8),
                        static_cast<const void*>(scales), static_cast<const void*>(amax)})
    MX_ASSERT(graph_aligned(p), op, ": an operand is not on 16 bytes");
  DeviceArenaScope scope(scratch);
  std::unordered_map<int64_t, void*> pack;
  pack[kQ] = const_cast<uint8_t*>(q8);
  pack[kK] = const_cast<uint8_t*>(k8);
  pack[kV] = const_cast<uint8_t*>(v8);
  pack[kO] = o8;
  pack[kStats] = lse;
  Impl::add_fp8_slots(pack, scales, amax, false);
  impl_->execute(*e.fwd, pack, e.fwd_workspace, scratch, op);
}

void CudnnAttention::backward_fp8(uint8_t* dq8, uint8_t* dk8, uint8_t* dv8, const uint8_t* do8,
                                  const uint8_t* q8, const uint8_t* k8, const uint8_t* v8,
                                  const uint8_t* o8, const float* lse, const float* scales,
                                  float* amax, int64_t B, int64_t T, int64_t H, int64_t KV,
                                  int64_t D, DeviceArena& scratch) {
  const char* op = "attention_backward_fp8";
  const Entry& e = impl_->fp8_entry(B, T, H, KV, D);
  MX_ASSERT(e.problem.empty(), op, " on cuDNN for a shape it does not take: ", e.problem);
  for (const void* p : {static_cast<const void*>(dq8), static_cast<const void*>(dk8),
                        static_cast<const void*>(dv8), static_cast<const void*>(do8),
                        static_cast<const void*>(q8), static_cast<const void*>(k8),
                        static_cast<const void*>(v8), static_cast<const void*>(o8),
                        static_cast<const void*>(scales), static_cast<const void*>(amax)})
    MX_ASSERT(graph_aligned(p), op, ": an operand is not on 16 bytes");
  DeviceArenaScope scope(scratch);
  std::unordered_map<int64_t, void*> pack;
  pack[kQ] = const_cast<uint8_t*>(q8);
  pack[kK] = const_cast<uint8_t*>(k8);
  pack[kV] = const_cast<uint8_t*>(v8);
  pack[kO] = const_cast<uint8_t*>(o8);
  pack[kDO] = const_cast<uint8_t*>(do8);
  pack[kDQ] = dq8;
  pack[kDK] = dk8;
  pack[kDV] = dv8;
  pack[kStats] = const_cast<float*>(lse);
  Impl::add_fp8_slots(pack, scales, amax, true);
  impl_->execute(*e.bwd, pack, e.bwd_workspace, scratch, op);
}

std::string cudnn_library_problem() {
  load_cudnn();
  return g_load_problem;
}

size_t cudnn_library_version() {
  load_cudnn();
  return g_load_problem.empty() ? fe::detail::get_backend_version() : 0;
}

}  // namespace mx::cuda
