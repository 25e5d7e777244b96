#include "daemon/server/supervisor_service.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "daemon/server/status_util.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = spikeguard::v1;

constexpr int kDefaultTelemetryLimit = 10'000;
constexpr int kMaxTelemetryLimit = 100'000;
constexpr char kVersion[] = "spikeguard 0.1.0";

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

grpc::Status Later(const std::string& rpc, const std::string& what) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      absl::StrCat(rpc, " is not implemented yet: ", what,
                                   " arrive with the incident engine"));
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

grpc::Status SupervisorServiceImpl::GetStatus(Ctx*, const v1::GetStatusRequest*,
                                              v1::ServerStatus* out) {
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
  out->set_open_incidents(0);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::CreateRun(Ctx*, const v1::CreateRunRequest* req, v1::Run* out) {
  if (auto s = ValidateRunName(req->name(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (req->world_size() == 0 || req->world_size() > state_->limits.max_world_size) {
    return Invalid(absl::StrFormat("world_size: %d is out of range [1, %d]", req->world_size(),
                                   state_->limits.max_world_size));
  }
  if (req->launch()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "launch: starting ranks from a run spec arrives with the local launcher; "
                        "create the run without --spec and start the workers yourself");
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
  (void)state_->catalog->AppendAudit("operator", "create_run", req->name(),
                                     absl::StrCat("world_size=", req->world_size()));
  SG_LOG(INFO) << "run '" << req->name() << "' created (world size " << req->world_size() << ")";
  *out = *created;
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::GetRun(Ctx*, const v1::GetRunRequest* req, v1::Run* out) {
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

grpc::Status SupervisorServiceImpl::ListRuns(Ctx*, const v1::ListRunsRequest*,
                                             v1::ListRunsResponse* out) {
  auto runs = state_->catalog->ListRuns();
  if (!runs.ok()) return ToGrpcStatus(runs.status());
  for (auto& r : *runs) *out->add_runs() = std::move(r);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::ListCheckpoints(Ctx*, const v1::ListCheckpointsRequest* req,
                                                    v1::ListCheckpointsResponse* out) {
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  auto run = state_->catalog->GetRun(req->run());
  if (!run.ok()) return ToGrpcStatus(run.status());
  auto list = state_->catalog->ListCheckpoints(req->run());
  if (!list.ok()) return ToGrpcStatus(list.status());
  for (auto& c : *list) *out->add_checkpoints() = std::move(c);
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::RegisterCheckpoint(Ctx*,
                                                       const v1::RegisterCheckpointRequest* req,
                                                       v1::Checkpoint* out) {
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
  v1::Checkpoint ckpt = c;
  if (ckpt.created_unix_ms() == 0) ckpt.set_created_unix_ms(state_->clock->NowUnixMillis());
  auto stored = state_->catalog->UpsertCheckpoint(ckpt);
  if (!stored.ok()) return ToGrpcStatus(stored.status());
  *out = *stored;
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::PinCheckpoint(Ctx*, const v1::PinCheckpointRequest* req,
                                                  v1::Checkpoint* out) {
  if (auto s = ValidateRunName(req->run(), state_->limits); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  if (req->step() < 0) return Invalid("step: negative");
  auto pinned = state_->catalog->PinCheckpoint(req->run(), req->step(), req->pinned());
  if (!pinned.ok()) return ToGrpcStatus(pinned.status());
  *out = *pinned;
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::QueryTelemetry(Ctx*, const v1::QueryTelemetryRequest* req,
                                                   v1::QueryTelemetryResponse* out) {
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
  auto records = state_->catalog->QueryTelemetry(req->run(), generation, req->from_step(), to,
                                                 limit + 1);
  if (!records.ok()) return ToGrpcStatus(records.status());
  if (static_cast<int>(records->size()) > limit) {
    records->resize(limit);
    out->set_truncated(true);
  }
  for (const auto& r : *records) *out->add_records() = FilterMetrics(r, req->metrics());
  return grpc::Status::OK;
}

grpc::Status SupervisorServiceImpl::ListIncidents(Ctx*, const v1::ListIncidentsRequest*,
                                                  v1::ListIncidentsResponse*) {
  return Later("ListIncidents", "incidents");
}
grpc::Status SupervisorServiceImpl::GetIncident(Ctx*, const v1::GetIncidentRequest*, v1::Incident*) {
  return Later("GetIncident", "incidents");
}
grpc::Status SupervisorServiceImpl::WatchIncidents(Ctx*, const v1::WatchIncidentsRequest*,
                                                   grpc::ServerWriter<v1::IncidentUpdate>*) {
  return Later("WatchIncidents", "incidents");
}
grpc::Status SupervisorServiceImpl::Rewind(Ctx*, const v1::RewindRequest*, v1::ActionResponse*) {
  return Later("Rewind", "rewinds");
}
grpc::Status SupervisorServiceImpl::Replay(Ctx*, const v1::ReplayRequest*, v1::ActionResponse*) {
  return Later("Replay", "replays");
}
grpc::Status SupervisorServiceImpl::Skip(Ctx*, const v1::SkipRequest*, v1::ActionResponse*) {
  return Later("Skip", "skip windows");
}
grpc::Status SupervisorServiceImpl::Pause(Ctx*, const v1::PauseRequest*, v1::ActionResponse*) {
  return Later("Pause", "worker commands");
}
grpc::Status SupervisorServiceImpl::Resume(Ctx*, const v1::ResumeRequest*, v1::ActionResponse*) {
  return Later("Resume", "worker commands");
}
grpc::Status SupervisorServiceImpl::Approve(Ctx*, const v1::ApproveRequest*, v1::ActionResponse*) {
  return Later("Approve", "approvals");
}
grpc::Status SupervisorServiceImpl::Abort(Ctx*, const v1::AbortRequest*, v1::ActionResponse*) {
  return Later("Abort", "incident actions");
}
grpc::Status SupervisorServiceImpl::GetPolicy(Ctx*, const v1::GetPolicyRequest*, v1::Policy*) {
  return Later("GetPolicy", "policies");
}
grpc::Status SupervisorServiceImpl::SetPolicy(Ctx*, const v1::SetPolicyRequest*, v1::Policy*) {
  return Later("SetPolicy", "policies");
}
grpc::Status SupervisorServiceImpl::ResolveManifest(Ctx*, const v1::ResolveManifestRequest*,
                                                    v1::ResolveManifestResponse*) {
  return Later("ResolveManifest", "manifest resolution and documents");
}
grpc::Status SupervisorServiceImpl::ListQuarantine(Ctx*, const v1::ListQuarantineRequest*,
                                                   v1::ListQuarantineResponse*) {
  return Later("ListQuarantine", "quarantines");
}
grpc::Status SupervisorServiceImpl::AddQuarantine(Ctx*, const v1::AddQuarantineRequest*,
                                                  v1::QuarantineEntry*) {
  return Later("AddQuarantine", "quarantines");
}

}  // namespace spikeguard::daemon
