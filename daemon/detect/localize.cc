#include "daemon/detect/localize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace spikeguard::detect {
namespace {

// Solves the 3×3 system A·x = r (A symmetric); false when singular.
bool Solve3(double A[3][3], double r[3], double x[3]) {
  double m[3][4];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) m[i][j] = A[i][j];
    m[i][3] = r[i];
  }
  for (int c = 0; c < 3; ++c) {
    int p = c;
    for (int i = c + 1; i < 3; ++i) {
      if (std::abs(m[i][c]) > std::abs(m[p][c])) p = i;
    }
    if (std::abs(m[p][c]) < 1e-12) return false;
    for (int j = 0; j < 4; ++j) std::swap(m[c][j], m[p][j]);
    for (int i = 0; i < 3; ++i) {
      if (i == c) continue;
      const double f = m[i][c] / m[c][c];
      for (int j = c; j < 4; ++j) m[i][j] -= f * m[c][j];
    }
  }
  for (int i = 0; i < 3; ++i) x[i] = m[i][3] / m[i][i];
  return true;
}

}  // namespace

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
  double best_sse = std::numeric_limits<double>::infinity();
  int best_k = -1;
  double best_x[3] = {0, 0, 0};
  for (int k = pre; k <= n - m; ++k) {
    const double c = s[k];
    const double cnt = n - k;
    // Basis (1, s, h) with h = max(0, s − c), nonzero for i >= k.
    const double sh = S1[k] - c * cnt;
    const double shh = S2[k] - 2 * c * S1[k] + c * c * cnt;
    const double ssh = S2[k] - c * S1[k];
    const double shy = SY[k] - c * Y1[k];
    double A[3][3] = {{static_cast<double>(n), S1[0], sh}, {S1[0], S2[0], ssh}, {sh, ssh, shh}};
    double r[3] = {Y1[0], SY[0], shy};
    double x[3];
    if (!Solve3(A, r, x)) continue;
    // For the least-squares solution, SSE = Σy² − xᵀr.
    const double sse = Y2 - (x[0] * r[0] + x[1] * r[1] + x[2] * r[2]);
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
