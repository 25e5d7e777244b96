#include "storage/catalog/database.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace spikeguard::storage {
namespace {

// Debian's Abseil is built with its own string_view type, which does not
// convert from std::string_view.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::StatusCode CodeFor(int extended_rc) {
  switch (extended_rc) {
    case SQLITE_CONSTRAINT_UNIQUE:
    case SQLITE_CONSTRAINT_PRIMARYKEY:
      return absl::StatusCode::kAlreadyExists;
    case SQLITE_CONSTRAINT_FOREIGNKEY:
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_CONSTRAINT_NOTNULL:
    case SQLITE_CONSTRAINT_CHECK:
      return absl::StatusCode::kInvalidArgument;
    default:
      break;
  }
  switch (extended_rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
      return absl::StatusCode::kUnavailable;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kDataLoss;
    case SQLITE_FULL:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_CONSTRAINT:  // RAISE(ABORT) in a trigger, other constraints
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

// What the OS said, when SQLite's error came from a system call (a
// read-only or full file system, a permission): "" otherwise.
std::string SystemCause(sqlite3* db) {
  const int err = db != nullptr ? sqlite3_system_errno(db) : 0;
  if (err == 0) return "";
  return absl::StrCat(" [", std::strerror(err), "]");
}

}  // namespace

// ---------------------------------------------------------------------------
// Statement

Statement::Statement(Database* db, sqlite3_stmt* stmt, bool* in_use)
    : db_(db), stmt_(stmt), in_use_(in_use) {}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_),
      stmt_(std::exchange(other.stmt_, nullptr)),
      in_use_(std::exchange(other.in_use_, nullptr)),
      bind_status_(std::move(other.bind_status_)) {}

Statement::~Statement() {
  if (stmt_ == nullptr) return;
  if (in_use_ == nullptr) {
    sqlite3_finalize(stmt_);
    return;
  }
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  *in_use_ = false;
}

void Statement::NoteBind(int rc, int index) {
  if (rc == SQLITE_OK || !bind_status_.ok()) return;
  bind_status_ = db_->Error(rc, absl::StrCat("binding parameter ", index, " of ",
                                             sqlite3_sql(stmt_)));
}

Statement& Statement::BindInt64(int index, int64_t value) {
  NoteBind(sqlite3_bind_int64(stmt_, index, value), index);
  return *this;
}

Statement& Statement::BindDouble(int index, double value) {
  if (std::isnan(value)) return BindNull(index);
  NoteBind(sqlite3_bind_double(stmt_, index, value), index);
  return *this;
}

Statement& Statement::BindText(int index, std::string_view value) {
  NoteBind(sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT,
                               SQLITE_UTF8),
           index);
  return *this;
}

Statement& Statement::BindBlob(int index, std::string_view value) {
  // A zero-length blob must stay a blob, not NULL (which NOT NULL refuses).
  if (value.empty()) {
    NoteBind(sqlite3_bind_zeroblob(stmt_, index, 0), index);
  } else {
    NoteBind(sqlite3_bind_blob64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT),
             index);
  }
  return *this;
}

Statement& Statement::BindNull(int index) {
  NoteBind(sqlite3_bind_null(stmt_, index), index);
  return *this;
}

absl::StatusOr<bool> Statement::Step() {
  if (!bind_status_.ok()) return bind_status_;
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Error(rc, sqlite3_sql(stmt_));
}

absl::Status Statement::Run() {
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return absl::OkStatus();
  }
}

int64_t Statement::ColumnInt64(int col) const { return sqlite3_column_int64(stmt_, col); }
double Statement::ColumnDouble(int col) const { return sqlite3_column_double(stmt_, col); }
bool Statement::ColumnIsNull(int col) const {
  return sqlite3_column_type(stmt_, col) == SQLITE_NULL;
}

std::string Statement::ColumnText(int col) const {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
  const int n = sqlite3_column_bytes(stmt_, col);
  return text == nullptr ? std::string() : std::string(text, n);
}

