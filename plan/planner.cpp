#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "plan/recipe.h"

namespace mx::plan {

std::string gib(double bytes) {
  char buf[48];
  if (bytes != 0 && bytes < double(int64_t(1) << 30))  // small CPU configs: not "0.00 GiB"
    std::snprintf(buf, sizeof buf, "%.3f MiB", bytes / double(1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(int64_t(1) << 30));
  return buf;
}

namespace {

std::string rate(double tok_s) {
  char buf[48];
  if (tok_s >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM tok/s", tok_s / 1e6);
  else if (tok_s >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk tok/s", tok_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f tok/s", tok_s);
  return buf;
}

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

std::string describe(const PlanInput& p) {
  return str("micro_batch ", p.micro_batch, ", checkpointing ", checkpointing_name(p.checkpointing),
             ", sharding ", p.sharding, ", recipe ", p.recipe);
}

const Checkpointing kPolicies[] = {Checkpointing::kNone, Checkpointing::kSelective,
                                   Checkpointing::kFull};

}  // namespace

double capacity_per_rank(const PlanInput& in, const GpuSpec& gpu) {
  // A GPU's memory is its rank's own; on cpu the processes of a node (--gpus) share the
  // machine's MemAvailable, so each may have its share (4 x 10 GiB "fit" in 21 GiB before).
  return gpu.is_cpu ? gpu.memory_bytes / double(std::max<int64_t>(1, in.gpus_per_node))
                    : gpu.memory_bytes;
}

Evaluation evaluate(const PlanInput& in, const GpuSpec& gpu) {
  Evaluation e;
  e.input = in;
  e.memory = plan_memory(in, gpu);
  e.time = plan_time(in, gpu);
  e.capacity_bytes = capacity_per_rank(in, gpu);
  e.engine_fits = gpu.is_cpu ? double(e.memory.total) <= e.capacity_bytes
                              : double(e.memory.engine.total()) <= e.capacity_bytes;
  e.sized_bytes = in.engine_memory && !gpu.is_cpu ? e.memory.engine.total() : e.memory.total;
  e.fits = double(e.sized_bytes) <= e.capacity_bytes;
  return e;
}

Recommendation recommend(const PlanInput& in, const GpuSpec& gpu,
                         const std::vector<std::string>& recipes_wanted) {
  Recommendation rec;
  // Recipes.
  std::vector<std::string> recipes;
  std::vector<std::string> unsupported;
  const std::vector<std::string> pool = recipes_wanted.empty() ? recipe_names() : recipes_wanted;
  for (auto& r : pool) {
    recipe_model(r);  // UserError for an unknown name
    if (recipe_supported(r, gpu)) recipes.push_back(r);
    else if (!recipes_wanted.empty() || r != "fp32") unsupported.push_back(r);
  }
  MX_REQUIRE(!recipes.empty(), "none of the recipes to search runs on ", gpu.name);
  // Sharding strategies: with one rank they are all the same; hybrid needs more than one node
  // (within one node it is `full`).
  std::vector<std::string> shardings;
  if (in.world_size() == 1) shardings = {in.sharding};
  else {
    shardings = {"full", "grad-op", "none"};
    if (in.nodes > 1) shardings.push_back("hybrid");
  }
  // Micro-batches: powers of two dividing the per-rank batch, so the global batch is kept.
  const int64_t per_rank = in.micro_batch * in.grad_accum;
  std::vector<int64_t> mbs;
  for (int64_t b = 1; b <= per_rank; b *= 2)
    if (per_rank % b == 0) mbs.push_back(b);
  if (mbs.back() != per_rank) mbs.push_back(per_rank);

  std::map<std::string, Evaluation> all;  // key: mb/policy/shard/recipe
  auto key = [](int64_t mb, Checkpointing p, const std::string& s, const std::string& r) {
    return str(mb, "/", checkpointing_name(p), "/", s, "/", r);
  };
  const Evaluation* best = nullptr;
  const Evaluation* smallest = nullptr;
  for (auto& r : recipes)
    for (auto& s : shardings)
      for (Checkpointing p : kPolicies)
        for (int64_t mb : mbs) {
          PlanInput c = in;
          c.recipe = r;
          c.configured_recipe.clear();  // taking the recommendation means running recipe r
          c.sharding = s;
          // Hybrid's candidate shards within a node unless the config names a group that
          // divides the ranks: a stray shard_group (train ignores it but under hybrid)
          // aborted the whole plan, and 0 (all ranks) would make it `full`.
          if (s == "hybrid" && (c.shard_group <= 0 || c.shard_group > in.world_size() ||
                                in.world_size() % c.shard_group != 0))
            c.shard_group = in.gpus_per_node;
          c.checkpointing = p;
          c.micro_batch = mb;
          c.grad_accum = per_rank / mb;
          auto [it, _] = all.emplace(key(mb, p, s, r), evaluate(c, gpu));
          const Evaluation& e = it->second;
          ++rec.candidates;
          if (!smallest || e.sized_bytes < smallest->sized_bytes) smallest = &e;
          if (!e.fits) continue;
          if (!best || e.time.tokens_per_s > best->time.tokens_per_s * (1 + 1e-9) ||
              (e.time.tokens_per_s >= best->time.tokens_per_s * (1 - 1e-9) &&
               e.sized_bytes < best->sized_bytes))
            best = &e;
        }

  auto& R = rec.reasons;
  const double cap = capacity_per_rank(in, gpu);
  if (!best) {
    rec.best = *smallest;
    rec.found = false;
    R.push_back(str("nothing fits on ", gpu.name, ": the smallest configuration (",
                    describe(smallest->input), ") needs ", gib(double(smallest->sized_bytes)),
                    " > ", gib(cap), " per device; add GPUs or nodes, or shorten train.seq_len"));
    return rec;
  }
  rec.best = *best;
  rec.found = true;
  const PlanInput& b = best->input;
  auto find = [&](int64_t mb, Checkpointing p, const std::string& s, const std::string& r)
      -> const Evaluation* {
    auto it = all.find(key(mb, p, s, r));
    return it == all.end() ? nullptr : &it->second;
  };

  // Activation checkpointing: every cheaper policy that was not chosen, and why.
  for (Checkpointing p : kPolicies) {
    if (p == b.checkpointing) break;
    const Evaluation* e = find(b.micro_batch, p, b.sharding, b.recipe);
    if (e && !e->fits)
      R.push_back(str("activation checkpointing '", checkpointing_name(b.checkpointing),
                      "' needed: '", checkpointing_name(p), "' needs ", gib(double(e->sized_bytes)),
                      " > ", gib(cap), " available"));
    else if (e)
      R.push_back(str("activation checkpointing '", checkpointing_name(b.checkpointing), "' (",
                      rate(best->time.tokens_per_s), ") is faster than '", checkpointing_name(p),
                      "' (", rate(e->time.tokens_per_s), ")"));
  }
  if (b.checkpointing == Checkpointing::kNone)
    R.push_back(str("activation checkpointing 'none': everything backward needs is kept (",
                    gib(double(in.engine_memory && !gpu.is_cpu ? best->memory.engine.activations
                                                               : best->memory.activations)),
                    " of activations), nothing is recomputed"));
  else if (b.checkpointing == Checkpointing::kFull)
    R.push_back("'full' recomputes each block's forward in backward: block GEMM FLOPs x 4/3");

  // Micro-batch.
  const int64_t per_rank_batch = b.micro_batch * b.grad_accum;
  if (b.micro_batch < per_rank_batch) {
    const Evaluation* up = find(b.micro_batch * 2, b.checkpointing, b.sharding, b.recipe);
    if (up && !up->fits)
      R.push_back(str("micro_batch ", b.micro_batch, ": micro_batch ", b.micro_batch * 2,
                      " needs ", gib(double(up->sized_bytes)), " > ", gib(cap)));
    else if (up)
      R.push_back(str("micro_batch ", b.micro_batch, " (", rate(best->time.tokens_per_s),
                      ") is at least as fast as micro_batch ", b.micro_batch * 2, " (",
                      rate(up->time.tokens_per_s), ")"));
  } else {
    R.push_back(str("micro_batch ", b.micro_batch, " = the whole per-rank batch (",
                    "train.micro_batch x train.grad_accum = ", per_rank_batch,
                    " sequences, kept so the global batch does not change)"));
  }

  // Sharding.
  if (shardings.size() > 1) {
    for (auto& s : shardings) {
      if (s == b.sharding) continue;
      const Evaluation* other = nullptr;
      for (Checkpointing p : kPolicies)
        for (int64_t mb : mbs) {
          const Evaluation* e = find(mb, p, s, b.recipe);
          if (e && e->fits && (!other || e->time.tokens_per_s > other->time.tokens_per_s))
            other = e;
        }
      if (!other) {
        const Evaluation* e = find(1, Checkpointing::kFull, s, b.recipe);
        R.push_back(str("sharding '", s, "' does not fit: even micro_batch 1 with full ",
                        "checkpointing needs ", gib(double(e ? e->sized_bytes : 0)), " > ",
                        gib(cap), " (", s == "none" ? "replicated" : "sharded", " state ",
                        gib(double(e ? e->memory.master_weights + e->memory.gradients +
                                           e->memory.adam_m + e->memory.adam_v
                                     : 0)),
                        ")"));
      } else {
        R.push_back(str("sharding '", b.sharding, "' (", rate(best->time.tokens_per_s),
                        ", exposed communication ", best->time.exposed_comm_s, " s/step) vs '", s,
                        "' at its best (", rate(other->time.tokens_per_s), ", ",
                        describe(other->input), ")"));
      }
    }
  } else {
    R.push_back(str("one rank: sharding has nothing to divide (all strategies are the same)"));
  }

  // Recipe.
  if (recipes.size() > 1) {
    std::string others;
    for (auto& r : recipes) {
      if (r == b.recipe) continue;
      const Evaluation* other = nullptr;
      for (auto& s : shardings)
        for (Checkpointing p : kPolicies)
          for (int64_t mb : mbs) {
            const Evaluation* e = find(mb, p, s, r);
            if (e && e->fits && (!other || e->time.tokens_per_s > other->time.tokens_per_s))
              other = e;
          }
      others += str(others.empty() ? "" : ", ", r, " ",
                    other ? rate(other->time.tokens_per_s) : std::string("does not fit"));
    }
    R.push_back(str("recipe '", b.recipe, "' is the fastest that fits: ",
                    rate(best->time.tokens_per_s), " vs ", others));
  }
  if (gpu.is_cpu && b.recipe != "fp32")
    R.push_back(str("recipe '", b.recipe, "' on cpu is emulated (quantize, dequantize, fp32 ",
                    "GEMM): the same numerics as on GPUs, slower than fp32 here"));
  if (!gpu.is_cpu && recipe_model(b.recipe).modelled && b.recipe != "bf16") {
    const RecipeModel rm = recipe_model(b.recipe);
    R.push_back(str("recipe '", b.recipe, "' is modelled, ",
                    rm.calibrated ? "calibrated on an H200's profiles (docs/plan.md, Calibration)"
                                  : "not calibrated (it has not run on a GPU yet)",
                    ": GEMMs at ", recipe_gemm_flops(b.recipe, gpu) / 1e12, " TFLOPS dense x ",
                    rm.gemm_efficiency, " efficiency, casts at ", rm.quantize_efficiency,
                    " of HBM bandwidth; it changes numerics, check convergence (mxtrain numerics) ",
                    "before adopting it"));
  }
  for (auto& r : unsupported)
    R.push_back(str("recipe '", r, "' not searched: not supported on ", gpu.name));
  R.push_back(str("step ", best->time.step_s, " s: GEMM ", best->time.gemm_s, " s, attention ",
                  best->time.attention_s, " s, memory-bound ", best->time.memory_bound_s,
                  " s, exposed communication ", best->time.exposed_comm_s, " s, optimizer ",
                  best->time.optimizer_s, " s"));
  return rec;
}

namespace {

nlohmann::json breakdown_json(const MemoryBreakdown& m) {
  nlohmann::json j = {{"master_weights", m.master_weights},
                      {"gradients", m.gradients},
                      {"adam_m", m.adam_m},
                      {"adam_v", m.adam_v},
                      {"compute_weights", m.compute_weights},
                      {"unsharded_gradient", m.unsharded_gradient},
                      {"reduce_scatter", m.reduce_scatter},
                      {"quantized_weights", m.quantized_weights},
                      {"recipe_state", m.recipe_state},
                      {"activations", m.activations},
                      {"batch_tokens", m.batch_tokens},
                      {"library_workspace", m.library_workspace},
                      {"nccl_buffers", m.nccl_buffers},
                      {"cuda_context", m.cuda_context},
                      {"fragmentation", m.fragmentation}};
  return j;
}

nlohmann::json memory_json(const Evaluation& e) {
  const MemoryBreakdown& m = e.memory;
  nlohmann::json j = {{"total_bytes", m.total},
          {"total_bytes_max_rank", m.total_max_rank},
          {"capacity_bytes", int64_t(e.capacity_bytes)},
          {"breakdown", breakdown_json(m)},
          {"activations_saved_at_peak", m.activations_saved},
          {"activations_scratch_at_peak", m.activations_scratch},
          {"activation_peak_at", m.activation_peak_at},
          {"shards", m.shards},
          {"exact", m.exact}};
  if (m.engine.total() > 0)  // GPUs: what this build's CUDA engine allocates (memory.h)
    j["engine"] = {{"total_bytes", m.engine.total()},
                   {"fits", e.engine_fits},
                   {"arena_bytes", m.engine.arenas()},
                   {"fsdp_bytes", m.engine.fsdp},
                   {"activation_arena_bytes", m.engine.activations},
                   {"amax_slot_bytes", m.engine.amax_slots},
                   {"backend_scratch_bytes", m.engine.backend_scratch},
                   {"allowance_bytes", m.engine.allowances}};
  if (m.exact)  // the CPU engine's FSDP arenas, as parallel/fsdp_sizes.h sizes them
    j["fsdp"] = {{"shard_size", m.fsdp.shard_size},
                 {"local_numel", m.fsdp.local_numel},
                 {"slot_numel", m.fsdp.max_padded},
                 {"block_slot_numel", m.fsdp.block_padded},
                 {"param_slots", m.fsdp.param_slots},
                 {"grad_slots", m.fsdp.grad_slots},
                 {"reduce_scatter_numel", m.fsdp.max_shard}};
  return j;
}

nlohmann::json time_json(const TimeBreakdown& t) {
  return {{"step_s", t.step_s},
          {"gemm_s", t.gemm_s},
          {"attention_s", t.attention_s},
          {"memory_bound_s", t.memory_bound_s},
          {"comm_s", t.comm_s},
          {"exposed_comm_s", t.exposed_comm_s},
          {"optimizer_s", t.optimizer_s},
          {"gemm_flops_per_step", t.gemm_flops},
          {"attention_flops_per_step", t.attention_flops},
          {"fp8_attention_blocks", t.fp8_attention_blocks},
          {"fp8_head", t.fp8_head},
          {"tokens_per_step", t.tokens_per_step},
          {"model_flops_per_token", t.model_flops_per_token},
          {"gemm_flops_per_s_assumed", t.gemm_rate}};
}

nlohmann::json config_json(const PlanInput& p, const GpuSpec& gpu) {
  return {{"micro_batch", p.micro_batch},
          {"seq_len", p.seq_len},
          {"grad_accum", p.grad_accum},
          {"activation_checkpointing", checkpointing_name(p.checkpointing)},
          {"sharding", p.sharding},
          {"shard_group", p.shard_group},
          {"recipe", p.recipe},
          {"fp8_attention", p.fp8_attention},
          {"fp8_head", p.fp8_head},
          {"fp8_head_dgrad", p.fp8_head_dgrad ? "fp8" : "bf16"},
          {"high_precision", plan_high_precision_bf16(p) ? "bf16" : "fp32"},
          // the engine's (memory.engine on GPUs: run.device = cuda)
          {"activations",
           plan_bf16_activations(p, p.engine_recipe(), gpu.is_cpu ? "cpu" : "cuda") ? "bf16"
                                                                                   : "fp32"},
          // GPU recipes are modelled; on cpu the engine runs (emulates) every recipe
          {"recipe_modelled", !gpu.is_cpu && recipe_model(p.recipe).modelled},
          // its GPU constants measured (docs/plan.md, Calibration)
          {"recipe_calibrated", !gpu.is_cpu && recipe_model(p.recipe).calibrated}};
}

}  // namespace

nlohmann::json plan_json(const Evaluation& given, const Recommendation& rec, const GpuSpec& gpu,
                         const std::vector<std::string>& notes) {
  const PlanInput& in = given.input;
  nlohmann::json j;
  j["gpu"] = {{"name", gpu.name},
              {"description", gpu.description},
              {"instance", gpu.instance},
              {"memory_bytes", gpu.memory_bytes},
              {"bf16_flops", gpu.bf16_flops},
              {"fp8_flops", gpu.fp8_flops},
              {"fp4_flops", gpu.fp4_flops},
              {"hbm_bytes_per_s", gpu.hbm_bytes_per_s},
              {"nvlink_bytes_per_s", gpu.nvlink_bytes_per_s},
              {"efa_bytes_per_s", gpu.efa_bytes_per_s}};
  j["gpus_per_node"] = in.gpus_per_node;
  j["nodes"] = in.nodes;
  j["world_size"] = in.world_size();
  j["model"] = {{"name", in.model_name},
                {"params", in.model.param_count()},
                {"hidden_size", in.model.hidden_size},
                {"num_hidden_layers", in.model.num_hidden_layers},
                {"vocab_size", in.model.vocab_size}};
  j["config"] = config_json(in, gpu);
  j["fits"] = given.fits;
  // What `fits` and the recommendation were sized by (plan --memory).
  j["memory_basis"] = gpu.is_cpu ? "engine" : in.engine_memory ? "engine" : "model";
  j["memory"] = memory_json(given);
  j["time"] = time_json(given.time);
  j["tokens_per_s"] = given.time.tokens_per_s;
  j["tokens_per_s_per_gpu"] = given.time.tokens_per_s_per_gpu;
  j["mfu"] = given.time.mfu;
  j["mfu_bf16"] = given.time.mfu_bf16;
  nlohmann::json r = config_json(rec.best.input, gpu);
  r["found"] = rec.found;
  r["fits"] = rec.best.fits;
  r["memory_total_bytes"] = rec.best.sized_bytes;
  r["tokens_per_s"] = rec.best.time.tokens_per_s;
  r["mfu"] = rec.best.time.mfu;
  r["mfu_bf16"] = rec.best.time.mfu_bf16;
  r["step_s"] = rec.best.time.step_s;
  r["candidates"] = rec.candidates;
  r["reasons"] = rec.reasons;
  r["memory"] = memory_json(rec.best);
  j["recommendation"] = r;
  j["notes"] = notes;
  return j;
}

std::string plan_table(const Evaluation& given, const Recommendation& rec, const GpuSpec& gpu,
                       const std::vector<std::string>& notes) {
  const PlanInput& in = given.input;
  std::string out;
  char line[256];
  // (format_count: 0.000119104B said the tiny preset's 119.1k)
  out += str("mxtrain plan: ", in.model_name, " (", format_count(double(in.model.param_count())),
             " parameters) on ", in.nodes, " x ", in.gpus_per_node, " ", gpu.name, " (",
             gpu.description, gpu.instance.empty() ? "" : ", " + gpu.instance, ")\n");
  out += str("config: ", describe(in), ", seq_len ", in.seq_len, ", grad_accum ", in.grad_accum,
             ", shards ", given.memory.shards,
             plan_bf16_activations(in, in.engine_recipe(), gpu.is_cpu ? "cpu" : "cuda")
                 ? ", bf16 activations" : "",
             "\n\n");
  // Small (CPU) configurations in MiB, so the table does not read 0.00 GiB everywhere.
  const bool mib = given.memory.total < (int64_t(1) << 30);
  auto amount = [&](double bytes) {
    if (!mib) return gib(bytes);
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.3f MiB", bytes / double(1 << 20));
    return std::string(buf);
  };
  auto row = [&](const char* name, int64_t bytes) {
    if (bytes == 0) return;
    std::snprintf(line, sizeof line, "  %-22s %14s\n", name, amount(double(bytes)).c_str());
    out += line;
  };
  const MemoryBreakdown& m = given.memory;
  out += str("memory per ", gpu.is_cpu ? "process" : "GPU",
             m.exact ? " (the CPU engine's arenas, replayed: exact)" : " (modelled)", ":\n");
  row("master weights fp32", m.master_weights);
  row("gradients fp32", m.gradients);
  row("adam m", m.adam_m);
  row("adam v", m.adam_v);
  if (gpu.is_cpu) {
    row("FSDP gathered weights", m.compute_weights);
    row("FSDP unit gradients", m.unsharded_gradient);
    row("FSDP reduce-scatter", m.reduce_scatter);
  } else {
    row("compute weights bf16", m.compute_weights);
    row("unsharded gradient", m.unsharded_gradient);
  }
  row("quantized weights", m.quantized_weights);
  row("recipe state", m.recipe_state);
  row("activations (peak)", m.activations);
  row("batch tokens", m.batch_tokens);
  row("cuBLASLt workspace", m.library_workspace);
  row("NCCL buffers", m.nccl_buffers);
  row("CUDA context", m.cuda_context);
  row("fragmentation", m.fragmentation);
  std::snprintf(line, sizeof line, "  %-22s %14s of %s  -> %s\n", "total",
                amount(double(m.total)).c_str(), gib(given.capacity_bytes).c_str(),
                given.fits ? "fits" : "DOES NOT FIT");
  out += line;
  if (m.engine.total() > 0)
    out += str("  this build's CUDA engine (",
               plan_bf16_activations(in, in.engine_recipe(), "cuda") ? "bf16" : "fp32",
               " kept activations, fp32 FSDP slots): ",
               amount(double(m.engine.total())), " of ", gib(given.capacity_bytes), "  -> ",
               given.engine_fits ? "fits" : "DOES NOT FIT", "\n");
  out += str("  activation peak at ", m.activation_peak_at, " (saved ",
             amount(double(m.activations_saved)), ", scratch ",
             amount(double(m.activations_scratch)), ")\n");
  if (gpu.is_cpu && in.world_size() > 1)
    out += str("  every rank the same (FSDP shards padded to equal length); ",
               m.fsdp.param_slots, " weight slots + ", m.fsdp.grad_slots, " gradient slots",
               in.sharding == "grad-op" ? " (weight slots: one per unit, its size)" : "",
               ": largest unit ", m.fsdp.max_padded, " floats, block ", m.fsdp.block_padded,
               " floats\n");
  out += "\n";
  const TimeBreakdown& t = given.time;
  std::snprintf(line, sizeof line,
                "time per step (modelled): %.4g s = GEMM %.4g + attention %.4g + memory-bound %.4g"
                " + exposed comm %.4g (of %.4g) + optimizer %.4g\n",
                t.step_s, t.gemm_s, t.attention_s, t.memory_bound_s, t.exposed_comm_s, t.comm_s,
                t.optimizer_s);
  out += line;
  if (t.fp8_attention_blocks > 0)
    out += str("  attention in FP8 (precision.fp8_attention) in ", t.fp8_attention_blocks, " of ",
               in.model.num_hidden_layers, " blocks", gpu.is_cpu ? " (the CPU twin)" : "", "\n");
  if (t.fp8_head)
    out += str("  head GEMMs in FP8 (precision.fp8_head)",
               in.fp8_head_dgrad ? "" : ", its data gradient in bf16",
               gpu.is_cpu ? " (the CPU twin)" : "", "\n");
  out += str("throughput: ", rate(t.tokens_per_s), " (", rate(t.tokens_per_s_per_gpu),
             " per device), MFU ", pct(t.mfu), " (vs bf16 peak ", pct(t.mfu_bf16), ")\n\n");
  const PlanInput& b = rec.best.input;
  out += str("recommendation", rec.found ? "" : " (NOTHING FITS)", ": micro_batch ", b.micro_batch,
             ", grad_accum ", b.grad_accum, ", seq_len ", b.seq_len, ", activation_checkpointing ",
             checkpointing_name(b.checkpointing), ", sharding ", b.sharding, ", recipe ", b.recipe,
             "\n  ", gib(double(rec.best.sized_bytes)), " per device, ", rate(rec.best.time.tokens_per_s),
             ", MFU ", pct(rec.best.time.mfu), "\n");
  for (auto& r : rec.reasons) out += "  - " + r + "\n";
  if (!notes.empty()) {
    out += "notes:\n";
    for (auto& n : notes) out += "  - " + n + "\n";
  }
  return out;
}

}  // namespace mx::plan
