#include "storage/catalog/catalog.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/catalog/merge.h"

namespace spikeguard::storage {

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(const CatalogOptions& options) {
  DatabaseOptions db_options;
  db_options.path = options.path;
  db_options.synchronous_full = options.synchronous_full;
  db_options.busy_timeout = options.busy_timeout;
  db_options.checkpoint_pages = options.checkpoint_pages;
  db_options.deferred_checkpoints = options.deferred_checkpoints;
  SG_ASSIGN_OR_RETURN(std::unique_ptr<Database> db, Database::Open(db_options));
  SG_RETURN_IF_ERROR(OpenSchema(*db));
  Clock* clock = options.clock != nullptr ? options.clock : Clock::Real();
  return std::unique_ptr<Catalog>(new Catalog(std::move(db), options.path, clock));
}

Catalog::Catalog(std::unique_ptr<Database> db, std::string path, Clock* clock)
    : path_(std::move(path)),
      clock_(clock),
      db_(std::move(db)),
      runs_(db_.get(), clock),
      steps_(db_.get(), clock),
      checkpoints_(db_.get(), clock),
      manifests_(db_.get()),
      incidents_(db_.get(), clock),
      warnings_(db_.get(), clock),
      commands_(db_.get(), clock),
      quarantine_(db_.get(), clock),
      audit_(db_.get(), clock),
      policies_(db_.get(), clock),
      launches_(db_.get(), clock) {}

// The lock's state after TryLock depends on its result: beyond the analysis.
Catalog::Held::Held(Catalog* catalog) ABSL_NO_THREAD_SAFETY_ANALYSIS : catalog_(catalog) {
  if (catalog_->mu_.TryLock()) return;
  catalog_->lock_waiters_.fetch_add(1, std::memory_order_acq_rel);
  {
    absl::MutexLock observer(&catalog_->observer_mu_);
    if (catalog_->contention_observer_) catalog_->contention_observer_();
  }
  catalog_->mu_.Lock();
  catalog_->lock_waiters_.fetch_sub(1, std::memory_order_acq_rel);
}

Catalog::Held::~Held() ABSL_NO_THREAD_SAFETY_ANALYSIS { catalog_->mu_.Unlock(); }

void Catalog::SetContentionObserver(std::function<void()> observer) {
  absl::MutexLock lock(&observer_mu_);
  contention_observer_ = std::move(observer);
}

absl::StatusOr<bool> Catalog::CheckpointIfDue() {
  Held lock(this);
  return db_->CheckpointIfDue();
}

int64_t Catalog::wal_pages() {
  Held lock(this);
  return db_->wal_pages();
}

// --- Runs and generations ----------------------------------------------------------

absl::StatusOr<v1::Run> Catalog::GetRunLocked(std::string_view name, bool with_ranks) {
  SG_ASSIGN_OR_RETURN(v1::Run run, runs_.Get(name));
  if (!with_ranks) return run;
  SG_ASSIGN_OR_RETURN(std::vector<v1::RankState> ranks, steps_.RankProgress(run.id()));
  for (auto& r : ranks) *run.add_ranks() = std::move(r);
  return run;
}

absl::StatusOr<v1::Run> Catalog::CreateRun(const v1::Run& run) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(runs_.Create(run).status());
  SG_RETURN_IF_ERROR(txn.Commit());
  config_version_.fetch_add(1, std::memory_order_acq_rel);
  return GetRunLocked(run.name());
}

absl::StatusOr<v1::Run> Catalog::GetRun(std::string_view name) {
  Held lock(this);
  return GetRunLocked(name);
}

absl::StatusOr<v1::Run> Catalog::GetRunWithoutRanks(std::string_view name) {
  Held lock(this);
  return GetRunLocked(name, /*with_ranks=*/false);
}

absl::StatusOr<Catalog::RunIncarnation> Catalog::GetRunIncarnation(std::string_view name) {
  Held lock(this);
  return runs_.Incarnation(name);
}

