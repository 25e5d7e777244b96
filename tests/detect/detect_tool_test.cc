// spikeguard-detect, run as a user would: generate a small trace, then run
// the detectors over it with and without labels.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace {

struct Result {
  int code = -1;
  std::string out;
};

Result Invoke(const std::string& args) {
  const std::string cmd = std::string(SPIKEGUARD_DETECT_BIN) + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Prefix() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/detect_tool_test_" + std::to_string(getpid());
}

TEST(DetectToolTest, GeneratesATraceAndScoresEveryDetector) {
  const std::string prefix = Prefix();
  Result g = Invoke("--generate sharp_spikes --seed 4 --steps 3000 --layers 2 --out " + prefix);
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_NE(g.out.find("3000 steps"), std::string::npos) << g.out;

  Result r = Invoke("--trace " + prefix + ".jsonl --labels " + prefix + ".labels.json");
  ASSERT_EQ(r.code, 0) << r.out;
  // One alarm line per alarm, then the score table with all six detectors.
  EXPECT_NE(r.out.find("spikeguard loss_spike"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scores"), std::string::npos);
  for (const char* d : {"spikeguard", "llmc", "olmo", "foundry", "megatron", "wandb"}) {
    EXPECT_NE(r.out.find(std::string("\n") + d + " "), std::string::npos) << d << "\n" << r.out;
  }
  // spikeguard finds both spikes of this trace without false alarms.
  const size_t row = r.out.find("\nspikeguard ", r.out.find("scores"));
  ASSERT_NE(row, std::string::npos);
  const std::string line = r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1);
  EXPECT_NE(line.find(" 1.000 "), std::string::npos) << line;

  Result one = Invoke("--trace " + prefix + ".jsonl --detector megatron --quiet");
  EXPECT_EQ(one.code, 0) << one.out;
  EXPECT_EQ(one.out.find("spikeguard"), std::string::npos) << one.out;
  std::remove((prefix + ".jsonl").c_str());
  std::remove((prefix + ".labels.json").c_str());
}

TEST(DetectToolTest, UsageErrorsExitTwoAndMissingFilesOne) {
  EXPECT_EQ(Invoke("").code, 2);
  EXPECT_EQ(Invoke("--trace x.jsonl --detector nope").code, 1);  // file checked first
  EXPECT_EQ(Invoke("--bogus 1").code, 2);
  Result missing = Invoke("--trace /nonexistent/t.jsonl");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("cannot open"), std::string::npos) << missing.out;
  EXPECT_EQ(Invoke("--generate unicorns --out /tmp/x").code, 2);
}

}  // namespace
