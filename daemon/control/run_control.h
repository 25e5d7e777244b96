// run_control.h
// -----------------------------------------------------------------------------
// RunControl acts on runs for the incident engine and for operators: a rewind
// starts a new generation in the catalog and sends REWIND to every live rank;
// CONTINUE and PAUSE likewise. Every command is written to the catalog's
// `commands` table before it is sent and carries an idempotency id, so a
// repeated request (after a daemon crash) creates nothing new, and a worker
// executes each id at most once. Commands a rank has not acknowledged are
// re-sent when it attaches again.
//
//   RunControl control(catalog, &hub, clock);
//   SG_ASSIGN_OR_RETURN(int64_t gen, control.Rewind("gpt", spec));
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "daemon/control/stream_hub.h"
#include "daemon/incident/engine.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class RunControl final : public incident::RunController {
 public:
  RunControl(storage::Catalog* catalog, StreamHub* hub, Clock* clock)
      : catalog_(catalog), hub_(hub), clock_(clock) {}

  absl::StatusOr<int64_t> Rewind(const std::string& run, const incident::RewindSpec& spec) override;
  absl::Status Continue(const std::string& run, const std::string& request_id,
                        const std::optional<spikeguard::v1::HParams>& hparams) override;
  absl::Status Pause(const std::string& run, const std::string& request_id) override;

  // Commands of `run` not yet acknowledged by every rank that a stream at
  // `stream_generation` must still get, in order.
  std::vector<spikeguard::v1::Command> Unacknowledged(const std::string& run,
                                                      int64_t stream_generation);
  // True when an unacknowledged REWIND leads into `generation`: a rank still
  // in an older generation may attach to receive it.
  bool RewindPendingInto(const std::string& run, int64_t generation);
  // A rank reported a command's result.
  void OnCommandResult(const std::string& run, uint32_t rank,
                       const spikeguard::v1::CommandResult& result);

  // While an Outbox lives on a thread, the commands RunControl issues on that
  // thread are recorded in the catalog at once but written to the streams
  // only when the Outbox is destroyed: declare it before taking a lock, so
  // that no lock is held across a stream write. Outboxes nest (the outermost
  // sends).
  //
  //   RunControl::Outbox outbox(control);
  //   { absl::MutexLock lock(&mu_); engine_->Tick(); }
  //   // ~Outbox: the commands go out here, every lock released
  class Outbox {
   public:
    explicit Outbox(RunControl* control);
    ~Outbox();
    Outbox(const Outbox&) = delete;
    Outbox& operator=(const Outbox&) = delete;

   private:
    friend class RunControl;
    struct Queued {
      std::string run;
      spikeguard::v1::ControllerMessage message;
      bool mark_sent = false;
    };
    RunControl* const control_;
    Outbox* const outer_;
    std::vector<Queued> queued_;
  };

 private:
  // Writes `message` to the run's streams now, or queues it in this thread's
  // Outbox; marks the command sent when a stream took it.
  void Send(const std::string& run, const spikeguard::v1::ControllerMessage& message,
            bool mark_sent);
  int SendNow(const std::string& run, const spikeguard::v1::ControllerMessage& message,
              bool mark_sent);

  absl::Status Issue(const std::string& run, int64_t generation, spikeguard::v1::Command command);

  storage::Catalog* const catalog_;
  StreamHub* const hub_;
  Clock* const clock_;
  absl::Mutex mu_;
  // command id -> ranks that acknowledged it (in memory; a daemon restart
  // re-sends, and workers deduplicate by id).
  std::map<std::string, std::set<uint32_t>> acks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spikeguard::daemon
