#include "parallel/fsdp.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "parallel/fsdp_sizes.h"
#include "parallel/groups.h"
#include "parallel/single_process_communicator.h"

namespace mx {

namespace {
// Adds the wall time of a blocking communication call to a counter: the communication the
// compute did not hide (the training loop reports it next to the step time).
class CommTimer {
 public:
  explicit CommTimer(double& total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~CommTimer() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point t0_;
};
}  // namespace

Sharding parse_sharding(const std::string& s) {
  if (s == "full") return Sharding::kFull;
  if (s == "grad-op") return Sharding::kGradOp;
  if (s == "none") return Sharding::kNone;
  if (s == "hybrid") return Sharding::kHybrid;
  throw UserError(str("parallel.sharding must be full, grad-op, none or hybrid (got '", s, "')"));
}

// A full-unit buffer: gathered weights or a unit's gradient before its reduce-scatter. A block
// unit gathered as bf16 codes holds, one after the other (each 64-byte rounded): the codes
// (padded_numel), the exact exchange's all-gather (S x per_rank fp32) and the assembled
// RMSNorm weights (numel fp32).
struct Fsdp::Slot {
  int unit = -1;  // -1: free
  float* buf = nullptr;
  size_t bytes = 0;   // capacity
  CommHandle gather;  // pending all-gather into buf
  CommHandle exact;   // bf16 block unit: pending all-gather of the exact exchange
  uint16_t* codes() const { return reinterpret_cast<uint16_t*>(buf); }
  float* exchange(const ShardLayout& sl) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(buf) +
                                    Arena::round_up(sizeof(uint16_t) * size_t(sl.padded_numel)));
  }
  float* assembled(const ShardLayout& sl, const ExactExchange& x) const {
    return exchange(sl) + Arena::round_up(sizeof(float) * size_t(sl.world_size * x.per_rank)) /
                              sizeof(float);
  }
};

struct Fsdp::PendingReduce {
  int unit = -1;
  Slot* slot = nullptr;
  CommHandle handle;
};

