// The SageMaker entrypoint's translation rules: hyperparameters.json -> config overrides,
// resourceconfig.json -> hosts, the train channel -> data.path, and the mpirun command line.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/config.h"
#include "train/sagemaker.h"

namespace fs = std::filesystem;
namespace sm = mx::sagemaker;
using nlohmann::json;

namespace {

class SagemakerDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("mx_sagemaker_" + std::string(::testing::UnitTest::GetInstance()
                                              ->current_test_info()
                                              ->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void touch(const fs::path& rel, const std::string& text = "x") {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  fs::path dir_;
};

bool contains_in_order(const std::vector<std::string>& v, const std::vector<std::string>& seq) {
  return std::search(v.begin(), v.end(), seq.begin(), seq.end()) != v.end();
}

}  // namespace

TEST(SagemakerHyperparameters, StringValuesBecomeTheSameOverridesAsSet) {
  // What SageMaker writes: every value a string; SDK v2 estimators JSON-quote them again.
  json hp = {{"train.steps", "7"},         {"model.preset", "tiny"},
             {"train.lr", "\"0.003\""},   {"data.shuffle", "false"},
             {"train.seed", 42},           {"checkpoint.every", "2"},
             {"run.sample_prompt", "a b"}, {"memory.activation_checkpointing", "full"}};
  auto h = sm::parse_hyperparameters(hp, "/nonexistent");
  EXPECT_EQ(h.sets, (std::vector<std::string>{
                        "checkpoint.every=2", "data.shuffle=false",
                        "memory.activation_checkpointing=full", "model.preset=tiny",
                        "run.sample_prompt=a b", "train.lr=0.003", "train.seed=42",
                        "train.steps=7"}));
  EXPECT_TRUE(h.config_file.empty());
  EXPECT_EQ(h.processes_per_host, 1);
  // ...and the config they make holds the values (the tiny preset is 64 wide).
  mx::RunConfig c = mx::load_run_config("", h.sets);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.seed, 42);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.003);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.checkpoint.every, 2);
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.run.sample_prompt, "a b");
  EXPECT_EQ(c.memory.activation_checkpointing, "full");
}

TEST(SagemakerHyperparameters, BadKeysAndValuesAreUserErrors) {
  EXPECT_THROW(sm::parse_hyperparameters(json::array(), "/d"), mx::UserError);
  EXPECT_THROW(sm::parse_hyperparameters({{"steps", "3"}}, "/d"), mx::UserError);  // no section
  EXPECT_THROW(sm::parse_hyperparameters({{"train.", "3"}}, "/d"), mx::UserError);
  EXPECT_THROW(sm::parse_hyperparameters({{"train.steps", json::array()}}, "/d"), mx::UserError);
  EXPECT_THROW(sm::parse_hyperparameters({{"sagemaker.nodes", "2"}}, "/d"), mx::UserError);
  for (const char* bad : {"0", "-1", "two", "2x", ""})
    EXPECT_THROW(sm::parse_hyperparameters({{"sagemaker.processes_per_host", bad}}, "/d"),
                 mx::UserError)
        << bad;
  EXPECT_THROW(sm::parse_hyperparameters({{"sagemaker.export_dtype", "fp8"}}, "/d"),
               mx::UserError);
  // Unknown keys and wrong types are the config schema's errors, as for --set.
  auto h = sm::parse_hyperparameters({{"train.stepz", "3"}}, "/d");
  EXPECT_THROW(mx::load_run_config("", h.sets), mx::UserError);
  h = sm::parse_hyperparameters({{"train.steps", "three"}}, "/d");
  EXPECT_THROW(mx::load_run_config("", h.sets), mx::UserError);
}

TEST(SagemakerHyperparameters, EntrypointKeys) {
  auto h = sm::parse_hyperparameters(
      {{"sagemaker.processes_per_host", "8"}, {"sagemaker.export_dtype", "BF16"},
       {"train.steps", "3"}},
      "/d");
  EXPECT_EQ(h.processes_per_host, 8);
  EXPECT_EQ(h.export_dtype, "bf16");
  EXPECT_EQ(h.sets, std::vector<std::string>{"train.steps=3"});  // not passed to the config
  // the training toolkit's own keys, as SDK estimators add them, are set aside
  h = sm::parse_hyperparameters(
      {{"sagemaker_region", "\"us-west-2\""}, {"sagemaker_program", "x"}, {"train.steps", "3"}},
      "/d");
  EXPECT_EQ(h.sets, std::vector<std::string>{"train.steps=3"});
  EXPECT_EQ(h.ignored, (std::vector<std::string>{"sagemaker_program", "sagemaker_region"}));
}

