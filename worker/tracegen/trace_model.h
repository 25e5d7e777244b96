// trace_model.h
// -----------------------------------------------------------------------------
// A deterministic, parametric training run: what `spikeguard-tracegen` streams
// and what detector tests and benchmarks reuse. Every value is a pure function
// of (spec, rank, step), so a trace can be regenerated instead of stored.
//
// The baseline is a decaying loss curve with noise; each spike has real-looking
// precursors: the last layer's max attention logit climbs for
// `precursor_steps` before the spike, and the grad norm blows up over the five
// steps before the loss peaks (0.24 → 0.95 → 2.4 → 16 → 145 → 960 style).
// A NaN step reports a NaN loss, an Inf grad norm and a non-finite count.
//
//   TraceSpec spec;
//   spec.layers = 4; spec.seed = 7; spec.spikes = {1200};
//   TraceModel model(spec);
//   spikeguard::v1::StepReport r = model.Report(/*rank=*/0, /*step=*/1200);
#pragma once

#include <cstdint>
#include <vector>

#include "spikeguard/v1/telemetry.pb.h"

namespace spikeguard::worker {

struct TraceSpec {
  int layers = 4;
  uint64_t seed = 1;
  // Steps at which the loss peaks.
  std::vector<int64_t> spikes;
  // Loss multiplier at the peak.
  double spike_factor = 2.5;
  // Steps the attention-logit precursor builds before a spike.
  int64_t precursor_steps = 200;
  // Steps at which the loss is NaN.
  std::vector<int64_t> nan_steps;
  int64_t warmup_steps = 100;
  double peak_lr = 1e-3;
  int64_t tokens_per_rank = 1024;
  std::vector<std::string> domains = {"prose", "code", "numeric"};
};

class TraceModel {
 public:
  explicit TraceModel(TraceSpec spec) : spec_(std::move(spec)) {}

  spikeguard::v1::StepReport Report(uint32_t rank, int64_t step) const;
  // The healthy loss at `step` without noise or spikes.
  double BaselineLoss(int64_t step) const;
  const TraceSpec& spec() const { return spec_; }

 private:
  // Deterministic standard normal for (rank, step, stream).
  double Noise(uint32_t rank, int64_t step, uint64_t stream) const;
  // Multiplier >= 1 the spikes apply at `step` (1 far from any spike).
  double SpikeFactor(int64_t step) const;
  // Growth of the precursor at `step`: 0 far from a spike, up to 1 at it.
  double Precursor(int64_t step) const;
  // Grad-norm multiplier of the blow-up that leads the loss peak.
  double GradBlowup(int64_t step) const;

  TraceSpec spec_;
};

// splitmix64 of the float's bits: the loss hash of a StepReport.
uint64_t LossHash(double loss);

}  // namespace spikeguard::worker
