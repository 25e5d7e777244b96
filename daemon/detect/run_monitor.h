// run_monitor.h
// -----------------------------------------------------------------------------
// All of one run's detectors behind one call. Feed the run-level steps in
// step order; get back what happened at each:
//   - loss and grad-norm spikes: onset, then recovered or diverged
//     (SpikeDetector, robust median/MAD rule of spike_detector.h);
//   - slow divergence of the loss (DivergenceDetector): a climb over
//     hundreds of steps that the spike rule's trailing window follows. A
//     spike lasting tens of steps lifts the divergence rule's trailing
//     median too: a divergence while its median window still holds a loss
//     excursion, or dated inside one, is that excursion, not a new event;
//     a climb that starts after it clears is reported;
//   - non-finite steps (NonFiniteDetector), with the first layer that went
//     non-finite;
//   - precursor warnings (PrecursorDetector), with series, layer and start.
// A spike onset and a non-finite event also carry the earliest precursor
// start seen within `precursor_horizon` steps before it (the incident's true
// onset, for the checkpoint choice) and the localization: per-layer series
// ordered by the step at which each left its baseline, up to the step before
// the onset.
//
// Blips and level shifts. An incident costs a rewind and probes,
// so a loss excursion opens one only when it is worth it:
//   - corroborated: the grad norm at least `corroborate_grad_ratio` × its
//     median and over its own threshold within `corroborate_lookback` steps
//     before the onset (a blow-up leads the loss by 0–8 steps), a grad-norm
//     event open, or a precursor warning within `precursor_horizon` (one
//     whose growth began before the last incident ended is spent), or the
//     step's excess loss concentrated in one data domain (below) → the
//     onset opens at once;
//   - otherwise it is held `loss.blip_steps` steps: back under by then → a
//     blip (kBlip, recorded); still up and at least `loss.shift_tolerance`
//     plus `shift_noise_scales` noise scales (MAD scale × the tail
//     threshold's ratio to z_threshold) above the median → it opens
//     (onset dated at the first step over); still up but smaller → held on:
//     back within the recovery steps → an incident when it was over the
//     full threshold for more than blip_steps steps (a small spike with a
//     rise and a decay), a blip otherwise; staying → a legit level shift
//     (kLevelShift; the window restarts at the new level);
//   - `loss.blip_escalate_count` blips within `loss.blip_window` steps open
//     an incident dated at the first of them.
// Per-domain corroboration. When the steps carry per-domain losses, each
// domain's loss keeps its own trailing window (`domain_window`, current value
// excluded). A step is data-like when one domain stands at least `domain_z`
// robust z above its own median (and `domain_relative_floor` above it) while
// every other domain stays within `domain_calm_z`: the excess sits in one
// domain's part of the batch, the signature of bad data, which a replay and
// a bisection can find. The same excursion spread evenly over the domains
// (all move together) corroborates nothing. At least two domains must be
// warm. A domain's outlying values stay out of its window; one that stays an
// outlier for `domain_window` / 4 steps restarts its window at the new level.
// `domain_z` 0 switches the rule off.
//
// The loss threshold follows the run's own tails (SpikeDetector's
// tail_factor), so heavy-tailed noise does not page anyone either.
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
  enum Kind {
    kSpikeOnset,
    kSpikeRecovered,
    kSpikeDiverged,
    kDivergence,
    kNonFinite,
    kPrecursor,
    // Informational: a loss excursion judged not worth an
    // incident — a blip (back at once, nothing corroborating it) or a legit
    // level shift (the loss moved to a new level and stays there).
    kBlip,
    kLevelShift,
  };
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
  // Escalated from repeated blips (kSpikeOnset only).
  bool escalated = false;
  // Loss spike onsets opened by corroboration: "grad_norm", "precursor" or
  // "domain_loss" (then `domain` names the domain); empty otherwise.
  std::string corroborated_by;
  std::string domain;
};

const char* MonitorEventKindName(MonitorEvent::Kind kind);

