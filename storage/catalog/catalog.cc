#include "storage/catalog/catalog.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <tuple>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "storage/catalog/merge.h"

namespace spikeguard::storage {
namespace {

// Debian's Abseil is built with its own string_view type, which does not
// convert from std::string_view.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// --- Runs and generations ----------------------------------------------------
constexpr char kSelectRunIdSql[] = "SELECT id FROM runs WHERE name = ?";
constexpr char kInsertRunSql[] =
    "INSERT INTO runs (name, created_unix_ms, mode, world_size, current_generation, state, "
    "last_step, spec, incarnation) VALUES (?, ?, ?, ?, 0, ?, ?, ?, lower(hex(randomblob(16))))";
constexpr char kSelectRunIncarnationSql[] = "SELECT incarnation, state FROM runs WHERE name = ?";
constexpr char kSelectRunSql[] =
    "SELECT id, name, created_unix_ms, mode, world_size, current_generation, state, last_step, "
    "spec, data_order, total_steps FROM runs WHERE name = ?";
constexpr char kListRunsSql[] =
    "SELECT id, name, created_unix_ms, mode, world_size, current_generation, state, last_step, "
    "spec, data_order, total_steps FROM runs ORDER BY id";
constexpr char kUpdateRunDataOrderSql[] =
    "UPDATE runs SET data_order = ?, total_steps = ? WHERE name = ?";
constexpr char kUpdateRunStateSql[] = "UPDATE runs SET state = ? WHERE name = ?";
constexpr char kUpdateRunSpecSql[] = "UPDATE runs SET spec = ? WHERE name = ?";
constexpr char kUpdateRunProgressSql[] = "UPDATE runs SET last_step = ? WHERE name = ?";
constexpr char kSetCurrentGenerationSql[] =
    "UPDATE runs SET current_generation = ? WHERE id = ?";
constexpr char kInsertGenerationSql[] =
    "INSERT INTO generations (run_id, generation, parent, from_checkpoint_step, reason, "
    "created_unix_ms, record) VALUES (?, ?, ?, ?, ?, ?, ?)";
constexpr char kSelectGenerationsSql[] =
    "SELECT record FROM generations WHERE run_id = ? ORDER BY generation";
constexpr char kMaxGenerationSql[] =
    "SELECT COALESCE(MAX(generation), -1) FROM generations WHERE run_id = ?";
constexpr char kGenerationExistsSql[] =
    "SELECT 1 FROM generations WHERE run_id = ? AND generation = ?";

// --- Checkpoints and manifests -------------------------------------------------
constexpr char kUpsertCheckpointSql[] = R"sql(
INSERT INTO checkpoints (run_id, step, uri, generation, data_position, bytes, checksum,
                         complete, pinned, has_rng_state, has_data_loader_state, created_unix_ms,
                         file_identity)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?13, ''))
ON CONFLICT (run_id, step, uri) DO UPDATE SET
  file_identity = CASE WHEN ?13 IS NOT NULL THEN ?13
                       WHEN excluded.checksum <> '' AND excluded.checksum <> checksum THEN ''
                       ELSE file_identity END,
  generation = CASE WHEN excluded.checksum <> '' AND excluded.checksum <> checksum
                    THEN excluded.generation ELSE generation END,
  data_position = excluded.data_position,
  bytes = CASE WHEN excluded.bytes > 0 THEN excluded.bytes ELSE bytes END,
  checksum = CASE WHEN excluded.checksum <> '' THEN excluded.checksum ELSE checksum END,
  complete = MAX(complete, excluded.complete),
  has_rng_state = MAX(has_rng_state, excluded.has_rng_state),
  has_data_loader_state = MAX(has_data_loader_state, excluded.has_data_loader_state)
)sql";
constexpr char kSelectCheckpointsSql[] =
    "SELECT step, uri, generation, data_position, bytes, checksum, complete, pinned, "
    "has_rng_state, has_data_loader_state, created_unix_ms, rolling FROM checkpoints "
    "WHERE run_id = ?1 AND (?2 IS NULL OR step = ?2) ORDER BY step, uri";
constexpr char kPinCheckpointSql[] =
    "UPDATE checkpoints SET pinned = ? WHERE run_id = ? AND step = ?";
constexpr char kSetRollingPinSql[] =
    "UPDATE checkpoints SET rolling = (step = ?2 AND uri = ?3) WHERE run_id = ?1 AND "
    "rolling <> (step = ?2 AND uri = ?3)";
constexpr char kSetCheckpointFileIdentitySql[] =
    "UPDATE checkpoints SET file_identity = ? WHERE run_id = ? AND step = ? AND uri = ?";
constexpr char kSelectCheckpointFileIdentitySql[] =
    "SELECT file_identity FROM checkpoints WHERE run_id = ? AND step = ? AND uri = ?";
constexpr char kDeleteCheckpointSql[] =
    "DELETE FROM checkpoints WHERE run_id = ? AND step = ? AND uri = ?";
constexpr char kInsertManifestSql[] =
    "INSERT INTO manifests (run_id, version, dataset_fingerprint, seed, global_batch_size, "
    "sequence_length, record) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (run_id, version) DO NOTHING";
constexpr char kSelectManifestSql[] =
    "SELECT record FROM manifests WHERE run_id = ? AND version = ?";

// --- Telemetry -------------------------------------------------------------------
constexpr char kSelectRunIdGenerationSql[] =
    "SELECT id, current_generation FROM runs WHERE name = ?";
constexpr char kSelectCommittedStepSql[] =
    "SELECT committed_step FROM rank_progress WHERE run_id = ? AND generation = ? AND rank = ?";
constexpr char kUpsertRankProgressSql[] =
    "INSERT INTO rank_progress (run_id, generation, rank, committed_step, last_seen_unix_ms) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, generation, rank) DO UPDATE SET "
    "committed_step = MAX(committed_step, excluded.committed_step), "
    "last_seen_unix_ms = excluded.last_seen_unix_ms";
constexpr char kSelectStepRecordSql[] =
    "SELECT record FROM step_telemetry WHERE run_id = ? AND generation = ? AND step = ?";
constexpr char kUpsertStepRecordSql[] =
    "INSERT INTO step_telemetry (run_id, generation, step, ranks_reported, loss, grad_norm, "
    "record) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, generation, step) DO UPDATE SET "
    "ranks_reported = excluded.ranks_reported, loss = excluded.loss, "
    "grad_norm = excluded.grad_norm, record = excluded.record";
constexpr char kQueryTelemetrySql[] =
    "SELECT record FROM step_telemetry WHERE run_id = ? AND generation = ? AND step >= ? "
    "AND step <= ? ORDER BY step LIMIT ?";
// Per rank, the row of the newest generation that rank reported in.
constexpr char kListRankProgressSql[] =
    // Each rank's newest generation first (one pass over the run's rows),
    // then a primary-key lookup per rank: O(ranks log ranks). A correlated
    // subquery here was a scan of the run's rows per rank (10,000 ranks:
    // 10^8 row visits under the catalog's lock).
    "SELECT p.rank, p.generation, p.committed_step, p.last_seen_unix_ms "
    "FROM (SELECT rank, MAX(generation) AS generation FROM rank_progress WHERE run_id = ?1 "
    "GROUP BY rank) AS m JOIN rank_progress AS p ON p.run_id = ?1 AND "
    "p.generation = m.generation AND p.rank = m.rank ORDER BY p.rank";

