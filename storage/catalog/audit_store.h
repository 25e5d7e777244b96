// audit_store.h
// -----------------------------------------------------------------------------
// The audit trail (table `audit`): one append-only row per mutating or
// refused call, with who (principal and role), what (the RPC), on which run,
// the outcome, a detail and the peer. Triggers refuse UPDATE and DELETE.
//
//   AuditStore audit(db, clock);
//   SG_ASSIGN_OR_RETURN(int64_t id, audit.Append(entry));
//   SG_ASSIGN_OR_RETURN(auto newest, audit.Query({.run = "gpt-7b", .limit = 50}));
//
// Not thread-safe; opens no transaction (see run_store.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

// A row as the first schema had it (actor, action, target, detail).
struct AuditEntry {
  int64_t seq = 0;
  int64_t unix_ms = 0;
  std::string actor;
  std::string action;
  std::string target;
  std::string detail;
};

// Newest first, at most `limit` (<= 0: all), with id < `before_id` when
// before_id > 0; empty run / principal: any.
struct AuditQuery {
  std::string run;
  std::string principal;
  int64_t since_unix_ms = 0;
  int64_t before_id = 0;
  int limit = 0;
};

class AuditStore {
 public:
  AuditStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // Returns the row's id (its seq).
  absl::StatusOr<int64_t> Append(std::string_view actor, std::string_view action,
                                 std::string_view target, std::string_view detail);
  // A call as the daemon's audit interceptor saw it; unix_ms 0 = now.
  absl::StatusOr<int64_t> Append(const v1::AuditEntry& entry);
  // The newest `limit` entries (all if limit <= 0), newest first.
  absl::StatusOr<std::vector<AuditEntry>> List(int limit);
  absl::StatusOr<std::vector<v1::AuditEntry>> Query(const AuditQuery& query);

 private:
  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
