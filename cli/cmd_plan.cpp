// mxtrain plan: what fits in memory and what will be fastest, before a job starts.
#include <cstdio>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "plan/planner.h"
#include "plan/recipe.h"
#include "train/config.h"

namespace mx::cli {

namespace {

constexpr int64_t kMaxPlanRanks = int64_t(1) << 20;

struct PlanArgs {
  std::string config, gpu, recipes, memory = "model";
  std::vector<std::string> sets;
  int64_t gpus = 0, nodes = 1;
  bool json = false;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    MX_REQUIRE(!item.empty(), "--recipes '", s, "' has an empty item");
    out.push_back(item);
  }
  // getline gives no item after a last ',': "bf16," was taken for "bf16" ("bf16,,x" refused)
  MX_REQUIRE(s.empty() || s.back() != ',', "--recipes '", s, "' has an empty item");
  return out;
}

int run_plan(const PlanArgs& a) {
  MX_REQUIRE(a.gpus >= 1, "--gpus must be at least 1 (got ", a.gpus, ")");
  MX_REQUIRE(a.nodes >= 1, "--nodes must be at least 1 (got ", a.nodes, ")");
  const plan::GpuSpec gpu = plan::find_gpu(a.gpu);
  if (gpu.is_cpu)
    MX_REQUIRE(a.gpus <= gpu.gpus_per_node, "--gpus (processes per node on the CPU) must be at "
               "most ", gpu.gpus_per_node, " (got ", a.gpus, ")");
  MX_REQUIRE(a.gpus <= gpu.gpus_per_node, "--gpus is per node: an ", gpu.instance, " has ",
             gpu.gpus_per_node, " ", gpu.name, " GPUs (got ", a.gpus, ")");
  // The planner's shard counts are ints (and no job has more ranks): nodes x gpus was narrowed
  // into a negative shard size, or planned 8e11 shards of a 119k-parameter model.
  MX_REQUIRE(a.nodes <= kMaxPlanRanks / a.gpus, "--nodes x --gpus must be at most ",
             kMaxPlanRanks, " ranks (got ", a.nodes, " x ", a.gpus, ")");
  // precision.recipe as train reads it (the loader rejects unknown names); the planner's
  // recipe models go by the same names.
  const RunConfig cfg = load_run_config(a.config, a.sets);
  std::string recipe = cfg.precision.recipe;
  std::vector<std::string> notes;
  plan::recipe_model(recipe);  // UserError for a recipe the planner has no model of
  if (!gpu.is_cpu && recipe == "fp32") {
    recipe = "bf16";
    notes.push_back("precision.recipe fp32 is the CPU engine's; on GPUs the plan uses bf16 "
                    "(fp32 master weights, bf16 compute)");
  }
  MX_REQUIRE(plan::recipe_supported(recipe, gpu), "precision.recipe '", recipe,
             "' does not run on ", gpu.name);
  MX_REQUIRE(cfg.init.from.empty(), "init.from: plan the model by its preset or HF fields "
             "(model.*), not from a weights directory");

  plan::PlanInput in;
  in.model = cfg.model;
  in.model_name = cfg.model_preset;
  in.micro_batch = cfg.train.micro_batch;
  in.seq_len = cfg.train.seq_len;
  in.grad_accum = cfg.train.grad_accum;
  in.checkpointing = parse_checkpointing(cfg.memory.activation_checkpointing);
  in.sharding = cfg.parallel.sharding;
  in.shard_group = cfg.parallel.shard_group;
  in.gather_dtype = cfg.parallel.gather_dtype;
  in.recipe = recipe;
  in.configured_recipe = cfg.precision.recipe;
  in.high_precision_first = cfg.precision.high_precision_first;
  in.high_precision_last = cfg.precision.high_precision_last;
  in.high_precision = cfg.precision.high_precision;
  in.activations = cfg.precision.activations;
  in.stats_every = cfg.precision.stats_every;
  in.fp8_attention = cfg.precision.fp8_attention;
  in.fp8_head = cfg.precision.fp8_head;
  in.fp8_head_dgrad = cfg.precision.fp8_head_dgrad == "fp8";
  in.eval = cfg.train.eval_every > 0;
  MX_REQUIRE(a.memory == "model" || a.memory == "engine",
             "--memory must be model or engine (got '", a.memory, "')");
  in.engine_memory = a.memory == "engine";
  in.gpus_per_node = a.gpus;
  in.nodes = a.nodes;
  plan::shard_count(in);  // UserError for a shard group that does not divide the world

  if (gpu.is_cpu) {
    notes.push_back("cpu: memory per process is the engine's own arena accounting, replayed "
                    "allocation by allocation (peak_mem_bytes of mxtrain train); with several "
                    "processes (mpirun -np N = --gpus N) FSDP's arenas are sized by the same "
                    "code as the engine's (parallel/fsdp_sizes.h), equal on every rank");
    if (recipe != "fp32")
      notes.push_back("cpu: precision.recipe '" + recipe + "' is emulated (its quantized "
                      "operand copies are in the replay)");
    notes.push_back("cpu throughput: GEMMs at the measured SGEMM rate x 0.9; a rough estimate");
    if (a.gpus > 1)
      notes.push_back(str("cpu: the ", a.gpus, " processes share this machine's available ",
                          "memory (", format_bytes(gpu.memory_bytes), "), so each fits in ",
                          format_bytes(gpu.memory_bytes / double(a.gpus))));
    if (in.engine_memory)
      notes.push_back("--memory engine: on cpu every figure is already the engine's own "
                      "allocation, so it changes nothing (it matters for GPUs)");
  } else {
    notes.push_back("GPU memory and time are MODELLED (docs/plan.md gives every formula and "
                    "constant): memory for an engine with bf16 activations and bf16 gathered "
                    "units, memory.engine what this build's CUDA engine allocates instead (its "
                    "arenas); time with the GEMM, attention, cast and memory-bound rates an "
                    "H200 measured (docs/plan.md, Calibration), taken as fractions of each "
                    "GPU's datasheet rates");
  }

  if (in.fp8_attention)
    notes.push_back(gpu.is_cpu
                        ? str("precision.fp8_attention: the CPU twin (fp32 attention plus FP8 "
                              "rounding of q, k, v, P, O and the gradients) at ",
                              plan::kCpuFp8AttentionSlowdown, "x the plain kernel's rate")
                        : str("precision.fp8_attention is MODELLED: cuDNN's fused FP8 SDPA at ",
                              plan::kFp8AttentionSpeedup, "x the bf16 attention's rate plus its "
                              "casts (not run on a GPU yet); its codes use the CUDA scratch "
                              "arena, in groups of sequences where the batch's do not fit"));
  if (in.fp8_head)
    notes.push_back(gpu.is_cpu
                        ? str("precision.fp8_head: the CPU twin (the head's fp32 GEMMs on FP8 "
                              "values) plus its rounding passes")
                        : str("precision.fp8_head is MODELLED: the head's ",
                              in.fp8_head_dgrad ? "three GEMMs" : "logits and weight-gradient "
                              "GEMMs (its data gradient's at the bf16 rate)",
                              " at the per-tensor FP8 rate plus the casts of W, h and the logits "
                              "gradient (not run on a GPU yet)"));
  const plan::Evaluation given = plan::evaluate(in, gpu);
  // FP8 attention runs a micro-batch in groups of sequences, but one sequence's codes (the
  // backward's q, o, do, dq and k, v, dk, dv, a byte each) must fit the CUDA scratch arena,
  // cuDNN's workspace beside them.
  if (!gpu.is_cpu && in.fp8_attention) {
    const int64_t codes = 4 * in.seq_len * (in.model.q_dim() + in.model.kv_dim());
    const int64_t arena = given.memory.engine.backend_scratch;
    if (codes > arena / 2)
      notes.push_back(str("precision.fp8_attention: one sequence's FP8 codes take ",
                          format_bytes(double(codes)), " of the CUDA scratch arena (",
                          format_bytes(double(arena)), ", MXTRAIN_CUDA_SCRATCH_MB), and "
                          "cuDNN's workspace (its dQ accumulator, fp32) about as much again: "
                          "where they do not fit the run stops at its first step with an "
                          "error; MXTRAIN_CUDA_SCRATCH_MB=",
                          (2 * codes + (int64_t(1) << 20) - 1) >> 20, " or more avoids it"));
  }
  if (!gpu.is_cpu && in.engine_memory)
    notes.push_back("--memory engine: fits and the recommendation are sized by what this "
                    "build's CUDA engine allocates (memory.engine), not by the model");
  if (!gpu.is_cpu && !in.engine_memory && given.fits && !given.engine_fits)
    notes.push_back(str("this build's CUDA engine would need ",
                        double(given.memory.engine.total()) / double(1 << 30),
                        " GiB per GPU for this configuration (capacity ",
                        given.capacity_bytes / double(1 << 30),
                        " GiB): it does not fit yet; a smaller train.micro_batch or "
                        "memory.activation_checkpointing = full lowers it, and --memory engine "
                        "recommends a configuration that fits it"));
  const plan::Recommendation rec = plan::recommend(in, gpu, split_list(a.recipes));
  if (a.json) {
    std::printf("%s\n", plan::plan_json(given, rec, gpu, notes).dump(2).c_str());
  } else {
    std::printf("%s", plan::plan_table(given, rec, gpu, notes).c_str());
  }
  return 0;
}

}  // namespace

void add_plan(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "plan", "predict per-GPU memory and speed of a config, and recommend the fastest "
              "micro-batch / checkpointing / sharding / recipe that fits");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("--config", a->config, "TOML config file (as for train)");
  cmd->add_option("--set", a->sets, "override: section.key=value (repeatable)");
  cmd->add_option("--gpu", a->gpu, "h100 | h200 | b200 | b300 | cpu (this machine)")->required();
  cmd->add_option("--gpus", a->gpus, "GPUs per node (processes for cpu)")->required();
  cmd->add_option("--nodes", a->nodes, "nodes (instances), default 1");
  cmd->add_option("--recipes", a->recipes,
                  "comma-separated recipes the recommendation may use (default: all the GPU runs)");
  cmd->add_option("--memory", a->memory,
                  "model | engine: on GPUs, size fits and the recommendation by the bf16-activation "
                  "model (default) or by what this build's CUDA engine allocates (memory.engine)");
  cmd->add_flag("--json", a->json, "one JSON object instead of the table");
  cmd->callback([&action, a] { action = [a] { return run_plan(*a); }; });
}

}  // namespace mx::cli