Fsdp::Fsdp(const ParamLayout& layout, Communicator& world, const FsdpOptions& options,
           Backend& backend, MemoryTracker* tracker)
    : layout_(layout), world_(world), be_(backend), options_(options),
      pending_rs_(std::make_unique<PendingReduce>()) {
  weights_changed();  // (a version of its own: no other instance's)
  switch (options.sharding) {
    case Sharding::kFull:
    case Sharding::kGradOp:
      shard_comm_ = &world;
      replica_comm_owned_ = std::make_unique<SingleProcessCommunicator>();
      replica_comm_ = replica_comm_owned_.get();
      break;
    case Sharding::kNone:
      shard_comm_owned_ = std::make_unique<SingleProcessCommunicator>();
      shard_comm_ = shard_comm_owned_.get();
      replica_comm_ = &world;
      break;
    case Sharding::kHybrid: {
      int group = options.shard_group > 0 ? options.shard_group : world.size();
      HybridGroups g = make_hybrid_groups(world, group);
      shard_comm_owned_ = std::move(g.shard);
      replica_comm_owned_ = std::move(g.replica);
      shard_comm_ = shard_comm_owned_.get();
      replica_comm_ = replica_comm_owned_.get();
      break;
    }
  }
  const int S = shard_comm_->size();
  // Every size below comes from fsdp_buffer_sizes, which `mxtrain plan` adds up too.
  const FsdpBufferSizes z = fsdp_buffer_sizes(layout, S, options.sharding, options.bf16_blocks);
  bf16_blocks_ = z.bf16_blocks;
  unit_bytes_ = z.unit_bytes;
  exchange_.resize(layout.units().size());
  if (bf16_blocks_)
    for (int u = 0; u < int(layout.units().size()); ++u)
      if (u != layout.embed_unit() && u != layout.head_unit())
        exchange_[size_t(u)] = exact_exchange(layout, u, S);
  for (const ParamUnit& u : layout.units()) {
    shards_.push_back(make_shard_layout(u.numel, S));
    unit_local_offset_.push_back(local_numel_);
    local_numel_ += shards_.back().shard_numel;
  }
  MX_ASSERT(local_numel_ == z.local_numel, "fsdp_buffer_sizes disagrees with the shards");
  auto state = [&](const char* name, float** base) {
    auto a = std::make_unique<Arena>(name, z.state_bytes, tracker, backend.memory());
    *base = a->alloc_f32_zero(local_numel_);
    return a;
  };
  master_ = state("master_weights", &master_base_);
  grad_shards_ = state("gradients", &grad_base_);
  m_ = state("adam_m", &m_base_);
  v_ = state("adam_v", &v_base_);
  resident_codes_ = z.resident_codes;
  if (resident_codes_) {
    codes_ = std::make_unique<Arena>("bf16_block_codes", z.resident_code_bytes, tracker,
                                     backend.memory());
    unit_codes_.assign(layout.units().size(), nullptr);
    norm_at_.resize(layout.units().size());
    for (int u = 0; u < int(layout.units().size()); ++u) {
      if (u == layout.embed_unit() || u == layout.head_unit()) continue;
      const ParamUnit& pu = layout.units()[size_t(u)];
      unit_codes_[size_t(u)] =
          static_cast<uint16_t*>(codes_->alloc(sizeof(uint16_t) * size_t(pu.numel)));
      size_t k = 0;  // the 1-D tensors, in the unit's order: input, post-attention norm
      for (int ti : pu.tensors) {
        const ParamTensor& t = layout.tensors()[size_t(ti)];
        if (t.shape.size() != 1) continue;
        MX_ASSERT(k < 2, "block unit ", u, " with more than two 1-D tensors");
        norm_at_[size_t(u)][k++] = t.offset - pu.offset;
      }
      MX_ASSERT(k == 2, "block unit ", u, " with ", k, " 1-D tensors");
    }
  }
  if (S > 1) {
    // grad-op keeps every unit's gathered weights from forward to backward; full needs the
    // unit in use, the prefetched next one and (tied heads) the embedding. Gradient slots:
    // the unit in backward, the one reduce-scattering, the embedding (tied).
    const int64_t max_padded = z.max_padded, max_shard = z.max_shard;
    const int param_slots = z.param_slots, grad_slots = z.grad_slots;
    MemoryResource* mem = backend.memory();
    gathered_ =
        std::make_unique<Arena>("fsdp_gathered_weights", z.gathered_bytes, tracker, mem);
    unit_grads_ = std::make_unique<Arena>("fsdp_unit_grads", z.unit_grad_bytes, tracker, mem);
    rs_out_ =
        std::make_unique<Arena>("fsdp_reduce_scatter", z.reduce_scatter_bytes, tracker, mem);
    // grad-op: slot u is the size of unit u (take_slot's best fit gives each unit one of its
    // size), so the kept weights are one padded copy of the model, not L + 2 of its largest
    // unit (a 128K-vocabulary head is 2.4x a Llama-3-8B block).
    // Otherwise one large slot and two of a block's size (fsdp_sizes.h says why that is enough).
    param_slots_.resize(param_slots);
    for (size_t i = 0; i < param_slots_.size(); ++i) {
      Slot& s = param_slots_[i];
      s.bytes = options_.sharding == Sharding::kGradOp ? z.unit_bytes[i]
                : i == 0                               ? z.weight_slot_bytes
                                                       : z.weight_block_slot_bytes;
      s.buf = static_cast<float*>(gathered_->alloc(s.bytes));
    }
    grad_slots_.resize(grad_slots);
    for (size_t i = 0; i < grad_slots_.size(); ++i) {
      grad_slots_[i].bytes = sizeof(float) * size_t(i == 0 ? max_padded : z.block_padded);
      grad_slots_[i].buf = unit_grads_->alloc_f32(int64_t(grad_slots_[i].bytes / sizeof(float)));
    }
    rs_buffer_ = rs_out_->alloc_f32(max_shard);
  }
}

