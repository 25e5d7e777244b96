#include "storage/catalog/checkpoint_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/catalog/store_util.h"

namespace spikeguard::storage {
namespace {

using internal::Sv;

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

std::string NoCheckpoint(std::string_view run, int64_t step, std::string_view uri) {
  return absl::StrCat("run '", Sv(run), "' has no checkpoint at step ", step, " named '", Sv(uri),
                      "'");
}

}  // namespace

absl::StatusOr<v1::Checkpoint> CheckpointStore::Upsert(
    const v1::Checkpoint& c, std::optional<std::string_view> file_identity) {
  if (c.uri().empty()) return absl::InvalidArgumentError("checkpoint.uri is empty");
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, c.run()));
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
  SG_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> at_step, Select(run_id, c.run(), c.step()));
  for (v1::Checkpoint& stored : at_step) {
    if (stored.uri() == c.uri()) return std::move(stored);
  }
  return absl::InternalError("checkpoint vanished after upsert");
}

absl::StatusOr<std::string> CheckpointStore::FileIdentity(std::string_view run, int64_t step,
                                                          std::string_view uri) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectCheckpointFileIdentitySql));
  select.BindInt64(1, run_id).BindInt64(2, step).BindText(3, uri);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(NoCheckpoint(run, step, uri));
  return select.ColumnText(0);
}

absl::Status CheckpointStore::SetFileIdentity(std::string_view run, int64_t step,
                                              std::string_view uri,
                                              std::string_view file_identity) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kSetCheckpointFileIdentitySql));
  update.BindText(1, file_identity).BindInt64(2, run_id).BindInt64(3, step).BindText(4, uri);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(NoCheckpoint(run, step, uri));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Checkpoint>> CheckpointStore::List(std::string_view run) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  return Select(run_id, run, std::nullopt);
}

absl::StatusOr<v1::Checkpoint> CheckpointStore::Pin(std::string_view run, int64_t step,
                                                    bool pinned) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  {
    SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kPinCheckpointSql));
    update.BindBool(1, pinned).BindInt64(2, run_id).BindInt64(3, step);
    SG_RETURN_IF_ERROR(update.Run());
  }
  if (db_->Changes() == 0) {
    return absl::NotFoundError(absl::StrCat("run '", Sv(run), "' has no checkpoint at step ", step));
  }
  SG_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> at_step, Select(run_id, run, step));
  return std::move(at_step.front());
}

absl::Status CheckpointStore::SetRollingPin(std::string_view run, int64_t step,
                                            std::string_view uri) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kSetRollingPinSql));
  update.BindInt64(1, run_id).BindInt64(2, step).BindText(3, uri);
  return update.Run();
}

absl::StatusOr<bool> CheckpointStore::Delete(std::string_view run, int64_t step,
                                             std::string_view uri) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  SG_ASSIGN_OR_RETURN(Statement del, db_->Prepare(kDeleteCheckpointSql));
  del.BindInt64(1, run_id).BindInt64(2, step).BindText(3, uri);
  SG_RETURN_IF_ERROR(del.Run());
  return db_->Changes() > 0;
}

absl::StatusOr<std::vector<v1::Checkpoint>> CheckpointStore::Select(int64_t run_id,
                                                                    std::string_view run,
                                                                    std::optional<int64_t> step) {
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

}  // namespace spikeguard::storage
