// scoring.h
// -----------------------------------------------------------------------------
// Scores a detector's alarms against a trace's labels (the detector benchmark).
//
// Matching rule. Event labels are spikes, divergences and non-finite bursts.
// A scored alarm at step a is a true positive for label L when
//     L.onset − lead_window ≤ a ≤ L.peak + post_peak
// (defaults: 10 steps before the onset — a grad-norm blow-up may announce the
// spike a few steps before the loss moves — and 5 steps after the peak).
// Each label counts once, with its first matching alarm; further alarms up
// to L.end + post_peak (the same incident, still recovering) are duplicates,
// neither true nor false. Every other alarm is a false alarm.
//   precision = detected labels / (detected labels + false alarms)
//   recall    = detected labels / labels
//   lead time = L.peak − a of the matching alarm (positive: before the peak)
//
// Precursor labels (signal, layer, start) are scored apart: a precursor
// warning on the same signal and layer, raised at or before the label's
// peak (the spike it announces) and no earlier than start − lead_window,
// detects it (a spike onset on that series, e.g. a grad-norm blow-up ahead
// of the loss, counts as its warning); the start error is warning.start_step − label.onset. A
// precursor warning outside every label's [onset − lead_window,
// end + post_peak] is a false warning.
//
//   ScoreCounts c;
//   for (auto& t : corpus) c.Add(ScoreTrace(alarms[t.name], t.labels, t.steps.size()));
//   DetectorScore s = Summarize("spikeguard", c);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/detect/eval/detectors.h"
#include "daemon/detect/eval/trace_gen.h"

namespace spikeguard::detect {

struct MatchRule {
  int64_t lead_window = 10;
  int64_t post_peak = 5;
};

struct ScoreCounts {
  int64_t steps = 0;
  int labels = 0;
  int detected = 0;
  int false_alarms = 0;
  int duplicates = 0;
  // Lead times (peak − alarm) of detected labels.
  std::vector<double> leads;
  // Steps of the false alarms (for reports: where they happened).
  std::vector<int64_t> false_alarm_steps;

  int precursor_labels = 0;
  int precursors_detected = 0;
  int false_warnings = 0;
  // warning.start_step − label.onset of detected precursor labels.
  std::vector<double> start_errors;
  // label.peak − warning step of detected precursor labels: how long before
  // the event it announces the warning came.
  std::vector<double> precursor_leads;

  void Add(const ScoreCounts& other);
};

ScoreCounts ScoreTrace(const std::vector<Alarm>& alarms, const std::vector<Label>& labels,
                       int64_t steps, const MatchRule& rule = {});

struct DetectorScore {
  std::string detector;
  ScoreCounts counts;
  double precision = 0;
  double recall = 0;
  double f1 = 0;
  double false_alarms_per_10k = 0;
  // NaN when nothing was detected.
  double median_lead = 0;
  double precursor_recall = 0;
  double median_abs_start_error = 0;
  double false_warnings_per_10k = 0;
  // NaN when no precursor label was detected.
  double median_precursor_lead = 0;
};

DetectorScore Summarize(const std::string& detector, const ScoreCounts& counts);

// Median of `v` (copied); NaN when empty.
double MedianOrNan(std::vector<double> v);

}  // namespace spikeguard::detect
