// nonfinite_detector.h
// -----------------------------------------------------------------------------
// Immediate detection of a non-finite step: a NaN or infinite loss or grad
// norm, or a trainer-reported non-finite count above zero. No window, no
// warm-up: the first such step is an event.
//
// When the per-layer statistics show where it started, the event names the
// first layer that went non-finite. A forward-pass value (max attention
// logit, activation RMS, parameter norm) that is non-finite in layer l is
// non-finite in every later layer too, so the lowest such layer is where it
// started. When only gradient values (grad norm, update ratio) are
// non-finite, the backward pass runs from the last layer down, so the
// highest such layer is where it started.
//
// One event per episode: after an event the detector stays quiet until
// `rearm_steps` consecutive finite steps have passed, so a burst of NaN steps
// is one incident.
//
//   NonFiniteDetector d(NonFiniteDetector::Options{});
//   if (auto e = d.Observe(sample)) Open(e->step, e->first_layer);
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "daemon/detect/step_sample.h"

namespace spikeguard::detect {

struct NonFiniteEvent {
  int64_t step = 0;
  // What was non-finite: "loss", "grad_norm" or "nonfinite_count" (the first
  // of these that applies).
  std::string signal;
  double value = 0;
  int64_t nonfinite_count = 0;
  // First layer that went non-finite, -1 when the layers do not show it.
  int first_layer = -1;
  // The per-layer statistic that located it, e.g. "act_rms"; empty if none.
  std::string layer_signal;
};

class NonFiniteDetector {
 public:
  struct Options {
    int rearm_steps = 10;
  };

  explicit NonFiniteDetector(Options options) : options_(options) {}

  std::optional<NonFiniteEvent> Observe(const StepSample& s);
  // True from an event until the detector re-arms.
  bool in_episode() const { return in_episode_; }
  void Reset();

 private:
  Options options_;
  bool in_episode_ = false;
  int finite_run_ = 0;
};

// True when any value of `s` (top-level or per-layer) is non-finite or the
// trainer reported non-finite values.
bool IsNonFinite(const StepSample& s);

// First layer that went non-finite (see above) and the statistic that shows
// it; -1 and "" when no layer value is non-finite.
int FirstNonFiniteLayer(const StepSample& s, std::string* layer_signal);

}  // namespace spikeguard::detect
