// Causal grouped-query attention on cuDNN's fused SDPA (flash attention on tensor cores) through
// the cudnn-frontend graph API: the CUDA backend's default attention where it is built
// (MXTRAIN_HAVE_CUDNN, CMakeLists.txt) and cuDNN supports the shape; otherwise the backend runs
// its fp32 kernel (attention.cu). See docs/cuda.md.
//
// Interface as Backend::attention_forward / _backward (fp32, q/out/dq/dout [B, T, H, D], k/v/dk/dv
// [B, T, KV, D], lse [B, H, T]: max + ln(sum exp) of the scores scaled by 1/sqrt(D), natural log).
// Inside: q, k, v (and out, dout for the backward) rounded to bf16 (RNE, as numerics/ rounds)
// into the backend's scratch, cuDNN in bf16 with fp32 accumulation and fp32 softmax statistics
// (written straight into lse), out / dq / dk / dv widened back to fp32. Both directions read our
// BSHD layout through strides (no transposes). dq, dk, dv are written, not accumulated.
// The general forms take each bf16 operand either way: fp32 to round (as above) or bf16 codes
// that cuDNN reads as they are, and write each output either widened to fp32 or straight as
// codes (Backend::attention_forward_bf16 / _backward_bf16: q, k, v, out as codes).
//
// libcudnn is opened at run time (dlopen libcudnn.so.9): a machine without it runs the fp32
// kernel, with the reason logged once. This header has no cuDNN types, so nvcc-compiled files
// include it; the implementation (cudnn_attention.cpp) is host code compiled by g++.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backend/cuda/device_arena.h"