// --- Incidents ---------------------------------------------------------------------
constexpr char kInsertIncidentSql[] =
    "INSERT INTO incidents (run_id, state, verdict, trigger_kind, generation, onset_step, "
    "opened_unix_ms, closed_unix_ms, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
constexpr char kUpdateIncidentSql[] =
    "UPDATE incidents SET state = ?, verdict = ?, trigger_kind = ?, generation = ?, "
    "onset_step = ?, opened_unix_ms = ?, closed_unix_ms = ?, record = ? WHERE id = ?";
constexpr char kSelectIncidentSql[] =
    "SELECT i.id, r.name, i.record FROM incidents AS i JOIN runs AS r ON r.id = i.run_id "
    "WHERE i.id = ?";
constexpr char kListIncidentsSql[] =
    "SELECT i.id, r.name, i.record FROM incidents AS i JOIN runs AS r ON r.id = i.run_id "
    "WHERE (?1 = '' OR r.name = ?1) AND (?2 = 0 OR i.state = ?2) "
    "AND (?3 = 0 OR i.verdict = ?3) AND i.opened_unix_ms >= ?4 ORDER BY i.id";
constexpr char kIncidentExistsSql[] = "SELECT 1 FROM incidents WHERE id = ?";
constexpr char kInsertEventSql[] =
    "INSERT INTO incident_events (incident_id, unix_ms, kind, payload) VALUES (?, ?, ?, ?)";
constexpr char kListEventsSql[] =
    "SELECT seq, unix_ms, kind, payload FROM incident_events WHERE incident_id = ? "
    "ORDER BY seq";

// --- Commands, quarantine, audit -----------------------------------------------------
constexpr char kInsertCommandSql[] =
    "INSERT INTO commands (id, run_id, generation, kind, payload, state, message, "
    "created_unix_ms, updated_unix_ms) VALUES (?, ?, ?, ?, ?, ?, '', ?, ?)";
constexpr char kSelectCommandSql[] =
    "SELECT c.id, r.name, c.generation, c.kind, c.payload, c.state, c.message, "
    "c.created_unix_ms, c.updated_unix_ms FROM commands AS c JOIN runs AS r ON r.id = c.run_id "
    "WHERE c.id = ?";
constexpr char kListCommandsSql[] =
    "SELECT c.id, r.name, c.generation, c.kind, c.payload, c.state, c.message, "
    "c.created_unix_ms, c.updated_unix_ms FROM commands AS c JOIN runs AS r ON r.id = c.run_id "
    "WHERE c.run_id = ?1 AND (?2 = '' OR c.state = ?2) ORDER BY c.rowid";
constexpr char kUpdateCommandStateSql[] =
    "UPDATE commands SET state = ?, message = ?, updated_unix_ms = ? WHERE id = ?";
constexpr char kInsertQuarantineSql[] =
    "INSERT INTO quarantine (run_id, domain, document_id, reason, incident_id, created_unix_ms) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, domain, document_id) DO NOTHING";
constexpr char kSelectQuarantineSql[] =
    "SELECT domain, document_id, reason, incident_id, created_unix_ms FROM quarantine "
    "WHERE run_id = ?1 AND (?2 IS NULL OR (domain = ?2 AND document_id = ?3)) "
    "ORDER BY domain, document_id";
constexpr char kInsertAuditSql[] =
    "INSERT INTO audit (unix_ms, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)";
constexpr char kInsertAuditV4Sql[] =
    "INSERT INTO audit (unix_ms, actor, action, target, detail, role, outcome, peer) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
constexpr char kQueryAuditSql[] =
    "SELECT seq, unix_ms, actor, action, target, detail, role, outcome, peer FROM audit "
    "WHERE (?1 = '' OR target = ?1) AND (?2 = '' OR actor = ?2) AND unix_ms >= ?3 AND seq < ?4 "
    "ORDER BY seq DESC LIMIT ?5";
constexpr char kListAuditSql[] =
    "SELECT seq, unix_ms, actor, action, target, detail FROM audit ORDER BY seq DESC LIMIT ?";

constexpr std::string_view kRunStates[] = {"created", "running",  "paused",
                                           "stopped", "finished", "failed"};
constexpr std::string_view kCommandStates[] = {"pending", "sent", "acked", "failed"};

template <size_t N>
bool OneOf(std::string_view value, const std::string_view (&set)[N]) {
  return std::find(std::begin(set), std::end(set), value) != std::end(set);
}

// Map fields (Manifest.blend) serialize in hash order unless asked not to;
// byte-comparable records need the deterministic form.
std::string Serialize(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

template <typename Message>
absl::StatusOr<Message> Parse(const std::string& blob, std::string_view what) {
  Message message;
  if (!message.ParseFromString(blob)) {
    return absl::DataLossError(absl::StrCat("corrupt ", Sv(what), " record in catalog"));
  }
  return message;
}

absl::StatusOr<v1::Run> ReadRunRow(const Statement& row) {
  v1::Run run;
  run.set_id(row.ColumnInt64(0));
  run.set_name(row.ColumnText(1));
  run.set_created_unix_ms(row.ColumnInt64(2));
  run.set_mode(static_cast<v1::Mode>(row.ColumnInt64(3)));
  run.set_world_size(static_cast<uint32_t>(row.ColumnInt64(4)));
  run.set_current_generation(row.ColumnInt64(5));
  run.set_state(row.ColumnText(6));
  run.set_last_step(row.ColumnInt64(7));
  SG_ASSIGN_OR_RETURN(*run.mutable_spec(),
                      Parse<v1::RunSpec>(row.ColumnBlob(8), absl::StrCat("run spec of ", run.name())));
  if (const std::string order = row.ColumnBlob(9); !order.empty()) {
    SG_ASSIGN_OR_RETURN(*run.mutable_data_order(),
                        Parse<v1::DataOrder>(order, absl::StrCat("data order of ", run.name())));
  }
  run.set_total_steps(row.ColumnInt64(10));
  return run;
}

StoredCommand ReadCommandRow(const Statement& row) {
  StoredCommand c;
  c.id = row.ColumnText(0);
  c.run = row.ColumnText(1);
  c.generation = row.ColumnInt64(2);
  c.kind = row.ColumnText(3);
  c.payload = row.ColumnBlob(4);
  c.state = row.ColumnText(5);
  c.message = row.ColumnText(6);
  c.created_unix_ms = row.ColumnInt64(7);
  c.updated_unix_ms = row.ColumnInt64(8);
  return c;
}

absl::StatusOr<v1::Incident> ReadIncidentRow(const Statement& row) {
  const int64_t id = row.ColumnInt64(0);
  SG_ASSIGN_OR_RETURN(v1::Incident incident,
                      Parse<v1::Incident>(row.ColumnBlob(2), absl::StrCat("incident ", id)));
  // The columns are the identity; the record may predate them.
  incident.set_id(id);
  incident.set_run(row.ColumnText(1));
  return incident;
}

std::string RunNotFound(std::string_view run) {
  return absl::StrCat("run '", Sv(run), "' not found");
}

}  // namespace

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

// --- Private helpers -----------------------------------------------------------------

