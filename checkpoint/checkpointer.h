// Checkpoints of a training run: every rank writes its own shard file, in the background, and
// rank 0 commits the step (the manifest) once every file is in place.
//
//   save(step)   at a step boundary, on every rank: waits for a checkpoint still in flight
//                (at most one), copies this rank's shards into a host staging image and hands
//                it to a background thread that writes or uploads it (and, on rank 0,
//                config.json and state.json), with retries.
//   poll()       at every later step boundary, on every rank: when every rank's writes are
//                done, rank 0 writes the manifest (the commit) and applies `keep`.
//   finish()     waits for and commits what is in flight (end of run, signals).
// Every call is collective: all ranks call them at the same step boundaries. A write that
// still fails after its retries is a StorageError (exit 3) on every rank, never dropped.
// With async = false, save() itself waits and commits: the loop stalls for the whole write.
#pragma once
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/sharded.h"
#include "checkpoint/storage.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/communicator.h"
#include "parallel/fsdp.h"
#include "precision/recipe.h"

namespace mx {

struct CheckpointerOptions {
  std::string root;      // local directory or s3://bucket/prefix
  int64_t keep = 0;      // committed steps to keep (0: all)
  bool async = true;
  int max_attempts = 4;  // whole-file attempts, on top of the S3 client's per-request retries
  std::string sharding = "full";
  // Rank 0: this run's claim on the root (CheckpointStore::claim_writer, made by the caller
  // before it chose a step to resume from), checked before each checkpoint's writes, its
  // commit and its retention; empty: no checks.
  std::string claim;
};

// This run as a checkpoint root's writer: a random id, the host, the pid and the start time,
// as JSON (CheckpointStore::claim_writer).
std::string writer_claim();

// This rank's view of FSDP's shards, as the checkpoint format reads and writes them.
ShardView fsdp_shard_view(const Fsdp& fsdp, const ParamLayout& layout);

// An extra float tensor a rank stores in its file (recipe state).
struct ExtraTensor {
  std::string name;
  std::vector<float> values;
};

class Checkpointer {
 public:
  Checkpointer(const CheckpointerOptions& options, Communicator& world, Fsdp& fsdp,
               const ModelConfig& config, const ParamLayout& layout);
  ~Checkpointer();  // waits for the background thread; commits nothing

  // Collective. `state` is the training state (rank 0's is written); `extra` this rank's.
  void save(int64_t step, const nlohmann::json& state, std::vector<ExtraTensor> extra);
  void poll();
  void finish();
  // Waits for this rank's background write, if one is under way (not collective): storage's
  // own time, which the trainer's hang watchdog leaves unbounded, apart from save's
  // collectives (the commit's agreement, S3's barrier), which it bounds. Counted as stall.
  void wait_written();

  bool in_flight() const { return in_flight_step_ >= 0; }
  std::string last_committed() const { return last_committed_; }
  // Seconds the training loop spent inside save / poll / finish (what async did not hide), and
  // seconds the background writes took.
  double stall_seconds() const { return stall_s_; }
  double write_seconds() const { return write_s_; }
  int64_t staging_bytes() const { return int64_t(staging_.capacity()); }
  CheckpointStore& store() { return *store_; }

 private:
  void commit();
  void join();

  CheckpointerOptions opt_;
  Communicator& world_;
  Fsdp& fsdp_;
  ModelConfig config_;
  const ParamLayout& layout_;
  std::unique_ptr<CheckpointStore> store_;
  ShardView view_;
  bool writer_ = false;  // replica 0 of its shard: writes a file
  HostBuffer staging_;  // this rank's file image, reused from one checkpoint to the next
  std::string config_text_, state_text_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::vector<FileRecord> records_;  // this rank's written files
  std::string error_;
  bool error_is_config_ = false;  // error_ came from a UserError (credentials, bucket, region)
  int64_t in_flight_step_ = -1;
  double stall_s_ = 0, write_s_ = 0;
  std::string last_committed_;
};

// Recipe state <-> extra tensors: "recipe.delayed.<layer>.<linear>.<op>" holds the scale then
// the amax history. A resumed rank takes the state of the file of its shard rank (modulo the
// checkpoint's shard count); ranks that only replicate a shard get their writer's state.
// Refused (UserError naming the file and tensor): a name of the family that is no operand of a
// model of num_layers blocks, a scale without a finite reciprocal, an amax not finite and >= 0.
std::vector<ExtraTensor> recipe_extra_tensors(const LinearRecipe& recipe);
int64_t restore_recipe_state(LinearRecipe& recipe, CheckpointReader& reader, int shard_rank,
                             int64_t num_layers);

}  // namespace mx
