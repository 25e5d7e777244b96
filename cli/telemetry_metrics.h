// telemetry_metrics.h
// -----------------------------------------------------------------------------
// The metric names `spikectl telemetry --metrics=...` accepts, and how each is
// read out of a run-level `StepRecord`.
//
// Scalars: loss, grad_norm, lr, loss_scale, clipped, lse_mean, lse_max,
// nonfinite, step_time_s, data_position, tokens, loss_hash.
// Layer maxima (max over the record's layers): max_attn_logit, update_ratio,
// act_rms, param_norm.
// One layer: layerN.max_attn_logit, layerN.grad_norm, layerN.update_ratio,
// layerN.act_rms, layerN.param_norm.
//
//   absl::StatusOr<std::vector<TelemetryMetric>> metrics =
//       ParseTelemetryMetrics({"loss", "layer3.max_attn_logit"});
//   for (const TelemetryMetric& m : *metrics) row.push_back(m.Format(record));
//
// The query sent to the daemon names fields (`RequestFields`), which the
// daemon keeps and drops the rest: StepRecord fields for scalars ("nonfinite"
// travels as "nonfinite_count"), LayerStats fields for layer metrics (only
// that statistic of each layer comes back), and "layers" for layerN.grad_norm,
// since a bare "grad_norm" means the record's global norm.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "spikeguard/v1/telemetry.pb.h"

namespace spikeguard::cli {

class TelemetryMetric {
 public:
  // Fails with INVALID_ARGUMENT naming `name` when it is not a metric.
  static absl::StatusOr<TelemetryMetric> Parse(absl::string_view name);

  // The column header: the name as the user wrote it.
  const std::string& name() const { return name_; }
  // The StepRecord or LayerStats field the daemon must return for it.
  std::string RequestField() const;
  // The value in `record` as table text: "nan"/"inf" for non-finite values,
  // "-" when the record lacks it (e.g. no stats for that layer).
  std::string Format(const spikeguard::v1::StepRecord& record) const;

 private:
  enum class Kind { kScalar, kLayerMax, kLayer };
  TelemetryMetric(std::string name, Kind kind, std::string field, int layer)
      : name_(std::move(name)), kind_(kind), field_(std::move(field)), layer_(layer) {}

  std::string name_;
  Kind kind_;
  // Scalar: the metric name; layer kinds: the LayerStats field.
  std::string field_;
  int layer_;
};

// The columns `spikectl telemetry` shows when --metrics is not given.
const std::vector<std::string>& DefaultTelemetryMetrics();

// Parses every name; the first unknown one fails the whole list.
absl::StatusOr<std::vector<TelemetryMetric>> ParseTelemetryMetrics(
    absl::Span<const std::string> names);

// The distinct field names the metrics need, in first-use order.
std::vector<std::string> RequestFields(absl::Span<const TelemetryMetric> metrics);

}  // namespace spikeguard::cli