absl::StatusOr<std::vector<v1::Run>> Catalog::ListRuns() {
  Held lock(this);
  return runs_.List();
}

absl::Status Catalog::SetRunState(std::string_view name, std::string_view state) {
  Held lock(this);
  return runs_.SetState(name, state);
}

absl::Status Catalog::SetRunSpec(std::string_view name, const v1::RunSpec& spec) {
  Held lock(this);
  SG_RETURN_IF_ERROR(runs_.SetSpec(name, spec));
  config_version_.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::Status Catalog::UpdateRunProgress(std::string_view name, int64_t last_step) {
  Held lock(this);
  return runs_.SetLastStep(name, last_step);
}

absl::Status Catalog::SetRunDataOrder(std::string_view name, const v1::DataOrder& order,
                                      int64_t total_steps) {
  Held lock(this);
  return runs_.SetDataOrder(name, order, total_steps);
}

absl::StatusOr<v1::Generation> Catalog::CreateGeneration(std::string_view run,
                                                         const v1::Generation& g) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(v1::Generation stored, runs_.CreateGeneration(run, g));
  SG_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::Generation>> Catalog::ListGenerations(std::string_view run) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  return runs_.Generations(key.id);
}

// --- Checkpoints and manifests --------------------------------------------------------

absl::StatusOr<v1::Checkpoint> Catalog::UpsertCheckpoint(
    const v1::Checkpoint& c, std::optional<std::string_view> file_identity) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(v1::Checkpoint stored, checkpoints_.Upsert(c, file_identity));
  SG_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::Checkpoint>> Catalog::ListCheckpoints(std::string_view run) {
  Held lock(this);
  return checkpoints_.List(run);
}

absl::StatusOr<v1::Checkpoint> Catalog::PinCheckpoint(std::string_view run, int64_t step,
                                                      bool pinned) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(v1::Checkpoint first, checkpoints_.Pin(run, step, pinned));
  SG_RETURN_IF_ERROR(txn.Commit());
  return first;
}

absl::Status Catalog::SetRollingPin(std::string_view run, int64_t step, std::string_view uri) {
  Held lock(this);
  return checkpoints_.SetRollingPin(run, step, uri);
}

absl::Status Catalog::SetCheckpointFileIdentity(std::string_view run, int64_t step,
                                               std::string_view uri,
                                               std::string_view file_identity) {
  Held lock(this);
  return checkpoints_.SetFileIdentity(run, step, uri, file_identity);
}

absl::StatusOr<std::string> Catalog::CheckpointFileIdentity(std::string_view run, int64_t step,
                                                          std::string_view uri) {
  Held lock(this);
  return checkpoints_.FileIdentity(run, step, uri);
}

absl::StatusOr<bool> Catalog::DeleteCheckpoint(std::string_view run, int64_t step,
                                               std::string_view uri) {
  Held lock(this);
  return checkpoints_.Delete(run, step, uri);
}

absl::Status Catalog::PutManifest(std::string_view run, const v1::Manifest& m) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(manifests_.Put(run, m));
  return txn.Commit();
}

absl::StatusOr<v1::Manifest> Catalog::GetManifest(std::string_view run, int64_t version) {
  Held lock(this);
  return manifests_.Get(run, version);
}

// --- Telemetry ---------------------------------------------------------------------------

absl::StatusOr<IngestResult> Catalog::IngestReports(std::string_view run, int64_t generation,
                                                    uint32_t rank,
                                                    std::span<const v1::StepReport> reports) {
  IngestBatch batch;
  batch.run = std::string(run);
  batch.generation = generation;
  batch.rank = rank;
  batch.reports.assign(reports.begin(), reports.end());
  SG_ASSIGN_OR_RETURN(IngestGroupResult group, IngestGroup(std::span<const IngestBatch>(&batch, 1)));
  BatchOutcome& outcome = group.batches.front();
  if (!outcome.status.ok()) return outcome.status;
  return outcome.result;
}

