// policy_store.h
// -----------------------------------------------------------------------------
// Policies set over gRPC (table `policies`), by scope: a run's name, or ""
// for the daemon-wide default. Stored as the serialized `v1::Policy`, so a
// restarted daemon applies what operators set.
//
//   PolicyStore policies(db, clock);
//   SG_RETURN_IF_ERROR(policies.Put("gpt-7b", policy));
//
// Not thread-safe; opens no transaction (see run_store.h).
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "spikeguard/v1/policy.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

class PolicyStore {
 public:
  PolicyStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // Replaces what was set for `scope`.
  absl::Status Put(std::string_view scope, const v1::Policy& policy);
  // NOT_FOUND when none was set for `scope`.
  absl::StatusOr<v1::Policy> Get(std::string_view scope);

 private:
  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
