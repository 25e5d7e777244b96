// precursor_detector.h
// -----------------------------------------------------------------------------
// Precursors: the instabilities that build for tens to hundreds of steps before
// a loss spike. One tracker per series:
//   per layer   max_attn_logit, grad_norm, update_ratio, act_rms
//   run level   lse_mean, lse_max, grad_norm, clip_rate
// (clip_rate = fraction of clipped steps over the last `clip_window` steps).
//
// Trend alarm. The multiplicative statistics are judged as logs (a logit
// that doubles is the same event at 30 and at 3,000). Each value is smoothed
// with a median of `smooth` steps, and its change over `trend_window` steps,
// d = y(t) − y(t − trend_window), is compared with the distribution of past
// changes of the same series (median and MAD of the last `baseline_window`
// changes). A robust z ≥ `trend_z_threshold` for `persistence_steps`
// consecutive steps, with a change of at least `min_log_change` (clip rate:
// `min_clip_rate_change`), raises a warning. Changes are compared with the
// series' own usual change, so a steady healthy drift (logits or activation
// RMS growing slowly through training) is not an alarm; an acceleration is.
// While a series is elevated (rising well beyond its usual change) its
// changes stay out of its baseline; a series that merely stops falling is
// not elevated, so its baseline catches up.
//
// Slow builds. Growth spread over hundreds to thousands of steps (a grad
// norm ×20 over 600 steps, an attention logit ×50 over 3,000) never moves a
// trend window by the minimum change; the slow rule compares block means
// `slow_window` steps apart instead (see Options::slow_window), and dates the
// warning where the broken-line fit leaves its level.
//
// Level alarm (max attention logit only, from the literature on attention
// logit growth): ≥ `attn_logit_warn` (1e3) warns, ≥ `attn_logit_critical`
// (1e4) is critical, each after `persistence_steps` consecutive steps.
//
// Warm-up. Every statistic moves fast from its initial value (the
// reference worker's attention logits grow from ~0.1 at init over the first
// steps and through the lr warm-up). That rise is not the instability: a
// series' first `onset_warmup_steps` steps (default 4 × trend_window), and
// after them any steps until its change over the trend window drops below
// the minimum change (at most until `trend_warmup_steps`), are its warm-up.
// Warm-up points never enter its baselines, its start dating or History().
//
// Every warning carries its start step: where the current growth above the
// series' own baseline began. The baseline level is an average of the calm
// (not elevated) smoothed values after the warm-up; from the alarm, the
// dating walks back to the last point that sat at that level, and refines
// it with FindDeparture (localize.h) over the post-warm-up lookback window.
// That dates the incident's true onset earlier than the loss does, but
// never inside the warm-up. A level alarm raised during the warm-up is dated
// at the first step over its threshold. A series warns once per episode; it
// re-arms after `trend_window` calm steps. Trend alarms start at step
// `trend_warmup_steps`; level alarms at once.
//
//   PrecursorDetector p(PrecursorDetector::Options{});
//   for (const StepSample& s : steps) {
//     for (const PrecursorWarning& w : p.Observe(s)) Warn(w.signal, w.layer, w.start_step);
//   }
//
// Memory: per series at most lookback + baseline_window + smooth doubles
// (and int64 steps for the lookback); the number of series is 4 per layer
// plus 4, whatever the run length.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "daemon/detect/localize.h"
#include "daemon/detect/step_sample.h"

namespace spikeguard::detect {

struct PrecursorWarning {
  enum Kind { kTrend, kLevelWarn, kLevelCritical };
  Kind kind = kTrend;
  std::string signal;
  // Global layer index; -1 for a run-level series.
  int layer = -1;
  // Step at which the warning was raised.
  int64_t step = 0;
  // Step at which the series left its baseline (≤ step).
  int64_t start_step = 0;
  // Raw value at `step` and the raw baseline level before `start_step`.
  double value = 0;
  double baseline = 0;
  // Trend: robust z of the change. Level: value / threshold.
  double score = 0;
};

const char* PrecursorKindName(PrecursorWarning::Kind kind);

class PrecursorDetector {
 public:
  // Mirrors spikeguard.v1.PrecursorPolicy (the first five fields); the rest
  // are tuning knobs with defaults.
  struct Options {
    int trend_window = 32;
    double trend_z_threshold = 6.0;
    double attn_logit_warn = 1e3;
    double attn_logit_critical = 1e4;
    int persistence_steps = 5;

    int baseline_window = 256;
    int min_baseline = 64;
    int lookback = 512;
    int smooth = 5;
    int clip_window = 64;
    // ln(1.3): a multiplicative series must grow by at least 30 % over the
    // trend window beyond its usual change.
    double min_log_change = 0.262;
    double min_clip_rate_change = 0.25;
    // Dating the start: the rise since the departure must exceed this many
    // residual standard deviations.
    double start_noise_factor = 5.0;
    // No trend alarms before this step: early in training every statistic
    // moves fast (the reference worker's attention logits grow from ~0.1 at
    // init), and a warning there would drag an incident's onset back to the
    // start of the run. Level alarms apply from step 0.
    int64_t trend_warmup_steps = 500;
    // Minimum warm-up of each series, counted from its first value, before
    // it may have a baseline; ≤ 0: 4 × trend_window. The warm-up lasts
    // longer while the series still moves by the minimum change over a trend
    // window, up to max(this, trend_warmup_steps).
    int64_t onset_warmup_steps = 0;
    // Slow-build rule: a log rise of at least slow_min_log_change
    // (0.5: ×1.65) across slow_window steps that is not slowing down warns
    // even when no trend window moves by min_log_change. 0: off.
    int slow_window = 384;
    double slow_min_log_change = 0.5;
  };

  explicit PrecursorDetector(Options options);
  ~PrecursorDetector();
  PrecursorDetector(PrecursorDetector&&) noexcept;
  PrecursorDetector& operator=(PrecursorDetector&&) noexcept;

  // Feeds one step (steps in increasing order); returns the warnings raised
  // at it.
  std::vector<PrecursorWarning> Observe(const StepSample& s);

  // The lookback window of every series (judged space: logs for the
  // multiplicative ones), for Localize().
  std::vector<SeriesHistory> Histories() const;
  // The same into `out`, reusing its buffers: the localization at an
  // incident's onset copies every series' window (128 series of 512 points
  // at 32 layers), and fresh buffers each time cost more than the copy.
  void HistoriesInto(std::vector<SeriesHistory>* out) const;

  // Values held in memory across all series (for bounded-memory checks).
  size_t footprint() const;
  size_t series_count() const;
  const Options& options() const { return options_; }
  void Reset();

 private:
  class Series;
  Series* SeriesFor(const std::string& signal, int layer, bool log_scale, bool level_alarm);

  Options options_;
  std::vector<std::unique_ptr<Series>> series_;
  std::deque<bool> clipped_;
  int64_t last_step_ = -1;
  bool any_step_ = false;
};

}  // namespace spikeguard::detect
