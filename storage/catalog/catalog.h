// catalog.h
// -----------------------------------------------------------------------------
// The catalog is spikeguard's persistent state: runs and their generations
// (timelines), checkpoints, data-order manifests, merged per-step telemetry,
// incidents with their append-only event logs, precursor warnings, commands
// sent to workers, quarantined documents, policies, launches and the audit
// trail. It is one SQLite file in WAL mode; the daemon is its only writer.
//
// The SQL lives in one store per concern (run_store.h, step_store.h,
// checkpoint_store.h, manifest_store.h, incident_store.h, warning_store.h,
// command_store.h, quarantine_store.h, audit_store.h, policy_store.h,
// launch_store.h), each over the one `Database`. `Catalog` owns the
// connection and those stores, serializes every call with one mutex, and
// wraps each call that writes several rows in one transaction.
//
//   SG_ASSIGN_OR_RETURN(std::unique_ptr<Catalog> catalog,
//                       Catalog::Open({.path = "/var/lib/spikeguard/catalog.db"}));
//   v1::Run run;
//   run.set_name("gpt-7b");
//   run.set_world_size(1024);
//   SG_ASSIGN_OR_RETURN(run, catalog->CreateRun(run));          // generation 0
//   SG_ASSIGN_OR_RETURN(IngestResult r,
//                       catalog->IngestReports("gpt-7b", /*generation=*/0, rank, reports));
//   // r.committed_step: every report of this rank up to here is durable.
//
// Telemetry: the reports of one step from all ranks are merged (merge.h) into
// one `StepRecord` per (run, generation, step). Each call to `IngestReports`
// is one transaction, so a batch is either wholly durable or absent, and it
// is deduplicated by a per-(run, generation, rank) high-water mark: within a
// generation a rank's steps strictly increase, so a report at or below the
// rank's committed step is a duplicate (a resend after reconnect) and is
// counted, not merged again. Reports inside one call are taken in step order.
//
// Records are stored as serialized protos, the source of truth: NaN and Inf
// are data and come back bit-exact. Convenience REAL columns are nullable
// (SQLite turns NaN into NULL).
//
// Errors: NOT_FOUND for an unknown run, generation, incident or command;
// ALREADY_EXISTS for a duplicate run name, generation, or a manifest or command
// id reused with different content; INVALID_ARGUMENT for malformed input;
// FAILED_PRECONDITION for a catalog newer than this binary or a forbidden state
// change; UNAVAILABLE when the file is locked or I/O failed (retry the call).
//
// Thread-safe: every method takes an internal mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "spikeguard/v1/policy.pb.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "spikeguard/v1/telemetry.pb.h"
#include "storage/catalog/audit_store.h"
#include "storage/catalog/checkpoint_store.h"
#include "storage/catalog/command_store.h"
#include "storage/catalog/database.h"
#include "storage/catalog/incident_store.h"
#include "storage/catalog/launch_store.h"
#include "storage/catalog/manifest_store.h"
#include "storage/catalog/policy_store.h"
#include "storage/catalog/quarantine_store.h"
#include "storage/catalog/run_store.h"
#include "storage/catalog/schema.h"
#include "storage/catalog/step_store.h"
#include "storage/catalog/warning_store.h"

namespace spikeguard::storage {

struct CatalogOptions {
  // File path, or ":memory:" for a private in-memory catalog (tests).
  std::string path;
  // fsync on every commit. NORMAL (false) may lose the last commits on power
  // loss, never on a process crash.
  bool synchronous_full = true;
  absl::Duration busy_timeout = absl::Seconds(5);
  // Write-ahead log checkpoints (DatabaseOptions): by default inside the
  // commit that takes the log to `checkpoint_pages`; deferred, when the
  // owner calls `CheckpointIfDue` (the daemon's ingest stage does, between
  // groups, once their batches are answered).
  int64_t checkpoint_pages = 1000;
  bool deferred_checkpoints = false;
  // Timestamps the catalog fills in (created, last seen, event times).
  Clock* clock = Clock::Real();
};

class Catalog {
 public:
  static constexpr int kSchemaVersion = ::spikeguard::storage::kSchemaVersion;
  // QueryTelemetry returns at most this many records whatever the limit.
  static constexpr int kMaxQueryLimit = StepStore::kMaxQueryLimit;

  // Opens or creates the catalog and migrates it to kSchemaVersion. A file
  // with a newer schema is refused (FAILED_PRECONDITION) and left untouched.
  static absl::StatusOr<std::unique_ptr<Catalog>> Open(const CatalogOptions& options);

  int schema_version() const { return kSchemaVersion; }
  const std::string& path() const { return path_; }

