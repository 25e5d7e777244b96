#include "daemon/control/operator_handler.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "daemon/control/supervisor.h"
#include "daemon/http/document_preview.h"
#include "daemon/incident/checkpoint_choice.h"
#include "daemon/incident/plan_proto.h"
#include "daemon/incident/policy.h"
#include "daemon/ingest/limits.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "daemon/launch/launcher.h"
#include "storage/corpus/data_plan.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = spikeguard::v1;

constexpr int kDefaultTelemetryLimit = 10'000;
constexpr int kMaxTelemetryLimit = 100'000;
constexpr int kAuditPage = 500;
constexpr char kVersion[] = "spikeguard 0.1.0";

absl::Status Starting() { return absl::UnavailableError("starting"); }

// A validator's refusal as INVALID_ARGUMENT, whatever code it chose: the
// caller sent a value that is not acceptable.
absl::Status Invalid(const absl::Status& refused) {
  return absl::InvalidArgumentError(refused.message());
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

// Every list is paged under the byte budget limits.max_response_bytes; a
// page token is "o<offset>" into the list (opaque to clients).
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

// The page of `items` at `token`: items from its offset on while they fit
// in `budget` bytes (at least one).
template <class Item>
absl::StatusOr<Page<Item>> CutPage(std::vector<Item> items, const std::string& token,
                                   int64_t budget) {
  auto offset = PageOffset(token, items.size());
  if (!offset.ok()) return offset.status();
  Page<Item> page;
  int64_t used = 0;
  size_t i = *offset;
  for (; i < items.size(); ++i) {
    const int64_t bytes = static_cast<int64_t>(items[i].ByteSizeLong()) + 8;
    if (i > *offset && used + bytes > budget) break;
    used += bytes;
    page.items.push_back(std::move(items[i]));
  }
  if (i < items.size()) page.next_page_token = absl::StrCat("o", i);
  return page;
}

// The run an item of a list belongs to.
const std::string& RunOf(const v1::Run& run) { return run.name(); }
const std::string& RunOf(const v1::Incident& incident) { return incident.run(); }
const std::string& RunOf(const v1::PrecursorWarning& warning) { return warning.run(); }

// Keeps the items `who` may see (a principal scoped to some runs).
template <class Item>
void KeepVisible(const auth::Principal& who, std::vector<Item>* items) {
  items->erase(std::remove_if(items->begin(), items->end(),
                              [&](const Item& i) { return !who.MayUseRun(RunOf(i)); }),
               items->end());
}

// A run filter that may be empty ("every run").
absl::Status ValidateOptionalRunName(const std::string& run, const Limits& limits) {
  return run.empty() ? absl::OkStatus() : ValidateRunName(run, limits);
}

// Newest complete catalog checkpoint at or before `step` on the line of the
// run's current generation (checkpoint_choice.h; its own generation wins a
// tie); FAILED_PRECONDITION when there is none, or when that one does not
// verify (outside the run's checkpoint root, file gone or changed), naming
// why: an operator's rewind never silently goes further back.
absl::StatusOr<incident::CheckpointInfo> CheckpointAtOrBefore(storage::Catalog* catalog,
                                                            CheckpointGuard* guard,
                                                            const std::string& run, int64_t step) {
  auto list = catalog->ListCheckpoints(run);
  if (!list.ok()) return list.status();
  std::vector<incident::CheckpointInfo> all;
  for (const auto& c : *list) all.push_back(incident::ToCheckpointInfo(c));
  auto row = catalog->GetRunWithoutRanks(run);
  if (!row.ok()) return row.status();
  auto tree = catalog->ListGenerations(run);
  if (!tree.ok()) return tree.status();
  incident::CheckpointQuery query;
  query.max_step = step;
  // An operator may go back past a fix: the new line keeps the fix's hparams
  // from the checkpoint on (see ManualRewind).
  query.lineage = incident::Lineage::Of(*tree, row->current_generation()).IgnoringHParams();
  query.preferred_generation = row->current_generation();
  query.ties_to_highest_generation = true;
  auto best = incident::ChooseCheckpoint(all, query);
  if (!best.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "run '%s' has no complete checkpoint at or before step %d on the line of its current "
        "generation %d",
        run, step, row->current_generation()));
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

// `plan` with each window's data positions cut out.
absl::StatusOr<storage::DataPlan> CutWindows(const storage::DataPlan& plan,
                                             const std::vector<StepWindow>& skip) {
  storage::DataPlan edited = plan;
  for (const StepWindow& w : skip) {
    if (w.from_step < 0 || w.to_step < w.from_step) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "skip: window %d:%d is not a valid step range", w.from_step, w.to_step));
    }
    auto begin = plan.PositionForStep(w.from_step);
    auto end = plan.PositionForStep(w.to_step);
    if (!begin.ok() || !end.ok()) {
      return absl::InvalidArgumentError("skip: window is past the end of the data plan");
    }
    if (*end == std::numeric_limits<int64_t>::max()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "skip: window %d:%d reaches past the last data position", w.from_step, w.to_step));
    }
    auto holed = edited.WithHole(*begin, *end + 1);
    if (!holed.ok()) return holed.status();
    edited = *holed;
  }
  return edited;
}

