#include "storage/catalog/catalog.h"

#include <utility>

#include "base/status_macros.h"

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

// The Writer holds mu_ from BeginWrite to its destruction: a span the
// analysis cannot follow.
absl::StatusOr<std::unique_ptr<Catalog::Writer>> Catalog::BeginWrite()
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  mu_.Lock();
  absl::StatusOr<Transaction> txn = Transaction::Begin(db_.get());
  if (!txn.ok()) {
    mu_.Unlock();
    return txn.status();
  }
  std::unique_ptr<Writer> writer(new Writer(this));
  writer->txn_.emplace(std::move(*txn));
  return writer;
}

Catalog::Writer::~Writer() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (txn_.has_value()) txn_.reset();  // rolls back unless committed, under the lock
  catalog_->mu_.Unlock();
}

RunStore& Catalog::Writer::runs() ABSL_NO_THREAD_SAFETY_ANALYSIS { return catalog_->runs_; }

StepStore& Catalog::Writer::steps() ABSL_NO_THREAD_SAFETY_ANALYSIS { return catalog_->steps_; }

absl::Status Catalog::Writer::Commit() { return txn_->Commit(); }

absl::StatusOr<bool> Catalog::CheckpointIfDue() {
  absl::MutexLock lock(&mu_);
  return db_->CheckpointIfDue();
}

int64_t Catalog::wal_pages() {
  absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(runs_.Create(run).status());
  SG_RETURN_IF_ERROR(txn.Commit());
  config_version_.fetch_add(1, std::memory_order_acq_rel);
  return GetRunLocked(run.name());
}

absl::StatusOr<v1::Run> Catalog::GetRun(std::string_view name) {
  absl::MutexLock lock(&mu_);
  return GetRunLocked(name);
}

absl::StatusOr<v1::Run> Catalog::GetRunWithoutRanks(std::string_view name) {
  absl::MutexLock lock(&mu_);
  return GetRunLocked(name, /*with_ranks=*/false);
}

absl::StatusOr<Catalog::RunIncarnation> Catalog::GetRunIncarnation(std::string_view name) {
  absl::MutexLock lock(&mu_);
  return runs_.Incarnation(name);
}

absl::StatusOr<std::vector<v1::Run>> Catalog::ListRuns() {
  absl::MutexLock lock(&mu_);
  return runs_.List();
}

absl::Status Catalog::SetRunState(std::string_view name, v1::RunState state) {
  absl::MutexLock lock(&mu_);
  return runs_.SetState(name, state);
}

absl::Status Catalog::SetRunSpec(std::string_view name, const v1::RunSpec& spec) {
  absl::MutexLock lock(&mu_);
  SG_RETURN_IF_ERROR(runs_.SetSpec(name, spec));
  config_version_.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::Status Catalog::UpdateRunProgress(std::string_view name, int64_t last_step) {
  absl::MutexLock lock(&mu_);
  return runs_.SetLastStep(name, last_step);
}

absl::Status Catalog::SetRunDataOrder(std::string_view name, const v1::DataOrder& order,
                                      int64_t total_steps) {
  absl::MutexLock lock(&mu_);
  return runs_.SetDataOrder(name, order, total_steps);
}

absl::StatusOr<v1::Generation> Catalog::CreateGeneration(std::string_view run,
                                                         const v1::Generation& g) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(v1::Generation stored, runs_.CreateGeneration(run, g));
  SG_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::Generation>> Catalog::ListGenerations(std::string_view run) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  return runs_.Generations(key.id);
}

// --- Checkpoints and manifests --------------------------------------------------------

absl::StatusOr<v1::Checkpoint> Catalog::UpsertCheckpoint(
    const v1::Checkpoint& c, std::optional<std::string_view> file_identity) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(v1::Checkpoint stored, checkpoints_.Upsert(c, file_identity));
  SG_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::Checkpoint>> Catalog::ListCheckpoints(std::string_view run) {
  absl::MutexLock lock(&mu_);
  return checkpoints_.List(run);
}

absl::StatusOr<v1::Checkpoint> Catalog::PinCheckpoint(std::string_view run, int64_t step,
                                                      bool pinned) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(v1::Checkpoint first, checkpoints_.Pin(run, step, pinned));
  SG_RETURN_IF_ERROR(txn.Commit());
  return first;
}