TEST_F(SagemakerDir, ConfigNamesATomlFileInAChannel) {
  touch("config/run.toml", "[train]\nsteps = 9\n");
  auto h = sm::parse_hyperparameters({{"config", "config/run.toml"}}, dir_.string());
  EXPECT_EQ(fs::path(h.config_file), dir_ / "config/run.toml");
  EXPECT_EQ(mx::load_run_config(h.config_file, h.sets).train.steps, 9);
  // absolute paths are taken as they are
  h = sm::parse_hyperparameters({{"config", (dir_ / "config/run.toml").string()}}, "/elsewhere");
  EXPECT_EQ(fs::path(h.config_file), dir_ / "config/run.toml");
  EXPECT_THROW(sm::parse_hyperparameters({{"config", "config/missing.toml"}}, dir_.string()),
               mx::UserError);
  EXPECT_THROW(sm::parse_hyperparameters({{"config", "../config/run.toml"}},
                                         (dir_ / "config").string()),
               mx::UserError);
  EXPECT_THROW(sm::parse_hyperparameters({{"config", ""}}, dir_.string()), mx::UserError);
}

TEST(SagemakerPlatform, UserOverridesComeAfterThePlatformPaths) {
  auto p = sm::paths_under("/tmp/smroot");
  EXPECT_EQ(p.checkpoints, "/tmp/smroot/checkpoints");
  EXPECT_EQ(p.model, "/tmp/smroot/model");
  EXPECT_EQ(p.failure, "/tmp/smroot/output/failure");
  auto sets = sm::platform_sets(p);
  mx::RunConfig c = mx::load_run_config("", sets);
  EXPECT_EQ(c.checkpoint_dir(), "/tmp/smroot/checkpoints");
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_EQ(c.metrics_path(), "/tmp/smroot/output/data/metrics.jsonl");
  sets.push_back("checkpoint.dir=/mnt/ckpt");
  EXPECT_EQ(mx::load_run_config("", sets).checkpoint_dir(), "/mnt/ckpt");
}

TEST(SagemakerResources, HostsSortedFirstIsMaster) {
  auto r = sm::parse_resource_config({{"current_host", "algo-2"},
                                      {"hosts", {"algo-3", "algo-1", "algo-2"}},
                                      {"network_interface_name", "eth0"}});
  EXPECT_EQ(r.hosts, (std::vector<std::string>{"algo-1", "algo-2", "algo-3"}));
  EXPECT_FALSE(r.is_master());
  EXPECT_EQ(r.network_interface, "eth0");
  r = sm::parse_resource_config({{"current_host", "algo-1"}, {"hosts", {"algo-2", "algo-1"}}});
  EXPECT_TRUE(r.is_master());
  EXPECT_EQ(r.network_interface, "");
  EXPECT_THROW(sm::parse_resource_config({{"current_host", "algo-9"}, {"hosts", {"algo-1"}}}),
               mx::UserError);
  EXPECT_THROW(sm::parse_resource_config({{"current_host", "algo-1"}, {"hosts", json::array()}}),
               mx::UserError);
  EXPECT_THROW(sm::parse_resource_config({{"hosts", {"algo-1"}}}), mx::UserError);
  EXPECT_THROW(
      sm::parse_resource_config({{"current_host", "algo-1"}, {"hosts", {"algo-1", "algo-1"}}}),
      mx::UserError);
}

