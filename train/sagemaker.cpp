#include "train/sagemaker.h"

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/json_input.h"
#include "data/token_dataset.h"

namespace mx::sagemaker {

namespace fs = std::filesystem;

Paths paths_under(const std::string& root) {
  Paths p;
  p.root = root;
  p.config_dir = root + "/input/config";
  p.data_dir = root + "/input/data";
  p.checkpoints = root + "/checkpoints";
  p.model = root + "/model";
  p.output_data = root + "/output/data";
  p.failure = root + "/output/failure";
  return p;
}

std::string root_from_env() {
  const char* r = std::getenv("MXTRAIN_SM_ROOT");
  return r && *r ? std::string(r) : std::string("/opt/ml");
}

Resources parse_resource_config(const nlohmann::json& j) {
  MX_REQUIRE(j.is_object(), "resourceconfig.json must be a JSON object");
  Resources r;
  MX_REQUIRE(j.contains("current_host") && j["current_host"].is_string() &&
                 !j["current_host"].get<std::string>().empty(),
             "resourceconfig.json: current_host must be a non-empty string");
  r.current_host = j["current_host"].get<std::string>();
  MX_REQUIRE(j.contains("hosts") && j["hosts"].is_array() && !j["hosts"].empty(),
             "resourceconfig.json: hosts must be a non-empty list of host names");
  r.hosts.clear();
  for (const auto& h : j["hosts"]) {
    MX_REQUIRE(h.is_string() && !h.get<std::string>().empty(),
               "resourceconfig.json: hosts must be a list of non-empty strings");
    r.hosts.push_back(h.get<std::string>());
  }
  // The toolkit's rule: hosts sorted, the first is the master (every host computes the same).
  std::sort(r.hosts.begin(), r.hosts.end());
  MX_REQUIRE(std::adjacent_find(r.hosts.begin(), r.hosts.end()) == r.hosts.end(),
             "resourceconfig.json: a host is listed twice");
  MX_REQUIRE(std::find(r.hosts.begin(), r.hosts.end(), r.current_host) != r.hosts.end(),
             "resourceconfig.json: current_host ", r.current_host, " is not in hosts");
  if (j.contains("network_interface_name")) {
    MX_REQUIRE(j["network_interface_name"].is_string(),
               "resourceconfig.json: network_interface_name must be a string");
    r.network_interface = j["network_interface_name"].get<std::string>();
  }
  return r;
}

namespace {

// A hyperparameter's value as the text `--set key=value` would carry.
std::string value_text(const std::string& key, const nlohmann::json& v) {
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    // SDK v2 estimators JSON-encode every value: "\"tiny\"" -> tiny, "\"3\"" -> 3.
    if (s.size() >= 2 && s.front() == '"' && s.back() == '"') {
      try {
        auto inner = nlohmann::json::parse(s);
        if (inner.is_string()) s = inner.get<std::string>();
      } catch (const nlohmann::json::exception&) {
      }
    }
    return s;
  }
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number()) return v.dump();
  throw UserError(str("hyperparameter '", key, "' must be a string, number or boolean (got ",
                      v.type_name(), ")"));
}

bool escapes(const fs::path& p) {
  for (const auto& part : p)
    if (part == "..") return true;
  return false;
}

}  // namespace