std::string RequestId(const std::string& given, const std::string& kind, Clock* clock) {
  if (!given.empty()) return "manual/" + given;
  return absl::StrCat("manual/", kind, "/", clock->NowUnixMillis());
}

// The stored run with the ranks' state merged in: live where the daemon has
// it, committed progress otherwise.
void MergeRanks(const std::vector<v1::RankState>& live,
                const absl::StatusOr<std::vector<v1::RankState>>& progress, v1::Run* run) {
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
  run->clear_ranks();
  int64_t last_step = run->last_step();
  for (auto& [rank, r] : ranks) {
    last_step = std::max(last_step, r.last_step());
    *run->add_ranks() = r;
  }
  run->set_last_step(last_step);
}

// A Supervisor watcher as a subscription: updates of runs the subscriber
// may not see are dropped; the watcher is released with it.
class WatcherSubscription final : public IncidentSubscription {
 public:
  WatcherSubscription(Supervisor* supervisor, auth::Principal who, const std::string& run)
      : supervisor_(supervisor), who_(std::move(who)), watcher_(supervisor->Watch(run)) {}
  ~WatcherSubscription() override { supervisor_->Unwatch(watcher_); }

  std::optional<std::vector<v1::IncidentUpdate>> Next(absl::Duration wait) override {
    std::vector<v1::IncidentUpdate> batch;
    {
      absl::MutexLock lock(&watcher_->mu);
      if (watcher_->updates.empty() && !watcher_->closed) {
        watcher_->cv.WaitWithTimeout(&watcher_->mu, wait);
      }
      if (watcher_->closed) return std::nullopt;
      while (!watcher_->updates.empty()) {
        batch.push_back(std::move(watcher_->updates.front()));
        watcher_->updates.pop_front();
      }
    }
    batch.erase(std::remove_if(batch.begin(), batch.end(),
                               [&](const v1::IncidentUpdate& u) {
                                 return !who_.MayUseRun(u.has_warning() ? u.warning().run()
                                                                        : u.incident().run());
                               }),
                batch.end());
    return batch;
  }

 private:
  Supervisor* const supervisor_;
  const auth::Principal who_;
  const std::shared_ptr<Supervisor::Watcher> watcher_;
};

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
    if (LayerMetricNames().count(m) > 0 && RecordMetricNames().count(m) == 0) {
      layer_wanted.insert(m);
    }
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

absl::StatusOr<v1::Run> DaemonOperatorHandler::ExistingRun(const std::string& name) {
  if (auto s = ValidateRunName(name, deps_.limits); !s.ok()) return Invalid(s);
  return deps_.catalog->GetRun(name);
}

absl::StatusOr<v1::ServerStatus> DaemonOperatorHandler::GetStatus() {
  v1::ServerStatus out;
  out.set_version(kVersion);
  out.set_uptime_s(absl::ToInt64Seconds(deps_.clock->Now() - deps_.started));
  out.set_catalog_path(deps_.catalog_path);
  out.set_schema_version(deps_.catalog->schema_version());
  auto runs = deps_.catalog->ListRuns();
  if (!runs.ok()) return runs.status();
  out.set_runs(static_cast<int32_t>(runs->size()));
  out.set_connected_ranks(deps_.registry->ConnectedRanks());
  out.set_reports_accepted(deps_.counters->reports_accepted.load());
  out.set_reports_duplicate(deps_.counters->reports_duplicate.load());
  out.set_reports_rejected(deps_.counters->reports_rejected.load());
  out.set_reports_dropped(deps_.counters->reports_dropped.load());
  out.set_open_incidents(deps_.supervisor ? deps_.supervisor->OpenIncidents() : 0);
  if (auto active = deps_.catalog->ListWarnings({.run = "", .state = v1::WARNING_ACTIVE}); active.ok()) {
    out.set_active_warnings(static_cast<int32_t>(active->size()));
  }
  out.set_tls(deps_.tls);
  return out;
}

