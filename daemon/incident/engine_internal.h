// engine_internal.h
// -----------------------------------------------------------------------------
// The orchestration state of IncidentEngine (engine.h), shared by the files
// that implement its concerns; not part of the engine's interface.
//
//   engine.cc          the public API, deciding the next step, the judge wiring
//   engine_opening.cc  opening an incident (OnDetection) and its deferred
//                      localization
//   engine_actions.cc  requests (rewind, continue, pause, quarantine) and their
//                      execution
//   engine_verdicts.cc the probe checkpoint, replay and skip proposals, the
//                      verdicts after them
//   engine_culprits.cc bisect and document bisect, the DATA verdict
//   fix_ladder.cc      the fix after a verdict, transplant, close
//
// The incident's own state and the fold over its log: incident_state.h; the
// probe judge: probe_judge.h; the checkpoint rule: checkpoint_choice.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/incident/bisection.h"
#include "daemon/incident/engine.h"
#include "daemon/incident/incident_state.h"

namespace spikeguard::incident {

// Skip probes extended to spikes at other batches before the model is
// called fragile.
inline constexpr int kMaxSkipExtensions = 2;

struct IncidentEngine::State {
  Clock* clock;
  RunController* controller;
  RunView* view;
  IncidentStore* store;
  Options options;
  Listener listener;
  DecisionObserver decided;
  // The incidents not yet closed, and those closed since the last call
  // into the engine (Retire moves them to `history` and `retired`): a
  // daemon's per-step work and memory do not grow with its past incidents.
  std::map<int64_t, std::unique_ptr<IncidentCase>> incidents;
  // The newest generation seen per run: the one a detection must be of.
  std::map<std::string, int64_t> watched;
  // Generations whose workers reached the end of their schedule: last step
  // and reason, per (run, generation).
  std::map<std::pair<std::string, int64_t>, std::pair<int64_t, std::string>> ended;
  // Runs whose closed incidents (from before this process) were read from
  // the store: their probe generations and detections count too.
  std::set<std::string> history_loaded;
  struct Past {
    int64_t id = 0;
    int64_t generation = 0;
    int64_t onset = 0;
    std::vector<int64_t> probe_generations;
    std::optional<int64_t> continued_generation;
  };
  // Per run: its incidents closed before this process (LoadHistory) and
  // those it closed (Retire).
  std::map<std::string, std::vector<Past>> history;
  // How each incident this process closed ended (CLOSED or ABORTED), for
  // an operator's late Approve or Abort.
  std::map<int64_t, spikeguard::v1::IncidentState> retired;

  // ---- Bookkeeping (engine.cc) ----------------------------------------------
  void LoadHistory(const std::string& run);
  // Moves closed incidents out of `incidents`. Called first by each engine
  // entry that may act, so no IncidentCase& is held across it.
  void Retire();
  static Past PastOf(int64_t id, const IncidentCase& s);
  // Every incident of the run this process knows, as Past records, in
  // `history` order then the open ones.
  void ForEachKnown(const std::string& run, const std::function<bool(const Past&)>& visit);
  // A probe's generation is an experiment, not the run: its spikes are the
  // probe's outcome and never open incidents, unless the run was let go on
  // with it (then it is the run's timeline).
  bool IsProbeGeneration(const std::string& run, int64_t generation);
  IncidentCase* ActiveFor(const std::string& run);
  spikeguard::v1::Mode ModeFor(const std::string& run);
  // Appends the event, applies it, saves the incident and tells the
  // listener (as soon as it is durable: IncidentStore's `durable`).
  absl::Status Emit(IncidentCase& s, EventKind kind, lg::EventPayload payload);
  // Tells the listener of `s`'s newest event.
  void Tell(const IncidentCase& s);
  absl::Status EmitNote(IncidentCase& s, const std::string& note);
  // The "localized" event of an incident opened with a deferred
  // localization (Detection::localize); none when no series departed
  // (engine_opening.cc).
  absl::Status EmitLocalized(IncidentCase& s, const Detection& d);

