#include "checkpoint/checkpointer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <thread>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random_id.h"
#include "model/hf_config.h"

namespace mx {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Writes one file, retrying the whole file with exponential backoff: a storage hiccup the S3
// client's own per-request retries did not absorb (or a local write error) gets more chances
// before the run fails.
FileRecord write_with_retries(CheckpointStore& store, int64_t step, const std::string& name,
                              const void* data, size_t size, int attempts) {
  const uint32_t crc = crc32c(data, size);
  for (int attempt = 1;; ++attempt) {
    try {
      StoredFile f = store.write_file(step, name, data, size);
      return {name, f.size, crc, f.etag};
    } catch (const UserError&) {
      throw;  // configuration (credentials, bucket): retrying will not help
    } catch (const std::exception& e) {
      if (attempt >= attempts)
        throw StorageError(str("checkpoint ", store.step_location(step), "/", name, ": ",
                               e.what(), " (", attempts, attempts == 1 ? " attempt" : " attempts",
                               " at the whole file)"));
      warn(str("checkpoint ", store.step_location(step), "/", name, ": ", e.what(),
               "; retrying (attempt ", attempt + 1, " of ", attempts, ")"));
      std::this_thread::sleep_for(std::chrono::milliseconds(250 << std::min(attempt, 6)));
    }
  }
}
}  // namespace

