// engine.h
// -----------------------------------------------------------------------------
// The incident engine: the loss-spike diagnosis an expert runs by hand, made
// automatic (docs/ARCHITECTURE.md, "The incident engine"). One persisted state
// machine per incident:
//
//   detected ─▶ replay probe ─┬─ clean ──────────────▶ TRANSIENT (continue from the replay)
//                             └─ spiked ─▶ skip probe ─┬─ clean ─▶ DATA (keep the hole,
//                                                      │           quarantine the documents)
//                                                      └─ spiked ─▶ FRAGILITY (fix ladder)
//                                                                  or NUMERICS (non-finite)
//   every fix is verified over a horizon before the incident closes.
//
// A probe is a rewind of the run to a checkpoint, with a data plan, optional
// hparam overrides and a horizon (stop_after_step); the workers run it in a
// new generation and the engine reads its outcome from that generation's
// telemetry (OnStep).
//
// Persistence: the `incident_events` log is the source of truth. Every state
// change is an event appended *before* it takes effect; after a crash,
// Recover() replays the log through the same transitions and re-issues what
// was requested but not confirmed, with the same request ids, so the
// controller (and the workers, by command id) never execute anything twice.
//
// Threading: the engine is not thread-safe; the daemon calls it under one
// lock. It never includes gRPC headers; it uses the v1 proto messages as data.
//
//   IncidentEngine engine(clock, &controller, &view, &store, IncidentEngine::Options{});
//   SG_RETURN_IF_ERROR(engine.Recover());
//   engine.OnDetection("gpt", detection);      // from the detectors
//   engine.OnStep("gpt", observation);         // every merged step record
//   engine.Tick();                             // timeouts, retries, periodically
//
// The protocol in detail (what an operator sees):
//
// - Modes come from view->PolicyFor(run) at each decision: OBSERVE (or
//   unspecified) opens the incident with detection and localization and
//   closes it at once ("observe mode: no probes"); PROPOSE parks every probe
//   and every fix in AWAITING_APPROVAL with the action in the note until
//   Approve(); AUTO runs unattended. Pauses and quarantine never wait. All
//   other knobs are frozen from the policy when the incident opens.
// - One active incident per run. A detection opens one only if it is of the
//   run's watched generation (the newest generation seen in OnStep or in a
//   detection); detections of older generations, and any detection while an
//   incident is active, are ignored.
// - Checkpoint (checkpoint_choice.h): the newest complete one on the watched
//   generation's line (its own, or an ancestor's saved before the line left
//   it; never a probe's or an abandoned branch's) in [onset − max_steps_before_onset,
//   onset − min_steps_before_onset], onset being the precursor onset when
//   earlier; else the nearest older one, with a note; else INCONCLUSIVE and
//   the run keeps training.
// - Replay (horizon onset + replay_steps_past_onset): loss hashes before the
//   onset must match the original; the first mismatch is a "nondeterminism"
//   event and halves every confidence. A spike counts when its onset lies in
//   [onset − 2, horizon]; any non-finite value counts too. Probes are judged
//   with a SpikeDetector on the loss (the grad norm for a grad-norm trigger)
//   seeded with the original steps up to the checkpoint.
// - Clean replay → TRANSIENT (0.9): continue from the replay, verified for
//   fix.verify_steps more steps; the ranks with the highest loss at the
//   spike are named. Spiked → skip probe with a hole of data positions
//   [p − skip_before, p + skip_after + 1) around the onset's position p,
//   horizon onset + skip_horizon (spikes count from the checkpoint on).
// - Clean skip → DATA (0.85): escalated to FRAGILITY when the run already
//   has data_incidents − 1 DATA incidents with onsets within window_steps.
//   Otherwise (bisect, transplant if enabled, then) continue the skip
//   generation, verified for verify_steps more steps, and quarantine the
//   documents of the window. After bisect or transplant the run has moved:
//   the fix is then a rewind with the skip plan, verified to onset +
//   verify_steps, then continued.
// - Document bisect (probe.bisect_documents): each culprit batch is fed
//   alone, with only the samples made entirely of the documents under test
//   (DataPlan sample masks); the same group testing over its documents, at
//   most probe.max_document_probes probes per batch. A document is named
//   after it spiked in its own samples; when none does alone, or the probes
//   run out, the documents not cleared by a clean probe stay named. The hole
//   stays at the whole batch.
// - Bisect: each probe skips the first half (rounded up) of the candidate
//   positions; a clean probe keeps that half, a spiked one the other, so the
//   culprit position is named after at most ⌈log2 W⌉ probes (confidence
//   0.95). Transplant: the culprit position spliced in right after a much
//   earlier checkpoint (max_steps_before_onset before the probe's); the
//   outcome is noted ("data × state" when it does not spike). Informational.
// - Spiked skip → NUMERICS (0.9) when the trigger or any probe was
//   non-finite: the first non-finite layer is named, precision advice given,
//   the run paused. Otherwise FRAGILITY (0.8): fix rungs rewound from the
//   probe checkpoint with the original plan, each verified to onset +
//   verify_steps: lr × lr_factor; + extra warmup and clip tight_clip_norm;
//   + β2 and ε. A clean rung is continued and the incident closes; three
//   spiked rungs → INCONCLUSIVE. Next-run advice follows the precursor
//   (qk-norm for attention logits, z-loss for log-sum-exp) plus soft-capping,
//   no biases, scaled residual init.
// - INCONCLUSIVE (budget: max_probes started or max_reexecuted_steps spent,
//   even mid-probe; a probe silent for Options::probe_timeout; a spike during
//   the verification of a fix; all rungs failed) pauses the run and closes
//   the incident; the operator resumes or rewinds by hand.
// - Abort(): ABORTED, and the run continues as it is (Continue).
// - Requests carry ids "incident-<id>/<n>-<what>". Every external fact a
//   decision used (checkpoint, documents, escalation count, probe outcomes)
//   is in the log, so Recover() reaches the same state without asking again;
//   steps of a running probe are read back from view->Steps and re-delivered
//   steps are ignored per (generation, step).
// - Cost: probes started, steps re-executed (last step seen − checkpoint per
//   probe), wall time open → close, GPU-hours = re-executed steps × mean
//   probe step time × world size / 3600. The verdict and close events give
//   the time to verdict and to close.
// - Get() knows the incidents opened or recovered by this process; older
//   closed ones are in the store.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/incident/checkpoint_choice.h"
#include "spikeguard/v1/policy.pb.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "spikeguard/v1/worker.pb.h"

