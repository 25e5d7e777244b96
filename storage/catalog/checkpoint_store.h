// checkpoint_store.h
// -----------------------------------------------------------------------------
// Registered checkpoints (table `checkpoints`), keyed by (run, step, uri):
// what saved them, where their data position is, their size and checksum,
// and the pins that keep workers from deleting them (an incident's or an
// operator's, and the daemon's one rolling rewind target per run).
//
//   CheckpointStore checkpoints(db, clock);
//   SG_ASSIGN_OR_RETURN(v1::Checkpoint c, checkpoints.Upsert(saved));
//   SG_ASSIGN_OR_RETURN(auto all, checkpoints.List("gpt-7b"));
//
// Errors: NOT_FOUND for an unknown run or checkpoint; INVALID_ARGUMENT for an
// empty uri. Not thread-safe; opens no transaction (see run_store.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

class CheckpointStore {
 public:
  CheckpointStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // A later report updates the descriptive fields; `complete` only ever goes
  // from false to true, `pinned` and `created_unix_ms` keep their first
  // values, an empty checksum or zero bytes does not erase a known one.
  // `file_identity` (opaque here) given: stored; not given: kept, unless the
  // report brings another checksum (another file: cleared). Returns the row.
  absl::StatusOr<v1::Checkpoint> Upsert(const v1::Checkpoint& c,
                                        std::optional<std::string_view> file_identity);
  // "" when none was stored.
  absl::StatusOr<std::string> FileIdentity(std::string_view run, int64_t step,
                                           std::string_view uri);
  absl::Status SetFileIdentity(std::string_view run, int64_t step, std::string_view uri,
                               std::string_view file_identity);
  // By step, then uri.
  absl::StatusOr<std::vector<v1::Checkpoint>> List(std::string_view run);
  // Pins/unpins every checkpoint of the run at `step`; returns the first.
  absl::StatusOr<v1::Checkpoint> Pin(std::string_view run, int64_t step, bool pinned);
  // (step, uri) becomes the run's one rolling pin, any other is released.
  absl::Status SetRollingPin(std::string_view run, int64_t step, std::string_view uri);
  // True when it was known.
  absl::StatusOr<bool> Delete(std::string_view run, int64_t step, std::string_view uri);

 private:
  absl::StatusOr<std::vector<v1::Checkpoint>> Select(int64_t run_id, std::string_view run,
                                                     std::optional<int64_t> step);

  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