std::string Statement::ColumnBlob(int col) const {
  const auto* blob = static_cast<const char*>(sqlite3_column_blob(stmt_, col));
  const int n = sqlite3_column_bytes(stmt_, col);
  return blob == nullptr ? std::string() : std::string(blob, n);
}

// ---------------------------------------------------------------------------
// Database

absl::StatusOr<std::unique_ptr<Database>> Database::Open(const DatabaseOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("catalog path is empty");
  }
  // The catalog holds the audit log and what every run did: owner-only.
  // Made here, not by SQLite (which uses the umask, 0644 as a rule); its
  // -wal and -shm files take the database's mode. An existing file is
  // tightened. Opening it first also names the real cause of a failure (a
  // read-only file system, a permission) instead of SQLite's guess.
  if (options.path != ":memory:" && options.path.rfind("file:", 0) != 0) {
    const int fd = ::open(options.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      const int err = errno;
      return absl::Status(err == ENOSPC ? absl::StatusCode::kResourceExhausted
                                        : absl::StatusCode::kFailedPrecondition,
                          absl::StrCat("cannot open catalog ", options.path, ": ", std::strerror(err)));
    }
    struct stat st;
    if (::fstat(fd, &st) == 0 && (st.st_mode & 077) != 0) ::fchmod(fd, st.st_mode & 0700);
    ::close(fd);
  }
  sqlite3* raw = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  const int rc = sqlite3_open_v2(options.path.c_str(), &raw, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    const std::string cause = SystemCause(raw);
    sqlite3_close(raw);
    return absl::Status(CodeFor(rc), absl::StrCat("cannot open catalog ", options.path, ": ",
                                                  message, cause));
  }
  std::unique_ptr<Database> db(new Database(raw, options.path, options));
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, static_cast<int>(absl::ToInt64Milliseconds(options.busy_timeout)));
  SG_RETURN_IF_ERROR(db->Execute("PRAGMA foreign_keys = ON"));
  SG_RETURN_IF_ERROR(db->Execute(options.synchronous_full ? "PRAGMA synchronous = FULL"
                                                          : "PRAGMA synchronous = NORMAL"));
  // A file that is not a database fails here rather than on first use.
  SG_RETURN_IF_ERROR(db->UserVersion().status());
  return db;
}

Database::~Database() {
  for (auto& [sql, entry] : cache_) sqlite3_finalize(entry.stmt);
  // close_v2 defers the close until any one-off statement is finalized.
  sqlite3_close_v2(db_);
}

absl::Status Database::EnableWriteAheadLog() {
  SG_ASSIGN_OR_RETURN(Statement pragma, Prepare("PRAGMA journal_mode = WAL"));
  SG_ASSIGN_OR_RETURN(bool row, pragma.Step());
  const std::string mode = row ? absl::AsciiStrToLower(pragma.ColumnText(0)) : "";
  if (mode == "wal") {
    // Replaces SQLite's autocheckpoint (itself a WAL hook) with ours.
    sqlite3_wal_hook(db_, &Database::OnWalCommit, this);
    return absl::OkStatus();
  }
  if (mode == "memory") return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("catalog ", path_, " cannot use write-ahead logging (journal mode is '",
                   mode, "')"));
}

int Database::OnWalCommit(void* self, sqlite3* /*db*/, const char* schema, int pages) {
  auto* db = static_cast<Database*>(self);
  db->wal_pages_ = pages;
  const int64_t limit = db->deferred_checkpoints_
                            ? db->checkpoint_pages_ * DatabaseOptions::kDeferredLimit
                            : db->checkpoint_pages_;
  // As SQLite's own hook: the commit is durable whatever the checkpoint
  // does; a failed one is retried at the next commit past the limit.
  if (pages >= limit) db->Checkpoint(schema).IgnoreError();
  return SQLITE_OK;
}