Fsdp::~Fsdp() {
  // Never leave a collective in flight on buffers about to be freed.
  for (auto& s : param_slots_) {
    s.gather = CommHandle();
    s.exact = CommHandle();
  }
  pending_rs_->handle = CommHandle();
}

Fsdp::Slot* Fsdp::find_slot(std::vector<Slot>& pool, int unit) {
  for (auto& s : pool)
    if (s.unit == unit) return &s;
  return nullptr;
}

bool Fsdp::code_unit(int unit) const { return !exchange_[size_t(unit)].tensor_at.empty(); }

Fsdp::Slot* Fsdp::free_slot(std::vector<Slot>& pool, size_t bytes) {
  // The smallest free slot of at least `bytes` (all slots are one size except grad-op's).
  Slot* best = nullptr;
  for (auto& s : pool)
    if (s.unit < 0 && s.bytes >= bytes && (!best || s.bytes < best->bytes)) best = &s;
  return best;
}

Fsdp::Slot* Fsdp::take_slot(std::vector<Slot>& pool, int unit, size_t bytes) {
  Slot* s = free_slot(pool, bytes);
  if (s) s->unit = unit;
  return s;
}

void Fsdp::start_gather(int unit) {
  Slot* s = take_slot(param_slots_, unit, unit_bytes_[size_t(unit)]);
  MX_ASSERT(s, "no free FSDP weight slot for unit ", unit);
  const ShardLayout& sl = shards_[unit];
  const float* shard = shard_of(master_base_, unit);
  if (!code_unit(unit)) {
    s->gather = shard_comm_->all_gather_async(shard, s->buf, sl.shard_numel, CommDtype::kF32);
    return;
  }
  // bf16: this rank's shard rounded (RNE) into its place in the codes, gathered in place; the
  // pieces of the RMSNorm weights it holds packed into its place in the exchange, gathered too.
  const int r = shard_comm_->rank();
  uint16_t* mine = s->codes() + int64_t(r) * sl.shard_numel;
  be_.to_bf16(mine, shard, sl.shard_numel);
  s->gather = shard_comm_->all_gather_async(mine, s->codes(), sl.shard_numel, CommDtype::kBF16);
  const ExactExchange& x = exchange_[size_t(unit)];
  float* packed = s->exchange(sl);
  int64_t mine_n = 0;
  for (const ExactPiece& p : x.pieces)
    if (p.rank == r) {
      be_.copy(packed + r * x.per_rank + p.packed, shard + p.local, p.numel);
      mine_n += p.numel;
    }
  // the rest of this rank's share is padding: zeros, not whatever the slot held
  if (mine_n < x.per_rank) be_.fill(packed + r * x.per_rank + mine_n, 0.0f, x.per_rank - mine_n);
  s->exact = shard_comm_->all_gather_async(packed + r * x.per_rank, packed, x.per_rank,
                                           CommDtype::kF32);
}

void Fsdp::weights_changed() {
  static std::atomic<int64_t> versions{0};
  weights_version_ = ++versions;
}

void Fsdp::refresh_codes() {
  if (codes_version_ == weights_version_) return;
  for (size_t u = 0; u < unit_codes_.size(); ++u)
    if (unit_codes_[u])
      be_.to_bf16(unit_codes_[u], shard_of(master_base_, int(u)), layout_.units()[u].numel);
  codes_version_ = weights_version_;
}