absl::StatusOr<int64_t> Catalog::RunIdLocked(std::string_view name) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectRunIdSql));
  select.BindText(1, name);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(RunNotFound(name));
  return select.ColumnInt64(0);
}

absl::Status Catalog::RequireGenerationLocked(int64_t run_id, std::string_view run,
                                              int64_t generation) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kGenerationExistsSql));
  select.BindInt64(1, run_id).BindInt64(2, generation);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) {
    return absl::NotFoundError(
        absl::StrCat("generation ", generation, " of run '", Sv(run), "' not found"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Generation>> Catalog::ListGenerationsLocked(int64_t run_id) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectGenerationsSql));
  select.BindInt64(1, run_id);
  std::vector<v1::Generation> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    SG_ASSIGN_OR_RETURN(out.emplace_back(),
                        Parse<v1::Generation>(select.ColumnBlob(0), "generation"));
  }
  return out;
}

absl::StatusOr<std::vector<v1::RankState>> Catalog::ListRankProgressLocked(int64_t run_id) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListRankProgressSql));
  select.BindInt64(1, run_id);
  std::vector<v1::RankState> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    v1::RankState& state = out.emplace_back();
    state.set_rank(static_cast<uint32_t>(select.ColumnInt64(0)));
    state.set_generation(select.ColumnInt64(1));
    state.set_last_step(select.ColumnInt64(2));
    state.set_last_seen_unix_ms(select.ColumnInt64(3));
  }
  return out;
}

absl::StatusOr<v1::Run> Catalog::GetRunLocked(std::string_view name, bool with_ranks) {
  v1::Run run;
  {
    SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectRunSql));
    select.BindText(1, name);
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) return absl::NotFoundError(RunNotFound(name));
    SG_ASSIGN_OR_RETURN(run, ReadRunRow(select));
  }
  SG_ASSIGN_OR_RETURN(std::vector<v1::Generation> generations, ListGenerationsLocked(run.id()));
  for (auto& g : generations) *run.add_generations() = std::move(g);
  if (!with_ranks) return run;
  SG_ASSIGN_OR_RETURN(std::vector<v1::RankState> ranks, ListRankProgressLocked(run.id()));
  for (auto& r : ranks) *run.add_ranks() = std::move(r);
  return run;
}

absl::StatusOr<v1::Generation> Catalog::InsertGenerationLocked(int64_t run_id,
                                                               std::string_view run,
                                                               v1::Generation g) {
  if (g.created_unix_ms() == 0) g.set_created_unix_ms(clock_->NowUnixMillis());
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertGenerationSql));
  insert.BindInt64(1, run_id)
      .BindInt64(2, g.generation())
      .BindInt64(3, g.parent())
      .BindInt64(4, g.from_checkpoint_step())
      .BindText(5, g.reason())
      .BindInt64(6, g.created_unix_ms())
      .BindBlob(7, Serialize(g));
  if (absl::Status s = insert.Run(); !s.ok()) {
    if (absl::IsAlreadyExists(s)) {
      return absl::AlreadyExistsError(
          absl::StrCat("generation ", g.generation(), " of run '", Sv(run), "' already exists"));
    }
    return s;
  }
  return g;
}

absl::StatusOr<std::vector<v1::Checkpoint>> Catalog::SelectCheckpointsLocked(
    int64_t run_id, std::string_view run, std::optional<int64_t> step) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectCheckpointsSql));
  select.BindInt64(1, run_id);
  if (step.has_value()) {
    select.BindInt64(2, *step);
  } else {
    select.BindNull(2);
  }
  std::vector<v1::Checkpoint> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    v1::Checkpoint& c = out.emplace_back();
    c.set_run(std::string(run));
    c.set_step(select.ColumnInt64(0));
    c.set_uri(select.ColumnText(1));
    c.set_generation(select.ColumnInt64(2));
    c.set_data_position(select.ColumnInt64(3));
    c.set_bytes(select.ColumnInt64(4));
    c.set_checksum(select.ColumnText(5));
    c.set_complete(select.ColumnBool(6));
    c.set_pinned(select.ColumnBool(7));
    c.set_has_rng_state(select.ColumnBool(8));
    c.set_has_data_loader_state(select.ColumnBool(9));
    c.set_created_unix_ms(select.ColumnInt64(10));
    c.set_rolling_pin(select.ColumnBool(11));
  }
  return out;
}

absl::StatusOr<v1::Incident> Catalog::GetIncidentLocked(int64_t id) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectIncidentSql));
  select.BindInt64(1, id);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("incident ", id, " not found"));
  return ReadIncidentRow(select);
}

absl::StatusOr<StoredCommand> Catalog::GetCommandLocked(std::string_view id) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectCommandSql));
  select.BindText(1, id);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("command '", Sv(id), "' not found"));
  return ReadCommandRow(select);
}

absl::StatusOr<int64_t> Catalog::CommittedStepLocked(int64_t run_id, int64_t generation,
                                                     uint32_t rank) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectCommittedStepSql));
  select.BindInt64(1, run_id).BindInt64(2, generation).BindInt64(3, rank);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  return row ? select.ColumnInt64(0) : int64_t{-1};
}

// --- Runs ------------------------------------------------------------------------------

absl::StatusOr<Catalog::RunIncarnation> Catalog::GetRunIncarnation(std::string_view name) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectRunIncarnationSql));
  select.BindText(1, name);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("run '", Sv(name), "' not found"));
  RunIncarnation out;
  out.incarnation = select.ColumnText(0);
  out.state = select.ColumnText(1);
  return out;
}

absl::StatusOr<v1::Run> Catalog::CreateRun(const v1::Run& run) {
  if (run.name().empty()) return absl::InvalidArgumentError("run.name is empty");
  const std::string state = run.state().empty() ? "created" : run.state();
  if (!OneOf(state, kRunStates)) {
    return absl::InvalidArgumentError(absl::StrCat("run.state: unknown state '", Sv(state), "'"));
  }
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  if (absl::StatusOr<int64_t> existing = RunIdLocked(run.name()); existing.ok()) {
    return absl::AlreadyExistsError(absl::StrCat("run '", run.name(), "' already exists"));
  } else if (!absl::IsNotFound(existing.status())) {
    return existing.status();
  }
  const int64_t now = clock_->NowUnixMillis();
  {
    SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertRunSql));
    insert.BindText(1, run.name())
        .BindInt64(2, run.created_unix_ms() != 0 ? run.created_unix_ms() : now)
        .BindInt64(3, run.mode())
        .BindInt64(4, run.world_size())
        .BindText(5, state)
        .BindInt64(6, run.last_step())
        .BindBlob(7, Serialize(run.spec()));
    SG_RETURN_IF_ERROR(insert.Run());
  }
  const int64_t run_id = db_->LastInsertRowId();
  v1::Generation initial;
  initial.set_generation(0);
  initial.set_parent(-1);
  initial.set_reason("initial");
  initial.set_created_unix_ms(now);
  SG_RETURN_IF_ERROR(InsertGenerationLocked(run_id, run.name(), initial).status());
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

absl::StatusOr<std::vector<v1::Run>> Catalog::ListRuns() {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListRunsSql));
  std::vector<v1::Run> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    SG_ASSIGN_OR_RETURN(out.emplace_back(), ReadRunRow(select));
  }
  return out;
}

