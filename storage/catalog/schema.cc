#include "storage/catalog/schema.h"

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "proto/state_names.h"

namespace spikeguard::storage {
namespace {

// Version 1: the eleven base tables (docs/ARCHITECTURE.md, "The catalog
// schema"). Full records are kept as serialized protos (the source of truth,
// bit-exact for NaN/Inf); the other columns exist for keys, constraints and
// queries. REAL columns are nullable because SQLite stores a NaN as NULL.
constexpr char kSchemaV1Sql[] = R"sql(
CREATE TABLE runs (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  created_unix_ms INTEGER NOT NULL,
  mode INTEGER NOT NULL,
  world_size INTEGER NOT NULL,
  current_generation INTEGER NOT NULL,
  state TEXT NOT NULL,
  last_step INTEGER NOT NULL,
  spec BLOB NOT NULL
);

CREATE TABLE generations (
  run_id INTEGER NOT NULL REFERENCES runs (id),
  generation INTEGER NOT NULL,
  parent INTEGER NOT NULL,
  from_checkpoint_step INTEGER NOT NULL,
  reason TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  record BLOB NOT NULL,
  PRIMARY KEY (run_id, generation)
);

CREATE TABLE checkpoints (
  run_id INTEGER NOT NULL REFERENCES runs (id),
  step INTEGER NOT NULL,
  uri TEXT NOT NULL,
  generation INTEGER NOT NULL,
  data_position INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  checksum TEXT NOT NULL,
  complete INTEGER NOT NULL,
  pinned INTEGER NOT NULL,
  has_rng_state INTEGER NOT NULL,
  has_data_loader_state INTEGER NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, step, uri)
);

CREATE TABLE manifests (
  run_id INTEGER NOT NULL REFERENCES runs (id),
  version INTEGER NOT NULL,
  dataset_fingerprint TEXT NOT NULL,
  seed INTEGER NOT NULL,
  global_batch_size INTEGER NOT NULL,
  sequence_length INTEGER NOT NULL,
  record BLOB NOT NULL,
  PRIMARY KEY (run_id, version)
);

CREATE TABLE step_telemetry (
  run_id INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  step INTEGER NOT NULL,
  ranks_reported INTEGER NOT NULL,
  loss REAL,
  grad_norm REAL,
  record BLOB NOT NULL,
  PRIMARY KEY (run_id, generation, step),
  FOREIGN KEY (run_id, generation) REFERENCES generations (run_id, generation)
);

CREATE TABLE rank_progress (
  run_id INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  committed_step INTEGER NOT NULL,
  last_seen_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, generation, rank),
  FOREIGN KEY (run_id, generation) REFERENCES generations (run_id, generation)
);

CREATE TABLE incidents (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id INTEGER NOT NULL REFERENCES runs (id),
  state INTEGER NOT NULL,
  verdict INTEGER NOT NULL,
  trigger_kind TEXT NOT NULL,
  generation INTEGER NOT NULL,
  onset_step INTEGER NOT NULL,
  opened_unix_ms INTEGER NOT NULL,
  closed_unix_ms INTEGER NOT NULL,
  record BLOB NOT NULL
);
CREATE INDEX incidents_by_run ON incidents (run_id, opened_unix_ms);

CREATE TABLE incident_events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  incident_id INTEGER NOT NULL REFERENCES incidents (id),
  unix_ms INTEGER NOT NULL,
  kind TEXT NOT NULL,
  payload BLOB NOT NULL
);
CREATE INDEX incident_events_by_incident ON incident_events (incident_id, seq);
-- The incident engine rebuilds its state from this log after a crash.
CREATE TRIGGER incident_events_no_update BEFORE UPDATE ON incident_events
BEGIN
  SELECT RAISE(ABORT, 'incident_events is append-only');
END;
CREATE TRIGGER incident_events_no_delete BEFORE DELETE ON incident_events
BEGIN
  SELECT RAISE(ABORT, 'incident_events is append-only');
END;

CREATE TABLE commands (
  id TEXT PRIMARY KEY NOT NULL,
  run_id INTEGER NOT NULL REFERENCES runs (id),
  generation INTEGER NOT NULL,
  kind TEXT NOT NULL,
  payload BLOB NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'sent', 'acked', 'failed')),
  message TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  updated_unix_ms INTEGER NOT NULL
);
CREATE INDEX commands_by_run_state ON commands (run_id, state);

CREATE TABLE quarantine (
  run_id INTEGER NOT NULL REFERENCES runs (id),
  domain TEXT NOT NULL,
  document_id INTEGER NOT NULL,
  reason TEXT NOT NULL,
  incident_id INTEGER REFERENCES incidents (id),
  created_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, domain, document_id)
);

CREATE TABLE audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  unix_ms INTEGER NOT NULL,
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  target TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
  SELECT RAISE(ABORT, 'audit is append-only');
