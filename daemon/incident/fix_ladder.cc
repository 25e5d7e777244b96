// The fix ladder: the pure rungs and advice, and the step that drives the fix
// after a verdict (fix_ladder.h), with the transplant probe and the close.
#include "daemon/incident/fix_ladder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "daemon/incident/bisection.h"
#include "daemon/incident/checkpoint_choice.h"
#include "daemon/incident/engine_internal.h"
#include "daemon/incident/plan_proto.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

v1::HParams RungHParams(const v1::FixPolicy& fix, int rung) {
  v1::HParams h;
  h.set_lr_scale(fix.lr_factor());
  if (rung >= 2) {
    h.set_extra_warmup_steps(fix.extra_warmup_steps());
    h.set_clip_norm(fix.tight_clip_norm());
  }
  if (rung >= 3) {
    h.set_beta2(fix.beta2());
    h.set_eps(fix.eps());
  }
  return h;
}

std::string HParamsString(const v1::HParams& h) {
  std::vector<std::string> parts;
  if (h.has_lr_scale()) parts.push_back(absl::StrCat("lr×", h.lr_scale()));
  if (h.has_extra_warmup_steps()) {
    parts.push_back(absl::StrCat("+", h.extra_warmup_steps(), " warmup"));
  }
  if (h.has_clip_norm()) parts.push_back(absl::StrCat("clip ", h.clip_norm()));
  if (h.has_beta2()) parts.push_back(absl::StrCat("β2 ", h.beta2()));
  if (h.has_eps()) parts.push_back(absl::StrCat("ε ", h.eps()));
  return absl::StrJoin(parts, ", ");
}

std::vector<std::string> FragilityRecommendations(const std::string& precursor,
                                                  const std::string& localized_signal) {
  std::vector<std::string> r;
  const std::string pre = absl::StrCat(precursor, " ", localized_signal);
  if (pre.find("attn") != std::string::npos) r.push_back("qk-norm (for the next run)");
  if (pre.find("lse") != std::string::npos || pre.find("log_sum_exp") != std::string::npos ||
      pre.find("logsumexp") != std::string::npos) {
    r.push_back("z-loss 1e-4·(log Σ e^z)² (for the next run)");
  }
  r.push_back("logit soft-capping (for the next run)");
  r.push_back("no biases (for the next run)");
  r.push_back("scaled residual init (for the next run)");
  return r;
}

std::optional<int64_t> IncidentEngine::State::LaterTrigger(const IncidentCase& s) {
  if (!s.skip_finished || OutcomeOf(*s.skip_finished) != ProbeOutcome::kSpiked) {
    return std::nullopt;
  }
  const lg::ProbeFinished& f = *s.skip_finished;
  if (f.spike_position() < 0 || InHoles(s, f.spike_position()) ||
      f.spike_step() <= s.onset() + s.policy.probe().replay_steps_past_onset()) {
    return std::nullopt;
  }
  return f.spike_position();
}

// A rung answers one question: does the event at the onset come back with
// these hyperparameters? A later batch that already spiked the skip probe
// on its own (LaterTrigger) would fail every rung whatever they fix, so the
// rung is judged up to the step before that batch, and the batch, once the
// run continues, is diagnosed as an incident of its own.
absl::Status IncidentEngine::State::ProposeRung(IncidentCase& s, int rung) {
  const int64_t ckpt = s.chosen->checkpoint().step();
  int64_t horizon = s.onset() + s.policy.fix().verify_steps();
  std::string why = absl::StrCat("FRAGILITY fix rung ", rung);
  if (const std::optional<int64_t> q = LaterTrigger(s)) {
    const int64_t fed = StepOfPosition(s.chosen->plan(), *q);
    if (fed > s.onset() + s.policy.probe().replay_steps_past_onset() && fed <= horizon) {
      horizon = fed - 1;
      absl::StrAppend(&why, "; judged through step ", horizon, ": data position ", *q,
                      " (step ", fed, ") spiked the skip probe on its own at step ",
                      s.skip_finished->spike_step(),
                      ", a trigger of its own, diagnosed as another incident if it spikes again");
    }
  }
  return RequestRewind(s, ProbeKind::kFix, Chosen(s), s.chosen->plan(), horizon,
                       RungHParams(s.policy.fix(), rung), ckpt, rung, 0, 0, why);
}