absl::Status Catalog::SetRunState(std::string_view name, std::string_view state) {
  Held lock(this);
  return SetRunStateLocked(name, state);
}

absl::Status Catalog::SetRunStateLocked(std::string_view name, std::string_view state) {
  if (!OneOf(state, kRunStates)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown run state '", Sv(state), "'"));
  }
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateRunStateSql));
  update.BindText(1, state).BindText(2, name);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(RunNotFound(name));
  return absl::OkStatus();
}

absl::Status Catalog::SetRunSpec(std::string_view name, const v1::RunSpec& spec) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateRunSpecSql));
  const std::string blob = Serialize(spec);
  update.BindBlob(1, blob).BindText(2, name);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(RunNotFound(name));
  config_version_.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::Status Catalog::UpdateRunProgress(std::string_view name, int64_t last_step) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateRunProgressSql));
  update.BindInt64(1, last_step).BindText(2, name);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(RunNotFound(name));
  return absl::OkStatus();
}

absl::Status Catalog::SetRunDataOrder(std::string_view name, const v1::DataOrder& order,
                                      int64_t total_steps) {
  if (total_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("total_steps: ", total_steps, " is negative"));
  }
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateRunDataOrderSql));
  update.BindBlob(1, Serialize(order)).BindInt64(2, total_steps).BindText(3, name);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(RunNotFound(name));
  return absl::OkStatus();
}

// --- Generations ---------------------------------------------------------------------

absl::StatusOr<v1::Generation> Catalog::CreateGeneration(std::string_view run,
                                                         const v1::Generation& g) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  v1::Generation stored = g;
  if (stored.generation() <= 0) {
    SG_ASSIGN_OR_RETURN(Statement max, db_->Prepare(kMaxGenerationSql));
    max.BindInt64(1, run_id);
    SG_ASSIGN_OR_RETURN(bool row, max.Step());
    stored.set_generation(row ? max.ColumnInt64(0) + 1 : 1);
  }
  if (absl::Status s = RequireGenerationLocked(run_id, run, stored.parent()); !s.ok()) {
    return absl::NotFoundError(
        absl::StrCat("parent generation ", stored.parent(), " of run '", Sv(run), "' not found"));
  }
  SG_ASSIGN_OR_RETURN(stored, InsertGenerationLocked(run_id, run, std::move(stored)));
  {
    SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kSetCurrentGenerationSql));
    update.BindInt64(1, stored.generation()).BindInt64(2, run_id);
    SG_RETURN_IF_ERROR(update.Run());
  }
  SG_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::Generation>> Catalog::ListGenerations(std::string_view run) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  return ListGenerationsLocked(run_id);
}

// --- Checkpoints -----------------------------------------------------------------------

absl::StatusOr<v1::Checkpoint> Catalog::UpsertCheckpoint(
    const v1::Checkpoint& c, std::optional<std::string_view> file_identity) {
  if (c.uri().empty()) return absl::InvalidArgumentError("checkpoint.uri is empty");
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(c.run()));
  {
    SG_ASSIGN_OR_RETURN(Statement upsert, db_->Prepare(kUpsertCheckpointSql));
    upsert.BindInt64(1, run_id)
        .BindInt64(2, c.step())
        .BindText(3, c.uri())
        .BindInt64(4, c.generation())
        .BindInt64(5, c.data_position())
        .BindInt64(6, c.bytes())
        .BindText(7, c.checksum())
        .BindBool(8, c.complete())
        .BindBool(9, c.pinned())
        .BindBool(10, c.has_rng_state())
        .BindBool(11, c.has_data_loader_state())
        .BindInt64(12, c.created_unix_ms() != 0 ? c.created_unix_ms() : clock_->NowUnixMillis());
    if (file_identity) {
      upsert.BindText(13, *file_identity);
    } else {
      upsert.BindNull(13);
    }
    SG_RETURN_IF_ERROR(upsert.Run());
  }
  SG_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> at_step,
                      SelectCheckpointsLocked(run_id, c.run(), c.step()));
  SG_RETURN_IF_ERROR(txn.Commit());
  for (v1::Checkpoint& stored : at_step) {
    if (stored.uri() == c.uri()) return std::move(stored);
  }
  return absl::InternalError("checkpoint vanished after upsert");
}

absl::StatusOr<std::vector<v1::Checkpoint>> Catalog::ListCheckpoints(std::string_view run) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  return SelectCheckpointsLocked(run_id, run, std::nullopt);
}

absl::StatusOr<v1::Checkpoint> Catalog::PinCheckpoint(std::string_view run, int64_t step,
                                                      bool pinned) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  {
    SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kPinCheckpointSql));
    update.BindBool(1, pinned).BindInt64(2, run_id).BindInt64(3, step);
    SG_RETURN_IF_ERROR(update.Run());
  }
  if (db_->Changes() == 0) {
    return absl::NotFoundError(absl::StrCat("run '", Sv(run), "' has no checkpoint at step ", step));
  }
  SG_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> at_step,
                      SelectCheckpointsLocked(run_id, run, step));
  SG_RETURN_IF_ERROR(txn.Commit());
  return std::move(at_step.front());
}

absl::Status Catalog::SetRollingPin(std::string_view run, int64_t step, std::string_view uri) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kSetRollingPinSql));
  update.BindInt64(1, run_id).BindInt64(2, step).BindText(3, uri);
  return update.Run();
}

absl::Status Catalog::SetCheckpointFileIdentity(std::string_view run, int64_t step,
                                               std::string_view uri,
                                               std::string_view file_identity) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kSetCheckpointFileIdentitySql));
  update.BindText(1, file_identity).BindInt64(2, run_id).BindInt64(3, step).BindText(4, uri);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) {
    return absl::NotFoundError(absl::StrCat("run '", Sv(run), "' has no checkpoint at step ", step,
                                            " named '", Sv(uri), "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Catalog::CheckpointFileIdentity(std::string_view run, int64_t step,
                                                          std::string_view uri) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectCheckpointFileIdentitySql));
  select.BindInt64(1, run_id).BindInt64(2, step).BindText(3, uri);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) {
    return absl::NotFoundError(absl::StrCat("run '", Sv(run), "' has no checkpoint at step ", step,
                                            " named '", Sv(uri), "'"));
  }
  return select.ColumnText(0);
}

absl::StatusOr<bool> Catalog::DeleteCheckpoint(std::string_view run, int64_t step,
                                               std::string_view uri) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  SG_ASSIGN_OR_RETURN(Statement del, db_->Prepare(kDeleteCheckpointSql));
  del.BindInt64(1, run_id).BindInt64(2, step).BindText(3, uri);
  SG_RETURN_IF_ERROR(del.Run());
  return db_->Changes() > 0;
}

// --- Manifests ---------------------------------------------------------------------------

