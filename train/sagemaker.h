// The SageMaker training-job contract, as `mxtrain sagemaker train` (the container's entrypoint)
// reads and writes it. Everything here is pure or touches only the /opt/ml tree, so the
// translation rules are unit-tested without a job; cli/cmd_sagemaker.cpp runs them.
//
// <root> is /opt/ml, or $MXTRAIN_SM_ROOT (tests, local runs). SageMaker provides:
//   <root>/input/config/hyperparameters.json   {"train.steps": "100", ...}: every value a string
//   <root>/input/config/resourceconfig.json    current_host, hosts, network_interface_name
//   <root>/input/config/inputdataconfig.json   {"train": {"TrainingInputMode": "File", ...}}
//   <root>/input/data/<channel>/...            the channels' files (File / FastFile mode)
// and uploads what the job leaves in <root>/model (model.tar.gz), <root>/output/data
// (output.tar.gz), <root>/output/failure (the failure reason) and <root>/checkpoints (synced to
// the CheckpointConfig S3 URI, and restored from it when a spot job restarts).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mx::sagemaker {

struct Paths {
  std::string root;          // /opt/ml or $MXTRAIN_SM_ROOT
  std::string config_dir;    // <root>/input/config
  std::string data_dir;      // <root>/input/data (one folder per channel)
  std::string checkpoints;   // <root>/checkpoints
  std::string model;         // <root>/model
  std::string output_data;   // <root>/output/data (metrics.jsonl)
  std::string failure;       // <root>/output/failure
};
Paths paths_under(const std::string& root);
std::string root_from_env();  // $MXTRAIN_SM_ROOT if set and non-empty, else /opt/ml

// resourceconfig.json. A missing file means a local run: one host, "localhost".
struct Resources {
  std::string current_host = "localhost";
  std::vector<std::string> hosts = {"localhost"};  // sorted
  std::string network_interface;                  // "" when not given
  bool is_master() const { return current_host == hosts.front(); }
};
Resources parse_resource_config(const nlohmann::json& j);  // UserError when malformed

// What hyperparameters.json asks for, split into the config overrides (`--set` items) and the
// entrypoint's own `sagemaker.*` settings.
struct Hyperparameters {
  std::string config_file;        // "config": TOML, resolved (relative: under input/data)
  std::vector<std::string> sets;  // "section.key=value", in key order
  int64_t processes_per_host = 1; // sagemaker.processes_per_host
  std::string export_dtype = "f32";  // sagemaker.export_dtype: f32 | bf16
  std::vector<std::string> ignored;  // sagemaker_* keys the SDK's estimators add for their toolkit
};
// Every value may be a string (what SageMaker gives) or a JSON number / boolean (hand-written
// files); a string that is itself JSON-quoted ("\"tiny\"", as SDK v2 estimators send) loses
// its quotes. Key rules: "config" names the TOML file; "sagemaker.*" are the keys above;
// "sagemaker_*" (sagemaker_region, sagemaker_program, ...: the SageMaker training toolkit's own,
// which SDK estimators add) are ignored and listed in `ignored`;
// anything else must be section.key and becomes an override (the config schema then rejects
// unknown keys and bad values, as for --set). UserError names the key on any problem.
// config_must_exist = false (`mxtrain sagemaker check`, before a job exists): "config" is
// resolved but not looked for, since it lives in a channel the job has not downloaded yet.
Hyperparameters parse_hyperparameters(const nlohmann::json& j, const std::string& data_dir,
                                      bool config_must_exist = true);

// inputdataconfig.json: channel name -> TrainingInputMode ("File" when not given).
std::map<std::string, std::string> parse_input_data_config(const nlohmann::json& j);

// The data of channel `name` ("train" for data.path, "validation" for data.val_path) when the
// config does not set it: <data_dir>/<name>'s one regular file, or the directory itself when it
// holds several (its files are read as shards, hidden ones ignored: token_dataset.h); "" when
// there is no such channel. UserError when a configured channel is missing or holds no file,
// or uses Pipe mode.
std::string channel_data_path(const std::string& data_dir,
                              const std::map<std::string, std::string>& channels,
                              const std::string& name);

// The overrides the entrypoint puts in front of the user's: checkpoints under <root>, resume
// from them, metrics under <root>/output/data. The user's own overrides (hyperparameters) come
// after and so win; a config file does not (its paths would not be the job's).
std::vector<std::string> platform_sets(const Paths& paths);

// The mpirun command line the master host runs when the job has more than one process:
// hosts x processes_per_host ranks over ssh, each running `program_args`. Pure: unit-tested.
struct MpiLaunch {
  std::vector<std::string> hosts;  // sorted; a single host runs as localhost
  int64_t processes_per_host = 1;
  std::string network_interface;   // "" : let Open MPI choose
  std::vector<std::string> export_env;  // names passed on with -x
  std::vector<std::string> program_args;
};
std::vector<std::string> mpirun_command(const MpiLaunch& launch);

// The environment variables the master passes to every rank with -x, given the names set in
// its own environment: PATH, LD_LIBRARY_PATH, OMP_NUM_THREADS / OPENBLAS_NUM_THREADS when set,
// and every AWS_* (credentials, the container-credentials URI, region, endpoint), MXTRAIN_*
// (S3 settings), NCCL_* and FI_* (EFA) variable: a rank started over ssh on another host sees
// only sshd's environment, not the container's. MXTRAIN_SM_ROOT is passed on for a one-host
// job only: with several hosts each host's ranks read their own host's /opt/ml. Sorted.
std::vector<std::string> mpi_export_names(const std::vector<std::string>& environment_names,
                                          bool multi_host);

// "a b" -> 'a b': one shell word, for logging a command line.
std::string shell_quote(const std::string& word);

// True while a process of one of these names (the kernel's 15-character comm) runs on this
// host; zombies (exited, not yet reaped) do not count.
bool process_running(const std::vector<std::string>& names);

// Reaps every exited child without waiting. A worker host's entrypoint is PID 1 of its
// container, so the MPI daemon that mpirun starts there (daemonized: reparented to PID 1)
// would otherwise stay a zombie when it ends.
void reap_orphans();

}  // namespace mx::sagemaker
