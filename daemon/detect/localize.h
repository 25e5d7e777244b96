// localize.h
// -----------------------------------------------------------------------------
// Where did an instability start? Each per-layer series (max attention logit,
// grad norm, update ratio, activation RMS of every layer) is dated by the step
// at which it left its own baseline; the series are ordered by that step and
// the earliest layer and signal are named.
//
// Dating a departure: the series (log values for the multiplicative
// statistics) is fitted with a broken line — a straight baseline that may
// drift slowly, plus an extra slope from a change point c on:
//     y(s) = a + b0·s + b1·max(0, s − c)
// by least squares over every candidate c. The c with the least residual
// error is the departure, if the extra rise b1·(s_last − c) is both above
// `min_rise` and above `noise_factor` residual standard deviations — a
// slow, steady healthy drift is absorbed by b0 and is not a departure. The
// baseline before c must span at least an eighth of the window (and
// `min_segment` points), so its own slope is pinned down.
//
//   std::vector<SeriesHistory> h = precursors.Histories();
//   Localization loc = Localize(h, /*up_to_step=*/onset - 1);
//   if (!loc.order.empty()) Report(loc.order[0].signal, loc.order[0].layer);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace spikeguard::detect {

// A bounded window of one series, in the space it is judged in (log values
// for multiplicative statistics).
struct SeriesHistory {
  std::string signal;  // e.g. "max_attn_logit"
  int layer = -1;      // -1: a run-level series
  std::vector<int64_t> steps;
  std::vector<double> values;
};

struct Departure {
  int64_t step = 0;
  // Extra rise since the departure, in the series' space.
  double rise = 0;
  // Rise over the residual noise of the fit.
  double significance = 0;
  // The fitted level just before the departure.
  double baseline = 0;
};

struct DepartureOptions {
  double min_rise = 0.2;
  double noise_factor = 5.0;
  // Each side of a change point keeps at least this many points.
  int min_segment = 5;
};

// Dates the departure of one series, or nullopt when it did not leave its
// baseline. `steps` must be increasing and as long as `values`.
std::optional<Departure> FindDeparture(const std::vector<int64_t>& steps,
                                       const std::vector<double>& values,
                                       const DepartureOptions& options = {});

struct LocalizedSeries {
  std::string signal;
  int layer = -1;
  Departure departure;
};

struct Localization {
  // Series that departed, earliest first (ties: the larger significance).
  std::vector<LocalizedSeries> order;
  // "max_attn_logit@3" style names of `order`, for reports.
  std::vector<std::string> Names() const;
};

// Orders the per-layer series by departure, using only points at or before
// `up_to_step` (the spike itself moves every series and must not count).
// Run-level series (layer −1) are skipped: localization names a layer.
Localization Localize(const std::vector<SeriesHistory>& series, int64_t up_to_step,
                      const DepartureOptions& options = {});

}  // namespace spikeguard::detect
