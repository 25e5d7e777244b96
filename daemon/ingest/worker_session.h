// worker_session.h
// -----------------------------------------------------------------------------
// The domain side of one worker stream (WorkerService.Attach): what a rank's
// hello, report batches and notices mean to the daemon, with no transport.
// The gRPC reactor (daemon/server/worker_service.cc) reads a message, calls
// the session method for its kind, and writes what comes back; a test drives
// a session with a real catalog and no gRPC at all.
//
//   WorkerSession session(&state, authorize);
//   absl::StatusOr<v1::Welcome> welcome = session.Hello(hello);
//   if (!welcome.ok()) {
//     // Write *RejectOf(welcome.status()) when there is one, then end the
//     // stream with welcome.status().
//   }
//   absl::StatusOr<WorkerSession::AcceptedBatch> accepted =
//       session.Reports(std::move(batch));
//   // accepted->batch goes to the group committer; once its group is
//   // durable, session.Committed(outcome, accepted->ticket) is the Ack.
//
// Errors follow one rule, so the reactor needs no knowledge of the cases:
//  - a status carrying a Reject (`Refusal`, read back with `RejectOf`) ends
//    the stream: the worker is sent the Reject, the stream ends with the
//    status (stale generation, unknown run, data-order mismatch, ...);
//  - from Hello, any other error (a catalog failure) ends the stream with it
//    and no Reject;
//  - from Reports, CheckpointSaved and CheckpointDeleted, any other error is
//    answered with an Ack that carries its message (the batch's reports
//    rejected, or seq 0 for a notice), and the stream stays open;
//  - from Committed, an error ends the stream (the batch is not
//    acknowledged, so the worker resends it after reconnecting).
//
// Threading: Hello and the message methods are called for one stream one at
// a time, in order; Committed runs on the commit thread meanwhile. The rank's
// committed step, which both read, is under the session's lock; everything
// Hello sets is read-only afterwards. No lock is held across a catalog call
// except the process-wide one that serializes the data-order check with its
// recording.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/ingest/group_commit.h"
#include "base/clock.h"
#include "daemon/ingest/counters.h"
#include "daemon/ingest/limits.h"
#include "daemon/ingest/run_registry.h"
#include "spikeguard/v1/worker.pb.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class Supervisor;
class CheckpointGuard;

// A refusal that ends the stream: `code` and `message` are the stream's end
// status; the worker is first sent a Reject with `reason`, `message` and
// `current_generation`.
absl::Status Refusal(spikeguard::v1::Reject::Reason reason, absl::string_view message,
                     int64_t current_generation, absl::StatusCode code);

// The Reject a refusal carries; nullopt for any other status.
std::optional<spikeguard::v1::Reject> RejectOf(const absl::Status& status);

class WorkerSession {
 public:
  // Whether the stream's principal may attach a rank of `run` (the reactor
  // authenticated the call; the session asks once it knows the run).
  using Authorize = std::function<absl::Status(const std::string& run)>;

  // What the ack of a batch in the group committer needs once it is durable.
  struct BatchTicket {
    uint64_t seq = 0;
    int64_t generation = 0;
    int reports = 0;
    // The batch's furthest step: the registry keeps only that.
    spikeguard::v1::StepReport furthest;
  };
  // A validated batch: `batch` goes to the group committer.
  struct AcceptedBatch {
    IngestBatch batch;
    BatchTicket ticket;
  };

  // What a session uses; everything outlives it.
  struct Deps {
    storage::Catalog* catalog = nullptr;
    Clock* clock = nullptr;
    Limits limits;
    // The live ranks: connected, their progress and who ended.
    RunRegistry* registry = nullptr;
    // Detection and commands; null: none (pending rewinds and command
    // results are then not followed).
    Supervisor* supervisor = nullptr;
    // The checkpoint confinement; null: checkpoints are not confined.
    CheckpointGuard* checkpoints = nullptr;
    Counters* counters = nullptr;
  };

  // `authorize` may be empty (no auth).
  explicit WorkerSession(const Deps& deps, Authorize authorize = nullptr);
  // Detaches (idempotent).
  ~WorkerSession();

  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  // The stream's hello: validates it, checks the run exists, its world size,
  // the generation (a rank behind may attach only to catch up through a
  // pending rewind) and the data order against the run's manifest and its
  // other connected ranks; then records the order and registers the rank.
  // Returns the Welcome (run, generation, the rank's committed step).
  absl::StatusOr<spikeguard::v1::Welcome> Hello(const spikeguard::v1::Hello& hello);

  // The commands this rank has not acknowledged yet, oldest first: sent
  // right after the Welcome.
  std::vector<spikeguard::v1::Command> Unacknowledged() const;

  // A report batch, validated (fields, steps increasing, not too far ahead
  // of the run, the stream's generation) and turned into the group
  // committer's batch; the reports are moved out of `batch`.
  absl::StatusOr<AcceptedBatch> Reports(spikeguard::v1::StepReportBatch batch);
  // The Ack of a batch once its group committed (or was refused as stale);
  // records the rank's progress. Called on the commit thread.
  absl::StatusOr<spikeguard::v1::Ack> Committed(const BatchOutcome& outcome,
                                                const BatchTicket& ticket);

  // Notices: stored (a checkpoint confined to the run's root) or refused
  // with a message for the worker. A stored checkpoint moves the run's
  // rolling rewind target (daemon/control/rolling_pin.h); `pins`, when
  // given, receives the answer for the worker: the URIs its retention must
  // keep now (has_pins set).
  absl::Status CheckpointSaved(const spikeguard::v1::CheckpointSaved& saved,
                               spikeguard::v1::Ack* pins = nullptr);
  absl::Status CheckpointDeleted(const spikeguard::v1::CheckpointDeleted& deleted);
  // Passed on to the supervisor; nothing goes back to the worker.
  void GenerationEnded(const spikeguard::v1::GenerationEnded& ended);
  void Heartbeat(const spikeguard::v1::Heartbeat& heartbeat);
  void CommandResult(const spikeguard::v1::CommandResult& result);

  // The rank is no longer connected (unless a newer stream took over).
  void Detach();

  // The hello as received (empty before one), whether or not it was
  // accepted; the rest is meaningful once Hello succeeded.
  const spikeguard::v1::Hello& hello() const { return hello_; }
  const std::string& run() const { return hello_.run(); }
  uint32_t rank() const { return hello_.rank(); }
  int64_t generation() const { return generation_; }

 private:
  absl::StatusOr<spikeguard::v1::Run> FindRun() const;
  // Chooses the stream's generation from the run's current one.
  absl::Status FenceGeneration(int64_t current);
  // Refuses a data order that contradicts the manifest or the other ranks,
  // else records it as the run's.
  absl::Status RecordDataOrder();
  // The rank's furthest known step: what a new report may lead by at most
  // limits.max_step_ahead.
  int64_t LastKnownStep() const;
  absl::Status StampRefused(absl::string_view what, const absl::Status& why) const;

  const Deps deps_;
  const Authorize authorize_;

  // Set by Hello; read-only afterwards.
  spikeguard::v1::Hello hello_;
  int64_t current_ = 0;
  int64_t generation_ = 0;
  bool catching_up_ = false;
  std::optional<uint64_t> stream_id_;

  mutable absl::Mutex mu_;
  // The furthest step this rank committed: later reports may not run
  // arbitrarily far past what the run has reached.
  int64_t rank_last_step_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace spikeguard::daemon