void Catalog::ForgetOlderTimelinesLocked(int64_t run_id, int64_t generation) {
  for (auto it = open_steps_.lower_bound({run_id, INT64_MIN});
       it != open_steps_.end() && it->first.first == run_id && it->first.second < generation;) {
    it = open_steps_.erase(it);
  }
  for (auto it = committed_.lower_bound({run_id, INT64_MIN, 0});
       it != committed_.end() && std::get<0>(it->first) == run_id &&
       std::get<1>(it->first) < generation;) {
    it = committed_.erase(it);
  }
}

absl::StatusOr<IngestGroupResult> Catalog::IngestGroup(std::span<const IngestBatch> batches,
                                                       const CompletedSink& before_commit,
                                                       const AtCommit& at_commit) {
  Held lock(this);
  absl::StatusOr<IngestGroupResult> result = IngestGroupLocked(batches, before_commit, at_commit);
  if (!result.ok()) {
    // Rolled back: the in-memory merges may hold uncommitted reports.
    open_steps_.clear();
    committed_.clear();
  }
  return result;
}

absl::StatusOr<IngestGroupResult> Catalog::IngestGroupLocked(std::span<const IngestBatch> batches,
                                                             const CompletedSink& before_commit,
                                                             const AtCommit& at_commit) {
  IngestGroupResult out;
  out.batches.resize(batches.size());
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  struct RunInfo {
    absl::Status status;
    int64_t id = 0;
    int64_t current = -1;
    std::set<int64_t> generations_checked;
  };
  std::map<std::string, RunInfo, std::less<>> runs;
  // Records touched by this group, and the world size that completes each.
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<std::string, uint32_t>> touched;
  std::map<std::tuple<int64_t, int64_t, uint32_t>, int64_t> progress;
  for (size_t i = 0; i < batches.size(); ++i) {
    const IngestBatch& batch = batches[i];
    BatchOutcome& outcome = out.batches[i];
    auto [it, fresh] = runs.try_emplace(batch.run);
    RunInfo& info = it->second;
    if (fresh) {
      absl::StatusOr<RunStore::Key> key = runs_.Lookup(batch.run);
      if (key.ok()) {
        info.id = key->id;
        info.current = key->current_generation;
      } else if (absl::IsNotFound(key.status())) {
        info.status = key.status();
      } else {
        return key.status();
      }
    }
    outcome.run_generation = info.current;
    if (!info.status.ok()) {
      outcome.status = info.status;
      continue;
    }
    if (batch.require_current && batch.generation != info.current) {
      outcome.status = absl::FailedPreconditionError(
          absl::StrCat("stale generation: reports of generation ", batch.generation,
                       " refused; the run is at generation ", info.current));
      continue;
    }
    if (batch.generation != info.current &&
        !info.generations_checked.contains(batch.generation)) {
      if (absl::Status s = runs_.RequireGeneration(info.id, batch.run, batch.generation);
          !s.ok()) {
        if (!absl::IsNotFound(s)) return s;
        outcome.status = s;
        continue;
      }
      info.generations_checked.insert(batch.generation);
    }
    const auto rank_key = std::make_tuple(info.id, batch.generation, batch.rank);
    auto committed = committed_.find(rank_key);
    if (committed == committed_.end()) {
      SG_ASSIGN_OR_RETURN(int64_t step,
                          steps_.CommittedStep(info.id, batch.generation, batch.rank));
      committed = committed_.emplace(rank_key, step).first;
    }
    // Within a batch, take reports in step order so a reordered batch loses nothing.
    std::vector<const v1::StepReport*> ordered;
    ordered.reserve(batch.reports.size());
    for (const v1::StepReport& r : batch.reports) ordered.push_back(&r);
    std::stable_sort(ordered.begin(), ordered.end(),
                     [](const v1::StepReport* a, const v1::StepReport* b) {
                       return a->step() < b->step();
                     });
    IngestResult& r = outcome.result;
    r.committed_step = committed->second;
    auto& open = open_steps_[{info.id, batch.generation}];
    for (const v1::StepReport* report : ordered) {
      if (report->step() <= r.committed_step) {
        ++r.duplicates;
        continue;
      }
      auto record = open.find(report->step());
      if (record == open.end()) {
        SG_ASSIGN_OR_RETURN(std::optional<v1::StepRecord> stored,
                            steps_.Read(info.id, batch.generation, report->step()));
        record = open.emplace(report->step(), stored.value_or(v1::StepRecord())).first;
      }
      record->second.set_generation(batch.generation);
      MergeReport(&record->second, batch.rank, *report);
      auto& t = touched[{info.id, batch.generation, report->step()}];
      t.first = batch.run;
      t.second = std::max(t.second, batch.world_size);
      r.committed_step = report->step();
      ++r.accepted;
    }
    committed->second = r.committed_step;
    if (!batch.reports.empty()) progress[rank_key] = r.committed_step;
  }
  // Records the group completes: handed over before anything is written
  // when the caller takes them early (`before_commit`: detection runs
  // beside the writes and the commit's fsync), else after the commit.
  std::set<TimelineKey> timelines;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> complete;
  for (const auto& [key, who] : touched) {
    const auto& [run_id, generation, step] = key;
    timelines.insert({run_id, generation});
    const v1::StepRecord& record = open_steps_[{run_id, generation}][step];
    if (who.second > 0 && record.ranks_reported() >= static_cast<int64_t>(who.second)) {
      complete.push_back(key);
      out.completed.push_back(CompletedStep{who.first, who.second, {}});
    }
  }
  if (before_commit && !complete.empty()) {
    for (size_t i = 0; i < complete.size(); ++i) {
      const auto& [run_id, generation, step] = complete[i];
      out.completed[i].record = open_steps_[{run_id, generation}][step];
    }
    before_commit(std::move(out.completed));
    out.completed.clear();
  }
  // Each touched record and each rank's high-water mark is written once.
  for (const auto& [key, who] : touched) {
    const auto& [run_id, generation, step] = key;
    SG_RETURN_IF_ERROR(steps_.Write(run_id, generation, open_steps_[{run_id, generation}][step]));
  }
  for (const auto& [key, step] : progress) {
    SG_RETURN_IF_ERROR(
        steps_.SetCommittedStep(std::get<0>(key), std::get<1>(key), std::get<2>(key), step));
  }
  if (at_commit) {
    OpenGroup open_group(this);
    at_commit(open_group);
  }
  SG_RETURN_IF_ERROR(txn.Commit());
  // Durable: complete records leave the cache (handed back now unless they
  // were handed over early); it keeps at most kMaxOpenStepsPerGeneration
  // steps per timeline.
  for (size_t i = 0; i < complete.size(); ++i) {
    const auto& [run_id, generation, step] = complete[i];
    auto& open = open_steps_[{run_id, generation}];
    auto it = open.find(step);
    if (!before_commit) out.completed[i].record = std::move(it->second);
    open.erase(it);
  }
  for (const TimelineKey& key : timelines) {
    auto& open = open_steps_[key];
    while (open.size() > kMaxOpenStepsPerGeneration) open.erase(open.begin());
  }
  // Older generations of a run stop receiving reports once it moved on.
  for (const auto& [name, info] : runs) {
    if (info.status.ok()) ForgetOlderTimelinesLocked(info.id, info.current);
  }
  return out;
}

