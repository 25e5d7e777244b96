// OpenBeneath on real files and symbolic links, through openat2 and through
// the walk of O_NOFOLLOW opens: both open the same paths and refuse the same
// ones, naming the component that is refused.
#include "base/beneath.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spikeguard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class BeneathTest : public ::testing::TestWithParam<BeneathResolver> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sg-beneath-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    root_ = base_ + "/root";
    fs::create_directories(root_ + "/a/b");
    fs::create_directories(base_ + "/outside");
    std::ofstream(root_ + "/a/b/file") << "inside";
    std::ofstream(root_ + "/top") << "top";
    std::ofstream(base_ + "/outside/file") << "outside!";
  }
  void TearDown() override { fs::remove_all(base_); }

  absl::StatusOr<ScopedFd> Open(const std::vector<std::string>& components, int flags = O_RDONLY) {
    auto root = OpenDirectory(root_);
    EXPECT_TRUE(root.ok()) << root.status();
    return OpenBeneath(root->get(), root_, components, flags, GetParam());
  }

  static std::string Read(int fd) {
    char buf[64] = {};
    const ssize_t n = pread(fd, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

  std::string base_, root_;
};

TEST_P(BeneathTest, OpensPlainPathsBeneathTheRoot) {
  auto fd = Open({"a", "b", "file"});
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(Read(fd->get()), "inside");
  auto top = Open({"top"});
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(Read(top->get()), "top");
  auto path = Open({"a", "b", "file"}, O_PATH);
  ASSERT_TRUE(path.ok()) << path.status();
  struct stat st {};
  ASSERT_EQ(fstat(path->get(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  if (GetParam() == BeneathResolver::kWalk) {
    EXPECT_FALSE(OpenBeneathUsedOpenat2());
  }
}

TEST_P(BeneathTest, ASymbolicLinkFileIsRefusedWhereverItLeads) {
  fs::create_symlink(base_ + "/outside/file", root_ + "/out");
  fs::create_symlink("top", root_ + "/in");
  fs::create_symlink(base_ + "/not-there-yet", root_ + "/dangling");
  for (const std::string name : {"out", "in", "dangling"}) {
    for (int flags : {O_RDONLY, O_PATH}) {
      auto fd = Open({name}, flags);
      ASSERT_FALSE(fd.ok()) << name;
      EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition) << name;
      EXPECT_THAT(fd.status().message(), HasSubstr("'" + root_ + "/" + name + "' is a symbolic link"));
    }
  }
}

TEST_P(BeneathTest, ASymbolicLinkDirectoryOnTheWayIsRefusedNamingIt) {
  fs::create_symlink(base_ + "/outside", root_ + "/a/link");
  fs::create_symlink(base_ + "/nowhere", root_ + "/a/dangling");
  fs::create_symlink("/proc/self/cwd", root_ + "/a/magic");
  for (const std::string dir : {"link", "dangling", "magic"}) {
    for (int flags : {O_RDONLY, O_PATH}) {
      auto fd = Open({"a", dir, "file"}, flags);
      ASSERT_FALSE(fd.ok()) << dir;
      EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition) << dir;
      EXPECT_THAT(fd.status().message(),
                  HasSubstr("'" + root_ + "/a/" + dir + "' is a symbolic link"));
    }
  }
}

TEST_P(BeneathTest, MissingAndMisplacedComponentsAreNamed) {
  auto missing = Open({"a", "nope", "file"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'" + root_ + "/a/nope'"));
  EXPECT_THAT(missing.status().message(), HasSubstr("No such file"));
  auto not_dir = Open({"top", "file"});
  EXPECT_EQ(not_dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(not_dir.status().message(), HasSubstr("'" + root_ + "/top' is not a directory"));
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{}, {".."}, {"a", ".", "b"}, {"a/b"}, {""}}) {
    EXPECT_EQ(Open(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST_P(BeneathTest, AFifoDoesNotBlock) {
  ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0600), 0);
  auto fd = Open({"fifo"});
  ASSERT_TRUE(fd.ok()) << fd.status();
  struct stat st {};
  ASSERT_EQ(fstat(fd->get(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(OpenDirectoryTest, TheRootItselfMustNotBeASymbolicLink) {
  char tmpl[] = "/tmp/sg-beneath-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string base = tmpl;
  fs::create_directories(base + "/real");
  fs::create_symlink(base + "/real", base + "/link");
  EXPECT_TRUE(OpenDirectory(base + "/real").ok());
  auto link = OpenDirectory(base + "/link");
  EXPECT_EQ(link.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(link.status().message(), HasSubstr("is a symbolic link"));
  EXPECT_EQ(OpenDirectory(base + "/none").status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(base);
}

INSTANTIATE_TEST_SUITE_P(Resolvers, BeneathTest,
                         ::testing::Values(BeneathResolver::kAuto, BeneathResolver::kWalk),
                         [](const ::testing::TestParamInfo<BeneathResolver>& info) {
                           return info.param == BeneathResolver::kAuto ? "Openat2" : "Walk";
                         });

}  // namespace
}  // namespace spikeguard