class RunMonitor {
 public:
  struct Options {
    SpikeDetector::Options loss = LossDefaults();
    SpikeDetector::Options grad_norm = GradNormDefaults();
    DivergenceDetector::Options divergence;
    NonFiniteDetector::Options nonfinite;
    PrecursorDetector::Options precursor;
    DepartureOptions localization;
    // Precursor warnings older than this (before an onset) are not attached.
    int precursor_horizon = 1000;
    // Recent precursor warnings kept for attaching.
    int max_recent_precursors = 64;
    // Whether a spike onset carries its `localization`. The fit over every
    // per-layer series costs about a millisecond at 32 layers; false leaves
    // it empty and the caller asks LocalizeNow(onset - 1) when it needs it
    // (the daemon does so after the incident is opened, before its next step).
    bool localize_events = true;

    // Corroboration of a loss excursion (see above).
    double corroborate_grad_ratio = 2.5;
    int corroborate_lookback = 8;
    double shift_noise_scales = 5.0;
    // Per-domain corroboration (see above). domain_z 0: off.
    double domain_z = 8.0;
    double domain_calm_z = 3.0;
    double domain_relative_floor = 0.05;
    int domain_window = 128;
    int domain_min_samples = 32;
    // Domains tracked per run (the rest are ignored).
    int max_domains = 64;

    static SpikeDetector::Options LossDefaults() {
      SpikeDetector::Options o;
      o.tail_factor = 2.0;
      o.hold_fraction = 0.5;
      o.blip_steps = 1;
      o.blip_escalate_count = 3;
      o.blip_window = 50;
      o.shift_tolerance = 0.12;
      return o;
    }
    static SpikeDetector::Options GradNormDefaults() {
      SpikeDetector::Options o;
      o.relative_floor = 7.0;
      o.tail_factor = 2.0;
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
  // What corroborates a loss excursion that started at `onset`: "grad_norm",
  // "precursor", "domain_loss", or nullptr.
  const char* Corroboration(int64_t onset, int64_t now) const;
  // Updates the per-domain windows with `s`; true when the step's excess is
  // concentrated in one domain (its name in *domain).
  bool ObserveDomains(const StepSample& s, std::string* domain);
  void ObserveLoss(const StepSample& s, std::vector<MonitorEvent>* out);

  enum class LossState { kIdle, kPending, kOpened };

  Options options_;
  SpikeDetector loss_;
  SpikeDetector grad_;
  DivergenceDetector divergence_;
  NonFiniteDetector nonfinite_;
  PrecursorDetector precursor_;
  std::deque<PrecursorWarning> recent_;
  std::optional<int64_t> last_step_;
  // Steps at which the grad norm corroborated (bounded by the lookback).
  std::deque<int64_t> grad_corroborates_;
  LossState loss_state_ = LossState::kIdle;
  // The latest loss excursion (spike or blip): its onset and the last step
  // it was open. A divergence whose median window still holds it, or that
  // dates its climb inside it, is that excursion seen again.
  std::optional<int64_t> excursion_onset_;
  int64_t excursion_last_ = 0;
  // Last step of the latest incident-opening event (its precursors are spent).
  std::optional<int64_t> last_incident_end_;
  SpikeEvent pending_;
  double pending_peak_ = 0;
  // Steps of the pending excursion over the full threshold.
  int pending_full_ = 0;
  // Recent blips: (onset step, peak value, baseline), within blip_window.
  struct Blip {
    int64_t step;
    double peak;
    double baseline;
    double z;
  };
  std::deque<Blip> blips_;
  // Per-domain loss windows (at most max_domains).
  struct DomainSeries {
    std::string name;
    std::deque<double> window;
    int outlier_run = 0;
  };
  std::vector<DomainSeries> domains_;
  // Steps at which one domain held the excess, with the domain's name.
  std::deque<std::pair<int64_t, std::string>> domain_corroborates_;
  mutable std::vector<double> scratch_;
  // The last localization (LocalizeNow), valid for the same onset while no
  // new step or warning arrived.
  struct LocalizedAt {
    int64_t up_to_step = 0;
    std::optional<int64_t> at_step;
    size_t warnings = 0;
    Localization loc;
  };
  mutable std::optional<LocalizedAt> localized_;
  // LocalizeNow's copy of the per-layer windows, kept for its buffers.
  mutable std::vector<SeriesHistory> histories_;
};

}  // namespace spikeguard::detect
