// mxtrain sweep: expand a grid of config overrides, ask the planner which points fit on this
// machine, train the others for a few steps (one at a time, each a subprocess of this binary,
// under mpirun for --np > 1), and tabulate predicted against measured memory and speed.
// Resumable: a point whose result.json holds a measurement (for the same base config, sets,
// steps and --np) is read back, not rerun; failed points run again.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "model/llama.h"
#include "parallel/communicator.h"
#include "plan/planner.h"
#include "plan/sweep.h"
#include "train/config.h"

namespace mx::cli {

namespace {

namespace fs = std::filesystem;

struct SweepArgs {
  std::string config, out, gpu = "cpu";
  std::vector<std::string> grids, sets;
  int64_t steps = 0, np = 1;
};

// Keys the sweep sets on every run itself, and why a --set or --grid of one is refused.
struct FixedKey {
  const char* key;
  const char* why;
};
const FixedKey kFixedKeys[] = {
    {"train.steps", "the sweep sets this key itself (--steps)"},
    {"run.out_dir", "the sweep sets this key itself (--out DIR/runs/<id>)"},
    {"run.sample_tokens", "the sweep sets this key itself (0)"},
    {"checkpoint.resume", "the sweep sets this key itself (none: each point starts afresh)"},
    // Every point starts afresh (resume = none) and writes its own steps: pointed at another
    // run's checkpoints it overwrote them, and checkpoint.keep pruned them.
    {"checkpoint.dir", "the sweep sets this key itself: each point checkpoints into its own "
                       "runs/<id>/checkpoints, so that no other run's steps are overwritten or "
                       "pruned"},
    {"checkpoint.s3_uri", "the sweep sets this key itself (empty): each point checkpoints into "
                          "its own runs/<id>/checkpoints, so that no other run's steps under an "
                          "S3 prefix are overwritten or pruned"},
};

// Under a run directory the deepest path a run writes, checkpoints/step_NNNNNNNN/ and a file's
// temporary name, with room to spare.
constexpr size_t kRunFilesBytes = 160;

std::string key_of(const std::string& set) {
  const auto eq = set.find('=');
  std::string k = set.substr(0, eq);
  while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
  return k;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Whole file to a temporary name, then renamed into place (removed again if that fails).
void write_text(const fs::path& p, const std::string& text) {
  write_file_atomic(p.string(), text);
}

// A SIGTERM (or a launcher's SIGUSR1) to the sweep goes on to the run in progress, which then
// stops at a step boundary with a checkpoint, as a Ctrl-C does; the default action killed the
// sweep alone and left the run training on, orphaned.
volatile sig_atomic_t g_run_pid = 0;       // the run in progress, 0 while there is none
volatile sig_atomic_t g_run_signal = 0;    // what to send it: SIGTERM, or SIGUSR1 for mpirun
volatile sig_atomic_t g_stop_requested = 0;  // the sweep stops after the run in progress
void forward_stop(int) {
  g_stop_requested = 1;
  if (g_run_pid > 0) kill(pid_t(g_run_pid), int(g_run_signal));
}

// Runs argv; stdout/stderr to the given files ("" = inherit). Returns the wait status.
int spawn(const std::vector<std::string>& argv, const std::string& out_file,
          const std::string& err_file, bool mpi_env) {
  std::fflush(stdout);
  std::fflush(stderr);
  // mpirun hands SIGUSR1 to every rank (which take it for SIGTERM); a SIGTERM it would pass on
  // and follow with SIGKILL a second later, too soon for the checkpoint.
  g_run_signal = mpi_env ? SIGUSR1 : SIGTERM;
  // Ctrl-C reaches the child too (same process group) and stops it at a step boundary; the
  // sweep notes it (the run's own exit status does not say so under mpirun, which exits 1) and
  // passes the stop on as SIGTERM does (a run takes a second stop signal as the first).
  struct sigaction forward {}, old_int {}, old_term {}, old_usr1 {};
  forward.sa_handler = forward_stop;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGINT, &forward, &old_int);
  sigaction(SIGTERM, &forward, &old_term);
  sigaction(SIGUSR1, &forward, &old_usr1);
  auto restore = [&] {
    g_run_pid = 0;
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGUSR1, &old_usr1, nullptr);
  };
  const pid_t pid = fork();
  if (pid < 0) restore();
  MX_REQUIRE(pid >= 0, "cannot start a process (fork failed)");
  if (pid == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);  // (exec resets handled signals anyway; until then, default)
    signal(SIGUSR1, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);  // ignored here (main.cpp); an ignored signal survives exec
    auto redirect = [](const std::string& f, int fd) {
      if (f.empty()) return;
      const int o = open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o >= 0) {
        dup2(o, fd);
        close(o);
      }
    };
    redirect(out_file, 1);
    redirect(err_file, 2);
    if (mpi_env) {
      setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
      setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    std::fprintf(stderr, "error: cannot run %s: %s\n", argv[0].c_str(), std::strerror(errno));
    _exit(127);
  }
  g_run_pid = pid;
  if (g_stop_requested) kill(pid, int(g_run_signal));  // came before the pid was known
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      status = -1;
      break;
    }
  }
  restore();
  return status;
}

