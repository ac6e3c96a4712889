// mxtrain sagemaker train: the container's entrypoint (ENTRYPOINT ["mxtrain", "sagemaker"],
// SageMaker appends `train`). Reads the job from /opt/ml (or $MXTRAIN_SM_ROOT), trains with
// checkpoints under /opt/ml/checkpoints (resumed from after a spot interruption), exports the
// final model as Hugging Face safetensors to /opt/ml/model, and on failure writes the reason
// to /opt/ml/output/failure. The rules are in train/sagemaker.h and docs/sagemaker.md.
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/json_input.h"
#include "checkpoint/export_hf.h"
#include "checkpoint/storage.h"
#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/output_dirs.h"
#include "data/token_dataset.h"
#include "model/config.h"
#include "precision/recipe.h"
#include "train/config.h"
#include "train/sagemaker.h"
#include "train/trainer.h"

namespace mx::cli {

namespace {

namespace fs = std::filesystem;
namespace sm = mx::sagemaker;

// A JSON file of the job's input/config; `required` = false: a missing file gives `fallback`.
nlohmann::json read_json(const std::string& path, bool required, nlohmann::json fallback) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    MX_REQUIRE(!required, path, " does not exist");
    return fallback;
  }
  MX_REQUIRE(fs::is_regular_file(path, ec), path, " is not a file");
  std::ifstream in(path);
  MX_REQUIRE(in.good(), "cannot read ", path);
  std::stringstream text;
  text << in.rdbuf();
  std::string why;
  nlohmann::json j = parse_json_input(text.str(), &why);
  if (j.is_discarded()) throw UserError(str(path, " ", why));
  return j;
}

void write_failure(const sm::Paths& paths, const std::string& reason) {
  // SageMaker shows the first KiB or so as the job's FailureReason: a 5 MB bad value echoed in
  // the message made a 5 MB file.
  const std::string line = shortened(one_line(reason), 999);  // 1000 bytes with its newline
  try {
    fs::create_directories(fs::path(paths.failure).parent_path());
    write_file_atomic(paths.failure, line + "\n");
  } catch (const std::exception& e) {
    warn(str("cannot write ", paths.failure, ": ", e.what()));
  }
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + sm::shell_quote(w);
  return out;
}

// The path of this executable, so mpirun starts the same binary on every host.
std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("mxtrain") : p.string();
}

// --- the launcher's child process, with SIGTERM / SIGINT passed on to it -------------------
// mpirun is told of the first SIGTERM / SIGINT with SIGUSR1, which it hands to every rank at
// once (the trainer stops at the next step boundary and checkpoints, as for SIGTERM). A SIGTERM
// sent to Open MPI 4's mpirun itself would reach the ranks followed by SIGKILL one second later
// (odls_base_sigkill_timeout): too soon to write a checkpoint of any real model. A second
// signal is passed on as it is, for a hard stop.
volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_forwarded = 0;  // the first signal passed on, 0 if none
volatile sig_atomic_t g_relay_as_usr1 = 0;
void forward_signal(int sig) {
  const bool first = g_forwarded == 0;
  if (first) g_forwarded = sig;
  if (g_child > 0) ::kill(pid_t(g_child), first && g_relay_as_usr1 ? SIGUSR1 : sig);
}