const float* Fsdp::acquire(int unit, bool backward) {
  if (shard_comm_->size() == 1) {
    if (!resident_unit(unit)) return shard_of(master_base_, unit);
    refresh_codes();
    return nullptr;
  }
  Slot* s = find_slot(param_slots_, unit);
  if (!s) {
    start_gather(unit);
    s = find_slot(param_slots_, unit);
  }
  {
    CommTimer t(comm_wait_s_);
    s->gather.wait();
    s->exact.wait();
  }
  if (code_unit(unit)) {  // every piece of the RMSNorm weights into place
    const ShardLayout& sl = shards_[unit];
    const ExactExchange& x = exchange_[size_t(unit)];
    const float* packed = s->exchange(sl);
    float* to = s->assembled(sl, x);
    for (const ExactPiece& p : x.pieces)
      be_.copy(to + p.to, packed + p.rank * x.per_rank + p.packed, p.numel);
  }
  // Prefetch the unit the model will ask for next while this one computes.
  const int head = layout_.head_unit();
  int next = -1;
  if (!backward) next = unit < head ? unit + 1 : head - 1;  // after the head: the last block
  else if (unit > 1 && unit < head) next = unit - 1;
  // (a free slot holds unit -1)
  if (next > 0 && !find_slot(param_slots_, next) &&
      free_slot(param_slots_, unit_bytes_[size_t(next)]))
    start_gather(next);
  return code_unit(unit) ? nullptr : s->buf;
}

UnitAccess::BlockCodes Fsdp::block_codes(int unit) {
  if (shard_comm_->size() == 1) {
    if (!resident_unit(unit)) return {};
    MX_ASSERT(codes_version_ == weights_version_, "block_codes of unit ", unit,
              " before acquire");
    const float* base = shard_of(master_base_, unit);
    return {unit_codes_[size_t(unit)], base + norm_at_[size_t(unit)][0],
            base + norm_at_[size_t(unit)][1]};
  }
  if (!code_unit(unit)) return {};
  Slot* s = find_slot(param_slots_, unit);
  MX_ASSERT(s, "block_codes of unit ", unit, " before acquire");
  const ExactExchange& x = exchange_[size_t(unit)];
  const float* norms = s->assembled(shards_[unit], x);
  MX_ASSERT(x.tensor_at.size() == 2, "a block unit with ", x.tensor_at.size(), " 1-D tensors");
  return {s->codes(), norms + x.tensor_at[0], norms + x.tensor_at[1]};
}

void Fsdp::release(int unit, bool backward) {
  if (shard_comm_->size() == 1) return;
  if (options_.sharding == Sharding::kGradOp && !backward && unit != layout_.head_unit() &&
      unit != layout_.embed_unit())
    return;  // ZeRO-2: keep the block's weights for its backward
  Slot* s = find_slot(param_slots_, unit);
  if (!s) return;
  {
    CommTimer t(comm_wait_s_);
    s->gather.wait();
    s->exact.wait();
  }
  s->unit = -1;
}

float* Fsdp::grads(int unit) {
  if (shard_comm_->size() == 1) return shard_of(grad_base_, unit);
  if (Slot* s = find_slot(grad_slots_, unit)) return s->buf;
  const size_t bytes = sizeof(float) * size_t(shards_[unit].padded_numel);
  Slot* s = take_slot(grad_slots_, unit, bytes);
  if (!s) {
    complete_reduce_scatter();
    s = take_slot(grad_slots_, unit, bytes);
  }
  MX_ASSERT(s, "no free FSDP gradient slot for unit ", unit);
  be_.fill(s->buf, 0.0f, shards_[unit].padded_numel);
  return s->buf;
}

void Fsdp::grads_ready(int unit) {
  if (shard_comm_->size() == 1) return;
  complete_reduce_scatter();
  Slot* s = find_slot(grad_slots_, unit);
  MX_ASSERT(s, "grads_ready for unit ", unit, " without gradients");
  pending_rs_->unit = unit;
  pending_rs_->slot = s;
  // A sum: each rank's gradients are already its share of the global mean (the trainer's
  // grad_scale is 1 / (grad_accum x ranks)), so the sum over ranks is the global batch's.
  pending_rs_->handle = shard_comm_->reduce_scatter_async(
      s->buf, rs_buffer_, shards_[unit].shard_numel, CommDtype::kF32, ReduceOp::kSum);
}