absl::Status Catalog::SetRollingPin(std::string_view run, int64_t step, std::string_view uri) {
  absl::MutexLock lock(&mu_);
  return checkpoints_.SetRollingPin(run, step, uri);
}

absl::Status Catalog::SetCheckpointFileIdentity(std::string_view run, int64_t step,
                                               std::string_view uri,
                                               std::string_view file_identity) {
  absl::MutexLock lock(&mu_);
  return checkpoints_.SetFileIdentity(run, step, uri, file_identity);
}

absl::StatusOr<std::string> Catalog::CheckpointFileIdentity(std::string_view run, int64_t step,
                                                          std::string_view uri) {
  absl::MutexLock lock(&mu_);
  return checkpoints_.FileIdentity(run, step, uri);
}

absl::StatusOr<bool> Catalog::DeleteCheckpoint(std::string_view run, int64_t step,
                                               std::string_view uri) {
  absl::MutexLock lock(&mu_);
  return checkpoints_.Delete(run, step, uri);
}

absl::Status Catalog::PutManifest(std::string_view run, const v1::Manifest& m) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(manifests_.Put(run, m));
  return txn.Commit();
}

absl::StatusOr<v1::Manifest> Catalog::GetManifest(std::string_view run, int64_t version) {
  absl::MutexLock lock(&mu_);
  return manifests_.Get(run, version);
}

// --- Telemetry ---------------------------------------------------------------------------

absl::StatusOr<IngestResult> Catalog::IngestReports(std::string_view run, int64_t generation,
                                                    uint32_t rank,
                                                    std::span<const v1::StepReport> reports) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  if (generation != key.current_generation) {
    SG_RETURN_IF_ERROR(runs_.RequireGeneration(key.id, run, generation));
  }
  SG_ASSIGN_OR_RETURN(IngestResult result, steps_.Ingest(key.id, generation, rank, reports));
  SG_RETURN_IF_ERROR(txn.Commit());
  return result;
}

absl::StatusOr<int64_t> Catalog::CommittedStep(std::string_view run, int64_t generation,
                                               uint32_t rank) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  return steps_.CommittedStep(key.id, generation, rank);
}

absl::StatusOr<std::vector<v1::StepRecord>> Catalog::QueryTelemetry(
    std::string_view run, int64_t generation, int64_t from_step, std::optional<int64_t> to_step,
    int limit) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  SG_RETURN_IF_ERROR(runs_.RequireGeneration(key.id, run, generation));
  return steps_.Query(key.id, generation, from_step, to_step, limit);
}

absl::StatusOr<std::vector<v1::RankState>> Catalog::ListRankProgress(std::string_view run) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(RunStore::Key key, runs_.Lookup(run));
  return steps_.RankProgress(key.id);
}

// --- Incidents ---------------------------------------------------------------------------

absl::StatusOr<int64_t> Catalog::CreateIncident(std::string_view run, const v1::Incident& inc) {
  absl::MutexLock lock(&mu_);
  return incidents_.Create(run, inc);
}

absl::Status Catalog::UpdateIncident(const v1::Incident& inc) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(incidents_.Update(inc));
  return txn.Commit();
}

absl::StatusOr<v1::Incident> Catalog::GetIncident(int64_t id) {
  absl::MutexLock lock(&mu_);
  return incidents_.Get(id);
}

absl::StatusOr<std::vector<v1::Incident>> Catalog::ListIncidents(const IncidentFilter& filter) {
  absl::MutexLock lock(&mu_);
  return incidents_.List(filter);
}

absl::StatusOr<int64_t> Catalog::AppendIncidentEvent(int64_t incident_id, std::string_view kind,
                                                     std::string_view payload) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t seq, incidents_.AppendEvent(incident_id, kind, payload));
  SG_RETURN_IF_ERROR(txn.Commit());
  return seq;
}

absl::StatusOr<int64_t> Catalog::AppendIncidentEventAndUpdate(int64_t incident_id,
                                                              std::string_view kind,
                                                              std::string_view payload,
                                                              const IncidentUpdateFn& updated) {
  absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t id, incidents_.CreateWithEvent(run, inc, kind, payload, updated));
  SG_RETURN_IF_ERROR(txn.Commit());
  return id;
}

absl::StatusOr<std::vector<StoredEvent>> Catalog::ListIncidentEvents(int64_t incident_id) {
  absl::MutexLock lock(&mu_);
  return incidents_.Events(incident_id);
}

