// The host-side rules of the CUDA backend's attention choice (backend/attention_choice.h):
// MXTRAIN_CUDA_ATTENTION parsing, the cuDNN SDPA shape rules checked before a graph is built,
// and the tensor views handed to cuDNN, checked element by element against our own layouts'
// index formulas (the same ones backend/cpu/attention.cpp and backend/cuda/attention.cu use).
#include "backend/attention_choice.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace {

using mx::CudaAttention;

TEST(AttentionChoice, ParsesTheTwoValuesAndDefaultsToCudnn) {
  EXPECT_EQ(mx::parse_cuda_attention(nullptr), CudaAttention::kCudnn);
  EXPECT_EQ(mx::parse_cuda_attention(""), CudaAttention::kCudnn);
  EXPECT_EQ(mx::parse_cuda_attention("cudnn"), CudaAttention::kCudnn);
  EXPECT_EQ(mx::parse_cuda_attention("fp32"), CudaAttention::kFp32);
  EXPECT_STREQ(mx::cuda_attention_name(CudaAttention::kCudnn), "cudnn");
  EXPECT_STREQ(mx::cuda_attention_name(CudaAttention::kFp32), "fp32");
}

TEST(AttentionChoice, BadValuesAreUserErrorsNamingTheVariable) {
  for (const char* bad : {"CUDNN", "bf16", "fp32 ", "flash", "1"}) {
    try {
      mx::parse_cuda_attention(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const mx::UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("MXTRAIN_CUDA_ATTENTION"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    }
  }
}

TEST(AttentionChoice, CudnnShapeRules) {
  // Llama shapes: 1B (32 / 8 heads, D 64), 8B (D 128), the op check's GQA case at T = 200.
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(2, 8192, 32, 8, 64), "");
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(1, 4096, 32, 8, 128), "");
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(2, 200, 8, 2, 64), "");
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(1, 2, 1, 1, 8), "");
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(1, 64, 4, 4, 256), "");
  auto has = [](const std::string& s, const char* what) {
    return s.find(what) != std::string::npos;
  };
  EXPECT_TRUE(has(mx::cudnn_sdpa_shape_problem(1, 64, 4, 4, 80 + 4), "multiple of 8"));
  EXPECT_TRUE(has(mx::cudnn_sdpa_shape_problem(1, 64, 4, 4, 100), "multiple of 8"));
  EXPECT_TRUE(has(mx::cudnn_sdpa_shape_problem(1, 64, 4, 4, 264), "above 256"));
  EXPECT_TRUE(has(mx::cudnn_sdpa_shape_problem(1, 1, 4, 4, 64), "sequence length 1"));
  EXPECT_TRUE(has(mx::cudnn_sdpa_shape_problem(1, 64, 6, 4, 64), "not a multiple of kv heads"));
  EXPECT_TRUE(has(mx::cudnn_sdpa_shape_problem(0, 64, 4, 4, 64), "empty"));
  // cuDNN's execute fails from 65536 sequences or heads on (PyTorch: batch 65535 runs, 65536
  // fails): refused before a graph is built, so the fp32 kernel or smaller groups take them
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(65535, 2, 1, 1, 8), "");
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(1, 64, 65535, 65535, 64), "");
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(65536, 2, 1, 1, 8),
            "65536 sequences in one call (cuDNN's SDPA fails at run time past 65535)");
  EXPECT_EQ(mx::cudnn_sdpa_shape_problem(1, 64, 65536, 65536, 64),
            "65536 heads (cuDNN's SDPA fails at run time past 65535)");
  EXPECT_EQ(mx::cudnn_batch(70000), 65535);
  EXPECT_EQ(mx::cudnn_batch(65535), 65535);
  EXPECT_EQ(mx::cudnn_batch(3), 3);
}

// The sequences a cuDNN call takes: the whole micro-batch where it fits and is within cuDNN's
// 65535, else halvings cut to a multiple of 4 / gcd(H T, 4) (the statistics' 16-byte
// alignment). Expected values worked out by hand.
TEST(AttentionChoice, CudnnGroupsStayWithinRoomAlignmentAndCudnnsLimit) {
  EXPECT_EQ(mx::cudnn_group_multiple(1, 3), 4);  // 4 / gcd(H T, 4)
  EXPECT_EQ(mx::cudnn_group_multiple(3, 2), 2);
  EXPECT_EQ(mx::cudnn_group_multiple(32, 8192), 1);
  const auto room = [](int64_t n) { return size_t(n) * 100; };  // 100 bytes a sequence
  const size_t lots = size_t(1) << 40;
  // all at once, whatever the alignment (the group starts at sequence 0)
  EXPECT_EQ(mx::cudnn_group_sequences(3, 3, 1, lots, room), 3);
  EXPECT_EQ(mx::cudnn_group_sequences(65535, 3, 1, lots, room), 65535);
  // more than cuDNN takes: 65535, cut to a multiple of 4 / gcd(H T, 4)
  EXPECT_EQ(mx::cudnn_group_sequences(65536, 4, 1, lots, room), 65535);  // H T = 4: any
  EXPECT_EQ(mx::cudnn_group_sequences(70000, 2, 1, lots, room), 65534);  // H T = 2: even
  EXPECT_EQ(mx::cudnn_group_sequences(70000, 3, 1, lots, room), 65532);  // H T = 3: 4s
  EXPECT_EQ(mx::cudnn_group_sequences(1 << 20, 3, 3, lots, room), 65532);
  // the scratch arena's room: 64 -> 32 -> 16 -> 8 sequences (800 <= 1000 bytes)
  EXPECT_EQ(mx::cudnn_group_sequences(64, 8, 4, 1000, room), 8);
  // halved from an odd count: 9 -> 5 (500 <= 600), cut to 4 for H T = 2
  EXPECT_EQ(mx::cudnn_group_sequences(9, 2, 1, 600, room), 4);
  // room for one sequence where 4 at a time are needed (H T odd): none
  EXPECT_EQ(mx::cudnn_group_sequences(8, 3, 1, 150, room), 0);
  // ... and for one where any count will do
  EXPECT_EQ(mx::cudnn_group_sequences(8, 4, 1, 150, room), 1);
}

// Every element's offset through the view's strides is its offset in our layout.
TEST(AttentionChoice, BshdViewAddressesOurLayout) {
  const int64_t B = 2, T = 5, heads = 3, D = 8;
  const mx::TensorView4 v = mx::bshd_view(B, T, heads, D);
  EXPECT_EQ(v.dim[0], B);
  EXPECT_EQ(v.dim[1], heads);
  EXPECT_EQ(v.dim[2], T);
  EXPECT_EQ(v.dim[3], D);
  EXPECT_EQ(v.stride[3], 1);  // cuDNN's SDPA requires the head dim innermost
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t through_view = b * v.stride[0] + h * v.stride[1] + t * v.stride[2] +
                                       d * v.stride[3];
          ASSERT_EQ(through_view, ((b * T + t) * heads + h) * D + d) << b << h << t << d;
        }
}

TEST(AttentionChoice, StatsViewAddressesOurLse) {
  const int64_t B = 2, H = 3, T = 7;
  const mx::TensorView4 v = mx::stats_view(B, H, T);
  EXPECT_EQ(v.dim, (std::array<int64_t, 4>{B, H, T, 1}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        ASSERT_EQ(b * v.stride[0] + h * v.stride[1] + t * v.stride[2], (b * H + h) * T + t);
}

}  // namespace
