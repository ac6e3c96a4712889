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
  if (name == "bf16") {
    r.gemm_efficiency = 0.75;  // large bf16 cuBLASLt GEMMs: ~70-80% of dense peak on H100/B200
    return r;
  }
  // Achievable efficiency is lower for the narrow formats: the same kernels are more
  // bandwidth- and epilogue-bound at twice / four times the math rate.
  if (name == "fp8-delayed" || name == "fp8-current") {
    r.quantized_weight_bytes_per_param = 2.0;  // E4M3 codes, row- and column-wise
    r.scaling_state_bytes_per_linear = name == "fp8-delayed" ? 3 * 1024 * 4 : 3 * 4;
    r.quantize_bytes_per_element = 2 + 1;
    r.gemm_efficiency = 0.65;
    return r;
  }
  if (name == "fp8-block") {
    // DeepSeek-V3 style: 128x128 weight blocks, 1x128 activation tiles, fp32 scales.
    r.quantized_weight_bytes_per_param = 2.0 * (1.0 + 4.0 / (128.0 * 128.0));
    r.quantize_bytes_per_element = 2 + 1 + 4.0 / 128.0;
    r.gemm_efficiency = 0.6;
    return r;
  }
  if (name == "mxfp8") {
    // OCP MX: 32-element blocks, one E8M0 scale byte each.
    r.quantized_weight_bytes_per_param = 2.0 * (1.0 + 1.0 / 32.0);
    r.quantize_bytes_per_element = 2 + 1 + 1.0 / 32.0;
    r.gemm_efficiency = 0.65;
    return r;
  }
  if (name == "nvfp4") {
    // E2M1 codes (half a byte), one E4M3 scale per 16 elements, one fp32 global scale.
    r.quantized_weight_bytes_per_param = 2.0 * (0.5 + 1.0 / 16.0);
    r.scaling_state_bytes_per_linear = 3 * 4;
    r.quantize_bytes_per_element = 2 + 0.5 + 1.0 / 16.0;
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
