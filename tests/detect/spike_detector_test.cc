#include "daemon/detect/spike_detector.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

double Healthy(int64_t step, std::mt19937_64& rng) {
  std::normal_distribution<double> noise(0.0, 0.015);
  return (1.8 + 3.0 * std::exp(-step / 400.0)) * (1.0 + noise(rng));
}

TEST(SpikeDetectorTest, SilentDuringWarmup) {
  SpikeDetector d(SpikeDetector::Options{});
  for (int s = 0; s < 63; ++s) EXPECT_FALSE(d.Observe(s, 2.0 + 0.01 * (s % 3)).has_value());
  // A huge value before 64 samples is not judged.
  EXPECT_FALSE(d.Observe(63, 100.0).has_value());
}

TEST(SpikeDetectorTest, SilentOnHealthyNoise) {
  std::mt19937_64 rng(1);
  SpikeDetector d(SpikeDetector::Options{});
  int events = 0;
  for (int s = 0; s < 20000; ++s) events += d.Observe(s, Healthy(s, rng)).has_value() ? 1 : 0;
  EXPECT_EQ(events, 0);
}

TEST(SpikeDetectorTest, FiresOnSpikeWithOnsetPeakAndRecovery) {
  std::mt19937_64 rng(2);
  SpikeDetector d(SpikeDetector::Options{});
  std::vector<SpikeEvent> events;
  for (int s = 0; s < 1000; ++s) {
    double v = Healthy(s, rng);
    if (s >= 600 && s < 606) v *= 1.0 + 2.0 * std::exp(-(s - 601) * (s - 601) / 2.0);
    if (auto e = d.Observe(s, v)) events.push_back(*e);
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].state, SpikeEvent::kOnset);
  EXPECT_EQ(events[0].onset_step, 600);
  EXPECT_EQ(events[1].state, SpikeEvent::kRecovered);
  EXPECT_EQ(events[1].peak_step, 601);
  EXPECT_GT(events[1].peak_value, 2.5 * events[1].baseline);
}

TEST(SpikeDetectorTest, RelativeFloorIgnoresTinyJumpsOnFlatSeries) {
  SpikeDetector d(SpikeDetector::Options{});
  for (int s = 0; s < 200; ++s) d.Observe(s, 2.0 + 1e-6 * (s % 5));
  // Huge z (MAD is tiny) but only 2 % above the median: not a spike.
  EXPECT_FALSE(d.Observe(200, 2.04).has_value());
  EXPECT_TRUE(d.Observe(201, 2.2).has_value());
}

TEST(SpikeDetectorTest, DivergenceIsReported) {
  SpikeDetector::Options o;
  o.recovery_steps = 20;
  SpikeDetector d(o);
  std::mt19937_64 rng(3);
  std::vector<SpikeEvent> events;
  for (int s = 0; s < 400; ++s) {
    double v = s < 300 ? Healthy(s, rng) : 6.0;
    if (auto e = d.Observe(s, v)) events.push_back(*e);
  }
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0].onset_step, 300);
  EXPECT_EQ(events[1].state, SpikeEvent::kDiverged);
}

TEST(SpikeDetectorTest, NonFiniteValuesAreNotSpikesAndDoNotPoisonTheWindow) {
  SpikeDetector d(SpikeDetector::Options{});
  std::mt19937_64 rng(4);
  for (int s = 0; s < 100; ++s) d.Observe(s, Healthy(s, rng));
  EXPECT_FALSE(d.Observe(100, std::numeric_limits<double>::quiet_NaN()).has_value());
  EXPECT_FALSE(d.Observe(101, std::numeric_limits<double>::infinity()).has_value());
  EXPECT_EQ(d.window_size(), 100u);
  EXPECT_FALSE(d.Observe(102, Healthy(102, rng)).has_value());
}

}  // namespace
}  // namespace spikeguard::detect

namespace spikeguard::detect {
namespace {

TEST(SpikeDetectorTest, RedeliveredStepsAreIgnored) {
  SpikeDetector d(SpikeDetector::Options{});
  std::mt19937_64 rng(5);
  for (int s = 0; s < 100; ++s) d.Observe(s, Healthy(s, rng));
  EXPECT_EQ(d.window_size(), 100u);
  // The same steps again (a re-delivered batch) neither fire nor fill.
  EXPECT_FALSE(d.Observe(50, 50.0).has_value());
  EXPECT_FALSE(d.Observe(99, 50.0).has_value());
  EXPECT_EQ(d.window_size(), 100u);
}

TEST(SpikeDetectorTest, AfterDivergenceTheNewLevelBecomesTheBaseline) {
  SpikeDetector::Options o;
  o.recovery_steps = 10;
  SpikeDetector d(o);
  std::mt19937_64 rng(6);
  std::vector<SpikeEvent> events;
  for (int s = 0; s < 600; ++s) {
    double v = s < 200 ? Healthy(s, rng) : 2.0 * Healthy(s, rng);
    if (auto e = d.Observe(s, v)) events.push_back(*e);
  }
  // One onset, one divergence, and silence at the new level afterwards.
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].state, SpikeEvent::kDiverged);
  EXPECT_FALSE(d.in_event());
  EXPECT_NEAR(d.baseline(), 2.0 * (1.8 + 3.0 * std::exp(-550 / 400.0)), 0.3);
}

TEST(SpikeDetectorTest, ResetForgetsTheWindow) {
  SpikeDetector d(SpikeDetector::Options{});
  for (int s = 0; s < 100; ++s) d.Observe(s, 2.0 + 0.01 * (s % 7));
  d.Reset();
  EXPECT_EQ(d.window_size(), 0u);
  EXPECT_FALSE(d.Score(10.0).has_value());
  // Steps may start again from zero after a reset (a new timeline).
  EXPECT_FALSE(d.Observe(0, 2.0).has_value());
  EXPECT_EQ(d.window_size(), 1u);
}

}  // namespace
}  // namespace spikeguard::detect
