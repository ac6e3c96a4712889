#include <gtest/gtest.h>

#include <cmath>

#include "train/schedule.h"

TEST(Schedule, WarmupThenCosineToMinLr) {
  const double lr = 1e-3, min_lr = 1e-4;
  EXPECT_DOUBLE_EQ(mx::lr_at(0, 100, 10, lr, min_lr), lr * 1 / 10);
  EXPECT_DOUBLE_EQ(mx::lr_at(9, 100, 10, lr, min_lr), lr);
  EXPECT_DOUBLE_EQ(mx::lr_at(10, 100, 10, lr, min_lr), lr);  // cosine at p = 0
  // p = 45/90 = 0.5: halfway between lr and min_lr.
  EXPECT_NEAR(mx::lr_at(55, 100, 10, lr, min_lr), (lr + min_lr) / 2, 1e-15);
  EXPECT_NEAR(mx::lr_at(100, 100, 10, lr, min_lr), min_lr, 1e-15);
  EXPECT_NEAR(mx::lr_at(30, 100, 0, lr, min_lr),
              min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI * 0.3)), 1e-15);
}
