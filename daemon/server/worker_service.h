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
#pragma once

#include "daemon/server/daemon_state.h"
#include "spikeguard/v1/worker.grpc.pb.h"

namespace spikeguard::daemon {

class WorkerServiceImpl final : public spikeguard::v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(DaemonState* state) : state_(state) {}

  grpc::Status Attach(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<spikeguard::v1::ControllerMessage,
                                               spikeguard::v1::WorkerMessage>* stream) override;

 private:
  DaemonState* const state_;
};

}  // namespace spikeguard::daemon
