// database.h
// -----------------------------------------------------------------------------
// `Database` is the one owner of a `sqlite3*` connection in spikeguard. It sets
// every PRAGMA (foreign keys, busy timeout, synchronous level, WAL), caches
// prepared statements by their SQL text, and turns SQLite errors into
// `absl::Status` values that carry SQLite's message and the statement.
//
// `Statement` is an RAII handle on a cached prepared statement: destroying it
// resets the statement and clears its bindings, so the next user starts clean.
// `Transaction` issues `BEGIN IMMEDIATE` and rolls back unless `Commit()` was
// called and succeeded.
//
//   SG_ASSIGN_OR_RETURN(auto db, Database::Open({.path = "/var/lib/sg.db"}));
//   SG_RETURN_IF_ERROR(db->EnableWriteAheadLog());
//   SG_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db.get()));
//   {
//     SG_ASSIGN_OR_RETURN(Statement insert, db->Prepare(kInsertRunSql));
//     insert.BindText(1, name).BindInt64(2, now_ms);
//     SG_RETURN_IF_ERROR(insert.Run());
//   }
//   SG_RETURN_IF_ERROR(txn.Commit());
//
// Error codes follow absl's rule: SQLITE_BUSY/LOCKED -> UNAVAILABLE (retry the
// same call), UNIQUE/PRIMARY KEY -> ALREADY_EXISTS, FOREIGN KEY -> FAILED_
// PRECONDITION, NOT NULL/CHECK -> INVALID_ARGUMENT, corruption -> DATA_LOSS,
// disk full -> RESOURCE_EXHAUSTED, anything else -> INTERNAL.
//
// A `Database` is not thread-safe: its owner (the `Catalog`) serializes calls.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct sqlite3;
struct sqlite3_stmt;

namespace spikeguard::storage {

class Database;

struct DatabaseOptions {
  // A file path, or ":memory:" for a private in-memory database.
  std::string path;
  // synchronous=FULL (fsync on every commit) when true, NORMAL otherwise.
  bool synchronous_full = true;
  // How long a statement waits for another connection's lock.
  absl::Duration busy_timeout = absl::Seconds(5);
  // Write-ahead log checkpoints (copying the log into the database file).
  // By default, SQLite's own rule: the commit that takes the log to
  // `checkpoint_pages` pages runs the checkpoint before it returns. With
  // `deferred_checkpoints`, that commit returns at once and the checkpoint
  // waits for the owner's `CheckpointIfDue` (a moment when no one waits on
  // a commit); only a log that reaches `kDeferredLimit` times
  // `checkpoint_pages` is checkpointed inside a commit, so a log no one
  // checkpoints stays bounded.
  int64_t checkpoint_pages = 1000;
  bool deferred_checkpoints = false;
  static constexpr int64_t kDeferredLimit = 4;
};

// A prepared statement in use. Bind indices are 1-based, column indices
// 0-based, as in SQLite. A bind error is remembered and returned by the next
// `Step()`/`Run()`, so binds can be chained.
class Statement {
 public:
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;
  ~Statement();

  Statement& BindInt64(int index, int64_t value);
  // NaN becomes NULL (SQLite has no NaN); use a BLOB for values that must
  // round-trip bit-exactly.
  Statement& BindDouble(int index, double value);
  Statement& BindBool(int index, bool value) { return BindInt64(index, value ? 1 : 0); }
  Statement& BindText(int index, std::string_view value);
  Statement& BindBlob(int index, std::string_view value);
  Statement& BindNull(int index);

  // Advances to the next row: true when a row is available, false when done.
  absl::StatusOr<bool> Step();
  // Steps to completion, ignoring rows; for INSERT/UPDATE/DELETE.
  absl::Status Run();

  int64_t ColumnInt64(int col) const;
  double ColumnDouble(int col) const;
  bool ColumnBool(int col) const { return ColumnInt64(col) != 0; }
  bool ColumnIsNull(int col) const;
  std::string ColumnText(int col) const;
  std::string ColumnBlob(int col) const;

 private:
  friend class Database;
  Statement(Database* db, sqlite3_stmt* stmt, bool* in_use);
  void NoteBind(int rc, int index);

  Database* db_;
  sqlite3_stmt* stmt_;
  // Points into the cache entry; null for a one-off statement that is
  // finalized on destruction.
  bool* in_use_;
  absl::Status bind_status_;
};

class Database {
 public:
  // Opens (creating if needed) the database and sets the connection PRAGMAs:
  // foreign_keys=ON, busy_timeout, synchronous. Writes nothing to the file,
  // so a caller can inspect `UserVersion()` before deciding to touch it.
  static absl::StatusOr<std::unique_ptr<Database>> Open(const DatabaseOptions& options);

  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // PRAGMA journal_mode=WAL. Writes the file header, so call it only once the
  // file is known to be ours. In-memory databases keep their memory journal.
  // Checkpoints then follow DatabaseOptions' rule.
  absl::Status EnableWriteAheadLog();

  // Pages in the write-ahead log as of the last commit; 0 before any, and
  // after a checkpoint that copied all of it (the next commit starts the log
  // over).
  int64_t wal_pages() const { return wal_pages_; }
  // A passive checkpoint (it waits for no reader or writer) when the log
  // holds `checkpoint_pages` pages or more. True when one ran.
  absl::StatusOr<bool> CheckpointIfDue();

  // Returns the cached statement for `sql`, preparing it on first use. If the
  // cached one is still held by another `Statement`, a one-off is prepared.
  absl::StatusOr<Statement> Prepare(std::string_view sql);

  // Runs one or more statements without bindings (DDL, PRAGMAs).
  absl::Status Execute(std::string_view sql);

  absl::StatusOr<int> UserVersion();
  absl::Status SetUserVersion(int version);

  int64_t LastInsertRowId() const;
  // Rows changed by the most recent INSERT/UPDATE/DELETE.
  int Changes() const;
  bool InTransaction() const;

  const std::string& path() const { return path_; }

  // The status for SQLite result `rc`, with SQLite's message and `sql`.
  absl::Status Error(int rc, std::string_view sql) const;

 private:
  struct CachedStatement {
    sqlite3_stmt* stmt = nullptr;
    bool in_use = false;
  };

  Database(sqlite3* db, std::string path, const DatabaseOptions& options)
      : db_(db),
        path_(std::move(path)),
        checkpoint_pages_(std::max<int64_t>(1, options.checkpoint_pages)),
        deferred_checkpoints_(options.deferred_checkpoints) {}
  // sqlite3_wal_hook: runs after every commit in WAL mode.
  static int OnWalCommit(void* self, sqlite3* db, const char* schema, int pages);
  // Checkpoints `schema`; notes an emptied log.
  absl::Status Checkpoint(const char* schema);

  sqlite3* db_;
  std::string path_;
  const int64_t checkpoint_pages_;
  const bool deferred_checkpoints_;
  int64_t wal_pages_ = 0;
  // Node-based so `&entry.in_use` stays valid while the map grows.
  absl::node_hash_map<std::string, CachedStatement> cache_;
};

// BEGIN IMMEDIATE ... COMMIT. Takes the write lock up front so a transaction
// never fails half-way with SQLITE_BUSY on upgrade from a read lock.
class Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(Database* db);
  Transaction(Transaction&& other) noexcept;
  Transaction& operator=(Transaction&&) = delete;
  // Rolls back unless committed.
  ~Transaction();

  absl::Status Commit();

 private:
  explicit Transaction(Database* db) : db_(db) {}
  Database* db_;  // null once committed or moved from
};

}  // namespace spikeguard::storage
