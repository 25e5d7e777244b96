#include "daemon/detect/localize.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

// A log-space series: flat (or drifting) with noise, then an extra slope
// from `start` on.
SeriesHistory Ramp(const std::string& signal, int layer, int64_t first, int n, int64_t start,
                   double slope, double drift, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0, 0.03);
  SeriesHistory h;
  h.signal = signal;
  h.layer = layer;
  for (int i = 0; i < n; ++i) {
    const int64_t s = first + i;
    double y = 3.0 + drift * i + noise(rng);
    if (start >= 0 && s > start) y += slope * static_cast<double>(s - start);
    h.steps.push_back(s);
    h.values.push_back(y);
  }
  return h;
}

TEST(FindDepartureTest, DatesARampWithinAFewSteps) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SeriesHistory h = Ramp("max_attn_logit", 2, 1000, 512, 1300, 0.01, 0, seed);
    auto d = FindDeparture(h.steps, h.values);
    ASSERT_TRUE(d.has_value()) << seed;
    EXPECT_NEAR(static_cast<double>(d->step), 1300, 8) << seed;
    EXPECT_NEAR(d->rise, 0.01 * (1511 - 1300), 0.2);
  }
}

TEST(FindDepartureTest, NoiseAndSteadyDriftAreNotDepartures) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SeriesHistory flat = Ramp("act_rms", 0, 0, 512, -1, 0, 0, seed);
    EXPECT_FALSE(FindDeparture(flat.steps, flat.values).has_value()) << seed;
    // Grows 0.5 in log space over the window, but steadily.
    SeriesHistory drift = Ramp("act_rms", 0, 0, 512, -1, 0, 0.001, seed);
    EXPECT_FALSE(FindDeparture(drift.steps, drift.values).has_value()) << seed;
  }
}

TEST(FindDepartureTest, TooShortIsNothing) {
  EXPECT_FALSE(FindDeparture({1, 2, 3}, {1, 2, 3}).has_value());
}

TEST(LocalizeTest, OrdersLayersByDepartureAndNamesTheEarliest) {
  std::vector<SeriesHistory> h = {
      Ramp("grad_norm", 0, 0, 512, 420, 0.02, 0, 1),      // departs last
      Ramp("max_attn_logit", 3, 0, 512, 250, 0.01, 0, 2),  // departs first
      Ramp("act_rms", 1, 0, 512, 330, 0.01, 0, 3),
      Ramp("update_ratio", 2, 0, 512, -1, 0, 0, 4),        // never departs
      Ramp("lse_max", -1, 0, 512, 100, 0.05, 0, 5),        // run level: not localized
  };
  Localization loc = Localize(h, 511);
  ASSERT_EQ(loc.order.size(), 3u);
  EXPECT_EQ(loc.order[0].signal, "max_attn_logit");
  EXPECT_EQ(loc.order[0].layer, 3);
  EXPECT_NEAR(static_cast<double>(loc.order[0].departure.step), 250, 8);
  EXPECT_EQ(loc.order[1].layer, 1);
  EXPECT_EQ(loc.order[2].layer, 0);
  EXPECT_EQ(loc.Names()[0], "max_attn_logit@3");
}

TEST(LocalizeTest, PointsAfterTheCutoffDoNotCount) {
  // Layer 0 only moves after step 400 (the spike itself): not a precursor
  // when localizing an onset at 400.
  std::vector<SeriesHistory> h = {Ramp("grad_norm", 0, 0, 512, 400, 0.05, 0, 1),
                                  Ramp("max_attn_logit", 1, 0, 512, 200, 0.01, 0, 2)};
  Localization loc = Localize(h, 399);
  ASSERT_EQ(loc.order.size(), 1u);
  EXPECT_EQ(loc.order[0].layer, 1);
}

}  // namespace
}  // namespace spikeguard::detect