absl::Status Catalog::PutManifest(std::string_view run, const v1::Manifest& m) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  const std::string record = Serialize(m);
  {
    SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertManifestSql));
    insert.BindInt64(1, run_id)
        .BindInt64(2, m.version())
        .BindText(3, m.dataset_fingerprint())
        .BindInt64(4, static_cast<int64_t>(m.seed()))  // bit pattern of the uint64
        .BindInt64(5, m.global_batch_size())
        .BindInt64(6, m.sequence_length())
        .BindBlob(7, record);
    SG_RETURN_IF_ERROR(insert.Run());
  }
  if (db_->Changes() == 0) {
    // Data order must never change under a version: only an identical resend is fine.
    SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectManifestSql));
    select.BindInt64(1, run_id).BindInt64(2, m.version());
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (row && select.ColumnBlob(0) != record) {
      return absl::AlreadyExistsError(absl::StrCat("manifest version ", m.version(), " of run '",
                                                   Sv(run), "' already exists with other content"));
    }
  }
  return txn.Commit();
}

absl::StatusOr<v1::Manifest> Catalog::GetManifest(std::string_view run, int64_t version) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectManifestSql));
  select.BindInt64(1, run_id).BindInt64(2, version);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) {
    return absl::NotFoundError(
        absl::StrCat("manifest version ", version, " of run '", Sv(run), "' not found"));
  }
  return Parse<v1::Manifest>(select.ColumnBlob(0), "manifest");
}

// --- Telemetry -----------------------------------------------------------------------------

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
        SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectRunIdGenerationSql));
        select.BindText(1, batch.run);
        SG_ASSIGN_OR_RETURN(bool row, select.Step());
        if (!row) {
          info.status = absl::NotFoundError(absl::StrCat("run '", Sv(batch.run), "' not found"));
        } else {
          info.id = select.ColumnInt64(0);
          info.current = select.ColumnInt64(1);
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
        if (absl::Status s = RequireGenerationLocked(info.id, batch.run, batch.generation);
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
        SG_ASSIGN_OR_RETURN(int64_t step, CommittedStepLocked(info.id, batch.generation, batch.rank));
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
          v1::StepRecord stored;
          SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectStepRecordSql));
          select.BindInt64(1, info.id).BindInt64(2, batch.generation).BindInt64(3, report->step());
          SG_ASSIGN_OR_RETURN(bool row, select.Step());
          if (row) {
            SG_ASSIGN_OR_RETURN(stored, Parse<v1::StepRecord>(select.ColumnBlob(0), "step"));
          }
          record = open.emplace(report->step(), std::move(stored)).first;
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
      const v1::StepRecord& record = open_steps_[{run_id, generation}][step];
      SG_ASSIGN_OR_RETURN(Statement upsert, db_->Prepare(kUpsertStepRecordSql));
      upsert.BindInt64(1, run_id)
          .BindInt64(2, generation)
          .BindInt64(3, record.step())
          .BindInt64(4, record.ranks_reported())
          .BindDouble(5, record.loss())  // NaN -> NULL; the blob keeps the bits
          .BindDouble(6, record.grad_norm())
          .BindBlob(7, Serialize(record));
      SG_RETURN_IF_ERROR(upsert.Run());
    }
    const int64_t now = clock_->NowUnixMillis();
    for (const auto& [key, step] : progress) {
      SG_ASSIGN_OR_RETURN(Statement upsert, db_->Prepare(kUpsertRankProgressSql));
      upsert.BindInt64(1, std::get<0>(key))
          .BindInt64(2, std::get<1>(key))
          .BindInt64(3, std::get<2>(key))
          .BindInt64(4, step)
          .BindInt64(5, now);
      SG_RETURN_IF_ERROR(upsert.Run());
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
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  return CommittedStepLocked(run_id, generation, rank);
}

absl::StatusOr<std::vector<v1::StepRecord>> Catalog::QueryTelemetry(
    std::string_view run, int64_t generation, int64_t from_step, std::optional<int64_t> to_step,
    int limit) {
  if (limit <= 0 || limit > kMaxQueryLimit) limit = kMaxQueryLimit;
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  SG_RETURN_IF_ERROR(RequireGenerationLocked(run_id, run, generation));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kQueryTelemetrySql));
  select.BindInt64(1, run_id)
      .BindInt64(2, generation)
      .BindInt64(3, from_step)
      .BindInt64(4, to_step.value_or(std::numeric_limits<int64_t>::max()))
      .BindInt64(5, limit);
  std::vector<v1::StepRecord> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    SG_ASSIGN_OR_RETURN(out.emplace_back(), Parse<v1::StepRecord>(select.ColumnBlob(0), "step"));
  }
  return out;
}

absl::StatusOr<std::vector<v1::RankState>> Catalog::ListRankProgress(std::string_view run) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  return ListRankProgressLocked(run_id);
}

// --- Incidents ---------------------------------------------------------------------------

absl::StatusOr<int64_t> Catalog::CreateIncident(std::string_view run, const v1::Incident& inc) {
  Held lock(this);
  return InsertIncidentLocked(run, inc);
}

absl::StatusOr<int64_t> Catalog::InsertIncidentLocked(std::string_view run,
                                                      const v1::Incident& inc) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  v1::Incident record = inc;
  record.set_id(0);
  record.set_run(std::string(run));
  if (record.opened_unix_ms() == 0) record.set_opened_unix_ms(clock_->NowUnixMillis());
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertIncidentSql));
  insert.BindInt64(1, run_id)
      .BindInt64(2, record.state())
      .BindInt64(3, record.verdict())
      .BindText(4, record.trigger())
      .BindInt64(5, record.generation())
      .BindInt64(6, record.onset_step())
      .BindInt64(7, record.opened_unix_ms())
      .BindInt64(8, record.closed_unix_ms())
      .BindBlob(9, Serialize(record));
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::Status Catalog::UpdateIncident(const v1::Incident& inc) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(UpdateIncidentLocked(inc));
  return txn.Commit();
}

absl::Status Catalog::UpdateIncidentLocked(const v1::Incident& inc) {
  SG_ASSIGN_OR_RETURN(v1::Incident stored, GetIncidentLocked(inc.id()));
  if (!inc.run().empty() && inc.run() != stored.run()) {
    return absl::InvalidArgumentError(absl::StrCat("incident ", inc.id(), " belongs to run '",
                                                   stored.run(), "', not '", inc.run(), "'"));
  }
  v1::Incident record = inc;
  record.set_run(stored.run());
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateIncidentSql));
  update.BindInt64(1, record.state())
      .BindInt64(2, record.verdict())
      .BindText(3, record.trigger())
      .BindInt64(4, record.generation())
      .BindInt64(5, record.onset_step())
      .BindInt64(6, record.opened_unix_ms())
      .BindInt64(7, record.closed_unix_ms())
      .BindBlob(8, Serialize(record))
      .BindInt64(9, record.id());
  return update.Run();
}

absl::StatusOr<int64_t> Catalog::AppendIncidentEventAndUpdate(int64_t incident_id,
                                                              std::string_view kind,
                                                              std::string_view payload,
                                                              const IncidentUpdateFn& updated) {
  if (kind.empty()) return absl::InvalidArgumentError("incident event kind is empty");
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t seq, RecordIncidentEventLocked(incident_id, kind, payload, updated));
  SG_RETURN_IF_ERROR(txn.Commit());
  return seq;
}

absl::StatusOr<int64_t> Catalog::CreateIncidentWithEvent(std::string_view run,
                                                         const v1::Incident& inc,
                                                         std::string_view kind,
                                                         std::string_view payload,
                                                         const NewIncidentFn& updated) {
  if (kind.empty()) return absl::InvalidArgumentError("incident event kind is empty");
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t id, CreateIncidentWithEventLocked(run, inc, kind, payload, updated));
  SG_RETURN_IF_ERROR(txn.Commit());
  return id;
}

