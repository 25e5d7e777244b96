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

// Max attention logit of a series that rises fast from ~0.1 at init to
// `level` over the first ~50 steps (as the reference worker's logits do),
// then sits there with noise, and grows by ×`growth` per step from `start`
// on (start < 0: never).
double WarmupThenGrowth(int64_t s, double level, int64_t start, double growth,
                        std::mt19937_64& rng) {
  std::normal_distribution<double> n(0, 1);
  double v = 0.1 + (level - 0.1) * (1 - std::exp(-s / 12.0));
  if (start >= 0 && s > start) v *= std::pow(growth, static_cast<double>(s - start));
  return v * std::exp(0.05 * n(rng));
}

// The warm-up rise of the logits is not the precursor: the onset is where
// the abnormal growth after it began (it used to be dated at step 2, the
// first smoothed point, which no rewind checkpoint can precede).
TEST(PrecursorDetectorTest, GrowthAfterWarmupRiseIsDatedToItsStartNotToTheWarmup) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    PrecursorDetector p(PrecursorDetector::Options{});
    std::mt19937_64 rng(seed);
    const int64_t start = 600;
    // ×500 over 400 steps.
    const double g = std::pow(500.0, 1.0 / 400);
    std::vector<PrecursorWarning> got;
    for (int s = 0; s < 1200; ++s) {
      StepSample x = Healthy(s, 4, rng);
      x.layers[1].max_attn_logit = WarmupThenGrowth(s, 30, start, g, rng);
      for (auto& w : p.Observe(x)) got.push_back(w);
    }
    ASSERT_FALSE(got.empty()) << seed;
    EXPECT_EQ(got[0].kind, PrecursorWarning::kTrend) << seed;
    int warn = 0, crit = 0;
    for (const auto& w : got) {
      EXPECT_EQ(w.signal, "max_attn_logit") << seed;
      EXPECT_EQ(w.layer, 1) << seed;
      EXPECT_GE(w.start_step, 100) << seed << " " << PrecursorKindName(w.kind);
      EXPECT_NEAR(static_cast<double>(w.start_step), start, 15)
          << seed << " " << PrecursorKindName(w.kind);
      EXPECT_GT(w.step, start) << seed;
      warn += w.kind == PrecursorWarning::kLevelWarn;
      crit += w.kind == PrecursorWarning::kLevelCritical;
    }
    EXPECT_EQ(warn, 1) << seed;
    EXPECT_EQ(crit, 1) << seed;
  }
}

// Growth that crosses the level alarm before the trend alarms start (step
// 500), with the warm-up rise still inside the lookback window.
TEST(PrecursorDetectorTest, EarlyLevelAlarmIsDatedAfterTheWarmup) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    PrecursorDetector p(PrecursorDetector::Options{});
    std::mt19937_64 rng(seed);
    const int64_t start = 250;
    // ×1000 over 250 steps: 30 → 1e3 about 125 steps after the start.
    const double g = std::pow(1000.0, 1.0 / 250);
    std::vector<PrecursorWarning> got;
    for (int s = 0; s < 480; ++s) {
      StepSample x = Healthy(s, 2, rng);
      x.layers[0].max_attn_logit = WarmupThenGrowth(s, 30, start, g, rng);
      for (auto& w : p.Observe(x)) got.push_back(w);
    }
    ASSERT_FALSE(got.empty()) << seed;
    EXPECT_EQ(got[0].kind, PrecursorWarning::kLevelWarn) << seed;
    EXPECT_GE(got[0].value, 1e3);
    EXPECT_GE(got[0].start_step, 100) << seed;
    EXPECT_NEAR(static_cast<double>(got[0].start_step), start, 25) << seed;
    EXPECT_LT(got[0].start_step, got[0].step - 50) << seed;
  }
}

// The reference worker's fragility and numerics runs: the logits climb from
// ~0.2 at init without ever sitting flat, through the lr warm-up, and pass
// 1e3 near step 500. The level alarm used to be dated at step 2 (the first
// point of its lookback: no change point in a steadily bending climb), where
// no checkpoint exists; it is dated after the warm-up now.
TEST(PrecursorDetectorTest, LogitsClimbingFromInitAreNotDatedToTheFirstSteps) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    PrecursorDetector p(PrecursorDetector::Options{});
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> n(0, 1);
    std::vector<PrecursorWarning> got;
    for (int s = 0; s < 1000; ++s) {
      StepSample x = Healthy(s, 4, rng);
      // 0.2 → ~17 at step 100 → 1e3 at 500 → ~1e4 at 900.
      x.layers[1].max_attn_logit =
          0.2 * std::pow(5000.0, std::pow(s / 500.0, 0.4)) * std::exp(0.05 * n(rng));
      for (auto& w : p.Observe(x)) got.push_back(w);
    }
    ASSERT_FALSE(got.empty()) << seed;
    bool warned = false;
    for (const auto& w : got) {
      EXPECT_EQ(w.layer, 1) << seed << " " << w.signal;
      EXPECT_GE(w.start_step, 100) << seed << " " << PrecursorKindName(w.kind);
      EXPECT_LE(w.start_step, w.step);
      if (w.kind == PrecursorWarning::kLevelWarn) {
        warned = true;
        EXPECT_NEAR(static_cast<double>(w.step), 500, 30) << seed;
      }
    }
    EXPECT_TRUE(warned) << seed;
  }
}

