// plan/sweep.h: grid ids stay valid directory names, and the grid's size is capped before it
// is expanded.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/sweep.h"

namespace {

using mx::plan::GridAxis;
using mx::plan::GridPoint;

TEST(SweepGrid, LongIdsAreCutWithAHashAndStayUnique) {
  // Two values that sanitize alike for their first 250 bytes ("/" and "_" both become "_").
  const std::string dir(250, 'd');
  GridAxis path{"data.path", {"/" + dir + "/a.txt", "/" + dir + "/b.txt", "/" + dir + "_a.txt",
                              "short.txt"}};
  GridAxis mb{"train.micro_batch", {"1", "2"}};
  const std::vector<GridPoint> points = mx::plan::expand_grid({path, mb});
  ASSERT_EQ(points.size(), 8u);
  std::set<std::string> ids;
  for (const auto& p : points) {
    EXPECT_LE(p.id.size(), 255u) << p.id;  // NAME_MAX
    EXPECT_TRUE(ids.insert(p.id).second) << p.id;
  }
  // A short id is unchanged; a cut one is 200 bytes: 183 of the id, '-', 16 hex digits.
  EXPECT_EQ(points.back().id, "path-short.txt_micro_batch-2");
  const std::string& cut = points.front().id;
  ASSERT_EQ(cut.size(), 200u);
  EXPECT_EQ(cut.substr(0, 183), ("path-_" + dir).substr(0, 183));
  EXPECT_EQ(cut[183], '-');
  EXPECT_EQ(cut.find_first_not_of("0123456789abcdef", 184), std::string::npos);
  // The same grid gives the same ids (a rerun finds its results).
  const std::vector<GridPoint> again = mx::plan::expand_grid({path, mb});
  for (size_t i = 0; i < points.size(); ++i) EXPECT_EQ(points[i].id, again[i].id);
}

TEST(SweepGrid, SizeIsCappedWithoutOverflow) {
  const GridAxis two{"a.b", {"1", "2"}};
  EXPECT_EQ(mx::plan::grid_size(std::vector<GridAxis>(13, two)), 8192u);  // 2^13 <= 10000
  EXPECT_THROW(mx::plan::grid_size(std::vector<GridAxis>(14, two)), mx::UserError);
  // 2^70 wraps a 64-bit product to 0 (and 2^64 x 2^6 to a small number): still refused.
  EXPECT_THROW(mx::plan::grid_size(std::vector<GridAxis>(70, two)), mx::UserError);
  EXPECT_THROW(mx::plan::expand_grid(std::vector<GridAxis>(70, two)), mx::UserError);
  const GridAxis hundred{"c.d", std::vector<std::string>(100, "x")};
  EXPECT_EQ(mx::plan::grid_size({hundred, hundred}), 10000u);
  EXPECT_THROW(mx::plan::grid_size({hundred, hundred, two}), mx::UserError);
}

}  // namespace
