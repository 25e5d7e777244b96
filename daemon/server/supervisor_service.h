// supervisor_service.h
// -----------------------------------------------------------------------------
// SupervisorService: runs, checkpoints, telemetry queries, incidents and
// manual actions for operators, over gRPC. A thin adapter: each method
// authorizes the caller from its ServerContext, unpacks the request into
// domain arguments, calls the OperatorHandler (daemon/control/
// operator_handler.h, where every value is validated and every action
// taken) and packs the answer; statuses map through ToGrpcStatus.
#pragma once

#include "daemon/auth/authorizer.h"
#include "daemon/control/operator_handler.h"
#include "storage/catalog/catalog.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"

namespace spikeguard::daemon {

class SupervisorServiceImpl final : public spikeguard::v1::SupervisorService::Service {
 public:
  // `authorizer` decides who may call what (null: everyone may), `catalog`
  // says an incident's run (whose readers may read it), `handler` answers.
  // All outlive the service.
  SupervisorServiceImpl(const auth::Authorizer* authorizer, storage::Catalog* catalog,
                        OperatorHandler* handler)
      : authorizer_(authorizer), catalog_(catalog), handler_(handler) {}

  using Ctx = grpc::ServerContext;
  grpc::Status GetStatus(Ctx*, const spikeguard::v1::GetStatusRequest*,
                         spikeguard::v1::ServerStatus*) override;
  grpc::Status CreateRun(Ctx*, const spikeguard::v1::CreateRunRequest*,
                         spikeguard::v1::Run*) override;
  grpc::Status GetRun(Ctx*, const spikeguard::v1::GetRunRequest*, spikeguard::v1::Run*) override;
  grpc::Status ListRuns(Ctx*, const spikeguard::v1::ListRunsRequest*,
                        spikeguard::v1::ListRunsResponse*) override;
  grpc::Status SetRunProfile(Ctx*, const spikeguard::v1::SetRunProfileRequest*,
                             spikeguard::v1::Run*) override;
  grpc::Status ListCheckpoints(Ctx*, const spikeguard::v1::ListCheckpointsRequest*,
                               spikeguard::v1::ListCheckpointsResponse*) override;
  grpc::Status RegisterCheckpoint(Ctx*, const spikeguard::v1::RegisterCheckpointRequest*,
                                  spikeguard::v1::Checkpoint*) override;
  grpc::Status PinCheckpoint(Ctx*, const spikeguard::v1::PinCheckpointRequest*,
                             spikeguard::v1::Checkpoint*) override;
  grpc::Status QueryTelemetry(Ctx*, const spikeguard::v1::QueryTelemetryRequest*,
                              spikeguard::v1::QueryTelemetryResponse*) override;

  // Incidents, actions, policy, manifest, quarantine.
  grpc::Status ListIncidents(Ctx*, const spikeguard::v1::ListIncidentsRequest*,
                             spikeguard::v1::ListIncidentsResponse*) override;
  grpc::Status GetIncident(Ctx*, const spikeguard::v1::GetIncidentRequest*,
                           spikeguard::v1::Incident*) override;
  grpc::Status WatchIncidents(Ctx*, const spikeguard::v1::WatchIncidentsRequest*,
                              grpc::ServerWriter<spikeguard::v1::IncidentUpdate>*) override;
  grpc::Status ListWarnings(Ctx*, const spikeguard::v1::ListWarningsRequest*,
                            spikeguard::v1::ListWarningsResponse*) override;
  grpc::Status Rewind(Ctx*, const spikeguard::v1::RewindRequest*,
                      spikeguard::v1::ActionResponse*) override;
  grpc::Status Replay(Ctx*, const spikeguard::v1::ReplayRequest*,
                      spikeguard::v1::ActionResponse*) override;
  grpc::Status Skip(Ctx*, const spikeguard::v1::SkipRequest*,
                    spikeguard::v1::ActionResponse*) override;
  grpc::Status Pause(Ctx*, const spikeguard::v1::PauseRequest*,
                     spikeguard::v1::ActionResponse*) override;
  grpc::Status Resume(Ctx*, const spikeguard::v1::ResumeRequest*,
                      spikeguard::v1::ActionResponse*) override;
  grpc::Status Approve(Ctx*, const spikeguard::v1::ApproveRequest*,
                       spikeguard::v1::ActionResponse*) override;
  grpc::Status Abort(Ctx*, const spikeguard::v1::AbortRequest*,
                     spikeguard::v1::ActionResponse*) override;
  grpc::Status GetPolicy(Ctx*, const spikeguard::v1::GetPolicyRequest*,
                         spikeguard::v1::Policy*) override;
  grpc::Status SetPolicy(Ctx*, const spikeguard::v1::SetPolicyRequest*,
                         spikeguard::v1::Policy*) override;
  grpc::Status ResolveManifest(Ctx*, const spikeguard::v1::ResolveManifestRequest*,
                               spikeguard::v1::ResolveManifestResponse*) override;
  grpc::Status ListQuarantine(Ctx*, const spikeguard::v1::ListQuarantineRequest*,
                              spikeguard::v1::ListQuarantineResponse*) override;
  grpc::Status AddQuarantine(Ctx*, const spikeguard::v1::AddQuarantineRequest*,
                             spikeguard::v1::QuarantineEntry*) override;

  grpc::Status ListAudit(Ctx*, const spikeguard::v1::ListAuditRequest*,
                         spikeguard::v1::ListAuditResponse*) override;

 private:
  // Whether the caller may make this call (UNAUTHENTICATED /
  // PERMISSION_DENIED otherwise); `who` receives the principal.
  grpc::Status Allow(Ctx* ctx, auth::Need need, const char* rpc, const std::string& run,
                     auth::Principal* who = nullptr) const;
  // The same for a call naming an incident: its run decides.
  grpc::Status AllowIncident(Ctx* ctx, auth::Need need, const char* rpc, int64_t incident_id) const;

  const auth::Authorizer* const authorizer_;
  storage::Catalog* const catalog_;
  OperatorHandler* const handler_;
};

}  // namespace spikeguard::daemon
