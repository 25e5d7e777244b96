#include "daemon/metrics/daemon_metrics.h"

namespace spikeguard::metrics {

DaemonMetrics::DaemonMetrics(Registry* r)
    : batches_committed(r->GetCounter("spikeguard_batches_committed_total",
                                      "Telemetry batches made durable by the group commit.")),
      commit_latency_seconds(r->GetHistogram(
          "spikeguard_commit_latency_seconds",
          "Group commit latency: first batch of a window enqueued to durable, in seconds.",
          Histogram::LatencyBuckets())),
      ack_latency_seconds(r->GetHistogram(
          "spikeguard_ack_latency_seconds",
          "Telemetry batch received on a stream to its acknowledgement written, in seconds.",
          Histogram::LatencyBuckets())),
      detection_latency_seconds(r->GetHistogram(
          "spikeguard_detection_latency_seconds",
          "Step report arrival to the detectors' decision on its step, in seconds.",
          Histogram::LatencyBuckets())),
      incident_open_latency_seconds(r->GetHistogram(
          "spikeguard_incident_open_latency_seconds",
          "Step report arrival to the incident it opened durable and published, in seconds.",
          Histogram::LatencyBuckets())) {}

}  // namespace spikeguard::metrics