Hyperparameters parse_hyperparameters(const nlohmann::json& j, const std::string& data_dir,
                                      bool config_must_exist) {
  MX_REQUIRE(j.is_object(), "hyperparameters.json must be a JSON object of \"key\": \"value\"");
  Hyperparameters h;
  for (const auto& [key, raw] : j.items()) {  // nlohmann's object: keys in sorted order
    // The training toolkit's keys, and the one SageMaker's hyperparameter tuning adds to every
    // job it starts (the metric it optimizes: read from the log by the job's metric
    // definitions, nothing the engine takes); refused, it failed every tuning job at once.
    if (key.rfind("sagemaker_", 0) == 0 || key == "_tuning_objective_metric") {
      h.ignored.push_back(key);
      continue;
    }
    const std::string value = value_text(key, raw);
    // "\u0000": paths and messages end at it (checkpoint.dir "ck\u0000/x" was probed as "ck")
    MX_REQUIRE(key.find('\0') == std::string::npos && value.find('\0') == std::string::npos,
               "hyperparameters.json: the key ", json_excerpt(nlohmann::json(key)),
               key.find('\0') == std::string::npos ? "'s value" : "",
               " holds a NUL character (\\u0000)");
    if (key == "config") {
      MX_REQUIRE(!value.empty(), "hyperparameter 'config' is empty (it names a TOML file: "
                                 "CHANNEL/FILE under input/data, or an absolute path)");
      fs::path p(value);
      if (p.is_relative()) {
        MX_REQUIRE(!escapes(p), "hyperparameter 'config' = ", value,
                   ": a relative path must stay inside input/data (no '..')");
        p = fs::path(data_dir) / p;
      }
      std::error_code ec;
      MX_REQUIRE(!config_must_exist || fs::is_regular_file(p, ec), "hyperparameter 'config' = ",
                 value, ": ",
                 p.string(), " is not a file (name it as CHANNEL/FILE under input/data)");
      h.config_file = p.string();
    } else if (key.rfind("sagemaker.", 0) == 0) {
      if (key == "sagemaker.processes_per_host") {
        // Decimal digits only, as a --set integer (stoll also took " 2" and "+2", not "2 ").
        size_t used = 0;
        long long n = -1;
        if (!value.empty() && value.size() <= 4 &&
            value.find_first_not_of("0123456789") == std::string::npos)
          n = std::stoll(value, &used);
        MX_REQUIRE(used == value.size() && n >= 1 && n <= 1024,
                   "hyperparameter sagemaker.processes_per_host must be an integer in "
                   "[1, 1024] (got '", value, "')");
        h.processes_per_host = n;
      } else if (key == "sagemaker.export_dtype") {
        std::string d = value;
        for (auto& c : d) c = char(std::tolower(static_cast<unsigned char>(c)));
        MX_REQUIRE(d == "f32" || d == "bf16",
                   "hyperparameter sagemaker.export_dtype must be f32 or bf16 (got '", value,
                   "')");
        h.export_dtype = d;
      } else {
        throw UserError(str("unknown hyperparameter '", key,
                            "' (known in sagemaker.: processes_per_host, export_dtype)"));
      }
    } else {
      const auto dot = key.find('.');
      MX_REQUIRE(dot != std::string::npos && dot > 0 && dot + 1 < key.size(),
                 "hyperparameter '", key, "' is not section.key (nor 'config' or sagemaker.*)");
      h.sets.push_back(key + "=" + value);
    }
  }
  return h;
}

std::map<std::string, std::string> parse_input_data_config(const nlohmann::json& j) {
  MX_REQUIRE(j.is_object(), "inputdataconfig.json must be a JSON object of channels");
  std::map<std::string, std::string> channels;
  for (const auto& [name, spec] : j.items()) {
    std::string mode = "File";
    MX_REQUIRE(spec.is_object(), "inputdataconfig.json: channel '", name,
               "' is not a JSON object");
    if (spec.contains("TrainingInputMode")) {
      MX_REQUIRE(spec["TrainingInputMode"].is_string(), "inputdataconfig.json: channel '", name,
                 "': TrainingInputMode is not a string");
      mode = spec["TrainingInputMode"].get<std::string>();
      // SageMaker's three input modes; anything else is a broken file, not a mode to guess at
      MX_REQUIRE(mode == "File" || mode == "FastFile" || mode == "Pipe",
                 "inputdataconfig.json: channel '", name, "': TrainingInputMode '", mode,
                 "' is not File, FastFile or Pipe");
    }
    // ShardedByS3Key gives each host other files; every rank here reads the same data and
    // takes its own windows of it (ranks compare sizes and a fingerprint, which failed later
    // with a message about the config or the data instead of the channel).
    if ((name == "train" || name == "validation") && spec.contains("S3DistributionType")) {
      MX_REQUIRE(spec["S3DistributionType"].is_string(), "inputdataconfig.json: channel '", name,
                 "': S3DistributionType is not a string");
      MX_REQUIRE(spec["S3DistributionType"].get<std::string>() != "ShardedByS3Key",
                 "inputdataconfig.json: channel '", name, "' is ShardedByS3Key: every host must ",
                 "see the whole data set (each rank reads its own windows of it): use ",
                 "FullyReplicated");
    }
    channels[name] = mode;
  }
  return channels;
}

std::string channel_data_path(const std::string& data_dir,
                              const std::map<std::string, std::string>& channels,
                              const std::string& name) {
  auto it = channels.find(name);
  if (it != channels.end())
    MX_REQUIRE(it->second != "Pipe", "input channel '", name, "' uses Pipe mode, which mxtrain ",
               "does not read: use File or FastFile");
  const fs::path dir = fs::path(data_dir) / name;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    MX_REQUIRE(it == channels.end(), "input channel '", name, "' is configured but ", dir.string(),
               " does not exist");
    return "";
  }
  // Its one file, or the directory, whose files TokenDataset reads as shards. A directory the
  // job's input config does not name, holding no data files (hidden ones only, say), is no
  // channel.
  std::vector<std::string> files;
  try {
    files = data_files(dir.string());
  } catch (const UserError&) {
    if (it == channels.end()) return "";
    throw;
  }
  return files.size() == 1 ? files.front() : dir.string();
}