// --- Precursor warnings -------------------------------------------------------------------

absl::StatusOr<int64_t> Catalog::CreateWarning(const v1::PrecursorWarning& w) {
  absl::MutexLock lock(&mu_);
  return warnings_.Create(w);
}

absl::Status Catalog::UpdateWarning(const v1::PrecursorWarning& w) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(warnings_.Update(w));
  return txn.Commit();
}

absl::StatusOr<v1::PrecursorWarning> Catalog::GetWarning(int64_t id) {
  absl::MutexLock lock(&mu_);
  return warnings_.Get(id);
}

absl::StatusOr<std::vector<v1::PrecursorWarning>> Catalog::ListWarnings(
    const WarningFilter& filter) {
  absl::MutexLock lock(&mu_);
  return warnings_.List(filter);
}

// --- Commands, quarantine, audit ----------------------------------------------------------

absl::Status Catalog::PutCommand(std::string_view id, std::string_view run, int64_t generation,
                                 std::string_view kind, std::string_view payload,
                                 v1::CommandState state) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(commands_.Put(id, run, generation, kind, payload, state));
  return txn.Commit();
}

absl::Status Catalog::UpdateCommandState(std::string_view id, v1::CommandState state,
                                         std::string_view message) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(commands_.SetState(id, state, message));
  return txn.Commit();
}

absl::StatusOr<StoredCommand> Catalog::GetCommand(std::string_view id) {
  absl::MutexLock lock(&mu_);
  return commands_.Get(id);
}

absl::StatusOr<std::vector<StoredCommand>> Catalog::ListCommands(std::string_view run,
                                                                 v1::CommandState state) {
  absl::MutexLock lock(&mu_);
  return commands_.List(run, state);
}

absl::StatusOr<v1::QuarantineEntry> Catalog::AddQuarantine(const v1::QuarantineEntry& entry) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(v1::QuarantineEntry stored, quarantine_.Add(entry));
  SG_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::QuarantineEntry>> Catalog::ListQuarantine(std::string_view run) {
  absl::MutexLock lock(&mu_);
  return quarantine_.List(run);
}

absl::StatusOr<int64_t> Catalog::AppendAudit(std::string_view actor, std::string_view action,
                                             std::string_view target, std::string_view detail) {
  absl::MutexLock lock(&mu_);
  return audit_.Append(actor, action, target, detail);
}

absl::StatusOr<std::vector<AuditEntry>> Catalog::ListAudit(int limit) {
  absl::MutexLock lock(&mu_);
  return audit_.List(limit);
}

absl::StatusOr<int64_t> Catalog::AppendAudit(const v1::AuditEntry& entry) {
  absl::MutexLock lock(&mu_);
  return audit_.Append(entry);
}

absl::StatusOr<std::vector<v1::AuditEntry>> Catalog::QueryAudit(const AuditQuery& query) {
  absl::MutexLock lock(&mu_);
  return audit_.Query(query);
}

// --- Policies and launches ----------------------------------------------------------------

absl::Status Catalog::PutPolicy(std::string_view scope, const v1::Policy& policy) {
  absl::MutexLock lock(&mu_);
  SG_RETURN_IF_ERROR(policies_.Put(scope, policy));
  config_version_.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::StatusOr<v1::Policy> Catalog::GetPolicy(std::string_view scope) {
  absl::MutexLock lock(&mu_);
  return policies_.Get(scope);
}

absl::Status Catalog::PutLaunch(const LaunchRecord& record) {
  absl::MutexLock lock(&mu_);
  return launches_.Put(record);
}

absl::StatusOr<std::vector<LaunchRecord>> Catalog::ListLaunches() {
  absl::MutexLock lock(&mu_);
  return launches_.List();
}

absl::Status Catalog::DeleteLaunches(std::string_view run, std::string_view slot) {
  absl::MutexLock lock(&mu_);
  return launches_.Delete(run, slot);
}

absl::Status Catalog::EndRun(std::string_view run, v1::RunState state, std::string_view slot) {
  absl::MutexLock lock(&mu_);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(runs_.SetState(run, state));
  SG_RETURN_IF_ERROR(launches_.Delete(run, slot));
  return txn.Commit();
}

}  // namespace spikeguard::storage
