#include "storage/catalog/audit_store.h"

#include <limits>

#include "base/status_macros.h"

namespace spikeguard::storage {
namespace {

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

}  // namespace

absl::StatusOr<int64_t> AuditStore::Append(std::string_view actor, std::string_view action,
                                           std::string_view target, std::string_view detail) {
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertAuditSql));
  insert.BindInt64(1, clock_->NowUnixMillis())
      .BindText(2, actor)
      .BindText(3, action)
      .BindText(4, target)
      .BindText(5, detail);
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<int64_t> AuditStore::Append(const v1::AuditEntry& entry) {
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

absl::StatusOr<std::vector<AuditEntry>> AuditStore::List(int limit) {
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

absl::StatusOr<std::vector<v1::AuditEntry>> AuditStore::Query(const AuditQuery& query) {
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

}  // namespace spikeguard::storage