namespace spikeguard::incident {

// One merged (run-level) step, as the engine needs it.
struct StepObservation {
  int64_t generation = 0;
  int64_t step = 0;
  int64_t data_position = 0;
  double loss = 0;
  double grad_norm = 0;
  int64_t nonfinite_count = 0;
  uint64_t loss_hash = 0;
  double step_time_s = 0;
  // Rank with the highest local loss at this step (outlier hosts).
  uint32_t max_loss_rank = 0;
  // Global layer index that first went non-finite, -1 when none/unknown.
  int first_nonfinite_layer = -1;
};

// What the detectors report; the daemon converts its monitor's events.
struct Detection {
  // kPrecursor: a critical precursor that persisted, opened as an incident
  // by policy (precursor.on_critical); judged on the loss like a loss spike.
  // The numbers are persisted: every "opened" event of the incident log
  // carries one (Opened.kind, engine_events.proto's DetectionKind), so they
  // never change and are never reused; a new kind takes the next number.
  // Read and written only through PersistedKind / DetectionKindOf
  // (incident_state.h).
  enum class Kind { kLossSpike = 0, kGradNormSpike = 1, kNonFinite = 2, kPrecursor = 3 };
  Kind kind = Kind::kLossSpike;
  int64_t generation = 0;
  int64_t onset_step = 0;
  int64_t peak_step = 0;
  double peak_value = 0;
  double baseline = 0;
  // The earliest precursor that fired before the onset, if any.
  std::optional<int64_t> precursor_onset_step;
  // e.g. "max_attn_logit", "lse_max", "grad_norm", "clip_rate".
  std::string precursor;
  // Localization: earliest signal and layer (-1: not per-layer).
  std::string localized_signal;
  int localized_layer = -1;
  std::vector<std::string> localization_order;
  // When set, the three fields above are worked out by this call after the
  // incident is opened, persisted and published (a "localized" event), so
  // the fit over every per-layer series is not on the detection path. Only
  // called for a detection that opens an incident, before the engine acts.
  std::function<void(Detection*)> localize;
  // Other detectors that fired for the same event (e.g. the grad norm
  // beside the loss): evidence of this incident, not incidents of their own.
  std::vector<std::string> also;
};

// One sample (row) of a batch: the documents it holds, in order.
struct SampleContent {
  std::vector<spikeguard::v1::DocumentRef> documents;
};

// A batch that carries documents a DATA fix holds out: the samples (slots)
// that hold any of them, and how many samples the batch has.
struct Carrier {
  int64_t position = 0;
  std::vector<int32_t> slots;
  int32_t samples = 0;
};

// A rewind the engine asks for. `request_id` is deterministic (incident id
// and probe number), so asking twice is safe.
struct RewindSpec {
  std::string request_id;
  CheckpointInfo checkpoint;
  spikeguard::v1::DataPlan plan;
  // Run up to and including this step, report, wait. 0 = no horizon.
  int64_t stop_after_step = 0;
  // Also save a checkpoint at this step (the state before it runs); 0 = none.
  int64_t checkpoint_at_step = 0;
  spikeguard::v1::HParams hparams;
  std::string reason;
};

// The world as the engine acts on it. The daemon implements it with commands
// to live workers (in-place rewind) or the launcher (relaunch); tests script it.
class RunController {
 public:
  virtual ~RunController() = default;
  // Starts a new generation of `run` from spec.checkpoint. Idempotent by
  // spec.request_id: a repeated request returns the generation the first
  // one created. Returns the new generation.
  virtual absl::StatusOr<int64_t> Rewind(const std::string& run, const RewindSpec& spec) = 0;
  // Lets the current generation train on with no horizon (optionally with
  // new hparams), e.g. after a verdict. Idempotent by request_id.
  virtual absl::Status Continue(const std::string& run, const std::string& request_id,
                                const std::optional<spikeguard::v1::HParams>& hparams) = 0;
  // Holds the workers where they are (NUMERICS, INCONCLUSIVE).
  virtual absl::Status Pause(const std::string& run, const std::string& request_id) = 0;
};

// Read access to what the daemon has stored about a run.
class RunView {
 public:
  virtual ~RunView() = default;
  virtual absl::StatusOr<std::vector<CheckpointInfo>> Checkpoints(const std::string& run) = 0;
  // Merged steps of one generation in [from, to], in step order.
  virtual absl::StatusOr<std::vector<StepObservation>> Steps(const std::string& run,
                                                            int64_t generation, int64_t from,
                                                            int64_t to) = 0;
  // The run's generation tree (each generation's parent and branch step):
  // rewind targets lie on the watched generation's line (checkpoint_choice.h).
  // A view that does not know it returns none: every generation up to the
  // watched one then counts.
  virtual absl::StatusOr<std::vector<spikeguard::v1::Generation>> Generations(
      const std::string& run) {
    return std::vector<spikeguard::v1::Generation>();
  }
  // The data plan the generation trains with.
  virtual absl::StatusOr<spikeguard::v1::DataPlan> Plan(const std::string& run,
                                                        int64_t generation) = 0;
  // The documents steps [from, to] of a generation consumed (manifest
  // resolution); empty when the run has no manifest.
  virtual absl::StatusOr<std::vector<spikeguard::v1::DocumentRef>> Documents(
      const std::string& run, int64_t generation, int64_t from, int64_t to) = 0;
  virtual uint32_t WorldSize(const std::string& run) = 0;
  virtual spikeguard::v1::Policy PolicyFor(const std::string& run) = 0;
  // The samples of batch `position` as `generation` reads it, by slot
  // (document bisect); empty when unknown (no manifest).
  virtual absl::StatusOr<std::vector<SampleContent>> Samples(const std::string& run,
                                                             int64_t generation,
                                                             int64_t position) {
    return std::vector<SampleContent>();
  }
  // The hyperparameter overrides a generation trains with (a fix in force);
  // a probe replaying that generation inherits them.
  virtual absl::StatusOr<spikeguard::v1::HParams> HParams(const std::string& run,
                                                          int64_t generation) {
    return spikeguard::v1::HParams();
  }
  // The last step the run's schedule executes, when the workers said
  // (Hello.total_steps); horizons past it are clamped.
  virtual std::optional<int64_t> FinalStep(const std::string& run) { return std::nullopt; }
  // The batches at positions [from, to) of the run's data order that carry
  // any of `documents`, in position order. FAILED_PRECONDITION, saying why,
  // when the view cannot know (no corpus manifest: a trainer's own dataset
  // reports the documents of the steps it trained, not of later ones).
  virtual absl::StatusOr<std::vector<Carrier>> Carriers(
      const std::string& run, const std::vector<spikeguard::v1::DocumentRef>& documents,
      int64_t from, int64_t to) {
    return absl::FailedPreconditionError(
        "the run has no corpus manifest, so the later batches that carry them are unknown");
  }
  // For each document, the most similar documents elsewhere in the corpus.
  virtual absl::StatusOr<std::vector<spikeguard::v1::NearDuplicate>> NearDuplicates(
      const std::string& run, const std::vector<spikeguard::v1::DocumentRef>& documents) {
    return std::vector<spikeguard::v1::NearDuplicate>();
  }
};

// The incident tables of the catalog.
class IncidentStore {
 public:
  virtual ~IncidentStore() = default;
  virtual absl::StatusOr<int64_t> CreateIncident(const std::string& run,
                                                 const spikeguard::v1::Incident& incident) = 0;
  // Materialized view for queries; the event log stays the truth.
  virtual absl::Status SaveIncident(const spikeguard::v1::Incident& incident) = 0;
  virtual absl::StatusOr<int64_t> AppendEvent(int64_t incident_id, const std::string& kind,
                                              const std::string& payload) = 0;
  // What the engine does for each event: append it, then save the incident
  // as `apply(seq)` leaves it (apply must not call the store). A store that
  // can does both in one transaction (one fsync); this default does
  // AppendEvent then SaveIncident. Returns the seq.
  //
  // `durable` (may be empty) runs once, as soon as both writes are durable
  // and before the call returns; not when they failed. A store that
  // commits them on another thread may run it there, so the news of the
  // event goes out without waiting for this caller to be woken: it must
  // only enqueue, and may read what `apply` left.
  using ApplyFn = std::function<const spikeguard::v1::Incident&(int64_t seq)>;
  using DurableFn = std::function<void()>;
  virtual absl::StatusOr<int64_t> AppendAndSave(int64_t incident_id, const std::string& kind,
                                                const std::string& payload, const ApplyFn& apply,
                                                const DurableFn& durable) {
    absl::StatusOr<int64_t> seq = AppendEvent(incident_id, kind, payload);
    if (!seq.ok()) return seq.status();
    if (absl::Status s = SaveIncident(apply(*seq)); !s.ok()) return s;
    if (durable) durable();
    return *seq;
  }
  // Opening: CreateIncident and its first event, saved as `apply(id, seq)`
  // leaves it; one transaction where the store can; `durable` as above.
  // Returns the id.
  using OpenFn = std::function<const spikeguard::v1::Incident&(int64_t id, int64_t seq)>;
  virtual absl::StatusOr<int64_t> CreateWithEvent(const std::string& run,
                                                  const spikeguard::v1::Incident& initial,
                                                  const std::string& kind,
                                                  const std::string& payload, const OpenFn& apply,
                                                  const DurableFn& durable) {
    absl::StatusOr<int64_t> id = CreateIncident(run, initial);
    if (!id.ok()) return id.status();
    absl::StatusOr<int64_t> seq = AppendEvent(*id, kind, payload);
    if (!seq.ok()) return seq.status();
    if (absl::Status s = SaveIncident(apply(*id, *seq)); !s.ok()) return s;
    if (durable) durable();
    return *id;
  }
  struct StoredEvent {
    int64_t seq = 0;
    int64_t unix_ms = 0;
    std::string kind;
    std::string payload;
  };
  virtual absl::StatusOr<std::vector<StoredEvent>> Events(int64_t incident_id) = 0;
  // Incidents not CLOSED/ABORTED, and all incidents of a run (escalation).
  virtual absl::StatusOr<std::vector<spikeguard::v1::Incident>> OpenIncidents() = 0;
  virtual absl::StatusOr<std::vector<spikeguard::v1::Incident>> RunIncidents(
      const std::string& run) = 0;
  virtual absl::Status Quarantine(const spikeguard::v1::QuarantineEntry& entry) = 0;
  // Pins (or unpins) the run's checkpoints at `step`: retention keeps them
  // while an incident may rewind there.
  virtual absl::Status PinCheckpoint(const std::string& run, int64_t step, bool pinned) {
    return absl::OkStatus();
  }
};

// Knobs of the engine itself (the protocol's knobs are in the Policy).
struct EngineOptions {
  // A probe whose generation reports no new step for this long is given up:
  // the incident becomes INCONCLUSIVE and the run is paused (Tick()).
  absl::Duration probe_timeout = absl::Minutes(10);
};

class IncidentEngine {
 public:
  using Listener = std::function<void(const spikeguard::v1::Incident&,
                                      const spikeguard::v1::IncidentEvent&)>;
  using Options = EngineOptions;

