#include "cli/telemetry_metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/table.h"

namespace spikeguard::cli {
namespace {

using spikeguard::v1::LayerStats;
using spikeguard::v1::StepRecord;

constexpr absl::string_view kScalars[] = {
    "loss",      "grad_norm",   "lr",            "loss_scale", "clipped",  "lse_mean",
    "lse_max",   "nonfinite",   "step_time_s",   "data_position", "tokens", "loss_hash",
};
constexpr absl::string_view kLayerMaxima[] = {"max_attn_logit", "update_ratio", "act_rms",
                                              "param_norm"};
constexpr absl::string_view kLayerFields[] = {"max_attn_logit", "grad_norm", "update_ratio",
                                              "act_rms", "param_norm"};

template <size_t N>
bool Contains(const absl::string_view (&names)[N], absl::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

double LayerField(const LayerStats& layer, absl::string_view field) {
  if (field == "max_attn_logit") return layer.max_attn_logit();
  if (field == "grad_norm") return layer.grad_norm();
  if (field == "update_ratio") return layer.update_ratio();
  if (field == "act_rms") return layer.act_rms();
  return layer.param_norm();
}

}  // namespace

absl::StatusOr<TelemetryMetric> TelemetryMetric::Parse(absl::string_view name) {
  if (Contains(kScalars, name)) {
    return TelemetryMetric(std::string(name), Kind::kScalar, std::string(name), -1);
  }
  if (Contains(kLayerMaxima, name)) {
    return TelemetryMetric(std::string(name), Kind::kLayerMax, std::string(name), -1);
  }
  if (absl::StartsWith(name, "layer")) {
    const size_t dot = name.find('.');
    int layer = -1;
    if (dot != absl::string_view::npos && absl::SimpleAtoi(name.substr(5, dot - 5), &layer) &&
        layer >= 0 && std::isdigit(static_cast<unsigned char>(name[5])) &&
        Contains(kLayerFields, name.substr(dot + 1))) {
      return TelemetryMetric(std::string(name), Kind::kLayer, std::string(name.substr(dot + 1)),
                             layer);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown metric '", name, "'"));
}

std::string TelemetryMetric::RequestField() const {
  if (kind_ != Kind::kScalar) {
    // "grad_norm" alone names the record's global norm; per-layer grad norms
    // need the whole per-layer stats.
    return field_ == "grad_norm" ? "layers" : field_;
  }
  if (field_ == "nonfinite") return "nonfinite_count";
  return field_;
}

std::string TelemetryMetric::Format(const StepRecord& r) const {
  switch (kind_) {
    case Kind::kScalar:
      if (field_ == "loss") return FormatDouble(r.loss());
      if (field_ == "grad_norm") return FormatDouble(r.grad_norm());
      if (field_ == "lr") return FormatDouble(r.lr());
      if (field_ == "loss_scale") return FormatDouble(r.loss_scale());
      if (field_ == "clipped") return FormatBool(r.clipped());
      if (field_ == "lse_mean") return FormatDouble(r.lse_mean());
      if (field_ == "lse_max") return FormatDouble(r.lse_max());
      if (field_ == "nonfinite") return absl::StrCat(r.nonfinite_count());
      if (field_ == "step_time_s") return FormatDouble(r.step_time_s());
      if (field_ == "data_position") return absl::StrCat(r.data_position());
      if (field_ == "tokens") return absl::StrCat(r.tokens());
      if (field_ == "loss_hash") return absl::StrFormat("%016x", r.loss_hash());
      return "-";
    case Kind::kLayerMax: {
      if (r.layers().empty()) return "-";
      double max = -std::numeric_limits<double>::infinity();
      for (const LayerStats& layer : r.layers()) {
        const double v = LayerField(layer, field_);
        // A non-finite layer is what the operator is looking for: keep it.
        if (std::isnan(v)) return FormatDouble(v);
        max = std::max(max, v);
      }
      return FormatDouble(max);
    }
    case Kind::kLayer:
      for (const LayerStats& layer : r.layers()) {
        if (static_cast<int>(layer.layer()) == layer_) return FormatDouble(LayerField(layer, field_));
      }
      return "-";
  }
  return "-";
}

const std::vector<std::string>& DefaultTelemetryMetrics() {
  static const auto* metrics = new std::vector<std::string>{
      "loss", "grad_norm", "lr", "clipped", "lse_max", "nonfinite", "max_attn_logit",
      "step_time_s"};
  return *metrics;
}

absl::StatusOr<std::vector<TelemetryMetric>> ParseTelemetryMetrics(
    absl::Span<const std::string> names) {
  std::vector<TelemetryMetric> metrics;
  for (const std::string& name : names) {
    absl::StatusOr<TelemetryMetric> metric = TelemetryMetric::Parse(name);
    if (!metric.ok()) return metric.status();
    metrics.push_back(*std::move(metric));
  }
  return metrics;
}

std::vector<std::string> RequestFields(absl::Span<const TelemetryMetric> metrics) {
  std::vector<std::string> fields;
  for (const TelemetryMetric& m : metrics) {
    std::string field = m.RequestField();
    if (std::find(fields.begin(), fields.end(), field) == fields.end()) {
      fields.push_back(std::move(field));
    }
  }
  return fields;
}

}  // namespace spikeguard::cli
