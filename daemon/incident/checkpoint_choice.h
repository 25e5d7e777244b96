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
//   q.max_step = onset - 1;                        // strictly before the onset
//   q.lineage = Lineage::Of(generations, watched);  // the watched timeline's history
//   q.preferred_generation = watched_generation;
//   absl::StatusOr<CheckpointInfo> c = ChooseCheckpoint(all, q);  // NOT_FOUND: none
//
// Only complete checkpoints are ever chosen.
//
// Lineage. Every rewind starts a new generation whose parent is the
// generation that saved the checkpoint it started from, and whose branch
// step is that checkpoint's step; the generations form a tree. A checkpoint
// of generation G at step s lies on generation H's history only if G is H,
// or G is an ancestor of H and s <= the step where H's line left G (the
// smallest branch step on the path from H up to G). Anything else was saved
// on another timeline: a probe's (another data plan, other hparams), or the
// run's own before a fix changed its trajectory. Replaying from it would not
// reproduce H, so it is never a rewind target of H.
//
// Hparams. A probe of H runs with H's hparams from the checkpoint on. Where a
// generation on H's path took other hparams than its parent (a FRAGILITY fix
// continued with a lower lr), H's line ran with other hparams before that
// generation's branch step: a checkpoint saved before it is on the history
// but a replay from it would train those steps with H's hparams and differ
// from H at once. So a target of H is also at or after the branch step of
// the newest hparams change on H's path (hparams_since).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
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

// The history of one generation: which checkpoints lie on it.
class Lineage {
 public:
  // `tree`: the run's generations (parent and from_checkpoint_step). A
  // generation that is not in it (generation 0 of a run its workers
  // started) is a root.
  static Lineage Of(const std::vector<spikeguard::v1::Generation>& tree, int64_t generation);

  int64_t generation() const { return generation_; }
  // Empty when a checkpoint of `generation` at `step` lies on the history;
  // otherwise why not, for an operator ("saved by generation 4, not on
  // generation 7's line", "saved at step 900, after generation 7's line
  // left generation 0 at step 600").
  std::string WhyNot(int64_t generation, int64_t step) const;
  bool Holds(int64_t generation, int64_t step) const;
  // The ancestors (this generation first) with the last step of each on
  // the history.
  const std::map<int64_t, int64_t>& last_steps() const { return last_step_; }
  // The first step from which H's line ran with H's hparams (the branch step
  // of the newest generation on the path whose hparams differ from its
  // parent's; the minimum int64 when none does).
  int64_t hparams_since() const { return hparams_since_; }
  // The same history without the hparams bound: an operator's rewind, which
  // starts a new line with the hparams in force from wherever it goes back.
  Lineage IgnoringHParams() const {
    Lineage l = *this;
    l.hparams_since_ = std::numeric_limits<int64_t>::min();
    return l;
  }

 private:
  int64_t generation_ = 0;
  int64_t hparams_since_ = std::numeric_limits<int64_t>::min();
  std::map<int64_t, int64_t> last_step_;
};

struct CheckpointQuery {
  // Candidates: complete, step in [min_step, max_step], not excluded, and of
  // the generations below.
  int64_t min_step = std::numeric_limits<int64_t>::min();
  int64_t max_step = std::numeric_limits<int64_t>::max();
  // Only generations <= this (a probe never starts from a later timeline).
  std::optional<int64_t> max_generation;
  // Only checkpoints on this history (see Lineage).
  std::optional<Lineage> lineage;
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
