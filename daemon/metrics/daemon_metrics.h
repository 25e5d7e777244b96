// daemon_metrics.h
// -----------------------------------------------------------------------------
// The daemon's own instruments, registered once in the daemon's metrics
// registry (both owned by `Daemon`). The ingest and control code is given a
// pointer and records into them (the instruments live as long as it):
//
//   metrics->batches_committed->Inc(batches.size());
//   metrics->commit_latency_seconds->Observe(absl::ToDoubleSeconds(took));
//
// What can be computed from existing state (runs, ranks, incidents, commands,
// catalog size, the runs' last telemetry, the reports ingest counted in its
// Counters) is collected at scrape time by daemon/metrics/state_collector.h
// instead.
#pragma once

#include <optional>

#include "absl/time/time.h"
#include "daemon/metrics/registry.h"

namespace spikeguard::metrics {

// One step record's detection latency, both ends measured in the daemon
// from the arrival of the report that completed the record.
struct DetectionLatency {
  // -> the decision on it: its detectors and the engine done; for a record
  // that opened an incident, the engine's decision to open it (the
  // incident formed, its write not yet begun).
  absl::Duration decision;
  // Only for a record that opened an incident: -> its "opened" event
  // durable and published (the decision, then the commit of its group).
  std::optional<absl::Duration> opened;
};

struct DaemonMetrics {
  explicit DaemonMetrics(Registry* registry);

  // Telemetry batches made durable by the group commit.
  Counter* batches_committed;
  // Group commit: from the window's first batch enqueued to durable.
  Histogram* commit_latency_seconds;
  // A batch: from received on the stream to its Ack written.
  Histogram* ack_latency_seconds;
  // A step record: from its report's arrival to the detectors' decision.
  Histogram* detection_latency_seconds;
  // A record that opened an incident: from its report's arrival to the
  // incident's "opened" event durable and published.
  Histogram* incident_open_latency_seconds;
};

}  // namespace spikeguard::metrics
