// The reference worker's scenarios, each judged from the worker's own JSONL
// telemetry by the daemon's spike rule (no daemon involved).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>

#include "gmock/gmock.h"
#include "storage/corpus/corpus_tools.h"
#include "tests/e2e/process.h"
#include "tests/e2e/scenario_util.h"

namespace spikeguard::testing {
namespace {

namespace v1 = spikeguard::v1;

class ScenarioTest : public ::testing::Test {
 protected:
  std::string MakeCorpus(std::vector<std::string> poisons = {}) {
    auto parsed = storage::ParsePoisons(poisons);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    auto meta = storage::SynthesizeCorpus(dir_.File("corpus"), 7, *parsed);
    EXPECT_TRUE(meta.ok()) << meta.status();
    meta_ = *meta;
    return dir_.File("corpus");
  }

  const v1::StepReport& At(const std::vector<v1::StepReport>& reports, int64_t step) {
    auto it = std::find_if(reports.begin(), reports.end(),
                           [&](const v1::StepReport& r) { return r.step() == step; });
    EXPECT_NE(it, reports.end()) << "no report for step " << step;
    return *it;
  }

  std::string Ckpt(int64_t generation, int64_t step) {
    return dir_.File("ckpt") + absl::StrFormat("/ckpt-g%06d-s%012d.sgck", generation, step);
  }

