// The head's logits chunks on a GPU: the planned chunk, and the larger chunk a run takes in
// device memory left free once its arenas are allocated (model/llama.h). Expected values are
// worked out here from the sizes themselves (bytes of fp32 logits and bf16 operand copies).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "backend/backend.h"
#include "model/config.h"
#include "model/llama.h"

namespace {

constexpr int64_t kGiB = int64_t(1) << 30, kMiB = int64_t(1) << 20;
constexpr auto kFp32 = mx::HeadOperands::kFp32, kBf16 = mx::HeadOperands::kBf16,
               kFp8 = mx::HeadOperands::kFp8;

mx::ModelConfig llama1b() {
  auto c = mx::model_preset("llama3.2-1b");  // hidden 2048, vocabulary 128256
  c.finalize();
  c.validate();
  return c;
}

// Bytes of the workspace of `rows` rows with bf16 operand copies, from the layout backend.h
// describes: fp32 logits [rows, V] padded to 16 bytes, then room for the operand copies: the
// GPU's bf16 copies of W, the logits' gradient and h (each padded to 16 bytes) or the CPU's
// fp32 copies of W and h, whichever is larger.
int64_t bf16_workspace_bytes(int64_t rows, int64_t C, int64_t V) {
  auto pad16 = [](int64_t bytes) { return (bytes + 15) / 16 * 16; };
  const int64_t logits = pad16(4 * rows * V);
  const int64_t gpu = pad16(2 * V * C) + pad16(2 * rows * V) + pad16(2 * rows * C);
  const int64_t cpu = 4 * (V * C + rows * C);
  return logits + std::max(gpu, cpu);
}

// The same for the FP8 head (precision.fp8_head): after the logits, the GPU's FP8 codes of W,
// of an h chunk and of the logits' gradient, each in both layouts (row-major and transposed:
// every FP8 GEMM operand K-major), each region padded to 256 bytes, or the CPU's fp32 copies.
int64_t fp8_workspace_bytes(int64_t rows, int64_t C, int64_t V, bool bf16_dgrad = false) {
  auto pad16 = [](int64_t bytes) { return (bytes + 15) / 16 * 16; };
  auto pad256 = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  // CUDA: W's codes (row-major; both layouts for the all-FP8 head), h's and the gradient's in
  // both layouts; with bf16_dgrad W's and the gradient's bf16 copies. CPU: fp32 copies of W's
  // and h's FP8 values, with bf16_dgrad of W's and the gradient's bf16 values too.
  const int64_t gpu =
      bf16_dgrad ? pad256(V * C) + 2 * (pad256(rows * V) + pad256(rows * C)) + pad16(2 * V * C) +
                       pad16(2 * rows * V)
                 : 2 * (pad256(V * C) + pad256(rows * V) + pad256(rows * C));
  const int64_t cpu = 4 * (V * C + rows * C) + (bf16_dgrad ? 4 * (V * C + rows * V) : 0);
  return pad16(4 * rows * V) + std::max(gpu, cpu);
}

TEST(HeadChunks, Fp8WorkspaceHoldsBothLayoutsOfEachOperand) {
  const int64_t C = 2048, V = 128256;
  for (int64_t rows : {int64_t(1), int64_t(523), int64_t(8371)}) {
    EXPECT_EQ(4 * mx::head_workspace_floats(rows, C, V, kFp8), fp8_workspace_bytes(rows, C, V))
        << rows;
    EXPECT_EQ(4 * mx::head_workspace_floats(rows, C, V, mx::HeadOperands::kFp8Bf16Dgrad),
              fp8_workspace_bytes(rows, C, V, true))
        << rows;
  }
  // Two one-byte layouts take what one two-byte bf16 copy does: the FP8 workspace is the bf16
  // one up to the regions' padding (256 bytes each against 16).
  for (int64_t rows : {int64_t(1), int64_t(523), int64_t(8371)}) {
    const int64_t fp8 = mx::head_workspace_floats(rows, C, V, kFp8);
    const int64_t bf16 = mx::head_workspace_floats(rows, C, V, kBf16);
    EXPECT_GE(fp8, bf16) << rows;
    EXPECT_LE(fp8 - bf16, 6 * 256 / 4) << rows;
  }
  // A spare chunk takes the FP8 workspace's own size.
  const auto c = llama1b();
  const int64_t total = 141 * kGiB, reserve = 4 * kGiB + total / 32;
  const int64_t need = fp8_workspace_bytes(8371, C, V) + reserve;
  EXPECT_EQ(mx::spare_head_chunk_rows(c, 16384, kFp8, need, total), 8371);
  EXPECT_EQ(mx::spare_head_chunk_rows(c, 16384, kFp8, need - 1, total), 2 * kGiB / 4 / V);
}

TEST(HeadChunks, PlannedDeviceChunkIs256MiBOfLogits) {
  unsetenv("MXTRAIN_CUDA_HEAD_CHUNK_MB");
  const auto c = llama1b();
  EXPECT_EQ(mx::head_chunk_rows(c, 16384, true), (256 * kMiB / 4) / 128256);  // 523 rows
  EXPECT_EQ(mx::head_chunk_rows(c, 100, true), 100);                           // all of them
}

TEST(HeadChunks, SpareMemoryTakesTheLargestChunkThatLeavesTheReserve) {
  unsetenv("MXTRAIN_CUDA_HEAD_CHUNK_MB");
  const auto c = llama1b();
  const int64_t C = 2048, V = 128256, N = 16384;
  const int64_t total = 141 * kGiB;
  const int64_t reserve = 4 * kGiB + total / 32;
  const int64_t rows4g = 4 * kGiB / 4 / V;  // rows of fp32 logits in 4 GiB
  ASSERT_EQ(rows4g, 8371);  // 2^30 / 128256 = 8371.9
  // An H200 with 100 GiB free: 4 GiB of logits.
  EXPECT_EQ(mx::spare_head_chunk_rows(c, N, kBf16, 100 * kGiB, total), rows4g);
  // Exactly enough for the 4 GiB chunk and the reserve; one byte less takes the 2 GiB chunk.
  const int64_t need4 = bf16_workspace_bytes(rows4g, C, V) + reserve;
  EXPECT_EQ(mx::spare_head_chunk_rows(c, N, kBf16, need4, total), rows4g);
  const int64_t rows2g = 2 * kGiB / 4 / V;
  EXPECT_EQ(mx::spare_head_chunk_rows(c, N, kBf16, need4 - 1, total), rows2g);
  // Without bf16 copies the workspace is the logits alone.
  EXPECT_EQ(mx::spare_head_chunk_rows(c, N, kFp32, 4 * rows4g * V + reserve, total), rows4g);
  EXPECT_EQ(mx::spare_head_chunk_rows(c, N, kFp32, 4 * rows4g * V + reserve - 1, total),
            rows2g);
  // A tight fit (docs/plan.md: llama3-8b on b200s with under 1 GiB spare): nothing.
  EXPECT_EQ(mx::spare_head_chunk_rows(c, N, kBf16, kGiB, total), 0);
  // The smallest step, 512 MiB of logits, still only when it fits with the reserve.
  const int64_t rows512 = 512 * kMiB / 4 / V;
  const int64_t need512 = bf16_workspace_bytes(rows512, C, V) + reserve;
  EXPECT_EQ(mx::spare_head_chunk_rows(c, N, kBf16, need512, total), rows512);
  EXPECT_EQ(mx::spare_head_chunk_rows(c, N, kBf16, need512 - 1, total), 0);
}

TEST(HeadChunks, SpareChunkIsCappedAtTheTokensAndMustBeatThePlan) {
  unsetenv("MXTRAIN_CUDA_HEAD_CHUNK_MB");
  const auto c = llama1b();
  // 2048 tokens: all rows in one chunk (1 GiB of logits), not more rows than there are.
  EXPECT_EQ(mx::spare_head_chunk_rows(c, 2048, kBf16, 100 * kGiB, 141 * kGiB), 2048);
  // 400 tokens already fit the planned 256 MiB chunk: nothing to gain.
  EXPECT_EQ(mx::spare_head_chunk_rows(c, 400, kBf16, 100 * kGiB, 141 * kGiB), 0);
}

TEST(HeadChunks, RowsInAWorkspaceInvertTheWorkspaceSize) {
  const auto c = llama1b();
  for (mx::HeadOperands bf16 : {kFp32, kBf16, kFp8})
    for (int64_t rows : {1, 2, 523, 8372}) {
      const int64_t floats = mx::head_workspace_floats(rows, 2048, 128256, bf16);
      EXPECT_EQ(mx::head_rows_in(floats, c, 16384, bf16), rows);
      EXPECT_EQ(mx::head_rows_in(floats - 1, c, 16384, bf16), rows - 1);
      EXPECT_EQ(mx::head_rows_in(floats, c, rows / 2, bf16), rows / 2);  // capped at the tokens
    }
}

}  // namespace