absl::StatusOr<v1::Run> DaemonOperatorHandler::CreateRun(const NewRun& r) {
  // The shared validator reads the wire shape; it is rebuilt here, never
  // taken from the caller.
  v1::CreateRunRequest as_request;
  as_request.set_name(r.name);
  as_request.set_world_size(r.world_size);
  as_request.set_mode(r.mode);
  *as_request.mutable_spec() = r.spec;
  as_request.set_launch(r.launch);
  if (auto s = ValidateCreateRunRequest(as_request, deps_.limits); !s.ok()) return Invalid(s);
  if (auto s = ValidateRunName(r.name, deps_.limits); !s.ok()) return Invalid(s);
  if (r.world_size == 0 || r.world_size > deps_.limits.max_world_size) {
    return absl::InvalidArgumentError(absl::StrFormat("world_size: %d is out of range [1, %d]",
                                                      r.world_size, deps_.limits.max_world_size));
  }
  // Nothing from the wire is executed: no command, env or workdir; a launch
  // profile of the daemon's and valid values for its parameters.
  if (deps_.profiles == nullptr) return Starting();
  if (auto s = deps_.profiles->ValidateSpec(r.spec, r.world_size, "spec"); !s.ok()) {
    return Invalid(s);
  }
  if (r.launch && r.spec.profile().empty()) {
    return absl::InvalidArgumentError(
        "spec.profile: launching a run needs a launch profile of the daemon's");
  }
  v1::Run run;
  run.set_name(r.name);
  run.set_world_size(r.world_size);
  run.set_mode(r.mode == v1::MODE_UNSPECIFIED ? v1::MODE_OBSERVE : r.mode);
  run.set_state(v1::RUN_CREATED);
  run.set_created_unix_ms(deps_.clock->NowUnixMillis());
  *run.mutable_spec() = r.spec;
  auto created = deps_.catalog->CreateRun(run);
  if (!created.ok()) return created.status();
  SG_LOG(INFO) << "run '" << r.name << "' created (world size " << r.world_size << ")";
  if (!r.launch) return created;
  // An external profile (no argv): the workers are started outside the
  // daemon (torchrun, a scheduler); the run is created and waits for them.
  if (auto profile = deps_.profiles->Find(r.spec.profile());
      profile.ok() && profile->argv().empty()) {
    SG_LOG(INFO) << "run '" << r.name << "': profile '" << r.spec.profile()
                 << "' is external; the daemon waits for workers started outside it";
    return created;
  }
  if (deps_.launcher == nullptr) return absl::UnavailableError("the launcher is not running");
  if (auto s = deps_.launcher->Launch(r.name); !s.ok()) return s;
  created->set_state(v1::RUN_RUNNING);
  return created;
}

absl::StatusOr<v1::Run> DaemonOperatorHandler::GetRun(const std::string& name) {
  auto run = ExistingRun(name);
  if (!run.ok()) return run.status();
  MergeRanks(deps_.registry->Ranks(name), deps_.catalog->ListRankProgress(name), &*run);
  return run;
}

absl::StatusOr<Page<v1::Run>> DaemonOperatorHandler::ListRuns(const auth::Principal& who,
                                                              const std::string& page_token) {
  auto runs = deps_.catalog->ListRuns();
  if (!runs.ok()) return runs.status();
  KeepVisible(who, &*runs);
  const int64_t budget = deps_.limits.max_response_bytes;
  for (auto& r : *runs) {
    // A spec stored before specs were bounded is left out of the list
    // (runs show has it) rather than make the list unreadable.
    if (static_cast<int64_t>(r.ByteSizeLong()) > budget / 2) r.clear_spec();
    // The last step as runs show has it (the stored row's lags behind the
    // ranks' progress); the ranks themselves stay out of the list.
    MergeRanks(deps_.registry->Ranks(r.name()), deps_.catalog->ListRankProgress(r.name()), &r);
    r.clear_ranks();
  }
  return CutPage(std::move(*runs), page_token, budget);
}

