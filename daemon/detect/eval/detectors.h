// detectors.h
// -----------------------------------------------------------------------------
// Runs any detector — spikeguard's RunMonitor or one of the five framework
// baselines (baselines.h) — over a whole trace and returns its alarms in one
// shape, for the benchmark and for `spikeguard-detect`.
//
// spikeguard's alarms are the events an incident opens on (loss and
// grad-norm spike onsets, non-finite steps), plus informational ones that
// are not scored (precursor warnings, spike recovered/diverged). A
// baseline's alarms are its loss rule's alarms plus the immediate alarm on
// a non-finite loss or grad norm that every framework has in some form (one
// per episode, like spikeguard's).
//
//   for (std::string_view d : DetectorNames()) {
//     SG_ASSIGN_OR_RETURN(std::vector<Alarm> alarms, RunDetector(d, trace.steps));
//   }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/detect/run_monitor.h"
#include "daemon/detect/step_sample.h"

namespace spikeguard::detect {

struct Alarm {
  int64_t step = 0;
  std::string detector;
  // "loss_spike", "grad_norm_spike", "nonfinite", "high_loss", "precursor",
  // "spike_recovered", "spike_diverged".
  std::string kind;
  // The series, e.g. "loss", "max_attn_logit".
  std::string signal;
  int layer = -1;
  double value = 0;
  double score = 0;
  // Precursors: where the series left its baseline. Others: the step.
  int64_t start_step = 0;
  // Counted by the spike benchmark (precursor warnings are scored apart).
  bool scored = true;
};

// "spikeguard", then the baselines in kBaselineNames order.
std::vector<std::string> DetectorNames();

// Runs detector `name` over `steps` (in step order). INVALID_ARGUMENT for an
// unknown name.
absl::StatusOr<std::vector<Alarm>> RunDetector(std::string_view name,
                                               const std::vector<StepSample>& steps,
                                               const RunMonitor::Options& options = {});

}  // namespace spikeguard::detect
