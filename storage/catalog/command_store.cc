#include "storage/catalog/command_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "proto/state_names.h"
#include "storage/catalog/store_util.h"

namespace spikeguard::storage {
namespace {

using internal::Sv;

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

absl::StatusOr<StoredCommand> ReadCommandRow(const Statement& row) {
  StoredCommand c;
  c.id = row.ColumnText(0);
  c.run = row.ColumnText(1);
  c.generation = row.ColumnInt64(2);
  c.kind = row.ColumnText(3);
  c.payload = row.ColumnBlob(4);
  const std::string state = row.ColumnText(5);
  std::optional<v1::CommandState> parsed = ParseCommandState(state);
  if (!parsed) {
    return absl::DataLossError(absl::StrCat("command '", c.id, "' of run '", c.run, "' has state '",
                                            state, "' in the catalog, which is not a command state"));
  }
  c.state = *parsed;
  c.message = row.ColumnText(6);
  c.created_unix_ms = row.ColumnInt64(7);
  c.updated_unix_ms = row.ColumnInt64(8);
  return c;
}

// The stored name of a command state (CommandStateName).
absl::StatusOr<std::string_view> StoredName(v1::CommandState state) {
  if (!v1::CommandState_IsValid(state) || state == v1::COMMAND_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat("command state ", static_cast<int>(state),
                                                   " is not a command state"));
  }
  return CommandStateName(state);
}

}  // namespace

absl::Status CommandStore::Put(std::string_view id, std::string_view run, int64_t generation,
                               std::string_view kind, std::string_view payload,
                               v1::CommandState state) {
  if (id.empty()) return absl::InvalidArgumentError("command id is empty");
  SG_ASSIGN_OR_RETURN(std::string_view stored, StoredName(state));
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  if (absl::StatusOr<StoredCommand> existing = Get(id); existing.ok()) {
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
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertCommandSql));
  insert.BindText(1, id)
      .BindInt64(2, run_id)
      .BindInt64(3, generation)
      .BindText(4, kind)
      .BindBlob(5, payload)
      .BindText(6, stored)
      .BindInt64(7, now)
      .BindInt64(8, now);
  return insert.Run();
}

absl::Status CommandStore::SetState(std::string_view id, v1::CommandState state,
                                    std::string_view message) {
  SG_ASSIGN_OR_RETURN(std::string_view stored, StoredName(state));
  SG_ASSIGN_OR_RETURN(StoredCommand existing, Get(id));
  if (CommandFinal(existing.state)) {
    if (existing.state == state) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("command '", Sv(id), "' is already ", Sv(CommandStateName(existing.state)),
                     "; cannot become ", Sv(stored)));
  }
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateCommandStateSql));
  update.BindText(1, stored)
      .BindText(2, message)
      .BindInt64(3, clock_->NowUnixMillis())
      .BindText(4, id);
  return update.Run();
}

absl::StatusOr<StoredCommand> CommandStore::Get(std::string_view id) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectCommandSql));
  select.BindText(1, id);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("command '", Sv(id), "' not found"));
  return ReadCommandRow(select);
}

absl::StatusOr<std::vector<StoredCommand>> CommandStore::List(std::string_view run,
                                                              v1::CommandState state) {
  std::string_view stored = "";  // every state (a null view would bind NULL)
  if (state != v1::COMMAND_STATE_UNSPECIFIED) {
    SG_ASSIGN_OR_RETURN(stored, StoredName(state));
  }
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListCommandsSql));
  select.BindInt64(1, run_id).BindText(2, stored);
  std::vector<StoredCommand> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    SG_ASSIGN_OR_RETURN(out.emplace_back(), ReadCommandRow(select));
  }
  return out;
}

}  // namespace spikeguard::storage
