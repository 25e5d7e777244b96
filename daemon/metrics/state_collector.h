// state_collector.h
// -----------------------------------------------------------------------------
// Metrics computed at scrape time from what the daemon already keeps: the
// report counters, the live rank registry and the catalog (runs, incidents,
// probes, commands, telemetry, file size). Registered once on the state's
// registry:
//
//   metrics::RegisterStateCollector(state);   // before serving /metrics
//
// The catalog-derived values (runs, their last step, generation and last
// record, rewinds, commands pending, incidents and probes) come from a
// snapshot read at most once per `catalog_refresh` (on the state's clock):
// a scrape storm (many Prometheus replicas, a dashboard on auto-refresh)
// reads SQLite once a second, not once per scrape. The report counters,
// uptime, connected ranks, catalog file size and every instrument of
// daemon/metrics (counters, histograms) stay live. Each snapshot read counts
// in spikeguard_metrics_catalog_reads_total.
//
// Names follow Prometheus conventions: prefix spikeguard_, base units,
// counters end in _total, labels name runs, verdicts and kinds (never a step
// or a document).
#pragma once

#include <string>

#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/ingest/counters.h"
#include "daemon/ingest/run_registry.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {
class Supervisor;
}

namespace spikeguard::metrics {

struct StateCollectorOptions {
  // How long a catalog snapshot answers scrapes; zero: every scrape reads.
  absl::Duration catalog_refresh = absl::Seconds(1);
};

class Registry;

// What the collector reads; everything outlives the registry.
struct StateSources {
  storage::Catalog* catalog = nullptr;
  // The catalog's file (its size, with the WAL's, is a gauge).
  std::string catalog_path;
  Clock* clock = nullptr;
  absl::Time started;
  // Live precursor warnings; null: the stored ones only.
  daemon::Supervisor* supervisor = nullptr;
  daemon::RunRegistry* registry = nullptr;
  const daemon::Counters* counters = nullptr;
};

// Adds the collector to `registry` (which keeps it).
void RegisterStateCollector(Registry* registry, StateSources sources,
                            const StateCollectorOptions& options = {});

}  // namespace spikeguard::metrics