absl::StatusOr<int64_t> Catalog::CreateIncidentWithEventLocked(std::string_view run,
                                                               const v1::Incident& inc,
                                                               std::string_view kind,
                                                               std::string_view payload,
                                                               const NewIncidentFn& updated) {
  SG_ASSIGN_OR_RETURN(int64_t id, InsertIncidentLocked(run, inc));
  SG_RETURN_IF_ERROR(RecordIncidentEventLocked(id, kind, payload,
                                               [&](int64_t seq) -> const v1::Incident& {
                                                 return updated(id, seq);
                                               })
                         .status());
  return id;
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
  if (kind.empty()) return absl::InvalidArgumentError("incident event kind is empty");
  Catalog* c = catalog_;
  c->mu_.AssertHeld();
  return c->InSavepointLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return c->CreateIncidentWithEventLocked(run, inc, kind, payload, updated);
  });
}

absl::StatusOr<int64_t> Catalog::OpenGroup::AppendIncidentEventAndUpdate(
    int64_t incident_id, std::string_view kind, std::string_view payload,
    const std::function<const v1::Incident&(int64_t seq)>& updated) {
  if (kind.empty()) return absl::InvalidArgumentError("incident event kind is empty");
  Catalog* c = catalog_;
  c->mu_.AssertHeld();
  return c->InSavepointLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return c->RecordIncidentEventLocked(incident_id, kind, payload, updated);
  });
}

absl::StatusOr<int64_t> Catalog::RecordIncidentEventLocked(int64_t incident_id,
                                                           std::string_view kind,
                                                           std::string_view payload,
                                                           const IncidentUpdateFn& updated) {
  SG_ASSIGN_OR_RETURN(int64_t seq, InsertIncidentEventLocked(incident_id, kind, payload));
  const v1::Incident& record = updated(seq);
  if (record.id() != incident_id) {
    return absl::InvalidArgumentError(absl::StrCat("event of incident ", incident_id,
                                                   " would store incident ", record.id()));
  }
  SG_RETURN_IF_ERROR(UpdateIncidentLocked(record));
  return seq;
}

absl::StatusOr<v1::Incident> Catalog::GetIncident(int64_t id) {
  Held lock(this);
  return GetIncidentLocked(id);
}

absl::StatusOr<std::vector<v1::Incident>> Catalog::ListIncidents(const IncidentFilter& filter) {
  Held lock(this);
  if (!filter.run.empty()) SG_RETURN_IF_ERROR(RunIdLocked(filter.run).status());
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListIncidentsSql));
  select.BindText(1, filter.run)
      .BindInt64(2, filter.state)
      .BindInt64(3, filter.verdict)
      .BindInt64(4, filter.since_unix_ms);
  std::vector<v1::Incident> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    SG_ASSIGN_OR_RETURN(out.emplace_back(), ReadIncidentRow(select));
  }
  return out;
}

absl::StatusOr<int64_t> Catalog::AppendIncidentEvent(int64_t incident_id, std::string_view kind,
                                                     std::string_view payload) {
  if (kind.empty()) return absl::InvalidArgumentError("incident event kind is empty");
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t seq, InsertIncidentEventLocked(incident_id, kind, payload));
  SG_RETURN_IF_ERROR(txn.Commit());
  return seq;
}

absl::StatusOr<int64_t> Catalog::InsertIncidentEventLocked(int64_t incident_id,
                                                           std::string_view kind,
                                                           std::string_view payload) {
  {
    SG_ASSIGN_OR_RETURN(Statement exists, db_->Prepare(kIncidentExistsSql));
    exists.BindInt64(1, incident_id);
    SG_ASSIGN_OR_RETURN(bool row, exists.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("incident ", incident_id, " not found"));
  }
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertEventSql));
  insert.BindInt64(1, incident_id)
      .BindInt64(2, clock_->NowUnixMillis())
      .BindText(3, kind)
      .BindBlob(4, payload);
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<std::vector<StoredEvent>> Catalog::ListIncidentEvents(int64_t incident_id) {
  Held lock(this);
  SG_RETURN_IF_ERROR(GetIncidentLocked(incident_id).status());
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListEventsSql));
  select.BindInt64(1, incident_id);
  std::vector<StoredEvent> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    StoredEvent& e = out.emplace_back();
    e.seq = select.ColumnInt64(0);
    e.incident_id = incident_id;
    e.unix_ms = select.ColumnInt64(1);
    e.kind = select.ColumnText(2);
    e.payload = select.ColumnBlob(3);
  }
  return out;
}

// --- Commands ------------------------------------------------------------------------------

absl::Status Catalog::PutCommand(std::string_view id, std::string_view run, int64_t generation,
                                 std::string_view kind, std::string_view payload,
                                 std::string_view state) {
  if (id.empty()) return absl::InvalidArgumentError("command id is empty");
  if (!OneOf(state, kCommandStates)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown command state '", Sv(state), "'"));
  }
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  if (absl::StatusOr<StoredCommand> existing = GetCommandLocked(id); existing.ok()) {
    if (existing->run == run && existing->generation == generation && existing->kind == kind &&
        existing->payload == payload) {
      return absl::OkStatus();  // a resend of the same command
    }
    return absl::AlreadyExistsError(
        absl::StrCat("command '", Sv(id), "' already exists with other content"));
  } else if (!absl::IsNotFound(existing.status())) {
    return existing.status();
  }
  const int64_t now = clock_->NowUnixMillis();
  {
    SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertCommandSql));
    insert.BindText(1, id)
        .BindInt64(2, run_id)
        .BindInt64(3, generation)
        .BindText(4, kind)
        .BindBlob(5, payload)
        .BindText(6, state)
        .BindInt64(7, now)
        .BindInt64(8, now);
    SG_RETURN_IF_ERROR(insert.Run());
  }
  return txn.Commit();
}

absl::Status Catalog::UpdateCommandState(std::string_view id, std::string_view state,
                                         std::string_view message) {
  if (!OneOf(state, kCommandStates)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown command state '", Sv(state), "'"));
  }
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(StoredCommand existing, GetCommandLocked(id));
  const bool final_state = existing.state == "acked" || existing.state == "failed";
  if (final_state) {
    if (existing.state == state) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "command '", Sv(id), "' is already ", existing.state, "; cannot become ", Sv(state)));
  }
  {
    SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateCommandStateSql));
    update.BindText(1, state)
        .BindText(2, message)
        .BindInt64(3, clock_->NowUnixMillis())
        .BindText(4, id);
    SG_RETURN_IF_ERROR(update.Run());
  }
  return txn.Commit();
}

absl::StatusOr<StoredCommand> Catalog::GetCommand(std::string_view id) {
  Held lock(this);
  return GetCommandLocked(id);
}

absl::StatusOr<std::vector<StoredCommand>> Catalog::ListCommands(std::string_view run,
                                                                 std::string_view state) {
  if (!state.empty() && !OneOf(state, kCommandStates)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown command state '", Sv(state), "'"));
  }
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListCommandsSql));
  select.BindInt64(1, run_id).BindText(2, state);
  std::vector<StoredCommand> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    out.push_back(ReadCommandRow(select));
  }
  return out;
}