  IncidentEngine(Clock* clock, RunController* controller, RunView* view, IncidentStore* store,
                 Options options = Options());
  ~IncidentEngine();
  IncidentEngine(const IncidentEngine&) = delete;
  IncidentEngine& operator=(const IncidentEngine&) = delete;

  // Rebuilds every open incident from its event log and re-issues requests
  // that were logged but not confirmed.
  absl::Status Recover();

  // A detector fired. Opens an incident unless one is active for the run (a
  // detection during a probe belongs to that probe) or the detection is of a
  // generation the engine is not watching.
  absl::Status OnDetection(const std::string& run, const Detection& detection);
  // A merged step record was committed (any generation).
  absl::Status OnStep(const std::string& run, const StepObservation& step);
  // The workers of `generation` reached the end of their schedule at
  // `last_step`: a probe or verification waiting for later steps is judged
  // with the steps it has.
  absl::Status OnGenerationEnded(const std::string& run, int64_t generation, int64_t last_step,
                                 const std::string& reason);
  // A worker could not execute command `command_id` (e.g. its checkpoint is
  // gone): the probe that sent it fails at once with `message`, and the
  // incident moves to the next checkpoint or a clear verdict.
  absl::Status OnCommandFailed(const std::string& run, const std::string& command_id,
                               const std::string& message);
  // Time-based checks (probe wall-clock timeouts).
  absl::Status Tick();

