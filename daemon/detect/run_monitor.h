// run_monitor.h
// -----------------------------------------------------------------------------
// All of one run's detectors behind one call. Feed the run-level steps in
// step order; get back what happened at each:
//   - loss and grad-norm spikes: onset, then recovered or diverged
//     (SpikeDetector, robust median/MAD rule of DESIGN §6);
//   - slow divergence of the loss (DivergenceDetector): a climb over
//     hundreds of steps that the spike rule's trailing window follows;
//   - non-finite steps (NonFiniteDetector), with the first layer that went
//     non-finite;
//   - precursor warnings (PrecursorDetector), with series, layer and start.
// A spike onset and a non-finite event also carry the earliest precursor
// start seen within `precursor_horizon` steps before it (the incident's true
// onset, for the checkpoint choice) and the localization: per-layer series
// ordered by the step at which each left its baseline, up to the step before
// the onset.
//
// The grad norm gets a much larger relative floor than the loss (≥ 8× its
// median by default): healthy runs have grad-norm outliers of 2–5× that
// nobody should be paged for (a first version at 4× did page for them in the
// benchmark), while the blow-ups that lead a loss spike grow by orders of
// magnitude within a few steps (×4, ×10, ×67, … — the rule fires at the ×10
// step, still ahead of the loss). A smaller grad-norm jump that matters
// moves the loss too, and the loss rule catches it.
//
//   RunMonitor monitor(RunMonitor::Options{});
//   for (const StepSample& s : steps) {
//     for (const MonitorEvent& e : monitor.Observe(s)) {
//       if (e.opens_incident()) engine.OnDetection(run, ToDetection(e));
//     }
//   }
//
// Memory is bounded by the options and the layer count, never by the run
// length (footprint() says how many values are held).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "daemon/detect/divergence_detector.h"
#include "daemon/detect/localize.h"
#include "daemon/detect/nonfinite_detector.h"
#include "daemon/detect/precursor_detector.h"
#include "daemon/detect/spike_detector.h"
#include "daemon/detect/step_sample.h"

namespace spikeguard::detect {

struct MonitorEvent {
  enum Kind { kSpikeOnset, kSpikeRecovered, kSpikeDiverged, kDivergence, kNonFinite, kPrecursor };
  Kind kind = kSpikeOnset;
  // Spikes and divergence: "loss" or "grad_norm". Non-finite: what was
  // non-finite.
  // Precursor: the series, e.g. "max_attn_logit".
  std::string signal;
  int layer = -1;
  // Step at which the event was emitted.
  int64_t step = 0;
  // Spikes: onset/peak/last-over steps. Precursor: start_step is onset_step.
  int64_t onset_step = 0;
  int64_t peak_step = 0;
  int64_t end_step = 0;
  double value = 0;
  double baseline = 0;
  // Spike: robust z at onset. Precursor: see PrecursorWarning::score.
  double score = 0;
  // Precursor events only.
  PrecursorWarning::Kind precursor_kind = PrecursorWarning::kTrend;

  // Spike onsets, divergence and non-finite events: the earliest precursor that started
  // within the horizon before, and the localization.
  std::optional<int64_t> precursor_start;
  std::string precursor_signal;
  int precursor_layer = -1;
  Localization localization;

  // True for the events an incident opens on: spike onsets, divergence and
  // non-finite steps.
  bool opens_incident() const {
    return kind == kSpikeOnset || kind == kDivergence || kind == kNonFinite;
  }
};

const char* MonitorEventKindName(MonitorEvent::Kind kind);

class RunMonitor {
 public:
  struct Options {
    SpikeDetector::Options loss;
    SpikeDetector::Options grad_norm = GradNormDefaults();
    DivergenceDetector::Options divergence;
    NonFiniteDetector::Options nonfinite;
    PrecursorDetector::Options precursor;
    DepartureOptions localization;
    // Precursor warnings older than this (before an onset) are not attached.
    int precursor_horizon = 1000;
    // Recent precursor warnings kept for attaching.
    int max_recent_precursors = 64;

    static SpikeDetector::Options GradNormDefaults() {
      SpikeDetector::Options o;
      o.relative_floor = 7.0;
      return o;
    }
  };

  explicit RunMonitor(Options options);

  // Feeds one step; steps that are not after the last one are ignored.
  std::vector<MonitorEvent> Observe(const StepSample& s);

  // Orders the per-layer series by departure up to `up_to_step` (see above).
  Localization LocalizeNow(int64_t up_to_step) const;

  size_t footprint() const;
  const SpikeDetector& loss_detector() const { return loss_; }
  const SpikeDetector& grad_norm_detector() const { return grad_; }
  const PrecursorDetector& precursors() const { return precursor_; }
  const Options& options() const { return options_; }
  void Reset();

 private:
  void Enrich(MonitorEvent* e, int64_t onset) const;

  Options options_;
  SpikeDetector loss_;
  SpikeDetector grad_;
  DivergenceDetector divergence_;
  NonFiniteDetector nonfinite_;
  PrecursorDetector precursor_;
  std::deque<PrecursorWarning> recent_;
  std::optional<int64_t> last_step_;
};

}  // namespace spikeguard::detect
