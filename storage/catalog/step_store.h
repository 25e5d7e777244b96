// step_store.h
// -----------------------------------------------------------------------------
// Merged step records and the ranks' high-water marks (tables
// `step_telemetry`, `rank_progress`). A record is the run-level merge
// (merge.h) of every rank's report of one (run, generation, step); a rank's
// committed step is the newest step of that rank stored in a generation,
// which is how resent reports are told from new ones.
//
//   StepStore steps(db, clock);
//   SG_ASSIGN_OR_RETURN(IngestResult r, steps.Ingest(run_id, 0, rank, reports));
//   SG_ASSIGN_OR_RETURN(auto records, steps.Query(run_id, 0, 0, std::nullopt, 100));
//
// Records are serialized protos: NaN and Inf come back bit-exact; the REAL
// columns beside them (loss, grad_norm) are nullable conveniences.
//
// Not thread-safe; opens no transaction (see run_store.h). Keys are run ids:
// the caller resolved the run (RunStore::Lookup) and its generation.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "spikeguard/v1/telemetry.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

struct IngestResult {
  // Reports merged into step records by this call.
  int accepted = 0;
  // Reports at or below the rank's committed step: resends, ignored.
  int duplicates = 0;
  // The rank's high-water mark after this call; -1 if it never reported.
  int64_t committed_step = -1;
};

class StepStore {
 public:
  // Query returns at most this many records whatever the limit.
  static constexpr int kMaxQueryLimit = 100'000;

  StepStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // The stored record of the step; nullopt when none.
  absl::StatusOr<std::optional<v1::StepRecord>> Read(int64_t run_id, int64_t generation,
                                                     int64_t step);
  // Inserts or replaces the record of (run, generation, record.step()).
  absl::Status Write(int64_t run_id, int64_t generation, const v1::StepRecord& record);

  // The rank's high-water mark in the generation, -1 if none.
  absl::StatusOr<int64_t> CommittedStep(int64_t run_id, int64_t generation, uint32_t rank);
  // Raises it to `step` (never lowers it) and notes the rank seen now.
  absl::Status SetCommittedStep(int64_t run_id, int64_t generation, uint32_t rank, int64_t step);

  // One rank's reports merged into their records, each read, merged and
  // written; reports at or below the rank's committed step are counted as
  // duplicates. Taken in step order. Records are not cached: the group
  // commit of the daemon's ingest stage keeps its own open steps.
  absl::StatusOr<IngestResult> Ingest(int64_t run_id, int64_t generation, uint32_t rank,
                                      std::span<const v1::StepReport> reports);

  // Records with from_step <= step <= to_step, by step; limit <= 0 or above
  // kMaxQueryLimit means kMaxQueryLimit.
  absl::StatusOr<std::vector<v1::StepRecord>> Query(int64_t run_id, int64_t generation,
                                                    int64_t from_step,
                                                    std::optional<int64_t> to_step, int limit);
  // Per rank, its progress in the newest generation it reported in; by rank.
  absl::StatusOr<std::vector<v1::RankState>> RankProgress(int64_t run_id);

 private:
  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
