// FSDP's bf16 gathers send a block's RMSNorm weights beside its bf16 codes as an exact fp32
// exchange (parallel/fsdp_sizes.h: ExactExchange). Checked by simulating it element by element:
// every rank packs its pieces from a unit whose element i holds the value i, the all-gather is
// a concatenation of per_rank elements from each rank, and the pieces copied into place must
// give each 1-D tensor's own indices, in order, for every shard count.
#include <gtest/gtest.h>

#include <vector>

#include "model/config.h"
#include "model/params.h"
#include "parallel/fsdp_sizes.h"
#include "parallel/shard.h"

namespace {

mx::ModelConfig shape(int64_t C, int64_t I, int64_t H, int64_t KV, int64_t D) {
  mx::ModelConfig c = mx::model_preset("tiny");
  c.hidden_size = C;
  c.intermediate_size = I;
  c.num_attention_heads = H;
  c.num_key_value_heads = KV;
  c.head_dim = D;
  c.num_hidden_layers = 2;
  c.finalize();
  c.validate();
  return c;
}

// The exchange of block unit 1 at shard count S, run on unit element indices.
void check_exchange(const mx::ModelConfig& c, int S) {
  const mx::ParamLayout layout(c);
  const int unit = layout.block_unit(0);
  const mx::ParamUnit& u = layout.units()[size_t(unit)];
  const mx::ShardLayout sl = mx::make_shard_layout(u.numel, S);
  const mx::ExactExchange x = mx::exact_exchange(layout, unit, S);
  SCOPED_TRACE(testing::Message() << "C " << c.hidden_size << " I " << c.intermediate_size
                                  << " S " << S);

  // What each rank holds (unit indices; padding -1), packed by its own pieces.
  std::vector<double> gathered(size_t(S * x.per_rank), -2.0);
  std::vector<int64_t> owned(size_t(S), 0);
  for (const mx::ExactPiece& p : x.pieces) {
    ASSERT_GE(p.rank, 0);
    ASSERT_LT(p.rank, S);
    ASSERT_LE(p.packed + p.numel, x.per_rank);
    ASSERT_LE(p.local + p.numel, sl.shard_numel);
    for (int64_t j = 0; j < p.numel; ++j) {
      const int64_t global = sl.shard_begin(p.rank) + p.local + j;
      gathered[size_t(p.rank * x.per_rank + p.packed + j)] = double(global);
    }
    owned[size_t(p.rank)] += p.numel;
  }
  int64_t most = 0;
  for (int64_t n : owned) most = std::max(most, n);
  EXPECT_EQ(x.per_rank, most);  // no rank sends more than it must

  // Unpack and compare with the tensors' own index ranges.
  std::vector<double> assembled(size_t(x.numel), -3.0);
  for (const mx::ExactPiece& p : x.pieces)
    for (int64_t j = 0; j < p.numel; ++j) {
      ASSERT_LT(p.to + j, x.numel);
      assembled[size_t(p.to + j)] = gathered[size_t(p.rank * x.per_rank + p.packed + j)];
    }
  const int64_t C = c.hidden_size;
  const std::array<int64_t, 9> o = layout.block_offsets_in_unit(0);
  ASSERT_EQ(x.tensor_at.size(), 2u);
  EXPECT_EQ(x.numel, 2 * C);
  const int64_t norms[2] = {o[0], o[5]};  // input_layernorm, post_attention_layernorm
  for (int t = 0; t < 2; ++t)
    for (int64_t j = 0; j < C; ++j)
      ASSERT_EQ(assembled[size_t(x.tensor_at[size_t(t)] + j)], double(norms[t] + j))
          << "tensor " << t << " element " << j;
}

TEST(ExactExchange, DeliversBothNormsForEveryShardCount) {
  for (const mx::ModelConfig& c :
       {shape(64, 160, 4, 2, 16), shape(32, 43, 2, 2, 16), shape(48, 97, 3, 1, 16),
        shape(8, 5, 2, 1, 4)})
    for (int S : {1, 2, 3, 4, 7, 8, 64, 5000}) check_exchange(c, S);
}

TEST(ExactExchange, ANormAcrossAShardBoundaryComesInTwoPieces) {
  // hidden 32, intermediate 43, 2 heads of 16: the block is 8288 elements, so 2 shards of 4144
  // split post_attention_layernorm ([4128, 4160)) after 16 elements.
  const mx::ModelConfig c = shape(32, 43, 2, 2, 16);
  const mx::ParamLayout layout(c);
  const mx::ExactExchange x = mx::exact_exchange(layout, layout.block_unit(0), 2);
  ASSERT_EQ(x.pieces.size(), 3u);
  EXPECT_EQ(x.pieces[0].rank, 0);  // input_layernorm, whole, on rank 0
  EXPECT_EQ(x.pieces[0].numel, 32);
  EXPECT_EQ(x.pieces[1].rank, 0);  // post_attention_layernorm's first 16
  EXPECT_EQ(x.pieces[1].local, 4128);
  EXPECT_EQ(x.pieces[1].numel, 16);
  EXPECT_EQ(x.pieces[2].rank, 1);  // ... and its last 16, at the start of rank 1's shard
  EXPECT_EQ(x.pieces[2].local, 0);
  EXPECT_EQ(x.pieces[2].numel, 16);
  EXPECT_EQ(x.per_rank, 48);
}

TEST(FsdpBufferSizes, Bf16BlockSlotsHoldCodesAndTheExchange) {
  // Byte counts written out: llama3-8b's block unit over 8 ranks.
  mx::ModelConfig c = mx::model_preset("llama3-8b");
  c.finalize();
  const mx::ParamLayout layout(c);
  const int64_t C = 4096, I = 14336, kv = 1024;
  const int64_t numel = 2 * C + 2 * C * C + 2 * kv * C + 3 * C * I;  // 218,112,000
  ASSERT_EQ(layout.units()[1].numel, numel);
  const int64_t padded = (numel + 7) / 8 * 8;
  auto r64 = [](int64_t b) { return (b + 63) / 64 * 64; };
  // post_attention_layernorm starts at C + 2C^2 + 2 kv C = 41,947,136, in rank 1's shard
  // (27,264,000 each): rank 0 and rank 1 each hold one whole norm, per_rank = C.
  const int64_t bf16_slot = r64(2 * padded) + r64(4 * 8 * C) + r64(4 * 2 * C);
  for (mx::Sharding s : {mx::Sharding::kFull, mx::Sharding::kGradOp}) {
    const mx::FsdpBufferSizes f = mx::fsdp_buffer_sizes(layout, 8, s, false);
    const mx::FsdpBufferSizes b = mx::fsdp_buffer_sizes(layout, 8, s, true);
    EXPECT_EQ(f.unit_bytes[1], size_t(r64(4 * padded)));
    EXPECT_EQ(b.unit_bytes[1], size_t(bf16_slot));
    const int64_t blocks = s == mx::Sharding::kGradOp ? c.num_hidden_layers : 2;
    EXPECT_EQ(int64_t(f.gathered_bytes - b.gathered_bytes), blocks * (r64(4 * padded) - bf16_slot));
    EXPECT_EQ(f.unit_grad_bytes, b.unit_grad_bytes);  // gradients stay fp32
    EXPECT_EQ(f.state_bytes, b.state_bytes);
  }
  // One shard: nothing is gathered, whatever the option.
  EXPECT_EQ(mx::fsdp_buffer_sizes(layout, 1, mx::Sharding::kFull, true).gathered_bytes, 0u);
}

}  // namespace
