// Every recipe's operand quantization (the path training takes) gives the same bytes with 1
// and 2 OpenMP threads, for every operand kind, on shapes that cross the parallel thresholds.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "precision/recipe.h"

namespace mx {
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen) * std::exp2(float(int(gen() % 12)) - 6.0f);
  return v;
}

// quantizes x as each operand, three "steps" in a row (fp8-delayed's history moves), and
// returns all the outputs concatenated
std::vector<float> run(Recipe recipe, const std::vector<float>& x, int64_t rows, int64_t cols) {
  LinearRecipe lr(recipe, 1, 0, 0, 17, 0);
  std::vector<float> all;
  const LinearOperand ops[] = {LinearOperand::kFwdInput,  LinearOperand::kFwdWeight,
                               LinearOperand::kDgradGrad, LinearOperand::kDgradWeight,
                               LinearOperand::kWgradGrad, LinearOperand::kWgradInput};
  for (int step = 0; step < 3; ++step) {
    lr.set_step(step);
    for (LinearOperand op : ops)
      for (bool along_cols : {true, false}) {
        std::vector<float> out(x.size());
        lr.quantize(out.data(), x.data(), rows, cols, along_cols, op, 0, 2);
        all.insert(all.end(), out.begin(), out.end());
      }
  }
  return all;
}

TEST(LinearRecipe, SameBytesWithOneAndTwoThreads) {
  const int64_t rows = 256, cols = 400;  // partial 32-, 128- and 16-blocks along the columns
  const std::vector<float> x = randn(size_t(rows * cols), 3);
  for (Recipe r : {Recipe::kBf16, Recipe::kFp8Current, Recipe::kFp8Delayed, Recipe::kFp8Block,
                   Recipe::kMxfp8, Recipe::kNvfp4}) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const std::vector<float> one = run(r, x, rows, cols);
    omp_set_num_threads(2);
    const std::vector<float> two = run(r, x, rows, cols);
    omp_set_num_threads(saved);
    ASSERT_EQ(one.size(), two.size());
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0)
        << recipe_name(r);
    // and the quantization did something (a recipe that copied its input would pass above)
    EXPECT_NE(std::memcmp(one.data(), x.data(), x.size() * sizeof(float)), 0) << recipe_name(r);
  }
}

}  // namespace
}  // namespace mx