  // --- Runs -----------------------------------------------------------------
  // Stores name, mode, world_size, state (default RUN_CREATED), spec and
  // created_unix_ms (default now); assigns id; creates generation 0 (parent -1,
  // reason "initial"). Returns the stored run as GetRun would.
  absl::StatusOr<v1::Run> CreateRun(const v1::Run& run);
  // With generations and the ranks' progress in the newest generation each
  // rank reported in (`connected` is left false: the catalog does not know).
  absl::StatusOr<v1::Run> GetRun(std::string_view name);
  // The same with generations but without the ranks' progress: what a
  // rank's hello needs, independent of how many ranks the run has.
  absl::StatusOr<v1::Run> GetRunWithoutRanks(std::string_view name);
  // Which run of that name this is (`incarnation`: 32 random hex digits made
  // by CreateRun, so a later run of the same name has another) and its
  // state: what a launched worker's token is checked against.
  using RunIncarnation = storage::RunIncarnation;
  absl::StatusOr<RunIncarnation> GetRunIncarnation(std::string_view name);
  // All runs by id, without generations or ranks.
  absl::StatusOr<std::vector<v1::Run>> ListRuns();
  // Any state but RUN_STATE_UNSPECIFIED.
  absl::Status SetRunState(std::string_view name, v1::RunState state);
  absl::Status UpdateRunProgress(std::string_view name, int64_t last_step);
  // Replaces the run's spec (an admin mapping a run to a launch profile).
  absl::Status SetRunSpec(std::string_view name, const v1::RunSpec& spec);
  // Records the data order the run's workers train with and the steps their
  // schedule runs (0 = unknown), as reported in their hello; GetRun and
  // ListRuns return them in `data_order` and `total_steps`. Replaces what
  // was recorded before.
  absl::Status SetRunDataOrder(std::string_view name, const v1::DataOrder& order,
                               int64_t total_steps);

  // --- Generations ----------------------------------------------------------
  // g.generation <= 0 assigns the next number. The parent must exist. Also
  // makes it the run's current generation.
  absl::StatusOr<v1::Generation> CreateGeneration(std::string_view run, const v1::Generation& g);
  absl::StatusOr<std::vector<v1::Generation>> ListGenerations(std::string_view run);

  // --- Checkpoints ----------------------------------------------------------
  // Keyed by (run, step, uri). A later report updates the descriptive fields;
  // `complete` only ever goes from false to true, `pinned` and
  // `created_unix_ms` keep their first values, an empty checksum or zero bytes
  // does not erase a known one.
  //
  // `file_identity` is what the daemon saw of the checkpoint's file as it
  // was registered (CheckpointGuard: device, inode, size, modification and
  // change times; opaque here): given, it is stored; not given, it stays,
  // unless the report brings another checksum (then another file: cleared).
  absl::StatusOr<v1::Checkpoint> UpsertCheckpoint(
      const v1::Checkpoint& c, std::optional<std::string_view> file_identity = std::nullopt);
  // The file identity stored with (run, step, uri), "" when none;
  // NOT_FOUND when there is no such checkpoint. Set replaces it.
  absl::StatusOr<std::string> CheckpointFileIdentity(std::string_view run, int64_t step,
                                                     std::string_view uri);
  absl::Status SetCheckpointFileIdentity(std::string_view run, int64_t step, std::string_view uri,
                                         std::string_view file_identity);
  // By step, then uri.
  absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(std::string_view run);
  // Pins/unpins every checkpoint of the run at `step`; returns the first.
  absl::StatusOr<v1::Checkpoint> PinCheckpoint(std::string_view run, int64_t step, bool pinned);
  // Makes (step, uri) the run's one rolling pin (Checkpoint.rolling_pin) and
  // releases any other; a (step, uri) the run does not have releases them
  // all. Independent of PinCheckpoint's pins.
  absl::Status SetRollingPin(std::string_view run, int64_t step, std::string_view uri);
  // Forgets the checkpoint (run, step, uri) whose file is gone (the worker's
  // retention deleted it), pinned or not: ListCheckpoints no longer returns
  // it. True when it was known; false (not an error) when it was not, so a
  // resent deletion notice is harmless. A later UpsertCheckpoint of the same
  // key registers it afresh.
  absl::StatusOr<bool> DeleteCheckpoint(std::string_view run, int64_t step, std::string_view uri);

  // --- Manifests ------------------------------------------------------------
  // Immutable once written: the same content again is OK, different content
  // under the same version is ALREADY_EXISTS.
  absl::Status PutManifest(std::string_view run, const v1::Manifest& m);
  absl::StatusOr<v1::Manifest> GetManifest(std::string_view run, int64_t version);

