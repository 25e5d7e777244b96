// probe_judge.h
// -----------------------------------------------------------------------------
// Judges one generation from its steps: the outcome of a probe, or the
// verification of a fix (engine.h: "Replay", "Clean replay", "Spiked skip").
// Runtime state only: the engine rebuilds it from the view after a restart,
// and Feed() is idempotent per step, so re-delivered steps change nothing.
//
// Steps: a checkpoint "at step c" holds the state after steps 0..c-1, so the
// first step a probe from it executes is c itself; that step is judged like
// every other (a culprit batch may sit exactly there).
//
//   ProbeJudge j;
//   j.generation = 7; j.checkpoint_step = 400; j.from = 498; j.to = 540;
//   j.detector = std::make_unique<detect::SpikeDetector>(options);
//   j.last_fed = j.checkpoint_step - 1;
//   for (const StepObservation& o : steps) j.Feed(o, now);
//   if (j.result) ...  // lg::ProbeFinished: clean, spiked, nonfinite or failed
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "daemon/detect/spike_detector.h"
#include "daemon/incident/engine.h"
#include "daemon/incident/engine_events.pb.h"

namespace spikeguard::incident {

namespace lg = spikeguard::incident::log;

// What a probe (or a verification) found; the names are persisted
// (incident_state.h: ProbeOutcomeName).
enum class ProbeOutcome { kPending, kClean, kSpiked, kNonFinite, kFailed };

// Non-finite loss, grad norm or a non-finite count in the step.
bool NonFinite(const StepObservation& o);

struct ProbeJudge {
  int64_t generation = 0;
  // The checkpoint's step: the first step the probe executes.
  int64_t checkpoint_step = 0;
  // A spike counts when its onset lies in [from, to]; done at a step >= to.
  int64_t from = 0;
  int64_t to = 0;
  bool use_grad = false;
  bool verification = false;
  // A probe's spike must be of the same kind as the original: at least this
  // log(peak / median). Healthy series (grad norms above all) have outliers
  // that pass the z-score rule; a replay is bit-exact, so a spike that truly
  // repeats has the original's size, and a 2x blip does not stand in for a
  // 1e38 bit flip.
  double min_log_ratio = 0;
  // The first spike of a probe, reported at the horizon.
  struct Spike {
    int64_t step = 0;
    int64_t position = -1;
    std::string detail;
  };
  std::optional<Spike> first_spike;
  // Re-executed steps this probe may still spend (budget).
  int64_t budget_left = std::numeric_limits<int64_t>::max();
  // Replay fidelity: the original generation's loss hash per step.
  std::map<int64_t, uint64_t> original_hash;
  // A replay's event steps (the onset through the step after the peak) with
  // the original's loss hash, and how many the replay matched. A replay that
  // repeats them bit for bit repeated the event, whether or not this judge's
  // detector (which lacks the live monitor's corroboration) flags it.
  std::map<int64_t, uint64_t> event_hash;
  // The original's judged value (loss, or grad norm) at the event steps: a
  // report that differs while the loss does not is not the same event.
  std::map<int64_t, double> event_value;
  size_t event_matched = 0;
  bool event_differs = false;
  bool ReproducedBitExactly() const {
    return !event_hash.empty() && !event_differs && event_matched == event_hash.size() &&
           mismatch_step < 0;
  }
  std::unique_ptr<detect::SpikeDetector> detector;
  // Data position of the recent steps (the spike's position is evidence).
  std::map<int64_t, int64_t> positions;
  // The workers' schedule ended at this step (no later step will come).
  std::optional<int64_t> ended_at;
  std::string ended_reason;

  int64_t last_fed = -1;
  // The first step fed, and how many fed steps lie in [from, to]: a replay
  // is judged clean only on the judged steps it reported (a worker whose
  // reports skip them, e.g. one that sent a step of its old timeline under
  // the new generation first, has not shown them clean).
  int64_t first_fed = -1;
  int64_t judged_seen = 0;
  double time_sum = 0;
  int64_t count = 0;
  absl::Time last_progress;
  int64_t mismatch_step = -1;
  uint64_t mismatch_original = 0, mismatch_replayed = 0;
  std::optional<lg::ProbeFinished> result;

  // Records the outcome (once judged, later steps are ignored).
  void Finish(ProbeOutcome outcome, const std::string& detail, int64_t spike_step, int layer,
              int64_t spike_position = -1);
  // The schedule ended: judge with what came. A probe that never reached the
  // steps it was to judge has failed; otherwise what it saw stands.
  void EndEarly();
  // Judged at the horizon (or the schedule's end) with no spike flagged:
  // clean, unless the replay repeated the event bit for bit; failed when
  // the reports skipped judged steps.
  void FinishWithoutDetectedSpike(const std::string& clean_detail);
  // One step of any generation (others and repeats are ignored).
  void Feed(const StepObservation& o, absl::Time now);
};

}  // namespace spikeguard::incident
