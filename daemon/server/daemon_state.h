// daemon_state.h
// -----------------------------------------------------------------------------
// What the gRPC adapters share: the catalog, the live rank registry, limits,
// counters and the clock. Owned by `Daemon`; adapters hold a pointer.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/control/stream_hub.h"
#include "daemon/ingest/limits.h"
#include "daemon/ingest/run_registry.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/metrics/registry.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

struct Counters {
  std::atomic<int64_t> reports_accepted{0};
  std::atomic<int64_t> reports_duplicate{0};
  std::atomic<int64_t> reports_rejected{0};
  std::atomic<int64_t> reports_dropped{0};
};

class Supervisor;
class Launcher;
class LaunchProfiles;
class CheckpointGuard;
}  // namespace spikeguard::daemon

namespace spikeguard::auth {
class Authorizer;
}

namespace spikeguard::daemon {

struct DaemonState {
  DaemonState(storage::Catalog* catalog, Clock* clock, Limits limits, std::string catalog_path)
      : catalog(catalog),
        clock(clock),
        limits(limits),
        catalog_path(std::move(catalog_path)),
        registry(clock),
        started(clock->Now()) {}

  storage::Catalog* const catalog;
  Clock* const clock;
  const Limits limits;
  const std::string catalog_path;
  RunRegistry registry;
  StreamHub hub;
  // Detection, incidents and commands; set once the daemon has started it.
  Supervisor* supervisor = nullptr;
  // Starts and restarts the ranks of runs created with a spec (local
  // processes or Slurm jobs, by the run's launch profile).
  Launcher* launcher = nullptr;
  // The operator's launch profiles (never null once the daemon serves; empty
  // without --launch-profiles) and the checkpoint confinement.
  LaunchProfiles* profiles = nullptr;
  CheckpointGuard* checkpoints = nullptr;
  // Who may call what; never null once the daemon serves.
  const auth::Authorizer* authorizer = nullptr;
  bool tls = false;
  Counters counters;
  const absl::Time started;
  // /metrics: the registry, and the daemon's instruments in it (the ingest
  // and control code record into `metrics`; daemon/metrics/state_collector
  // adds what is computed at scrape time).
  metrics::Registry metrics_registry;
  metrics::DaemonMetrics metrics{&metrics_registry};
};

}  // namespace spikeguard::daemon