TEST_F(SagemakerDir, ChannelsGiveTheDataFileOrDirectory) {
  std::map<std::string, std::string> channels = {{"train", "File"}, {"validation", "File"}};
  // no channel at all: nothing to add (the config's own data.path / the bundled corpus)
  EXPECT_EQ(sm::channel_data_path(dir_.string(), {}, "train"), "");
  // configured but absent, empty, Pipe mode: errors
  EXPECT_THROW(sm::channel_data_path(dir_.string(), channels, "train"), mx::UserError);
  EXPECT_THROW(sm::channel_data_path(dir_.string(), channels, "validation"), mx::UserError);
  fs::create_directories(dir_ / "train");
  EXPECT_THROW(sm::channel_data_path(dir_.string(), channels, "train"), mx::UserError);
  touch("train/sub/shard.bin");
  touch("train/.hidden");
  touch("train/.cache/x.bin");
  EXPECT_EQ(fs::path(sm::channel_data_path(dir_.string(), channels, "train")),
            dir_ / "train/sub/shard.bin");
  EXPECT_THROW(sm::channel_data_path(dir_.string(), {{"train", "Pipe"}}, "train"), mx::UserError);
  // several files: the channel's directory, read as shards
  touch("train/other.bin");
  EXPECT_EQ(fs::path(sm::channel_data_path(dir_.string(), channels, "train")), dir_ / "train");
  // a directory the input config does not name, holding hidden files only: no channel
  touch("validation/.keep");
  EXPECT_EQ(sm::channel_data_path(dir_.string(), {{"train", "File"}}, "validation"), "");
  EXPECT_THROW(sm::channel_data_path(dir_.string(), channels, "validation"), mx::UserError);
  touch("validation/val_000.bin");
  EXPECT_EQ(fs::path(sm::channel_data_path(dir_.string(), channels, "validation")),
            dir_ / "validation/val_000.bin");
}

TEST(SagemakerInputData, ModesPerChannel) {
  auto c = sm::parse_input_data_config(
      {{"train", {{"TrainingInputMode", "FastFile"}}}, {"config", json::object()}});
  EXPECT_EQ(c.at("train"), "FastFile");
  EXPECT_EQ(c.at("config"), "File");
  // A mode SageMaker does not have, a mode that is not a string, a channel that is not an
  // object: a broken file (they were taken for File).
  EXPECT_THROW(sm::parse_input_data_config({{"train", {{"TrainingInputMode", "Bogus"}}}}),
               mx::UserError);
  EXPECT_THROW(sm::parse_input_data_config({{"train", {{"TrainingInputMode", 3}}}}),
               mx::UserError);
  EXPECT_THROW(sm::parse_input_data_config({{"train", "File"}}), mx::UserError);
}

TEST(SagemakerMpirun, TwoHostsEightProcessesEach) {
  sm::MpiLaunch l;
  l.hosts = {"algo-1", "algo-2"};
  l.processes_per_host = 8;
  l.network_interface = "eth0";
  l.export_env = {"PATH", "MXTRAIN_SM_ROOT"};
  l.program_args = {"/opt/mxtrain/build/mxtrain", "sagemaker", "train"};
  auto cmd = sm::mpirun_command(l);
  ASSERT_FALSE(cmd.empty());
  EXPECT_EQ(cmd.front(), "mpirun");
  EXPECT_TRUE(contains_in_order(cmd, {"--host", "algo-1:8,algo-2:8"}));
  EXPECT_TRUE(contains_in_order(cmd, {"-np", "16"}));
  EXPECT_TRUE(contains_in_order(cmd, {"--mca", "plm_rsh_no_tree_spawn", "1"}));
  EXPECT_TRUE(contains_in_order(cmd, {"--mca", "btl_tcp_if_include", "eth0"}));
  EXPECT_TRUE(contains_in_order(cmd, {"--mca", "oob_tcp_if_include", "eth0"}));
  EXPECT_TRUE(contains_in_order(cmd, {"-x", "NCCL_SOCKET_IFNAME=eth0"}));
  EXPECT_TRUE(contains_in_order(cmd, {"-x", "PATH"}));
  EXPECT_TRUE(contains_in_order(cmd, {"-x", "MXTRAIN_SM_ROOT"}));
  EXPECT_TRUE(contains_in_order(cmd, {"--allow-run-as-root"}));
  // the program comes last, whole
  ASSERT_GE(cmd.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(cmd.end() - 3, cmd.end()), l.program_args);
}