void Fsdp::complete_reduce_scatter() {
  PendingReduce& p = *pending_rs_;
  if (p.unit < 0) return;
  {
    CommTimer t(comm_wait_s_);
    p.handle.wait();
  }
  float* dst = shard_of(grad_base_, p.unit);
  be_.add(dst, dst, rs_buffer_, shards_[p.unit].shard_numel);  // accumulate micro-batches
  p.slot->unit = -1;
  p.unit = -1;
  p.slot = nullptr;
}

void Fsdp::finish_micro_batch() {
  complete_reduce_scatter();
  for (auto& s : param_slots_) {
    CommTimer t(comm_wait_s_);
    s.gather.wait();
    s.exact.wait();
    s.unit = -1;
  }
  for (auto& s : grad_slots_) MX_ASSERT(s.unit < 0, "unit ", s.unit, " gradients never reduced");
}

double Fsdp::reduce_gradients_and_norm() {
  complete_reduce_scatter();
  // A GPU's host reaches this point with the backward still queued: wait for it outside the
  // timer, so that comm_wait_s counts the all-reduce and the norm, not the compute.
  be_.synchronize();
  CommTimer t(comm_wait_s_);
  if (replica_comm_->size() > 1) {
    // In pieces: a collective's count is an int (MPI), and a replicated shard is the whole
    // model with sharding = none (Llama-3-8B: 8e9 elements).
    constexpr int64_t kPiece = int64_t(1) << 30;
    for (int64_t i = 0; i < local_numel_; i += kPiece)
      replica_comm_->all_reduce(
          std::span<float>(grad_base_ + i, size_t(std::min(kPiece, local_numel_ - i))),
          ReduceOp::kSum);  // (shares of the global mean, as the reduce-scatter)
  }
  double local = be_.sum_squares(grad_base_, local_numel_);  // padding holds zeros
  return std::sqrt(shard_comm_->all_reduce(local, ReduceOp::kSum));
}

int64_t Fsdp::resident_code_bytes() const { return codes_ ? int64_t(codes_->used()) : 0; }

int64_t Fsdp::state_bytes() const {
  return int64_t(master_->used() + grad_shards_->used() + m_->used() + v_->used());
}

int64_t Fsdp::transient_bytes() const {
  return gathered_ ? int64_t(gathered_->used() + unit_grads_->used() + rs_out_->used()) : 0;
}

void Fsdp::zero_grads() { be_.fill(grad_base_, 0.0f, local_numel_); }
void Fsdp::adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                      int64_t t, float grad_scale) {
  const int r = shard_comm_->rank();
  const auto& units = layout_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t sb = shards_[u].shard_begin(r), se = sb + shards_[u].shard_numel;
    const int64_t base = unit_local_offset_[u];
    for (int ti : units[u].tensors) {
      const ParamTensor& t_ = layout_.tensors()[ti];
      const int64_t begin = t_.offset - units[u].offset, end = begin + t_.numel;
      const int64_t lo = std::max(begin, sb), hi = std::min(end, se);
      if (lo >= hi) continue;
      const int64_t at = base + (lo - sb);
      // resident codes (one shard: the shard is the unit) rewritten in the same pass
      uint16_t* codes = resident_unit(int(u)) ? unit_codes_[u] + lo : nullptr;
      be_.adamw(master_base_ + at, grad_base_ + at, m_base_ + at, v_base_ + at, hi - lo, lr,
                beta1, beta2, eps, t_.decay ? weight_decay : 0.0f, t, grad_scale, codes);
    }
  }
  // Every tensor of every unit was stepped, so every code is the new weight's; were they stale
  // before, they are not now.
  weights_changed();
  if (resident_codes_) codes_version_ = weights_version_;
}

