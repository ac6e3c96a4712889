#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <thread>
#include <tuple>
#include <filesystem>
#include <optional>
#include <vector>

#include "backend/sgemm_rate.h"
#include "checkpoint/checkpointer.h"
#include "core/crc32c.h"
#include "checkpoint/sharded.h"
#include "checkpoint/storage.h"
#include "core/error.h"
#include "core/fnv1a.h"
#include "core/log.h"
#include "core/output_dirs.h"
#include "core/stop.h"
#include "data/byte_tokenizer.h"
#include "data/data_split.h"
#include "data/window_sampler.h"
#include "data/token_dataset.h"
#include "model/generate.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"
#include "parallel/communicator.h"
#include "parallel/device_communicator.h"
#include "parallel/fsdp.h"
#include "plan/gpus.h"
#include "train/engine.h"
#include "train/metrics.h"
#include "train/run_lock.h"
#include "train/schedule.h"
#include "train/watchdog.h"

namespace mx {

namespace {

namespace fs = std::filesystem;

// A checkpoint root inside a committed step or a writer's hidden step directory: the run's
// steps would change the checkpoint they sit in and be deleted with it (retention pruning that
// step, a later start clearing what stopped writers left). Before anything is cleared there.
void refuse_checkpoint_root_inside_a_step(const RunConfig& cfg) {
  auto refuse = [](const std::string& key, const std::string& root, const std::string& step) {
    MX_REQUIRE(step.empty(), key, " ", root, " lies inside the checkpoint step ", step,
               ": its steps would change that checkpoint and be deleted with it (choose a ",
               "directory outside every step_NNNNNNNN)");
  };
  refuse("checkpoint.dir", cfg.checkpoint_dir(), enclosing_step_dir(cfg.checkpoint_dir()));
  const std::string& uri = cfg.checkpoint.s3_uri;
  if (uri.rfind("s3://", 0) != 0) return;
  std::string prefix;
  for (size_t b = 5, e; b < uri.size(); b = e + 1) {
    e = std::min(uri.find('/', b), uri.size());
    const std::string name = uri.substr(b, e - b);
    prefix = uri.substr(0, e);
    if (b > 5 && is_step_dir_name(name)) refuse("checkpoint.s3_uri", uri, prefix);
  }
}

// The local checkpoint directory, created now and written to once (a hidden directory made and
// removed): a path under a file, a read-only mount, /proc or a dangling link would otherwise
// fail only at the first save, after the training it was to keep. Each rank probes (every
// writer writes its own shard there), and every rank must see the same directory: one that each
// node has its own copy of committed steps without the other nodes' files.
void probe_checkpoint_dir(const std::string& dir, Communicator& world) {
  const int rank = world.rank();
  std::error_code ec;
  MX_REQUIRE(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "checkpoint directory ", dir,
             " exists and is not a directory");
  MX_REQUIRE(!(fs::is_symlink(fs::symlink_status(dir, ec)) && !fs::exists(dir, ec)),
             "checkpoint directory ", dir, " is a symbolic link to ",
             fs::read_symlink(dir, ec).string(), ", which does not exist");
  create_output_dirs(dir, "cannot create checkpoint directory");
  const fs::path probe = fs::path(dir) / str(".probe-", rank, "-", ::getpid());
  fs::create_directory(probe, ec);
  if (ec)
    throw_path_error(ec.value(),
                     str("cannot write to checkpoint directory ", dir, ": ", ec.message()));
  fs::remove(probe, ec);
  if (world.size() == 1) return;
  int64_t token = rank == 0 ? int64_t(::getpid()) : 0;
  world.broadcast(&token, 1, CommDtype::kI64, 0);
  const fs::path shared = fs::path(dir) / str(".probe-shared-", token);
  if (rank == 0) fs::create_directory(shared, ec);
  world.barrier();
  const int64_t blind = world.all_reduce(int64_t(fs::is_directory(shared, ec) ? -1 : rank),
                                         ReduceOp::kMax);
  world.barrier();
  if (rank == 0) fs::remove(shared, ec);
  MX_REQUIRE(blind < 0, "checkpoint directory ", dir, " is not the same directory on every rank: ",
             "rank ", blind, " does not see what rank 0 writes there (every rank writes its own ",
             "file into each step: use a shared file system, or checkpoint.s3_uri)");
}

// Whether two paths name the same directory (after resolving what exists of them: links, ..).
bool same_dir(const std::string& a, const std::string& b) {
  return path_place(a, b) == PathPlace::kSame;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The files of a data path, listed once at start-up for every check and for opening it (a
// directory may hold 100k shards); nullopt for no path, random data, or a path that cannot be
// listed (TokenDataset::open then says why, after the write-path check).
std::optional<std::vector<std::string>> list_data(const std::string& path) {
  if (path.empty() || path == "<random>") return std::nullopt;
  try {
    return data_files(path);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The metrics file is opened for writing (a new file on a fresh run): it must not be one of the
// run's inputs (the data file, which it would truncate under the reader) or a file of a
// checkpoint, nor may the run write anything where the data paths read.
void check_metrics_path(const RunConfig& cfg, const std::string& data_path,
                        const std::optional<std::vector<std::string>>& data_listed,
                        const std::optional<std::vector<std::string>>& val_listed) {
  const std::string m = cfg.metrics_path();
  std::error_code ec;
  MX_REQUIRE(!fs::is_directory(m, ec), "run.metrics ", m, " is a directory, not a file");
  auto refuse_if_same = [&](const fs::path& in, const std::string& what) {
    MX_REQUIRE(!fs::equivalent(m, in, ec), "run.metrics ", m, " is ", what,
               ": the metrics would overwrite it");
  };
  // A data directory or pattern reads every file it covers: metrics or checkpoints written
  // there would be read as data by the next run (or overwrite a shard now).
  // (A pattern such as d/* also matches the directories a run makes: the next start failed.)
  for (const auto& [key, path, listed] :
       {std::tuple<const char*, std::string, const std::optional<std::vector<std::string>>*>{
            "data.path", data_path, &data_listed},
        {"data.val_path", cfg.data.val_path, &val_listed}}) {
    if (path.empty() || path == "<random>") continue;
    const DataFileIds reads(listed->value_or(std::vector<std::string>{}));
    auto covers = [&](const std::string& p) {
      return data_path_covers(path, p) || reads.contains(p);
    };
    MX_REQUIRE(!covers(m), "run.metrics ", m, " is one of the files ", key, " ",
               path, " reads: the metrics would overwrite it or be read as data");
    // Each path the run writes, and every directory above it that it would create.
    const std::string ckpt = cfg.checkpoint_dir();
    std::vector<std::string> made;
    for (const std::string& w : {cfg.out_dir(), ckpt + "/step_00000000/manifest.json", m})
      for (fs::path q = fs::absolute(w, ec).lexically_normal(); !q.empty();
           q = q.parent_path()) {
        made.push_back(q.string());
        if (fs::exists(q, ec) || q == q.root_path()) break;
      }
    for (const std::string& w : made)
      MX_REQUIRE(!covers(w), "the run would write ", w, ", where ", key, " ", path, " reads ",
                 "data, and it would be read as data (checkpoint.dir ", ckpt, ", run.out_dir ",
                 cfg.out_dir(), ", run.metrics ", m, ")");
  }
  if (!cfg.config_file.empty()) refuse_if_same(cfg.config_file, "the --config file");
  if (!cfg.init.from.empty() && fs::is_directory(cfg.init.from, ec))
    for (const auto& e : fs::directory_iterator(cfg.init.from, ec))
      refuse_if_same(e.path(), "a file of init.from's model");
  // (where it leads too: a link to a step's state.json had the metrics written into it)
  for (const fs::path& p : {fs::absolute(m, ec), fs::weakly_canonical(fs::absolute(m, ec), ec)}) {
    const std::string step = enclosing_step_dir(p.parent_path().string());
    MX_REQUIRE(step.empty(), "run.metrics ", m, " lies inside the checkpoint ", step,
               p == fs::absolute(m, ec) ? "" : str(" (it leads to ", p.string(), ")"),
               ": the metrics would change its files");
  }
}

std::atomic<int>& g_stop_signal = g_stop_request;  // (core/stop.h: start-up work polls it)
// SIGUSR1 is a SIGTERM passed on by a launcher: Open MPI's mpirun hands SIGUSR1 to every rank
// at once, while a SIGTERM sent to mpirun reaches the ranks only to be followed by SIGKILL one
// second later (odls_base_sigkill_timeout), too soon for a checkpoint (docs/checkpoints.md).
// A second Ctrl-C (SIGINT after SIGINT) quits at once, without the stop checkpoint: a stop is
// honoured at a step boundary, which a long start-up (an id check of terabytes, a slow S3
// listing) reaches only minutes later. The first says so (write: async-signal-safe).
void on_signal(int sig) {
  if (sig == SIGINT && g_stop_signal.load() == SIGINT) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  if (sig == SIGINT && g_stop_signal.load() == 0) {
    static const char msg[] = "\nmxtrain: stopping at the next step boundary, with a checkpoint "
                              "(Ctrl-C again to quit at once, without one)\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
  }
  if (sig != SIGINT) g_sigterm_count.fetch_add(1);
  g_stop_signal.store(sig == SIGUSR1 ? SIGTERM : sig);
}

// The highest rank whose `value` differs from rank 0's, or -1 when every rank has rank 0's:
// for what each rank reads from its own view of a path (data, init.from, a resume location),
// which a node-local copy makes differ while the config text is the same everywhere.
int64_t rank_differing_from_root(Communicator& world, uint64_t value) {
  if (world.size() == 1) return -1;
  const int64_t mine = std::bit_cast<int64_t>(value);
  int64_t root = mine;
  world.broadcast(&root, 1, CommDtype::kI64, 0);
  return world.all_reduce(int64_t(mine != root ? world.rank() : -1), ReduceOp::kMax);
}

// Every rank must run with the same settings. Ranks that differ (a stale config file on one
// node, a --set given to one rank) hang in the first collective whose sizes differ, or fail deep
// inside MPI ("MPI_ERR_TRUNCATE"), or train silently on different data. So rank 0's hash of
// each source of the config (the file's content, each --set, in order) goes to every rank,
// which names the first of its own that differs.
void require_same_config(Communicator& world, const RunConfig& cfg) {
  if (world.size() == 1) return;
  constexpr size_t kMaxSources = 256;
  // The first kMaxSources one by one (a difference is named), any after them as one hash of
  // their hashes (a difference there was not compared at all: a rank with a different 257th
  // --set trained on, then hung).
  const auto& src = cfg.sources;
  const size_t n = std::min(src.size(), kMaxSources);
  std::vector<int64_t> mine(kMaxSources + 2, 0);
  mine[0] = int64_t(src.size());
  // content, not the path
  for (size_t i = 0; i < n; ++i) mine[i + 1] = int64_t(fnv1a64(src[i].second));
  std::string rest;
  for (size_t i = n; i < src.size(); ++i) rest += std::to_string(fnv1a64(src[i].second)) + ",";
  mine[kMaxSources + 1] = int64_t(fnv1a64(rest));
  std::vector<int64_t> root = mine;
  world.broadcast(std::span<int64_t>(root), 0);
  if (root == mine) return;
  for (size_t i = 0; i < n; ++i)
    MX_REQUIRE(i < size_t(root[0]) && root[i + 1] == mine[i + 1], "this process's ",
               src[i].first, " differs from rank 0's (every process of a job must be started "
               "with the same config file and --set flags)");
  MX_REQUIRE(root[0] != mine[0], "this process's --set flags after the first ", kMaxSources,
             " config sources differ from rank 0's (every process of a job must be started "
             "with the same config file and --set flags)");
  throw UserError(str("rank 0 was started with ", root[0], " config sources (config file and "
                      "--set flags), this process with ", src.size(), ": every process of a job "
                      "must be started with the same ones"));
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The model the run trains: from init.from's config.json when given, else the config's.
ModelConfig resolve_model(const RunConfig& cfg) {
  if (cfg.init.from.empty()) return cfg.model;
  MX_REQUIRE(is_hf_dir(cfg.init.from), "init.from: ", cfg.init.from,
             " is not a Hugging Face model directory (no config.json)");
  return read_hf_config(cfg.init.from + "/config.json");
}

}  // namespace

void install_stop_signal_handlers() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGUSR1, on_signal);
}

int run_training(const RunConfig& cfg, const std::function<void(const std::string&)>& on_hang) {
  if (cfg.run.threads > 0) omp_set_num_threads(int(cfg.run.threads));
  // From the start: a stop requested during start-up (MPI_Init, reading a large checkpoint) is
  // honoured at the first step boundary, with a checkpoint, instead of killing the process
  install_stop_signal_handlers();
  Communicator& world = world_communicator();
  const int rank = world.rank(), W = world.size();
  require_same_config(world, cfg);
  const bool lead = rank == 0;  // rank 0 logs, writes metrics and checkpoints
  if (!lead) set_log_level(LogLevel::kQuiet);
  const auto& tc = cfg.train;
  const int64_t B = tc.micro_batch, T = tc.seq_len;
  // config.json (checkpoints, export-hf) states the context the model was trained at: at least
  // seq_len (a preset's 1024 stayed after training at 2048)
  const ModelConfig model_cfg = [&] {
    ModelConfig m = resolve_model(cfg);
    m.max_position_embeddings = std::max(m.max_position_embeddings, T);
    return m;
  }();
  if (!cfg.init.from.empty()) {
    // init.from is read by every rank from its own view of the path: another model on one
    // node failed deep inside MPI (MPI_ERR_TRUNCATE), the same shape trained a stitched model
    const int64_t other =
        rank_differing_from_root(world, fnv1a64(hf_config_text(model_cfg, "float32")));
    MX_REQUIRE(other < 0, "init.from ", cfg.init.from, " is not the same model on every rank: ",
               "rank ", other, " reads another config.json than rank 0 (every rank must read ",
               "the same files: a shared file system, or identical copies)");
    // the weight files against config.json, before memory is planned by it
    check_hf_weights(cfg.init.from, ParamLayout(model_cfg));
  }

  // Data first: a bad data file should fail before any memory is committed.
  // data.format = random reads no file: it says so, whatever data.path holds
  const std::string data_path = parse_token_format(cfg.data.format) == TokenFormat::kRandom
                                    ? "<random>"  // as TokenDataset names it
                                    : cfg.data.path.empty() ? MXTRAIN_DEFAULT_CORPUS
                                                            : cfg.data.path;
  std::optional<std::vector<std::string>> data_listed = list_data(data_path);
  std::optional<std::vector<std::string>> val_listed = list_data(cfg.data.val_path);
  // Every rank: each writes its own checkpoint files, and may see its own working directory.
  check_metrics_path(cfg, data_path, data_listed, val_listed);
  refuse_checkpoint_root_inside_a_step(cfg);
  TokenFormat format = parse_token_format(cfg.data.format);
  if (cfg.data.path.empty() && format != TokenFormat::kRandom) {
    MX_REQUIRE(std::filesystem::exists(data_path), "data.path is not set and the bundled corpus ",
               data_path, " is missing (run scripts/setup.sh, or set data.path)");
  }
  auto open_data = [&](const std::string& path, std::optional<std::vector<std::string>>& listed) {
    return listed ? TokenDataset::open_listed(path, std::move(*listed), format,
                                              model_cfg.vocab_size)
                  : TokenDataset::open(path, format, model_cfg.vocab_size);
  };
  // A stop during start-up (the data's id scan takes minutes for terabytes of shards) ends the
  // run here, before its first step: nothing trained, nothing to checkpoint. Every rank agrees
  // (the one collective each calls at this point), whichever ranks the signal reached.
  // The stop signal as the ranks agree on it (the highest any of them took; 0: none), a
  // collective: every rank calls it at the same point.
  auto agreed_stop = [&]() -> int64_t {
    const int64_t mine = g_stop_signal.load();
    return W > 1 ? world.all_reduce(mine, ReduceOp::kMax) : mine;
  };
  auto stopped_in_start_up = [&](const char* during) -> int {
    const int64_t sig = agreed_stop();
    if (!sig) return 0;
    info("stopped by signal ", sig, " during start-up (", during, "), before the first step: ",
         "nothing trained, no checkpoint written");
    return sig == SIGINT ? 130 : 143;
  };
  auto open_or_stop = [&](const std::string& path,
                          std::optional<std::vector<std::string>>& listed) {
    std::optional<TokenDataset> d;
    try {
      d.emplace(open_data(path, listed));
    } catch (const StopRequested&) {  // (the agreement comes next)
    }
    return d;
  };
  std::optional<TokenDataset> opened = open_or_stop(data_path, data_listed);
  if (const int rc = stopped_in_start_up("checking data.path")) return rc;
  TokenDataset data = std::move(*opened);
  opened.reset();
  // Every rank must read the same data: a node with another copy of the file trained on
  // silently (other windows). The sizes first, then a sample of the tokens against rank 0's
  // (the same size is not the same data: another version of the dataset), naming the highest
  // rank that differs.
  auto require_same_on_every_rank = [&](const TokenDataset& d, const char* key) {
    if (W == 1) return;
    const int64_t most = world.all_reduce(d.size(), ReduceOp::kMax);
    const int64_t least = -world.all_reduce(-d.size(), ReduceOp::kMax);
    MX_REQUIRE(most == least, key, " ", d.path(), " is not the same data on every rank: it ",
               "holds between ", least, " and ", most, " tokens across the ranks (every rank ",
               "must read the same files)");
    const int64_t other = rank_differing_from_root(world, d.fingerprint());
    MX_REQUIRE(other < 0, key, " ", d.path(), " is not the same data on every rank: rank ",
               other, " reads other tokens than rank 0 (the same ", d.size(), " tokens, but ",
               "not the same ids at the 64 places sampled; every rank must read the same files)");
    // every id, where the vocabulary check read them all: copies that differ only between
    // the sampled places
    const std::optional<uint32_t> crc = d.content_crc32c();
    const int64_t unlike = rank_differing_from_root(world, crc ? *crc : uint64_t{1} << 32);
    MX_REQUIRE(unlike < 0, key, " ", d.path(), " is not the same data on every rank: rank ",
               unlike, " reads other tokens than rank 0 (the same ", d.size(), " tokens, but ",
               "their CRC32C differs; every rank must read the same files)");
  };
  require_same_on_every_rank(data, "data.path");
  // Kept in state.json: a resume over the same path and token count but other ids (a shard
  // renamed or replaced by one of its size) is told apart.
  const std::string data_fingerprint = hex64(data.fingerprint());
  const std::string data_crc = data.content_crc32c() ? crc32c_hex(*data.content_crc32c()) : "";
  // data.val_path: validation data of its own (llm.c's fineweb_val_*.bin); training then reads
  // all of data.path and data.val_fraction is not used.
  std::optional<TokenDataset> val_data;
  MX_REQUIRE(cfg.data.val_path.empty() || format != TokenFormat::kRandom, "data.val_path is ",
             "set, but data.format = random reads no data (validation is the random data's tail)");
  if (!cfg.data.val_path.empty()) {
    val_data = open_or_stop(cfg.data.val_path, val_listed);
    if (const int rc = stopped_in_start_up("checking data.val_path")) return rc;
    require_same_on_every_rank(*val_data, "data.val_path");
    // llm.c's layout keeps fineweb_train_* and fineweb_val_* in one directory: data.path = that
    // directory would train on the validation shards.
    // (by device and inode, from the listings the datasets were opened with)
    const DataFileIds train_files(data.files());
    for (const std::string& v : val_data->files())
      MX_REQUIRE(!train_files.contains(v), "data.val_path's file ", v, " is also read by data.path ", data_path,
                 ": the run would train on its validation data (give data.path a pattern, e.g. ",
                 "DIR/*_train_*.bin)");
  }
  // Kept in state.json too: validation data rewritten under the same name is told apart.
  const std::string val_fingerprint = val_data ? hex64(val_data->fingerprint()) : "";
  const std::string val_crc =
      val_data && val_data->content_crc32c() ? crc32c_hex(*val_data->content_crc32c()) : "";
  const DataSplit split =
      val_data ? DataSplit{0, data.size(), 0, val_data->size()}
               : split_train_val(data.size(), cfg.data.val_fraction, T);
  const TokenDataset& held_out = val_data ? *val_data : data;
  WindowSampler train_sampler(&data, split.train_begin, split.train_end, T, uint64_t(tc.seed),
                              cfg.data.shuffle);
  std::unique_ptr<WindowSampler> val_sampler;
  if (tc.eval_every > 0 && split.val_end - split.val_begin >= T + 1)
    val_sampler = std::make_unique<WindowSampler>(&held_out, split.val_begin, split.val_end, T,
                                                  uint64_t(tc.seed) + 1, false);
  else if (tc.eval_every > 0 && lead)
    warn(val_data ? "validation is off: data.val_path holds fewer than seq_len + 1 tokens"
         : cfg.data.val_fraction > 0
             ? "validation is off: the held-out data (data.val_fraction) is shorter than "
               "seq_len + 1"
             : "validation is off: data.val_fraction = 0 holds no data out");

  EngineOptions eo;
  eo.device = cfg.run.device;
  eo.checkpointing = parse_checkpointing(cfg.memory.activation_checkpointing);
  eo.micro_batch = B;
  eo.seq_len = T;
  eo.params = eo.gradients = eo.optimizer = false;  // FSDP holds the (sharded) state
  const Recipe recipe = parse_recipe(cfg.precision.recipe);
  const bool fp8_recipe = recipe != Recipe::kFp32 && recipe != Recipe::kBf16;  // FP8 / FP4
  eo.quantized = recipe != Recipe::kFp32;
  eo.bf16_activations = bf16_activations(recipe, cfg.precision.activations, cfg.run.device);
  eo.bf16_path_only =
      bf16_path_only(recipe, eo.bf16_activations,
                     high_precision_bf16(recipe, cfg.precision.high_precision),
                     cfg.precision.high_precision_first, cfg.precision.high_precision_last,
                     cfg.precision.stats_every);
  eo.fp8_xt_only = fp8_xt_only_applies(model_cfg, B * T, cfg.precision.recipe,
                                       eo.bf16_activations, eo.checkpointing);
  Engine engine(model_cfg, eo);
  // run.deterministic: before the first op (the SGEMM probe tunes GEMMs, the FP8 attention
  // check below builds cuDNN graphs)
  if (cfg.run.deterministic) {
    const std::string what = engine.backend->set_deterministic();
    if (lead) info("run.deterministic: ", what);
  }
  LinearRecipe linear_recipe(recipe, model_cfg.num_hidden_layers,
                             cfg.precision.high_precision_first,
                             cfg.precision.high_precision_last, uint32_t(tc.seed), uint32_t(rank));
  linear_recipe.set_high_precision_bf16(
      high_precision_bf16(recipe, cfg.precision.high_precision));
  linear_recipe.set_fp8_attention(cfg.precision.fp8_attention);
  linear_recipe.set_fp8_head(cfg.precision.fp8_head, cfg.precision.fp8_head_dgrad == "fp8");
  if (recipe != Recipe::kFp32) engine.model->set_recipe(&linear_recipe);
  if (linear_recipe.fp8_attention_any()) {
    // A shape the backend's FP8 attention does not take (cuDNN's head-dim rule, no cuDNN) is
    // bad input: refused here, before a checkpoint is chosen or an S3 prefix claimed, not at
    // the first step.
    const std::string why = engine.backend->attention_fp8_problem(
        B, T, model_cfg.num_attention_heads, model_cfg.num_key_value_heads, model_cfg.head_dim);
    MX_REQUIRE(why.empty(), "precision.fp8_attention: ", why);
  }
  // Every block left in high precision: the recipe quantizes nothing, which the start-up line
  // ("precision nvfp4: block Linears emulated") did not say.
  const std::string covers_all = high_precision_covers_all(
      recipe, cfg.precision.high_precision_first, cfg.precision.high_precision_last,
      model_cfg.num_hidden_layers, high_precision_bf16(recipe, cfg.precision.high_precision),
      "precision.high_precision_first + high_precision_last",
      str("precision.recipe = ", cfg.precision.recipe));
  if (lead && !covers_all.empty()) warn(covers_all);
  // fp8-delayed: each pass's amaxes are the max over all ranks (every rank is data-parallel),
  // so all ranks quantize with the same scales and checkpoint the same histories.
  if (W > 1 && recipe == Recipe::kFp8Delayed)
    linear_recipe.set_amax_reduction([&world](float* amaxes, int64_t n) {
      world.all_reduce(amaxes, amaxes, n, CommDtype::kF32, ReduceOp::kMax);
    });
  Backend& be = *engine.backend;
  FsdpOptions fo;
  fo.sharding = parse_sharding(cfg.parallel.sharding);
  fo.shard_group = int(cfg.parallel.shard_group);
  // engine.options.bf16_path_only: resolved for this backend's bf16 GEMMs
  fo.bf16_blocks = bf16_gathers(cfg.parallel.gather_dtype, engine.options.bf16_path_only);
  // train.hang_timeout_s: a rank that makes no progress for that long (a peer stopped or hung
  // in a collective, a wedged device) ends itself, which ends the job (mpirun ends a job only
  // when a rank exits; every rank would otherwise wait in its collective forever). From the
  // watchdog's thread, while the main thread may sit inside MPI or a device synchronize: no
  // MPI call (MPI_Abort is not safe there), no destructors; mpirun kills the other ranks
  // when one exits with a failure. Rank 0 reports first (the others wait, as abort_all's do).
  Watchdog watchdog(tc.hang_timeout_s, [&on_hang, limit = tc.hang_timeout_s](
                                           const std::string& what, double idle_s, double limit_s) {
    char idle[32], lim[32];  // (a tenth of a second below 10 s: a test's limits)
    std::snprintf(idle, sizeof idle, "%.*f", idle_s < 10 ? 1 : 0, idle_s);
    std::snprintf(lim, sizeof lim, "%.*f", limit_s < 10 ? 1 : 0, limit_s);
    const std::string message =
        str("no progress for ", idle, " s in ", what, " (the limit: ", lim, " s",
            limit_s > limit ? str(", ", kHangAdapt, " x the longest interval so far") : "",
            "; train.hang_timeout_s): a process, a collective or the device is hung; ending the "
            "job (resume from its last checkpoint)");
    std::fflush(stdout);
    // (not when mpirun's SIGTERM came in the wait: the job is ending for another rank's
    // failure, whose line this must not replace. A stopped rank that mpirun's SIGCONT wakes
    // finds its own limit long past and comes here too.)
    if (let_rank0_report_first()) {
      if (on_hang) on_hang(str("error: ", launcher_rank_prefix(), message));
      std::fprintf(stderr, "error: %s%s\n", launcher_rank_prefix().c_str(), message.c_str());
    }
    std::fflush(stderr);
    std::_Exit(kExitHang);
  });

  // On a GPU under mpirun the shards move over NCCL (bootstrapped over the MPI world); the
  // host world keeps the trainer's own scalars, barriers and checkpoint coordination.
  // (NCCL's start-up waits for every rank to connect: a node that cannot reach the others,
  // a security group or EFA set up wrong, hung here with no line)
  watchdog.arm("the device communicator's start-up (NCCL)");
  std::unique_ptr<Communicator> device_comm = make_device_communicator(world, be);
  watchdog.disarm();
  Fsdp fsdp(engine.layout, device_comm ? *device_comm : world, fo, be, &engine.tracker);
  const int64_t n_params = engine.layout.total_numel();

  // Whole-model buffers exist only around init and the final sample.
  auto full_buffer = [&]() { return std::vector<float>(size_t(n_params)); };

  // Resume or initialize. A checkpoint of any process count resumes: each rank reads the
  // pieces of the saved shards that make up its own shard, straight from the files.
  int64_t start_step = 0;
  int64_t sample_base = 0;  // global samples read before start_step (resume: the checkpoint's)
  const std::string ckpt_root =
      cfg.checkpoint.s3_uri.empty() ? cfg.checkpoint_dir() : cfg.checkpoint.s3_uri;
  // Rank 0 picks and verifies the checkpoint (verifying reads every byte of a local one) and
  // tells the others: {which location, step}.
  std::vector<std::string> resume_roots;
  int64_t choice[2] = {-1, -1};
  // One run at a time in an out_dir and a checkpoint directory, before anything is written
  // there: two runs into one directory both exited 0, their metrics lines interleaved (two
  // summaries, a torn line) and one's final checkpoint replacing the other's. The checkpoint
  // directory has a lock of its own, also under out_dir: another run's checkpoint.dir may name
  // it. Rank 0 only: it writes the metrics and commits the checkpoints (the other ranks run
  // under its locks).
  std::optional<DirLock> out_dir_lock, checkpoint_dir_lock;
  // (out_dir only when the run writes there: with run.metrics and checkpoint.dir elsewhere it
  // is never made, and a read-only working directory stays usable)
  const bool ckpt_in_out_dir =
      cfg.checkpoint.s3_uri.empty() && same_dir(cfg.checkpoint_dir(), cfg.out_dir());
  if (lead && (ckpt_in_out_dir ||
               same_dir(fs::path(cfg.metrics_path()).parent_path().string(), cfg.out_dir())))
    out_dir_lock.emplace(cfg.out_dir(), "run.out_dir");
  // The directory's checks first (every rank sees the same one): a resume from a directory
  // each node has its own copy of read as a missing manifest on one rank.
  if (cfg.checkpoint.s3_uri.empty()) probe_checkpoint_dir(cfg.checkpoint_dir(), world);
  // (after the checks, which say what is wrong with a path; before anything is removed there)
  if (lead && cfg.checkpoint.s3_uri.empty() && !(out_dir_lock && ckpt_in_out_dir))
    checkpoint_dir_lock.emplace(cfg.checkpoint_dir(), "checkpoint.dir");
  // Before choosing: what stopped writers left behind goes, and a committed step a replacing
  // commit had moved aside (stopped between its renames) comes back (LocalStore).
  if (lead) open_checkpoint_store(cfg.checkpoint_dir())->remove_uncommitted();
  // On S3 this run names itself the prefix's writer once its step to resume from is chosen
  // and checked (the roll-back refusal, the model), before its tensors load: a run still
  // writing there stops at its next checkpoint instead of committing or pruning steps while
  // this one loads, and a launch refused as bad input has not taken the prefix from it
  // (CheckpointStore::claim_writer).
  std::string claim;
  bool claimed = false;
  auto claim_prefix = [&]() {
    if (claimed) return;
    claimed = true;
    if (!lead || cfg.checkpoint.s3_uri.empty()) return;
    claim = writer_claim();
    if (!open_checkpoint_store(cfg.checkpoint.s3_uri)->claim_writer(claim)) claim.clear();
  };
  if (cfg.checkpoint.resume == "auto") {
    // The newest committed checkpoint that verifies, across the local directory and S3 (on a
    // tie the local copy: it reads faster).
    resume_roots.push_back(cfg.checkpoint_dir());
    if (!cfg.checkpoint.s3_uri.empty()) resume_roots.push_back(cfg.checkpoint.s3_uri);
    if (lead)
      for (size_t i = 0; i < resume_roots.size(); ++i) {
        int64_t s = latest_verified_step(*open_checkpoint_store(resume_roots[i]), true);
        if (s > choice[1]) choice[0] = int64_t(i), choice[1] = s;
      }
  } else if (cfg.checkpoint.resume != "none") {
    resume_roots.push_back(parse_checkpoint_location(cfg.checkpoint.resume).root);
    if (lead) choice[0] = 0, choice[1] = resolve_checkpoint(cfg.checkpoint.resume).step;
  }
  // This run's own checkpoints must not mix with newer steps of another run in its root: a
  // same-numbered step would be replaced, checkpoint.keep (which keeps the highest numbers)
  // would delete this run's newest and keep the other run's, and resume = auto, generate and
  // export-hf of the root would later pick the other run's newest. An explicit resume from an
  // older step (a roll-back) is refused; a fresh start (resume = none) is warned about.
  if (lead && cfg.checkpoint.resume != "auto") {
    const std::unique_ptr<CheckpointStore> store = open_checkpoint_store(ckpt_root);
    const std::vector<int64_t> own = store->committed_steps();
    const int64_t from = std::max<int64_t>(choice[1], 0);
    if (!own.empty() && own.back() > from) {
      const std::string where = store->step_location(own.back());
      MX_REQUIRE(cfg.checkpoint.resume == "none", "checkpoint ", where,
                 " is newer than the step this run resumes from (", from, "), in the same "
                 "directory this run checkpoints to: its steps would mix with this run's "
                 "(checkpoint.keep would delete this run's newest); move the newer steps away "
                 "or set another checkpoint.dir");
      warn(str("checkpoint.resume = none, but ", ckpt_root, " already holds committed steps up to ",
               where, ": this run's steps replace those of the same number, and a later "
               "resume = auto picks the newest of either run"));
    }
  }
  if (W > 1) world.broadcast(choice, 2, CommDtype::kI64, 0);
  std::unique_ptr<CheckpointStore> resume_store;
  const int64_t resume_step = choice[1];
  if (resume_step >= 0) resume_store = open_checkpoint_store(resume_roots[size_t(choice[0])]);
  if (resume_step >= 0) {
    CheckpointReader reader(*resume_store, resume_step);
    // Rank 0 chose and verified the step; every rank reads it from its own view of the
    // location (a relative path, a node-local copy): another checkpoint of the same shape
    // on one node resumed a stitched model without a word. The manifest holds every file's
    // CRC32C, so the same manifest is the same checkpoint.
    const int64_t other = rank_differing_from_root(world, fnv1a64(reader.manifest().dump()));
    MX_REQUIRE(other < 0, "checkpoint ", reader.location(), " is not the same checkpoint on ",
               "every rank: rank ", other, " reads another manifest.json than rank 0 (every ",
               "rank must read the same files: a shared file system, or checkpoint.s3_uri)");
    ModelConfig saved_cfg = reader.model_config();
    // Every field that changes what the weights compute (rope_theta and rms_norm_eps were
    // taken from the new config silently, and the next checkpoint said so).
    const ModelConfig& m = model_cfg;
    MX_REQUIRE(saved_cfg.param_count() == m.param_count() &&
                   saved_cfg.hidden_size == m.hidden_size &&
                   saved_cfg.intermediate_size == m.intermediate_size &&
                   saved_cfg.num_hidden_layers == m.num_hidden_layers &&
                   saved_cfg.num_attention_heads == m.num_attention_heads &&
                   saved_cfg.num_key_value_heads == m.num_key_value_heads &&
                   saved_cfg.head_dim == m.head_dim && saved_cfg.vocab_size == m.vocab_size &&
                   saved_cfg.tie_word_embeddings == m.tie_word_embeddings &&
                   saved_cfg.rope_theta == m.rope_theta &&
                   saved_cfg.rms_norm_eps == m.rms_norm_eps,
               "checkpoint ", reader.location(), " holds a different model than this config");
    // Before any tensor loads (a whole checkpoint's download from S3, to be told then that
    // there was nothing to do, or a mistake): a step past train.steps, or the run complete.
    MX_REQUIRE(resume_step <= tc.steps, "checkpoint ", reader.location(), " is at step ",
               resume_step, ", past train.steps = ", tc.steps);
    if (resume_step == tc.steps) {
      // A finished run started again (a retried SageMaker job, the same command twice): its
      // metrics and checkpoint stay as they are, and it takes no S3 prefix. Running on would
      // append a summary of zero steps (final loss NaN, 0 tok/s) after the real one, which
      // readers take as the result.
      info("the run is already complete at train.steps = ", tc.steps, " (checkpoint ",
           reader.location(), "): nothing to train (metrics and checkpoints unchanged)");
      return 0;
    }
    claim_prefix();
    const nlohmann::json state = reader.state();
    // What the checks below compare is the same on every rank (one checkpoint, one config, data
    // checked alike on every rank above): rank 0 says it, not each of W ranks.
    auto warn_once = [&](const std::string& line) {
      if (lead) warn(line);
    };
    // The data continue where the checkpoint's run stopped reading, whatever this run's global
    // batch (micro_batch x grad_accum x ranks): step x the new batch skipped or repeated samples.
    const int64_t batch = tc.grad_accum * B * W;
    if (state.contains("samples_seen")) sample_base = state["samples_seen"].get<int64_t>();
    else sample_base = resume_step * batch;  // (checkpoints that predate the field)
    if (sample_base != resume_step * batch)
      info("the checkpoint's run read ", sample_base, " samples in ", resume_step,
           " steps; this run's global batch is ", batch, " samples: the data continue at sample ",
           sample_base);
    if (state.contains("seed") && state["seed"].is_number_integer() &&
        state["seed"].get<int64_t>() != tc.seed)
      warn_once(str("train.seed is ", tc.seed, ", the checkpoint's run used ", state["seed"].dump(),
               ": the rest of the epoch follows another order (windows may repeat or be missed)"));
    // Another spelling of the same data (./a.u16, an absolute path, ./d/*.bin for d/*.bin):
    // the same files, in the same order.
    auto same_data = [&](const std::string& old_path, const std::string& path,
                         const std::vector<std::string>& b) {
      std::error_code same_ec;
      if (old_path == path || fs::equivalent(old_path, path, same_ec)) return true;
      try {
        const std::vector<std::string> a = data_files(old_path);
        if (a.size() != b.size()) return false;
        for (size_t i = 0; i < a.size(); ++i)
          if (!fs::equivalent(a[i], b[i], same_ec)) return false;
        return true;
      } catch (const std::exception&) {
        return false;
      }
    };
    if (state.contains("data_path") && state["data_path"].is_string() &&
        !same_data(state["data_path"].get<std::string>(), data_path, data.files()))
      warn_once(str("data.path is ", data_path, ", the checkpoint's run read ",
               state["data_path"].get<std::string>(), ": training goes on with the new data"));
    // The same path over other data (a shard added to or removed from a directory, a file
    // rewritten): the windows and their order from here are not the run's.
    else if (state.contains("data_tokens") && state["data_tokens"].is_number_integer() &&
             state["data_tokens"].get<int64_t>() != data.size())
      warn_once(str("data.path ", data_path, " holds ", data.size(), " tokens, the checkpoint's run ",
               "read ", state["data_tokens"].get<int64_t>(), " (a shard added or removed, a file ",
               "rewritten?): training goes on with the data as they are now, in another order"));
    else if ((state.contains("data_fingerprint") &&
              state["data_fingerprint"].get<std::string>() != data_fingerprint) ||
             (state.contains("data_crc32c") && state["data_crc32c"].is_string() &&
              !data_crc.empty() && state["data_crc32c"].get<std::string>() != data_crc))
      warn_once(str("data.path ", data_path, " holds as many tokens as the checkpoint's run read, ",
               "but not the same ids (shards renamed, reordered or replaced? a file rewritten?): ",
               "training goes on with the data as they are now"));
    // (data.shuffle was not recorded: a resume that turned it on or off went on in another
    // order without a word)
    if (state.contains("shuffle") && state["shuffle"].is_boolean() &&
        state["shuffle"].get<bool>() != cfg.data.shuffle)
      warn_once(str("data.shuffle is ", cfg.data.shuffle ? "true" : "false",
                    ", the checkpoint's run used ", state["shuffle"].dump(),
                    ": the rest of the epoch follows another order (windows may repeat or be ",
                    "missed)"));
    // The windows themselves: another seq_len, or another split between training and
    // validation (data.val_fraction, data.val_path), reorders the rest of the epoch, and
    // validation may then be measured on windows the checkpoint's run trained on.
    if (state.contains("seq_len") && state["seq_len"].is_number_integer() &&
        state["seq_len"].get<int64_t>() != T)
      warn_once(str("train.seq_len is ", T, ", the checkpoint's run used ", state["seq_len"].dump(),
               ": the windows differ from here on, and so does the rest of the epoch's order"));
    else if (state.contains("train_windows") && state["train_windows"].is_number_integer() &&
             state["train_windows"].get<int64_t>() != train_sampler.num_windows())
      warn_once(str("training reads ", train_sampler.num_windows(), " windows, the checkpoint's run ",
               state["train_windows"].get<int64_t>(), " (data.val_fraction or data.val_path ",
               "changed?): the rest of the epoch follows another order, and validation may be ",
               "measured on windows the checkpoint's run trained on"));
    else if (state.contains("val_path") && state["val_path"].is_string() &&
             state["val_path"].get<std::string>() != cfg.data.val_path &&
             !(val_data && !state["val_path"].get<std::string>().empty() &&
               same_data(state["val_path"].get<std::string>(), cfg.data.val_path,
                         val_data->files())))
      warn_once(str("data.val_path is '", cfg.data.val_path, "', the checkpoint's run used '",
               state["val_path"].get<std::string>(), "': validation losses before and after ",
               "this step are not comparable"));
    // The same validation files, rewritten (another size, or other ids: a regenerated shard).
    else if (val_data &&
             ((state.contains("val_tokens") && state["val_tokens"].is_number_integer() &&
               state["val_tokens"].get<int64_t>() != val_data->size()) ||
              (state.contains("val_fingerprint") && state["val_fingerprint"].is_string() &&
               state["val_fingerprint"].get<std::string>() != val_fingerprint) ||
              (state.contains("val_crc32c") && state["val_crc32c"].is_string() &&
               !val_crc.empty() && state["val_crc32c"].get<std::string>() != val_crc)))
      warn_once(str("data.val_path ", cfg.data.val_path, " does not hold the tokens the ",
               "checkpoint's run validated on (",
               state.contains("val_tokens") && state["val_tokens"].is_number_integer() &&
                       state["val_tokens"].get<int64_t>() != val_data->size()
                   ? str(val_data->size(), " tokens now, ", state["val_tokens"].get<int64_t>(),
                         " then")
                   : str("as many tokens, ", val_data->size(), ", but other ids"),
               "; a file rewritten?): validation losses before and after this step are not ",
               "comparable"));
    const Fsdp::HostShards host = fsdp.shards_on_host();  // staged on a GPU
    try {
      load_shards(reader, fsdp_shard_view(fsdp, engine.layout), host.master, host.m, host.v,
                  /*stoppable=*/true);
    } catch (const StopRequested&) {  // (the agreement comes next)
    }
    // A stop during the load (minutes for a large model on S3) ends the run here: it waited
    // for the first step, which then wrote a checkpoint of the step it had resumed from.
    if (const int rc = stopped_in_start_up("loading the checkpoint")) return rc;
    fsdp.write_shards_from_host(host);
    const int64_t restored = restore_recipe_state(linear_recipe, reader, fsdp.shard_rank(),
                                                  model_cfg.num_hidden_layers);
    // Another recipe than the checkpoint's run: the weights and moments carry over, fp8-delayed's
    // amax histories only into fp8-delayed (they were restored under any recipe, never used,
    // and saved again into every later checkpoint, stale by then).
    const std::string saved_recipe = state.contains("recipe") && state["recipe"].is_string()
                                         ? state["recipe"].get<std::string>()
                                         : "";
    if (!saved_recipe.empty() && saved_recipe != cfg.precision.recipe)
      warn_once(str("precision.recipe is ", cfg.precision.recipe, ", the checkpoint's run used ",
                    saved_recipe, ": the weights and optimizer state carry over",
                    saved_recipe == "fp8-delayed" ? ", its fp8-delayed amax histories do not" : "",
                    cfg.precision.recipe == "fp8-delayed"
                        ? "; fp8-delayed's scales start at 1, with empty amax histories"
                        : ""));
    else if (const int64_t want = linear_recipe.delayed_operand_count(); restored < want)
      warn_once(str("the checkpoint holds fp8-delayed state for ", restored, " of the ", want,
                    " operands this run quantizes (precision.high_precision_first / _last ",
                    "changed?): the other ", want - restored, " start at scale 1, with empty ",
                    "amax histories"));
    start_step = resume_step;
    info("resumed from ", reader.location(), " at step ", start_step, " (saved by ",
         reader.world_size(), " processes, ", reader.shard_size(), " shards)");
  } else {
    auto full = full_buffer();
    if (!cfg.init.from.empty()) {
      try {
        load_hf_weights(cfg.init.from, engine.layout, full.data(), /*stoppable=*/true);
      } catch (const StopRequested&) {  // (the agreement comes next, before any other collective)
      }
      if (const int rc = stopped_in_start_up("loading init.from")) return rc;
      const int64_t other = rank_differing_from_root(
          world, crc32c(full.data(), full.size() * sizeof(float)));
      MX_REQUIRE(other < 0, "init.from ", cfg.init.from, " is not the same weights on every ",
                 "rank: rank ", other, " read other values than rank 0 (every rank must read ",
                 "the same files: a shared file system, or identical copies)");
      info("initialized from ", cfg.init.from);
    } else {
      init_params(engine.layout, full.data(), uint64_t(tc.seed));
    }
    fsdp.scatter_params(full.data());
  }
  claim_prefix();  // (a fresh start: before the checkpointer's start-up clean-up)
  CheckpointerOptions co;
  co.root = ckpt_root;
  co.keep = cfg.checkpoint.keep;
  co.async = cfg.checkpoint.async;
  co.sharding = cfg.parallel.sharding;
  co.claim = claim;
  Checkpointer checkpointer(co, world, fsdp, model_cfg, engine.layout);

  // MFU's denominator: a known GPU's dense BF16 datasheet rate, else the measured SGEMM rate.
  // A measured rate is a lower bound of what the machine can do: one taken while another
  // process held a core reads low (MFU then showed 200%). So it is raised to the best GEMM
  // rate the training steps themselves achieve (each step's GEMM FLOPs over its GEMM seconds).
  double peak_flops = 0;
  bool peak_measured = false;
  {
    peak_flops = plan::datasheet_bf16_flops(be.device_name());
    if (peak_flops <= 0) {
      peak_measured = true;
      // 12 MiB of device memory, taken after every training arena: on a GPU left with less
      // (an unlisted GPU, nearly full) a 256^3 product (768 KiB) measures instead; only MFU's
      // denominator depends on it, and a rate measured that small reads low, not high.
      try {
        peak_flops = measure_sgemm_flops(be, 1024, 3);
      } catch (const UserError& e) {
        if (lead) warn(str("MFU's SGEMM rate measured at 256^3, not 1024^3: ", e.what()));
        peak_flops = measure_sgemm_flops(be, 256, 3);
      }
      // Tests: a start-up measurement as low as a busy machine's.
      if (const char* t = std::getenv("MXTRAIN_TEST_SGEMM_GFLOPS")) peak_flops = std::atof(t) * 1e9;
    }
  }
  // The head's logits in larger chunks where the GPU has memory to spare once every arena is
  // allocated (MXTRAIN_CUDA_HEAD_CHUNK_MB not set): each chunk's weight gradient reads and
  // writes all of the head's fp32 dW, so fewer chunks move less (spare_head_chunk_rows).
  struct SpareHead {
    MemoryResource* mem = nullptr;
    void* p = nullptr;
    int64_t bytes = 0;
    void release() {
      if (p) mem->deallocate(p);
      p = nullptr;
    }
    ~SpareHead() { release(); }
  } spare_head;
  int64_t head_rows = head_chunk_rows(model_cfg, B * T, be.memory() != nullptr);
  // (not under run.deterministic: the rows would depend on the memory free at start-up, and
  // the weight gradient's sum over the chunks, so its rounding, on the rows)
  if (MemoryResource* mem = be.memory();
      mem && !std::getenv("MXTRAIN_CUDA_HEAD_CHUNK_MB") && !cfg.run.deterministic) {
    int64_t free_b = 0, total_b = 0;
    const HeadOperands head_ops = head_operands(&linear_recipe);  // (kFp32 under recipe fp32)
    if (mem->device_memory(&free_b, &total_b)) {
      const int64_t rows = spare_head_chunk_rows(model_cfg, B * T, head_ops, free_b, total_b);
      if (rows > 0) {
        const int64_t floats = head_workspace_floats(rows, model_cfg.hidden_size,
                                                     model_cfg.vocab_size, head_ops);
        spare_head.mem = mem;
        spare_head.bytes = int64_t(sizeof(float)) * floats;
        spare_head.p = mem->allocate(size_t(spare_head.bytes), "head_chunk");
        engine.model->set_head_workspace(static_cast<float*>(spare_head.p), floats);
        head_rows = rows;
      }
    }
  }
  const int64_t tokens_per_step = B * T * tc.grad_accum * W;
  const double flops_per_token = model_cfg.flops_per_token(T);
  info("mxtrain: ", format_count(double(model_cfg.param_count())), " parameters (",
       model_cfg.num_hidden_layers, " x ", model_cfg.hidden_size, ", ",
       model_cfg.num_attention_heads, " heads / ", model_cfg.num_key_value_heads, " kv), ",
       "data ", one_line(data_path), " (", format_count(double(data.size())), " tokens",
       data.num_files() > 1 ? str(" in ", data.num_files(), " files") : std::string(), "), ",
       val_data ? str("val ", one_line(val_data->path()), " (",
                      format_count(double(val_data->size())), " tokens), ")
                : std::string(),
       B, " x ", T, " x ", tc.grad_accum, " x ", W, " ranks = ", tokens_per_step,
       " tokens/step, precision ", cfg.precision.recipe,
       recipe == Recipe::kFp32 ? ""
       : linear_recipe.fp8_head()
           ? (linear_recipe.high_precision_bf16() ? " (head FP8, high-precision blocks bf16)"
                                                  : " (head FP8, high-precision blocks fp32)")
       : linear_recipe.high_precision_bf16() ? " (head and high-precision blocks bf16)"
                                              : " (head and high-precision blocks fp32)",
       eo.bf16_activations ? ", bf16 activations" : "", ", checkpointing ",
       cfg.memory.activation_checkpointing, ", sharding ",
       cfg.parallel.sharding,
       // (append, not operator+: GCC 12 warns falsely, -Wrestrict, on "literal" + string&&)
       device_comm ? std::string(" over ").append(device_comm->kind()) : std::string(),
       fsdp.bf16_blocks()      ? " (bf16 block gathers)"
       : fsdp.resident_codes() ? " (bf16 block codes resident)"
                               : "",
       ", ",
       omp_get_max_threads(), " threads/rank, device ", be.name(),
       be.device_name().empty() ? std::string() : std::string(" ").append(be.device_name()),
       ", peak ",
       format_count(peak_flops), "FLOP/s");
  if (linear_recipe.per_tensor_fp8() || recipe == Recipe::kFp8Block ||
      recipe == Recipe::kMxfp8 || recipe == Recipe::kNvfp4) {
    // What this shape gets: the backend's GEMMs take a Linear only when the tokens of a
    // micro-batch and both its widths are multiples of the recipe's block (LlamaModel::native_fp8).
    const int64_t multiple = engine.model->native_fp8_multiple();
    const int native = engine.model->native_fp8_linears(B * T);
    const std::string gemms = recipe == Recipe::kNvfp4
                                  ? "on the backend's FP4 GEMMs (tensor cores on a GPU)"
                                  : "on the backend's FP8 GEMMs (tensor cores on a GPU)";
    const std::string rule = "the backend's GEMMs need the tokens of a micro-batch and every "
                             "Linear width multiples of " + std::to_string(multiple);
    if (multiple == 0)
      info("precision ", cfg.precision.recipe,
           ": block Linears emulated (fp32 GEMMs over dequantized operands)");
    else if (native == 7)
      info("precision ", cfg.precision.recipe, ": block Linears ", gemms);
    else if (native > 0)
      info("precision ", cfg.precision.recipe, ": block Linears: ", native, " of 7 ", gemms,
           ", the others emulated at this shape (", rule, ")");
    else
      info("precision ", cfg.precision.recipe,
           ": block Linears emulated at this shape (fp32 GEMMs over dequantized operands; ",
           rule, ")");
  }

  if (linear_recipe.fp8_attention_any()) {
    info("attention: FP8 in the blocks precision.recipe covers (E4M3 q, k, v, probabilities "
         "and output, E5M2 gradients), ",
         be.attention_fp8_path(B, T, model_cfg.num_attention_heads,
                               model_cfg.num_key_value_heads, model_cfg.head_dim));
  }

  if (lead && be.memory())  // (after the start-up line: what the head took)
    info("head: logits in chunks of ", head_rows, " of ", B * T, " rows",
         spare_head.p ? str(" (", format_bytes(double(spare_head.bytes)), " of spare device memory)")
         : std::getenv("MXTRAIN_CUDA_HEAD_CHUNK_MB") ? std::string(" (MXTRAIN_CUDA_HEAD_CHUNK_MB)")
         : cfg.run.deterministic ? std::string(" (planned; run.deterministic takes no spare memory)")
                                 : std::string(" (planned)"),
         linear_recipe.fp8_head()  // (never set under recipe fp32)
             ? str("; precision.fp8_head ", be.head_fp8_path(B * T, model_cfg.hidden_size,
                                                             model_cfg.vocab_size, head_rows),
                   linear_recipe.fp8_head_dgrad() ? ", its data gradient too"
                                                  : ", its data gradient in bf16")
             : std::string());

  std::unique_ptr<MetricsWriter> metrics;
  if (lead) metrics = std::make_unique<MetricsWriter>(cfg.metrics_path(), start_step > 0);

  // Validation loss on a fixed set of held-out windows: eval_batches global batches of B x W
  // windows, numbered as the training batches are, each rank computing its own B of them, and
  // the ranks' means averaged (equal counts). So the set and the value are the same for every
  // process count at the same micro_batch x ranks, and no rank repeats another's work.
  auto evaluate = [&](int64_t after_step) {
    // As a recompute does: fp8-delayed quantizes with the training's current scales and records
    // no amax (the validation's amaxes changed the next steps' scales, so eval_every changed
    // the trained weights); telemetry does not count its operands.
    const LinearRecipe::ReplayScope replay(&linear_recipe);
    double sum = 0;
    for (int64_t i = 0; i < tc.eval_batches; ++i) {
      // A stop signal ends the validation (SIGTERM was not heard until every batch was done,
      // past a spot notice's grace with many eval_batches), agreed by the ranks, whose
      // forwards share collectives: no val_loss; the step loop then stops with a checkpoint.
      if (i > 0 && agreed_stop() != 0) {
        if (lead) info("validation stopped by a signal after ", i, " of ", tc.eval_batches,
                       " batches: no val_loss this step");
        return std::optional<double>();
      }
      watchdog.beat(str("validation batch ", i + 1, " of ", tc.eval_batches, " after step ",
                        after_step));
      val_sampler->fill((i * W + rank) * B, B, engine.batch_tokens());
      sum += engine.model->forward_loss(fsdp, engine.batch_tokens(), B, T);
      fsdp.finish_micro_batch();
    }
    const double mean = sum / double(tc.eval_batches);
    return std::optional<double>(W > 1 ? world.all_reduce(mean, ReduceOp::kAvg) : mean);
  };

  // Starts a checkpoint of `step` (in the background when checkpoint.async).
  // Global samples read before `step` (base: the resumed checkpoint's samples_seen).
  auto samples_before = [&](int64_t step) {
    return sample_base + (step - start_step) * tc.grad_accum * B * W;
  };
  // Before a checkpoint's collectives (a save's: the commit of the one in flight, S3's
  // barrier; a finish's commit): this rank's background write waited for unwatched, as it is
  // storage's time (a large model's upload, bounded by storage's own limits), then the
  // watchdog armed again for the collectives, where a hung peer would leave this rank waiting.
  auto after_writes = [&](const std::string& what) {
    watchdog.disarm();
    checkpointer.wait_written();
    watchdog.arm(what);
  };
  int64_t last_saved = -1;
  auto save = [&](int64_t step) {
    last_saved = step;
    nlohmann::json state = {{"samples_seen", samples_before(step)},
                            {"seed", tc.seed},
                            {"world_size", W},
                            {"sharding", cfg.parallel.sharding},
                            {"recipe", cfg.precision.recipe},
                            {"data_path", data_path},
                            {"data_tokens", data.size()},
                            {"data_fingerprint", data_fingerprint},
                            {"data_crc32c", data_crc.empty() ? nlohmann::json() : nlohmann::json(data_crc)},
                            {"seq_len", T},
                            {"shuffle", cfg.data.shuffle},
                            {"train_windows", train_sampler.num_windows()},
                            {"val_path", cfg.data.val_path},
                            {"val_fraction", cfg.data.val_fraction}};
    if (val_data) {
      state["val_tokens"] = val_data->size();
      state["val_fingerprint"] = val_fingerprint;
      state["val_crc32c"] = val_crc.empty() ? nlohmann::json() : nlohmann::json(val_crc);
    }
    checkpointer.save(step, state, recipe_extra_tensors(linear_recipe));
  };

  const bool tty = ::isatty(STDERR_FILENO);
  auto run_t0 = Clock::now();
  double tokens_done = 0, last_loss = NAN, train_seconds = 0;
  be.reset_gemm_stats();
  // run.profile: every op of the training steps after this run's first (which builds cuDNN
  // graphs, asks cuBLASLt's heuristics, touches fresh memory); validation and checkpoints are
  // left out. A run of one step profiles that step.
  double profile_from = 0;  // train_seconds when the profile was last reset
  int64_t profile_first = start_step + 1;
  if (cfg.run.profile) be.set_profiling(true);
  // The profile so far, for the metrics (each logged step's, and the summary's): a run that is
  // stopped early still leaves one.
  auto profile_json = [&](int64_t last_step, const std::vector<OpProfile::Row>& rows) {
    const double wall = train_seconds - profile_from;
    double in_ops = 0;
    for (const OpProfile::Row& r : rows) in_ops += r.seconds;
    // (the table's "(outside backend ops)" row: the JSON had no such figure)
    return nlohmann::json{{"first_step", profile_first},
                          {"last_step", last_step},
                          {"seconds", wall},
                          {"outside_ops_seconds", std::max(0.0, wall - in_ops)},
                          {"ops", op_profile_json(rows, wall)}};
  };
  if (val_sampler && lead && val_sampler->num_windows() < tc.eval_batches * B * W)
    warn(str("validation reads ", tc.eval_batches * B * W, " windows (train.eval_batches x "
             "micro_batch x ranks) but the held-out data holds ", val_sampler->num_windows(),
             ": some count more than once (", val_data ? "more data in data.val_path" :
             "raise data.val_fraction", " or lower train.eval_batches)"));
  int64_t step = start_step;
  int64_t stop_signal = 0;
  // Tests only: a signal between the start-up's last agreement and the first step, a window
  // too narrow to hit from outside.
  if (const char* t = std::getenv("MXTRAIN_TEST_SIGNAL_BEFORE_FIRST_STEP"); t && *t == '1')
    std::raise(SIGTERM);
  for (; step < tc.steps; ++step) {
    watchdog.arm(str("step ", step + 1, "'s start"));
    // Every rank stops at the same step boundary (a signal may reach only some of them).
    stop_signal = agreed_stop();
    if (stop_signal) break;
    auto t0 = Clock::now();
    // CUDA's profile charges each op the device time since the previous op's event: restarted
    // here, the time between steps (logging, the last step's profile read back: outside every
    // step time) goes to no op, instead of to this step's first (the GPU is idle: the last
    // step ended with a synchronize, so the restart waits for nothing).
    if (cfg.run.profile && step > start_step) {
      be.set_profiling(false);
      be.set_profiling(true);
    }
    const Backend::GemmStats gemm_before = be.gemm_stats();
    checkpointer.poll();  // commits a background checkpoint once every rank has written it
    const double comm_wait_before = fsdp.comm_wait_seconds();
    const double lr = lr_at(step, tc.steps, tc.warmup_steps, tc.lr, tc.min_lr);
    linear_recipe.set_step(step);
    // Numerics telemetry on this step's quantized operands: rank 0's only (docs/numerics.md).
    linear_recipe.set_collect_stats(lead && cfg.precision.stats_every > 0 &&
                                    (step + 1) % cfg.precision.stats_every == 0);
    fsdp.zero_grads();
    // Tests: this rank fails as the step starts, as a data, device or storage error on one rank
    // does, while the others go on into the step's collectives (MXTRAIN_TEST_FAIL_AT_STEP =
    // RANK:STEP): the job must end at once with its error (test_cuda_emu.py).
    if (const char* f = std::getenv("MXTRAIN_TEST_FAIL_AT_STEP")) {
      long long fr = -1, fs = -1;
      if (std::sscanf(f, "%lld:%lld", &fr, &fs) == 2 && fr == rank && fs == step + 1)
        throw UserError(str("test: rank ", rank, " fails at step ", step + 1,
                            " (MXTRAIN_TEST_FAIL_AT_STEP)"));
    }
    double loss = 0;
    for (int64_t m = 0; m < tc.grad_accum; ++m) {
      watchdog.beat(str("step ", step + 1, ", micro-batch ", m + 1, " of ", tc.grad_accum));
      // Global sample order: micro-step m of step s takes samples
      // samples_before(s) + (m * ranks + rank) * micro_batch + b, so the global batch is the
      // same for any number of ranks.
      const int64_t first = samples_before(step) + (m * W + rank) * B;
      train_sampler.fill(first, B, engine.batch_tokens());
      linear_recipe.set_micro_batch(m);
      // Each rank's gradients are its share of the global batch's mean (1 / (grad_accum x
      // ranks) of its micro-batch mean), summed over the ranks by Fsdp: the backward's
      // operands are then those of one process training the same global batch, whatever the
      // process count, which the FP8 recipes' scales depend on (with a per-rank mean, averaged
      // afterwards, a rank's gradients were W times one process's, and fp8-delayed's first
      // step quantized them differently under mpirun).
      loss += engine.model->forward_backward(fsdp, engine.batch_tokens(), B, T,
                                             1.0f / float(tc.grad_accum * W));
      fsdp.finish_micro_batch();
    }
    watchdog.beat(str("step ", step + 1, "'s gradient reduction and optimizer"));
    loss /= double(tc.grad_accum);
    nlohmann::json numerics = linear_recipe.finish_stats(step + 1);  // null unless collected
    if (W > 1) loss = world.all_reduce(loss, ReduceOp::kAvg);
    MX_REQUIRE(std::isfinite(loss), "loss is ", loss, " at step ", step + 1,
               ": training diverged (lower train.lr or set train.grad_clip)");
    const double grad_norm = fsdp.reduce_gradients_and_norm();
    // Clipping scales the gradients inside AdamW's own pass over them (Backend::adamw): the
    // same floats as scaling them first, without a read and a write of every gradient.
    const float clip = tc.grad_clip > 0 && grad_norm > tc.grad_clip
                           ? float(tc.grad_clip / (grad_norm + 1e-6))
                           : 1.0f;
    fsdp.adamw_step(float(lr), float(tc.beta1), float(tc.beta2), float(tc.eps),
                    float(tc.weight_decay), step + 1, clip);
    be.synchronize();  // a GPU queues the update: the step ends when it has run
    const double dt = seconds_since(t0);
    train_seconds += dt;
    if (cfg.run.profile && step == start_step && step + 1 < tc.steps) {
      be.reset_op_profile();
      profile_from = train_seconds;
      profile_first = step + 2;
    }
    tokens_done += double(tokens_per_step);
    last_loss = loss;
    const int64_t done = step + 1;
    const double tok_s = double(tokens_per_step) / dt;
    if (peak_measured) {
      const Backend::GemmStats g = be.gemm_stats();
      const double gemm_s = g.seconds - gemm_before.seconds;
      if (gemm_s > 0) peak_flops = std::max(peak_flops, (g.flops - gemm_before.flops) / gemm_s);
    }
    const double mfu = flops_per_token * tok_s / (peak_flops * W);

    nlohmann::json rec;
    bool log_now = done % tc.log_every == 0 || done == tc.steps;
    if (cfg.precision.stats_every > 0 && done % cfg.precision.stats_every == 0) {
      log_now = true;  // on every rank: log_now decides a collective below
      if (!numerics.is_null()) rec["numerics"] = std::move(numerics);
    }
    if (val_sampler && (done % tc.eval_every == 0 || done == tc.steps)) {
      be.set_profiling(false);
      if (const std::optional<double> val = evaluate(done)) rec["val_loss"] = *val;
      be.set_profiling(cfg.run.profile);
      log_now = true;
    }
    const int64_t peak = engine.tracker.peak();
    const int64_t peak_max = W > 1 && log_now ? world.all_reduce(peak, ReduceOp::kMax) : peak;
    if (log_now && lead) {
      rec["step"] = done;
      rec["loss"] = loss;
      rec["lr"] = lr;
      rec["grad_norm"] = grad_norm;
      rec["tokens_per_s"] = tok_s;
      rec["mfu"] = mfu;
      rec["peak_mem_bytes"] = peak;
      if (W > 1) rec["peak_mem_bytes_max_rank"] = peak_max;
      rec["step_time_s"] = dt;
      if (W > 1) rec["comm_wait_s"] = fsdp.comm_wait_seconds() - comm_wait_before;
      if (cfg.run.profile && done >= profile_first) rec["op_profile"] = profile_json(done, be.op_profile());
      if (fp8_recipe) rec["fp8_shared_operands"] = be.shared_input_hits();  // so far, rank 0
      metrics->write(rec);
      const double eta = train_seconds / double(done - start_step) * double(tc.steps - done);
      std::string line = str("step ", done, "/", tc.steps, " | loss ", loss);
      if (rec.contains("val_loss")) line += str(" | val ", rec["val_loss"].get<double>());
      char extra[160];
      std::snprintf(extra, sizeof extra, " | lr %.2e | %s tok/s | MFU %.1f%% | mem %s | ETA %s", lr,
                    format_count(tok_s).c_str(), 100 * mfu, format_bytes(double(peak)).c_str(),
                    format_duration(eta).c_str());
      line += extra;
      // A terminal redraws one progress line (kept where validation ran, and at the end); a
      // log file (SageMaker's CloudWatch, a redirect) gets plain lines, no cursor controls.
      if (!tty)
        std::fprintf(stderr, "%s\n", line.c_str());
      else if (!rec.contains("val_loss") && done != tc.steps)
        std::fprintf(stderr, "\r%s\033[K", line.c_str());
      else
        std::fprintf(stderr, "\r%s\033[K\n", line.c_str());
      std::fflush(stderr);
    }
    if (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0 && done != tc.steps) {
      after_writes(str("the checkpoint of step ", done));
      be.set_profiling(false);
      save(done);
      be.set_profiling(cfg.run.profile);
    }
  }
  watchdog.disarm();
  be.set_profiling(false);

  const int sig = int(stop_signal);
  // The last checkpoint is always waited for: the run ends only once it has committed.
  const double loop_ckpt_stall = checkpointer.stall_seconds();
  // A stop before this run's first step trained nothing: no checkpoint (it wrote the untrained
  // weights as step 0, or rewrote the step it had resumed from, which on S3 means uncommitting
  // it first, so a failure there lost it).
  if (step > start_step) {
    if (sig) {
      // Tests only: a stop checkpoint that takes this long, as a large model's does, to show
      // that the launcher leaves the ranks time to write it.
      if (const char* d = std::getenv("MXTRAIN_TEST_SLOW_STOP_MS"))
        std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(d)));
    }
    after_writes("the run's final checkpoint");
    if (last_saved != step) save(step);
    after_writes("the commit of the run's final checkpoint");
    checkpointer.finish();
  }
  watchdog.arm("the run's summary");
  const bool resumed = resume_step >= 0;
  // (nothing trained by a stop before the first step: the step it resumed from, where it is)
  std::string final_dir = step > start_step ? checkpointer.store().step_location(step)
                          : resumed         ? resume_store->step_location(resume_step)
                                            : "";
  // The head's spare-memory chunks are done with: the end-of-run sample copies the weights to
  // the device and may need that memory.
  const int64_t head_spare_bytes = spare_head.bytes;
  engine.model->set_head_workspace(nullptr, 0);
  spare_head.release();
  auto stats = be.gemm_stats();
  const int64_t peak = engine.tracker.peak();
  const int64_t peak_max = W > 1 ? world.all_reduce(peak, ReduceOp::kMax) : peak;
  nlohmann::json summary = {
      {"summary", true},
      {"steps", step},
      {"final_loss", last_loss},
      {"tokens", int64_t(tokens_done)},  // a count (a double only for the rates below)
      {"tokens_per_s", train_seconds > 0 ? tokens_done / train_seconds : 0.0},
      {"mfu", train_seconds > 0
                  ? flops_per_token * tokens_done / train_seconds / (peak_flops * W) : 0.0},
      {"peak_mem_bytes", peak},
      {"gemm_gflops", stats.seconds > 0 ? stats.flops / stats.seconds / 1e9 : 0.0},
      {"gemm_seconds", stats.seconds},
      {"train_seconds", train_seconds},
      {"sgemm_peak_gflops", peak_flops / 1e9},
      {"world_size", W},
      {"sharding", cfg.parallel.sharding},
      {"fsdp_gather_dtype", fsdp.bf16_blocks() ? "bf16" : "fp32"},
      {"fsdp_state_bytes", fsdp.state_bytes()},
      {"fsdp_transient_bytes", fsdp.transient_bytes()},
      {"fsdp_resident_code_bytes", fsdp.resident_code_bytes()},
      {"comm_wait_seconds", fsdp.comm_wait_seconds()},
      {"checkpoint", final_dir},
      // Time the step loop waited for checkpoints (async: the staging copies), and the time the
      // final checkpoint took after the loop (always waited for).
      {"checkpoint_stall_seconds", loop_ckpt_stall},
      {"checkpoint_final_seconds", checkpointer.stall_seconds() - loop_ckpt_stall},
      {"checkpoint_write_seconds", checkpointer.write_seconds()},
      {"wall_seconds", seconds_since(run_t0)}};
  if (W > 1) summary["peak_mem_bytes_max_rank"] = peak_max;
  if (MemoryResource* mem = be.memory()) {
    // Device memory this rank's arenas hold (allocated whole up front, so their capacities),
    // besides the backend's own scratch: what `mxtrain plan` reports as memory.engine.
    // (the head's chunks in spare memory, released above, are not part of the plan)
    const int64_t held = mem->held_bytes();
    summary["device_mem_bytes"] = held;
    summary["head_chunk_rows"] = head_rows;
    if (head_spare_bytes > 0) summary["head_spare_bytes"] = head_spare_bytes;
    if (W > 1) summary["device_mem_bytes_max_rank"] = world.all_reduce(held, ReduceOp::kMax);
  }
  watchdog.disarm();  // (the summary's collectives are done)
  if (sig) summary["stopped_by_signal"] = sig;
  // FP8 operands taken from another Linear's quantization of the same input (q, k and v share
  // h1's, gate and up h2's: Backend::begin_shared_input), rank 0, whole run.
  if (fp8_recipe) summary["fp8_shared_operands"] = be.shared_input_hits();
  // FP8 GEMMs with cuBLASLt's fast accumulation (MXTRAIN_CUDA_FP8_FAST_ACCUM), rank 0.
  if (fp8_recipe) summary["fp8_fast_accum_gemms"] = be.fp8_fast_accum_gemms();
  // Weight-gradient operands taken from x^T's FP8 codes the forward kept (LlamaModel::saves_xt)
  if (fp8_recipe) {
    summary["fp8_saved_xt_operands"] = engine.model->saved_xt_operands();
    summary["fp8_fused_swiglu_inputs"] = engine.model->fused_swiglu_inputs();
    summary["fp8_fused_swiglu_grads"] = engine.model->fused_swiglu_grads();
    summary["fp8_norm_amax_inputs"] = engine.model->norm_amax_inputs();
    summary["fp8_norm_amax_grads"] = engine.model->norm_amax_grads();
    summary["fp8_weight_amax_reuses"] = engine.model->weight_amax_reuses();
  }
  if (cfg.run.profile && step >= profile_first) {  // rank 0's ops (every rank runs the same)
    auto str_seconds = [](double s) {
      char b[32];
      std::snprintf(b, sizeof b, "%.3f s", s);
      return std::string(b);
    };
    const std::vector<OpProfile::Row> rows = be.op_profile();
    const double wall = train_seconds - profile_from;
    summary["op_profile"] = profile_json(step, rows);
    if (lead)
      info_lines(str("profile of steps ", profile_first, "-", step, " (", str_seconds(wall),
                     ", rank 0; each op's own time, docs/config.md):\n",
                     format_op_profile(rows, wall, 20)));
  }
  // A run stopped before its first step (a stop during start-up) trained nothing: a summary
  // of zero steps (final loss null, 0 tok/s) after a resumed run's earlier one would read as
  // the result, as for a run started again after it was complete.
  if (lead && step > start_step) metrics->write(summary);
  if (sig && step == start_step) {
    info("stopped by signal ", sig, " before the first step: nothing trained, ",
         resumed ? "the checkpoint it resumed from stands (" + final_dir + ")"
                 : std::string("no checkpoint written"));
    return sig == SIGINT ? 130 : 143;
  }
  if (sig) {
    info("stopped by signal ", sig, " at step ", step, "; checkpoint ", final_dir);
    return sig == SIGINT ? 130 : 143;
  }
  info("done: ", step, step == 1 ? " step" : " steps", ", final loss ", last_loss, ", ",
       format_count(summary["tokens_per_s"].get<double>()), " tok/s, peak memory ",
       format_bytes(double(peak)), ", checkpoint ", final_dir, ", metrics ",
       cfg.metrics_path());

  if (cfg.run.sample_tokens > 0 && model_cfg.vocab_size < 256)
    info("no sample: the model's vocabulary (", model_cfg.vocab_size, ") is smaller than the ",
         "byte-level tokenizer's 256 (run.sample_tokens = 0 says so quietly)");
  if (cfg.run.sample_tokens > 0 && model_cfg.vocab_size >= 256) {
    auto full = full_buffer();
    watchdog.arm("the sample's gather of the weights");
    fsdp.gather_params(full.data());
    watchdog.disarm();  // (rank 0 alone generates, for as long as run.sample_tokens asks)
    if (lead) {
      SampleOptions so;
      so.max_new_tokens = cfg.run.sample_tokens;
      so.seed = uint64_t(tc.seed);
      so.stop = &g_stop_signal;
      auto prompt = byte_encode(cfg.run.sample_prompt.empty() ? "\n" : cfg.run.sample_prompt);
      std::vector<int32_t> ids;
      try {
        ids = generate_tokens(model_cfg, engine.layout, be, full.data(), prompt, so);
      } catch (const std::bad_alloc&) {  // (main's advice would name the training's settings)
        throw UserError(str("out of memory generating the sample (run.sample_tokens = ",
                            so.max_new_tokens, "; the run and its checkpoint are complete)"));
      } catch (const UserError& e) {  // (a model whose logits overflow: the run is complete)
        warn(str("no sample: ", e.what()));
      }
      if (!ids.empty()) {
        std::printf("--- sample (temperature %.1f, top-k %lld) ---\n", so.temperature,
                    static_cast<long long>(so.top_k));
        // whole: a generated byte 0 cut printf's %s short (the rest and the closing line lost)
        const std::string text = byte_decode(ids);
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::printf("\n---\n");
        if (const std::string lost = ids_without_text(ids, prompt.size()); !lost.empty())
          warn("sample: " + lost);
      }
      // A signal during the sample (the training and its checkpoint are complete) ends it
      // where it is, with the signal's exit code, as during training.
      if (const int late = g_stop_signal.load()) {
        info("sample stopped by signal ", late, " after ",
             ids.empty() ? size_t(0) : ids.size() - prompt.size(), " of ",
             so.max_new_tokens, " tokens (the run and its checkpoint are complete)");
        return late == SIGINT ? 130 : 143;
      }
    }
  }
  return 0;
}

}  // namespace mx
