#include "plan/recipe.h"

#include "core/error.h"

namespace mx::plan {

std::vector<std::string> recipe_names() {
  return {"fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "nvfp4"};
}

RecipeModel recipe_model(const std::string& name) {
  RecipeModel r;
  r.name = name;
  if (name == "fp32") {
    r.modelled = false;
    r.gemm_efficiency = 0.9;  // the CPU engine's GEMMs run at ~90% of its measured SGEMM rate
    return r;
  }
  // GPU constants (docs/plan.md, "Calibration"): measured on an H200 (bench/RESULTS.md, the
  // 2026-12-04 runs' profiles: Llama-3.2-1B, 2 x 8192 tokens) where `calibrated`, assumed
  // where not. gemm_efficiency is the whole step's GEMM FLOPs over their time, over the dense
  // rate and n / (n + 128); quantize_efficiency the casts' modelled bytes over their time,
  // over the datasheet HBM bandwidth.
  if (name == "bf16") {
    r.gemm_efficiency = 0.72;  // 121.4 TFLOP of GEMMs a step in 171 ms (blocks 695, head 772 TF/s)
    r.calibrated = true;
    return r;
  }
  if (name == "fp8-delayed" || name == "fp8-current") {
    r.quantized_weight_bytes_per_param = 2.0;  // E4M3 codes, row- and column-wise
    r.scaling_state_bytes_per_linear = name == "fp8-delayed" ? 3 * 1024 * 4 : 3 * 4;
    // bf16 in, row-major and transposed codes out (2 + 1 + 1); current scaling reads the
    // input once more for its amax first (+ 2)
    r.quantize_bytes_per_element = name == "fp8-delayed" ? 4 : 6;
    r.gemm_efficiency = 0.65;  // the block Linears' FP8 GEMMs: 1293 TFLOP/s
    // fp8-delayed: 43.6 GB of casts in 37 ms; fp8-current: the step 7 ms longer for 22 GB more
    r.quantize_efficiency = name == "fp8-delayed" ? 0.25 : 0.3;
    r.calibrated = true;
    return r;
  }
  if (name == "fp8-block") {
    // DeepSeek-V3 style: 128x128 weight blocks, 1x128 activation tiles, fp32 scales.
    r.quantized_weight_bytes_per_param = 2.0 * (1.0 + 4.0 / (128.0 * 128.0));
    // the 1x128 rows and the 128x1 columns (transposed) each read the input: 2 x (2 + 1 + 4 / 128)
    r.quantize_bytes_per_element = 2.0 * (2 + 1 + 4.0 / 128.0);
    r.gemm_efficiency = 0.55;     // 1094 TFLOP/s
    r.quantize_efficiency = 0.08;  // 66 GB of quantization in 165 ms (the tiled kernels)
    r.calibrated = true;
    return r;
  }
  // Not run on a GPU (Blackwell only): the GEMMs as assumed, the casts at fp8-delayed's
  // measured fraction of bandwidth.
  if (name == "mxfp8") {
    // OCP MX: 32-element blocks, one E8M0 scale byte each; the 1x32 rows and the 32x1
    // columns (transposed) each read the input.
    r.quantized_weight_bytes_per_param = 2.0 * (1.0 + 1.0 / 32.0);
    r.quantize_bytes_per_element = 2.0 * (2 + 1 + 1.0 / 32.0);
    r.gemm_efficiency = 0.65;
    return r;
  }
  if (name == "nvfp4") {
    // E2M1 codes (half a byte), one E4M3 scale per 16 elements, one fp32 global scale: an
    // input's two layouts (the forward's 1x16 rows, once per distinct input; the weight
    // gradient's Hadamard-transformed x^T, each Linear its own) each read the bf16 input
    // twice, for its own global amax and for its codes and scales; an output gradient's both
    // come from one amax pass and one read; a weight's 16x16 codes, forward and (transposed)
    // data gradient, each from a read of the fp32 weight each micro-batch, after one amax pass
    // a step (the first cast's, kept until the optimizer changes W: LlamaModel::weight_amax).
    r.quantized_weight_bytes_per_param = 2.0 * (0.5 + 1.0 / 16.0);
    r.scaling_state_bytes_per_linear = 3 * 4;
    r.quantize_bytes_per_element = 2 + 2 + 0.5 + 1.0 / 16.0;
    r.quantize_xt_bytes_per_element = 2 + 2 + 0.5 + 1.0 / 16.0;
    r.quantize_grad_bytes_per_element = 2 + 2 + 2.0 * (0.5 + 1.0 / 16.0);
    r.quantize_weight_bytes_per_param = 2.0 * (4 + 0.5 + 1.0 / 16.0);
    r.quantize_weight_step_bytes_per_param = 4;
    r.gemm_efficiency = 0.55;
    return r;
  }
  std::string names;
  for (auto& n : recipe_names()) names += (names.empty() ? "" : ", ") + n;
  throw UserError(str("unknown precision recipe '", name, "' (known: ", names, ")"));
}

bool recipe_supported(const std::string& name, const GpuSpec& gpu) {
  if (gpu.is_cpu) return true;  // the CPU engine emulates every recipe (precision/recipe.h)
  if (name == "fp32") return false;  // GPUs train in bf16 or lower (fp32 master weights kept)
  if (name == "bf16") return true;
  if (name == "mxfp8" || name == "nvfp4") return gpu.mx_formats && gpu.fp4_flops > 0;
  return gpu.fp8_flops > 0;
}

double recipe_gemm_flops(const std::string& name, const GpuSpec& gpu) {
  // CPU: every recipe's GEMM runs in fp32 on dequantized operands (bf16_flops holds SGEMM's).
  if (gpu.is_cpu || name == "fp32" || name == "bf16") return gpu.bf16_flops;
  if (name == "nvfp4") return gpu.fp4_flops;
  return gpu.fp8_flops;
}

}  // namespace mx::plan