TEST(SagemakerMpirun, OneHostRunsLocally) {
  sm::MpiLaunch l;
  l.hosts = {"algo-1"};
  l.processes_per_host = 2;
  l.network_interface = "eth0";
  l.program_args = {"mxtrain", "sagemaker", "train"};
  auto cmd = sm::mpirun_command(l);
  EXPECT_TRUE(contains_in_order(cmd, {"--host", "localhost:2"}));
  EXPECT_TRUE(contains_in_order(cmd, {"-np", "2"}));
  EXPECT_EQ(std::find(cmd.begin(), cmd.end(), "plm_rsh_no_tree_spawn"), cmd.end());
  EXPECT_EQ(std::find(cmd.begin(), cmd.end(), "btl_tcp_if_include"), cmd.end());
  l.hosts.clear();
  EXPECT_THROW(sm::mpirun_command(l), mx::UserError);
}

TEST(SagemakerMpirun, ShellQuote) {
  EXPECT_EQ(sm::shell_quote("train.steps=3"), "train.steps=3");
  EXPECT_EQ(sm::shell_quote("a b"), "'a b'");
  EXPECT_EQ(sm::shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(sm::shell_quote(""), "''");
}

TEST(SagemakerMpirun, ExportedEnvironment) {
  // A rank started over ssh sees only sshd's environment: the credentials URI, region and the
  // S3 / NCCL / EFA settings must travel with -x; each host keeps its own /opt/ml.
  const std::vector<std::string> env = {
      "HOME", "PATH", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_REGION", "MXTRAIN_SM_ROOT",
      "MXTRAIN_S3_PART_SIZE", "NCCL_DEBUG", "FI_PROVIDER", "OMP_NUM_THREADS", "SM_HOSTS",
      "TERM", "AWSX", "LD_PRELOAD"};
  EXPECT_EQ(sm::mpi_export_names(env, true),
            (std::vector<std::string>{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_REGION",
                                      "FI_PROVIDER", "LD_LIBRARY_PATH", "MXTRAIN_S3_PART_SIZE",
                                      "NCCL_DEBUG", "OMP_NUM_THREADS", "PATH"}));
  // one host: its ranks are local, and MXTRAIN_SM_ROOT (set or not) names the one tree
  EXPECT_EQ(sm::mpi_export_names({"PATH", "TERM"}, false),
            (std::vector<std::string>{"LD_LIBRARY_PATH", "MXTRAIN_SM_ROOT", "PATH"}));
}

// The worker host waits while the MPI daemon runs; a daemon that has exited but is not yet
// reaped (a zombie: in a container the entrypoint is PID 1, every orphan's parent) has ended.
TEST(SagemakerWorker, ProcessRunningSkipsZombiesAndReapOrphansClearsThem) {
  const std::string name = "mxzombie" + std::to_string(::getpid() % 100000);
  ASSERT_LE(name.size(), 15u);  // the kernel's comm length
  EXPECT_FALSE(sm::process_running({name}));
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // named as the daemon would be; exits when the parent says so
    ::prctl(PR_SET_NAME, name.c_str());
    char c;
    ::close(go[1]);
    (void)!::read(go[0], &c, 1);
    ::_exit(0);
  }
  ::close(go[0]);
  auto state = [&] {  // the child's state letter from /proc/PID/stat ('?' once it is gone)
    std::ifstream in("/proc/" + std::to_string(child) + "/stat");
    std::string s;
    if (!std::getline(in, s)) return '?';
    return s[s.rfind(')') + 2];
  };
  auto wait_for = [&](auto pred) {
    for (int i = 0; i < 500 && !pred(); ++i) ::usleep(10000);
    return pred();
  };
  // running (once the prctl has happened): seen
  EXPECT_TRUE(wait_for([&] { return sm::process_running({name}); }));
  EXPECT_FALSE(sm::process_running({name + "x"}));
  ::close(go[1]);  // the child exits and, unreaped, stays a zombie
  ASSERT_TRUE(wait_for([&] { return state() == 'Z'; }));
  EXPECT_FALSE(sm::process_running({name}));
  sm::reap_orphans();
  EXPECT_EQ(state(), '?');
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, WNOHANG), -1);  // already reaped
}
