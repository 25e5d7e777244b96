// checkpoint_choice.h
// -----------------------------------------------------------------------------
// Which checkpoint a rewind starts from. One pure rule, used by every place
// that picks one: the incident engine (the probe checkpoint before an onset,
// the much earlier state of a transplant), an operator's rewind
// (SupervisorService::ManualRewind: the newest at or before a step) and a
// relaunch (LocalLauncher: the newest of a generation). Callers differ only in
// the query; a caller that must also verify the file (CheckpointGuard) adds a
// checkpoint that fails to `excluded_uris` and asks again.
//
//   CheckpointQuery q;
//   q.max_step = onset - 1;                 // strictly before the onset
//   q.max_generation = watched_generation;  // the run's timeline so far
//   q.preferred_generation = watched_generation;
//   absl::StatusOr<CheckpointInfo> c = ChooseCheckpoint(all, q);  // NOT_FOUND: none
//
// Only complete checkpoints are ever chosen.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "spikeguard/v1/supervisor.pb.h"

namespace spikeguard::incident {

struct CheckpointInfo {
  int64_t generation = 0;
  int64_t step = 0;
  std::string uri;
  std::string checksum;
  bool complete = false;
};

// The catalog's row as the chooser sees it.
CheckpointInfo ToCheckpointInfo(const spikeguard::v1::Checkpoint& c);

struct CheckpointQuery {
  // Candidates: complete, step in [min_step, max_step], not excluded, and of
  // the generations below.
  int64_t min_step = std::numeric_limits<int64_t>::min();
  int64_t max_step = std::numeric_limits<int64_t>::max();
  // Only generations <= this (a probe never starts from a later timeline).
  std::optional<int64_t> max_generation;
  // Only this generation (a relaunch resumes its own generation).
  std::optional<int64_t> generation;
  std::vector<std::string> excluded_uris;

  // Which candidate: the highest step, or the lowest.
  enum class Pick { kNewest, kOldest };
  Pick pick = Pick::kNewest;
  // Between candidates at the same step: this generation's own first; then
  // the highest generation when ties_to_highest_generation, else the one
  // listed first.
  std::optional<int64_t> preferred_generation;
  bool ties_to_highest_generation = false;
};

// The checkpoint `query` picks from `checkpoints` (in the catalog's order);
// NOT_FOUND, naming the step window, when no complete checkpoint qualifies.
absl::StatusOr<CheckpointInfo> ChooseCheckpoint(const std::vector<CheckpointInfo>& checkpoints,
                                                const CheckpointQuery& query);

}  // namespace spikeguard::incident
