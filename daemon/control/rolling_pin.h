// rolling_pin.h
// -----------------------------------------------------------------------------
// The run's rolling rewind target. Workers delete old checkpoints under their
// own retention (keep_checkpoints); with a small keep, every checkpoint old
// enough to rewind to could go, and an incident would have nothing to replay
// from. So the daemon keeps one pinned: the newest complete checkpoint on the
// line of the run's current generation (checkpoint_choice.h) at least
// probe.min_steps_before_onset steps before the step the run has reached. A
// newer one that qualifies takes the pin over; the old one is released.
//
// Each CheckpointSaved moves it (the saved step is the step the run has
// reached), and the answer to that notice, like every command, tells the
// worker the pins its retention must keep: the incidents' pins, this one,
// and the next target, the oldest checkpoint of the line after it. A worker
// keeping only its newest checkpoint would otherwise delete every candidate
// before it is old enough to qualify, and the pin could never move on; so
// the rolling target is at most about two min_steps_before_onset (plus the
// checkpoint interval) old, at the cost of up to two files beyond the
// worker's own keep.
//
//   SG_ASSIGN_OR_RETURN(std::vector<std::string> keep,
//                       UpdateRollingPin(catalog, "gpt", /*now_step=*/1200));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

// The URIs the run's retention must keep now, sorted: its pinned
// checkpoints (PinCheckpoint's), the rolling one and the next target.
absl::StatusOr<std::vector<std::string>> RetainedPins(storage::Catalog* catalog,
                                                      const std::string& run);

// Moves the run's rolling pin for a run at `now_step`, then RetainedPins.
absl::StatusOr<std::vector<std::string>> UpdateRollingPin(storage::Catalog* catalog,
                                                          const std::string& run,
                                                          int64_t now_step);

}  // namespace spikeguard::daemon
