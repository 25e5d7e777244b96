#include "daemon/server/supervisor_service.h"

#include "daemon/http/document_preview.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "daemon/auth/authorizer.h"
#include "daemon/control/supervisor.h"
#include "daemon/incident/checkpoint_choice.h"
#include "daemon/incident/plan_proto.h"
#include "daemon/incident/policy.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "daemon/launch/launcher.h"
#include "daemon/server/status_util.h"
#include "storage/corpus/data_plan.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = spikeguard::v1;

constexpr int kDefaultTelemetryLimit = 10'000;
constexpr int kMaxTelemetryLimit = 100'000;
constexpr char kVersion[] = "spikeguard 0.1.0";

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}


const std::set<std::string>& LayerMetricNames() {
  static const auto* names = [] {
    auto* s = new std::set<std::string>;
    const auto* d = v1::LayerStats::descriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      if (d->field(i)->name() != "layer") s->insert(d->field(i)->name());
    }
    return s;
  }();
  return *names;
}

const std::set<std::string>& RecordMetricNames() {
  static const auto* names = [] {
    auto* s = new std::set<std::string>;
    const auto* d = v1::StepRecord::descriptor();
    for (int i = 0; i < d->field_count(); ++i) s->insert(d->field(i)->name());
    return s;
  }();
  return *names;
}

bool IsIdentityField(const std::string& name) {
  return name == "generation" || name == "step" || name == "ranks_reported";
}

// Every list response is paged under the byte budget limits.max_response_bytes;
// a page token is "o<offset>" into the list (opaque to clients).
absl::StatusOr<size_t> PageOffset(const std::string& token, size_t total) {
  if (token.empty()) return 0;
  uint64_t offset = 0;
  if (token.size() < 2 || token[0] != 'o' || !absl::SimpleAtoi(token.substr(1), &offset) ||
      offset > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: '", LogText(token, 64),
                     "' is not a token this daemon gave out (or the list shrank since); ask "
                     "again without one"));
  }
  return static_cast<size_t>(offset);
}

// Adds items from `offset` on while they fit in `budget` bytes (at least
// one); returns the next page's token, "" after the last page.
template <class Item, class Add>
std::string FillPage(std::vector<Item>& items, size_t offset, int64_t budget, Add add) {
  int64_t used = 0;
  size_t i = offset;
  for (; i < items.size(); ++i) {
    const int64_t bytes = static_cast<int64_t>(items[i].ByteSizeLong()) + 8;
    if (i > offset && used + bytes > budget) break;
    used += bytes;
    add(std::move(items[i]));
  }
  return i < items.size() ? absl::StrCat("o", i) : std::string();
}

}  // namespace

absl::Status ValidateMetricNames(const google::protobuf::RepeatedPtrField<std::string>& metrics) {
  for (const std::string& m : metrics) {
    if (RecordMetricNames().count(m) == 0 && LayerMetricNames().count(m) == 0) {
      std::vector<std::string> known(RecordMetricNames().begin(), RecordMetricNames().end());
      known.insert(known.end(), LayerMetricNames().begin(), LayerMetricNames().end());
      return absl::InvalidArgumentError(absl::StrCat("metrics: unknown metric '", m.substr(0, 64),
                                                     "'; known: ", absl::StrJoin(known, ", ")));
    }
  }
  return absl::OkStatus();
}

v1::StepRecord FilterMetrics(const v1::StepRecord& record,
                             const google::protobuf::RepeatedPtrField<std::string>& metrics) {
  if (metrics.empty()) return record;
  std::set<std::string> wanted(metrics.begin(), metrics.end());
  v1::StepRecord out;
  const auto* desc = v1::StepRecord::descriptor();
  const auto* refl = v1::StepRecord::GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> present;
  refl->ListFields(record, &present);
  for (const auto* field : present) {
    if (IsIdentityField(field->name()) || wanted.count(field->name()) > 0) {
      // Copy the field by round-tripping through a one-field message.
      v1::StepRecord one = record;
      for (int i = 0; i < desc->field_count(); ++i) {
        if (desc->field(i) != field) one.GetReflection()->ClearField(&one, desc->field(i));
      }
      out.MergeFrom(one);
    }
  }
  std::set<std::string> layer_wanted;
  for (const auto& m : wanted) {
    if (LayerMetricNames().count(m) > 0 && RecordMetricNames().count(m) == 0) layer_wanted.insert(m);
  }
  // "grad_norm" names the record's global norm; per-layer grad norms come
  // with "layers".
  if (!layer_wanted.empty() && wanted.count("layers") == 0) {
    const auto* ldesc = v1::LayerStats::descriptor();
    for (const auto& layer : record.layers()) {
      v1::LayerStats* l = out.add_layers();
      l->set_layer(layer.layer());
      for (const auto& name : layer_wanted) {
        const auto* f = ldesc->FindFieldByName(name);
        l->GetReflection()->SetDouble(l, f, layer.GetReflection()->GetDouble(layer, f));
      }
    }
  }
  return out;
}