  // ---- Actions (engine_actions.cc) -------------------------------------------
  std::string RequestId(const IncidentCase& s, const std::string& what);
  // The hparams a probe of this incident runs with: those of the generation
  // under diagnosis (a fix in force stays in force), with `overrides` on
  // top (a fix rung; its lr scale multiplies the one in force).
  absl::StatusOr<spikeguard::v1::HParams> ProbeHParams(
      const IncidentCase& s, const std::optional<spikeguard::v1::HParams>& overrides);
  // The horizon clamped to the last step the run's schedule executes.
  int64_t Clamp(const IncidentCase& s, int64_t step);
  // `checkpoint_at_step` (replay): the step the workers also checkpoint at.
  absl::Status RequestRewind(IncidentCase& s, ProbeKind probe_kind, const CheckpointInfo& ckpt,
                             const spikeguard::v1::DataPlan& plan, int64_t stop_after,
                             const std::optional<spikeguard::v1::HParams>& overrides,
                             int64_t judge_from, int rung, int64_t hole_begin, int64_t hole_end,
                             const std::string& why, const std::vector<int64_t>& include = {},
                             const std::vector<std::pair<int64_t, int64_t>>& holes = {},
                             int64_t sample_position = -1,
                             const std::vector<int64_t>& kept_documents = {},
                             int64_t checkpoint_at_step = 0);
  absl::Status RequestContinue(IncidentCase& s, bool needs_approval, int64_t verify_generation,
                               int64_t verify_from, int64_t verify_until, const std::string& why);
  absl::Status RequestPause(IncidentCase& s, const std::string& why);
  absl::Status RequestQuarantine(IncidentCase& s);
  // Performs the pending action and logs its completion.
  absl::Status Execute(IncidentCase& s);

  // ---- Checkpoint, replay, skip, verdicts (engine_verdicts.cc) ---------------
  absl::Status EmitVerdict(IncidentCase& s, spikeguard::v1::Verdict verdict, double confidence,
                           const std::string& note, std::vector<std::string> recommendations,
                           const std::string& fix,
                           const std::vector<spikeguard::v1::DocumentRef>& documents = {},
                           bool escalated = false, bool leave_running = false);
  absl::Status Inconclusive(IncidentCase& s, const std::string& reason);
  std::vector<std::string> FragilityRecommendationsFor(const IncidentCase& s);
  double Confidence(const IncidentCase& s, double base) { return base * s.confidence_factor; }
  // The workers could not load the chosen checkpoint (or another command of
  // a probe failed): give that checkpoint up and start over from the next
  // candidate, or say clearly that none is left.
  absl::Status RetryCheckpoint(IncidentCase& s, const std::string& why);
  // The checkpoints a rewind of `generation` may start from: those on its
  // line (view->Generations), or, when the view has no tree, every
  // generation up to it.
  absl::StatusOr<CheckpointQuery> OnLineOf(const std::string& run, int64_t generation);
  absl::Status PickProbeCheckpoint(IncidentCase& s, const std::vector<std::string>& excluded = {},
                                   const std::string& retry_note = "");
  CheckpointInfo Chosen(const IncidentCase& s) { return FromRecord(s.chosen->checkpoint()); }
  absl::Status ProposeReplay(IncidentCase& s);
  // The step that consumes the first position of the skip window in the
  // chosen plan (the replay checkpoints there), or -1.
  int64_t WindowStartStep(const IncidentCase& s);
  // After a spiked replay that was asked to checkpoint at the window's
  // start: logs that checkpoint (kWindowCheckpoint) when the workers saved
  // it and the replay was bit-exact up to it, else a note.
  absl::Status FindWindowCheckpoint(IncidentCase& s);
  // Where a probe starts whose plan differs from the chosen plan only at
  // positions >= `first_changed` (same hparams): the window checkpoint when
  // its step consumes no later position, else the probe checkpoint.
  CheckpointInfo DataProbeStart(const IncidentCase& s, int64_t first_changed);
  std::pair<int64_t, int64_t> HoleAround(const IncidentCase& s, int64_t position);
  absl::Status ProposeSkip(IncidentCase& s, std::optional<int64_t> extra = std::nullopt);
  absl::Status VerdictAfterSkip(IncidentCase& s);
  // The run's other DATA incidents with onsets within the escalation
  // window of this one's.
  absl::StatusOr<int> DataIncidentsNear(const IncidentCase& s);
  // Whether repeated DATA incidents call for escalation to FRAGILITY.
  absl::StatusOr<bool> EscalationDue(const IncidentCase& s);
  // FRAGILITY by escalation, `why` saying which evidence of the incident's
  // own was missing (no culprit batch named).
  absl::Status Escalate(IncidentCase& s, const std::string& why);
  // Escalated fixes all failed while the skip was clean: the DATA verdict
  // and its fix stand instead of a pause.
  absl::Status DataAfterFailedEscalation(IncidentCase& s, const std::string& why);
  absl::Status EmitTransient(IncidentCase& s);

