// supervisor.h
// -----------------------------------------------------------------------------
// Wires detection and the incident engine into the daemon. The ingest stage
// pushes, in memory, the run-level records that became complete (every rank
// reported) in each group commit to its queue (daemon/ingest/
// completed_queue.h); the supervisor's dispatcher thread takes them from
// there and hands each run's records to the run's pipeline, a serialized
// executor on a small thread pool, that delivers them in step order to the
// run's detectors and to the engine, off the RPC threads. Detector events open incidents; the engine acts through
// RunControl and persists through the catalog. Operators' incident calls
// (list, get, watch, approve, abort, manual rewinds) come through here too.
//
// The engine is single-threaded by contract; every call into it holds mu_.
// Detectors run under no lock of the Supervisor (a run's pipeline owns
// them). Commands the engine issues are written to the streams only after
// mu_ is released (RunControl::Outbox), so a slow stream delays only the
// pipeline of its own run.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/task_pool.h"
#include "daemon/control/catalog_adapters.h"
#include "daemon/control/live_streams.h"
#include "daemon/control/precursor_warnings.h"
#include "daemon/control/run_control.h"
#include "daemon/control/stream_hub.h"
#include "daemon/detect/run_monitor.h"
#include "daemon/incident/engine.h"
#include "daemon/ingest/completed_queue.h"
#include "daemon/metrics/daemon_metrics.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class Supervisor {
 public:
  // Called on a run's pipeline with each record's detection latency
  // (metrics::DetectionLatency: to the decision, and for a record that
  // opened an incident, also to its "opened" event durable and published):
  // exact figures for benchmarks (the histograms have buckets).
  using LatencyObserver = std::function<void(const metrics::DetectionLatency&)>;

  // What the supervisor uses; everything outlives it.
  struct Deps {
    storage::Catalog* catalog = nullptr;
    // Where commands and incident updates are pushed to live streams.
    StreamHub* hub = nullptr;
    Clock* clock = nullptr;
    // The ingest stage's queue of completed records (null: none arrive;
    // operators' calls only).
    CompletedQueue* completed = nullptr;
    // Rewind targets only among the checkpoints it verifies; null: all.
    CheckpointGuard* checkpoints = nullptr;
    // Corpus dirs confined again at each read; null: not confined.
    LaunchProfiles* profiles = nullptr;
    // Null: not recorded.
    metrics::DaemonMetrics* metrics = nullptr;
    LatencyObserver latency_observer;
    // Threads running the runs' pipelines (a run uses one at a time).
    int pipeline_threads = 2;
  };

  explicit Supervisor(Deps deps);
  ~Supervisor();

  // Recovers open incidents from their event logs, starts the tick thread,
  // the pipelines and the dispatcher (which opens the completed queue).
  absl::Status Start();
  // Processes what the queue held, then closes it and stops.
  void Stop();

  RunControl* control() { return &control_; }
  CatalogRunView* view() { return &view_; }

  static constexpr int64_t kMaxQueuedRecords = 65536;
  // Waits until every pipeline has processed what it was handed.
  void Drain();

  // Queued on the run's pipeline, behind the records the ingest stage
  // queued before it.
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
  // An operator's rewind: refused (FAILED_PRECONDITION) while an incident
  // probe runs on `run`, else issued, both under the engine's lock so that
  // no probe can start in between. The command is written after the lock is
  // released. Returns the new generation.
  absl::StatusOr<int64_t> OperatorRewind(const std::string& run, const incident::RewindSpec& spec);
  std::optional<spikeguard::v1::Incident> LiveIncident(int64_t id);
  int OpenIncidents();
  // The live copies of the active precursor warnings of `run` ("": every
  // run), fresher than the catalog's (WarningTracker persists them every
  // few steps); the others are read from the catalog.
  std::vector<spikeguard::v1::PrecursorWarning> ActiveWarnings(const std::string& run = "") {
    return warnings_.Active(run);
  }

  // Watchers (WatchIncidents): a queue of updates of one run ("": every
  // run), registered in watchers_ (LiveStreams) under `id`.
  struct Watcher {
    uint64_t id = 0;
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
  // One run's serialized executor: its tasks run one at a time, in order.
  // (The analysis cannot name the outer exec_mu_ from here: `tasks` and
  // `scheduled` are read and written only under it.)
  struct Pipeline {
    std::string run;
    // Each task with the number of records it carries.
    std::deque<std::pair<int64_t, std::function<void()>>> tasks;
    bool scheduled = false;
    // Touched only by the pipeline's running task.
    Monitor monitor;
    // The run's generation tree as last read (generation -> parent), for
    // telling which generations are on a precursor warning's line.
    std::map<int64_t, int64_t> parents;
  };

  // `wait`: first wait for room (kMaxQueuedRecords).
  // False when dropped (stopping, or not started).
  bool Post(const std::string& run, int64_t records, std::function<void()> task,
            bool wait = true);
  // The dispatcher thread: hands what the completed queue holds to the
  // pipelines (DispatchPending) until the queue closes.
  void DispatchLoop();
  // Every slice queued now, each run's records to its pipeline, in order.
  void DispatchPending() ABSL_LOCKS_EXCLUDED(dispatch_mu_);
  // Records of one slice, by (run, generation, step): posted on their runs'
  // pipelines (never waits); each told Done to the queue once delivered.
  void OnCompleted(std::vector<CompletedStep> completed, absl::Time arrived)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  void AwaitRoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  // One turn of a scheduled pipeline on the pool: the tasks it holds, then
  // another turn queued when more arrived meanwhile.
  void RunPipeline(Pipeline* p) ABSL_LOCKS_EXCLUDED(exec_mu_);
  // On the run's pipeline.
  // Records each delivered record's latency from `arrived` (the others
  // were stale or delivered before).
  void Deliver(Pipeline* p, std::vector<CompletedStep> records, absl::Time arrived);
  void ResetMonitor(const std::string& run, int64_t generation, int64_t first_step, Monitor* m);
  std::vector<incident::Detection> Detect(Pipeline* p, const spikeguard::v1::StepRecord& record);
  // Whether generation `descendant` of the pipeline's run is `ancestor` or
  // descends from it (the tree is read again when a generation is new).
  bool OnLine(Pipeline* p, int64_t ancestor, int64_t descendant);
  // The engine's listener: queues the update for every watcher of its run.
  // Runs as soon as the event is durable, on the engine's caller's thread
  // with mu_ held, so it only enqueues.
  void Publish(const spikeguard::v1::Incident& incident, const spikeguard::v1::IncidentEvent& event);
  // A precursor warning that opened, cleared or preceded an incident, to
  // every watcher of its run.
  void PublishWarning(const spikeguard::v1::PrecursorWarning& warning, std::string_view kind);
  void Broadcast(const std::string& run, const spikeguard::v1::IncidentUpdate& update);
  void TickLoop();

  storage::Catalog* const catalog_;
  Clock* const clock_;
  RunControl control_;
  CatalogRunView view_;
  CatalogIncidentStore store_;
  WarningTracker warnings_;

  absl::Mutex mu_;
  std::unique_ptr<incident::IncidentEngine> engine_ ABSL_GUARDED_BY(mu_);
  // Null: not recorded.
  metrics::DaemonMetrics* const metrics_;
  const LatencyObserver latency_observer_;
  CompletedQueue* const completed_;
  // Dispatching from the queue to the pipelines, one thread at a time, so
  // slices reach a pipeline in queue order (the dispatcher, and
  // OnGenerationEnded, which first dispatches what is queued before it).
  absl::Mutex dispatch_mu_;
  std::thread dispatcher_;
  // When the engine last decided to open an incident, and when the last
  // "opened" event was published (ns since the epoch; 0: none since
  // Deliver reset them): an opening record's latencies end there.
  std::atomic<int64_t> decided_at_ns_{0};
  std::atomic<int64_t> opened_at_ns_{0};
  // Incidents opened since the pipelines last looked, as (run, id, onset
  // step): Publish records them, the run's pipeline hands them to warnings_.
  absl::Mutex opened_mu_;
  std::vector<std::tuple<std::string, int64_t, int64_t>> opened_ ABSL_GUARDED_BY(opened_mu_);

  absl::Mutex exec_mu_;
  std::map<std::string, std::unique_ptr<Pipeline>> pipelines_ ABSL_GUARDED_BY(exec_mu_);
  int64_t queued_records_ ABSL_GUARDED_BY(exec_mu_) = 0;
  // Pipelines with a turn queued or running on the pool.
  int scheduled_ ABSL_GUARDED_BY(exec_mu_) = 0;
  bool exec_started_ ABSL_GUARDED_BY(exec_mu_) = false;
  bool exec_stopping_ ABSL_GUARDED_BY(exec_mu_) = false;
  const int pipeline_threads_;
  // The pipelines' threads: made by Start, gone after Stop; posted to under
  // exec_mu_ while started and not stopping.
  std::unique_ptr<TaskPool> pipeline_pool_;

  // One broadcast at a time, so that every watcher queues updates in the
  // same order.
  absl::Mutex watch_mu_;
  LiveStreams<Watcher> watchers_;

  absl::Mutex tick_mu_;
  bool stopping_ ABSL_GUARDED_BY(tick_mu_) = false;
  std::thread tick_thread_;
};

}  // namespace spikeguard::daemon
