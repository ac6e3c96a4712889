// cgroup_memory_limit against cgroup trees written by hand in a temporary directory, laid out
// as the kernel's documentation (Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/memory.rst)
// lays them out: v2's memory.max ("max" or bytes), v1's memory.limit_in_bytes (no limit:
// 9223372036854771712, PAGE_COUNTER_MAX pages of 4 KiB), /proc/self/cgroup's lines.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/memory_limit.h"

namespace mx {
namespace {

namespace fs = std::filesystem;

constexpr const char* kV1NoLimit = "9223372036854771712";

class CgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("mx_cgroup_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void put(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text << "\n";
  }
  int64_t limit(const std::string& self) { return cgroup_memory_limit(self, root_.string()); }
  fs::path root_;
};

TEST_F(CgroupTest, V2NestedLimitIsFound) {
  put("memory.max", "max");  // the root has none
  put("system.slice/memory.max", "max");
  put("system.slice/job.service/memory.max", "1073741824");
  EXPECT_EQ(limit("0::/system.slice/job.service\n"), 1073741824);
}

TEST_F(CgroupTest, V2TheLowestOfTheAncestorsCounts) {
  put("a/memory.max", "500000000");
  put("a/b/memory.max", "max");
  put("a/b/c/memory.max", "900000000");
  EXPECT_EQ(limit("0::/a/b/c\n"), 500000000);
}

TEST_F(CgroupTest, V2NamespacedRoot) {
  // inside a cgroup namespace: the path is "/", the container's limit at the mount's root
  put("memory.max", "2147483648");
  EXPECT_EQ(limit("0::/\n"), 2147483648);
}

TEST_F(CgroupTest, V2NoLimitAnywhere) {
  put("memory.max", "max");
  put("u/memory.max", "max");
  EXPECT_EQ(limit("0::/u\n"), -1);
}

TEST_F(CgroupTest, V1HostPathOverTheContainersOwnRoot) {
  // Docker on cgroup v1 without a namespace: /proc/self/cgroup names the host's path, the
  // mount shows the container's own cgroup as the root
  put("memory/memory.limit_in_bytes", "3221225472");
  const std::string self =
      "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n";
  EXPECT_EQ(limit(self), 3221225472);
}

TEST_F(CgroupTest, V1NestedAndNoLimitValue) {
  // this very layout: a nested v1 memory cgroup whose limit sits at its own directory, v1's
  // "no limit" at the root and above it; a hybrid host's "0::/" v2 line besides
  put("memory/memory.limit_in_bytes", kV1NoLimit);
  put("memory/process_api/memory.limit_in_bytes", kV1NoLimit);
  put("memory/process_api/9da9/memory.limit_in_bytes", "25769803776");
  EXPECT_EQ(limit("4:memory:/process_api/9da9\n0::/\n"), 25769803776);
  put("memory/process_api/9da9/memory.limit_in_bytes", kV1NoLimit);
  EXPECT_EQ(limit("4:memory:/process_api/9da9\n0::/\n"), -1);
}

TEST_F(CgroupTest, V1ControllerAmongOthers) {
  put("memory/memory.limit_in_bytes", "123456789");
  EXPECT_EQ(limit("3:cpu,memory:/\n"), 123456789);
}

TEST_F(CgroupTest, NothingReadable) {
  EXPECT_EQ(limit(""), -1);
  EXPECT_EQ(limit("garbage\n"), -1);
  EXPECT_EQ(limit("0::/nowhere\n"), -1);
  put("memory.max", "not a number");
  EXPECT_EQ(limit("0::/\n"), -1);
}

}  // namespace
}  // namespace mx
