#include "storage/catalog/quarantine_store.h"

#include "base/status_macros.h"
#include "storage/catalog/store_util.h"

namespace spikeguard::storage {
namespace {

constexpr char kInsertQuarantineSql[] =
    "INSERT INTO quarantine (run_id, domain, document_id, reason, incident_id, created_unix_ms) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, domain, document_id) DO NOTHING";
constexpr char kSelectQuarantineSql[] =
    "SELECT domain, document_id, reason, incident_id, created_unix_ms FROM quarantine "
    "WHERE run_id = ?1 AND (?2 IS NULL OR (domain = ?2 AND document_id = ?3)) "
    "ORDER BY domain, document_id";

void ReadEntry(const Statement& row, std::string_view run, v1::QuarantineEntry* e) {
  e->set_run(std::string(run));
  e->set_domain(row.ColumnText(0));
  e->set_document_id(row.ColumnInt64(1));
  e->set_reason(row.ColumnText(2));
  e->set_incident_id(row.ColumnInt64(3));  // NULL reads as 0
  e->set_created_unix_ms(row.ColumnInt64(4));
}

}  // namespace

absl::StatusOr<v1::QuarantineEntry> QuarantineStore::Add(const v1::QuarantineEntry& entry) {
  if (entry.domain().empty()) return absl::InvalidArgumentError("entry.domain is empty");
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, entry.run()));
  if (entry.incident_id() != 0) {
    SG_RETURN_IF_ERROR(internal::RequireIncident(*db_, entry.incident_id()));
  }
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
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectQuarantineSql));
  select.BindInt64(1, run_id).BindText(2, entry.domain()).BindInt64(3, entry.document_id());
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::InternalError("quarantine entry vanished after insert");
  v1::QuarantineEntry stored;
  ReadEntry(select, entry.run(), &stored);
  return stored;
}

absl::StatusOr<std::vector<v1::QuarantineEntry>> QuarantineStore::List(std::string_view run) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectQuarantineSql));
  select.BindInt64(1, run_id).BindNull(2).BindNull(3);
  std::vector<v1::QuarantineEntry> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    ReadEntry(select, run, &out.emplace_back());
  }
  return out;
}

}  // namespace spikeguard::storage
