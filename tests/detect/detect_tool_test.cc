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

void WriteText(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

TEST(DetectToolTest, ReadsPythonJsonlAndCsvExportsAndNamesBadFields) {
  const std::string prefix = Prefix();
  // Python's json.dumps: a NaN step in the middle of a healthy run is an
  // alarm, not a rejected file.
  std::string jsonl;
  std::string csv = "\"Step\",\"my run - loss\",\"my run - loss__MIN\",\"grad_norm\"\n";
  for (int s = 0; s < 400; ++s) {
    const std::string loss = s == 300 ? "NaN" : std::to_string(2.0 + 0.01 * (s % 5));
    jsonl += "{\"step\": " + std::to_string(s) + ", \"loss\": " + loss + ", \"grad_norm\": " +
             (s == 300 ? "Infinity" : "0.3") + "}\n";
    csv += std::to_string(s) + "," + (s == 300 ? "nan" : loss) + ",," + (s % 2 ? "" : "0.3") +
           "\n";
  }
  WriteText(prefix + "_py.jsonl", jsonl);
  WriteText(prefix + "_wandb.csv", csv);
  for (const std::string& file : {prefix + "_py.jsonl", prefix + "_wandb.csv"}) {
    Result r = Invoke("--trace " + file + " --detector spikeguard");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("400 steps (0..399)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("300      spikeguard nonfinite"), std::string::npos) << r.out;
  }
  WriteText(prefix + "_bad.jsonl",
            "{\"step\": 0, \"loss\": 1}\n{\"step\": 1, \"loss\": 1, \"acc\": 0.5}\n");
  Result bad = Invoke("--trace " + prefix + "_bad.jsonl");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("line 2: unknown field \"acc\""), std::string::npos) << bad.out;
  WriteText(prefix + "_bad.csv", "step,loss,act_rms\n0,1,1\n");
  Result badcsv = Invoke("--trace " + prefix + "_bad.csv");
  EXPECT_EQ(badcsv.code, 1);
  EXPECT_NE(badcsv.out.find("\"act_rms\" has no layer index"), std::string::npos) << badcsv.out;
  for (const char* f : {"_py.jsonl", "_wandb.csv", "_bad.jsonl", "_bad.csv"}) {
    std::remove((prefix + f).c_str());
  }
}

TEST(DetectToolTest, UsageErrorsExitTwoAndMissingFilesOne) {
  EXPECT_EQ(Invoke("").code, 2);
  EXPECT_EQ(Invoke("--trace x.jsonl --detector nope").code, 1);  // file checked first
  EXPECT_EQ(Invoke("--bogus 1").code, 2);
  Result missing = Invoke("--trace /nonexistent/t.jsonl");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("cannot open"), std::string::npos) << missing.out;
  EXPECT_EQ(Invoke("--generate unicorns --out /tmp/x").code, 2);
  // The wild families (wild_corpus.h) are generated too.
  const std::string prefix = Prefix() + "_wild";
  Result w = Invoke("--generate attn_growth --seed 3 --steps 4000 --out " + prefix);
  EXPECT_EQ(w.code, 0) << w.out;
  EXPECT_NE(w.out.find("4000 steps"), std::string::npos) << w.out;
  std::remove((prefix + ".jsonl").c_str());
  std::remove((prefix + ".labels.json").c_str());
}

}  // namespace
