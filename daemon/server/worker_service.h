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
// A stream must send its hello within limits.hello_timeout (else it ends
// DEADLINE_EXCEEDED), and at most limits.max_pending_hellos streams may be
// waiting for theirs (others end RESOURCE_EXHAUSTED at once): a client that
// never says hello holds no thread for long.
#pragma once

#include <atomic>
#include <memory>

#include "daemon/ingest/group_commit.h"
#include "daemon/server/daemon_state.h"
#include "spikeguard/v1/worker.grpc.pb.h"

namespace spikeguard::daemon {

class WorkerServiceImpl final : public spikeguard::v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(DaemonState* state);
  ~WorkerServiceImpl() override;

  grpc::Status Attach(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<spikeguard::v1::ControllerMessage,
                                               spikeguard::v1::WorkerMessage>* stream) override;

 private:
  DaemonState* const state_;
  // Ends streams that keep their hello past the deadline.
  class HelloWatchdog;
  std::unique_ptr<HelloWatchdog> hello_watchdog_;
  std::atomic<int> pending_hellos_{0};
  // Group commit of every stream's report batches; completed step records
  // go from it to the supervisor's run pipelines.
  std::unique_ptr<GroupCommitter> ingest_;
};

}  // namespace spikeguard::daemon
