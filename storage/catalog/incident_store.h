// incident_store.h
// -----------------------------------------------------------------------------
// Incidents and their append-only event logs (tables `incidents`,
// `incident_events`). The record is the incident as last saved; the events
// are what the engine replays after a restart (triggers refuse UPDATE and
// DELETE of an event). An event and the record it leads to are written
// together (`Record`, `CreateWithEvent`), inside the caller's transaction.
//
//   IncidentStore incidents(db, clock);
//   SG_ASSIGN_OR_RETURN(int64_t id, incidents.CreateWithEvent(
//       "gpt-7b", initial, "opened", payload,
//       [&](int64_t id, int64_t seq) -> const v1::Incident& { ... }));
//
// Errors: NOT_FOUND for an unknown run or incident; INVALID_ARGUMENT for an
// empty event kind or a record of another incident or run. Not thread-safe;
// opens no transaction (see run_store.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

struct IncidentFilter {
  std::string run;  // empty: all runs
  v1::IncidentState state = v1::INCIDENT_STATE_UNSPECIFIED;  // unspecified: any
  v1::Verdict verdict = v1::VERDICT_UNSPECIFIED;              // unspecified: any
  int64_t since_unix_ms = 0;  // opened at or after
};

// One entry of an incident's append-only event log.
struct StoredEvent {
  int64_t seq = 0;  // global, increasing in append order
  int64_t incident_id = 0;
  int64_t unix_ms = 0;
  std::string kind;
  std::string payload;  // bytes, as given
};

class IncidentStore {
 public:
  // The record to store once the event is appended (its seq known). Called
  // with the catalog's lock held: it must not call the catalog.
  using IncidentUpdateFn = std::function<const v1::Incident&(int64_t seq)>;
  // The same for a new incident (its id known too).
  using NewIncidentFn = std::function<const v1::Incident&(int64_t id, int64_t seq)>;

  IncidentStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // Assigns and returns the id; inc.id is ignored, inc.run is set to `run`,
  // opened_unix_ms defaults to now.
  absl::StatusOr<int64_t> Create(std::string_view run, const v1::Incident& inc);
  // Replaces the stored record of inc.id (its run cannot change).
  absl::Status Update(const v1::Incident& inc);
  absl::StatusOr<v1::Incident> Get(int64_t id);
  // By id (= opening order).
  absl::StatusOr<std::vector<v1::Incident>> List(const IncidentFilter& filter);

  // Appends an event; returns its seq.
  absl::StatusOr<int64_t> AppendEvent(int64_t incident_id, std::string_view kind,
                                      std::string_view payload);
  // The event, then the record `updated(seq)` returns (its id must be
  // `incident_id`). Returns the seq.
  absl::StatusOr<int64_t> Record(int64_t incident_id, std::string_view kind,
                                 std::string_view payload, const IncidentUpdateFn& updated);
  // Create, then Record of its first event. Returns the id.
  absl::StatusOr<int64_t> CreateWithEvent(std::string_view run, const v1::Incident& inc,
                                          std::string_view kind, std::string_view payload,
                                          const NewIncidentFn& updated);
  // In append order.
  absl::StatusOr<std::vector<StoredEvent>> Events(int64_t incident_id);

 private:
  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
