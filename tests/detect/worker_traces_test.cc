// The real trainers' labeled traces detector_bench scores as its "workers"
// split (tests/testdata/detect_traces: the C++ reference worker and the
// PyTorch trainer, poisoned batches, a bit flip, a fragile run, a clean
// run). Each reads, its labels lie inside it, and spikeguard opens on every
// labeled event and on nothing else.
#include <string>
#include <vector>

#include "daemon/detect/eval/detectors.h"
#include "daemon/detect/eval/scoring.h"
#include "daemon/detect/eval/trace_io.h"
#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

const char* const kTraces[] = {"worker_data-s7",  "worker_data-s11", "worker_transient-s7",
                               "worker_clean-s7", "torch_data-s23",  "torch_data-s31",
                               "torch_fragile-s7"};

TEST(WorkerTracesTest, SpikeguardOpensOnEveryLabeledEventAndNothingElse) {
  int labels = 0, torch_steps_with_domains = 0;
  for (const char* name : kTraces) {
    const std::string prefix = std::string(SPIKEGUARD_WORKER_TRACES_DIR) + "/" + name;
    auto steps = ReadTrace(prefix + ".jsonl");
    ASSERT_TRUE(steps.ok()) << name << ": " << steps.status();
    auto lab = ReadLabels(prefix + ".labels.json");
    ASSERT_TRUE(lab.ok()) << name << ": " << lab.status();
    ASSERT_GE(steps->size(), 300u) << name;
    for (const Label& l : *lab) {
      EXPECT_GE(l.onset, steps->front().step) << name;
      EXPECT_LE(l.end, steps->back().step) << name;
    }
    if (std::string(name).rfind("torch_", 0) == 0) {
      for (const StepSample& s : *steps) torch_steps_with_domains += s.domains.size() == 3;
    }
    auto alarms = RunDetector("spikeguard", *steps);
    ASSERT_TRUE(alarms.ok());
    const ScoreCounts c = ScoreTrace(*alarms, *lab, static_cast<int64_t>(steps->size()));
    EXPECT_EQ(c.detected, c.labels) << name;
    EXPECT_EQ(c.false_alarms, 0) << name;
    labels += c.labels;
  }
  EXPECT_EQ(labels, 9);
  // The PyTorch trainer reports its per-domain losses (code, numbers, prose).
  EXPECT_EQ(torch_steps_with_domains, 1000);
}

}  // namespace
}  // namespace spikeguard::detect