std::string last_error_line(const fs::path& stderr_file) {
  std::string text = read_text(stderr_file), last;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    // Progress lines are redrawn with '\r': look at each piece.
    std::stringstream ls(line);
    std::string piece;
    while (std::getline(ls, piece, '\r'))
      if (piece.rfind("error:", 0) == 0) last = piece;
  }
  if (last.rfind("error: ", 0) == 0) last = last.substr(7);
  return last;
}

std::string gib_or_mib(double bytes) {
  char buf[64];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024));
  return buf;
}

struct Prepared {
  plan::GridPoint point;
  std::vector<std::string> sets;  // the run's --set list (user sets, the point, fixed keys)
  std::string metrics_path;
  plan::Evaluation eval;
  double needs = 0;  // bytes on this machine (all processes)
};

int run_sweep(const SweepArgs& a) {
  // Its runs would join the launcher's job (their MPI environment is the sweep's), every rank's
  // sweep writing the same --out: one sweep starts each run under mpirun itself (--np).
  MX_REQUIRE(!launched_by_mpi_launcher(), "mxtrain sweep runs once, not under mpirun: --np N ",
             "starts each run under mpirun itself");
  MX_REQUIRE(a.steps >= 1, "--steps must be at least 1 (got ", a.steps, ")");
  MX_REQUIRE(a.np >= 1, "--np must be at least 1 (got ", a.np, ")");
  MX_REQUIRE(!a.out.empty(), "--out DIR is required");
  const plan::GpuSpec probe_name_check = [&] {
    MX_REQUIRE(a.gpu == "cpu", "--gpu '", a.gpu, "': sweep trains every point on this machine, "
               "so only --gpu cpu is supported (use mxtrain plan for GPUs)");
    return plan::find_gpu("cpu");
  }();
  const plan::GpuSpec& gpu = probe_name_check;
  for (const auto& s : a.sets) {
    MX_REQUIRE(s.find('=') != std::string::npos, "--set '", s, "': expected section.key=value");
    for (const FixedKey& f : kFixedKeys)
      MX_REQUIRE(key_of(s) != f.key, "--set ", f.key, ": ", f.why);
  }
  const std::vector<plan::GridAxis> axes = plan::parse_grid(a.grids);
  for (const auto& ax : axes)  // the grid's value would silently win over the --set
    for (const auto& s : a.sets)
      MX_REQUIRE(key_of(s) != ax.key, "--set ", ax.key, " and --grid ", ax.key,
                 ": a key given twice (give its values in the grid)");
  for (const auto& ax : axes) {
    for (const FixedKey& f : kFixedKeys)
      MX_REQUIRE(ax.key != f.key, "--grid ", f.key, ": ", f.why);
  }
  // Each value as its key's type reads it, before the product is formed: an unknown key or a
  // bad value is refused at once (it was found after expanding, or validating, every point
  // before it), and two spellings of one value (2, 02, +2) would train the same point twice.
  for (const auto& ax : axes) {
    std::map<std::string, std::string> spelled;  // the value as read -> as given
    for (const auto& v : ax.values) {
      const std::string c = canonical_value(ax.key, v, "--grid");
      const auto [it, fresh] = spelled.emplace(c, v);
      MX_REQUIRE(fresh, "--grid ", ax.key, ": '", shortened(it->second, 80), "' and '",
                 shortened(v, 80), "' are the same value (", shortened(c, 80),
                 "): the point would be trained twice");
    }
  }
  const std::vector<plan::GridPoint> points = plan::expand_grid(axes);
  const fs::path out(a.out);
  const fs::path runs = out / "runs";
  std::error_code out_ec;
  MX_REQUIRE(!fs::exists(out, out_ec) || fs::is_directory(out, out_ec), "--out ", a.out,
             " exists and is not a directory");
  // Every name the sweep creates fits the filesystem: --out's own parts, runs, the points' ids
  // (cut to plan::kMaxPointIdBytes), and a run directory's whole path with room for the files
  // a run writes under it (checkpoints/step_NNNNNNNN/<file>.tmp.<pid>).
  for (const auto& part : out) {
    MX_REQUIRE(part.native().size() <= size_t(NAME_MAX), "--out ", shortened(a.out, 80),
               ": a part of the path is longer than ", NAME_MAX, " bytes");
  }
  {
    std::error_code abs_ec;
    const fs::path abs_runs = fs::absolute(runs, abs_ec);
    size_t longest = 0;
    for (const auto& p : points) longest = std::max(longest, p.id.size());
    MX_REQUIRE(abs_ec || abs_runs.native().size() + 1 + longest + kRunFilesBytes < size_t(PATH_MAX),
               "--out ", shortened(a.out, 80), ": the run directories' paths would be longer "
               "than the filesystem allows (", PATH_MAX, " bytes with the files under them)");
  }

  // Validate every point (config loading, planner) before running anything.
  std::vector<Prepared> prepared;
  for (const auto& p : points) {
    Prepared q;
    q.point = p;
    q.sets = a.sets;
    for (const auto& [k, v] : p.overrides) q.sets.push_back(k + "=" + v);
    q.sets.push_back("train.steps=" + std::to_string(a.steps));
    q.sets.push_back("run.out_dir=" + (runs / p.id).string());
    q.sets.push_back("run.sample_tokens=0");
    q.sets.push_back("checkpoint.resume=none");
    q.sets.push_back("checkpoint.dir=" + (runs / p.id / "checkpoints").string());
    q.sets.push_back("checkpoint.s3_uri=");
    RunConfig cfg;
    try {
      cfg = load_run_config(a.config, q.sets);
    } catch (const UserError& e) {
      std::string where;
      for (const auto& [k, v] : p.overrides) where += (where.empty() ? "" : ", ") + k + "=" + v;
      throw UserError(std::string(e.what()) + " (grid point " + where + ")");
    }
    q.metrics_path = cfg.metrics_path();
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
    in.recipe = cfg.precision.recipe;
    in.high_precision_first = cfg.precision.high_precision_first;
    in.high_precision_last = cfg.precision.high_precision_last;
    in.high_precision = cfg.precision.high_precision;
    in.activations = cfg.precision.activations;
    in.stats_every = cfg.precision.stats_every;
    in.fp8_attention = cfg.precision.fp8_attention;
    in.fp8_head = cfg.precision.fp8_head;
    in.fp8_head_dgrad = cfg.precision.fp8_head_dgrad == "fp8";
    in.eval = cfg.train.eval_every > 0;
    in.gpus_per_node = a.np;
    in.nodes = 1;
    plan::shard_count(in);
    q.eval = plan::evaluate(in, gpu);
    // The processes share this machine's memory.
    q.needs = static_cast<double>(q.eval.memory.total) * static_cast<double>(a.np);
    prepared.push_back(std::move(q));
  }

  std::error_code ec;
  fs::create_directories(runs, ec);
  if (ec) throw StorageError("cannot create " + runs.string() + ": " + ec.message());
  // Our own binary. One process: /proc/self/exe itself (it stays valid even if the file is
  // rebuilt meanwhile); mpirun needs the path.
  std::error_code exe_ec;
  std::string exe_path = fs::read_symlink("/proc/self/exe", exe_ec).string();
  if (exe_ec) throw StorageError("cannot find this program (/proc/self/exe): " + exe_ec.message());
  const std::string deleted = " (deleted)";
  if (exe_path.size() > deleted.size() &&
      exe_path.compare(exe_path.size() - deleted.size(), deleted.size(), deleted) == 0)
    exe_path.resize(exe_path.size() - deleted.size());
  const std::string exe = a.np > 1 ? exe_path : std::string("/proc/self/exe");
  std::string signature = "config=" + a.config + ";steps=" + std::to_string(a.steps) +
                          ";np=" + std::to_string(a.np);
  for (const auto& s : a.sets) signature += ";set=" + s;

  std::vector<plan::SweepResult> results;
  int executed = 0, reused = 0, skipped = 0, failed = 0;
  const size_t n = prepared.size();
  for (size_t i = 0; i < n; ++i) {
    const Prepared& q = prepared[i];
    plan::SweepResult r;
    r.point = q.point;
    r.predicted_mem_bytes = static_cast<double>(q.eval.memory.total);
    // The machine's MemAvailable: the planner's capacity is each of the --np processes' share.
    r.capacity_bytes = q.eval.capacity_bytes * static_cast<double>(a.np);
    r.predicted_tokens_per_s = q.eval.time.tokens_per_s;
    r.predicted_mfu = q.eval.time.mfu;
    const fs::path dir = runs / q.point.id;
    r.run_dir = dir.string();
    const fs::path result_file = dir / "result.json";
    std::fprintf(stderr, "[%zu/%zu] %s: ", i + 1, n, q.point.id.c_str());

    if (q.needs > r.capacity_bytes) {
      r.status = "skipped: predicted OOM (needs " + gib_or_mib(q.needs) + " > " +
                 gib_or_mib(r.capacity_bytes) + ")";
      std::fprintf(stderr, "%s\n", r.status.c_str());
      ++skipped;
      results.push_back(r);
      continue;
    }
    std::error_code result_ec;
    const bool has_result = fs::exists(result_file, result_ec);
    if (result_ec)
      throw StorageError("cannot read " + result_file.string() + ": " + result_ec.message());
    if (has_result) {
      try {
        const auto j = nlohmann::json::parse(read_text(result_file));
        plan::SweepResult old = plan::result_from_json(j);
        // Only measured points count as done: a failed one runs again. The same values too:
        // two values can clean up to the same id (d/c.txt and d_c.txt), and a widened grid
        // can hand an id to another point than the one whose result the directory holds.
        if (j.value("signature", "") == signature && old.measured &&
            old.point.overrides == q.point.overrides) {
          old.point = q.point;
          old.reused = true;
          // The memory prediction is recomputed (deterministic, and the planner may have
          // improved); the speed prediction is kept from the run, as it depends on the SGEMM
          // rate measured then, under the same load as the measurement.
          old.predicted_mem_bytes = r.predicted_mem_bytes;
          old.capacity_bytes = r.capacity_bytes;
          std::fprintf(stderr, "already done (%s), not rerun\n", old.status.c_str());
          ++reused;
          results.push_back(old);
          continue;
        }
      } catch (const std::exception&) {
        // unreadable: run it again
      }
    }

    fs::remove_all(dir, ec);
    if (ec) throw StorageError("cannot remove " + dir.string() + ": " + ec.message());
    fs::create_directories(dir, ec);
    if (ec) throw StorageError("cannot create " + dir.string() + ": " + ec.message());
    std::vector<std::string> argv;
    if (a.np > 1)
      argv = {"mpirun", "-np", std::to_string(a.np), "--oversubscribe", "--bind-to", "none"};
    argv.push_back(exe);
    argv.push_back("train");
    if (!a.config.empty()) {
      argv.push_back("--config");
      argv.push_back(a.config);
    }
    for (const auto& s : q.sets) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    std::fprintf(stderr, "training %lld steps (predicted %s, %.3g tok/s)... ",
                 static_cast<long long>(a.steps), gib_or_mib(q.needs).c_str(),
                 r.predicted_tokens_per_s);
    const auto t0 = std::chrono::steady_clock::now();
    const int status = spawn(argv, (dir / "stdout.log").string(), (dir / "stderr.log").string(),
                             a.np > 1);
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++executed;
    const bool interrupted =
        g_stop_requested ||
        (WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM)) ||
        (WIFEXITED(status) && (WEXITSTATUS(status) == 130 || WEXITSTATUS(status) == 143));
    if (interrupted) {
      std::fprintf(stderr, "interrupted\n");
      throw UserError("sweep interrupted at " + q.point.id + " (rerun the same command to "
                      "resume; finished points are kept)");
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      nlohmann::json summary;
      std::ifstream mf(q.metrics_path);
      std::string line;
      while (std::getline(mf, line)) {
        if (line.empty()) continue;
        try {
          auto j = nlohmann::json::parse(line);
          if (j.value("summary", false)) summary = j;
        } catch (const std::exception&) {
        }
      }
      if (summary.is_object() && summary.contains("tokens_per_s")) {
        r.measured = true;
        r.status = "ok";
        // (a value that is not a number, e.g. null for a NaN, threw nlohmann's type_error out
        // of value(): an "internal error"; it is NaN here, absent stays 0)
        auto number = [&](const char* key) {
          const auto it = summary.find(key);
          if (it == summary.end()) return 0.0;
          return it->is_number() ? it->get<double>() : std::nan("");
        };
        r.tokens_per_s = number("tokens_per_s");
        r.peak_mem_bytes = summary.contains("peak_mem_bytes_max_rank")
                               ? number("peak_mem_bytes_max_rank")
                               : number("peak_mem_bytes");
        r.final_loss = number("final_loss");
        r.mfu = number("mfu");
      } else {
        r.status = "failed: no summary in " + q.metrics_path;
      }
    } else {
      std::string msg = last_error_line(dir / "stderr.log");
      if (msg.empty())
        msg = WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                : "killed by signal " + std::to_string(WTERMSIG(status));
      r.status = "failed: " + msg;
    }
    if (!r.measured) ++failed;
    if (r.measured)
      std::fprintf(stderr, "%.3g tok/s, peak %s (predicted %s), %.1f s\n", r.tokens_per_s,
                   gib_or_mib(r.peak_mem_bytes).c_str(), gib_or_mib(q.needs).c_str(), r.wall_s);
    else
      std::fprintf(stderr, "%s\n", r.status.c_str());
    nlohmann::json j = plan::result_to_json(r);
    j["signature"] = signature;
    write_text(result_file, j.dump(2) + "\n");
    results.push_back(r);
  }

  plan::sort_results(results);
  nlohmann::json all = {
      {"config", a.config},    {"sets", a.sets},         {"steps", a.steps},
      {"np", a.np},            {"gpu", a.gpu},           {"points", nlohmann::json::array()},
      {"runs_executed", executed}, {"reused", reused},   {"skipped", skipped},
      {"failed", failed},
  };
  for (const auto& r : results) all["points"].push_back(plan::result_to_json(r));
  const std::string title = "mxtrain sweep: " + std::to_string(results.size()) + " points, " +
                            std::to_string(a.steps) + " steps each, " + std::to_string(a.np) +
                            (a.np == 1 ? " process" : " processes");
  const std::string md = plan::results_markdown(results, title);
  // The three tables are one result: a failure (a full disk) leaves the earlier three as they
  // were, never a mix of two sweeps.
  write_files_atomic({{(out / "results.json").string(), all.dump(2) + "\n"},
                      {(out / "results.csv").string(), plan::results_csv(results)},
                      {(out / "results.md").string(), md}});
  std::printf("%s\n", md.c_str());
  std::printf("sweep: %d run, %d reused, %d skipped, %d failed; results in %s\n", executed,
              reused, skipped, failed, out.string().c_str());

  // Plots: scripts/sweep_plot.py next to the build directory (or $MXTRAIN_SWEEP_PLOT).
  fs::path script;
  if (const char* env = std::getenv("MXTRAIN_SWEEP_PLOT")) script = env;
  else script = fs::path(exe_path).parent_path().parent_path() / "scripts" / "sweep_plot.py";
  std::error_code script_ec;
  if (!fs::exists(script, script_ec)) {
    std::fprintf(stderr, "warning: no plots: %s not found (tables written)\n",
                 script.string().c_str());
  } else {
    const int st = spawn({"/usr/bin/python3", script.string(), out.string()}, "", "", false);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
      std::fprintf(stderr, "warning: no plots (%s failed; it needs Debian's python3-matplotlib); "
                   "tables written\n", script.string().c_str());
  }
  return 0;
}

}  // namespace

void add_sweep(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "sweep", "train every point of a config grid for a few steps (skipping those the planner "
               "says do not fit) and compare predicted with measured memory and speed");
  auto a = std::make_shared<SweepArgs>();
  cmd->add_option("--config", a->config, "base TOML config file (as for train)");
  cmd->add_option("--grid", a->grids, "section.key=v1,v2,... (repeatable; cartesian product)")
      ->required();
  cmd->add_option("--set", a->sets, "override for every point: section.key=value (repeatable)");
  cmd->add_option("--steps", a->steps, "training steps per point")->required();
  cmd->add_option("--out", a->out, "output directory (results.*, plots, runs/<id>)")->required();
  cmd->add_option("--np", a->np, "processes per run (mpirun when > 1), default 1");
  cmd->add_option("--gpu", a->gpu, "the planner's device: cpu (this machine; the default)");
  cmd->callback([&action, a] { action = [a] { return run_sweep(*a); }; });
}

}  // namespace mx::cli