TEST(PrecursorDetectorTest, FlatSeriesAfterWarmupRiseRaisesNothing) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    PrecursorDetector p(PrecursorDetector::Options{});
    std::mt19937_64 rng(seed);
    int warnings = 0;
    for (int s = 0; s < 6000; ++s) {
      StepSample x = Healthy(s, 4, rng);
      for (int l = 0; l < 4; ++l) {
        x.layers[l].max_attn_logit = WarmupThenGrowth(s, 20 + 10 * l, -1, 1, rng);
      }
      warnings += static_cast<int>(p.Observe(x).size());
    }
    EXPECT_EQ(warnings, 0) << seed;
    // The history kept for localization starts after the warm-up.
    for (const SeriesHistory& h : p.Histories()) {
      if (!h.steps.empty()) {
        EXPECT_GE(h.steps.front(), 100) << h.signal;
      }
    }
  }
}

// Level alarms are absolute: logits already past 1e3 (or 1e4) at the end
// of the warm-up still warn (critical), dated at the first step over.
TEST(PrecursorDetectorTest, LevelAlarmsFireEvenWithoutABaseline) {
  PrecursorDetector p(PrecursorDetector::Options{});
  std::mt19937_64 rng(9);
  std::vector<PrecursorWarning> got;
  for (int s = 0; s < 300; ++s) {
    StepSample x = Healthy(s, 1, rng);
    x.layers[0].max_attn_logit = WarmupThenGrowth(s, 2e4, -1, 1, rng);
    for (auto& w : p.Observe(x)) got.push_back(w);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, PrecursorWarning::kLevelWarn);
  EXPECT_EQ(got[1].kind, PrecursorWarning::kLevelCritical);
  for (const auto& w : got) {
    EXPECT_EQ(w.start_step, w.step - 4) << PrecursorKindName(w.kind);
    EXPECT_LT(w.step, 100);
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

// The Python Supervisor measures update-to-weight ratios every 10 steps and
// repeats the last measurement in the reports between
// (spikeguard.torch.Telemetry's update_every). On such a series the update
// ratio's precursor still warns, dated within one cadence of its start,
// and healthy noise stays silent.
TEST(PrecursorDetectorTest, UpdateRatioMeasuredEveryTenStepsStillWarnsNearItsStart) {
  constexpr int kEvery = 10;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    PrecursorDetector quiet(PrecursorDetector::Options{});
    PrecursorDetector p(PrecursorDetector::Options{});
    std::mt19937_64 rng(seed), rng2(seed + 100);
    const int64_t start = 1500;
    // ×20 over 300 steps.
    const double rho = std::log(20.0) / 300;
    std::vector<double> held(4), held_quiet(4);
    std::vector<PrecursorWarning> got;
    int quiet_warnings = 0;
    for (int s = 0; s < 6000; ++s) {
      StepSample q = Healthy(s, 4, rng2);
      StepSample x = Healthy(s, 4, rng);
      if (s > start) x.layers[1].update_ratio *= std::exp(rho * std::min<int64_t>(s - start, 300));
      for (int l = 0; l < 4; ++l) {
        if (s % kEvery == 0) {
          held[l] = x.layers[l].update_ratio;
          held_quiet[l] = q.layers[l].update_ratio;
        }
        x.layers[l].update_ratio = held[l];
        q.layers[l].update_ratio = held_quiet[l];
      }
      quiet_warnings += static_cast<int>(quiet.Observe(q).size());
      if (s < 2000) {
        for (auto& w : p.Observe(x)) got.push_back(w);
      }
    }
    EXPECT_EQ(quiet_warnings, 0) << seed;
    ASSERT_FALSE(got.empty()) << seed;
    EXPECT_EQ(got[0].signal, "update_ratio");
    EXPECT_EQ(got[0].layer, 1);
    EXPECT_NEAR(static_cast<double>(got[0].start_step), start, kEvery + 5) << seed;
    EXPECT_LT(got[0].step, start + 300) << seed;
  }
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