absl::Status IncidentEngine::State::ProposeTransplant(IncidentCase& s) {
  // A much earlier model state: the newest complete checkpoint at least
  // max_steps_before_onset before the probe checkpoint, else the oldest.
  SG_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, view->Checkpoints(s.run()));
  const int64_t probe_ckpt = s.chosen->checkpoint().step();
  const int64_t far = probe_ckpt - s.policy.probe().max_steps_before_onset();
  SG_ASSIGN_OR_RETURN(CheckpointQuery q, OnLineOf(s.run(), s.opened.generation()));
  q.max_step = std::min(far, probe_ckpt - 1);
  absl::StatusOr<CheckpointInfo> pick = ChooseCheckpoint(all, q);
  if (!pick.ok()) {
    q.max_step = probe_ckpt - 1;
    q.pick = CheckpointQuery::Pick::kOldest;
    pick = ChooseCheckpoint(all, q);
  }
  std::optional<int64_t> at;
  if (pick.ok()) {
    SG_ASSIGN_OR_RETURN(
        std::vector<StepObservation> next,
        view->Steps(s.run(), s.opened.generation(), pick->step + 1, pick->step + 1));
    for (const auto& o : next) at = o.data_position;
  }
  if (!pick.ok() || !at || s.culprits.empty()) {
    lg::EventPayload p;
    p.set_note("transplant skipped: no earlier complete checkpoint with a known data position");
    p.set_detail(p.note());
    return Emit(s, EventKind::kTransplantSkipped, p);
  }
  const int64_t culprit = s.culprits.front();
  SG_ASSIGN_OR_RETURN(const storage::DataPlan original, PlanFromProto(s.chosen->plan()));
  absl::StatusOr<storage::DataPlan> spliced =
      original.WithInsertBeforePosition(*at, {culprit, culprit + 1});
  // A position the plan never feeds leaves the plan as it is.
  if (!spliced.ok() && !absl::IsNotFound(spliced.status())) return spliced.status();
  const v1::DataPlan plan = PlanToProto(spliced.ok() ? *spliced : original);
  return RequestRewind(s, ProbeKind::kTransplant, *pick, plan,
                       pick->step + 1 + s.policy.probe().replay_steps_past_onset(), std::nullopt,
                       pick->step + 1, 0, culprit, culprit + 1,
                       absl::StrCat("culprit position ", culprit, " fed at step ", pick->step + 1));
}

absl::Status IncidentEngine::State::Close(IncidentCase& s) {
  lg::EventPayload p;
  const int64_t now = clock->NowUnixMillis();
  const double to_verdict =
      s.verdict_ms > 0 ? (s.verdict_ms - s.inc.opened_unix_ms()) / 1000.0 : 0;
  p.set_detail(absl::StrFormat(
      "closed: %s; verdict after %.0f s, closed after %.0f s; %d probe(s), %d steps "
      "re-executed, %.3f rank-hours",
      v1::Verdict_Name(s.verdict), to_verdict, (now - s.inc.opened_unix_ms()) / 1000.0, s.probes,
      s.reexecuted, s.inc.cost().gpu_hours()));
  SG_RETURN_IF_ERROR(Emit(s, EventKind::kClosed, p));
  if (s.chosen) (void)store->PinCheckpoint(s.run(), s.chosen->checkpoint().step(), false);
  if (s.window_checkpoint) (void)store->PinCheckpoint(s.run(), s.window_checkpoint->step(), false);
  return absl::OkStatus();
}