absl::StatusOr<v1::Run> DaemonOperatorHandler::SetRunProfile(
    const std::string& run, const std::string& profile,
    const std::map<std::string, std::string>& params) {
  if (auto s = ValidateRunName(run, deps_.limits); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("run: ", s.message()));
  }
  if (profile.empty()) {
    return absl::InvalidArgumentError("profile: empty; name a launch profile of the daemon's");
  }
  if (deps_.profiles == nullptr) return Starting();
  auto row = deps_.catalog->GetRun(run);
  if (!row.ok()) return row.status();
  v1::RunSpec spec = row->spec();
  const bool was_legacy = IsLegacySpec(spec);
  spec.clear_command();
  spec.clear_env();
  spec.clear_workdir();
  spec.set_profile(profile);
  spec.mutable_params()->clear();
  spec.mutable_params()->insert(params.begin(), params.end());
  if (auto s = deps_.profiles->ValidateSpec(spec, row->world_size(), ""); !s.ok()) {
    return Invalid(s);
  }
  if (auto s = deps_.catalog->SetRunSpec(run, spec); !s.ok()) return s;
  SG_LOG(INFO) << "run '" << run << "' mapped to launch profile " << Quoted(profile)
               << (was_legacy ? " (its free command line is dropped)" : "");
  return deps_.catalog->GetRun(run);
}

absl::StatusOr<Page<v1::Checkpoint>> DaemonOperatorHandler::ListCheckpoints(
    const std::string& run, const std::string& page_token) {
  if (auto row = ExistingRun(run); !row.ok()) return row.status();
  auto list = deps_.catalog->ListCheckpoints(run);
  if (!list.ok()) return list.status();
  auto row = deps_.catalog->GetRunWithoutRanks(run);
  if (!row.ok()) return row.status();
  auto tree = deps_.catalog->ListGenerations(run);
  if (!tree.ok()) return tree.status();
  const incident::Lineage line = incident::Lineage::Of(*tree, row->current_generation());
  for (v1::Checkpoint& c : *list) {
    const std::string why = c.complete() ? line.WhyNot(c.generation(), c.step())
                                         : std::string("incomplete");
    c.set_rewind_target(why.empty());
    c.set_rewind_note(why);
  }
  return CutPage(std::move(*list), page_token, deps_.limits.max_response_bytes);
}

absl::StatusOr<v1::Checkpoint> DaemonOperatorHandler::RegisterCheckpoint(const v1::Checkpoint& c) {
  if (auto s = ValidateRunName(c.run(), deps_.limits); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint.", s.message()));
  }
  v1::CheckpointSaved as_saved;
  as_saved.set_step(c.step());
  as_saved.set_data_position(c.data_position());
  as_saved.set_uri(c.uri());
  as_saved.set_bytes(c.bytes());
  as_saved.set_checksum(c.checksum());
  if (auto s = ValidateCheckpointSaved(as_saved, deps_.limits); !s.ok()) return Invalid(s);
  if (c.generation() < 0) return absl::InvalidArgumentError("checkpoint.generation: negative");
  // Confined to the run's checkpoint root, before anything is stored.
  if (deps_.checkpoints == nullptr) return Starting();
  auto admitted = deps_.checkpoints->Admit(c.run(), c.uri());
  if (!admitted.ok()) {
    if (!absl::IsInvalidArgument(admitted.status())) return admitted.status();
    return absl::InvalidArgumentError(absl::StrCat("checkpoint.", admitted.status().message()));
  }
  v1::Checkpoint ckpt = c;
  if (ckpt.created_unix_ms() == 0) ckpt.set_created_unix_ms(deps_.clock->NowUnixMillis());
  // With the identity of the file as registered (what a rewind checks).
  return deps_.catalog->UpsertCheckpoint(ckpt, admitted->file_identity);
}

absl::StatusOr<v1::Checkpoint> DaemonOperatorHandler::PinCheckpoint(const std::string& run,
                                                                    int64_t step, bool pinned) {
  if (auto s = ValidateRunName(run, deps_.limits); !s.ok()) return Invalid(s);
  if (step < 0) return absl::InvalidArgumentError("step: negative");
  return deps_.catalog->PinCheckpoint(run, step, pinned);
}