grpc::Status SupervisorServiceImpl::Allow(Ctx* ctx, auth::Need need, const char* rpc,
                                          const std::string& run, auth::Principal* who) const {
  if (state_->authorizer == nullptr) {
    if (who != nullptr) {
      who->name = "anonymous";
      who->role = auth::Role::kAdmin;
      who->all_runs = true;
    }
    return grpc::Status::OK;
  }
  return state_->authorizer->Check(*ctx, need, rpc, run, who);
}

grpc::Status SupervisorServiceImpl::AllowIncident(Ctx* ctx, auth::Need need, const char* rpc,
                                                  int64_t incident_id) const {
  if (state_->authorizer == nullptr) return grpc::Status::OK;
  // The incident's run decides; an unknown incident is the handler's
  // NOT_FOUND, once the caller is known.
  auto incident = state_->catalog->GetIncident(incident_id);
  if (!incident.ok()) {
    auto who = state_->authorizer->Authenticate(*ctx);
    if (!who.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(who.status().message()));
    }
    return grpc::Status::OK;
  }
  return state_->authorizer->Check(*ctx, need, rpc, incident->run());
}

grpc::Status SupervisorServiceImpl::GetStatus(Ctx* ctx, const v1::GetStatusRequest*,
                                              v1::ServerStatus* out) {
  auth::Principal who;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "GetStatus", "", &who); !a.ok()) return a;
  out->set_version(kVersion);
  out->set_uptime_s(absl::ToInt64Seconds(state_->clock->Now() - state_->started));
  out->set_catalog_path(state_->catalog_path);
  out->set_schema_version(state_->catalog->schema_version());
  auto runs = state_->catalog->ListRuns();
  if (!runs.ok()) return ToGrpcStatus(runs.status());
  out->set_runs(static_cast<int32_t>(runs->size()));
  out->set_connected_ranks(state_->registry.ConnectedRanks());
  out->set_reports_accepted(state_->counters.reports_accepted.load());
  out->set_reports_duplicate(state_->counters.reports_duplicate.load());
  out->set_reports_rejected(state_->counters.reports_rejected.load());
  out->set_reports_dropped(state_->counters.reports_dropped.load());
  out->set_open_incidents(state_->supervisor ? state_->supervisor->OpenIncidents() : 0);
  out->set_authentication(state_->authorizer != nullptr && state_->authorizer->enabled());
  out->set_tls(state_->tls);
  if (out->authentication()) {
    out->set_principal(who.name);
    out->set_role(auth::RoleName(who.role));
  }
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::CreateRun(Ctx* ctx, const v1::CreateRunRequest* req, v1::Run* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kAdmin, "CreateRun", req->name()); !a.ok()) return a;
  if (auto s = ValidateCreateRunRequest(*req, state_->limits); !s.ok()) return Invalid(std::string(s.message()));
  if (auto s = ValidateRunName(req->name(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (req->world_size() == 0 || req->world_size() > state_->limits.max_world_size) {
    return Invalid(absl::StrFormat("world_size: %d is out of range [1, %d]", req->world_size(),
                                   state_->limits.max_world_size));
  }
  // Nothing from the wire is executed: no command, env or workdir; a launch
  // profile of the daemon's and valid values for its parameters.
  if (state_->profiles == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  if (auto s = state_->profiles->ValidateSpec(req->spec(), req->world_size(), "spec"); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (req->launch() && req->spec().profile().empty()) {
    return Invalid("spec.profile: launching a run needs a launch profile of the daemon's");
  }
  v1::Run run;
  run.set_name(req->name());
  run.set_world_size(req->world_size());
  run.set_mode(req->mode() == v1::MODE_UNSPECIFIED ? v1::MODE_OBSERVE : req->mode());
  run.set_state("created");
  run.set_created_unix_ms(state_->clock->NowUnixMillis());
  *run.mutable_spec() = req->spec();
  auto created = state_->catalog->CreateRun(run);
  if (!created.ok()) return ToGrpcStatus(created.status());
  SG_LOG(INFO) << "run '" << req->name() << "' created (world size " << req->world_size() << ")";
  *out = *created;
  // An external profile (no argv): the workers are started outside the
  // daemon (torchrun, a scheduler); the run is created and waits for them.
  bool external = false;
  if (req->launch() && state_->profiles != nullptr && !req->spec().profile().empty()) {
    auto profile = state_->profiles->Find(req->spec().profile());
    external = profile.ok() && profile->argv().empty();
  }
  if (external) {
    SG_LOG(INFO) << "run '" << req->name() << "': profile '" << req->spec().profile()
                 << "' is external; the daemon waits for workers started outside it";
  } else if (req->launch()) {
    if (state_->launcher == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the launcher is not running");
    }
    if (auto s = state_->launcher->Launch(req->name()); !s.ok()) return ToGrpcStatus(s);
    out->set_state("running");
  }
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::GetRun(Ctx* ctx, const v1::GetRunRequest* req, v1::Run* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "GetRun", req->name()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->name(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  auto run = state_->catalog->GetRun(req->name());
  if (!run.ok()) return ToGrpcStatus(run.status());
  *out = *run;
  // Live state where the daemon has it, committed progress otherwise.
  auto live = state_->registry.Ranks(req->name());
  auto progress = state_->catalog->ListRankProgress(req->name());
  std::map<uint32_t, v1::RankState> ranks;
  if (progress.ok()) {
    for (const auto& r : *progress) {
      if (r.generation() == run->current_generation()) ranks[r.rank()] = r;
    }
  }
  for (const auto& r : live) {
    v1::RankState& merged = ranks[r.rank()];
    const int64_t last_step = std::max(merged.last_step(), r.last_step());
    merged = r;
    merged.set_last_step(last_step);
  }
  out->clear_ranks();
  int64_t last_step = out->last_step();
  for (auto& [rank, r] : ranks) {
    last_step = std::max(last_step, r.last_step());
    *out->add_ranks() = r;
  }
  out->set_last_step(last_step);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::ListRuns(Ctx* ctx, const v1::ListRunsRequest* req,
                                             v1::ListRunsResponse* out) {
  auth::Principal who;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListRuns", "", &who); !a.ok()) return a;
  auto runs = state_->catalog->ListRuns();
  if (!runs.ok()) return ToGrpcStatus(runs.status());
  // A principal scoped to some runs sees only those.
  runs->erase(std::remove_if(runs->begin(), runs->end(),
                             [&](const v1::Run& r) { return !who.MayUseRun(r.name()); }),
              runs->end());
  auto offset = PageOffset(req->page_token(), runs->size());
  if (!offset.ok()) return Invalid(std::string(offset.status().message()));
  const int64_t budget = state_->limits.max_response_bytes;
  for (auto& r : *runs) {
    // A spec stored before specs were bounded is left out of the list
    // (runs show has it) rather than make the list unreadable.
    if (static_cast<int64_t>(r.ByteSizeLong()) > budget / 2) r.clear_spec();
  }
  out->set_next_page_token(
      FillPage(*runs, *offset, budget, [&](v1::Run&& r) { *out->add_runs() = std::move(r); }));
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::SetRunProfile(Ctx* ctx, const v1::SetRunProfileRequest* req,
                                                  v1::Run* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kAdmin, "SetRunProfile", req->run()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(absl::StrCat("run: ", s.message()));
  }
  if (req->profile().empty()) return Invalid("profile: empty; name a launch profile of the daemon's");
  if (state_->profiles == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  auto row = state_->catalog->GetRun(req->run());
  if (!row.ok()) return ToGrpcStatus(row.status());
  v1::RunSpec spec = row->spec();
  const bool was_legacy = IsLegacySpec(spec);
  spec.clear_command();
  spec.clear_env();
  spec.clear_workdir();
  spec.set_profile(req->profile());
  *spec.mutable_params() = req->params();
  if (auto s = state_->profiles->ValidateSpec(spec, row->world_size(), ""); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (auto s = state_->catalog->SetRunSpec(req->run(), spec); !s.ok()) return ToGrpcStatus(s);
  SG_LOG(INFO) << "run '" << req->run() << "' mapped to launch profile " << Quoted(req->profile())
               << (was_legacy ? " (its free command line is dropped)" : "");
  auto updated = state_->catalog->GetRun(req->run());
  if (!updated.ok()) return ToGrpcStatus(updated.status());
  *out = *updated;
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::ListCheckpoints(Ctx* ctx, const v1::ListCheckpointsRequest* req,
                                                    v1::ListCheckpointsResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListCheckpoints", req->run()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  auto run = state_->catalog->GetRun(req->run());
  if (!run.ok()) return ToGrpcStatus(run.status());
  auto list = state_->catalog->ListCheckpoints(req->run());
  if (!list.ok()) return ToGrpcStatus(list.status());
  auto offset = PageOffset(req->page_token(), list->size());
  if (!offset.ok()) return Invalid(std::string(offset.status().message()));
  out->set_next_page_token(FillPage(*list, *offset, state_->limits.max_response_bytes,
                                    [&](v1::Checkpoint&& c) {
                                      *out->add_checkpoints() = std::move(c);
                                    }));
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::RegisterCheckpoint(Ctx* ctx,
                                                       const v1::RegisterCheckpointRequest* req,
                                                       v1::Checkpoint* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kWorker, "RegisterCheckpoint", req->checkpoint().run()); !a.ok()) return a;
  const v1::Checkpoint& c = req->checkpoint();
  if (auto s = ValidateRunName(c.run(), state_->limits); !s.ok()) {
    return Invalid(absl::StrCat("checkpoint.", s.message()));
  }
  v1::CheckpointSaved as_saved;
  as_saved.set_step(c.step());
  as_saved.set_data_position(c.data_position());
  as_saved.set_uri(c.uri());
  as_saved.set_bytes(c.bytes());
  as_saved.set_checksum(c.checksum());
  if (auto s = ValidateCheckpointSaved(as_saved, state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (c.generation() < 0) return Invalid("checkpoint.generation: negative");
  // Confined to the run's checkpoint root, before anything is stored.
  if (state_->checkpoints == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  if (auto confined = state_->checkpoints->Confine(c.run(), c.uri()); !confined.ok()) {
    if (!absl::IsInvalidArgument(confined.status())) return ToGrpcStatus(confined.status());
    return Invalid(absl::StrCat("checkpoint.", confined.status().message()));
  }
  v1::Checkpoint ckpt = c;
  if (ckpt.created_unix_ms() == 0) ckpt.set_created_unix_ms(state_->clock->NowUnixMillis());
  auto stored = state_->catalog->UpsertCheckpoint(ckpt);
  if (!stored.ok()) return ToGrpcStatus(stored.status());
  *out = *stored;
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::PinCheckpoint(Ctx* ctx, const v1::PinCheckpointRequest* req,
                                                  v1::Checkpoint* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "PinCheckpoint", req->run()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (req->step() < 0) return Invalid("step: negative");
  auto pinned = state_->catalog->PinCheckpoint(req->run(), req->step(), req->pinned());
  if (!pinned.ok()) return ToGrpcStatus(pinned.status());
  *out = *pinned;
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::QueryTelemetry(Ctx* ctx, const v1::QueryTelemetryRequest* req,
                                                   v1::QueryTelemetryResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "QueryTelemetry", req->run()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (req->from_step() < 0) {
    return Invalid(absl::StrFormat("from_step: %d is negative", req->from_step()));
  }
  if (req->has_to_step() && req->to_step() < req->from_step()) {
    return Invalid(absl::StrFormat("to_step: %d is before from_step %d", req->to_step(),
                                   req->from_step()));
  }
  if (req->has_generation() && req->generation() < 0) {
    return Invalid(absl::StrFormat("generation: %d is negative", req->generation()));
  }
  if (req->limit() < 0) return Invalid("limit: negative");
  if (auto s = ValidateMetricNames(req->metrics()); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  auto run = state_->catalog->GetRun(req->run());
  if (!run.ok()) return ToGrpcStatus(run.status());
  const int64_t generation = req->has_generation() ? req->generation() : run->current_generation();
  const int limit = std::min(req->limit() == 0 ? kDefaultTelemetryLimit : req->limit(),
                             kMaxTelemetryLimit);
  std::optional<int64_t> to;
  if (req->has_to_step()) to = req->to_step();
  // Paged by rows (limit) and by bytes (limits.max_response_bytes, well
  // under a client's 4 MB): a cut result is truncated, with the step to ask
  // again from. Read in chunks, so a wide record costs no more than a page.
  constexpr int kChunk = 64;
  const int64_t budget = state_->limits.max_response_bytes;
  int64_t used = 0;
  int64_t from = req->from_step();
  int taken = 0;
  while (true) {
    const int want = std::min(kChunk, limit - taken) + 1;  // one more: is there a next?
    auto records = state_->catalog->QueryTelemetry(req->run(), generation, from, to, want);
    if (!records.ok()) return ToGrpcStatus(records.status());
    bool cut = false;
    for (const auto& r : *records) {
      v1::StepRecord filtered = FilterMetrics(r, req->metrics());
      const int64_t bytes = static_cast<int64_t>(filtered.ByteSizeLong()) + 8;
      if (taken == limit || (taken > 0 && used + bytes > budget)) {
        out->set_truncated(true);
        out->set_next_from_step(r.step());
        cut = true;
        break;
      }
      used += bytes;
      ++taken;
      *out->add_records() = std::move(filtered);
    }
    if (cut || static_cast<int>(records->size()) < want) break;
    if (records->back().step() == std::numeric_limits<int64_t>::max()) break;  // no step after it
    from = records->back().step() + 1;
  }
  return grpc::Status::OK;
}

namespace {

// Newest complete catalog checkpoint at or before `step` (highest generation
// wins a tie); FAILED_PRECONDITION when there is none, or when that one does
// not verify (outside the run's checkpoint root, file gone or changed),
// naming why: an operator's rewind never silently goes further back.
absl::StatusOr<incident::CheckpointInfo> CheckpointAtOrBefore(storage::Catalog* catalog,
                                                            CheckpointGuard* guard,
                                                            const std::string& run, int64_t step) {
  auto list = catalog->ListCheckpoints(run);
  if (!list.ok()) return list.status();
  std::vector<incident::CheckpointInfo> all;
  for (const auto& c : *list) all.push_back(incident::ToCheckpointInfo(c));
  incident::CheckpointQuery query;
  query.max_step = step;
  query.ties_to_highest_generation = true;
  auto best = incident::ChooseCheckpoint(all, query);
  if (!best.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "run '%s' has no complete checkpoint at or before step %d", run, step));
  }
  if (guard != nullptr) {
    const size_t row = std::find_if(all.begin(), all.end(),
                                    [&](const incident::CheckpointInfo& c) {
                                      return c.generation == best->generation &&
                                             c.step == best->step && c.uri == best->uri;
                                    }) -
                       all.begin();
    if (auto verified = guard->Verify((*list)[row]); !verified.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "run '%s': cannot rewind to step %d: the %s", run, step, verified.status().message()));
    }
  }
  return *best;
}

std::string RequestId(const std::string& given, const std::string& kind, Clock* clock) {
  if (!given.empty()) return "manual/" + given;
  return absl::StrCat("manual/", kind, "/", clock->NowUnixMillis());
}

}  // namespace

grpc::Status SupervisorServiceImpl::ManualRewind(const std::string& run, int64_t to_step,
                                                 const std::vector<std::pair<int64_t, int64_t>>& skip,
                                                 int64_t stop_after, const std::string& request_id,
                                                 const std::string& reason,
                                                 v1::ActionResponse* out) {
  if (auto s = ValidateRunName(run, state_->limits); !s.ok()) return Invalid(std::string(s.message()));
  if (to_step < 0) return Invalid(absl::StrFormat("to_step: %d is negative", to_step));
  if (stop_after != 0 && stop_after < to_step) {
    return Invalid(absl::StrFormat("stop_after_step: %d is before the rewind step %d", stop_after,
                                   to_step));
  }
  Supervisor* sup = state_->supervisor;
  if (sup == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "daemon is starting");
  auto run_row = state_->catalog->GetRun(run);
  if (!run_row.ok()) return ToGrpcStatus(run_row.status());
  // Early, so a refused rewind costs nothing; decided below under the lock.
  if (sup->ProbeRunning(run)) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("run '", run, "' is running an incident probe; wait for it or "
                                     "abort the incident first"));
  }
  auto ckpt = CheckpointAtOrBefore(state_->catalog, state_->checkpoints, run, to_step);
  if (!ckpt.ok()) return ToGrpcStatus(ckpt.status());
  auto plan = sup->view()->Plan(run, run_row->current_generation());
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  auto storage_plan = incident::PlanFromProto(*plan);
  if (!storage_plan.ok()) return ToGrpcStatus(storage_plan.status());
  storage::DataPlan edited = *storage_plan;
  for (const auto& [from, to] : skip) {
    if (from < 0 || to < from) {
      return Invalid(absl::StrFormat("skip: window %d:%d is not a valid step range", from, to));
    }
    auto begin = storage_plan->PositionForStep(from);
    auto end = storage_plan->PositionForStep(to);
    if (!begin.ok() || !end.ok()) return Invalid("skip: window is past the end of the data plan");
    if (*end == std::numeric_limits<int64_t>::max()) {
      return Invalid(absl::StrFormat("skip: window %d:%d reaches past the last data position",
                                     from, to));
    }
    auto holed = edited.WithHole(*begin, *end + 1);
    if (!holed.ok()) return ToGrpcStatus(holed.status());
    edited = *holed;
  }
  incident::RewindSpec spec;
  spec.request_id = request_id;
  spec.checkpoint = *ckpt;
  spec.plan = incident::PlanToProto(edited);
  spec.stop_after_step = stop_after;
  spec.reason = reason;
  // A rewind keeps the hyperparameters in force (a fix applied earlier).
  if (auto hp = sup->view()->HParams(run, run_row->current_generation()); hp.ok()) {
    spec.hparams = *hp;
  }
  // Checked again with the rewind, under the engine's lock: a probe that
  // started since the check above makes this FAILED_PRECONDITION too.
  auto gen = sup->OperatorRewind(run, spec);
  if (!gen.ok()) return ToGrpcStatus(gen.status());
  out->set_accepted(true);
  out->set_generation(*gen);
  out->set_command_id(request_id);
  out->set_message(absl::StrFormat("run '%s' rewinds to the checkpoint at step %d in generation %d",
                                   run, ckpt->step, *gen));
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::Rewind(Ctx* ctx, const v1::RewindRequest* req, v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Rewind", req->run()); !a.ok()) return a;
  std::vector<std::pair<int64_t, int64_t>> skip;
  for (int i = 0; i < req->skip_size(); ++i) {
    const auto& w = req->skip(i);
    if (auto s = ValidateStepWindow(absl::StrFormat("skip[%d].from_step", i), w.from_step(),
                                    absl::StrFormat("skip[%d].to_step", i), w.to_step(),
                                    state_->limits);
        !s.ok()) {
      return Invalid(std::string(s.message()));
    }
    skip.emplace_back(w.from_step(), w.to_step());
  }
  return ManualRewind(req->run(), req->to_step(), skip, req->stop_after_step(),
                      RequestId(req->request_id(), "rewind", state_->clock),
                      absl::StrCat("manual rewind to step ", req->to_step()), out);
}

grpc::Status SupervisorServiceImpl::Replay(Ctx* ctx, const v1::ReplayRequest* req, v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Replay", req->run()); !a.ok()) return a;
  if (req->from_step() < 0) {
    return Invalid(absl::StrFormat("from_step: %d is negative", req->from_step()));
  }
  if (req->stop_after_step() < 0) {
    return Invalid(absl::StrFormat("stop_after_step: %d is negative", req->stop_after_step()));
  }
  return ManualRewind(req->run(), req->from_step(), {}, req->stop_after_step(),
                      RequestId(req->request_id(), "replay", state_->clock),
                      absl::StrCat("manual replay from step ", req->from_step()), out);
}

grpc::Status SupervisorServiceImpl::Skip(Ctx* ctx, const v1::SkipRequest* req, v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Skip", req->run()); !a.ok()) return a;
  if (auto s = ValidateStepWindow("from_step", req->from_step(), "to_step", req->to_step(),
                                  state_->limits);
      !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  return ManualRewind(req->run(), req->from_step(), {{req->from_step(), req->to_step()}}, 0,
                      RequestId(req->request_id(), "skip", state_->clock),
                      absl::StrFormat("manual skip of steps %d..%d", req->from_step(), req->to_step()),
                      out);
}

grpc::Status SupervisorServiceImpl::Pause(Ctx* ctx, const v1::PauseRequest* req, v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Pause", req->run()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (state_->supervisor == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  if (auto r = state_->catalog->GetRun(req->run()); !r.ok()) return ToGrpcStatus(r.status());
  const std::string id = RequestId("", "pause", state_->clock);
  if (auto s = state_->supervisor->control()->Pause(req->run(), id); !s.ok()) return ToGrpcStatus(s);
  out->set_accepted(true);
  out->set_command_id(id);
  out->set_message("pause sent");
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::Resume(Ctx* ctx, const v1::ResumeRequest* req, v1::ActionResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "Resume", req->run()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (state_->supervisor == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  if (auto r = state_->catalog->GetRun(req->run()); !r.ok()) return ToGrpcStatus(r.status());
  const std::string id = RequestId("", "resume", state_->clock);
  if (auto s = state_->supervisor->control()->Continue(req->run(), id, std::nullopt); !s.ok()) {
    return ToGrpcStatus(s);
  }
  out->set_accepted(true);
  out->set_command_id(id);
  out->set_message("continue sent");
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::ListIncidents(Ctx* ctx, const v1::ListIncidentsRequest* req,
                                                  v1::ListIncidentsResponse* out) {
  auth::Principal who;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListIncidents", req->run(), &who); !a.ok()) return a;
  if (!req->run().empty()) {
    if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
      return Invalid(std::string(s.message()));
    }
  }
  if (req->since_unix_ms() < 0) return Invalid("since_unix_ms: negative");
  storage::IncidentFilter filter;
  filter.run = req->run();
  filter.state = req->state();
  filter.verdict = req->verdict();
  filter.since_unix_ms = req->since_unix_ms();
  auto list = state_->catalog->ListIncidents(filter);
  if (!list.ok()) return ToGrpcStatus(list.status());
  list->erase(std::remove_if(list->begin(), list->end(),
                             [&](const v1::Incident& i) { return !who.MayUseRun(i.run()); }),
              list->end());
  auto offset = PageOffset(req->page_token(), list->size());
  if (!offset.ok()) return Invalid(std::string(offset.status().message()));
  out->set_next_page_token(FillPage(*list, *offset, state_->limits.max_response_bytes,
                                    [&](v1::Incident&& i) {
                                      *out->add_incidents() = std::move(i);
                                    }));
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::GetIncident(Ctx* ctx, const v1::GetIncidentRequest* req,
                                                v1::Incident* out) {
  if (grpc::Status a = AllowIncident(ctx, auth::Need::kRead, "GetIncident", req->id()); !a.ok()) return a;
  if (req->id() <= 0) return Invalid(absl::StrFormat("id: %d is not an incident id", req->id()));
  std::optional<v1::Incident> live;
  if (state_->supervisor != nullptr) live = state_->supervisor->LiveIncident(req->id());
  if (live) {
    *out = *live;
  } else {
    auto stored = state_->catalog->GetIncident(req->id());
    if (!stored.ok()) return ToGrpcStatus(stored.status());
    *out = *stored;
  }
  if (out->events_size() == 0) {
    auto events = state_->catalog->ListIncidentEvents(req->id());
    if (events.ok()) {
      for (const auto& e : *events) {
        auto* ev = out->add_events();
        ev->set_seq(e.seq);
        ev->set_unix_ms(e.unix_ms);
        ev->set_kind(e.kind);
      }
    }
  }
  // The culprit documents' first bytes, for the report's preview.
  if (auto run = state_->catalog->GetRun(out->run()); run.ok()) AttachDocumentPreviews(*run, out);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::WatchIncidents(Ctx* ctx, const v1::WatchIncidentsRequest* req,
                                                   grpc::ServerWriter<v1::IncidentUpdate>* writer) {
  auth::Principal who;
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "WatchIncidents", req->run(), &who); !a.ok()) {
    return a;
  }
  if (!req->run().empty()) {
    if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
      return Invalid(std::string(s.message()));
    }
    // As ListIncidents: an unknown run is NOT_FOUND, not a watch that never ends.
    if (auto r = state_->catalog->GetRun(req->run()); !r.ok()) return ToGrpcStatus(r.status());
  }
  if (state_->supervisor == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  auto watcher = state_->supervisor->Watch(req->run());
  while (!ctx->IsCancelled()) {
    std::vector<v1::IncidentUpdate> batch;
    {
      absl::MutexLock lock(&watcher->mu);
      if (watcher->updates.empty() && !watcher->closed) {
        watcher->cv.WaitWithTimeout(&watcher->mu, absl::Milliseconds(200));
      }
      if (watcher->closed) break;
      while (!watcher->updates.empty()) {
        batch.push_back(std::move(watcher->updates.front()));
        watcher->updates.pop_front();
      }
    }
    bool ok = true;
    for (const auto& u : batch) {
      // Watching every run: a principal scoped to some sees only theirs.
      if (!who.MayUseRun(u.incident().run())) continue;
      ok = ok && writer->Write(u);
    }
    if (!ok) break;
  }
  state_->supervisor->Unwatch(watcher);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::Approve(Ctx* ctx, const v1::ApproveRequest* req,
                                            v1::ActionResponse* out) {
  if (grpc::Status a = AllowIncident(ctx, auth::Need::kOperate, "Approve", req->incident_id()); !a.ok()) return a;
  if (req->incident_id() <= 0) return Invalid("incident_id: not an incident id");
  if (state_->supervisor == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  if (auto s = state_->supervisor->Approve(req->incident_id()); !s.ok()) return ToGrpcStatus(s);
  out->set_accepted(true);
  out->set_message(absl::StrCat("incident ", req->incident_id(), " approved"));
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::Abort(Ctx* ctx, const v1::AbortRequest* req, v1::ActionResponse* out) {
  if (grpc::Status a = AllowIncident(ctx, auth::Need::kOperate, "Abort", req->incident_id()); !a.ok()) return a;
  if (req->incident_id() <= 0) return Invalid("incident_id: not an incident id");
  if (auto s = ValidateText("reason", req->reason(), state_->limits.max_string_length); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (state_->supervisor == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  if (auto s = state_->supervisor->Abort(req->incident_id(), req->reason()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  out->set_accepted(true);
  out->set_message(absl::StrCat("incident ", req->incident_id(), " aborted"));
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::GetPolicy(Ctx* ctx, const v1::GetPolicyRequest* req, v1::Policy* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "GetPolicy", req->run()); !a.ok()) return a;
  if (!req->run().empty()) {
    if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
      return Invalid(std::string(s.message()));
    }
    if (auto r = state_->catalog->GetRun(req->run()); !r.ok()) return ToGrpcStatus(r.status());
  }
  *out = EffectivePolicy(state_->catalog, req->run());
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::SetPolicy(Ctx* ctx, const v1::SetPolicyRequest* req, v1::Policy* out) {
  if (grpc::Status a = Allow(ctx, req->run().empty() ? auth::Need::kAdmin : auth::Need::kOperate, "SetPolicy", req->run()); !a.ok()) return a;
  if (!req->run().empty()) {
    if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
      return Invalid(std::string(s.message()));
    }
    if (auto r = state_->catalog->GetRun(req->run()); !r.ok()) return ToGrpcStatus(r.status());
  }
  const v1::Policy merged = incident::MergePolicy(EffectivePolicy(state_->catalog, req->run()),
                                                  req->policy());
  if (auto s = incident::ValidatePolicy(merged); !s.ok()) return Invalid(std::string(s.message()));
  if (auto s = state_->catalog->PutPolicy(req->run(), req->policy()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  *out = EffectivePolicy(state_->catalog, req->run());
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::ResolveManifest(Ctx* ctx, const v1::ResolveManifestRequest* req,
                                                    v1::ResolveManifestResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ResolveManifest", req->run()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (req->from_step() < 0 || req->to_step() < req->from_step()) {
    return Invalid(absl::StrFormat("from_step/to_step: %d..%d is not a valid step range",
                                   req->from_step(), req->to_step()));
  }
  if (req->to_step() - req->from_step() >= 10'000) {
    return Invalid("to_step: at most 10000 steps per request");
  }
  if (state_->supervisor == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
  auto resolved = state_->supervisor->view()->Resolve(req->run(), req->generation(),
                                                      req->from_step(), req->to_step());
  if (!resolved.ok()) return ToGrpcStatus(resolved.status());
  for (auto& r : *resolved) *out->add_steps() = std::move(r);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::ListQuarantine(Ctx* ctx, const v1::ListQuarantineRequest* req,
                                                   v1::ListQuarantineResponse* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kRead, "ListQuarantine", req->run()); !a.ok()) return a;
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  auto list = state_->catalog->ListQuarantine(req->run());
  if (!list.ok()) return ToGrpcStatus(list.status());
  auto offset = PageOffset(req->page_token(), list->size());
  if (!offset.ok()) return Invalid(std::string(offset.status().message()));
  out->set_next_page_token(FillPage(*list, *offset, state_->limits.max_response_bytes,
                                    [&](v1::QuarantineEntry&& e) {
                                      *out->add_entries() = std::move(e);
                                    }));
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::AddQuarantine(Ctx* ctx, const v1::AddQuarantineRequest* req,
                                                  v1::QuarantineEntry* out) {
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "AddQuarantine", req->entry().run()); !a.ok()) return a;
  const auto& e = req->entry();
  if (auto s = ValidateRunName(e.run(), state_->limits); !s.ok()) {
    return Invalid(absl::StrCat("entry.", s.message()));
  }
  if (e.domain().empty()) return Invalid("entry.domain: empty");
  if (auto s = ValidateText("entry.domain", e.domain(), state_->limits.max_name_length); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (e.document_id() < 0) return Invalid("entry.document_id: negative");
  if (auto s = ValidateText("entry.reason", e.reason(), state_->limits.max_string_length); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  v1::QuarantineEntry entry = e;
  if (entry.created_unix_ms() == 0) entry.set_created_unix_ms(state_->clock->NowUnixMillis());
  auto stored = state_->catalog->AddQuarantine(entry);
  if (!stored.ok()) return ToGrpcStatus(stored.status());
  *out = *stored;
  return grpc::Status::OK;
}

}  // namespace spikeguard::daemon

namespace spikeguard::daemon {

grpc::Status SupervisorServiceImpl::ListAudit(Ctx* ctx, const v1::ListAuditRequest* req,
                                              v1::ListAuditResponse* out) {
  // Operators read the audit of their runs; the whole log (no run) needs a
  // principal of every run.
  if (grpc::Status a = Allow(ctx, auth::Need::kOperate, "ListAudit", req->run()); !a.ok()) return a;
  if (!req->run().empty()) {
    if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
      return Invalid(std::string(s.message()));
    }
  }
  if (auto s = ValidateText("principal", req->principal(), state_->limits.max_name_length);
      !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (req->since_unix_ms() < 0) return Invalid("since_unix_ms: negative");
  if (req->limit() < 0) return Invalid(absl::StrFormat("limit: %d is negative", req->limit()));
  constexpr int kPage = 500;
  storage::Catalog::AuditQuery query;
  query.run = req->run();
  query.principal = req->principal();
  query.since_unix_ms = req->since_unix_ms();
  if (!req->page_token().empty()) {
    if (!absl::SimpleAtoi(req->page_token(), &query.before_id) || query.before_id <= 0) {
      return Invalid("page_token: not a token this daemon gave out");
    }
  }
  const int wanted = req->limit() > 0 ? req->limit() : std::numeric_limits<int>::max();
  query.limit = std::min(wanted, kPage) + 1;
  auto entries = state_->catalog->QueryAudit(query);
  if (!entries.ok()) return ToGrpcStatus(entries.status());
  const size_t page = static_cast<size_t>(std::min(wanted, kPage));
  for (size_t i = 0; i < entries->size() && i < page; ++i) *out->add_entries() = (*entries)[i];
  if (entries->size() > page && req->limit() == 0) {
    out->set_next_page_token(absl::StrCat(out->entries(out->entries_size() - 1).id()));
  }
  return grpc::Status::OK;
}

}  // namespace spikeguard::daemon