  // --- Telemetry ------------------------------------------------------------
  // One transaction per call; see the header comment.
  absl::StatusOr<IngestResult> IngestReports(std::string_view run, int64_t generation,
                                             uint32_t rank,
                                             std::span<const v1::StepReport> reports);
  // A write transaction over the stores, for a writer whose writes span
  // several of them in one commit (the ingest stage's group commit,
  // daemon/ingest/group_commit.h). It holds the catalog's lock from
  // BeginWrite until it is destroyed: BEGIN IMMEDIATE, COMMIT in Commit, a
  // rollback if it was not committed. Every other catalog call waits
  // meanwhile, so a writer keeps it short and waits for nothing while it
  // holds it. The catalog calls nothing of the writer's.
  class Writer {
   public:
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;

    RunStore& runs();
    StepStore& steps();
    absl::Status Commit();

   private:
    friend class Catalog;
    explicit Writer(Catalog* catalog) : catalog_(catalog) {}
    Catalog* const catalog_;
    std::optional<Transaction> txn_;
  };
  absl::StatusOr<std::unique_ptr<Writer>> BeginWrite();
  // Counts the writes that change a run's configuration as the daemon reads
  // it (CreateRun, PutPolicy, SetRunSpec), bumped after each commits; read
  // without the catalog's lock, so a cache of policies and world sizes
  // knows when to read again.
  int64_t config_version() const { return config_version_.load(std::memory_order_acquire); }
  // A checkpoint of the write-ahead log if it is due (Database::
  // CheckpointIfDue); true when one ran. For deferred checkpoints: call it
  // when no commit is waited on.
  absl::StatusOr<bool> CheckpointIfDue();
  // Pages in the write-ahead log as of the last commit (Database::wal_pages).
  int64_t wal_pages();
  // The rank's high-water mark in the generation, -1 if none.
  absl::StatusOr<int64_t> CommittedStep(std::string_view run, int64_t generation, uint32_t rank);
  // Records with from_step <= step <= to_step, by step; limit <= 0 or above
  // kMaxQueryLimit means kMaxQueryLimit.
  absl::StatusOr<std::vector<v1::StepRecord>> QueryTelemetry(std::string_view run,
                                                             int64_t generation, int64_t from_step,
                                                             std::optional<int64_t> to_step,
                                                             int limit);
  // Per rank, its progress in the newest generation it reported in; by rank.
  absl::StatusOr<std::vector<v1::RankState>> ListRankProgress(std::string_view run);

  // --- Incidents ------------------------------------------------------------
  // Assigns and returns the id; inc.id is ignored, inc.run is set to `run`.
  absl::StatusOr<int64_t> CreateIncident(std::string_view run, const v1::Incident& inc);
  // Replaces the stored record of inc.id (its run cannot change).
  absl::Status UpdateIncident(const v1::Incident& inc);
  // The record as last written; the event log is read with ListIncidentEvents.
  absl::StatusOr<v1::Incident> GetIncident(int64_t id);
  // By id (= opening order).
  absl::StatusOr<std::vector<v1::Incident>> ListIncidents(const IncidentFilter& filter);

  // Append-only; returns the event's seq.
  absl::StatusOr<int64_t> AppendIncidentEvent(int64_t incident_id, std::string_view kind,
                                              std::string_view payload);
  // One transaction (one fsync) for what an incident's step records: the
  // event, then the record as `updated(seq)` returns it (called with the
  // catalog's lock held: it must not call the catalog). Returns the seq.
  using IncidentUpdateFn = IncidentStore::IncidentUpdateFn;
  absl::StatusOr<int64_t> AppendIncidentEventAndUpdate(int64_t incident_id, std::string_view kind,
                                                       std::string_view payload,
                                                       const IncidentUpdateFn& updated);
  // CreateIncident and its first event in one transaction: `updated(id,
  // seq)` returns the record to store. Returns the id.
  using NewIncidentFn = IncidentStore::NewIncidentFn;
  absl::StatusOr<int64_t> CreateIncidentWithEvent(std::string_view run, const v1::Incident& inc,
                                                  std::string_view kind, std::string_view payload,
                                                  const NewIncidentFn& updated);
  // In append order.
  absl::StatusOr<std::vector<StoredEvent>> ListIncidentEvents(int64_t incident_id);

  // --- Precursor warnings ---------------------------------------------------
  // Assigns and returns the id; w.id is ignored, w.run names the run
  // (NOT_FOUND when unknown); opened_unix_ms and updated_unix_ms default to
  // now.
  absl::StatusOr<int64_t> CreateWarning(const v1::PrecursorWarning& w);
  // Replaces the stored record of w.id (its run cannot change);
  // updated_unix_ms becomes now. An incident_id must name an incident.
  absl::Status UpdateWarning(const v1::PrecursorWarning& w);
  absl::StatusOr<v1::PrecursorWarning> GetWarning(int64_t id);
  // By id (= opening order).
  absl::StatusOr<std::vector<v1::PrecursorWarning>> ListWarnings(const WarningFilter& filter);

