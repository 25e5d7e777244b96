#include "daemon/detect/eval/baselines.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

double Noisy(std::mt19937_64& rng) {
  std::normal_distribution<double> n(0, 0.01);
  return 2.0 * (1 + n(rng));
}

TEST(LlmcOutlierDetectorTest, NoScoreUntilTheBufferIsFull) {
  LlmcOutlierDetector d;
  std::mt19937_64 rng(1);
  for (int s = 0; s < 128; ++s) {
    EXPECT_TRUE(std::isnan(d.ZScore(100)));
    EXPECT_FALSE(d.Observe(s, s == 100 ? 100.0 : Noisy(rng)).has_value());
  }
  EXPECT_FALSE(std::isnan(d.ZScore(2.0)));
}

TEST(LlmcOutlierDetectorTest, SmallZOnNoiseLargeZOnASpike) {
  LlmcOutlierDetector d;
  std::mt19937_64 rng(2);
  for (int s = 0; s < 300; ++s) EXPECT_FALSE(d.Observe(s, Noisy(rng)).has_value());
  EXPECT_LT(std::abs(d.ZScore(2.0)), 1.0);
  auto a = d.Observe(300, 3.0);
  ASSERT_TRUE(a.has_value());
  EXPECT_GT(a->score, 7);
  // The outlier entered the buffer (as upstream): the same value again
  // scores much lower.
  EXPECT_LT(d.ZScore(3.0), a->score / 2);
}

TEST(OlmoSpikeRuleTest, NeedsSixtyFourSamplesThenMeanPlusSixSigma) {
  OlmoSpikeRule r;
  std::mt19937_64 rng(3);
  for (int s = 0; s < 64; ++s) EXPECT_FALSE(r.Observe(s, s == 63 ? 50.0 : Noisy(rng)).has_value());
  OlmoSpikeRule r2;
  for (int s = 0; s < 200; ++s) r2.Observe(s, Noisy(rng));
  EXPECT_FALSE(r2.Observe(200, 2.05).has_value());
  EXPECT_TRUE(r2.Observe(201, 2.5).has_value());
}

TEST(FoundryKillLossSpikeTest, FiresOnTheFifthConsecutiveOutlier) {
  FoundryKillLossSpike f;
  for (int s = 0; s < 150; ++s) EXPECT_FALSE(f.Observe(s, 2.0).has_value());
  // Four outliers then normal: reset, no alarm.
  for (int s = 150; s < 154; ++s) EXPECT_FALSE(f.Observe(s, 5.0).has_value());
  EXPECT_FALSE(f.Observe(154, 2.0).has_value());
  int fired_at = -1;
  for (int s = 155; s < 165; ++s) {
    if (auto a = f.Observe(s, 5.0); a && a->kind == "spike") fired_at = s;
  }
  EXPECT_EQ(fired_at, 159);
}

TEST(FoundryKillLossSpikeTest, HighLossOverTheCap) {
  FoundryKillLossSpike f;
  // The cap becomes the max of the first full window (3.0).
  for (int s = 0; s < 100; ++s) f.Observe(s, s == 10 ? 3.0 : 2.0);
  bool high = false;
  // A slow climb to 3.5: never 2× the mean, but half the window over the cap.
  for (int s = 100; s < 400 && !high; ++s) {
    auto a = f.Observe(s, 2.0 + 1.5 * std::min(1.0, (s - 100) / 100.0));
    high = a && a->kind == "high_loss";
  }
  EXPECT_TRUE(high);
}

TEST(MegatronSpikyLossTest, TenTimesTheMaxOfTheFirstHundred) {
  MegatronSpikyLoss m;
  for (int s = 0; s < 100; ++s) EXPECT_FALSE(m.Observe(s, s == 0 ? 5.5 : 2.0).has_value());
  EXPECT_FALSE(m.Observe(100, 50.0).has_value());
  EXPECT_TRUE(m.Observe(101, 55.0).has_value());
  // Rising edge: still spiky, no second alarm.
  EXPECT_FALSE(m.Observe(102, 60.0).has_value());
  EXPECT_FALSE(m.Observe(103, std::nan("")).has_value());
}

TEST(WandbZScoreTest, ThreeSigmaOverThirty) {
  WandbZScore w;
  std::mt19937_64 rng(4);
  for (int s = 0; s < 30; ++s) EXPECT_FALSE(w.Observe(s, Noisy(rng)).has_value());
  EXPECT_TRUE(w.Observe(30, 2.2).has_value());
}

TEST(MakeBaselineTest, KnowsTheFiveAndRejectsOthers) {
  for (std::string_view n : kBaselineNames) {
    auto b = MakeBaseline(n);
    ASSERT_TRUE(b.ok()) << n;
    EXPECT_EQ((*b)->name(), n);
  }
  EXPECT_EQ(MakeBaseline("pytorch").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace spikeguard::detect
