// trace_io.h
// -----------------------------------------------------------------------------
// Trace files: the telemetry of a run as JSONL, one spikeguard.v1.StepReport
// per line in proto JSON — exactly what `spikeguard-worker train --no-daemon
// --telemetry-out FILE` writes — plus an optional sidecar labels file:
//
//   {"trace": "sharp_spikes-3", "steps": 5000, "labels": [
//     {"kind": "spike", "onset": 1201, "peak": 1203, "end": 1221},
//     {"kind": "precursor", "signal": "max_attn_logit", "layer": 2,
//      "onset": 900, "peak": 1203, "end": 1203}]}
//
// Kinds: spike, divergence, nonfinite, precursor. `signal` and `layer` are
// optional (layer −1 / absent: run level).
//
// Reading: per-layer stats go to their global layer index; NaN and Infinity
// (proto JSON "NaN", "Infinity") are kept — they are data. When the step
// goes backwards (the worker appends a resumed run to the same file), the
// later timeline wins: earlier steps at or after the new one are dropped.
//
//   SG_ASSIGN_OR_RETURN(std::vector<StepSample> steps, ReadTraceJsonl("t.jsonl"));
//   SG_ASSIGN_OR_RETURN(std::vector<Label> labels, ReadLabels("t.labels.json"));
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/detect/step_message.h"
#include "daemon/detect/step_sample.h"
#include "daemon/detect/eval/trace_gen.h"
#include "spikeguard/v1/telemetry.pb.h"

namespace spikeguard::detect {

inline StepSample FromStepReport(const spikeguard::v1::StepReport& r) { return FromStepMessage(r); }
spikeguard::v1::StepReport ToStepReport(const StepSample& s);

// NOT_FOUND when the file cannot be opened; INVALID_ARGUMENT naming the line
// when a line is not a StepReport.
absl::StatusOr<std::vector<StepSample>> ReadTraceJsonl(const std::string& path);
absl::StatusOr<std::vector<StepSample>> ParseTraceJsonl(std::string_view text);
absl::Status WriteTraceJsonl(const std::string& path, const std::vector<StepSample>& steps);

std::string LabelsToJson(const std::string& trace_name, int64_t steps,
                         const std::vector<Label>& labels);
absl::StatusOr<std::vector<Label>> LabelsFromJson(std::string_view json);
absl::StatusOr<std::vector<Label>> ReadLabels(const std::string& path);
absl::Status WriteLabels(const std::string& path, const LabeledTrace& trace);

}  // namespace spikeguard::detect