absl::Status Database::Checkpoint(const char* schema) {
  int log = 0;
  int copied = 0;
  const int rc = sqlite3_wal_checkpoint_v2(db_, schema, SQLITE_CHECKPOINT_PASSIVE, &log, &copied);
  // BUSY: another connection is checkpointing; the log stays as it is.
  if (rc == SQLITE_BUSY) return absl::OkStatus();
  if (rc != SQLITE_OK) return Error(rc, "PRAGMA wal_checkpoint(PASSIVE)");
  if (log >= 0 && copied >= log) wal_pages_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> Database::CheckpointIfDue() {
  if (wal_pages_ < checkpoint_pages_) return false;
  SG_RETURN_IF_ERROR(Checkpoint("main"));
  return true;
}

absl::StatusOr<Statement> Database::Prepare(std::string_view sql) {
  auto it = cache_.find(Sv(sql));
  if (it == cache_.end()) {
    sqlite3_stmt* stmt = nullptr;
    const int rc =
        sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                           SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) return Error(rc, sql);
    it = cache_.emplace(std::string(sql), CachedStatement{stmt, false}).first;
  }
  if (!it->second.in_use) {
    it->second.in_use = true;
    return Statement(this, it->second.stmt, &it->second.in_use);
  }
  // Re-entrant use of the same SQL (e.g. while iterating): a private copy.
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) return Error(rc, sql);
  return Statement(this, stmt, nullptr);
}

absl::Status Database::Execute(std::string_view sql) {
  const std::string text(sql);
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &message);
  if (rc == SQLITE_OK) return absl::OkStatus();
  std::string detail = message != nullptr ? message : sqlite3_errstr(rc);
  sqlite3_free(message);
  return absl::Status(CodeFor(sqlite3_extended_errcode(db_)),
                      absl::StrCat("catalog ", path_, ": sqlite: ", detail, SystemCause(db_),
                                   " in: ", Sv(sql)));
}

absl::StatusOr<int> Database::UserVersion() {
  SG_ASSIGN_OR_RETURN(Statement pragma, Prepare("PRAGMA user_version"));
  SG_ASSIGN_OR_RETURN(bool row, pragma.Step());
  if (!row) return absl::InternalError("PRAGMA user_version returned no row");
  return static_cast<int>(pragma.ColumnInt64(0));
}

absl::Status Database::SetUserVersion(int version) {
  // PRAGMA arguments cannot be bound; the value is an int we format ourselves.
  return Execute(absl::StrCat("PRAGMA user_version = ", version));
}

int64_t Database::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }
int Database::Changes() const { return sqlite3_changes(db_); }
bool Database::InTransaction() const { return sqlite3_get_autocommit(db_) == 0; }

absl::Status Database::Error(int rc, std::string_view sql) const {
  // Prefer the connection's extended code: the step's own rc may be the
  // primary code only.
  int code = sqlite3_extended_errcode(db_);
  if ((code & 0xff) != (rc & 0xff)) code = rc;
  return absl::Status(CodeFor(code),
                      absl::StrCat("catalog ", path_, ": sqlite: ", sqlite3_errmsg(db_), " (",
                                   sqlite3_errstr(code), ")", SystemCause(db_), " in: ", Sv(sql)));
}

// ---------------------------------------------------------------------------
// Transaction

absl::StatusOr<Transaction> Transaction::Begin(Database* db) {
  SG_RETURN_IF_ERROR(db->Execute("BEGIN IMMEDIATE"));
  return Transaction(db);
}

Transaction::Transaction(Transaction&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}

Transaction::~Transaction() {
  // Some errors (SQLITE_FULL, IOERR) already rolled back; ROLLBACK would fail.
  if (db_ != nullptr && db_->InTransaction()) {
    db_->Execute("ROLLBACK").IgnoreError();
  }
}

absl::Status Transaction::Commit() {
  if (db_ == nullptr) return absl::FailedPreconditionError("transaction already finished");
  SG_RETURN_IF_ERROR(db_->Execute("COMMIT"));
  db_ = nullptr;
  return absl::OkStatus();
}

}  // namespace spikeguard::storage