absl::StatusOr<int64_t> Catalog::CommittedStep(std::string_view run, int64_t generation,
                                               uint32_t rank) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  return steps_.CommittedStep(key.id, generation, rank);
}

absl::StatusOr<std::vector<v1::StepRecord>> Catalog::QueryTelemetry(
    std::string_view run, int64_t generation, int64_t from_step, std::optional<int64_t> to_step,
    int limit) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  SG_RETURN_IF_ERROR(runs_.RequireGeneration(key.id, run, generation));
  return steps_.Query(key.id, generation, from_step, to_step, limit);
}

absl::StatusOr<std::vector<v1::RankState>> Catalog::ListRankProgress(std::string_view run) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  return steps_.RankProgress(key.id);
}

// --- Incidents ---------------------------------------------------------------------------

absl::StatusOr<int64_t> Catalog::CreateIncident(std::string_view run, const v1::Incident& inc) {
  Held lock(this);
  return incidents_.Create(run, inc);
}

absl::Status Catalog::UpdateIncident(const v1::Incident& inc) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(incidents_.Update(inc));
  return txn.Commit();
}

absl::StatusOr<v1::Incident> Catalog::GetIncident(int64_t id) {
  Held lock(this);
  return incidents_.Get(id);
}

absl::StatusOr<std::vector<v1::Incident>> Catalog::ListIncidents(const IncidentFilter& filter) {
  Held lock(this);
  return incidents_.List(filter);
}

