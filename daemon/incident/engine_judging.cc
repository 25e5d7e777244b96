// The probe judge's wiring: building it for the running probe or
// verification (seeded from the original timeline and the steps already
// stored), and logging what it found.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "daemon/detect/spike_detector.h"
#include "daemon/incident/engine_internal.h"
#include "daemon/incident/policy.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

absl::Status IncidentEngine::State::BuildJudge(IncidentCase& s) {
  if (!s.probe) {
    return absl::DataLossError(absl::StrCat(
        "incident ", s.id(), ": a probe runs but its request is not in the log"));
  }
  auto j = std::make_unique<ProbeJudge>();
  const bool grad = DetectionKindOf(s.opened) == Detection::Kind::kGradNormSpike;
  const v1::SpikeDetectorPolicy& sp = grad ? s.policy.grad_norm_spike() : s.policy.loss_spike();
  j->use_grad = grad;
  j->detector = std::make_unique<detect::SpikeDetector>(SpikeOptions(sp));
  j->checkpoint_step = s.probe->checkpoint().step();
  if (s.stage == Stage::kVerifying) {
    j->generation = s.verify_generation;
    j->from = s.verify_from;
    j->to = s.verify_until;
    j->verification = true;
  } else {
    j->generation = s.probe_generation;
    j->from = s.probe->judge_from();
    j->to = s.probe->judge_to();
    if (s.opened.baseline() > 0 && s.opened.peak_value() > s.opened.baseline()) {
      j->min_log_ratio = 0.5 * std::log(s.opened.peak_value() / s.opened.baseline());
    }
    j->budget_left = s.policy.budget().max_reexecuted_steps() - s.reexecuted;
  }
  // The detector starts from the original timeline before the checkpoint,
  // as the live detector would have.
  // The checkpoint at step c holds the state after steps 0..c-1: the
  // detector sees the original's steps before c, and the probe's own
  // steps from c on.
  const int window = SpikeOptions(sp).window;
  SG_ASSIGN_OR_RETURN(std::vector<StepObservation> before,
                      view->Steps(s.run(), s.opened.generation(),
                                  std::max<int64_t>(0, j->checkpoint_step - window),
                                  j->checkpoint_step - 1));
  for (const auto& o : before) {
    if (!NonFinite(o)) j->detector->Observe(o.step, grad ? o.grad_norm : o.loss);
  }
  if (s.probe_kind() == ProbeKind::kReplay && s.stage == Stage::kProbing && s.nondet_step < 0) {
    SG_ASSIGN_OR_RETURN(std::vector<StepObservation> original,
                        view->Steps(s.run(), s.opened.generation(), j->checkpoint_step,
                                    s.onset() - 1));
    for (const auto& o : original) j->original_hash[o.step] = o.loss_hash;
    // The event itself: the onset through the peak, and the step after the
    // peak when the original got that far (a fault in a step's update shows
    // in the next step's loss; one in its gradient already in the judged
    // grad norm), within the horizon. Without hashes (a trainer that
    // reports none) nothing is compared.
    const int64_t peak = std::min(std::max(s.onset(), s.opened.peak_step()), j->to);
    SG_ASSIGN_OR_RETURN(std::vector<StepObservation> event,
                        view->Steps(s.run(), s.opened.generation(), s.onset(),
                                    std::min(peak + 1, j->to)));
    int64_t through_peak = 0;
    bool complete = true;
    for (const auto& o : event) {
      complete = complete && o.loss_hash != 0;
      if (o.step <= peak) ++through_peak;
    }
    complete = complete && through_peak == peak - s.onset() + 1;
    if (complete) {
      for (const auto& o : event) {
        j->event_hash[o.step] = o.loss_hash;
        j->event_value[o.step] = grad ? o.grad_norm : o.loss;
      }
    }
  }
  j->last_fed = j->checkpoint_step - 1;
  j->last_progress = clock->Now();
  if (auto e = ended.find({s.run(), j->generation}); e != ended.end()) {
    j->ended_at = e->second.first;
    j->ended_reason = e->second.second;
  }
  // Steps that arrived before a restart (or before verification began).
  SG_ASSIGN_OR_RETURN(std::vector<StepObservation> done,
                      view->Steps(s.run(), j->generation, j->checkpoint_step, j->to));
  for (const auto& o : done) j->Feed(o, clock->Now());
  j->EndEarly();
  s.judge = std::move(j);
  return absl::OkStatus();
}

// Logs what the judge found. Returns true when an event was logged.
absl::StatusOr<bool> IncidentEngine::State::HandleJudge(IncidentCase& s) {
  ProbeJudge* j = s.judge.get();
  if (!j) return false;
  bool changed = false;
  if (j->mismatch_step >= 0 && s.nondet_step < 0) {
    lg::EventPayload p;
    p.set_step(j->mismatch_step);
    p.set_note(absl::StrFormat(
        "non-determinism: the replay's loss differs from the original at step %d (hash %016x vs "
        "%016x): the run is not deterministic; confidence halved",
        j->mismatch_step, j->mismatch_replayed, j->mismatch_original));
    p.set_detail(p.note());
    SG_RETURN_IF_ERROR(Emit(s, EventKind::kNondeterminism, p));
    changed = true;
    j = s.judge.get();
    if (!j) return true;
  }
  if (!j->result) return changed;
  const lg::ProbeFinished f = *j->result;
  lg::EventPayload p;
  if (j->verification) {
    if (OutcomeOf(f) == ProbeOutcome::kClean) {
      p.set_detail(absl::StrCat("verified: no spike through step ", f.last_step()));
      SG_RETURN_IF_ERROR(Emit(s, EventKind::kVerified, p));
    } else {
      if (s.verdict == v1::TRANSIENT) {
        // The replay already showed that this event does not recur; a spike
        // after it is another event, which the detectors open on its own.
        const std::string what = absl::StrCat(
            "a new spike while verifying the continuation: ", f.detail(),
            "; the TRANSIENT verdict stands (the replay did not repeat the spike at step ",
            s.onset(), "), and the new spike is diagnosed as an incident of its own");
        p.set_note(what);
        p.set_detail(what);
        SG_RETURN_IF_ERROR(Emit(s, EventKind::kVerificationFailed, p));
        SG_RETURN_IF_ERROR(Close(s));
        return true;
      }
      const std::string what = absl::StrCat("spike returned while verifying the fix: ", f.detail());
      p.set_note(what);
      p.set_detail(what);
      SG_RETURN_IF_ERROR(Emit(s, EventKind::kVerificationFailed, p));
      SG_RETURN_IF_ERROR(Inconclusive(s, what));
    }
    return true;
  }
  *p.mutable_finished() = f;
  const std::string kind = s.probe->probe_kind();
  if (s.probe_kind() == ProbeKind::kTransplant) {
    p.set_note(OutcomeOf(f) == ProbeOutcome::kClean
                   ? absl::StrCat("transplant: the culprit batch does not spike the step-",
                                  s.probe->checkpoint().step(),
                                  " model: data × state (the model was fragile too)")
                   : absl::StrCat("transplant: the culprit batch spikes the step-",
                                  s.probe->checkpoint().step(), " model as well: the data alone"));
  }
  p.set_detail(absl::StrCat(kind, " probe (generation ", j->generation, "): ", f.outcome(), ": ",
                            f.detail()));
  SG_RETURN_IF_ERROR(Emit(s, EventKind::kProbeFinished, p));
  return true;
}

}  // namespace spikeguard::incident