// --- Quarantine ------------------------------------------------------------------------------

absl::StatusOr<v1::QuarantineEntry> Catalog::AddQuarantine(const v1::QuarantineEntry& entry) {
  if (entry.domain().empty()) return absl::InvalidArgumentError("entry.domain is empty");
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(entry.run()));
  if (entry.incident_id() != 0) SG_RETURN_IF_ERROR(GetIncidentLocked(entry.incident_id()).status());
  {
    SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertQuarantineSql));
    insert.BindInt64(1, run_id)
        .BindText(2, entry.domain())
        .BindInt64(3, entry.document_id())
        .BindText(4, entry.reason())
        .BindInt64(6, entry.created_unix_ms() != 0 ? entry.created_unix_ms()
                                                   : clock_->NowUnixMillis());
    if (entry.incident_id() != 0) {
      insert.BindInt64(5, entry.incident_id());
    } else {
      insert.BindNull(5);
    }
    SG_RETURN_IF_ERROR(insert.Run());
  }
  v1::QuarantineEntry stored;
  {
    SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectQuarantineSql));
    select.BindInt64(1, run_id).BindText(2, entry.domain()).BindInt64(3, entry.document_id());
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) return absl::InternalError("quarantine entry vanished after insert");
    stored.set_run(entry.run());
    stored.set_domain(select.ColumnText(0));
    stored.set_document_id(select.ColumnInt64(1));
    stored.set_reason(select.ColumnText(2));
    stored.set_incident_id(select.ColumnInt64(3));  // NULL reads as 0
    stored.set_created_unix_ms(select.ColumnInt64(4));
  }
  SG_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::QuarantineEntry>> Catalog::ListQuarantine(std::string_view run) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(run));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectQuarantineSql));
  select.BindInt64(1, run_id).BindNull(2).BindNull(3);
  std::vector<v1::QuarantineEntry> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    v1::QuarantineEntry& e = out.emplace_back();
    e.set_run(std::string(run));
    e.set_domain(select.ColumnText(0));
    e.set_document_id(select.ColumnInt64(1));
    e.set_reason(select.ColumnText(2));
    e.set_incident_id(select.ColumnInt64(3));
    e.set_created_unix_ms(select.ColumnInt64(4));
  }
  return out;
}

// --- Audit -------------------------------------------------------------------------------------

absl::StatusOr<int64_t> Catalog::AppendAudit(std::string_view actor, std::string_view action,
                                             std::string_view target, std::string_view detail) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertAuditSql));
  insert.BindInt64(1, clock_->NowUnixMillis())
      .BindText(2, actor)
      .BindText(3, action)
      .BindText(4, target)
      .BindText(5, detail);
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<std::vector<AuditEntry>> Catalog::ListAudit(int limit) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListAuditSql));
  select.BindInt64(1, limit > 0 ? limit : -1);  // LIMIT -1: no limit
  std::vector<AuditEntry> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    AuditEntry& e = out.emplace_back();
    e.seq = select.ColumnInt64(0);
    e.unix_ms = select.ColumnInt64(1);
    e.actor = select.ColumnText(2);
    e.action = select.ColumnText(3);
    e.target = select.ColumnText(4);
    e.detail = select.ColumnText(5);
  }
  return out;
}

absl::StatusOr<int64_t> Catalog::AppendAudit(const v1::AuditEntry& entry) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertAuditV4Sql));
  insert.BindInt64(1, entry.unix_ms() != 0 ? entry.unix_ms() : clock_->NowUnixMillis())
      .BindText(2, entry.principal())
      .BindText(3, entry.rpc())
      .BindText(4, entry.run())
      .BindText(5, entry.detail())
      .BindText(6, entry.role())
      .BindText(7, entry.outcome())
      .BindText(8, entry.peer());
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<std::vector<v1::AuditEntry>> Catalog::QueryAudit(const AuditQuery& query) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kQueryAuditSql));
  select.BindText(1, query.run)
      .BindText(2, query.principal)
      .BindInt64(3, query.since_unix_ms)
      .BindInt64(4, query.before_id > 0 ? query.before_id : std::numeric_limits<int64_t>::max())
      .BindInt64(5, query.limit > 0 ? query.limit : -1);
  std::vector<v1::AuditEntry> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    v1::AuditEntry& e = out.emplace_back();
    e.set_id(select.ColumnInt64(0));
    e.set_unix_ms(select.ColumnInt64(1));
    e.set_principal(select.ColumnText(2));
    e.set_rpc(select.ColumnText(3));
    e.set_run(select.ColumnText(4));
    e.set_detail(select.ColumnText(5));
    e.set_role(select.ColumnText(6));
    e.set_outcome(select.ColumnText(7));
    e.set_peer(select.ColumnText(8));
  }
  return out;
}

// --- Policies ----------------------------------------------------------------------------------

constexpr char kPutPolicySql[] =
    "INSERT INTO policies (scope, policy, updated_unix_ms) VALUES (?, ?, ?) "
    "ON CONFLICT (scope) DO UPDATE SET policy = excluded.policy, "
    "updated_unix_ms = excluded.updated_unix_ms";
constexpr char kGetPolicySql[] = "SELECT policy FROM policies WHERE scope = ?";

absl::Status Catalog::PutPolicy(std::string_view scope, const v1::Policy& policy) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement put, db_->Prepare(kPutPolicySql));
  const std::string blob = policy.SerializeAsString();
  put.BindText(1, scope).BindBlob(2, blob).BindInt64(3, clock_->NowUnixMillis());
  SG_RETURN_IF_ERROR(put.Run());
  config_version_.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::StatusOr<v1::Policy> Catalog::GetPolicy(std::string_view scope) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement get, db_->Prepare(kGetPolicySql));
  get.BindText(1, scope);
  SG_ASSIGN_OR_RETURN(bool row, get.Step());
  if (!row) {
    return absl::NotFoundError(absl::StrCat("no policy set for '", std::string(scope), "'"));
  }
  return Parse<v1::Policy>(get.ColumnBlob(0), absl::StrCat("policy of '", std::string(scope), "'"));
}

// --- Precursor warnings -------------------------------------------------------------------------

constexpr char kInsertWarningSql[] =
    "INSERT INTO precursor_warnings (run_id, generation, signal, layer, state, onset_step, "
    "incident_id, opened_unix_ms, updated_unix_ms, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
constexpr char kUpdateWarningSql[] =
    "UPDATE precursor_warnings SET generation = ?, signal = ?, layer = ?, state = ?, "
    "onset_step = ?, incident_id = ?, updated_unix_ms = ?, record = ? WHERE id = ?";
constexpr char kSelectWarningSql[] =
    "SELECT w.id, r.name, w.record FROM precursor_warnings AS w JOIN runs AS r "
    "ON r.id = w.run_id WHERE w.id = ?";
constexpr char kListWarningsSql[] =
    "SELECT w.id, r.name, w.record FROM precursor_warnings AS w JOIN runs AS r "
    "ON r.id = w.run_id WHERE (?1 = '' OR r.name = ?1) AND (?2 = 0 OR w.state = ?2) "
    "ORDER BY w.id";

