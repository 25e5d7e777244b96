// state_collector.h
// -----------------------------------------------------------------------------
// Metrics computed at scrape time from what the daemon already keeps: the
// report counters, the live rank registry and the catalog (runs, incidents,
// probes, commands, telemetry, file size). Registered once on the state's
// registry:
//
//   metrics::RegisterStateCollector(state);   // before serving /metrics
//
// Names follow Prometheus conventions: prefix spikeguard_, base units,
// counters end in _total, labels name runs, verdicts and kinds (never a step
// or a document).
#pragma once

namespace spikeguard::daemon {
struct DaemonState;
}

namespace spikeguard::metrics {

void RegisterStateCollector(spikeguard::daemon::DaemonState* state);

}  // namespace spikeguard::metrics