absl::StatusOr<TelemetryPage> DaemonOperatorHandler::QueryTelemetry(const TelemetryQuery& q) {
  if (auto s = ValidateRunName(q.run, deps_.limits); !s.ok()) return Invalid(s);
  if (q.from_step < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("from_step: %d is negative", q.from_step));
  }
  if (q.to_step && *q.to_step < q.from_step) {
    return absl::InvalidArgumentError(
        absl::StrFormat("to_step: %d is before from_step %d", *q.to_step, q.from_step));
  }
  if (q.generation && *q.generation < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("generation: %d is negative", *q.generation));
  }
  if (q.limit < 0) return absl::InvalidArgumentError("limit: negative");
  if (auto s = ValidateMetricNames(q.metrics); !s.ok()) return Invalid(s);
  auto run = deps_.catalog->GetRun(q.run);
  if (!run.ok()) return run.status();
  const int64_t generation = q.generation.value_or(run->current_generation());
  const int limit = std::min(q.limit == 0 ? kDefaultTelemetryLimit : q.limit, kMaxTelemetryLimit);
  // Paged by rows (limit) and by bytes (limits.max_response_bytes, well
  // under a client's 4 MB): a cut result is truncated, with the step to ask
  // again from. Read in chunks, so a wide record costs no more than a page.
  constexpr int kChunk = 64;
  const int64_t budget = deps_.limits.max_response_bytes;
  TelemetryPage out;
  int64_t used = 0;
  int64_t from = q.from_step;
  int taken = 0;
  while (true) {
    const int want = std::min(kChunk, limit - taken) + 1;  // one more: is there a next?
    auto records = deps_.catalog->QueryTelemetry(q.run, generation, from, q.to_step, want);
    if (!records.ok()) return records.status();
    for (const auto& r : *records) {
      v1::StepRecord filtered = FilterMetrics(r, q.metrics);
      const int64_t bytes = static_cast<int64_t>(filtered.ByteSizeLong()) + 8;
      if (taken == limit || (taken > 0 && used + bytes > budget)) {
        out.truncated = true;
        out.next_from_step = r.step();
        return out;
      }
      used += bytes;
      ++taken;
      out.records.push_back(std::move(filtered));
    }
    if (static_cast<int>(records->size()) < want) break;
    if (records->back().step() == std::numeric_limits<int64_t>::max()) break;  // no step after it
    from = records->back().step() + 1;
  }
  return out;
}

absl::StatusOr<ActionResult> DaemonOperatorHandler::ManualRewind(const RewindArgs& args,
                                                                 const std::string& kind,
                                                                 const std::string& reason) {
  const std::string& run = args.run;
  if (auto s = ValidateRunName(run, deps_.limits); !s.ok()) return Invalid(s);
  if (args.to_step < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("to_step: %d is negative", args.to_step));
  }
  if (args.stop_after_step != 0 && args.stop_after_step < args.to_step) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stop_after_step: %d is before the rewind step %d", args.stop_after_step, args.to_step));
  }
  Supervisor* sup = deps_.supervisor;
  if (sup == nullptr) return absl::UnavailableError("daemon is starting");
  auto run_row = deps_.catalog->GetRun(run);
  if (!run_row.ok()) return run_row.status();
  // Early, so a refused rewind costs nothing; decided below under the lock.
  if (sup->ProbeRunning(run)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "' is running an incident probe; wait for it or abort the incident first"));
  }
  auto ckpt = CheckpointAtOrBefore(deps_.catalog, deps_.checkpoints, run, args.to_step);
  if (!ckpt.ok()) return ckpt.status();
  auto plan = sup->view()->Plan(run, run_row->current_generation());
  if (!plan.ok()) return plan.status();
  auto storage_plan = incident::PlanFromProto(*plan);
  if (!storage_plan.ok()) return storage_plan.status();
  auto edited = CutWindows(*storage_plan, args.skip);
  if (!edited.ok()) return edited.status();
  incident::RewindSpec spec;
  spec.request_id = RequestId(args.request_id, kind, deps_.clock);
  spec.checkpoint = *ckpt;
  spec.plan = incident::PlanToProto(*edited);
  spec.stop_after_step = args.stop_after_step;
  spec.reason = reason;
  // A rewind keeps the hyperparameters in force (a fix applied earlier).
  if (auto hp = sup->view()->HParams(run, run_row->current_generation()); hp.ok()) {
    spec.hparams = *hp;
  }
  // Checked again with the rewind, under the engine's lock: a probe that
  // started since the check above makes this FAILED_PRECONDITION too.
  auto gen = sup->OperatorRewind(run, spec);
  if (!gen.ok()) return gen.status();
  ActionResult out;
  out.generation = *gen;
  out.command_id = spec.request_id;
  out.message = absl::StrFormat("run '%s' rewinds to the checkpoint at step %d in generation %d",
                                run, ckpt->step, *gen);
  return out;
}

