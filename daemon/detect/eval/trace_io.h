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
// (proto JSON "NaN", "Infinity", and the bare NaN / Infinity / -Infinity
// tokens Python's json.dumps writes) are kept — they are data. A key that is
// not a StepReport field, and a layers[] entry without its "layer" index, are
// errors naming the line and the field (not silently dropped or read as
// layer 0) — except the annotations spikeguard's PyTorch trainer writes on
// each line ("rank", "generation", "max_attn_logit_kind"), which are skipped.
//
// CSV exports (W&B, TensorBoard) are read too: a header row naming a step
// column (step, _step, Step, global_step) and metric columns — loss,
// grad_norm, lse_mean, lse_max, clipped, nonfinite_count (other StepReport
// scalars such as lr are accepted and unused), per-layer stats with their
// index (layers/3/max_attn_logit, layer3.act_rms, update_ratio/3). Header
// cells may be quoted; "RUN - metric" names lose the run part; __MIN/__MAX
// companions and wall-time columns are skipped. An empty cell repeats the
// column's last value (a metric not logged at that step); rows before the
// first loss are skipped. nan / inf cells are kept as data. An unknown
// column or a per-layer column without an index is an error naming it. When the step
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
absl::StatusOr<std::vector<StepSample>> ParseTraceCsv(std::string_view text);
// JSONL when the first non-blank character is '{', CSV otherwise.
absl::StatusOr<std::vector<StepSample>> ParseTrace(std::string_view text);
// A .csv path is CSV; any other is sniffed as ParseTrace does.
absl::StatusOr<std::vector<StepSample>> ReadTrace(const std::string& path);
absl::Status WriteTraceJsonl(const std::string& path, const std::vector<StepSample>& steps);

std::string LabelsToJson(const std::string& trace_name, int64_t steps,
                         const std::vector<Label>& labels);
absl::StatusOr<std::vector<Label>> LabelsFromJson(std::string_view json);
absl::StatusOr<std::vector<Label>> ReadLabels(const std::string& path);
absl::Status WriteLabels(const std::string& path, const LabeledTrace& trace);

}  // namespace spikeguard::detect
