// Precision recipes as the planner models them, by the names precision.recipe takes. The CPU
// engine emulates every recipe (precision/recipe.h: quantize, dequantize, fp32 GEMM), and its
// memory is replayed exactly (plan/memory.cpp); on GPUs the recipes (bf16, FP8 and FP4
// families, DESIGN.md) are MODELLED here: what they do to the GEMM rate and what extra
// quantized weight copies and scales they keep.
#pragma once
#include <string>
#include <vector>

#include "plan/gpus.h"

namespace mx::plan {

struct RecipeModel {
  std::string name;
  bool modelled = true;  // false for fp32 (the CPU engine's own precision)
  // Bytes per parameter of the quantized weight copies a gathered unit carries besides its
  // compute-dtype copy: both orientations (row-wise for forward/dgrad, column-wise for wgrad),
  // codes plus block scales.
  double quantized_weight_bytes_per_param = 0;
  // Per Linear: fp32 scaling state (delayed scaling: amax histories of input, weight, grad).
  double scaling_state_bytes_per_linear = 0;
  // Bytes moved per element quantized, as this build's CUDA engine moves them: each cast
  // reads the bf16 input (an amax pass first under current scaling) and writes codes + scales
  // in the layouts the GEMMs take (row-major and transposed), for the time model.
  double quantize_bytes_per_element = 0;
  // The same for an element of an output gradient where it differs (0: the same), whose two
  // layouts may come from one read.
  double quantize_grad_bytes_per_element = 0;
  // Where each Linear makes its own weight-gradient operand of its input (nvfp4: x^T through
  // that Linear's Hadamard transform), the bytes an element of it: counted per Linear (q, k, v
  // and gate, up each their own), with quantize_bytes_per_element then the forward's layout of
  // each distinct input alone. 0: both layouts counted per distinct input.
  double quantize_xt_bytes_per_element = 0;
  // Bytes a weight parameter moves per micro-batch for its quantizations (the forward's W and
  // the data gradient's W^T). 0: quantize_bytes_per_element (the calibrated recipes' count).
  double quantize_weight_bytes_per_param = 0;
  // Bytes a weight parameter moves once a step for them (an amax pass the step's casts share:
  // LlamaModel::weight_amax, kept until the optimizer changes W). 0: none apart.
  double quantize_weight_step_bytes_per_param = 0;
  double gemm_efficiency = 0.7;  // achievable fraction of the dense datasheet rate
  // GPU: the fraction of HBM bandwidth the recipe's casts achieve (their bytes above).
  double quantize_efficiency = 0.25;
  // GPU: whether gemm_efficiency and quantize_efficiency were measured (the H200 profiles of
  // bench/RESULTS.md, 2026-12-04, docs/plan.md) rather than assumed.
  bool calibrated = false;
};

// fp32 (cpu), bf16, fp8-delayed, fp8-current, fp8-block, mxfp8, nvfp4. UserError if unknown.
RecipeModel recipe_model(const std::string& name);
std::vector<std::string> recipe_names();
// Whether `gpu` runs the recipe: cpu emulates all; on GPUs in hardware (FP8 needs Hopper or
// later; MXFP8 and NVFP4 need Blackwell's block-scaled tensor cores; fp32 is planned as bf16).
bool recipe_supported(const std::string& name, const GpuSpec& gpu);
// Dense rate of the recipe's low-precision GEMMs on `gpu` (before efficiency).
double recipe_gemm_flops(const std::string& name, const GpuSpec& gpu);

}  // namespace mx::plan
