// FSDP: each rank holds 1/S of every unit's fp32 master weights, gradients and AdamW moments
// (S = the shard group's size), gathers a unit's weights just before the model uses it and
// reduce-scatters the unit's gradients as soon as its backward is done (PyTorch FSDP's
// FULL_SHARD / ZeRO-3). Strategies (parallel.sharding):
//   full     shard over all ranks; weights gathered for forward, freed, gathered again for backward
//   grad-op  shard over all ranks; weights gathered in forward are kept through backward (ZeRO-2)
//   none     every rank holds everything (DDP): gradients all-reduced once per step
//   hybrid   shard within groups of parallel.shard_group ranks, replicate across groups (HSDP):
//            reduce-scatter within the group, then all-reduce the shard across groups
// One process is the degenerate case S = 1: the shards are the whole units, nothing moves.
//
// Gathers of the next unit are started while the current one computes (forward ascending,
// backward descending), and a unit's gradient reduce-scatter runs while the next unit's
// backward computes. Every buffer comes from arenas on the engine's MemoryTracker.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "model/llama.h"
#include "model/params.h"
#include "parallel/communicator.h"
#include "parallel/shard.h"

namespace mx {

enum class Sharding { kFull, kGradOp, kNone, kHybrid };
struct ExactExchange;  // parallel/fsdp_sizes.h
Sharding parse_sharding(const std::string& s);  // UserError for unknown names

struct FsdpOptions {
  Sharding sharding = Sharding::kFull;
  int shard_group = 0;  // hybrid: ranks per shard group
  // bf16 gathers (parallel.gather_dtype): block units travel as bf16 codes of the master
  // weights (half the bytes of fp32 gathers and slots), their RMSNorm weights exactly beside
  // them (fsdp_sizes.h: ExactExchange); the model reads them through block_codes(). Only for a
  // model whose every block runs on native bf16 GEMMs (LlamaModel's bf16 path, recipe bf16):
  // they round the weights to bf16 anyway, so the values are the same. With one shard nothing
  // is gathered: the block units' codes are kept resident instead (resident_codes()).
  bool bf16_blocks = false;
};

class Fsdp final : public UnitAccess {
 public:
  Fsdp(const ParamLayout& layout, Communicator& world, const FsdpOptions& options,
       Backend& backend, MemoryTracker* tracker);
  ~Fsdp() override;

  // UnitAccess, called by the model.
  const float* acquire(int unit, bool backward) override;
  void release(int unit, bool backward) override;
  float* grads(int unit) override;
  void grads_ready(int unit) override;
  BlockCodes block_codes(int unit) override;
  // Changes with every write of the master weights this class makes or hands out a pointer
  // for (adamw_step, scatter_params, shards_on_host, write_shards_from_host, master_shard);
  // drawn from one process-wide count, so no two instances share a value.
  int64_t weights_version() const override { return weights_version_; }
  bool bf16_blocks() const { return bf16_blocks_; }
  // bf16_blocks with one shard: every block unit's bf16 codes kept beside the master weights,
  // written by AdamW in its own pass (Backend::adamw's codes) and remade from the master weights
  // after anything else writes them (init, a checkpoint load); acquire() of a block unit then
  // returns null and block_codes() gives them, so the bf16 GEMMs read codes instead of rounding
  // each block weight at every use (twice a step, three times with recompute).
  bool resident_codes() const { return resident_codes_; }
  int64_t resident_code_bytes() const;

  // After a forward (or forward+backward) of one micro-batch: every gather and reduce-scatter
  // complete, every gathered buffer free.
  void finish_micro_batch();
  // After the last micro-batch of a step: gradient shards summed over all ranks (each rank's
  // are its share of the global mean: the model's grad_scale carries 1 / ranks). Returns the
  // global L2 norm of the gradient (before clipping).
  double reduce_gradients_and_norm();
  void zero_grads();
  // AdamW on this rank's shards; weight decay only on the tensors the layout marks. The
  // gradients are taken times grad_scale (clipping's factor; Backend::adamw), left unchanged.
  void adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                  int64_t t, float grad_scale = 1.0f);

  // Whole-model views, for init, checkpoints and generation: full flat buffers in the layout's
  // order. scatter_* keep this rank's shard of a full buffer (every rank passes the same one);
  // gather_* fill a full buffer on every rank.
  void scatter_params(const float* full);
  void scatter_moments(const float* full_m, const float* full_v);
  void gather_params(float* full);
  void gather_moments(float* full_m, float* full_v);

