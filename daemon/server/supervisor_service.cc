#include "daemon/server/supervisor_service.h"

#include <atomic>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/auth/authorizer.h"
#include "daemon/server/status_util.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = spikeguard::v1;

// The handler's answer into the response: its status, or OK with `out` set.
template <class T>
grpc::Status Reply(absl::StatusOr<T> answer, T* out) {
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  *out = std::move(*answer);
  return grpc::Status::OK;
}

// A page of a list into a list response's items and next_page_token.
template <class Item, class Response>
grpc::Status ReplyPage(absl::StatusOr<Page<Item>> answer,
                       google::protobuf::RepeatedPtrField<Item>* items, Response* out) {
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  for (Item& item : answer->items) *items->Add() = std::move(item);
  out->set_next_page_token(std::move(answer->next_page_token));
  return grpc::Status::OK;
}

grpc::Status ReplyAction(absl::StatusOr<ActionResult> answer, v1::ActionResponse* out) {
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  out->set_accepted(true);
  out->set_message(std::move(answer->message));
  out->set_generation(answer->generation);
  out->set_command_id(std::move(answer->command_id));
  return grpc::Status::OK;
}

}  // namespace

grpc::Status SupervisorServiceImpl::Allow(Ctx* ctx, auth::Need need, const char* rpc,
                                          const std::string& run, auth::Principal* who) const {
  if (authorizer_ == nullptr) {
    if (who != nullptr) {
      who->name = "anonymous";
      who->role = auth::Role::kAdmin;
      who->all_runs = true;
    }
    return grpc::Status::OK;
  }
  return authorizer_->Check(*ctx, need, rpc, run, who);
}

grpc::Status SupervisorServiceImpl::AllowIncident(Ctx* ctx, auth::Need need, const char* rpc,
                                                  int64_t incident_id) const {
  if (authorizer_ == nullptr) return grpc::Status::OK;
  // The incident's run decides; an unknown incident is the handler's
  // NOT_FOUND, once the caller is known.
  auto incident = catalog_->GetIncident(incident_id);
  if (!incident.ok()) {
    auto who = authorizer_->Authenticate(*ctx);
    if (!who.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(who.status().message()));
    }
    return grpc::Status::OK;
  }
  return authorizer_->Check(*ctx, need, rpc, incident->run());
}

grpc::Status SupervisorServiceImpl::GetStatus(Ctx* ctx, const v1::GetStatusRequest*,
                                              v1::ServerStatus* out) {
  auth::Principal who;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "GetStatus", "", &who); !a.ok()) return a;
  if (grpc::Status s = Reply(handler_->GetStatus(), out); !s.ok()) return s;
  // Who is asking is the transport's to say.
  out->set_authentication(authorizer_ != nullptr && authorizer_->enabled());
  if (out->authentication()) {
    out->set_principal(who.name);
    out->set_role(auth::RoleName(who.role));
  }
  if (!who.SeesEveryRun()) {
    // Counts over every run and where the catalog lives are not for a
    // principal scoped to some runs.
    const v1::ServerStatus full = *out;
    out->Clear();
    out->set_version(full.version());
    out->set_uptime_s(full.uptime_s());
    out->set_schema_version(full.schema_version());
    out->set_tls(full.tls());
    out->set_authentication(full.authentication());
    out->set_principal(full.principal());
    out->set_role(full.role());
  }
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::CreateRun(Ctx* ctx, const v1::CreateRunRequest* req,
                                              v1::Run* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kAdmin, "CreateRun", req->name()); !a.ok()) return a;
  NewRun run;
  run.name = req->name();
  run.world_size = req->world_size();
  run.mode = req->mode();
  run.spec = req->spec();
  run.launch = req->launch();
  return Reply(handler_->CreateRun(run), out);
}

grpc::Status SupervisorServiceImpl::GetRun(Ctx* ctx, const v1::GetRunRequest* req, v1::Run* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "GetRun", req->name()); !a.ok()) return a;
  return Reply(handler_->GetRun(req->name()), out);
}

grpc::Status SupervisorServiceImpl::ListRuns(Ctx* ctx, const v1::ListRunsRequest* req,
                                             v1::ListRunsResponse* out) {
  auth::Principal who;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListRuns", "", &who); !a.ok()) return a;
  return ReplyPage(handler_->ListRuns(who, req->page_token()), out->mutable_runs(), out);
}

grpc::Status SupervisorServiceImpl::SetRunProfile(Ctx* ctx, const v1::SetRunProfileRequest* req,
                                                  v1::Run* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kAdmin, "SetRunProfile", req->run()); !a.ok()) {
    return a;
  }
  const std::map<std::string, std::string> params(req->params().begin(), req->params().end());
  return Reply(handler_->SetRunProfile(req->run(), req->profile(), params), out);
}