std::vector<std::string> platform_sets(const Paths& paths) {
  // run.metrics too: a config file's own metrics path would take the metrics out of
  // output/data (the job's output.tar.gz), where `run.out_dir` puts them by default.
  return {"checkpoint.dir=" + paths.checkpoints, "checkpoint.resume=auto",
          "run.out_dir=" + paths.output_data, "run.metrics="};
}

std::vector<std::string> mpirun_command(const MpiLaunch& l) {
  MX_REQUIRE(!l.hosts.empty(), "mpirun needs at least one host");
  MX_REQUIRE(l.processes_per_host >= 1, "processes per host must be at least 1");
  const int64_t np = int64_t(l.hosts.size()) * l.processes_per_host;
  // One host: the ranks are local (its SageMaker name need not resolve to itself over ssh).
  std::string host_list;
  const std::string slots = std::string(":").append(std::to_string(l.processes_per_host));
  if (l.hosts.size() == 1) {
    host_list = "localhost" + slots;
  } else {
    for (const auto& h : l.hosts) host_list += (host_list.empty() ? "" : ",") + h + slots;
  }
  std::vector<std::string> cmd = {"mpirun", "--host", host_list, "-np", std::to_string(np),
                                  // containers run as root; ranks are placed host by host
                                  "--allow-run-as-root", "--map-by", "slot", "--bind-to", "none",
                                  // a failing rank ends the job instead of hanging the others
                                  "--mca", "orte_abort_on_non_zero_status", "1"};
  if (l.hosts.size() > 1) {
    // Launch every remote daemon from the master (the workers only run sshd).
    for (const char* a : {"--mca", "plm_rsh_no_tree_spawn", "1"}) cmd.emplace_back(a);
    if (!l.network_interface.empty()) {
      for (const char* k : {"btl_tcp_if_include", "oob_tcp_if_include"}) {
        cmd.emplace_back("--mca");
        cmd.emplace_back(k);
        cmd.push_back(l.network_interface);
      }
      cmd.emplace_back("-x");
      cmd.push_back("NCCL_SOCKET_IFNAME=" + l.network_interface);
    }
  }
  for (const auto& name : l.export_env) {
    cmd.emplace_back("-x");
    cmd.push_back(name);
  }
  cmd.insert(cmd.end(), l.program_args.begin(), l.program_args.end());
  return cmd;
}

std::vector<std::string> mpi_export_names(const std::vector<std::string>& names,
                                          bool multi_host) {
  std::set<std::string> out = {"PATH", "LD_LIBRARY_PATH"};
  const std::set<std::string> exact = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
  for (const auto& n : names) {
    const bool prefixed = n.rfind("AWS_", 0) == 0 || n.rfind("MXTRAIN_", 0) == 0 ||
                          n.rfind("NCCL_", 0) == 0 || n.rfind("FI_", 0) == 0;
    if (!(prefixed || exact.count(n))) continue;
    if (multi_host && n == "MXTRAIN_SM_ROOT") continue;
    out.insert(n);
  }
  if (!multi_host) out.insert("MXTRAIN_SM_ROOT");
  return {out.begin(), out.end()};
}

std::string shell_quote(const std::string& w) {
  const bool plain = !w.empty() && std::all_of(w.begin(), w.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string("-_./:=,@%+").find(c) !=
                                                              std::string::npos;
  });
  if (plain) return w;
  std::string out = "'";
  for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool process_running(const std::vector<std::string>& names) {
  // /proc/PID/stat is "PID (comm) STATE ..."; comm may itself hold ')' or spaces.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    std::ifstream in(e.path() / "stat");
    std::string stat;
    if (!in || !std::getline(in, stat)) continue;
    const auto open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 2 >= stat.size())
      continue;
    const char state = stat[close + 2];
    if (state == 'Z' || state == 'X') continue;
    const std::string name = stat.substr(open + 1, close - open - 1);
    for (const auto& n : names)
      if (name == n) return true;
  }
  return false;
}

void reap_orphans() {
  int status = 0;
  while (::waitpid(-1, &status, WNOHANG) > 0) {
  }
}

}  // namespace mx::sagemaker
