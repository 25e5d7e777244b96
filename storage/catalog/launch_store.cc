#include "storage/catalog/launch_store.h"

#include "base/status_macros.h"

namespace spikeguard::storage {
namespace {

constexpr char kPutLaunchSql[] =
    "INSERT INTO launches (run, slot, kind, handle, start_ticks, generation, restarts, "
    "updated_unix_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run, slot) DO UPDATE SET "
    "kind = excluded.kind, handle = excluded.handle, start_ticks = excluded.start_ticks, "
    "generation = excluded.generation, restarts = excluded.restarts, "
    "updated_unix_ms = excluded.updated_unix_ms";
constexpr char kListLaunchesSql[] =
    "SELECT run, slot, kind, handle, start_ticks, generation, restarts, updated_unix_ms "
    "FROM launches ORDER BY run, slot";
constexpr char kDeleteRunLaunchesSql[] = "DELETE FROM launches WHERE run = ?";
constexpr char kDeleteSlotLaunchSql[] = "DELETE FROM launches WHERE run = ? AND slot = ?";

}  // namespace

absl::Status LaunchStore::Put(const LaunchRecord& r) {
  SG_ASSIGN_OR_RETURN(Statement put, db_->Prepare(kPutLaunchSql));
  put.BindText(1, r.run)
      .BindText(2, r.slot)
      .BindText(3, r.kind)
      .BindInt64(4, r.handle)
      .BindInt64(5, r.start_ticks)
      .BindInt64(6, r.generation)
      .BindInt64(7, r.restarts)
      .BindInt64(8, clock_->NowUnixMillis());
  return put.Run();
}

absl::StatusOr<std::vector<LaunchRecord>> LaunchStore::List() {
  SG_ASSIGN_OR_RETURN(Statement list, db_->Prepare(kListLaunchesSql));
  std::vector<LaunchRecord> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, list.Step());
    if (!row) break;
    LaunchRecord& r = out.emplace_back();
    r.run = list.ColumnText(0);
    r.slot = list.ColumnText(1);
    r.kind = list.ColumnText(2);
    r.handle = list.ColumnInt64(3);
    r.start_ticks = list.ColumnInt64(4);
    r.generation = list.ColumnInt64(5);
    r.restarts = static_cast<int32_t>(list.ColumnInt64(6));
    r.updated_unix_ms = list.ColumnInt64(7);
  }
  return out;
}

absl::Status LaunchStore::Delete(std::string_view run, std::string_view slot) {
  SG_ASSIGN_OR_RETURN(Statement del,
                      db_->Prepare(slot.empty() ? kDeleteRunLaunchesSql : kDeleteSlotLaunchSql));
  del.BindText(1, run);
  if (!slot.empty()) del.BindText(2, slot);
  return del.Run();
}

}  // namespace spikeguard::storage
