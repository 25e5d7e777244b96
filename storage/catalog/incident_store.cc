#include "storage/catalog/incident_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/catalog/store_util.h"

namespace spikeguard::storage {
namespace {

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
constexpr char kInsertEventSql[] =
    "INSERT INTO incident_events (incident_id, unix_ms, kind, payload) VALUES (?, ?, ?, ?)";
constexpr char kListEventsSql[] =
    "SELECT seq, unix_ms, kind, payload FROM incident_events WHERE incident_id = ? "
    "ORDER BY seq";

absl::StatusOr<v1::Incident> ReadIncidentRow(const Statement& row) {
  const int64_t id = row.ColumnInt64(0);
  SG_ASSIGN_OR_RETURN(v1::Incident incident, internal::Parse<v1::Incident>(
                                                 row.ColumnBlob(2), absl::StrCat("incident ", id)));
  // The columns are the identity; the record may predate them.
  incident.set_id(id);
  incident.set_run(row.ColumnText(1));
  return incident;
}

absl::Status CheckKind(std::string_view kind) {
  if (kind.empty()) return absl::InvalidArgumentError("incident event kind is empty");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> IncidentStore::Create(std::string_view run, const v1::Incident& inc) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
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
      .BindBlob(9, internal::Serialize(record));
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::Status IncidentStore::Update(const v1::Incident& inc) {
  SG_ASSIGN_OR_RETURN(v1::Incident stored, Get(inc.id()));
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
      .BindBlob(8, internal::Serialize(record))
      .BindInt64(9, record.id());
  return update.Run();
}

absl::StatusOr<v1::Incident> IncidentStore::Get(int64_t id) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectIncidentSql));
  select.BindInt64(1, id);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("incident ", id, " not found"));
  return ReadIncidentRow(select);
}

absl::StatusOr<std::vector<v1::Incident>> IncidentStore::List(const IncidentFilter& filter) {
  if (!filter.run.empty()) SG_RETURN_IF_ERROR(internal::RunId(*db_, filter.run).status());
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

absl::StatusOr<int64_t> IncidentStore::AppendEvent(int64_t incident_id, std::string_view kind,
                                                   std::string_view payload) {
  SG_RETURN_IF_ERROR(CheckKind(kind));
  SG_RETURN_IF_ERROR(internal::RequireIncident(*db_, incident_id));
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertEventSql));
  insert.BindInt64(1, incident_id)
      .BindInt64(2, clock_->NowUnixMillis())
      .BindText(3, kind)
      .BindBlob(4, payload);
  SG_RETURN_IF_ERROR(insert.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<int64_t> IncidentStore::Record(int64_t incident_id, std::string_view kind,
                                              std::string_view payload,
                                              const IncidentUpdateFn& updated) {
  SG_ASSIGN_OR_RETURN(int64_t seq, AppendEvent(incident_id, kind, payload));
  const v1::Incident& record = updated(seq);
  if (record.id() != incident_id) {
    return absl::InvalidArgumentError(absl::StrCat("event of incident ", incident_id,
                                                   " would store incident ", record.id()));
  }
  SG_RETURN_IF_ERROR(Update(record));
  return seq;
}

absl::StatusOr<int64_t> IncidentStore::CreateWithEvent(std::string_view run,
                                                       const v1::Incident& inc,
                                                       std::string_view kind,
                                                       std::string_view payload,
                                                       const NewIncidentFn& updated) {
  SG_RETURN_IF_ERROR(CheckKind(kind));
  SG_ASSIGN_OR_RETURN(int64_t id, Create(run, inc));
  SG_RETURN_IF_ERROR(
      Record(id, kind, payload, [&](int64_t seq) -> const v1::Incident& { return updated(id, seq); })
          .status());
  return id;
}

absl::StatusOr<std::vector<StoredEvent>> IncidentStore::Events(int64_t incident_id) {
  SG_RETURN_IF_ERROR(Get(incident_id).status());
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

}  // namespace spikeguard::storage
