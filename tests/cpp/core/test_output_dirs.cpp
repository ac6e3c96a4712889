// path_place: where a path lies against a directory, checked against paths built by hand in a
// fresh temporary directory (links, "..", a trailing '/', names that only share a prefix), and
// is_config_path_errno against the errno values the contract names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "core/output_dirs.h"

namespace mx {
namespace {

namespace fs = std::filesystem;

class PathPlaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("mx_path_place_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "model" / "sub");
    fs::create_directories(root_ / "other");
    fs::create_symlink(root_ / "model", root_ / "link");
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string at(const std::string& rel) const { return (root_ / rel).string(); }
  fs::path root_;
};

TEST_F(PathPlaceTest, SameInsideOutside) {
  EXPECT_EQ(path_place(at("model"), at("model")), PathPlace::kSame);
  EXPECT_EQ(path_place(at("model/"), at("model")), PathPlace::kSame);
  EXPECT_EQ(path_place(at("model"), at("model/")), PathPlace::kSame);
  EXPECT_EQ(path_place(at("model/sub"), at("model")), PathPlace::kInside);
  EXPECT_EQ(path_place(at("model/not/yet/made"), at("model")), PathPlace::kInside);
  EXPECT_EQ(path_place(at("other"), at("model")), PathPlace::kOutside);
  EXPECT_EQ(path_place(at("model"), at("model/sub")), PathPlace::kOutside);  // a parent
  // a name that begins like the directory's is not inside it
  fs::create_directories(root_ / "modelx");
  EXPECT_EQ(path_place(at("modelx"), at("model")), PathPlace::kOutside);
}

TEST_F(PathPlaceTest, LinksAndDotsResolve) {
  EXPECT_EQ(path_place(at("link"), at("model")), PathPlace::kSame);
  EXPECT_EQ(path_place(at("link/sub"), at("model")), PathPlace::kInside);
  EXPECT_EQ(path_place(at("other/../model/sub"), at("model")), PathPlace::kInside);
  EXPECT_EQ(path_place(at("model/sub/.."), at("model")), PathPlace::kSame);
  EXPECT_EQ(path_place(at("model/./sub/../../other"), at("model")), PathPlace::kOutside);
}

TEST_F(PathPlaceTest, RelativePathsAreFromTheWorkingDirectory) {
  const fs::path cwd = fs::current_path();
  fs::current_path(root_);
  const PathPlace rel = path_place("model/sub", at("model"));
  const PathPlace dot = path_place(".", root_.string());
  fs::current_path(cwd);
  EXPECT_EQ(rel, PathPlace::kInside);
  EXPECT_EQ(dot, PathPlace::kSame);
}

TEST(ConfigPathErrno, TheContractsList) {
  for (int e : {ENAMETOOLONG, ENOTDIR, EEXIST, ELOOP}) EXPECT_TRUE(is_config_path_errno(e)) << e;
  for (int e : {EIO, ENOSPC, EACCES, EROFS}) EXPECT_FALSE(is_config_path_errno(e)) << e;
}

}  // namespace
}  // namespace mx
