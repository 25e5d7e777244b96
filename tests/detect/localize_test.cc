#include "daemon/detect/localize.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <vector>

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

// The broken-line fit written out plainly: for every candidate change
// point, the full 3x3 normal equations of the basis (1, s, max(0, s - c))
// solved with partial pivoting, the least squared error kept. FindDeparture
// solves the same fits by block elimination; it must choose the same point.
std::optional<Departure> PlainFindDeparture(const std::vector<int64_t>& steps,
                                            const std::vector<double>& values,
                                            const DepartureOptions& options) {
  const int n = static_cast<int>(std::min(steps.size(), values.size()));
  const int m = std::max(3, options.min_segment);
  const int pre = std::max(m, n / 8);
  if (n < pre + m + 1) return std::nullopt;
  const double s0 = static_cast<double>(steps[0]);
  const double span = std::max(1.0, static_cast<double>(steps[n - 1]) - s0);
  std::vector<double> s(n);
  for (int i = 0; i < n; ++i) s[i] = (static_cast<double>(steps[i]) - s0) / span;
  double best_sse = std::numeric_limits<double>::infinity();
  int best_k = -1;
  double best_x[3] = {0, 0, 0};
  for (int k = pre; k <= n - m; ++k) {
    double a[3][4] = {};
    for (int i = 0; i < n; ++i) {
      const double basis[3] = {1, s[i], std::max(0.0, s[i] - s[k])};
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 3; ++c) a[r][c] += basis[r] * basis[c];
        a[r][3] += basis[r] * values[i];
      }
    }
    bool singular = false;
    for (int c = 0; c < 3 && !singular; ++c) {
      int p = c;
      for (int r = c + 1; r < 3; ++r) {
        if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
      }
      if (std::abs(a[p][c]) < 1e-12) singular = true;
      for (int j = 0; j < 4 && !singular; ++j) std::swap(a[c][j], a[p][j]);
      for (int r = 0; r < 3 && !singular; ++r) {
        if (r == c) continue;
        const double f = a[r][c] / a[c][c];
        for (int j = c; j < 4; ++j) a[r][j] -= f * a[c][j];
      }
    }
    if (singular) continue;
    double x[3];
    for (int r = 0; r < 3; ++r) x[r] = a[r][3] / a[r][r];
    double sse = 0;
    for (int i = 0; i < n; ++i) {
      const double e = values[i] - (x[0] + x[1] * s[i] + x[2] * std::max(0.0, s[i] - s[k]));
      sse += e * e;
    }
    if (sse < best_sse) {
      best_sse = sse;
      best_k = k;
      std::copy(x, x + 3, best_x);
    }
  }
  if (best_k < 0 || best_x[2] <= 0) return std::nullopt;
  const double sigma = std::sqrt(std::max(best_sse, 0.0) / std::max(1, n - 4));
  Departure d;
  d.step = steps[best_k];
  d.rise = best_x[2] * (s[n - 1] - s[best_k]);
  d.significance = d.rise / std::max(sigma, 1e-12);
  d.baseline = best_x[0] + best_x[1] * s[best_k];
  if (d.rise < options.min_rise || d.significance < options.noise_factor) return std::nullopt;
  return d;
}

TEST(FindDepartureTest, ChoosesThePointThePlainLeastSquaresFitChooses) {
  // Random lengths, strides, hinges, slopes, noise and options; a case a
  // tolerance could flip (significance or rise within 1e-6 of its bound) is
  // not compared for found / not found.
  std::mt19937_64 rng(20261203);
  std::normal_distribution<double> g;
  std::uniform_real_distribution<double> u(0, 1);
  int found = 0;
  for (int t = 0; t < 600; ++t) {
    const int n = 8 + static_cast<int>(rng() % 200);
    const int64_t first = static_cast<int64_t>(rng() % 100000);
    const int stride = 1 + static_cast<int>(rng() % 5);
    const int hinge = static_cast<int>(rng() % n);
    const double slope = u(rng) < 0.3 ? 0 : u(rng) * 5;
    const double noise = u(rng) * 0.5, base = 3 * g(rng);
    std::vector<int64_t> steps;
    std::vector<double> values;
    for (int i = 0; i < n; ++i) {
      const double x = static_cast<double>(i) / n;
      steps.push_back(first + static_cast<int64_t>(i) * stride);
      values.push_back(base + 0.1 * x + (i > hinge ? slope * (x - double(hinge) / n) : 0) +
                       noise * g(rng));
    }
    DepartureOptions o;
    o.min_rise = u(rng) * 0.5;
    o.noise_factor = 1 + u(rng) * 3;
    o.min_segment = 3 + static_cast<int>(rng() % 8);
    DepartureOptions loose = o;
    loose.min_rise = 0;
    loose.noise_factor = 0;
    const auto want = PlainFindDeparture(steps, values, loose);
    const auto got = FindDeparture(steps, values, loose);
    ASSERT_EQ(want.has_value(), got.has_value()) << "case " << t;
    if (!want) continue;
    ++found;
    EXPECT_EQ(got->step, want->step) << "case " << t << ", n " << n;
    EXPECT_NEAR(got->rise, want->rise, 1e-6 * std::max(1.0, std::abs(want->rise))) << t;
    EXPECT_NEAR(got->baseline, want->baseline, 1e-6 * std::max(1.0, std::abs(want->baseline)));
    const bool near_bound = std::abs(want->rise - o.min_rise) < 1e-6 ||
                            std::abs(want->significance - o.noise_factor) < 1e-6 * o.noise_factor;
    if (!near_bound) {
      EXPECT_EQ(FindDeparture(steps, values, o).has_value(),
                PlainFindDeparture(steps, values, o).has_value())
          << "case " << t;
    }
  }
  EXPECT_GT(found, 200);  // the comparison covered fits, not only refusals
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