int run_child(const std::vector<std::string>& argv, bool relay_as_usr1 = false) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  // The handlers go in before the fork (exec resets them in the child), so that no signal
  // between the two ends this process and leaves the child running.
  g_relay_as_usr1 = relay_as_usr1;
  std::signal(SIGTERM, forward_signal);
  std::signal(SIGINT, forward_signal);
  // exec's failure comes back through a pipe closed on a successful exec: a missing mpirun is
  // said as what it is (exit 2), not as a child's exit code 127 with a second message.
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::close(exec_pipe[0]);
    std::signal(SIGPIPE, SIG_DFL);  // ignored here (main.cpp); an ignored signal survives exec
    ::execvp(args[0], args.data());
    const int err = errno;
    (void)!::write(exec_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(exec_pipe[1]);
  int exec_errno = 0;
  ssize_t got_bytes;
  while ((got_bytes = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  ::close(exec_pipe[0]);
  if (got_bytes == sizeof exec_errno) {
    int ignored = 0;
    ::waitpid(pid, &ignored, 0);
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_DFL);
    throw UserError(str("cannot start ", args[0], ": ", std::strerror(exec_errno),
                        " (is it installed in the image and on PATH?)"));
  }
  g_child = pid;
  // A signal that came while the child was being started is passed on now.
  if (g_forwarded != 0) ::kill(pid, relay_as_usr1 ? SIGUSR1 : int(g_forwarded));
  // While the ranks run, a stop relayed as SIGUSR1 is sent again (after 1 s, 2 s, 4 s, ...,
  // then every 16 s): Open MPI hands it only to the ranks already running, so one sent while
  // they were being started was lost and the job trained on to its end (or to SIGKILL).
  int status = 0;
  auto last_relay = std::chrono::steady_clock::now();
  std::chrono::milliseconds relay_every(1000);
  for (;;) {
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) throw std::runtime_error("waitpid failed");
    const auto now = std::chrono::steady_clock::now();
    if (relay_as_usr1 && g_forwarded != 0 && now - last_relay >= relay_every) {
      ::kill(pid, SIGUSR1);  // (mpirun logs each: the period doubles, to 16 s)
      last_relay = now;
      relay_every = std::min(relay_every * 2, std::chrono::milliseconds(16000));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  g_child = 0;
  // Nobody to pass a signal on to any more: SIGTERM / SIGINT end this process again.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// True once host:port accepts a TCP connection.
bool port_open(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  bool ok = false;
  for (auto* a = res; a && !ok; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return ok;
}

// A host other than the first: serve ssh for the master's mpirun, and end when the MPI
// daemon it starts here (orted, or prted for Open MPI 5) has come and gone.
int run_worker(const sm::Resources& res, const sm::Paths& paths) {
  info("sagemaker: ", res.current_host, " waits for the master ", res.hosts.front(),
       " to start the job over ssh");
  const char* sshd = std::getenv("MXTRAIN_SSHD");
  const std::string sshd_cmd = sshd && *sshd ? sshd : "/usr/sbin/sshd";
  if (sshd_cmd != "none") {
    int rc = run_child({sshd_cmd});  // daemonizes: returns once listening
    MX_REQUIRE(rc == 0, "cannot start ", sshd_cmd, " (exit ", rc, "): multi-node jobs need sshd");
  }
  const std::vector<std::string> daemons = {"orted", "prted"};
  using clock = std::chrono::steady_clock;
  const auto give_up = clock::now() + std::chrono::minutes(30);
  while (!sm::process_running(daemons)) {
    MX_REQUIRE(clock::now() < give_up, "the master ", res.hosts.front(),
               " did not start the MPI job on this host within 30 minutes");
    sm::reap_orphans();
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  info("sagemaker: the MPI job runs on ", res.current_host);
  do {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    sm::reap_orphans();
  } while (sm::process_running(daemons));
  info("sagemaker: the MPI job on ", res.current_host, " has ended");
  // A rank on this host that failed wrote its error here (this file was cleared at the start):
  // this host then fails with it, so SageMaker's FailureReason names the error, not only the
  // master's "mpirun exited with code 2".
  std::error_code ec;
  if (fs::exists(paths.failure, ec)) {
    std::ifstream in(paths.failure);
    std::string line;
    std::getline(in, line);
    std::fprintf(stderr, "sagemaker: a rank on %s failed: %s\n", res.current_host.c_str(),
                 one_line(line).c_str());
    return 2;
  }
  return 0;
}

// Where the job writes must be one of its own directories: a relative path is under the
// container's working directory, which the job does not keep (checkpoint.dir = ck wrote
// /opt/mxtrain/ck, lost with the instance, and a restarted job had nothing to resume).
void refuse_relative_output(const std::string& key, const std::string& value,
                            const sm::Paths& paths) {
  if (value.empty() || !fs::path(value).is_relative()) return;
  const bool ckpt = key == "checkpoint.dir";
  throw UserError(str(key, " = ", value, " is a relative path: in a SageMaker job that is under "
                      "the container's working directory, which the job does not keep; name a "
                      "path under ", paths.root, " (or leave ", key, " unset: ",
                      ckpt ? paths.checkpoints : paths.output_data,
                      key == "run.metrics" ? "/metrics.jsonl" : "", ")"));
}

// The three output paths of a whole config, as resolved (an empty run.out_dir is
// runs/<run.name>, relative).
void refuse_relative_outputs(const RunConfig& cfg, const sm::Paths& paths) {
  refuse_relative_output("checkpoint.dir", cfg.checkpoint_dir(), paths);
  refuse_relative_output("run.out_dir", cfg.out_dir(), paths);
  refuse_relative_output("run.metrics", cfg.metrics_path(), paths);
}

int sagemaker_train() {
  const sm::Paths paths = sm::paths_under(sm::root_from_env());
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) {  // the entrypoint itself, not a rank it started
    // A failure file left by an earlier run in the same root (a local or Docker rerun; a real
    // job starts with an empty output/) would describe this run and hide its own failure.
    std::error_code ec;
    fs::remove(paths.failure, ec);
  }
  try {
    const auto hp_json =
        read_json(paths.config_dir + "/hyperparameters.json", false, nlohmann::json::object());
    const std::string rc_path = paths.config_dir + "/resourceconfig.json";
    sm::Resources res;
    std::error_code ec;
    if (fs::exists(rc_path, ec)) res = sm::parse_resource_config(read_json(rc_path, true, {}));
    const auto channels = sm::parse_input_data_config(
        read_json(paths.config_dir + "/inputdataconfig.json", false, nlohmann::json::object()));
    const sm::Hyperparameters hp = sm::parse_hyperparameters(hp_json, paths.data_dir);
    for (const auto& key : hp.ignored)
      if (!std::getenv("OMPI_COMM_WORLD_SIZE")) info("sagemaker: ignoring hyperparameter ", key);

    const bool mpi_rank = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;  // started by mpirun
    const bool launcher =
        !mpi_rank && (res.hosts.size() > 1 || hp.processes_per_host > 1);

    // The platform's paths first, then the user's overrides (which win); the data file of
    // the `train` channel when neither the config file nor a hyperparameter names one.
    std::vector<std::string> sets = sm::platform_sets(paths);
    sets.insert(sets.end(), hp.sets.begin(), hp.sets.end());
    RunConfig first = load_run_config(hp.config_file, sets, "hyperparameters");
    auto under_data = [&](const std::string& p) {
      return fs::path(p).is_relative() ? (fs::path(paths.data_dir) / p).string() : p;
    };
    // data.path from the `train` channel, data.val_path from `validation`, when not set.
    for (const auto& [channel, key, value] :
         {std::tuple<const char*, const char*, std::string>{"train", "data.path", first.data.path},
          {"validation", "data.val_path", first.data.val_path}}) {
      if (!value.empty()) {
        sets.push_back(str(key, "=", under_data(value)));
      } else if (first.data.format != "random") {
        const std::string found = sm::channel_data_path(paths.data_dir, channels, channel);
        if (!found.empty()) sets.push_back(str(key, "=", found));
      }
    }
    if (!first.init.from.empty()) sets.push_back("init.from=" + under_data(first.init.from));
    // A checkpoint to resume from, named by a relative path, is in a channel, as init.from.
    if (const std::string& r = first.checkpoint.resume;
        r != "auto" && r != "none" && r.rfind("s3://", 0) != 0)
      sets.push_back("checkpoint.resume=" + under_data(r));
    // A restarted job (a spot reclaim, a retry) replays the same hyperparameters: once its own
    // checkpoints hold a step past the one checkpoint.resume names elsewhere (a channel's, where
    // the job began), resuming from that one would roll them back, refused ("newer than the
    // step this run resumes from") at every restart. The job's own newest step goes on from
    // there instead. A step named in the job's own location (a deliberate roll-back) is left to
    // the trainer's refusal, and an older own step than the one named, to the named one.
    // (every rank decides alike: the job's checkpoints are one directory on one host, or S3)
    if (std::string r = first.checkpoint.resume; r != "auto" && r != "none") {
      if (r.rfind("s3://", 0) != 0) r = under_data(r);
      const bool s3 = !first.checkpoint.s3_uri.empty();
      std::string own = s3 ? first.checkpoint.s3_uri : first.checkpoint_dir();
      while (s3 && !own.empty() && own.back() == '/') own.pop_back();
      const CheckpointLocation named = parse_checkpoint_location(r);
      const bool in_own = s3 ? (named.root == own || named.root.rfind(own + "/", 0) == 0)
                             : path_place(named.root, own) != PathPlace::kOutside;
      std::vector<int64_t> steps;
      std::error_code dir_ec;
      if (!in_own && (s3 || fs::is_directory(own, dir_ec)))
        steps = open_checkpoint_store(own)->committed_steps();
      int64_t named_step = named.step;
      if (!steps.empty() && named_step < 0) {  // a root: its newest committed step
        const std::vector<int64_t> theirs = open_checkpoint_store(named.root)->committed_steps();
        named_step = theirs.empty() ? -1 : theirs.back();
      }
      if (!steps.empty() && steps.back() > named_step) {
        sets.push_back("checkpoint.resume=auto");
        if (!mpi_rank)
          info("sagemaker: ", own, " holds this job's checkpoints (a restarted job): resuming ",
               "from its newest, not from checkpoint.resume = ", r, " where the job began");
      }
    }
    RunConfig cfg = load_run_config(hp.config_file, sets, "hyperparameters");
    refuse_relative_outputs(cfg, paths);
    // Checkpoints in the model directory: the export refused it only after the whole training
    // (and a restarted job, "already complete", failed the same way each time); SageMaker
    // uploads the model directory whole, as model.tar.gz.
    if (cfg.checkpoint.s3_uri.empty()) {
      const PathPlace place = path_place(cfg.checkpoint_dir(), paths.model);
      MX_REQUIRE(place == PathPlace::kOutside, "checkpoint.dir ", cfg.checkpoint_dir(), " is ",
                 place == PathPlace::kSame ? "" : "inside ", "the model directory ", paths.model,
                 ", where the job exports its final model (SageMaker uploads that directory "
                 "as model.tar.gz): leave checkpoint.dir unset (", paths.root,
                 "/checkpoints) or name another directory");
    }
    // Every host reads the same hyperparameters: a worker refuses a bad config as the master
    // does, at once (it waited up to 30 minutes for an MPI job the master never started, and
    // wrote no failure file).
    if (launcher && !res.is_master()) return run_worker(res, paths);

    if (!mpi_rank) {
      info("sagemaker: host ", res.current_host, " (", res.hosts.size(), " host",
           res.hosts.size() > 1 ? "s" : "", " x ", hp.processes_per_host,
           " processes), root ", paths.root);
      info("sagemaker: mxtrain train", hp.config_file.empty() ? "" : " --config ",
           hp.config_file.empty() ? "" : sm::shell_quote(hp.config_file), [&] {
             std::string s;
             for (const auto& x : sets) s += " --set " + sm::shell_quote(x);
             return s;
           }());
    }
    fs::create_directories(paths.output_data, ec);
    fs::create_directories(cfg.checkpoint_dir(), ec);

    int rc = 0;
    if (launcher) {
      for (size_t i = 1; i < res.hosts.size(); ++i) {  // the workers' sshd
        using clock = std::chrono::steady_clock;
        const auto give_up = clock::now() + std::chrono::minutes(10);
        while (!port_open(res.hosts[i], 22)) {
          MX_REQUIRE(clock::now() < give_up, "host ", res.hosts[i], " does not accept ssh "
                                             "connections after 10 minutes");
          std::this_thread::sleep_for(std::chrono::seconds(1));
        }
      }
      sm::MpiLaunch launch;
      launch.hosts = res.hosts;
      launch.processes_per_host = hp.processes_per_host;
      launch.network_interface = res.network_interface;
      std::vector<std::string> env_names;
      for (char** e = environ; *e; ++e) {
        const std::string kv = *e;
        env_names.push_back(kv.substr(0, kv.find('=')));
      }
      launch.export_env = sm::mpi_export_names(env_names, res.hosts.size() > 1);
      if (!std::getenv("LD_LIBRARY_PATH")) ::setenv("LD_LIBRARY_PATH", "", 0);
      if (!std::getenv("MXTRAIN_SM_ROOT")) ::setenv("MXTRAIN_SM_ROOT", paths.root.c_str(), 0);
      launch.program_args = {self_exe(), "sagemaker", "train"};
      auto cmd = sm::mpirun_command(launch);
      info("sagemaker: ", joined(cmd));
      rc = run_child(cmd, /*relay_as_usr1=*/true);
      // Stopped (spot reclaim, StopTrainingJob): the ranks checkpointed at the same step and
      // exited 143 / 130, whatever status mpirun makes of that; the job's status is the stop.
      // (A job that finished before the stop reached a rank exited 0: it keeps its model.)
      if (rc != 0 && (g_forwarded == SIGTERM || g_forwarded == SIGINT))
        rc = 128 + int(g_forwarded);
      std::error_code fe;
      if (rc != 0 && rc != 130 && rc != 143 && !fs::exists(paths.failure, fe))
        write_failure(paths, str("error: mpirun exited with code ", rc,
                                 res.hosts.size() > 1 ? " (a rank on another host failed? its "
                                                        "error is in that host's log)" : ""));
    } else {
      // (a rank the hang watchdog ends exits from its thread: its line goes here first)
      rc = run_training(cfg, [&paths](const std::string& line) { write_failure(paths, line); });
    }
    if (rc != 0 || mpi_rank) return rc;  // a stopped job keeps its checkpoint, not a model

    // This run's final checkpoint, at train.steps (a finished run always writes it), where the
    // run wrote it: S3 when checkpoint.s3_uri is set. Not the root's newest step: a newer step
    // left there by another job (a resubmission with resume = none), or one resume skipped as
    // corrupt, is not this job's model.
    std::string root = cfg.checkpoint.s3_uri.empty() ? cfg.checkpoint_dir() : cfg.checkpoint.s3_uri;
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    const std::string step = export_checkpoint_hf(
        root + "/" + step_dir_name(cfg.train.steps), paths.model, hp.export_dtype);
    info("sagemaker: exported ", step, " to ", paths.model, " (Hugging Face, ", hp.export_dtype,
         ")");
    return 0;
  } catch (const UserError& e) {
    write_failure(paths, str("error: ", e.what()));
    throw;
  } catch (const StorageError& e) {
    write_failure(paths, str("error: ", e.what()));
    throw;
  } catch (const std::bad_alloc&) {
    write_failure(paths, "error: out of memory");
    throw;
  } catch (const std::exception& e) {
    write_failure(paths, str("error: internal error: ", e.what()));
    throw;
  }
}

// `mxtrain sagemaker check`: the hyperparameters of a job about to be submitted, as the
// entrypoint will read them, so that a typo fails on the submitting machine instead of after
// the instances are provisioned (launch/sagemaker/submit.py runs it).
int sagemaker_check(const std::string& file) {
  const sm::Paths paths = sm::paths_under("/opt/ml");  // where the job will run
  const sm::Hyperparameters hp =
      sm::parse_hyperparameters(read_json(file, true, {}), paths.data_dir, false);
  std::vector<std::string> sets = sm::platform_sets(paths);
  sets.insert(sets.end(), hp.sets.begin(), hp.sets.end());
  check_sets(sets, "hyperparameters");  // (unknown keys and wrong types first)
  for (const std::string& item : hp.sets) {  // each override, as the engine reads its value
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = canonical_value(key, item.substr(eq + 1), "hyperparameters");
    // A key whose value is one of a fixed set: with the config file in a channel (not at hand)
    // the whole is not read here, and a typo (model.preset = huge) passed and failed in the job
    try {
      check_fixed_value(key, value);
    } catch (const UserError& e) {
      throw UserError(str(e.what(), " (from hyperparameters)"));
    }
    if (key == "checkpoint.dir" || key == "run.out_dir" || key == "run.metrics")
      refuse_relative_output(key, value, paths);
    // (empty: runs/<run.name>, relative; an empty checkpoint.dir or run.metrics is under it)
    if (key == "run.out_dir" && value.empty())
      refuse_relative_output(key, "runs/<run.name>", paths);
  }
  if (hp.config_file.empty()) {
    // the whole config, as the entrypoint's first reading
    refuse_relative_outputs(load_run_config("", sets, "hyperparameters"), paths);
    info("sagemaker check: ", hp.sets.size(), " override", hp.sets.size() == 1 ? "" : "s",
         " valid on the default config");
  } else {
    // the file is in a channel: each key and value (checked above), not the whole
    info("sagemaker check: ", hp.sets.size(), " override", hp.sets.size() == 1 ? "" : "s",
         " name known keys with values of their types (the config file ", hp.config_file,
         " is read in the job)");
  }
  return 0;
}

}  // namespace

void add_sagemaker(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("sagemaker", "SageMaker training-job entrypoint (the container "
                                              "runs `mxtrain sagemaker train`)");
  cmd->require_subcommand(1);
  auto* train = cmd->add_subcommand(
      "train", "run the job described under /opt/ml ($MXTRAIN_SM_ROOT): hyperparameters.json "
               "-> config overrides, checkpoints in checkpoints/, HF model in model/");
  train->callback([&action] { action = [] { return sagemaker_train(); }; });
  auto hp_file = std::make_shared<std::string>();
  auto* check = cmd->add_subcommand(
      "check", "check a job's hyperparameters (a JSON object, as SageMaker writes "
               "hyperparameters.json) before submitting it: keys, value types, and the whole "
               "config when no 'config' file is named; exit 2 on the first problem");
  check->add_option("--hyperparameters", *hp_file, "the hyperparameters JSON file")->required();
  check->callback([&action, hp_file] { action = [hp_file] { return sagemaker_check(*hp_file); }; });
}

}  // namespace mx::cli
