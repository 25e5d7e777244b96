// launch_store.h
// -----------------------------------------------------------------------------
// What a launcher started for a run (table `launches`), keyed by (run,
// slot): a Slurm job (slot "job") or a local rank's process (slot
// "rank-R", with its pid and start time), its generation and the restarts
// it spent. A restarted daemon reads them back and adopts what still runs.
//
//   LaunchStore launches(db, clock);
//   SG_RETURN_IF_ERROR(launches.Put(record));
//
// Not thread-safe; opens no transaction (see run_store.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

struct LaunchRecord {
  std::string run;
  std::string slot;  // "job" (Slurm) or "rank-R" (local)
  std::string kind;  // "slurm" or "local"
  int64_t handle = 0;       // Slurm job id or pid
  int64_t start_ticks = 0;  // a pid's start time (/proc/PID/stat field 22)
  int64_t generation = 0;
  int32_t restarts = 0;
  int64_t updated_unix_ms = 0;
};

class LaunchStore {
 public:
  LaunchStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // Insert or replace the (run, slot) record; updated_unix_ms becomes now.
  absl::Status Put(const LaunchRecord& record);
  // Every record, ordered by run and slot.
  absl::StatusOr<std::vector<LaunchRecord>> List();
  // Drops the run's records (all slots when `slot` is empty).
  absl::Status Delete(std::string_view run, std::string_view slot);

 private:
  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
