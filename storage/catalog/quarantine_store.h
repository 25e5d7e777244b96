// quarantine_store.h
// -----------------------------------------------------------------------------
// Quarantined documents (table `quarantine`), keyed by (run, domain,
// document id), each with the reason and the incident that named it.
// Idempotent: adding an entry again returns the stored one, which keeps its
// first reason and incident.
//
//   QuarantineStore quarantine(db, clock);
//   SG_ASSIGN_OR_RETURN(v1::QuarantineEntry stored, quarantine.Add(entry));
//
// Errors: NOT_FOUND for an unknown run or incident; INVALID_ARGUMENT for an
// empty domain. Not thread-safe; opens no transaction (see run_store.h).
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

class QuarantineStore {
 public:
  QuarantineStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // incident_id 0 means none.
  absl::StatusOr<v1::QuarantineEntry> Add(const v1::QuarantineEntry& entry);
  // By domain, then document id.
  absl::StatusOr<std::vector<v1::QuarantineEntry>> List(std::string_view run);

 private:
  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