  // Operators. Refused with FAILED_PRECONDITION and a reason when not
  // applicable (e.g. nothing awaits approval); idempotent.
  absl::Status Approve(int64_t incident_id);
  absl::Status Abort(int64_t incident_id, const std::string& reason);
  // True while an incident of the run runs a probe (manual rewinds are
  // refused then).
  bool ProbeRunning(const std::string& run) const;
  // An operator's rewind (spikectl rewind, replay, skip): refused with
  // FAILED_PRECONDITION while ProbeRunning(run), else handed to the
  // controller. The check and the rewind are one call, so under the lock the
  // daemon holds for the engine no probe can start between them.
  absl::StatusOr<int64_t> OperatorRewind(const std::string& run, const RewindSpec& spec);

  // Current materialized state of an incident the engine holds: one not
  // closed, or closed since the engine's last call (it then keeps only
  // what deduplication needs; the catalog has the rest). nullopt for others.
  std::optional<spikeguard::v1::Incident> Get(int64_t incident_id) const;
  std::vector<spikeguard::v1::Incident> Active() const;

  // Told of each event once it is durable (IncidentStore's `durable`):
  // possibly on the thread that committed it, while the engine call that
  // emitted it waits for it; it must only enqueue.
  void SetListener(Listener listener);
  // Told on the engine caller's thread when the engine has decided to open
  // an incident for `run` and formed it, just before its opening is
  // written (the listener hears "opened" once that write is durable). The
  // daemon's detection latency ends there: it must only note the time.
  using DecisionObserver = std::function<void(const std::string& run)>;
  void SetDecisionObserver(DecisionObserver observer);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace spikeguard::incident