absl::StatusOr<ActionResult> DaemonOperatorHandler::Rewind(const RewindArgs& args) {
  for (size_t i = 0; i < args.skip.size(); ++i) {
    const StepWindow& w = args.skip[i];
    if (auto s = ValidateStepWindow(absl::StrFormat("skip[%d].from_step", i), w.from_step,
                                    absl::StrFormat("skip[%d].to_step", i), w.to_step,
                                    deps_.limits);
        !s.ok()) {
      return Invalid(s);
    }
  }
  return ManualRewind(args, "rewind", absl::StrCat("manual rewind to step ", args.to_step));
}

absl::StatusOr<ActionResult> DaemonOperatorHandler::Replay(const std::string& run,
                                                           int64_t from_step,
                                                           int64_t stop_after_step,
                                                           const std::string& request_id) {
  if (from_step < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("from_step: %d is negative", from_step));
  }
  if (stop_after_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stop_after_step: %d is negative", stop_after_step));
  }
  RewindArgs args{run, from_step, {}, stop_after_step, request_id};
  return ManualRewind(args, "replay", absl::StrCat("manual replay from step ", from_step));
}

absl::StatusOr<ActionResult> DaemonOperatorHandler::Skip(const std::string& run,
                                                         StepWindow window,
                                                         const std::string& request_id) {
  if (auto s = ValidateStepWindow("from_step", window.from_step, "to_step", window.to_step,
                                  deps_.limits);
      !s.ok()) {
    return Invalid(s);
  }
  RewindArgs args{run, window.from_step, {window}, 0, request_id};
  return ManualRewind(
      args, "skip",
      absl::StrFormat("manual skip of steps %d..%d", window.from_step, window.to_step));
}

absl::Status DaemonOperatorHandler::CheckCommandable(const std::string& run) {
  if (auto s = ValidateRunName(run, deps_.limits); !s.ok()) return Invalid(s);
  if (deps_.supervisor == nullptr) return Starting();
  return deps_.catalog->GetRun(run).status();
}

absl::StatusOr<ActionResult> DaemonOperatorHandler::Pause(const std::string& run) {
  if (auto s = CheckCommandable(run); !s.ok()) return s;
  const std::string id = RequestId("", "pause", deps_.clock);
  if (auto s = deps_.supervisor->control()->Pause(run, id); !s.ok()) return s;
  return ActionResult{"pause sent", 0, id};
}

absl::StatusOr<ActionResult> DaemonOperatorHandler::Resume(const std::string& run) {
  if (auto s = CheckCommandable(run); !s.ok()) return s;
  const std::string id = RequestId("", "resume", deps_.clock);
  if (auto s = deps_.supervisor->control()->Continue(run, id, std::nullopt); !s.ok()) return s;
  return ActionResult{"continue sent", 0, id};
}

absl::StatusOr<Page<v1::Incident>> DaemonOperatorHandler::ListIncidents(
    const auth::Principal& who, const storage::IncidentFilter& filter,
    const std::string& page_token) {
  if (auto s = ValidateOptionalRunName(filter.run, deps_.limits); !s.ok()) return Invalid(s);
  if (filter.since_unix_ms < 0) return absl::InvalidArgumentError("since_unix_ms: negative");
  auto list = deps_.catalog->ListIncidents(filter);
  if (!list.ok()) return list.status();
  KeepVisible(who, &*list);
  return CutPage(std::move(*list), page_token, deps_.limits.max_response_bytes);
}

