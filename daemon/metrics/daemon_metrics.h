// daemon_metrics.h
// -----------------------------------------------------------------------------
// The daemon's own instruments, registered once in DaemonState's registry.
// The ingest and control code records into them (cache nothing: the pointers
// live as long as DaemonState):
//
//   state->metrics.batches_committed->Inc(batches.size());
//   state->metrics.commit_latency_seconds->Observe(absl::ToDoubleSeconds(took));
//
// What can be computed from existing state (runs, ranks, incidents, commands,
// catalog size, the runs' last telemetry, the reports counted in
// DaemonState::counters) is collected at scrape time by
// daemon/metrics/state_collector.h instead.
#pragma once

#include "daemon/metrics/registry.h"

namespace spikeguard::metrics {

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
};

}  // namespace spikeguard::metrics