std::string writer_claim() {
  const std::string id = random_hex_id(4);
  char host[256] = "";
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::time_t now = std::time(nullptr);
  char started[32] = "";
  std::tm utc{};
  if (gmtime_r(&now, &utc)) std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return nlohmann::json{{"run", id}, {"host", host}, {"pid", int64_t(::getpid())},
                        {"started", started}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // (any host name)
}

Checkpointer::Checkpointer(const CheckpointerOptions& options, Communicator& world, Fsdp& fsdp,
                           const ModelConfig& config, const ParamLayout& layout)
    : opt_(options), world_(world), fsdp_(fsdp), config_(config), layout_(layout) {
  MX_REQUIRE(opt_.max_attempts >= 1, "checkpoint write attempts must be at least 1");
  store_ = open_checkpoint_store(opt_.root);
  view_ = fsdp_shard_view(fsdp, layout_);
  writer_ = fsdp.replica_rank() == 0;
  config_text_ = hf_config_text(config_);
  // The staging image is allocated and its pages touched now, not inside the first checkpoint:
  // three fp32 states of the local shard, plus room for the header and recipe state.
  if (writer_) staging_.reserve(3 * sizeof(float) * size_t(view_.local_numel()) + (4u << 20));
  // This run names itself the root's writer (S3), then what writers that died left behind
  // goes, before anything new is written.
  if (world_.rank() == 0) {
    store_->check_writer(opt_.claim);  // (claimed before the resume: still this run's)
    store_->remove_uncommitted();
  }
  if (world_.size() > 1) world_.barrier();
}

Checkpointer::~Checkpointer() { join(); }

void Checkpointer::join() {
  if (thread_.joinable()) thread_.join();
}

void Checkpointer::wait_written() {
  if (!thread_.joinable()) return;
  const auto t0 = Clock::now();
  join();
  stall_s_ += seconds_since(t0);
}

void Checkpointer::save(int64_t step, const nlohmann::json& state,
                        std::vector<ExtraTensor> extra) {
  const auto t0 = Clock::now();
  if (in_flight_step_ >= 0) commit();  // at most one in flight
  // Another run on this S3 prefix since: no more files written among its steps, by any rank
  // (the others wait for rank 0's check; a failed one ends the job from rank 0).
  if (world_.rank() == 0) store_->check_writer(opt_.claim);
  if (world_.size() > 1 && store_->is_s3()) world_.barrier();
  std::vector<TensorBytes> extra_bytes;
  for (const auto& e : extra)
    extra_bytes.push_back({e.name, "F32", {int64_t(e.values.size())}, e.values.data(),
                           e.values.size() * sizeof(float)});
  if (writer_) {
    // The shards live in the backend's memory: staged to the host first on a GPU.
    const Fsdp::HostShards h = fsdp_.read_shards_to_host();
    build_rank_file(view_, h.master, h.m, h.v, extra_bytes, staging_);
  }
  nlohmann::json s = state;
  s["format_version"] = kCheckpointFormatVersion;
  s["step"] = step;
  state_text_ = s.dump(2) + "\n";
  in_flight_step_ = step;
  done_ = false;
  records_.clear();
  error_.clear();
  error_is_config_ = false;
  const bool lead = world_.rank() == 0;
  const std::string file = rank_file_name(view_.shard_rank, view_.shard_size());
  thread_ = std::thread([this, step, lead, file] {
    // Below the compute threads: on a machine with few cores the writer takes idle time
    // instead of slowing the step down (Linux: nice applies per thread).
    ::setpriority(PRIO_PROCESS, pid_t(::syscall(SYS_gettid)), 10);
    const auto tw = Clock::now();
    try {
      if (writer_)
        records_.push_back(write_with_retries(*store_, step, file, staging_.data(),
                                              staging_.size(), opt_.max_attempts));
      if (lead) {
        records_.push_back(write_with_retries(*store_, step, "config.json", config_text_.data(),
                                              config_text_.size(), opt_.max_attempts));
        records_.push_back(write_with_retries(*store_, step, "state.json", state_text_.data(),
                                              state_text_.size(), opt_.max_attempts));
      }
    } catch (const std::exception& e) {
      error_ = e.what();
      if (error_.empty()) error_ = "unknown error";
      // a refusal only configuration can fix (403, a missing bucket): exit 2, as elsewhere
      error_is_config_ = dynamic_cast<const UserError*>(&e) != nullptr;
    }
    write_s_ += seconds_since(tw);
    done_ = true;
  });
  if (!opt_.async) commit();
  stall_s_ += seconds_since(t0);
}

void Checkpointer::poll() {
  if (in_flight_step_ < 0) return;
  const auto t0 = Clock::now();
  int64_t not_done = done_ ? 0 : 1;
  if (world_.size() > 1) not_done = world_.all_reduce(not_done, ReduceOp::kMax);
  if (!not_done) commit();
  stall_s_ += seconds_since(t0);
}

void Checkpointer::finish() {
  if (in_flight_step_ < 0) return;
  const auto t0 = Clock::now();
  commit();
  stall_s_ += seconds_since(t0);
}

void Checkpointer::commit() {
  join();
  const int64_t step = in_flight_step_;
  in_flight_step_ = -1;
  const int W = world_.size();
  // Every rank learns whether any write failed: all fail together, none deadlocks.
  // The lowest rank that failed reports its own cause and ends the job (abort_all); the others
  // wait to be ended by it. When each rank threw, "another rank could not write its file" from
  // rank 0 often came first, and the cause was one line among W.
  int64_t first_failed = error_.empty() ? -int64_t(W) : -int64_t(world_.rank());
  if (W > 1) first_failed = world_.all_reduce(first_failed, ReduceOp::kMax);
  first_failed = -first_failed;
  if (first_failed < W) {
    if (W > 1 && first_failed != world_.rank()) {
      // (ended within a second or two by the reporting rank's MPI_Abort; a fallback line if not)
      std::this_thread::sleep_for(std::chrono::seconds(60));
      throw StorageError(str("checkpoint ", store_->step_location(step), ": rank ",
                             first_failed, " could not write its file"));
    }
    if (error_is_config_) throw UserError(error_);
    throw StorageError(error_);
  }
  // Rank 0 collects every writer's shard rank, file size and CRC32C (-1: not a writer).
  int64_t mine[3] = {-1, -1, -1};
  for (const auto& r : records_)
    if (r.name.rfind("rank_", 0) == 0) {
      mine[0] = view_.shard_rank;
      mine[1] = int64_t(r.size);
      mine[2] = int64_t(r.crc32c);
    }
  std::vector<int64_t> all(size_t(3 * W));
  if (W > 1) world_.all_gather(mine, all.data(), 3, CommDtype::kI64);
  else std::copy(mine, mine + 3, all.begin());
  if (world_.rank() != 0) return;

  const int S = view_.shard_size();
  std::vector<FileRecord> files(static_cast<size_t>(S));
  std::vector<bool> seen(static_cast<size_t>(S), false);
  for (int r = 0; r < W; ++r) {
    const int64_t shard = all[size_t(3 * r)];
    if (shard < 0) continue;
    MX_ASSERT(shard < S && !seen[size_t(shard)], "checkpoint: two writers of shard ", shard);
    seen[size_t(shard)] = true;
    files[size_t(shard)] = {rank_file_name(int(shard), S), uint64_t(all[size_t(3 * r + 1)]),
                            uint32_t(all[size_t(3 * r + 2)]), ""};
  }
  for (int s = 0; s < S; ++s)
    MX_ASSERT(seen[size_t(s)], "checkpoint: nobody wrote shard ", s);
  for (const auto& r : records_)
    if (r.name.rfind("rank_", 0) != 0) files.push_back(r);
  // Taken over since this checkpoint began (the other run's start removed this step's files
  // as a dead writer's): said as that, not as a missing file.
  store_->check_writer(opt_.claim);
  if (store_->is_s3()) {
    // ETags as S3 reports them, so a quick verify can tell a replaced object without reading.
    for (auto& f : files) {
      auto st = store_->stat(step, f.name);
      if (!st || st->size != f.size)
        throw StorageError(str("checkpoint ", store_->step_location(step), "/", f.name,
                               " is missing or has the wrong size after upload"));
      f.etag = st->etag;
    }
  }
  ManifestInfo info;
  info.step = step;
  info.world_size = W;
  info.sharding = opt_.sharding;
  info.shard_size = S;
  info.has_optimizer = true;
  store_->check_writer(opt_.claim);  // (another run on this S3 prefix since: StorageError)
  store_->commit(step, build_manifest(info, config_, layout_, files));
  last_committed_ = store_->step_location(step);
  store_->check_writer(opt_.claim);  // (nor delete among another run's steps)
  prune_checkpoints(*store_, opt_.keep, step);
}

ShardView fsdp_shard_view(const Fsdp& fsdp, const ParamLayout& layout) {
  ShardView view;
  view.layout = &layout;
  view.units = fsdp.unit_shards();
  view.local_offset = fsdp.unit_local_offsets();
  view.shard_rank = fsdp.shard_rank();
  return view;
}

std::vector<ExtraTensor> recipe_extra_tensors(const LinearRecipe& recipe) {
  std::vector<ExtraTensor> out;
  for (const auto& st : recipe.delayed_state()) {
    ExtraTensor e;
    e.name = str("recipe.delayed.", st.layer, ".", st.linear, ".", st.op);
    e.values.push_back(st.scale);
    e.values.insert(e.values.end(), st.amax_history.begin(), st.amax_history.end());
    out.push_back(std::move(e));
  }
  return out;
}

int64_t restore_recipe_state(LinearRecipe& recipe, CheckpointReader& reader, int shard_rank,
                             int64_t num_layers) {
  const int file_rank = shard_rank % reader.shard_size();
  const std::string file = reader.location() + "/" + rank_file_name(file_rank, reader.shard_size());
  std::vector<LinearRecipe::DelayedState> states;
  for (const std::string& name : reader.extra_names(file_rank)) {
    if (name.rfind("recipe.delayed.", 0) != 0) continue;
    const auto values = reader.read_extra(file_rank, name);
    LinearRecipe::DelayedState st;
    int64_t layer = 0;
    const std::string why = delayed_state_problem(name, values ? &*values : nullptr, num_layers,
                                                  &layer, &st.linear, &st.op);
    MX_REQUIRE(why.empty(), file, ": ", why);
    st.layer = layer;
    st.scale = (*values)[0];
    st.amax_history.assign(values->begin() + 1, values->end());
    states.push_back(std::move(st));
  }
  // (delayed_state_problem checked what restore requires)
  return recipe.restore_delayed_state(states);
}

}  // namespace mx