  // --- Commands -------------------------------------------------------------
  // Idempotent: the same id with the same run, generation, kind and payload is
  // OK and leaves the stored state alone; other content is ALREADY_EXISTS.
  absl::Status PutCommand(std::string_view id, std::string_view run, int64_t generation,
                          std::string_view kind, std::string_view payload,
                          v1::CommandState state = v1::COMMAND_PENDING);
  // COMMAND_ACKED and COMMAND_FAILED are final: moving out of them is
  // FAILED_PRECONDITION (setting the same final state again is OK).
  absl::Status UpdateCommandState(std::string_view id, v1::CommandState state,
                                  std::string_view message = "");
  absl::StatusOr<StoredCommand> GetCommand(std::string_view id);
  // COMMAND_STATE_UNSPECIFIED: all. In creation order.
  absl::StatusOr<std::vector<StoredCommand>> ListCommands(
      std::string_view run, v1::CommandState state = v1::COMMAND_STATE_UNSPECIFIED);

  // --- Quarantine -----------------------------------------------------------
  // Idempotent by (run, domain, document_id): returns the stored entry, which
  // keeps its first reason and incident. incident_id 0 means none.
  absl::StatusOr<v1::QuarantineEntry> AddQuarantine(const v1::QuarantineEntry& entry);
  // By domain, then document id.
  absl::StatusOr<std::vector<v1::QuarantineEntry>> ListQuarantine(std::string_view run);

  // --- Audit ----------------------------------------------------------------
  absl::StatusOr<int64_t> AppendAudit(std::string_view actor, std::string_view action,
                                      std::string_view target, std::string_view detail);
  // The newest `limit` entries (all if limit <= 0), newest first.
  absl::StatusOr<std::vector<AuditEntry>> ListAudit(int limit);
  // A call as the daemon's audit interceptor saw it (principal, role, rpc,
  // run, outcome, detail, peer); unix_ms 0 = now. Returns the row's id.
  absl::StatusOr<int64_t> AppendAudit(const v1::AuditEntry& entry);
  // Newest first, at most `limit` (<= 0: all), with id < `before_id` when
  // before_id > 0; empty run / principal: any.
  using AuditQuery = storage::AuditQuery;
  absl::StatusOr<std::vector<v1::AuditEntry>> QueryAudit(const AuditQuery& query);

  // --- Policies: per run name; "" is the daemon-wide default ---------------
  absl::Status PutPolicy(std::string_view scope, const v1::Policy& policy);
  // NOT_FOUND when none was set for `scope`.
  absl::StatusOr<v1::Policy> GetPolicy(std::string_view scope);

  // --- Launches: what a launcher started (adopted after a restart) -------
  // Insert or replace the (run, slot) record.
  absl::Status PutLaunch(const LaunchRecord& record);
  // Every record, ordered by run and slot.
  absl::StatusOr<std::vector<LaunchRecord>> ListLaunches();
  // Drops the run's records (all slots when `slot` is empty).
  absl::Status DeleteLaunches(std::string_view run, std::string_view slot = "");
  // A launcher's end of a run, in one transaction: the run's state becomes
  // `state` (RUN_FINISHED, RUN_FAILED, ...) and its launch records in `slot`
  // (all slots when empty) go. Whoever reads the state over finds nothing
  // left to adopt, and a daemon that dies cannot leave a run that is still
  // running with no record of its job.
  absl::Status EndRun(std::string_view run, v1::RunState state, std::string_view slot = "");

 private:
  Catalog(std::unique_ptr<Database> db, std::string path, Clock* clock);

  absl::StatusOr<v1::Run> GetRunLocked(std::string_view name, bool with_ranks = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::unique_ptr<Database> db_ ABSL_GUARDED_BY(mu_);
  // One store per concern, each over db_ (their SQL; the lock and the
  // transactions are the catalog's).
  RunStore runs_ ABSL_GUARDED_BY(mu_);
  StepStore steps_ ABSL_GUARDED_BY(mu_);
  CheckpointStore checkpoints_ ABSL_GUARDED_BY(mu_);
  ManifestStore manifests_ ABSL_GUARDED_BY(mu_);
  IncidentStore incidents_ ABSL_GUARDED_BY(mu_);
  WarningStore warnings_ ABSL_GUARDED_BY(mu_);
  CommandStore commands_ ABSL_GUARDED_BY(mu_);
  QuarantineStore quarantine_ ABSL_GUARDED_BY(mu_);
  AuditStore audit_ ABSL_GUARDED_BY(mu_);
  PolicyStore policies_ ABSL_GUARDED_BY(mu_);
  LaunchStore launches_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> config_version_{0};
};

}  // namespace spikeguard::storage