END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
  SELECT RAISE(ABORT, 'audit is append-only');
END;
)sql";

// Version 2: policies per run ("" = the daemon-wide default), so a policy set
// over gRPC survives a restart.
constexpr char kSchemaV2Sql[] = R"sql(
CREATE TABLE policies (
  scope TEXT PRIMARY KEY NOT NULL,
  policy BLOB NOT NULL,
  updated_unix_ms INTEGER NOT NULL
);
)sql";

// Version 3: the data order the run's workers reported in their hello
// (serialized v1::DataOrder, empty = none reported) and the steps their
// schedule runs (0 = unknown).
constexpr char kSchemaV3Sql[] = R"sql(
ALTER TABLE runs ADD COLUMN data_order BLOB NOT NULL DEFAULT x'';
ALTER TABLE runs ADD COLUMN total_steps INTEGER NOT NULL DEFAULT 0;
)sql";

// Version 4: the audit row says who (principal and role), from where (peer),
// and how the call ended (outcome: the gRPC status code's name). `actor`
// keeps the principal, `action` the RPC and `target` the run.
constexpr char kSchemaV4Sql[] = R"sql(
ALTER TABLE audit ADD COLUMN role TEXT NOT NULL DEFAULT '';
ALTER TABLE audit ADD COLUMN outcome TEXT NOT NULL DEFAULT '';
ALTER TABLE audit ADD COLUMN peer TEXT NOT NULL DEFAULT '';
CREATE INDEX audit_by_target ON audit (target, seq);
)sql";

// Version 5: what a launcher started for a run, so a daemon restarted after
// kill -9 adopts it instead of starting a second copy: a Slurm job (slot
// "job", handle = the job id) or a local rank (slot "rank-R", handle = the
// pid, start_ticks = field 22 of /proc/PID/stat, so a reused pid is not
// taken for ours). `restarts` is what the run has spent of its budget.
constexpr char kSchemaV5Sql[] = R"sql(
CREATE TABLE launches (
  run TEXT NOT NULL,
  slot TEXT NOT NULL,
  kind TEXT NOT NULL,
  handle INTEGER NOT NULL,
  start_ticks INTEGER NOT NULL DEFAULT 0,
  generation INTEGER NOT NULL DEFAULT 0,
  restarts INTEGER NOT NULL DEFAULT 0,
  updated_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (run, slot)
);
)sql";

// Version 6: the run's rolling rewind target (at most one checkpoint per run
// has rolling = 1), pinned like `pinned` but set and released by the daemon
// as newer checkpoints qualify; kept apart so an incident's unpin never
// releases it.
constexpr char kSchemaV6Sql[] = R"sql(
ALTER TABLE checkpoints ADD COLUMN rolling INTEGER NOT NULL DEFAULT 0;
)sql";

// Version 7: precursor warnings (a critical precursor that persisted), one
// row per episode; `record` is the serialized v1::PrecursorWarning, the other
// columns are for queries. incident_id is NULL until an incident opens while
// the warning is active.
constexpr char kSchemaV7Sql[] = R"sql(
CREATE TABLE precursor_warnings (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id INTEGER NOT NULL REFERENCES runs (id),
  generation INTEGER NOT NULL,
  signal TEXT NOT NULL,
  layer INTEGER NOT NULL,
  state INTEGER NOT NULL,
  onset_step INTEGER NOT NULL,
  incident_id INTEGER REFERENCES incidents (id),
  opened_unix_ms INTEGER NOT NULL,
  updated_unix_ms INTEGER NOT NULL,
  record BLOB NOT NULL
);
CREATE INDEX precursor_warnings_by_run ON precursor_warnings (run_id, state);
)sql";

// Version 8: what the daemon saw of a checkpoint's file when it was
// registered (CheckpointGuard's file identity: device, inode, size,
// modification and change times), so a rewind checks that the file is the
// one registered without reading it; "" = not seen (the file was not there
// yet, or the row is older).
constexpr char kSchemaV8Sql[] = R"sql(
ALTER TABLE checkpoints ADD COLUMN file_identity TEXT NOT NULL DEFAULT '';
)sql";

// Version 9: each run's incarnation, random, made when the run is created
// (a later run of the same name, in this catalog or in one made afresh
// beside the same worker-token key, has another): the tokens of the workers
// the daemon launches are bound to it. Runs stored before get one now.
constexpr char kSchemaV9Sql[] = R"sql(
ALTER TABLE runs ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
UPDATE runs SET incarnation = lower(hex(randomblob(16))) WHERE incarnation = '';
)sql";