absl::StatusOr<int64_t> Catalog::AppendIncidentEvent(int64_t incident_id, std::string_view kind,
                                                     std::string_view payload) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t seq, incidents_.AppendEvent(incident_id, kind, payload));
  SG_RETURN_IF_ERROR(txn.Commit());
  return seq;
}

absl::StatusOr<int64_t> Catalog::AppendIncidentEventAndUpdate(int64_t incident_id,
                                                              std::string_view kind,
                                                              std::string_view payload,
                                                              const IncidentUpdateFn& updated) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t seq, incidents_.Record(incident_id, kind, payload, updated));
  SG_RETURN_IF_ERROR(txn.Commit());
  return seq;
}

absl::StatusOr<int64_t> Catalog::CreateIncidentWithEvent(std::string_view run,
                                                         const v1::Incident& inc,
                                                         std::string_view kind,
                                                         std::string_view payload,
                                                         const NewIncidentFn& updated) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t id, incidents_.CreateWithEvent(run, inc, kind, payload, updated));
  SG_RETURN_IF_ERROR(txn.Commit());
  return id;
}

absl::StatusOr<std::vector<StoredEvent>> Catalog::ListIncidentEvents(int64_t incident_id) {
  Held lock(this);
  return incidents_.Events(incident_id);
}

absl::StatusOr<int64_t> Catalog::InSavepointLocked(
    const std::function<absl::StatusOr<int64_t>()>& write) {
  SG_RETURN_IF_ERROR(db_->Execute("SAVEPOINT joined"));
  absl::StatusOr<int64_t> result = write();
  if (!result.ok()) {
    // Undo this write only; the group's own writes stay.
    (void)db_->Execute("ROLLBACK TO joined");
  }
  if (absl::Status s = db_->Execute("RELEASE joined"); !s.ok() && result.ok()) return s;
  return result;
}

absl::StatusOr<int64_t> Catalog::OpenGroup::CreateIncidentWithEvent(
    std::string_view run, const v1::Incident& inc, std::string_view kind, std::string_view payload,
    const std::function<const v1::Incident&(int64_t id, int64_t seq)>& updated) {
  Catalog* c = catalog_;
  c->mu_.AssertHeld();
  return c->InSavepointLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return c->incidents_.CreateWithEvent(run, inc, kind, payload, updated);
  });
}

absl::StatusOr<int64_t> Catalog::OpenGroup::AppendIncidentEventAndUpdate(
    int64_t incident_id, std::string_view kind, std::string_view payload,
    const std::function<const v1::Incident&(int64_t seq)>& updated) {
  Catalog* c = catalog_;
  c->mu_.AssertHeld();
  return c->InSavepointLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return c->incidents_.Record(incident_id, kind, payload, updated);
  });
}