absl::StatusOr<Page<v1::PrecursorWarning>> DaemonOperatorHandler::ListWarnings(
    const auth::Principal& who, const storage::WarningFilter& filter,
    const std::string& page_token) {
  if (auto s = ValidateOptionalRunName(filter.run, deps_.limits); !s.ok()) return Invalid(s);
  if (!v1::WarningState_IsValid(filter.state)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: unknown warning state ", static_cast<int>(filter.state)));
  }
  auto list = deps_.catalog->ListWarnings(filter);
  if (!list.ok()) return list.status();
  if (deps_.supervisor != nullptr) {
    // The stored record of an active warning lags its live copy by a few steps.
    std::map<int64_t, v1::PrecursorWarning> live;
    for (v1::PrecursorWarning& w : deps_.supervisor->ActiveWarnings(filter.run)) {
      live[w.id()] = std::move(w);
    }
    for (v1::PrecursorWarning& w : *list) {
      if (auto it = live.find(w.id()); it != live.end() && w.state() == v1::WARNING_ACTIVE) {
        w = it->second;
      }
    }
  }
  KeepVisible(who, &*list);
  return CutPage(std::move(*list), page_token, deps_.limits.max_response_bytes);
}

absl::StatusOr<v1::Incident> DaemonOperatorHandler::GetIncident(int64_t id) {
  if (id <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("id: %d is not an incident id", id));
  }
  std::optional<v1::Incident> live;
  if (deps_.supervisor != nullptr) live = deps_.supervisor->LiveIncident(id);
  v1::Incident out;
  if (live) {
    out = *live;
  } else {
    auto stored = deps_.catalog->GetIncident(id);
    if (!stored.ok()) return stored.status();
    out = *stored;
  }
  if (out.events_size() == 0) {
    if (auto events = deps_.catalog->ListIncidentEvents(id); events.ok()) {
      for (const auto& e : *events) {
        auto* ev = out.add_events();
        ev->set_seq(e.seq);
        ev->set_unix_ms(e.unix_ms);
        ev->set_kind(e.kind);
      }
    }
  }
  // The culprit documents' first bytes, for the report's preview.
  // The corpus dir is confined again now: one replaced by a symlink leading
  // out of its root since the run was created is not read.
  if (auto run = deps_.catalog->GetRun(out.run());
      run.ok() && !run->spec().manifest().corpus_dir().empty()) {
    absl::StatusOr<std::string> dir = run->spec().manifest().corpus_dir();
    if (deps_.profiles != nullptr) dir = deps_.profiles->CorpusDir(out.run(), run->spec());
    if (dir.ok()) {
      AttachDocumentPreviews(*dir, &out);
    } else {
      SG_LOG(WARNING) << "incident " << id << ": no document previews: " << dir.status().message();
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<IncidentSubscription>> DaemonOperatorHandler::WatchIncidents(
    const auth::Principal& who, const std::string& run) {
  if (!run.empty()) {
    // As ListIncidents: an unknown run is NOT_FOUND, not a watch that never ends.
    if (auto r = ExistingRun(run); !r.ok()) return r.status();
  }
  if (deps_.supervisor == nullptr) return Starting();
  return std::make_unique<WatcherSubscription>(deps_.supervisor, who, run);
}

absl::StatusOr<ActionResult> DaemonOperatorHandler::Approve(int64_t incident_id) {
  if (incident_id <= 0) return absl::InvalidArgumentError("incident_id: not an incident id");
  if (deps_.supervisor == nullptr) return Starting();
  if (auto s = deps_.supervisor->Approve(incident_id); !s.ok()) return s;
  return ActionResult{absl::StrCat("incident ", incident_id, " approved"), 0, ""};
}

absl::StatusOr<ActionResult> DaemonOperatorHandler::Abort(int64_t incident_id,
                                                          const std::string& reason) {
  if (incident_id <= 0) return absl::InvalidArgumentError("incident_id: not an incident id");
  if (auto s = ValidateText("reason", reason, deps_.limits.max_string_length); !s.ok()) {
    return Invalid(s);
  }
  if (deps_.supervisor == nullptr) return Starting();
  if (auto s = deps_.supervisor->Abort(incident_id, reason); !s.ok()) return s;
  return ActionResult{absl::StrCat("incident ", incident_id, " aborted"), 0, ""};
}

absl::StatusOr<v1::Policy> DaemonOperatorHandler::GetPolicy(const std::string& run) {
  if (!run.empty()) {
    if (auto r = ExistingRun(run); !r.ok()) return r.status();
  }
  return EffectivePolicy(deps_.catalog, run);
}

absl::StatusOr<v1::Policy> DaemonOperatorHandler::SetPolicy(const std::string& run,
                                                            const v1::Policy& policy) {
  if (!run.empty()) {
    if (auto r = ExistingRun(run); !r.ok()) return r.status();
  }
  const v1::Policy merged = incident::MergePolicy(EffectivePolicy(deps_.catalog, run), policy);
  if (auto s = incident::ValidatePolicy(merged); !s.ok()) return Invalid(s);
  if (auto s = deps_.catalog->PutPolicy(run, policy); !s.ok()) return s;
  return EffectivePolicy(deps_.catalog, run);
}

absl::StatusOr<std::vector<v1::ResolvedStep>> DaemonOperatorHandler::ResolveManifest(
    const std::string& run, int64_t generation, int64_t from_step, int64_t to_step) {
  if (auto s = ValidateRunName(run, deps_.limits); !s.ok()) return Invalid(s);
  if (from_step < 0 || to_step < from_step) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "from_step/to_step: %d..%d is not a valid step range", from_step, to_step));
  }
  if (to_step - from_step >= 10'000) {
    return absl::InvalidArgumentError("to_step: at most 10000 steps per request");
  }
  if (deps_.supervisor == nullptr) return Starting();
  return deps_.supervisor->view()->Resolve(run, generation, from_step, to_step);
}