bool IncidentEngine::State::NeedsQuarantine(const IncidentCase& s) {
  return s.verdict == v1::DATA && s.fix_requested && !s.quarantined && !s.pending &&
         s.inc.documents_size() > 0;
}

absl::StatusOr<v1::DataPlan> IncidentEngine::State::HoldOut(IncidentCase& s,
                                                             const v1::DataPlan& plan) {
  const v1::FixPolicy& fix = s.policy.fix();
  if (!fix.hold_out_documents() || s.inc.documents_size() == 0) return plan;
  std::vector<v1::DocumentRef> held(s.inc.documents().begin(), s.inc.documents().end());
  std::vector<std::string> names;
  for (const auto& d : held) names.push_back(absl::StrCat(d.domain(), ":", d.document_id()));
  std::vector<std::string> copies;
  for (const v1::NearDuplicate& d : s.inc.near_duplicates()) {
    if (d.similarity() < fix.hold_out_similarity()) continue;
    v1::DocumentRef& r = held.emplace_back();
    r.set_domain(d.domain());
    r.set_document_id(d.document_id());
    copies.push_back(absl::StrFormat("%s:%d (%.2f like %s:%d)", d.domain(), d.document_id(),
                                     d.similarity(), d.similar_to_domain(),
                                     d.similar_to_document_id()));
  }
  // Later batches: past the window, through the schedule's last position
  // (the plan's position at the run's final step), at most
  // hold_out_max_positions ahead.
  const std::vector<int64_t> window = WindowPositions(s);
  const int64_t from = (window.empty() ? s.onset() : window.back()) + 1;
  int64_t to = from + fix.hold_out_max_positions();
  if (const std::optional<int64_t> last = view->FinalStep(s.run())) {
    const int64_t position = PositionOfStep(plan, *last);
    if (position >= 0) to = std::min(to, position + 1);
  }
  const std::string what = absl::StrCat(
      "document(s) ", absl::StrJoin(names, " "),
      copies.empty() ? "" : absl::StrCat(" and near-copies ", absl::StrJoin(copies, " ")));
  if (to <= from) return plan;
  absl::StatusOr<std::vector<Carrier>> carriers = view->Carriers(s.run(), held, from, to);
  if (!carriers.ok()) {
    SG_RETURN_IF_ERROR(EmitNote(
        s, absl::StrCat("later batches are not searched for the ", what, ": ",
                        carriers.status().message())));
    return plan;
  }
  SG_ASSIGN_OR_RETURN(storage::DataPlan out, PlanFromProto(plan));
  std::vector<int64_t> holes;
  std::vector<std::string> masked;
  int64_t samples = 0;
  for (const Carrier& c : *carriers) {
    if (StepOfPosition(plan, c.position) < 0) continue;  // never fed anyway
    std::vector<int32_t> slots = c.slots;
    if (const storage::SampleMask* m = out.MaskAt(c.position)) {
      slots.insert(slots.end(), m->slots.begin(), m->slots.end());
    }
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    if (c.samples > 0 && static_cast<int64_t>(slots.size()) >= c.samples) {
      holes.push_back(c.position);  // every sample carries one
      continue;
    }
    SG_ASSIGN_OR_RETURN(out, out.WithMask(c.position, slots));
    masked.push_back(absl::StrCat(c.position));
    samples += static_cast<int64_t>(c.slots.size());
  }
  for (const auto& [lo, hi] : PositionRuns(holes)) {
    SG_ASSIGN_OR_RETURN(out, out.WithHole(lo, hi));
  }
  auto shown = [](const std::vector<std::string>& v) {
    constexpr size_t kShown = 12;
    if (v.size() <= kShown) return absl::StrJoin(v, ",");
    return absl::StrCat(absl::StrJoin(v.begin(), v.begin() + kShown, ","), ",… (",
                        v.size() - kShown, " more)");
  };
  std::vector<std::string> hole_list;
  for (int64_t h : holes) hole_list.push_back(absl::StrCat(h));
  if (masked.empty() && holes.empty()) {
    SG_RETURN_IF_ERROR(EmitNote(s, absl::StrCat("no later batch through data position ", to - 1,
                                                " carries the ", what)));
    return plan;
  }
  SG_RETURN_IF_ERROR(EmitNote(
      s, absl::StrCat(
             "the fix holds the ", what, " out of ", masked.size() + holes.size(),
             " later batch(es) through data position ", to - 1,
             masked.empty() ? ""
                            : absl::StrCat(": ", samples, " sample(s) masked at position(s) ",
                                           shown(masked)),
             holes.empty() ? ""
                           : absl::StrCat(masked.empty() ? ": " : "; ",
                                          "position(s) ", shown(hole_list),
                                          " skipped whole (every sample carries one)"))));
  return PlanToProto(out);
}