grpc::Status SupervisorServiceImpl::ListCheckpoints(Ctx* ctx, const v1::ListCheckpointsRequest* req,
                                                    v1::ListCheckpointsResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListCheckpoints", req->run()); !a.ok()) {
    return a;
  }
  return ReplyPage(handler_->ListCheckpoints(req->run(), req->page_token()),
                   out->mutable_checkpoints(), out);
}

grpc::Status SupervisorServiceImpl::RegisterCheckpoint(Ctx* ctx,
                                                       const v1::RegisterCheckpointRequest* req,
                                                       v1::Checkpoint* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kWorker, "RegisterCheckpoint",
                             req->checkpoint().run());
      !a.ok()) {
    return a;
  }
  return Reply(handler_->RegisterCheckpoint(req->checkpoint()), out);
}

grpc::Status SupervisorServiceImpl::PinCheckpoint(Ctx* ctx, const v1::PinCheckpointRequest* req,
                                                  v1::Checkpoint* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "PinCheckpoint", req->run()); !a.ok()) {
    return a;
  }
  return Reply(handler_->PinCheckpoint(req->run(), req->step(), req->pinned()), out);
}

grpc::Status SupervisorServiceImpl::QueryTelemetry(Ctx* ctx, const v1::QueryTelemetryRequest* req,
                                                   v1::QueryTelemetryResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "QueryTelemetry", req->run()); !a.ok()) {
    return a;
  }
  TelemetryQuery query;
  query.run = req->run();
  query.from_step = req->from_step();
  if (req->has_to_step()) query.to_step = req->to_step();
  if (req->has_generation()) query.generation = req->generation();
  query.limit = req->limit();
  query.metrics = req->metrics();
  auto page = handler_->QueryTelemetry(query);
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (auto& r : page->records) *out->add_records() = std::move(r);
  out->set_truncated(page->truncated);
  out->set_next_from_step(page->next_from_step);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::Rewind(Ctx* ctx, const v1::RewindRequest* req,
                                           v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Rewind", req->run()); !a.ok()) return a;
  RewindArgs args;
  args.run = req->run();
  args.to_step = req->to_step();
  for (const auto& w : req->skip()) args.skip.push_back({w.from_step(), w.to_step()});
  args.stop_after_step = req->stop_after_step();
  args.request_id = req->request_id();
  return ReplyAction(handler_->Rewind(args), out);
}

grpc::Status SupervisorServiceImpl::Replay(Ctx* ctx, const v1::ReplayRequest* req,
                                           v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Replay", req->run()); !a.ok()) return a;
  return ReplyAction(handler_->Replay(req->run(), req->from_step(), req->stop_after_step(),
                                      req->request_id()),
                     out);
}

grpc::Status SupervisorServiceImpl::Skip(Ctx* ctx, const v1::SkipRequest* req,
                                         v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Skip", req->run()); !a.ok()) return a;
  return ReplyAction(
      handler_->Skip(req->run(), {req->from_step(), req->to_step()}, req->request_id()), out);
}

grpc::Status SupervisorServiceImpl::Pause(Ctx* ctx, const v1::PauseRequest* req,
                                          v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Pause", req->run()); !a.ok()) return a;
  return ReplyAction(handler_->Pause(req->run()), out);
}

grpc::Status SupervisorServiceImpl::Resume(Ctx* ctx, const v1::ResumeRequest* req,
                                           v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Resume", req->run()); !a.ok()) return a;
  return ReplyAction(handler_->Resume(req->run()), out);
}

grpc::Status SupervisorServiceImpl::ListIncidents(Ctx* ctx, const v1::ListIncidentsRequest* req,
                                                  v1::ListIncidentsResponse* out) {
  auth::Principal who;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListIncidents", req->run(), &who);
      !a.ok()) {
    return a;
  }
  storage::IncidentFilter filter;
  filter.run = req->run();
  filter.state = req->state();
  filter.verdict = req->verdict();
  filter.since_unix_ms = req->since_unix_ms();
  return ReplyPage(handler_->ListIncidents(who, filter, req->page_token()),
                   out->mutable_incidents(), out);
}

grpc::Status SupervisorServiceImpl::ListWarnings(Ctx* ctx, const v1::ListWarningsRequest* req,
                                                 v1::ListWarningsResponse* out) {
  auth::Principal who;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListWarnings", req->run(), &who); !a.ok()) {
    return a;
  }
  storage::WarningFilter filter;
  filter.run = req->run();
  filter.state = req->state();
  return ReplyPage(handler_->ListWarnings(who, filter, req->page_token()), out->mutable_warnings(),
                   out);
}

grpc::Status SupervisorServiceImpl::GetIncident(Ctx* ctx, const v1::GetIncidentRequest* req,
                                                v1::Incident* out) {
  if (grpc::Status a = AllowIncident(ctx, auth::Need::kRead, "GetIncident", req->id()); !a.ok()) {
    return a;
  }
  return Reply(handler_->GetIncident(req->id()), out);
}