// Version 10: run and command states are enums (RunState, CommandState in
// supervisor.proto) that the columns keep by name ("running", "acked";
// proto/state_names.h), so the text rows of earlier versions are already in
// the stored form. The step refuses a catalog holding a state that is not
// one (CheckStoredStates, before this SQL) and makes `runs` refuse one from
// now on, as `commands` has since v1 (its CHECK). The names are frozen here:
// a new state needs a migration that recreates these triggers.
constexpr char kSchemaV10Sql[] = R"sql(
CREATE TRIGGER runs_state_is_known_on_insert BEFORE INSERT ON runs
WHEN NEW.state NOT IN ('created', 'running', 'paused', 'stopped', 'finished', 'failed')
BEGIN
  SELECT RAISE(ABORT, 'runs.state: not a run state');
END;
CREATE TRIGGER runs_state_is_known_on_update BEFORE UPDATE OF state ON runs
WHEN NEW.state NOT IN ('created', 'running', 'paused', 'stopped', 'finished', 'failed')
BEGIN
  SELECT RAISE(ABORT, 'runs.state: not a run state');
END;
)sql";

// The first run, then the first command, whose state is not a state's name:
// an error naming the row and the value (rows an earlier binary could not
// have written, edited by hand or by another tool).
absl::Status CheckStoredStates(Database& db) {
  {
    SG_ASSIGN_OR_RETURN(Statement runs, db.Prepare("SELECT name, state FROM runs ORDER BY id"));
    while (true) {
      SG_ASSIGN_OR_RETURN(bool row, runs.Step());
      if (!row) break;
      const std::string state = runs.ColumnText(1);
      if (!ParseRunState(state)) {
        return absl::DataLossError(absl::StrCat(
            "catalog ", db.path(), ": run '", runs.ColumnText(0), "' has state '", state,
            "', which is not a run state (created, running, paused, stopped, finished, failed); "
            "correct the row (sqlite3), then open the catalog again"));
      }
    }
  }
  SG_ASSIGN_OR_RETURN(Statement commands,
                      db.Prepare("SELECT id, state FROM commands ORDER BY rowid"));
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, commands.Step());
    if (!row) break;
    const std::string state = commands.ColumnText(1);
    if (!ParseCommandState(state)) {
      return absl::DataLossError(absl::StrCat(
          "catalog ", db.path(), ": command '", commands.ColumnText(0), "' has state '", state,
          "', which is not a command state (pending, sent, acked, failed); correct the row "
          "(sqlite3), then open the catalog again"));
    }
  }
  return absl::OkStatus();
}

// One migration step: `check`, then `sql`, then user_version = `to`,
// atomically.
absl::Status Step(Database& db, const char* sql, int to,
                  absl::Status (*check)(Database&) = nullptr) {
  SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&db));
  if (check != nullptr) SG_RETURN_IF_ERROR(check(db));
  SG_RETURN_IF_ERROR(db.Execute(sql));
  SG_RETURN_IF_ERROR(db.SetUserVersion(to));
  SG_RETURN_IF_ERROR(txn.Commit());
  SG_LOG(INFO) << "catalog " << db.path() << " migrated to schema version " << to;
  return absl::OkStatus();
}

absl::Status RefuseNewer(Database& db, int version) {
  if (version <= kSchemaVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "catalog ", db.path(), " has schema version ", version,
      ", newer than this binary's ", kSchemaVersion, "; upgrade spikeguard"));
}

}  // namespace

absl::Status MigrateSchema(Database& db) {
  SG_ASSIGN_OR_RETURN(int version, db.UserVersion());
  SG_RETURN_IF_ERROR(RefuseNewer(db, version));
  switch (version) {
    case 0:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV1Sql, 1));
      [[fallthrough]];
    case 1:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV2Sql, 2));
      [[fallthrough]];
    case 2:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV3Sql, 3));
      [[fallthrough]];
    case 3:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV4Sql, 4));
      [[fallthrough]];
    case 4:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV5Sql, 5));
      [[fallthrough]];
    case 5:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV6Sql, 6));
      [[fallthrough]];
    case 6:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV7Sql, 7));
      [[fallthrough]];
    case 7:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV8Sql, 8));
      [[fallthrough]];
    case 8:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV9Sql, 9));
      [[fallthrough]];
    case 9:
      SG_RETURN_IF_ERROR(Step(db, kSchemaV10Sql, 10, &CheckStoredStates));
      [[fallthrough]];
    case kSchemaVersion:
      break;
    default:
      return absl::InternalError(absl::StrCat("no migration from schema version ", version));
  }
  return absl::OkStatus();
}

absl::Status OpenSchema(Database& db) {
  // Check before WAL: switching the journal mode rewrites the file header.
  SG_ASSIGN_OR_RETURN(int version, db.UserVersion());
  SG_RETURN_IF_ERROR(RefuseNewer(db, version));
  SG_RETURN_IF_ERROR(db.EnableWriteAheadLog());
  return MigrateSchema(db);
}

}  // namespace spikeguard::storage
