// warning_store.h
// -----------------------------------------------------------------------------
// Precursor warnings (table `precursor_warnings`): a critical precursor
// level that persisted, its state (open, cleared, preceded an incident) and
// the incident it preceded. The record is the warning as last saved; signal,
// layer, state, onset and incident are columns for queries.
//
//   WarningStore warnings(db, clock);
//   SG_ASSIGN_OR_RETURN(int64_t id, warnings.Create(w));
//
// Errors: NOT_FOUND for an unknown run, warning or incident; INVALID_ARGUMENT
// for an empty signal or a state that is not a warning state;
// FAILED_PRECONDITION for an update naming another run. Not thread-safe;
// opens no transaction (see run_store.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

struct WarningFilter {
  std::string run;  // empty: all runs
  v1::WarningState state = v1::WARNING_STATE_UNSPECIFIED;  // unspecified: any
};

class WarningStore {
 public:
  WarningStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // Assigns and returns the id; w.id is ignored, w.run names the run;
  // opened_unix_ms and updated_unix_ms default to now.
  absl::StatusOr<int64_t> Create(const v1::PrecursorWarning& w);
  // Replaces the stored record of w.id (its run and opening time cannot
  // change); updated_unix_ms becomes now. An incident_id must name one.
  absl::Status Update(const v1::PrecursorWarning& w);
  absl::StatusOr<v1::PrecursorWarning> Get(int64_t id);
  // By id (= opening order).
  absl::StatusOr<std::vector<v1::PrecursorWarning>> List(const WarningFilter& filter);

 private:
  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