grpc::Status SupervisorServiceImpl::WatchIncidents(Ctx* ctx, const v1::WatchIncidentsRequest* req,
                                                   grpc::ServerWriter<v1::IncidentUpdate>* writer) {
  auth::Principal who;
  std::atomic<uint64_t> auth_epoch =
      authorizer_ != nullptr ? authorizer_->epoch() : 0;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "WatchIncidents", req->run(), &who);
      !a.ok()) {
    return a;
  }
  auto subscription = handler_->WatchIncidents(who, req->run());
  if (!subscription.ok()) return ToGrpcStatus(subscription.status());
  // Short waits, so a cancelled call (or a token revoked meanwhile) is
  // noticed; writes happen with no lock held.
  while (!ctx->IsCancelled()) {
    if (authorizer_ != nullptr) {
      grpc::Status still = authorizer_->Recheck(*ctx, auth::Need::kRead, "WatchIncidents",
                                                       req->run(), &auth_epoch);
      if (!still.ok()) return still;
    }
    auto batch = (*subscription)->Next(absl::Milliseconds(200));
    if (!batch) break;
    bool ok = true;
    for (const auto& u : *batch) ok = ok && writer->Write(u);
    if (!ok) break;
  }
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::Approve(Ctx* ctx, const v1::ApproveRequest* req,
                                            v1::ActionResponse* out) {
  if (grpc::Status a = AllowIncident(ctx, auth::Need::kOperate, "Approve", req->incident_id());
      !a.ok()) {
    return a;
  }
  return ReplyAction(handler_->Approve(req->incident_id()), out);
}

grpc::Status SupervisorServiceImpl::Abort(Ctx* ctx, const v1::AbortRequest* req,
                                          v1::ActionResponse* out) {
  if (grpc::Status a = AllowIncident(ctx, auth::Need::kOperate, "Abort", req->incident_id());
      !a.ok()) {
    return a;
  }
  return ReplyAction(handler_->Abort(req->incident_id(), req->reason()), out);
}

grpc::Status SupervisorServiceImpl::GetPolicy(Ctx* ctx, const v1::GetPolicyRequest* req,
                                              v1::Policy* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "GetPolicy", req->run()); !a.ok()) return a;
  return Reply(handler_->GetPolicy(req->run()), out);
}

grpc::Status SupervisorServiceImpl::SetPolicy(Ctx* ctx, const v1::SetPolicyRequest* req,
                                              v1::Policy* out) {
  // The daemon's default policy is the admin's; a run's, its operators'.
  const auth::Need need = req->run().empty() ? auth::Need::kAdmin : auth::Need::kOperate;
  if (grpc::Status a = Allow(ctx, need, "SetPolicy", req->run()); !a.ok()) return a;
  return Reply(handler_->SetPolicy(req->run(), req->policy()), out);
}

grpc::Status SupervisorServiceImpl::ResolveManifest(Ctx* ctx, const v1::ResolveManifestRequest* req,
                                                    v1::ResolveManifestResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ResolveManifest", req->run()); !a.ok()) {
    return a;
  }
  auto steps = handler_->ResolveManifest(req->run(), req->generation(), req->from_step(),
                                         req->to_step());
  if (!steps.ok()) return ToGrpcStatus(steps.status());
  for (auto& r : *steps) *out->add_steps() = std::move(r);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::ListQuarantine(Ctx* ctx, const v1::ListQuarantineRequest* req,
                                                   v1::ListQuarantineResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListQuarantine", req->run()); !a.ok()) {
    return a;
  }
  return ReplyPage(handler_->ListQuarantine(req->run(), req->page_token()),
                   out->mutable_entries(), out);
}

grpc::Status SupervisorServiceImpl::AddQuarantine(Ctx* ctx, const v1::AddQuarantineRequest* req,
                                                  v1::QuarantineEntry* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "AddQuarantine", req->entry().run());
      !a.ok()) {
    return a;
  }
  return Reply(handler_->AddQuarantine(req->entry()), out);
}

grpc::Status SupervisorServiceImpl::ListAudit(Ctx* ctx, const v1::ListAuditRequest* req,
                                              v1::ListAuditResponse* out) {
  // Operators read the audit of their runs; the whole log (no run: every
  // run's entries and those of no run) is the admin's.
  const auth::Need need = req->run().empty() ? auth::Need::kAdmin : auth::Need::kOperate;
  if (grpc::Status a = Allow(ctx, need, "ListAudit", req->run()); !a.ok()) return a;
  AuditQuery query;
  query.run = req->run();
  query.principal = req->principal();
  query.since_unix_ms = req->since_unix_ms();
  query.limit = req->limit();
  query.page_token = req->page_token();
  return ReplyPage(handler_->ListAudit(query), out->mutable_entries(), out);
}

}  // namespace spikeguard::daemon
