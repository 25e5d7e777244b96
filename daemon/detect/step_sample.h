// step_sample.h
// -----------------------------------------------------------------------------
// What the detectors read: one merged, run-level training step as plain data.
// The daemon converts its StepRecord protos to this at the adapter, trace files
// are converted on load (trace_io.h), and tests build it by hand, so the
// detectors never see gRPC or proto types.
//
//   StepSample s;
//   s.step = 1200;
//   s.loss = 2.31;
//   s.grad_norm = 0.42;
//   s.layers.resize(4);
//   s.layers[3].max_attn_logit = 1.7e3;
//   monitor.Observe(s);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spikeguard::detect {

// Statistics of one transformer layer at one step (telemetry.proto LayerStats).
struct LayerSample {
  // Max over heads and positions of the scaled pre-softmax q·k/√d.
  double max_attn_logit = 0;
  // L2 norm of the layer's gradient, before clipping.
  double grad_norm = 0;
  // ‖Δw‖ / ‖w‖ of the step's update.
  double update_ratio = 0;
  // RMS of the residual stream leaving the layer.
  double act_rms = 0;
  // L2 norm of the layer's parameters after the update.
  double param_norm = 0;
};

// The loss on one data domain's part of the batch (telemetry.proto
// DomainLoss).
struct DomainSample {
  std::string domain;
  double loss = 0;
  int64_t tokens = 0;
};

struct StepSample {
  int64_t step = 0;
  double loss = 0;
  // Global gradient norm before clipping.
  double grad_norm = 0;
  // Output-logit log-sum-exp over the batch.
  double lse_mean = 0;
  double lse_max = 0;
  bool clipped = false;
  // Non-finite values seen in loss, logits or gradients.
  int64_t nonfinite = 0;
  // Indexed by global layer index; empty when the trainer reports none.
  std::vector<LayerSample> layers;
  // Per-domain losses, as reported; empty when the trainer reports none.
  // RunMonitor reads them to tell a data-like excursion (the excess in one
  // domain) from one spread over the whole batch.
  std::vector<DomainSample> domains;
};

}  // namespace spikeguard::detect
