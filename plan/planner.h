// `mxtrain plan`: the memory and time models of one configuration, and the recommendation:
// the fastest configuration that fits, searched over micro-batch (powers of two that keep the
// per-rank batch micro_batch x grad_accum), activation checkpointing, sharding and recipe.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/gpus.h"
#include "plan/memory.h"
#include "plan/time.h"

namespace mx::plan {

struct Evaluation {
  PlanInput input;
  MemoryBreakdown memory;
  TimeBreakdown time;
  double capacity_bytes = 0;
  bool fits = false;
  bool engine_fits = false;  // GPUs: this build's CUDA engine (memory.engine) fits too
  // The bytes `fits` compares with the capacity: memory.total, or with input.engine_memory on
  // a GPU memory.engine.total().
  int64_t sized_bytes = 0;
};

// What one rank may hold: a GPU's memory, or on cpu MemAvailable / the node's processes.
double capacity_per_rank(const PlanInput& in, const GpuSpec& gpu);
Evaluation evaluate(const PlanInput& in, const GpuSpec& gpu);

struct Recommendation {
  Evaluation best;        // fits == false when nothing fits (then: the smallest configuration)
  bool found = false;
  std::vector<std::string> reasons;
  int64_t candidates = 0;
};

// recipes: the recipes to search (empty: every recipe the GPU supports).
Recommendation recommend(const PlanInput& in, const GpuSpec& gpu,
                         const std::vector<std::string>& recipes = {});

// The command's JSON object and its human table.
nlohmann::json plan_json(const Evaluation& given, const Recommendation& rec, const GpuSpec& gpu,
                         const std::vector<std::string>& notes);
std::string plan_table(const Evaluation& given, const Recommendation& rec, const GpuSpec& gpu,
                       const std::vector<std::string>& notes);

std::string gib(double bytes);  // "12.34 GiB"; below 1 GiB "512.000 MiB"

}  // namespace mx::plan