namespace {

absl::StatusOr<v1::PrecursorWarning> ReadWarningRow(const Statement& row) {
  const int64_t id = row.ColumnInt64(0);
  SG_ASSIGN_OR_RETURN(v1::PrecursorWarning w,
                      Parse<v1::PrecursorWarning>(row.ColumnBlob(2),
                                                  absl::StrCat("precursor warning ", id)));
  w.set_id(id);
  w.set_run(row.ColumnText(1));
  return w;
}

absl::Status CheckWarning(const v1::PrecursorWarning& w) {
  if (w.signal().empty()) return absl::InvalidArgumentError("precursor warning: empty signal");
  if (!v1::WarningState_IsValid(w.state()) || w.state() == v1::WARNING_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("precursor warning: state ", w.state(), " is not a warning state"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> Catalog::CreateWarning(const v1::PrecursorWarning& w) {
  SG_RETURN_IF_ERROR(CheckWarning(w));
  Held lock(this);
  SG_ASSIGN_OR_RETURN(int64_t run_id, RunIdLocked(w.run()));
  v1::PrecursorWarning record = w;
  record.set_id(0);
  const int64_t now = clock_->NowUnixMillis();
  if (record.opened_unix_ms() == 0) record.set_opened_unix_ms(now);
  if (record.updated_unix_ms() == 0) record.set_updated_unix_ms(now);
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertWarningSql));
  insert.BindInt64(1, run_id)
      .BindInt64(2, record.generation())
      .BindText(3, record.signal())
      .BindInt64(4, record.layer())
      .BindInt64(5, record.state())
      .BindInt64(6, record.onset_step());
  if (record.incident_id() > 0) {
    insert.BindInt64(7, record.incident_id());
  } else {
    insert.BindNull(7);
  }
  insert.BindInt64(8, record.opened_unix_ms())
      .BindInt64(9, record.updated_unix_ms())
      .BindBlob(10, Serialize(record));
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::Status Catalog::UpdateWarning(const v1::PrecursorWarning& w) {
  SG_RETURN_IF_ERROR(CheckWarning(w));
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  v1::PrecursorWarning stored;
  {
    SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectWarningSql));
    select.BindInt64(1, w.id());
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("precursor warning ", w.id(), " not found"));
    SG_ASSIGN_OR_RETURN(stored, ReadWarningRow(select));
  }
  if (!w.run().empty() && w.run() != stored.run()) {
    return absl::FailedPreconditionError(absl::StrCat("precursor warning ", w.id(), " belongs to run '",
                                                      stored.run(), "', not '", w.run(), "'"));
  }
  if (w.incident_id() > 0) {
    SG_ASSIGN_OR_RETURN(Statement exists, db_->Prepare(kIncidentExistsSql));
    exists.BindInt64(1, w.incident_id());
    SG_ASSIGN_OR_RETURN(bool row, exists.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("incident ", w.incident_id(), " not found"));
  }
  v1::PrecursorWarning record = w;
  record.set_run(stored.run());
  record.set_opened_unix_ms(stored.opened_unix_ms());
  record.set_updated_unix_ms(clock_->NowUnixMillis());
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateWarningSql));
  update.BindInt64(1, record.generation())
      .BindText(2, record.signal())
      .BindInt64(3, record.layer())
      .BindInt64(4, record.state())
      .BindInt64(5, record.onset_step());
  if (record.incident_id() > 0) {
    update.BindInt64(6, record.incident_id());
  } else {
    update.BindNull(6);
  }
  update.BindInt64(7, record.updated_unix_ms()).BindBlob(8, Serialize(record)).BindInt64(9, w.id());
  SG_RETURN_IF_ERROR(update.Run());
  return txn.Commit();
}

absl::StatusOr<v1::PrecursorWarning> Catalog::GetWarning(int64_t id) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectWarningSql));
  select.BindInt64(1, id);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("precursor warning ", id, " not found"));
  return ReadWarningRow(select);
}

absl::StatusOr<std::vector<v1::PrecursorWarning>> Catalog::ListWarnings(
    const WarningFilter& filter) {
  Held lock(this);
  if (!filter.run.empty()) SG_RETURN_IF_ERROR(RunIdLocked(filter.run).status());
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListWarningsSql));
  select.BindText(1, filter.run).BindInt64(2, filter.state);
  std::vector<v1::PrecursorWarning> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    SG_ASSIGN_OR_RETURN(out.emplace_back(), ReadWarningRow(select));
  }
  return out;
}

// --- Launches ----------------------------------------------------------------------------------

constexpr char kPutLaunchSql[] =
    "INSERT INTO launches (run, slot, kind, handle, start_ticks, generation, restarts, "
    "updated_unix_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run, slot) DO UPDATE SET "
    "kind = excluded.kind, handle = excluded.handle, start_ticks = excluded.start_ticks, "
    "generation = excluded.generation, restarts = excluded.restarts, "
    "updated_unix_ms = excluded.updated_unix_ms";
constexpr char kListLaunchesSql[] =
    "SELECT run, slot, kind, handle, start_ticks, generation, restarts, updated_unix_ms "
    "FROM launches ORDER BY run, slot";

absl::Status Catalog::PutLaunch(const LaunchRecord& r) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement put, db_->Prepare(kPutLaunchSql));
  put.BindText(1, r.run)
      .BindText(2, r.slot)
      .BindText(3, r.kind)
      .BindInt64(4, r.handle)
      .BindInt64(5, r.start_ticks)
      .BindInt64(6, r.generation)
      .BindInt64(7, r.restarts)
      .BindInt64(8, clock_->NowUnixMillis());
  return put.Run();
}

absl::StatusOr<std::vector<LaunchRecord>> Catalog::ListLaunches() {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Statement list, db_->Prepare(kListLaunchesSql));
  std::vector<LaunchRecord> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, list.Step());
    if (!row) break;
    LaunchRecord r;
    r.run = list.ColumnText(0);
    r.slot = list.ColumnText(1);
    r.kind = list.ColumnText(2);
    r.handle = list.ColumnInt64(3);
    r.start_ticks = list.ColumnInt64(4);
    r.generation = list.ColumnInt64(5);
    r.restarts = static_cast<int32_t>(list.ColumnInt64(6));
    r.updated_unix_ms = list.ColumnInt64(7);
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status Catalog::DeleteLaunches(std::string_view run, std::string_view slot) {
  Held lock(this);
  return DeleteLaunchesLocked(run, slot);
}

absl::Status Catalog::DeleteLaunchesLocked(std::string_view run, std::string_view slot) {
  SG_ASSIGN_OR_RETURN(Statement del,
                      db_->Prepare(slot.empty() ? "DELETE FROM launches WHERE run = ?"
                                                : "DELETE FROM launches WHERE run = ? AND slot = ?"));
  del.BindText(1, run);
  if (!slot.empty()) del.BindText(2, slot);
  return del.Run();
}

absl::Status Catalog::EndRun(std::string_view run, std::string_view state, std::string_view slot) {
  Held lock(this);
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_.get()));
  SG_RETURN_IF_ERROR(SetRunStateLocked(run, state));
  SG_RETURN_IF_ERROR(DeleteLaunchesLocked(run, slot));
  return txn.Commit();
}

}  // namespace spikeguard::storage
