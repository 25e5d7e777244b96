// spike_detector.h
// -----------------------------------------------------------------------------
// The daemon's spike rule, as a pure class over one series (loss or
// pre-clip grad norm) with bounded memory.
//
// A value is over threshold when its robust z-score against the trailing
// window — (x − median) / (1.4826 · MAD), the current value excluded — is
// at least `z_threshold` AND it exceeds the median by `relative_floor`
// (5 % by default; a flat series has a tiny MAD, and the floor keeps noise
// from looking like a spike). Nothing fires before `min_samples` values.
// Non-finite values are not spikes here (the non-finite detector owns them)
// and never enter the window. A step that is not after the last one seen
// (a re-delivered record) is ignored.
//
// An event starts at the first step over threshold (onset), follows the
// highest value (peak) and ends when the series is back under threshold:
// recovered when that happens within `recovery_steps`, diverged otherwise.
// While an event is open its values stay out of the window, so a long spike
// does not become the baseline; after a divergence the window restarts at
// the new level (and the detector warms up again).
//
//   SpikeDetector d(SpikeDetector::Options{});
//   for (auto& [step, loss] : series) {
//     if (auto e = d.Observe(step, loss); e && e->state == SpikeEvent::kOnset) ...
//   }
//
// Tails. A robust z of 6 is rare for Gaussian noise and common for
// heavy-tailed noise (Student-t with 3 degrees of freedom exceeds it every
// few hundred steps). With `tail_factor` > 0 the threshold follows the run's
// own noise: the upper z (max(z, 0); a falling loss has large negative z that
// say nothing about spikes) of every calm value (not in an event) is kept
// over the last `tail_window` values, and once `tail_min_samples` are there
// the threshold is max(z_threshold, tail_factor × their 99.5th percentile)
// (the 99th of |z| for symmetric noise) — for Gaussian noise (2.6) that is
// z_threshold, for t₃ noise about 10 (t₃'s is 5.2 MAD-sigmas). While an event is open a value stays "over" when it
// reaches `hold_fraction` of the threshold and of the relative floor, so a
// spike that decays is one event, not several.
//
// The blip_*/shift_tolerance knobs are read by RunMonitor (the decision needs
// the grad norm and the precursors); this class only carries them so one
// policy section maps to one struct.
//
// Memory: at most `window` + `tail_window` doubles, whatever the run length.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace spikeguard::detect {

struct SpikeEvent {
  enum State { kOnset, kRecovered, kDiverged };
  State state = kOnset;
  int64_t onset_step = 0;
  int64_t peak_step = 0;
  double peak_value = 0;
  // Median of the window when the event started.
  double baseline = 0;
  double onset_z = 0;
  // Last step still over threshold (recovered/diverged only).
  int64_t end_step = 0;
};

class SpikeDetector {
 public:
  struct Options {
    int window = 128;
    int min_samples = 64;
    double z_threshold = 6.0;
    double relative_floor = 0.05;
    int recovery_steps = 50;
    // 0: z_threshold alone.
    double tail_factor = 0;
    int tail_window = 1024;
    int tail_min_samples = 128;
    double hold_fraction = 1.0;
    // Loss, read by RunMonitor: 0 disables the blip rule.
    int blip_steps = 0;
    int blip_escalate_count = 3;
    int blip_window = 200;
    // 0 disables the level-shift rule.
    double shift_tolerance = 0;
  };

  explicit SpikeDetector(Options options) : options_(options), threshold_(options.z_threshold) {}

  // Feeds one value; returns an event when one starts or ends at this step.
  std::optional<SpikeEvent> Observe(int64_t step, double value);

  // The robust z-score `value` would have now, or nullopt during warm-up.
  std::optional<double> Score(double value) const;
  // Median of the window (0 while empty).
  double baseline() const;
  // The z threshold in force now (z_threshold, or the tail-calibrated one).
  double threshold() const { return threshold_; }
  // 1.4826·MAD of the window at the last value seen (0 before).
  double noise_scale() const { return last_sigma_; }
  // Robust z of the last value seen (0 during warm-up).
  double last_z() const { return last_z_; }
  bool in_event() const { return open_.has_value(); }
  size_t window_size() const { return window_.size(); }
  const Options& options() const { return options_; }
  // Forgets everything (a new timeline).
  void Reset();

 private:
  bool OverThreshold(double value, double* z, double* median, double fraction = 1.0) const;
  void Push(double value);
  void PushTail(double abs_z);

  Options options_;
  std::deque<double> window_;
  std::optional<SpikeEvent> open_;
  std::optional<int64_t> last_step_;
  mutable std::vector<double> scratch_;
  mutable double last_sigma_ = 0;
  double last_z_ = 0;
  double threshold_ = 0;
  std::deque<double> tail_;
  int since_tail_update_ = 0;
};

// Median of `values` (copied; the window is small).
double Median(std::deque<double> values);

}  // namespace spikeguard::detect