namespace mx::cuda {

class CudnnAttention {
 public:
  // No cuDNN call here: the library is opened, the handle created (bound to `stream`) and the
  // graphs built at the first shape asked for.
  explicit CudnnAttention(cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // run.deterministic (Backend::set_deterministic): the backward graphs built from here on
  // take cuDNN's deterministic algorithm (`set_deterministic_algorithm`: dQ accumulated in a
  // fixed order; on compute capability 9.x through cuDNN 9.24 by a dP workspace of 2 bytes a
  // score, B H T^2 x 2 a call, which the scratch arena must hold; from 9.25 the ordered-dQ
  // engine, asked for through CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT=0, set here unless the
  // environment has it). cuDNN's FP8 backward has a deterministic form on 10.x only: on other
  // GPUs the FP8 graphs are refused (the FP8 attention then runs on the fp32 kernel, which is
  // deterministic). Graphs built before are dropped. Where cuDNN refuses a shape's
  // deterministic backward (Blackwell before cuDNN 9.18), the shape falls back as for any
  // refusal, to the fp32 kernel.
  void set_deterministic(bool on);

  // "" when this shape runs on cuDNN, else why not (libcudnn missing, a shape rule of
  // backend/attention_choice.h, or cuDNN's own support check). The first call for a shape builds
  // both its forward and backward graphs (one decision per shape, so a backward never mixes with
  // the other implementation's forward), caches them, and logs the outcome once. A cuDNN that
  // loads but fails here (cudnnCreate, a symbol missing from an older library) is a reason too.
  const std::string& problem(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

  // One bf16 input of the graphs, exactly one pointer set: f32, rounded to bf16 (RNE) into
  // scratch for the call; or codes (numerics::encode_bf16 bit patterns), read by cuDNN as they
  // are (copied into scratch first only when not on the 16-byte alignment the graphs declare,
  // which the frontend's execute() enforces).
  struct In {
    const float* f32 = nullptr;
    const uint16_t* codes = nullptr;
    static In fp32(const float* p) { return {p, nullptr}; }
    static In bf16(const uint16_t* p) { return {nullptr, p}; }
  };
  // One bf16 output, exactly one pointer set: f32, cuDNN's bf16 result widened into it from
  // scratch; or codes, written by cuDNN straight (through scratch only when not 16-byte aligned).
  struct Out {
    float* f32 = nullptr;
    uint16_t* codes = nullptr;
    static Out fp32(float* p) { return {p, nullptr}; }
    static Out bf16(uint16_t* p) { return {nullptr, p}; }
  };

  // Both require problem(...) == "" for the shape (one graph per shape, whatever form the
  // operands take). Scratch: the bf16 copies and cuDNN's workspace, released on return (stream
  // order keeps later users after these kernels). op: the backend op's name, which errors
  // carry (attention_forward_bf16 and the other codes forms run here too).
  void forward(Out out, float* lse, In q, In k, In v, int64_t B, int64_t T, int64_t H,
               int64_t KV, int64_t D, DeviceArena& scratch, const char* op = "attention_forward");
  void backward(Out dq, Out dk, Out dv, In dout, In q, In k, In v, In out, const float* lse,
                int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DeviceArena& scratch,
                const char* op = "attention_backward");
  // The fp32 interface (Backend::attention_forward / _backward): every operand fp32.
  void forward(float* out, float* lse, const float* q, const float* k, const float* v,
               int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DeviceArena& scratch) {
    forward(Out::fp32(out), lse, In::fp32(q), In::fp32(k), In::fp32(v), B, T, H, KV, D, scratch);
  }
  void backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                const float* k, const float* v, const float* out, const float* lse, int64_t B,
                int64_t T, int64_t H, int64_t KV, int64_t D, DeviceArena& scratch) {
    backward(Out::fp32(dq), Out::fp32(dk), Out::fp32(dv), In::fp32(dout), In::fp32(q),
             In::fp32(k), In::fp32(v), In::fp32(out), lse, B, T, H, KV, D, scratch);
  }

  // FP8 attention (numerics/attention_fp8.h; docs/numerics.md, "FP8 attention") on cuDNN's
  // fused FP8 SDPA (Graph::sdpa_fp8 / sdpa_fp8_backward): codes in and out, q, k, v, o as E4M3,
  // do, dq, dk, dv as E5M2, in our BSHD layout, lse fp32 as above. scales: the device array
  // numerics::attn_fp8_scale_slots fills. amax (device, 4 floats): cuDNN's own amaxes of the
  // tensors it encodes, forward {P, O}, backward {dQ, dK, dV, dP} (diagnostics: each must stay
  // below its format's largest value over its scale). fp8_problem: "" when cuDNN builds both
  // graphs for the shape, else why not (the FP8 graphs are built apart from the bf16 ones).
  const std::string& fp8_problem(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);
  void forward_fp8(uint8_t* o8, float* lse, const uint8_t* q8, const uint8_t* k8,
                   const uint8_t* v8, const float* scales, float* amax, int64_t B, int64_t T,
                   int64_t H, int64_t KV, int64_t D, DeviceArena& scratch);
  void backward_fp8(uint8_t* dq8, uint8_t* dk8, uint8_t* dv8, const uint8_t* do8,
                    const uint8_t* q8, const uint8_t* k8, const uint8_t* v8, const uint8_t* o8,
                    const float* lse, const float* scales, float* amax, int64_t B, int64_t T,
                    int64_t H, int64_t KV, int64_t D, DeviceArena& scratch);

  // Scratch bytes one FP8 call for B sequences takes beside the codes the caller passes in:
  // cuDNN's workspace for the shape's FP8 graph (0 when fp8_problem is not "").
  size_t fp8_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                             bool backward);

  // Scratch bytes one call with every operand in fp32 takes for this shape (bf16 copies +
  // cuDNN workspace): a bound for every form (an operand given as codes takes no copy, or, not
  // 16-byte aligned, one of the same size); 0 when the shape does not run on cuDNN.
  size_t forward_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);
  size_t backward_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The process's libcudnn: "" when it is loaded (opening it on the first call), else the loader's
// error. cudnn_library_version(): cudnnGetVersion() (e.g. 91900), 0 when not loaded.
std::string cudnn_library_problem();
size_t cudnn_library_version();

}  // namespace mx::cuda
