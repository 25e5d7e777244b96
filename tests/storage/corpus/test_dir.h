// A fresh directory per test (ctest runs each TEST as its own process, maybe
// in parallel with others), removed when the process's tests are done.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace spikeguard::storage::testing_util {

inline std::vector<std::filesystem::path>& FreshDirsMade() {
  static auto* dirs = new std::vector<std::filesystem::path>;
  return *dirs;
}

// Removes the process's fresh directories once its tests are done.
class RemoveFreshDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    for (const auto& dir : FreshDirsMade()) std::filesystem::remove_all(dir, ignored);
  }
};
inline ::testing::Environment* const kRemoveFreshDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveFreshDirs);

// `dir` (and what it holds) is removed when the process's tests are done.
inline void RemoveWhenTestsEnd(const std::filesystem::path& dir) { FreshDirsMade().push_back(dir); }

inline std::string FreshDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string("sg_test_") + info->test_suite_name() + "_" + info->name() +
                     "_" + std::to_string(::getpid());
  std::replace(name.begin(), name.end(), '/', '_');  // parameterized tests' names hold '/'
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RemoveWhenTestsEnd(dir);
  return dir.string();
}

// A path for `name` in the running test's fresh directory (made at the
// test's first call, removed with the others): test files never land in the
// shared temp directory under fixed names.
inline std::string TestFilePath(const std::string& name) {
  static const ::testing::TestInfo* owner = nullptr;
  static std::string dir;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (dir.empty() || info != owner) {
    dir = FreshDir();
    owner = info;
  }
  return (std::filesystem::path(dir) / name).string();
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Writes `bytes` to TestFilePath(name); returns the path.
inline std::string WriteTestFile(const std::string& name, const std::string& bytes) {
  const std::string path = TestFilePath(name);
  WriteFile(path, bytes);
  return path;
}

}  // namespace spikeguard::storage::testing_util