  TempDir dir_;
  storage::CorpusMetadata meta_;
};

TEST_F(ScenarioTest, ReplayFromACheckpointIsBitExact) {
  RunSpec original{.scenario = "small", .corpus = MakeCorpus(), .checkpoint_dir = dir_.File("ckpt"),
                   .telemetry = dir_.File("gen0.jsonl"), .steps = 300};
  uint64_t original_params = 0;
  auto gen0 = RunWorker(original, &original_params);
  ASSERT_EQ(gen0.size(), 300u);

  RunSpec replay = original;
  replay.telemetry = dir_.File("gen1.jsonl");
  replay.generation = 1;
  replay.resume_from = Ckpt(0, 100);
  uint64_t replay_params = 0;
  auto gen1 = RunWorker(replay, &replay_params);
  ASSERT_EQ(gen1.size(), 200u);
  for (const auto& r : gen1) {
    ASSERT_EQ(r.loss_hash(), At(gen0, r.step()).loss_hash()) << "step " << r.step();
    ASSERT_EQ(r.data_position(), At(gen0, r.step()).data_position());
  }
  EXPECT_EQ(replay_params, original_params);
  std::cout << "[figures] replay 100..299: 200/200 loss hashes equal; param hash "
            << std::hex << replay_params << std::dec << " at step 300 in both\n";
}

TEST_F(ScenarioTest, DataPoisonSpikesReplaysAndSkipRemovesIt) {
  const std::string corpus = MakeCorpus({"highbytes@300"});
  ASSERT_EQ(meta_.poisons.size(), 1u);
  RunSpec original{.scenario = "data", .corpus = corpus, .checkpoint_dir = dir_.File("ckpt"),
                   .telemetry = dir_.File("gen0.jsonl"), .steps = 400};
  auto gen0 = RunWorker(original);
  Judgement j0 = Judge(gen0);
  ASSERT_FALSE(j0.loss_onsets.empty()) << "the poison did not spike the loss";
  EXPECT_EQ(j0.loss_onsets[0].onset_step, 300);
  const double ratio = PeakOverBaseline(gen0, 300);
  EXPECT_GT(ratio, 2.0);

  // Replay from step 200: the same spike, bit for bit.
  RunSpec replay = original;
  replay.telemetry = dir_.File("gen1.jsonl");
  replay.generation = 1;
  replay.resume_from = Ckpt(0, 200);
  auto gen1 = RunWorker(replay);
  ASSERT_EQ(gen1.size(), 200u);
  for (const auto& r : gen1) ASSERT_EQ(r.loss_hash(), At(gen0, r.step()).loss_hash()) << r.step();

  // Skip the batches around the onset: no spike through step 500.
  RunSpec skip = original;
  skip.telemetry = dir_.File("gen2.jsonl");
  skip.generation = 2;
  skip.resume_from = Ckpt(0, 200);
  skip.plan = "0-295,305-";
  skip.steps = 500;
  auto gen2 = RunWorker(skip);
  ASSERT_EQ(gen2.size(), 300u);
  EXPECT_EQ(At(gen2, 295).data_position(), 305);
  // The detector needs its warm-up: judge the skip run with the original's
  // history in front of it.
  std::vector<v1::StepReport> joined(gen0.begin(), gen0.begin() + 200);
  joined.insert(joined.end(), gen2.begin(), gen2.end());
  Judgement j2 = Judge(joined);
  EXPECT_TRUE(j2.loss_onsets.empty()) << "skip run spiked at " << j2.loss_onsets[0].onset_step;
  std::cout << "[figures] data: spike at step " << j0.loss_onsets[0].onset_step << ", loss "
            << At(gen0, 300).loss() << " = " << ratio
            << "x its 64-step median; replay identical; skip [295,305) clean; poison documents:";
  for (const auto& d : meta_.poisons[0].documents) std::cout << " " << d.domain << ":" << d.document;
  std::cout << "\n";
}

TEST_F(ScenarioTest, TransientBitflipSpikesOnceAndDoesNotReplay) {
  RunSpec original{.scenario = "transient", .corpus = MakeCorpus(),
                   .checkpoint_dir = dir_.File("ckpt"), .telemetry = dir_.File("gen0.jsonl"),
                   .bitflip_step = 250};
  auto gen0 = RunWorker(original);
  Judgement j0 = Judge(gen0);
  const bool loss_spike = !j0.loss_onsets.empty() && j0.loss_onsets[0].onset_step >= 250 &&
                          j0.loss_onsets[0].onset_step <= 252;
  const bool grad_spike = !j0.grad_onsets.empty() && j0.grad_onsets[0].onset_step == 250;
  EXPECT_TRUE(loss_spike || grad_spike) << "the bit flip left no spike";

  RunSpec replay = original;
  replay.telemetry = dir_.File("gen1.jsonl");
  replay.generation = 1;  // a process started in a later generation: no fault
  replay.resume_from = Ckpt(0, 200);
  auto gen1 = RunWorker(replay);
  ASSERT_EQ(gen1.size(), 150u);
  for (const auto& r : gen1) {
    if (r.step() < 250) {
      ASSERT_EQ(r.loss_hash(), At(gen0, r.step()).loss_hash()) << r.step();
    }
  }
  std::vector<v1::StepReport> joined(gen0.begin(), gen0.begin() + 200);
  joined.insert(joined.end(), gen1.begin(), gen1.end());
  Judgement j1 = Judge(joined);
  EXPECT_TRUE(j1.loss_onsets.empty());
  for (const auto& e : j1.grad_onsets) {
    // Healthy grad norms wander; only the fault's step matters here.
    EXPECT_NE(e.onset_step, 250) << "the replay spiked at the fault's step";
    std::cout << "replay grad-norm event at " << e.onset_step << " z=" << e.onset_z << "\n";
  }
  std::cout << "[figures] transient: grad norm at 250 = " << At(gen0, 250).grad_norm()
            << " (replay: " << At(gen1, 250).grad_norm() << "), loss at 251 = "
            << At(gen0, 251).loss() << " (replay: " << At(gen1, 251).loss() << ")\n";
}

TEST_F(ScenarioTest, Fp16OverflowIsNonFiniteAndReproducible) {
  RunSpec original{.scenario = "numerics", .corpus = MakeCorpus(),
                   .checkpoint_dir = dir_.File("ckpt"), .telemetry = dir_.File("gen0.jsonl")};
  auto gen0 = RunWorker(original);
  Judgement j0 = Judge(gen0);
  ASSERT_GE(j0.first_nonfinite_step, 0) << "no overflow";
  const int64_t first = j0.first_nonfinite_step;
  // Replay from the newest checkpoint before the first non-finite step.
  const int64_t from = (first / 50) * 50;
  RunSpec replay = original;
  replay.telemetry = dir_.File("gen1.jsonl");
  replay.generation = 1;
  if (from > 0) replay.resume_from = Ckpt(0, from);
  auto gen1 = RunWorker(replay);
  std::vector<v1::StepReport> joined;
  for (const auto& r : gen0) if (r.step() < from) joined.push_back(r);
  joined.insert(joined.end(), gen1.begin(), gen1.end());
  EXPECT_EQ(Judge(joined).first_nonfinite_step, first);
  EXPECT_EQ(At(gen1, first).nonfinite_count(), At(gen0, first).nonfinite_count());
  std::cout << "[figures] numerics: first non-finite at step " << first << " ("
            << At(gen0, first).nonfinite_count() << " values), reproduced from step " << from
            << "\n";
}

TEST_F(ScenarioTest, FragilityLogitsGrowThenSpikeSkipDoesNotHelpLowerLrDoes) {
  RunSpec original{.scenario = "fragility", .corpus = MakeCorpus(),
                   .checkpoint_dir = dir_.File("ckpt"), .telemetry = dir_.File("gen0.jsonl"),
                   .steps = 1300};
  auto gen0 = RunWorker(original);
  ASSERT_EQ(gen0.size(), 1300u);
  Judgement j0 = Judge(gen0);
  ASSERT_FALSE(j0.loss_onsets.empty() && j0.grad_onsets.empty()) << "no spike in 1300 steps";
  int64_t onset = std::numeric_limits<int64_t>::max();
  if (!j0.loss_onsets.empty()) onset = j0.loss_onsets[0].onset_step;
  if (!j0.grad_onsets.empty()) onset = std::min(onset, j0.grad_onsets[0].onset_step);
  EXPECT_GE(onset, 800) << "the spike should come after a long precursor";
  auto max_logit = [](const v1::StepReport& r) {
    double m = 0;
    for (const auto& l : r.layers()) m = std::max(m, l.max_attn_logit());
    return m;
  };
  // The precursor: max attention logits past the 1e3 warning level for
  // hundreds of steps, still climbing into the spike.
  EXPECT_GT(max_logit(At(gen0, onset - 400)), 1e3);
  EXPECT_GT(max_logit(At(gen0, onset - 1)), 3.0 * max_logit(At(gen0, onset - 600)));
  std::cout << "[figures] fragility: first spike at step " << onset << "; max attention logit";
  for (int64_t s = 100; s < 1300; s += 200) std::cout << " " << s << ":" << max_logit(At(gen0, s));
  std::cout << "\n";

  // Rewind to the checkpoint 100-200 steps before the onset.
  const int64_t from = ((onset - 100) / 100) * 100;
  const int64_t horizon = onset + 250;
  auto joined_with = [&](const std::vector<v1::StepReport>& probe) {
    std::vector<v1::StepReport> joined;
    for (const auto& r : gen0) if (r.step() < from) joined.push_back(r);
    joined.insert(joined.end(), probe.begin(), probe.end());
    return Judge(joined);
  };
  // Skipping the batches around the spike does not prevent one.
  RunSpec skip = original;
  skip.telemetry = dir_.File("gen1.jsonl");
  skip.generation = 1;
  skip.resume_from = Ckpt(0, from);
  skip.plan = absl::StrFormat("0-%d,%d-", onset - 2, onset + 3);
  skip.steps = horizon;
  Judgement j1 = joined_with(RunWorker(skip));
  EXPECT_FALSE(j1.loss_onsets.empty() && j1.grad_onsets.empty())
      << "the skip removed the spike: this scenario should be fragility, not data";
  // Peak lr x 0.7 from the same checkpoint trains through.
  RunSpec lower = original;
  lower.telemetry = dir_.File("gen2.jsonl");
  lower.generation = 2;
  lower.resume_from = Ckpt(0, from);
  lower.steps = horizon;
  lower.lr_scale = 0.7;
  auto gen2 = RunWorker(lower);
  Judgement j2 = joined_with(gen2);
  EXPECT_TRUE(j2.loss_onsets.empty()) << "loss spike at " << j2.loss_onsets[0].onset_step;
  EXPECT_TRUE(j2.grad_onsets.empty()) << "grad-norm spike at " << j2.grad_onsets[0].onset_step;
  const int64_t skip_spike = !j1.loss_onsets.empty()   ? j1.loss_onsets[0].onset_step
                             : !j1.grad_onsets.empty() ? j1.grad_onsets[0].onset_step
                                                       : -1;
  std::cout << "[figures] fragility: skip probe spiked at " << skip_spike
            << "; lr x 0.7 from step " << from << " clean through step " << horizon
            << " (loss " << gen2.back().loss() << ")\n";
}

TEST_F(ScenarioTest, CleanRunHasNoSpike) {
  RunSpec clean{.scenario = "clean", .corpus = MakeCorpus(), .checkpoint_dir = dir_.File("ckpt"),
                .telemetry = dir_.File("gen0.jsonl")};
  auto gen0 = RunWorker(clean);
  ASSERT_EQ(gen0.size(), 2000u);
  Judgement j = Judge(gen0);
  EXPECT_TRUE(j.loss_onsets.empty()) << "loss spike at " << j.loss_onsets[0].onset_step;
  EXPECT_EQ(j.first_nonfinite_step, -1);
  EXPECT_LT(gen0.back().loss(), 0.6 * gen0.front().loss());
  std::cout << "[figures] clean: loss " << gen0.front().loss() << " -> " << gen0.back().loss()
            << " over 2000 steps, " << j.grad_onsets.size() << " grad-norm events, no loss spike\n";
}

}  // namespace
}  // namespace spikeguard::testing