// --- Precursor warnings -------------------------------------------------------------------

absl::StatusOr<int64_t> Catalog::CreateWarning(const v1::PrecursorWarning& w) {
  Held lock(this);
  return warnings_.Create(w);
}

absl::Status Catalog::UpdateWarning(const v1::PrecursorWarning& w) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(warnings_.Update(w));
  return txn.Commit();
}

absl::StatusOr<v1::PrecursorWarning> Catalog::GetWarning(int64_t id) {
  Held lock(this);
  return warnings_.Get(id);
}

absl::StatusOr<std::vector<v1::PrecursorWarning>> Catalog::ListWarnings(
    const WarningFilter& filter) {
  Held lock(this);
  return warnings_.List(filter);
}

// --- Commands, quarantine, audit ----------------------------------------------------------

absl::Status Catalog::PutCommand(std::string_view id, std::string_view run, int64_t generation,
                                 std::string_view kind, std::string_view payload,
                                 std::string_view state) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(commands_.Put(id, run, generation, kind, payload, state));
  return txn.Commit();
}

absl::Status Catalog::UpdateCommandState(std::string_view id, std::string_view state,
                                         std::string_view message) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(commands_.SetState(id, state, message));
  return txn.Commit();
}

absl::StatusOr<StoredCommand> Catalog::GetCommand(std::string_view id) {
  Held lock(this);
  return commands_.Get(id);
}

absl::StatusOr<std::vector<StoredCommand>> Catalog::ListCommands(std::string_view run,
                                                                 std::string_view state) {
  Held lock(this);
  return commands_.List(run, state);
}

absl::StatusOr<v1::QuarantineEntry> Catalog::AddQuarantine(const v1::QuarantineEntry& entry) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(v1::QuarantineEntry stored, quarantine_.Add(entry));
  SG_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::QuarantineEntry>> Catalog::ListQuarantine(std::string_view run) {
  Held lock(this);
  return quarantine_.List(run);
}

absl::StatusOr<int64_t> Catalog::AppendAudit(std::string_view actor, std::string_view action,
                                             std::string_view target, std::string_view detail) {
  Held lock(this);
  return audit_.Append(actor, action, target, detail);
}

absl::StatusOr<std::vector<AuditEntry>> Catalog::ListAudit(int limit) {
  Held lock(this);
  return audit_.List(limit);
}

absl::StatusOr<int64_t> Catalog::AppendAudit(const v1::AuditEntry& entry) {
  Held lock(this);
  return audit_.Append(entry);
}

absl::StatusOr<std::vector<v1::AuditEntry>> Catalog::QueryAudit(const AuditQuery& query) {
  Held lock(this);
  return audit_.Query(query);
}

// --- Policies and launches ----------------------------------------------------------------

absl::Status Catalog::PutPolicy(std::string_view scope, const v1::Policy& policy) {
  Held lock(this);
  SG_RETURN_IF_ERROR(policies_.Put(scope, policy));
  config_version_.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::StatusOr<v1::Policy> Catalog::GetPolicy(std::string_view scope) {
  Held lock(this);
  return policies_.Get(scope);
}

absl::Status Catalog::PutLaunch(const LaunchRecord& record) {
  Held lock(this);
  return launches_.Put(record);
}

absl::StatusOr<std::vector<LaunchRecord>> Catalog::ListLaunches() {
  Held lock(this);
  return launches_.List();
}

absl::Status Catalog::DeleteLaunches(std::string_view run, std::string_view slot) {
  Held lock(this);
  return launches_.Delete(run, slot);
}

absl::Status Catalog::EndRun(std::string_view run, std::string_view state, std::string_view slot) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(runs_.SetState(run, state));
  SG_RETURN_IF_ERROR(launches_.Delete(run, slot));
  return txn.Commit();
}

}  // namespace spikeguard::storage
