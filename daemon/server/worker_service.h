// worker_service.h
// -----------------------------------------------------------------------------
// WorkerService.Attach: one bidirectional stream per training rank.
//
// The first message must be a Hello; the run must exist and the generation
// must be the run's current one, otherwise the worker gets a Reject naming the
// reason and the stream ends. After the Welcome, report batches are validated,
// committed to the catalog, and only then acknowledged (Ack.seq), so nothing
// acknowledged is ever lost; reports at steps the rank already delivered in
// this generation are counted as duplicates and not stored twice. Invalid
// batches are acknowledged as rejected with a message naming the field, and
// the stream stays open.
//
// What each message means (the checks above, the catalog, the registry) is
// WorkerSession's (daemon/ingest/worker_session.h); this adapter only reads
// a message, calls the stream's session, and writes what it returns.
//
// Threading (callback API, no thread per stream): gRPC calls the stream's
// reactor when a message arrives or a write completes; the handling of each
// message (SQLite reads, validation) runs on a small pool shared by every
// stream, one message of a stream at a time and in order. A report batch
// goes to the group committer and the next message is read at once: up to
// kMaxBatchesInFlight batches of a stream wait for their commit together,
// and their acks are written when their group is durable. Acks and commands
// share the stream's write queue (one write at a time, in order); a rank
// that stops reading stalls only its own queue.
//
// A stream must send its hello within limits.hello_timeout (else it ends
// DEADLINE_EXCEEDED), and at most limits.max_pending_hellos streams may be
// waiting for theirs (others end RESOURCE_EXHAUSTED at once): a client that
// never says hello holds nothing for long. With authentication on, a stream
// whose principal's role cannot attach at all ends PERMISSION_DENIED before
// it takes a slot, and one principal holds at most
// limits.max_pending_hellos_per_principal of them: a token cannot lock the
// other workers out.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "base/task_pool.h"
#include "daemon/control/stream_hub.h"
#include "daemon/ingest/group_commit.h"
#include "daemon/ingest/worker_session.h"
#include "daemon/metrics/daemon_metrics.h"
#include "spikeguard/v1/worker.grpc.pb.h"

namespace spikeguard::auth {
class Authorizer;
}

namespace spikeguard::daemon {

class WorkerServiceImpl final : public spikeguard::v1::WorkerService::CallbackService {
 public:
  // Report batches of one stream waiting for their commit at once; the
  // stream is not read further until one is answered (backpressure).
  static constexpr int kMaxBatchesInFlight = 8;

  // What the service uses; everything outlives it.
  struct Deps {
    // What each stream's session uses.
    WorkerSession::Deps session;
    // Who may attach; null: no authentication.
    const auth::Authorizer* authorizer = nullptr;
    // Where a stream registers to be pushed its run's commands.
    StreamHub* hub = nullptr;
    metrics::DaemonMetrics* metrics = nullptr;
  };

  // `ingest`: the group commit every stream's report batches go to (it
  // outlives the service's streams).
  WorkerServiceImpl(const Deps& deps, GroupCommitter* ingest);
  ~WorkerServiceImpl() override;

  grpc::ServerBidiReactor<spikeguard::v1::WorkerMessage, spikeguard::v1::ControllerMessage>*
  Attach(grpc::CallbackServerContext* context) override;

 private:
  class AttachReactor;
  class HelloWatchdog;

  const Deps deps_;
  // Ends streams that keep their hello past the deadline.
  std::unique_ptr<HelloWatchdog> hello_watchdog_;
  std::atomic<int> pending_hellos_{0};
  // Streams waiting for their hello, by principal (authentication on).
  absl::Mutex pending_mu_;
  std::map<std::string, int> pending_by_principal_ ABSL_GUARDED_BY(pending_mu_);
  // Group commit of every stream's report batches.
  GroupCommitter* const ingest_;
  // Where the streams' messages are handled, one task per stream at a time
  // (its next message is read only once the task is done), so a stream's
  // messages are handled in order (declared last: destroyed
  // first, after the server has ended every stream).
  std::unique_ptr<TaskPool> pool_;
};

}  // namespace spikeguard::daemon
