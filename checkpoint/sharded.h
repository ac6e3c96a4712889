// The checkpoint format (version 2): one safetensors file per shard rank with that rank's flat
// shards of the fp32 master weights and AdamW moments, plus config.json, state.json and the
// manifest. Resuming on another number of processes reads, for each new shard, the pieces of
// the old shards that overlap it (see parallel/shard.h), straight from the files.
//
//   step_00000100/rank_00000-of-00002.safetensors   master.<unit>, exp_avg.<unit>,
//                                                   exp_avg_sq.<unit> (F32, the rank's real
//                                                   elements of that unit, padding left out)
//                                                   and per-rank recipe state (amax histories)
//                 rank_00001-of-00002.safetensors
//                 config.json                       the model (Hugging Face LlamaConfig)
//                 state.json                        step, data position, seed, world size
//                 manifest.json                     the commit; see docs/checkpoints.md
//
// Units are FSDP's: 0 = embedding, 1 + l = block l, last = head (and final norm); a unit's
// tensors are contiguous in its flat buffer in the layout's order. With S shard ranks, unit u of
// numel N is split as parallel/shard.h says (shard_numel = ceil(N / S)); the manifest records
// every unit's tensors (name, offset, global shape) and every file's slice of every unit.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/storage.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/shard.h"

namespace mx {

inline constexpr int kCheckpointFormatVersion = 2;

// One rank's view of the sharded state: how every unit is split and where this rank's shard of
// each unit starts in its flat shard buffers (master, exp_avg, exp_avg_sq alike).
struct ShardView {
  const ParamLayout* layout = nullptr;
  std::vector<ShardLayout> units;
  std::vector<int64_t> local_offset;
  int shard_rank = 0;
  int shard_size() const { return units.empty() ? 1 : units[0].world_size; }
  int64_t local_numel() const;
};
// The whole model as one shard (export, generation): local offsets are the layout's.
ShardView whole_model_view(const ParamLayout& layout);
// How `shard_size` ranks split `layout` (align 1, as FSDP does), seen from `shard_rank`.
ShardView shard_view(const ParamLayout& layout, int shard_size, int shard_rank);

std::string rank_file_name(int shard_rank, int shard_size);  // rank_00000-of-00002.safetensors

enum class StateKind { kMaster, kExpAvg, kExpAvgSq };
std::string state_tensor_name(StateKind kind, const std::string& unit_name);

// This rank's file image into `out`: its real elements of every unit of the three states, then
// `extra` tensors (recipe state). m / v may be null (weights only).
void build_rank_file(const ShardView& view, const float* master, const float* m, const float* v,
                     const std::vector<TensorBytes>& extra, HostBuffer& out);

struct FileRecord {
  std::string name;
  uint64_t size = 0;
  uint32_t crc32c = 0;
  std::string etag;  // S3 only
};

struct ManifestInfo {
  int64_t step = 0;
  int world_size = 1;
  std::string sharding = "none";
  int shard_size = 1;
  bool has_optimizer = true;
};
std::string build_manifest(const ManifestInfo& info, const ModelConfig& config,
                           const ParamLayout& layout, const std::vector<FileRecord>& files);

// A committed step opened for reading: the manifest parsed and checked against itself (names
// are plain file names; every unit's slices tile it exactly) before anything else is read.
class CheckpointReader {
 public:
  CheckpointReader(CheckpointStore& store, int64_t step);
  ~CheckpointReader();
  int64_t step() const { return step_; }
  std::string location() const { return store_.step_location(step_); }
  const nlohmann::json& manifest() const { return manifest_; }
  ModelConfig model_config() const;
  nlohmann::json state() const;  // state.json
  int shard_size() const { return shard_size_; }
  int world_size() const;
  bool has_optimizer() const { return has_optimizer_; }

  // UserError unless `layout` has the checkpoint's units, in size and tensor names.
  void check_layout(const ParamLayout& layout) const;
  // Elements [begin, end) of unit `unit`'s `kind` into dst.
  void read(int unit, StateKind kind, int64_t begin, int64_t end, float* dst);
  // A rank's extra tensor (F32), or nullopt if that file does not hold it.
  std::optional<std::vector<float>> read_extra(int shard_rank, const std::string& name);
  // The extra tensor names of a rank's file.
  std::vector<std::string> extra_names(int shard_rank);
  // A rank file's parsed header (read and checked on first use).
  const SafeTensorsIndex& index(int shard_rank);

 private:
  struct OpenFile;
  OpenFile& file(int shard_rank);

  CheckpointStore& store_;
  int64_t step_;
  nlohmann::json manifest_;
  int shard_size_ = 1;
  bool has_optimizer_ = true;
  std::vector<std::string> unit_names_;
  std::vector<ShardLayout> units_;
  std::vector<std::unique_ptr<OpenFile>> files_;
};

// Fills this view's shards (padding zeroed) from a checkpoint of any shard count. m / v may be
// null; when given, the checkpoint must hold the optimizer state. A line every 10 s while it
// reads; `stoppable` (the trainer's start-up): throws StopRequested (core/stop.h) between
// tensors once a stop is asked for.
void load_shards(CheckpointReader& reader, const ShardView& view, float* master, float* m,
                 float* v, bool stoppable = false);

// fp8-delayed's state in a rank file: "recipe.delayed.LAYER.LINEAR.OPERAND" holds the scale
// then the amax history. Returns "" or why the tensor `name` (with `values`, null if absent)
// cannot be restored into a model of num_layers blocks: a name of the family that is no
// operand of its Linears, fewer than 2 values, a scale without a finite reciprocal, an amax
// not finite and >= 0. Parsed into `layer`, `linear`, `op` when given. Names outside the
// family: "" (not recipe state).
std::string delayed_state_problem(const std::string& name, const std::vector<float>* values,
                                  int64_t num_layers, int64_t* layer = nullptr,
                                  int* linear = nullptr, int* op = nullptr);

// Checks a committed step: the manifest (format, plain file names, slices), every file's size
// (and ETag on S3) against it, each rank file's safetensors header and tensors; and every
// file's CRC32C when `read_all` (always for local stores: reading is cheap there), and then
// every value as loading checks it (finite; second moments >= 0; delayed_state_problem). Returns ""
// when it verifies, else one line naming the bad file and the problem. A StorageError (the store
// unreachable or failing after its retries) propagates: it says nothing about the checkpoint.
std::string verify_checkpoint(CheckpointStore& store, int64_t step, bool read_all);

// The newest committed step that verifies (-1 if none); each newer one that does not is
// reported with warn() when `report`.
int64_t latest_verified_step(CheckpointStore& store, bool report, bool read_all = false);

// Deletes all but the newest `keep` committed steps up to `newest`, the step just committed
// (keep <= 0: none). Steps above it are left alone and not counted: a junk or corrupt step
// with a higher number (skipped by resume = auto) made retention delete every good step,
// the one just committed included.
void prune_checkpoints(CheckpointStore& store, int64_t keep, int64_t newest);

// A CHECKPOINT argument (a step location, or a root meaning its newest committed step) opened
// and verified: UserError naming the bad file otherwise.
struct ResolvedCheckpoint {
  std::unique_ptr<CheckpointStore> store;
  int64_t step = -1;
};
ResolvedCheckpoint resolve_checkpoint(const std::string& location, bool read_all = false);

// Reads a whole model's fp32 weights (layout order) from a checkpoint location.
ModelConfig load_checkpoint_weights(const std::string& location, std::vector<float>& params,
                                    std::string* step_location = nullptr);

}  // namespace mx