  // ---- Bisect and the DATA verdict (engine_culprits.cc) ----------------------
  // Every data position of the skip probe's holes.
  static std::vector<int64_t> WindowPositions(const IncidentCase& s);
  static bool InHoles(const IncidentCase& s, int64_t position);
  // The documents the original generation consumed at `positions` (each
  // position resolved at the step the original plan fed it).
  absl::StatusOr<std::vector<spikeguard::v1::DocumentRef>> DocumentsAt(
      const IncidentCase& s, const std::vector<int64_t>& positions);
  absl::Status BisectStep(IncidentCase& s);
  absl::Status SampleBisectStep(IncidentCase& s, const Bisection& b);
  // `after_escalation`: the escalated fixes failed; the DATA verdict stands
  // whatever the escalation count.
  absl::Status CulpritsFound(
      IncidentCase& s, Bisection b,
      const std::map<int64_t, std::vector<spikeguard::v1::DocumentRef>>& refined = {},
      const std::vector<lg::SampleCulprit>& samples = {}, bool after_escalation = false);

  // ---- The fix ladder (fix_ladder.cc) ----------------------------------------
  absl::Status ProposeRung(IncidentCase& s, int rung);
  // A batch outside the skip's holes that spiked the skip probe after the
  // event's own steps (past onset + replay_steps_past_onset): a trigger of
  // its own. Its data position; nullopt when the skip found none.
  static std::optional<int64_t> LaterTrigger(const IncidentCase& s);
  absl::Status ProposeTransplant(IncidentCase& s);
  absl::Status Close(IncidentCase& s);
  bool NeedsQuarantine(const IncidentCase& s);
  // `plan` (a DATA fix's) with the incident's named documents, and their
  // near-copies of at least fix.hold_out_similarity, held out of every later
  // batch that carries them; says in the incident what was held out, or why
  // nothing could be.
  absl::StatusOr<spikeguard::v1::DataPlan> HoldOut(IncidentCase& s,
                                                   const spikeguard::v1::DataPlan& plan);
  // The fix ladder after a verdict. Returns false when waiting.
  absl::StatusOr<bool> FixStep(IncidentCase& s);

  // ---- Deciding and judging (engine.cc) --------------------------------------
  // The next decision when nothing is pending. Returns false when waiting.
  absl::StatusOr<bool> Decide(IncidentCase& s);
  absl::Status BuildJudge(IncidentCase& s);
  // Logs what the judge found. Returns true when an event was logged.
  absl::StatusOr<bool> HandleJudge(IncidentCase& s);
  absl::Status Advance(IncidentCase& s);
};

}  // namespace spikeguard::incident