absl::StatusOr<Page<v1::QuarantineEntry>> DaemonOperatorHandler::ListQuarantine(
    const std::string& run, const std::string& page_token) {
  if (auto s = ValidateRunName(run, deps_.limits); !s.ok()) return Invalid(s);
  auto list = deps_.catalog->ListQuarantine(run);
  if (!list.ok()) return list.status();
  return CutPage(std::move(*list), page_token, deps_.limits.max_response_bytes);
}

absl::StatusOr<v1::QuarantineEntry> DaemonOperatorHandler::AddQuarantine(
    const v1::QuarantineEntry& e) {
  if (auto s = ValidateRunName(e.run(), deps_.limits); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("entry.", s.message()));
  }
  if (e.domain().empty()) return absl::InvalidArgumentError("entry.domain: empty");
  if (auto s = ValidateText("entry.domain", e.domain(), deps_.limits.max_name_length); !s.ok()) {
    return Invalid(s);
  }
  if (e.document_id() < 0) return absl::InvalidArgumentError("entry.document_id: negative");
  if (auto s = ValidateText("entry.reason", e.reason(), deps_.limits.max_string_length);
      !s.ok()) {
    return Invalid(s);
  }
  v1::QuarantineEntry entry = e;
  if (entry.created_unix_ms() == 0) entry.set_created_unix_ms(deps_.clock->NowUnixMillis());
  return deps_.catalog->AddQuarantine(entry);
}

absl::StatusOr<Page<v1::AuditEntry>> DaemonOperatorHandler::ListAudit(const AuditQuery& q) {
  if (auto s = ValidateOptionalRunName(q.run, deps_.limits); !s.ok()) return Invalid(s);
  if (auto s = ValidateText("principal", q.principal, deps_.limits.max_name_length); !s.ok()) {
    return Invalid(s);
  }
  if (q.since_unix_ms < 0) return absl::InvalidArgumentError("since_unix_ms: negative");
  if (q.limit < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("limit: %d is negative", q.limit));
  }
  storage::Catalog::AuditQuery query;
  query.run = q.run;
  query.principal = q.principal;
  query.since_unix_ms = q.since_unix_ms;
  // The token is the id of the last entry given out (entries are newest first).
  if (!q.page_token.empty()) {
    if (!absl::SimpleAtoi(q.page_token, &query.before_id) || query.before_id <= 0) {
      return absl::InvalidArgumentError("page_token: not a token this daemon gave out");
    }
  }
  const int wanted = q.limit > 0 ? q.limit : std::numeric_limits<int>::max();
  const int page_size = std::min(wanted, kAuditPage);
  query.limit = page_size + 1;  // one more: is there a next page?
  auto entries = deps_.catalog->QueryAudit(query);
  if (!entries.ok()) return entries.status();
  Page<v1::AuditEntry> page;
  const bool more = static_cast<int>(entries->size()) > page_size;
  if (more) entries->resize(page_size);
  page.items = std::move(*entries);
  // A caller's limit is all they want: no next page then.
  if (more && q.limit == 0) page.next_page_token = absl::StrCat(page.items.back().id());
  return page;
}

}  // namespace spikeguard::daemon
