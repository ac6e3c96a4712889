// commit_staged_files: a set of files replaced all together or not at all. A rename made to
// fail by putting a non-empty directory where a staged file is to go (after staging, as a
// race would) must leave every file as it was, with nothing staged or kept left behind; the
// references are the files' own earlier bytes and the directory's listing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "core/atomic_file.h"
#include "core/error.h"

namespace mx {
namespace {

namespace fs = std::filesystem;

class CommitStagedFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("mx_atomic_file_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string at(const std::string& name) const { return (root_ / name).string(); }
  void put(const std::string& name, const std::string& text) const {
    std::ofstream(at(name), std::ios::binary) << text;
  }
  std::string get(const std::string& name) const {
    std::ifstream in(at(name), std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string stage(const std::string& name, const std::string& text) const {
    return stage_file(at(name), {ByteSpan{text.data(), text.size()}});
  }
  // A directory (non-empty, so no rename can replace it) where `name` is to go.
  void block(const std::string& name) const {
    fs::remove(at(name));
    fs::create_directories(root_ / name / "inside");
  }
  std::set<std::string> listing() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(root_)) names.insert(e.path().filename().string());
    return names;
  }
  fs::path root_;
};

TEST_F(CommitStagedFilesTest, ReplacesEveryFile) {
  put("a", "old a");
  const std::string sa = stage("a", "new a"), sb = stage("b", "new b");
  commit_staged_files({{sa, at("a")}, {sb, at("b")}});
  EXPECT_EQ(get("a"), "new a");
  EXPECT_EQ(get("b"), "new b");
  EXPECT_EQ(listing(), (std::set<std::string>{"a", "b"}));
}

TEST_F(CommitStagedFilesTest, AFailedSecondRenamePutsTheFirstFileBack) {
  put("a", "old a");
  put("b", "old b");
  const std::string sa = stage("a", "new a"), sb = stage("b", "new b");
  block("b");
  EXPECT_THROW(commit_staged_files({{sa, at("a")}, {sb, at("b")}}), StorageError);
  EXPECT_EQ(get("a"), "old a");
  EXPECT_TRUE(fs::is_directory(root_ / "b" / "inside"));
  EXPECT_EQ(listing(), (std::set<std::string>{"a", "b"}));  // nothing staged or kept left
}

TEST_F(CommitStagedFilesTest, AFileThatDidNotExistIsRemovedAgain) {
  put("b", "old b");
  const std::string sa = stage("a", "new a"), sb = stage("b", "new b");
  block("b");
  EXPECT_THROW(commit_staged_files({{sa, at("a")}, {sb, at("b")}}), StorageError);
  EXPECT_FALSE(fs::exists(root_ / "a"));
  EXPECT_EQ(listing(), (std::set<std::string>{"b"}));
}

TEST_F(CommitStagedFilesTest, AFailedFirstRenameTouchesNothing) {
  put("a", "old a");
  put("b", "old b");
  const std::string sa = stage("a", "new a"), sb = stage("b", "new b");
  block("a");
  EXPECT_THROW(commit_staged_files({{sa, at("a")}, {sb, at("b")}}), StorageError);
  EXPECT_EQ(get("b"), "old b");
  EXPECT_EQ(listing(), (std::set<std::string>{"a", "b"}));
}

TEST_F(CommitStagedFilesTest, AFailedThirdRenamePutsBothBack) {
  put("a", "old a");
  put("c", "old c");
  const std::string sa = stage("a", "new a"), sb = stage("b", "new b"), sc = stage("c", "new c");
  block("c");
  EXPECT_THROW(commit_staged_files({{sa, at("a")}, {sb, at("b")}, {sc, at("c")}}), StorageError);
  EXPECT_EQ(get("a"), "old a");
  EXPECT_FALSE(fs::exists(root_ / "b"));
  EXPECT_EQ(listing(), (std::set<std::string>{"a", "c"}));
}

TEST_F(CommitStagedFilesTest, WriteFilesAtomicStagesAllBeforeReplacingAny) {
  put("a", "old a");
  write_files_atomic({{at("a"), "new a"}, {at("b"), "new b"}});
  EXPECT_EQ(get("a"), "new a");
  EXPECT_EQ(get("b"), "new b");
  // the second cannot be staged (its path is a directory): the first is not replaced
  block("b");
  EXPECT_THROW(write_files_atomic({{at("a"), "newer a"}, {at("b"), "newer b"}}), UserError);
  EXPECT_EQ(get("a"), "new a");
  EXPECT_EQ(listing(), (std::set<std::string>{"a", "b"}));
}

}  // namespace
}  // namespace mx
