// supervisor.h
// -----------------------------------------------------------------------------
// Wires detection and the incident engine into the daemon. After every
// committed batch, the run-level records that became complete (every rank
// reported) are delivered in step order to the run's detectors and to the
// engine; detector events open incidents; the engine acts through RunControl
// and persists through the catalog. Operators' incident calls (list, get,
// watch, approve, abort, manual rewinds) come through here too.
//
// The engine is single-threaded by contract; every call into it holds mu_.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "daemon/control/catalog_adapters.h"
#include "daemon/control/run_control.h"
#include "daemon/control/stream_hub.h"
#include "daemon/detect/run_monitor.h"
#include "daemon/incident/engine.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class Supervisor {
 public:
  Supervisor(storage::Catalog* catalog, StreamHub* hub, Clock* clock);
  ~Supervisor();

  // Recovers open incidents from their event logs and starts the tick thread.
  absl::Status Start();
  void Stop();

  RunControl* control() { return &control_; }
  CatalogRunView* view() { return &view_; }

  // A batch covering steps [first, last] of `generation` was committed; a
  // step's record is complete once `world_size` ranks reported it.
  void OnCommitted(const std::string& run, int64_t generation, uint32_t world_size, int64_t first,
                   int64_t last);

  // A rank reports that its generation stopped training before any horizon
  // it was given (the end of its training schedule): a probe waiting for
  // steps past `last_step` is judged with what it has, at once.
  void OnGenerationEnded(const std::string& run, int64_t generation, uint32_t rank,
                         int64_t last_step, const std::string& reason);
  // A rank could not execute a command (e.g. "cannot open checkpoint"): the
  // incident that asked for it fails that action at once with the message.
  void OnCommandFailed(const std::string& run, const std::string& command_id, uint32_t rank,
                       const std::string& message);

  // Operators.
  absl::Status Approve(int64_t id);
  absl::Status Abort(int64_t id, const std::string& reason);
  bool ProbeRunning(const std::string& run);
  std::optional<spikeguard::v1::Incident> LiveIncident(int64_t id);
  int OpenIncidents();

  // Watchers (WatchIncidents): a queue of updates for an optional run filter.
  struct Watcher {
    std::string run;
    absl::Mutex mu;
    absl::CondVar cv;
    std::deque<spikeguard::v1::IncidentUpdate> updates ABSL_GUARDED_BY(mu);
    bool closed ABSL_GUARDED_BY(mu) = false;
  };
  std::shared_ptr<Watcher> Watch(const std::string& run);
  void Unwatch(const std::shared_ptr<Watcher>& watcher);

 private:
  struct Monitor {
    int64_t generation = -1;
    int64_t next_step = -1;  // delivery cursor
    std::unique_ptr<detect::RunMonitor> detectors;
  };

  void Deliver(const std::string& run, int64_t generation, uint32_t world, int64_t up_to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetMonitor(const std::string& run, int64_t generation, int64_t first_step, Monitor* m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Observe(const std::string& run, Monitor* m, const spikeguard::v1::StepRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(const spikeguard::v1::Incident& incident, const spikeguard::v1::IncidentEvent& event);
  void TickLoop();

  storage::Catalog* const catalog_;
  Clock* const clock_;
  RunControl control_;
  CatalogRunView view_;
  CatalogIncidentStore store_;

  absl::Mutex mu_;
  std::unique_ptr<incident::IncidentEngine> engine_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Monitor> monitors_ ABSL_GUARDED_BY(mu_);

  absl::Mutex watch_mu_;
  std::vector<std::shared_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(watch_mu_);

  absl::Mutex tick_mu_;
  bool stopping_ ABSL_GUARDED_BY(tick_mu_) = false;
  std::thread tick_thread_;
};

}  // namespace spikeguard::daemon
