#include "daemon/detect/localize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace spikeguard::detect {

std::optional<Departure> FindDeparture(const std::vector<int64_t>& steps,
                                       const std::vector<double>& values,
                                       const DepartureOptions& options) {
  const int n = static_cast<int>(std::min(steps.size(), values.size()));
  const int m = std::max(3, options.min_segment);
  // The baseline before a change point must be long enough to pin its own
  // slope: with a short one, the baseline slope and the extra slope trade off
  // against each other and the "extra rise" is noise.
  const int pre = std::max(m, n / 8);
  if (n < pre + m + 1) return std::nullopt;
  // Steps scaled to [0, 1] keep the normal equations well conditioned.
  const double s0 = static_cast<double>(steps[0]);
  const double span = std::max(1.0, static_cast<double>(steps[n - 1]) - s0);
  std::vector<double> s(n), y(n);
  for (int i = 0; i < n; ++i) {
    s[i] = (static_cast<double>(steps[i]) - s0) / span;
    y[i] = values[i];
  }
  // Suffix sums over i >= k of s, s², y, s·y; totals are the k = 0 entries.
  std::vector<double> S1(n + 1, 0), S2(n + 1, 0), Y1(n + 1, 0), SY(n + 1, 0);
  double Y2 = 0;
  for (int i = n - 1; i >= 0; --i) {
    S1[i] = S1[i + 1] + s[i];
    S2[i] = S2[i + 1] + s[i] * s[i];
    Y1[i] = Y1[i + 1] + y[i];
    SY[i] = SY[i + 1] + s[i] * y[i];
    Y2 += y[i] * y[i];
  }
  // The basis (1, s) is the same for every candidate k; only the hinge
  // column h changes. Block elimination (the Schur complement of the (1, s)
  // block) turns each candidate's 3x3 least-squares solve into a few
  // multiply-adds: with B the (1, s) normal matrix, u = (Σh, Σs·h),
  // w = Σh², e = Σh·y − uᵀB⁻¹r₁₂ and d = w − uᵀB⁻¹u, the hinge slope is e/d
  // and the fit removes e²/d more squared error than the straight line.
  const double b00 = static_cast<double>(n), b01 = S1[0], b11 = S2[0];
  const double det = b00 * b11 - b01 * b01;
  if (!(std::abs(det) > 1e-12 * std::max(1.0, b00 * b11))) return std::nullopt;
  const double i00 = b11 / det, i01 = -b01 / det, i11 = b00 / det;  // B⁻¹
  const double beta0 = i00 * Y1[0] + i01 * SY[0], beta1 = i01 * Y1[0] + i11 * SY[0];
  const double line_sse = Y2 - (beta0 * Y1[0] + beta1 * SY[0]);
  double best_gain = -std::numeric_limits<double>::infinity();
  int best_k = -1;
  double best_x[3] = {0, 0, 0};
  for (int k = pre; k <= n - m; ++k) {
    const double c = s[k];
    const double cnt = n - k;
    const double sh = S1[k] - c * cnt;
    const double shh = S2[k] - 2 * c * S1[k] + c * c * cnt;
    const double ssh = S2[k] - c * S1[k];
    const double shy = SY[k] - c * Y1[k];
    const double v0 = i00 * sh + i01 * ssh, v1 = i01 * sh + i11 * ssh;  // B⁻¹u
    const double d = shh - (sh * v0 + ssh * v1);
    if (!(d > 1e-12 * std::max(1.0, shh))) continue;  // h is (nearly) a line
    const double e = shy - (sh * beta0 + ssh * beta1);
    const double gain = e * e / d;
    if (gain > best_gain) {
      best_gain = gain;
      best_k = k;
      best_x[2] = e / d;
      best_x[0] = beta0 - v0 * best_x[2];
      best_x[1] = beta1 - v1 * best_x[2];
    }
  }
  const double best_sse = line_sse - best_gain;
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

std::vector<std::string> Localization::Names() const {
  std::vector<std::string> out;
  for (const auto& o : order) out.push_back(absl::StrCat(o.signal, "@", o.layer));
  return out;
}

Localization Localize(const std::vector<SeriesHistory>& series, int64_t up_to_step,
                      const DepartureOptions& options) {
  Localization loc;
  std::vector<int64_t> steps;
  std::vector<double> values;
  for (const SeriesHistory& h : series) {
    if (h.layer < 0) continue;
    steps.clear();
    values.clear();
    for (size_t i = 0; i < h.steps.size() && i < h.values.size(); ++i) {
      if (h.steps[i] > up_to_step) break;
      if (!std::isfinite(h.values[i])) continue;
      steps.push_back(h.steps[i]);
      values.push_back(h.values[i]);
    }
    if (auto d = FindDeparture(steps, values, options)) {
      loc.order.push_back(LocalizedSeries{h.signal, h.layer, *d});
    }
  }
  std::stable_sort(loc.order.begin(), loc.order.end(),
                   [](const LocalizedSeries& a, const LocalizedSeries& b) {
                     if (a.departure.step != b.departure.step) {
                       return a.departure.step < b.departure.step;
                     }
                     return a.departure.significance > b.departure.significance;
                   });
  return loc;
}

}  // namespace spikeguard::detect