  // This rank's three state shards (master, exp_avg, exp_avg_sq) as host memory, for the
  // checkpoint writer and reader. On a host-addressable backend they are the shards themselves;
  // otherwise (CUDA, or MXTRAIN_TEST_STAGING=1) host copies that Fsdp keeps:
  // read_shards_to_host() fills them from the shards (before a save), write_shards_from_host()
  // puts them back (after a load into shards_on_host()).
  struct HostShards {
    float *master = nullptr, *m = nullptr, *v = nullptr;
  };
  HostShards shards_on_host();
  HostShards read_shards_to_host();
  void write_shards_from_host(const HostShards& h);

  // For sharded checkpoints: this rank's flat shards (local_numel() floats each, laid out unit
  // after unit as unit_shards() / unit_local_offsets() say; padding is zero). In the backend's
  // memory: host code goes through the calls above. (A caller may write the master weights
  // through master_shard(): the resident codes are remade before their next use.)
  float* master_shard() {
    weights_changed();
    return master_base_;
  }
  float* exp_avg_shard() { return m_base_; }
  float* exp_avg_sq_shard() { return v_base_; }
  const std::vector<ShardLayout>& unit_shards() const { return shards_; }
  const std::vector<int64_t>& unit_local_offsets() const { return unit_local_offset_; }
  int shard_rank() const { return shard_comm_->rank(); }
  int replica_rank() const { return replica_comm_->rank(); }

  int shard_size() const { return shard_comm_->size(); }
  int replica_size() const { return replica_comm_->size(); }
  int64_t local_numel() const { return local_numel_; }  // this rank's shard elements (padded)
  // Bytes of this rank's master weights + gradients + AdamW moments (its shards), and of the
  // full-unit buffers that exist only while a unit is in use (gathered weights, unit gradients).
  int64_t state_bytes() const;
  int64_t transient_bytes() const;
  // Seconds spent blocked in communication (gathers, reduce-scatters, the gradient all-reduce
  // and norm) since construction: what overlap did not hide.
  double comm_wait_seconds() const { return comm_wait_s_; }

 private:
  struct Slot;
  Slot* free_slot(std::vector<Slot>& pool, size_t bytes);
  Slot* take_slot(std::vector<Slot>& pool, int unit, size_t bytes);
  bool code_unit(int unit) const;  // a block unit gathered as bf16 codes
  Slot* find_slot(std::vector<Slot>& pool, int unit);
  void start_gather(int unit);
  void complete_reduce_scatter();
  void gather_state(const float* local, float* full);
  bool resident_unit(int unit) const {
    return resident_codes_ && unit_codes_[size_t(unit)] != nullptr;
  }
  void refresh_codes();  // the resident codes from the master weights, where stale
  // The master weights were (or may be about to be) written: weights_version() moves on (so
  // the resident codes, made from an earlier version, are stale).
  void weights_changed();
  float* shard_of(float* base, int unit) const { return base + unit_local_offset_[unit]; }

  const ParamLayout& layout_;
  Communicator& world_;
  Backend& be_;
  FsdpOptions options_;
  std::unique_ptr<Communicator> shard_comm_owned_, replica_comm_owned_;
  Communicator* shard_comm_ = nullptr;
  Communicator* replica_comm_ = nullptr;
  std::vector<ShardLayout> shards_;        // per unit, over the shard group
  std::vector<int64_t> unit_local_offset_;  // per unit, into the local shard buffers
  int64_t local_numel_ = 0;
  bool bf16_blocks_ = false;
  std::vector<size_t> unit_bytes_;           // a unit's gathered weights (S > 1)
  std::vector<ExactExchange> exchange_;      // bf16 block units' exact exchange (else empty)
  bool resident_codes_ = false;
  int64_t weights_version_ = 0;  // weights_version(); set by the constructor
  int64_t codes_version_ = -1;   // the weights_version the resident codes were made from
  std::unique_ptr<Arena> codes_;             // resident codes (block units; null elsewhere)
  std::vector<uint16_t*> unit_codes_;
  std::vector<std::array<int64_t, 2>> norm_at_;  // a block unit's two RMSNorm weights
  std::unique_ptr<Arena> master_, grad_shards_, m_, v_, gathered_, unit_grads_, rs_out_;
  float *master_base_ = nullptr, *grad_base_ = nullptr, *m_base_ = nullptr, *v_base_ = nullptr;
  std::vector<Slot> param_slots_, grad_slots_;
  float* rs_buffer_ = nullptr;
  struct PendingReduce;
  std::unique_ptr<PendingReduce> pending_rs_;
  double comm_wait_s_ = 0;
  std::vector<float> host_master_, host_m_, host_v_;  // shards_on_host() when staged
};

}  // namespace mx