absl::StatusOr<bool> IncidentEngine::State::FixStep(IncidentCase& s) {
  const v1::Policy& pol = s.policy;
  if (s.aborting) {
    if (!s.continued) return false;
    lg::EventPayload p;
    p.set_detail("aborted; the run continues as it is");
    SG_RETURN_IF_ERROR(Emit(s, EventKind::kAborted, p));
    if (s.chosen) (void)store->PinCheckpoint(s.run(), s.chosen->checkpoint().step(), false);
    return true;
  }
  const ProbeKind last_kind = s.probe_kind();
  // kPending when no probe has finished yet (a finished probe never is).
  const ProbeOutcome last_outcome =
      s.last_finished ? OutcomeOf(*s.last_finished) : ProbeOutcome::kPending;
  switch (s.verdict) {
    case v1::VERDICT_UNSPECIFIED:
      SG_RETURN_IF_ERROR(Close(s));
      return true;
    case v1::INCONCLUSIVE:
    case v1::NUMERICS:
      if (s.leave_running || s.paused) {
        SG_RETURN_IF_ERROR(Close(s));
      } else {
        SG_RETURN_IF_ERROR(RequestPause(s, absl::StrCat(v1::Verdict_Name(s.verdict),
                                                        ": pause the run for an operator")));
      }
      return true;
    case v1::TRANSIENT:
      if (!s.fix_requested) {
        const int64_t horizon = s.probe->stop_after_step();
        SG_RETURN_IF_ERROR(RequestContinue(
            s, ModeFor(s.run()) == v1::MODE_PROPOSE, s.probe_generation, horizon + 1,
            horizon + pol.fix().verify_steps(),
            absl::StrCat("fix: continue from the replay (generation ", s.probe_generation, ")")));
        return true;
      }
      if (s.verified) {
        SG_RETURN_IF_ERROR(Close(s));
        return true;
      }
      return false;
    case v1::DATA: {
      if (pol.probe().transplant() && s.bisect_done && !s.culprits.empty() &&
          !s.transplant_done) {
        SG_RETURN_IF_ERROR(ProposeTransplant(s));
        return true;
      }
      if (!s.fix_requested) {
        // The holes the fix keeps: the culprit batches when bisect named
        // them, else every hole the clean skip had.
        std::vector<std::pair<int64_t, int64_t>> keep = s.holes;
        if (!s.culprits.empty()) keep = PositionRuns(s.culprits);
        SG_ASSIGN_OR_RETURN(const v1::DataPlan with_holes, PlanWithHoles(s.chosen->plan(), keep));
        // The named documents also leave every later batch that carries
        // them: one document, one incident.
        SG_ASSIGN_OR_RETURN(const v1::DataPlan plan, HoldOut(s, with_holes));
        const bool held_out = plan.SerializeAsString() != with_holes.SerializeAsString();
        if (last_kind == ProbeKind::kSkip && !held_out) {
          // The skip generation is the fix: let it go on with its holes.
          const int64_t horizon = s.probe->stop_after_step();
          SG_RETURN_IF_ERROR(RequestContinue(
              s, ModeFor(s.run()) == v1::MODE_PROPOSE, s.probe_generation, horizon + 1,
              horizon + pol.fix().verify_steps(),
              absl::StrCat("fix: continue the skip generation ", s.probe_generation,
                           " with its hole(s)")));
        } else {
          // Bisect or transplant moved the run: rewind once more, with
          // holes at the culprits only.
          std::vector<std::string> parts;
          for (const auto& [lo, hi] : keep) {
            parts.push_back(absl::StrCat("[", lo, ", ", hi, ")"));
          }
          const CheckpointInfo start =
              keep.empty() ? Chosen(s) : DataProbeStart(s, keep.front().first);
          SG_RETURN_IF_ERROR(RequestRewind(
              s, ProbeKind::kFix, start, plan,
              s.onset() + pol.fix().verify_steps(), std::nullopt, start.step,
              0, keep.empty() ? 0 : keep.front().first, keep.empty() ? 0 : keep.front().second,
              absl::StrCat("DATA fix: hole(s) ", absl::StrJoin(parts, " "),
                           held_out ? ", the named documents held out of later batches"
                                    : " only"),
              {},
              keep));
        }
        return true;
      }
      if (NeedsQuarantine(s)) {
        SG_RETURN_IF_ERROR(RequestQuarantine(s));
        return true;
      }
      if (last_kind == ProbeKind::kFix && !s.continued) {
        if (last_outcome == ProbeOutcome::kClean) {
          SG_RETURN_IF_ERROR(RequestContinue(s, false, -1, 0, 0,
                                             "DATA fix verified: the run continues"));
        } else if (last_outcome == ProbeOutcome::kFailed) {
          SG_RETURN_IF_ERROR(Inconclusive(
              s, absl::StrCat("the DATA fix probe failed: ", s.last_finished->detail())));
        } else {
          SG_RETURN_IF_ERROR(Inconclusive(
              s, absl::StrCat("the spike returned with the window skipped: ",
                              s.last_finished->detail())));
        }
        return true;
      }
      if (s.continued && (s.verified || last_kind == ProbeKind::kFix) &&
          (s.quarantined || s.inc.documents_size() == 0)) {
        SG_RETURN_IF_ERROR(Close(s));
        return true;
      }
      return false;
    }
    case v1::FRAGILITY:
      if (s.rung == 0) {
        SG_RETURN_IF_ERROR(ProposeRung(s, 1));
        return true;
      }
      if (last_kind == ProbeKind::kFix && s.last_finished) {
        if (last_outcome == ProbeOutcome::kClean) {
          if (!s.continued) {
            SG_RETURN_IF_ERROR(RequestContinue(
                s, false, -1, 0, 0,
                absl::StrCat("fix rung ", s.rung, " (", HParamsString(s.probe->hparams()),
                             ") verified: the run continues with it")));
          } else {
            SG_RETURN_IF_ERROR(Close(s));
          }
          return true;
        }
        if (last_outcome == ProbeOutcome::kFailed) {
          SG_RETURN_IF_ERROR(Inconclusive(s, s.last_finished->detail()));
          return true;
        }
        if (s.rung < 3) {
          SG_RETURN_IF_ERROR(ProposeRung(s, s.rung + 1));
        } else if (s.escalated && s.outcomes.count(ProbeKind::kSkip) &&
                   s.outcomes.at(ProbeKind::kSkip) == ProbeOutcome::kClean) {
          SG_RETURN_IF_ERROR(DataAfterFailedEscalation(s, "all three fix rungs spiked again"));
        } else {
          SG_RETURN_IF_ERROR(Inconclusive(s, "all three fix rungs spiked again"));
        }
        return true;
      }
      return false;
    default:
      return false;
  }
}

}  // namespace spikeguard::incident
