#include "storage/catalog/warning_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/catalog/store_util.h"

namespace spikeguard::storage {
namespace {

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

absl::StatusOr<v1::PrecursorWarning> ReadWarningRow(const Statement& row) {
  const int64_t id = row.ColumnInt64(0);
  SG_ASSIGN_OR_RETURN(v1::PrecursorWarning w,
                      internal::Parse<v1::PrecursorWarning>(
                          row.ColumnBlob(2), absl::StrCat("precursor warning ", id)));
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

absl::StatusOr<int64_t> WarningStore::Create(const v1::PrecursorWarning& w) {
  SG_RETURN_IF_ERROR(CheckWarning(w));
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, w.run()));
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
      .BindBlob(10, internal::Serialize(record));
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::Status WarningStore::Update(const v1::PrecursorWarning& w) {
  SG_RETURN_IF_ERROR(CheckWarning(w));
  SG_ASSIGN_OR_RETURN(v1::PrecursorWarning stored, Get(w.id()));
  if (!w.run().empty() && w.run() != stored.run()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "precursor warning ", w.id(), " belongs to run '", stored.run(), "', not '", w.run(), "'"));
  }
  if (w.incident_id() > 0) SG_RETURN_IF_ERROR(internal::RequireIncident(*db_, w.incident_id()));
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
  update.BindInt64(7, record.updated_unix_ms())
      .BindBlob(8, internal::Serialize(record))
      .BindInt64(9, w.id());
  return update.Run();
}

absl::StatusOr<v1::PrecursorWarning> WarningStore::Get(int64_t id) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectWarningSql));
  select.BindInt64(1, id);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("precursor warning ", id, " not found"));
  return ReadWarningRow(select);
}

absl::StatusOr<std::vector<v1::PrecursorWarning>> WarningStore::List(const WarningFilter& filter) {
  if (!filter.run.empty()) SG_RETURN_IF_ERROR(internal::RunId(*db_, filter.run).status());
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

}  // namespace spikeguard::storage
