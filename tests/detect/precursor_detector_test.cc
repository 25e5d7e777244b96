#include "daemon/detect/precursor_detector.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

// A healthy step with noise: grad norm falling from its warmup level,
// logits growing slowly, activations drifting up.
StepSample Healthy(int64_t s, int layers, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0, 1);
  StepSample x;
  x.step = s;
  x.loss = 2.0 + 3.0 * std::exp(-s / 400.0);
  x.grad_norm = 0.3 * (1 + 3 * std::exp(-s / 300.0)) * std::exp(0.15 * n(rng));
  x.clipped = x.grad_norm > 1.0;
  x.lse_mean = 5 * (1 + 0.01 * n(rng));
  x.lse_max = (x.lse_mean + 3) * (1 + 0.02 * n(rng));
  x.layers.resize(layers);
  for (int l = 0; l < layers; ++l) {
    LayerSample& y = x.layers[l];
    y.max_attn_logit = (20 + 5 * l) * (1 + 0.5 * (1 - std::exp(-s / 1000.0))) * std::exp(0.05 * n(rng));
    y.grad_norm = x.grad_norm * 0.5 * std::exp(0.1 * n(rng));
    y.update_ratio = 1e-3 * std::min(1.0, (s + 1) / 200.0) * std::exp(0.1 * n(rng));
    y.act_rms = (1 + 0.1 * l) * (1 + 0.2 * s / 20000.0) * std::exp(0.02 * n(rng));
    y.param_norm = 50;
  }
  return x;
}

TEST(PrecursorDetectorTest, SilentDuringWarmup) {
  PrecursorDetector p(PrecursorDetector::Options{});
  std::mt19937_64 rng(1);
  // Before the trend window and the baseline are full nothing is judged, even
  // a wild jump.
  for (int s = 0; s < 80; ++s) {
    StepSample x = Healthy(s, 4, rng);
    if (s > 60) x.layers[1].max_attn_logit *= 20;
    EXPECT_TRUE(p.Observe(x).empty()) << s;
  }
}

TEST(PrecursorDetectorTest, SilentOnHealthyNoiseOverLongRuns) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    PrecursorDetector p(PrecursorDetector::Options{});
    std::mt19937_64 rng(seed);
    int warnings = 0;
    for (int s = 0; s < 20000; ++s) warnings += static_cast<int>(p.Observe(Healthy(s, 4, rng)).size());
    EXPECT_EQ(warnings, 0) << "seed " << seed;
  }
}

TEST(PrecursorDetectorTest, AttentionLogitRampIsDatedToItsStart) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    PrecursorDetector p(PrecursorDetector::Options{});
    std::mt19937_64 rng(seed);
    const int64_t start = 1500;
    // ×500 over 400 steps: 30 → 15,000.
    const double rho = std::log(500.0) / 400;
    std::vector<PrecursorWarning> got;
    for (int s = 0; s < 2000; ++s) {
      StepSample x = Healthy(s, 4, rng);
      if (s > start) x.layers[2].max_attn_logit *= std::exp(rho * std::min<int64_t>(s - start, 400));
      for (auto& w : p.Observe(x)) got.push_back(w);
    }
    ASSERT_FALSE(got.empty()) << seed;
    const PrecursorWarning& trend = got[0];
    EXPECT_EQ(trend.kind, PrecursorWarning::kTrend);
    EXPECT_EQ(trend.signal, "max_attn_logit");
    EXPECT_EQ(trend.layer, 2);
    EXPECT_NEAR(static_cast<double>(trend.start_step), start, 5) << seed;
    // Raised while the logits were still far below the level alarms.
    EXPECT_LT(trend.value, 1e3);
    EXPECT_GT(trend.step, start);
    int warn = 0, crit = 0;
    for (const auto& w : got) {
      EXPECT_EQ(w.layer, 2) << w.signal;
      if (w.kind == PrecursorWarning::kLevelWarn) {
        ++warn;
        EXPECT_GE(w.value, 1e3);
        EXPECT_NEAR(static_cast<double>(w.start_step), start, 10);
      }
      if (w.kind == PrecursorWarning::kLevelCritical) {
        ++crit;
        EXPECT_GE(w.value, 1e4);
      }
    }
    EXPECT_EQ(warn, 1);
    EXPECT_EQ(crit, 1);
  }
}

TEST(PrecursorDetectorTest, LevelAlarmsNeedPersistence) {
  PrecursorDetector::Options o;
  o.persistence_steps = 5;
  PrecursorDetector p(o);
  std::mt19937_64 rng(4);
  int level = 0;
  for (int s = 0; s < 400; ++s) {
    StepSample x = Healthy(s, 2, rng);
    // Four steps over 1e3, then back: not a level alarm.
    if (s >= 300 && s < 304) x.layers[0].max_attn_logit = 2e3;
    for (auto& w : p.Observe(x)) level += w.kind != PrecursorWarning::kTrend;
  }
  EXPECT_EQ(level, 0);
}

TEST(PrecursorDetectorTest, ClipRateRiseWarns) {
  PrecursorDetector p(PrecursorDetector::Options{});
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<PrecursorWarning> got;
  for (int s = 0; s < 3000; ++s) {
    StepSample x = Healthy(s, 0, rng);
    // 5 % of steps clipped, then from step 2000 on 80 %.
    x.clipped = u(rng) < (s < 2000 ? 0.05 : 0.8);
    for (auto& w : p.Observe(x)) got.push_back(w);
  }
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0].signal, "clip_rate");
  EXPECT_EQ(got[0].layer, -1);
  EXPECT_GE(got[0].step, 2000);
  EXPECT_NEAR(static_cast<double>(got[0].start_step), 2000, 40);
}

TEST(PrecursorDetectorTest, MemoryIsBoundedRegardlessOfRunLength) {
  PrecursorDetector::Options o;
  PrecursorDetector p(o);
  std::mt19937_64 rng(6);
  size_t at_10k = 0;
  for (int s = 0; s < 100000; ++s) {
    // Healthy statistics of a mid-run stretch, over and over.
    StepSample x = Healthy(1000 + s % 5000, 4, rng);
    x.step = s;
    p.Observe(x);
    if (s == 10000) at_10k = p.footprint();
  }
  EXPECT_EQ(p.series_count(), 4u + 4u * 4u);
  const size_t per_series =
      static_cast<size_t>(2 * o.lookback + o.baseline_window + 2 * o.smooth + o.baseline_window);
  EXPECT_LE(p.footprint(), p.series_count() * per_series + static_cast<size_t>(o.clip_window));
  EXPECT_EQ(p.footprint(), at_10k);
}

}  // namespace
}  // namespace spikeguard::detect