// Host code reaches the shards (backend memory) only through be_.copy_*: a memcpy on the CPU,
// a host<->device copy on CUDA.
void Fsdp::scatter_params(const float* full) {
  weights_changed();
  const int r = shard_comm_->rank();
  const auto& units = layout_.units();
  std::vector<float> shard;
  for (size_t u = 0; u < units.size(); ++u) {
    const ShardLayout& sl = shards_[u];
    shard.assign(size_t(sl.shard_numel), 0.0f);  // padding is zero
    std::memcpy(shard.data(), full + units[u].offset + sl.shard_begin(r),
                sizeof(float) * size_t(sl.valid_numel(r)));
    be_.copy_from_host(shard_of(master_base_, int(u)), shard.data(),
                       sizeof(float) * shard.size());
  }
}

void Fsdp::scatter_moments(const float* full_m, const float* full_v) {
  const int r = shard_comm_->rank();
  const auto& units = layout_.units();
  std::vector<float> shard;
  for (size_t u = 0; u < units.size(); ++u) {
    const ShardLayout& sl = shards_[u];
    for (auto [src, base] : {std::pair{full_m, m_base_}, std::pair{full_v, v_base_}}) {
      shard.assign(size_t(sl.shard_numel), 0.0f);
      std::memcpy(shard.data(), src + units[u].offset + sl.shard_begin(r),
                  sizeof(float) * size_t(sl.valid_numel(r)));
      be_.copy_from_host(shard_of(base, int(u)), shard.data(), sizeof(float) * shard.size());
    }
  }
}

void Fsdp::gather_state(const float* local, float* full) {
  const auto& units = layout_.units();
  float* gathered = nullptr;
  if (shard_comm_->size() > 1) {
    // The largest gradient slot (fp32, the size of the largest unit, in the backend's memory
    // as the communicator needs) holds each unit in turn: weight slots may hold bf16 codes.
    for (auto& s : param_slots_) MX_ASSERT(s.unit < 0, "gather during a micro-batch");
    const Slot* largest = &grad_slots_[0];
    for (auto& s : grad_slots_) {
      MX_ASSERT(s.unit < 0, "gather during a micro-batch");
      if (s.bytes > largest->bytes) largest = &s;
    }
    gathered = largest->buf;
  }
  for (size_t u = 0; u < units.size(); ++u) {
    const ShardLayout& sl = shards_[u];
    const float* src = local + unit_local_offset_[u];
    if (gathered) {
      shard_comm_->all_gather(src, gathered, sl.shard_numel, CommDtype::kF32);
      src = gathered;
    }
    be_.copy_to_host(full + units[u].offset, src, sizeof(float) * size_t(units[u].numel));
  }
}

void Fsdp::gather_params(float* full) { gather_state(master_base_, full); }

void Fsdp::gather_moments(float* full_m, float* full_v) {
  gather_state(m_base_, full_m);
  gather_state(v_base_, full_v);
}

Fsdp::HostShards Fsdp::shards_on_host() {
  weights_changed();  // the caller may write the master weights (a checkpoint load)
  if (be_.host_addressable()) return {master_base_, m_base_, v_base_};
  const size_t n = size_t(local_numel_);
  host_master_.resize(n);
  host_m_.resize(n);
  host_v_.resize(n);
  return {host_master_.data(), host_m_.data(), host_v_.data()};
}

Fsdp::HostShards Fsdp::read_shards_to_host() {
  HostShards h = shards_on_host();
  if (h.master == master_base_) return h;
  const size_t bytes = sizeof(float) * size_t(local_numel_);
  be_.copy_to_host(h.master, master_base_, bytes);
  be_.copy_to_host(h.m, m_base_, bytes);
  be_.copy_to_host(h.v, v_base_, bytes);
  return h;
}

void Fsdp::write_shards_from_host(const HostShards& h) {
  weights_changed();
  if (h.master == master_base_) return;
  const size_t bytes = sizeof(float) * size_t(local_numel_);
  be_.copy_from_host(master_base_, h.master, bytes);
  be_.copy_from_host(m_base_, h.m, bytes);
  be_.copy_from_host(v_base_, h.v, bytes);
}

}  // namespace mx
