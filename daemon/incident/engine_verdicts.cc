// The probe checkpoint, the replay and skip probes, and the verdicts they
// lead to (TRANSIENT, NUMERICS, FRAGILITY, the escalation of DATA).
#include <algorithm>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "daemon/incident/checkpoint_choice.h"
#include "daemon/incident/engine_internal.h"
#include "daemon/incident/fix_ladder.h"
#include "daemon/incident/plan_proto.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

absl::Status IncidentEngine::State::EmitVerdict(IncidentCase& s, v1::Verdict verdict,
                                                double confidence, const std::string& note,
                                                std::vector<std::string> recommendations,
                                                const std::string& fix,
                                                const std::vector<v1::DocumentRef>& documents,
                                                bool escalated, bool leave_running) {
  lg::EventPayload p;
  lg::VerdictRecord* v = p.mutable_verdict();
  v->set_verdict(verdict);
  v->set_confidence(confidence);
  v->set_note(note);
  for (auto& r : recommendations) v->add_recommendations(std::move(r));
  for (const auto& d : documents) *v->add_documents() = d;
  v->set_fix(fix);
  v->set_escalated(escalated);
  if (leave_running) p.set_text("leave_running");
  const int64_t open_ms = s.inc.opened_unix_ms();
  p.set_detail(absl::StrFormat("verdict %s (confidence %.2f) after %.0f s: %s",
                               v1::Verdict_Name(verdict), confidence,
                               (clock->NowUnixMillis() - open_ms) / 1000.0, note));
  return Emit(s, EventKind::kVerdict, p);
}

absl::Status IncidentEngine::State::Inconclusive(IncidentCase& s, const std::string& reason) {
  return EmitVerdict(s, v1::INCONCLUSIVE, 0.0,
                     absl::StrCat(reason, "; run paused, awaiting an operator"), {},
                     "none: paused for an operator");
}

std::vector<std::string> IncidentEngine::State::FragilityRecommendationsFor(const IncidentCase& s) {
  return FragilityRecommendations(s.opened.precursor(), s.opened.localized_signal());
}

absl::Status IncidentEngine::State::RetryCheckpoint(IncidentCase& s, const std::string& why) {
  std::vector<std::string> excluded = s.excluded_uris;
  const int64_t failed_step = s.chosen ? s.chosen->checkpoint().step() : -1;
  if (s.chosen) {
    excluded.push_back(s.chosen->checkpoint().uri());
    (void)store->PinCheckpoint(s.run(), failed_step, false);
  }
  return PickProbeCheckpoint(s, excluded,
                             absl::StrCat("checkpoint step ", failed_step, " given up: ", why));
}

absl::StatusOr<CheckpointQuery> IncidentEngine::State::OnLineOf(const std::string& run,
                                                                 int64_t generation) {
  SG_ASSIGN_OR_RETURN(std::vector<v1::Generation> tree, view->Generations(run));
  CheckpointQuery q;
  if (tree.empty()) {
    q.max_generation = generation;
  } else {
    q.lineage = Lineage::Of(tree, generation);
  }
  return q;
}

absl::Status IncidentEngine::State::PickProbeCheckpoint(IncidentCase& s,
                                                        const std::vector<std::string>& excluded,
                                                        const std::string& retry_note) {
  const v1::ProbePolicy& probe = s.policy.probe();
  int64_t onset = s.opened.has_precursor() ? std::min(s.onset(), s.opened.precursor_onset_step())
                                           : s.onset();
  SG_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, view->Checkpoints(s.run()));
  SG_ASSIGN_OR_RETURN(const CheckpointQuery on_line, OnLineOf(s.run(), s.opened.generation()));
  std::optional<CheckpointInfo> in_window, older;
  // The newest complete checkpoint strictly before `before` on the watched
  // generation's line (its own generation's at equal steps), in the probe
  // window and overall.
  auto scan = [&](int64_t before) {
    CheckpointQuery q = on_line;
    q.preferred_generation = s.opened.generation();
    q.excluded_uris = excluded;
    q.max_step = before - 1;
    absl::StatusOr<CheckpointInfo> any = ChooseCheckpoint(all, q);
    older = any.ok() ? std::optional<CheckpointInfo>(*any) : std::nullopt;
    q.min_step = before - probe.max_steps_before_onset();
    q.max_step = std::min(before - 1, before - probe.min_steps_before_onset());
    absl::StatusOr<CheckpointInfo> window = ChooseCheckpoint(all, q);
    in_window = window.ok() ? std::optional<CheckpointInfo>(*window) : std::nullopt;
  };
  scan(onset);
  std::string precursor_note;
  if (!in_window && !older && onset < s.onset()) {
    // A precursor that started before the first checkpoint cannot move the
    // rewind point; fall back to the spike's own onset.
    precursor_note = absl::StrCat("no checkpoint before the precursor onset (step ", onset,
                                  "); probing from before the spike onset instead");
    onset = s.onset();
    scan(onset);
  }
  std::string note = retry_note;
  if (!precursor_note.empty()) note += (note.empty() ? "" : "; ") + precursor_note;
  CheckpointInfo chosen;
  if (in_window) {
    chosen = *in_window;
  } else if (older) {
    chosen = *older;
    if (!note.empty()) note += "; ";
    note += absl::StrCat("no complete checkpoint ", probe.min_steps_before_onset(), "–",
                         probe.max_steps_before_onset(), " steps before the onset (step ", onset,
                         "); using the nearest older one, step ", chosen.step, " (",
                         onset - chosen.step, " steps before)");
  } else if (!retry_note.empty()) {
    return Inconclusive(s, absl::StrCat(retry_note, "; no other complete checkpoint before the "
                                        "onset (step ", onset, ") is left to replay from"));
  } else {
    return EmitVerdict(s, v1::INCONCLUSIVE, 0.0,
                       absl::StrCat("no complete checkpoint before the onset (step ", onset,
                                    "): nothing to replay from; the run keeps training"),
                       {"save checkpoints often enough that one lies 100–500 steps before any "
                        "step"},
                       "none: run left training", {}, false, /*leave_running=*/true);
  }
  SG_ASSIGN_OR_RETURN(v1::DataPlan plan, view->Plan(s.run(), s.opened.generation()));
  SG_ASSIGN_OR_RETURN(std::vector<StepObservation> at,
                      view->Steps(s.run(), s.opened.generation(), s.onset(), s.onset()));
  int64_t position = -1;
  for (const StepObservation& o : at) {
    if (o.step == s.onset()) position = o.data_position;
  }
  if (position < 0) position = PositionOfStep(plan, s.onset());
  lg::EventPayload p;
  lg::CheckpointChosen* c = p.mutable_checkpoint();
  *c->mutable_checkpoint() = ToRecord(chosen);
  *c->mutable_plan() = plan;
  c->set_onset_position(position);
  c->set_fallback(!in_window);
  for (const std::string& uri : excluded) c->add_excluded_uris(uri);
  p.set_note(note);
  // Retention must keep it while this incident may rewind there.
  if (absl::Status pin = store->PinCheckpoint(s.run(), chosen.step, true); !pin.ok()) {
    SG_LOG(WARNING) << "incident " << s.id() << ": pin checkpoint step " << chosen.step << ": "
                    << pin;
  }
  p.set_detail(absl::StrCat("checkpoint step ", chosen.step, " (", chosen.uri, ")",
                            note.empty() ? "" : ": ", note));
  return Emit(s, EventKind::kCheckpoint, p);
}

absl::Status IncidentEngine::State::ProposeReplay(IncidentCase& s) {
  const int64_t stop = s.onset() + s.policy.probe().replay_steps_past_onset();
  const int64_t at = s.policy.probe().window_checkpoint() ? WindowStartStep(s) : -1;
  return RequestRewind(s, ProbeKind::kReplay, Chosen(s), s.chosen->plan(), stop, std::nullopt,
                       s.onset() - 2, 0, 0, 0, "same checkpoint, same data", {}, {}, -1, {},
                       std::max<int64_t>(at, 0));
}

int64_t IncidentEngine::State::WindowStartStep(const IncidentCase& s) {
  if (!s.chosen) return -1;
  const int64_t first = HoleAround(s, s.chosen->onset_position()).first;
  return StepOfPosition(s.chosen->plan(), first);
}

absl::Status IncidentEngine::State::FindWindowCheckpoint(IncidentCase& s) {
  if (!s.probe || s.probe_kind() != ProbeKind::kReplay || s.window_checkpoint) {
    return absl::OkStatus();
  }
  const int64_t at = s.probe->checkpoint_at_step();
  if (at <= 0) return absl::OkStatus();
  const int64_t from = s.chosen->checkpoint().step();
  if (s.nondet_step >= 0 && s.nondet_step < at) {
    return EmitNote(s, absl::StrCat("the replay differed from the original before step ", at,
                                    ": probes start from step ", from));
  }
  SG_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, view->Checkpoints(s.run()));
  for (const CheckpointInfo& c : all) {
    if (c.generation != s.probe_generation || c.step != at || !c.complete) continue;
    lg::EventPayload p;
    *p.mutable_checkpoint()->mutable_checkpoint() = ToRecord(c);
    p.set_detail(absl::StrCat("window checkpoint: the replay (generation ", c.generation,
                              ") saved step ", at, " (", c.uri, "); probes that change only the "
                              "window's data start there, not at step ", from));
    if (absl::Status pin = store->PinCheckpoint(s.run(), at, true); !pin.ok()) {
      SG_LOG(WARNING) << "incident " << s.id() << ": pin checkpoint step " << at << ": " << pin;
    }
    return Emit(s, EventKind::kWindowCheckpoint, p);
  }
  return EmitNote(s, absl::StrCat("the replay saved no checkpoint at step ", at,
                                  " (the window's start): probes start from step ", from));
}

CheckpointInfo IncidentEngine::State::DataProbeStart(const IncidentCase& s,
                                                     int64_t first_changed) {
  if (s.window_checkpoint) {
    const int64_t consumed = PositionOfStep(s.chosen->plan(), s.window_checkpoint->step());
    if (consumed >= 0 && consumed <= first_changed) return FromRecord(*s.window_checkpoint);
  }
  return Chosen(s);
}

// Step s consumes the s-th position of the plan, and the checkpoint already
// holds the positions consumed before its step: a hole never starts before
// the position the checkpoint's step consumes, or it would shift every later
// step's data instead.
std::pair<int64_t, int64_t> IncidentEngine::State::HoleAround(const IncidentCase& s,
                                                              int64_t position) {
  const v1::ProbePolicy& probe = s.policy.probe();
  int64_t first = PositionOfStep(s.chosen->plan(), s.chosen->checkpoint().step());
  if (first < 0) first = 0;
  return {std::max<int64_t>(first, position - probe.skip_before()),
          std::max<int64_t>(first, position) + probe.skip_after() + 1};
}

// The skip probe: a hole around the onset's position, or (extending) the
// holes so far plus one around `extra`, where the previous skip spiked.
absl::Status IncidentEngine::State::ProposeSkip(IncidentCase& s, std::optional<int64_t> extra) {
  const v1::ProbePolicy& probe = s.policy.probe();
  std::vector<std::pair<int64_t, int64_t>> holes = s.holes;
  if (holes.empty()) holes.push_back(HoleAround(s, s.chosen->onset_position()));
  int64_t horizon = s.onset() + probe.skip_horizon();
  std::string why;
  if (extra) {
    holes.push_back(HoleAround(s, *extra));
    why = absl::StrCat("the previous skip spiked on another batch, data position ", *extra,
                       ": skip it too");
    if (s.last_finished) {
      horizon = std::max(horizon, s.last_finished->spike_step() + probe.skip_horizon());
    }
  } else {
    why = absl::StrCat("hole [", holes.front().first, ", ", holes.front().second,
                       ") around the onset");
  }
  holes = MergeRanges(holes);
  SG_ASSIGN_OR_RETURN(const v1::DataPlan plan, PlanWithHoles(s.chosen->plan(), holes));
  const CheckpointInfo start = DataProbeStart(s, holes.front().first);
  return RequestRewind(s, ProbeKind::kSkip, start, plan, horizon, std::nullopt, start.step, 0,
                       holes.front().first, holes.front().second, why, {}, holes);
}

absl::Status IncidentEngine::State::VerdictAfterSkip(IncidentCase& s) {
  const v1::Policy& pol = s.policy;
  const auto skip = s.outcomes.find(ProbeKind::kSkip);
  if (skip != s.outcomes.end() && skip->second == ProbeOutcome::kClean) {
    // Repeated DATA incidents raise the prior on FRAGILITY, but this
    // incident's own evidence decides: bisect first, and escalate only when
    // it names no culprit batch (CulpritsFound).
    if (pol.probe().bisect()) return BisectStep(s);
    SG_ASSIGN_OR_RETURN(const bool escalate, EscalationDue(s));
    if (escalate) return Escalate(s, "bisect is off, so no culprit batch was named");
    Bisection whole;
    whole.culprits = WindowPositions(s);
    whole.untested = true;
    return CulpritsFound(s, whole);
  }
  const bool numerics =
      DetectionKindOf(s.opened) == Detection::Kind::kNonFinite || s.any_nonfinite;
  if (numerics) {
    const int layer = s.nonfinite_layer >= 0 ? s.nonfinite_layer : s.opened.localized_layer();
    return EmitVerdict(
        s, v1::NUMERICS, Confidence(s, 0.9),
        absl::StrCat("non-finite values reproduce on replay and survive the skip",
                     layer >= 0 ? absl::StrCat("; first non-finite layer ", layer)
                                : std::string("; first non-finite layer unknown")),
        {"fp32 softmax, norms, losses and reductions", "bf16 rather than fp16",
         "check the loss-scale schedule if fp16 is kept"},
        "none in place: run paused; precision changes need an operator");
  }
  // The skip probe spiked on another batch. Without evidence that the model
  // moved (a precursor), that batch may be a trigger of its own: skip it too
  // before calling the model fragile.
  const int64_t q = s.last_finished ? s.last_finished->spike_position() : -1;
  if (q >= 0 && !InHoles(s, q) && !s.opened.has_precursor() &&
      s.skip_extensions < kMaxSkipExtensions) {
    return ProposeSkip(s, q);
  }
  std::string why = "the spike reproduces on replay and survives skipping the batches around it";
  if (s.skip_extensions > 0) {
    why = absl::StrCat(why, " and around ", s.skip_extensions, " more spike(s) at other batches");
  } else if (s.opened.has_precursor()) {
    why = absl::StrCat(why, " (precursor ", s.opened.precursor(), " since step ",
                       s.opened.precursor_onset_step(), ")");
  }
  return EmitVerdict(s, v1::FRAGILITY, Confidence(s, 0.8),
                     absl::StrCat(why, ": the model state is fragile"),
                     FragilityRecommendationsFor(s), kFragilityFix);
}

absl::StatusOr<int> IncidentEngine::State::DataIncidentsNear(const IncidentCase& s) {
  SG_ASSIGN_OR_RETURN(std::vector<v1::Incident> all, store->RunIncidents(s.run()));
  int near = 0;
  for (const v1::Incident& other : all) {
    if (other.id() == s.id() || other.verdict() != v1::DATA) continue;
    if (std::llabs(other.onset_step() - s.onset()) <= s.policy.escalation().window_steps()) ++near;
  }
  return near;
}

absl::StatusOr<bool> IncidentEngine::State::EscalationDue(const IncidentCase& s) {
  SG_ASSIGN_OR_RETURN(const int near, DataIncidentsNear(s));
  return near >= s.policy.escalation().data_incidents() - 1;
}

absl::Status IncidentEngine::State::Escalate(IncidentCase& s, const std::string& why) {
  SG_ASSIGN_OR_RETURN(const int near, DataIncidentsNear(s));
  return EmitVerdict(s, v1::FRAGILITY, Confidence(s, 0.8),
                     absl::StrCat("escalated: ", near + 1, " DATA incidents within ",
                                  s.policy.escalation().window_steps(), " steps, and ", why,
                                  "; skipping data may only postpone the next spike (if the "
                                  "fixes fail, the clean skip's DATA fix stands)"),
                     FragilityRecommendationsFor(s), kFragilityFix, {},
                     /*escalated=*/true);
}

absl::Status IncidentEngine::State::DataAfterFailedEscalation(IncidentCase& s,
                                                              const std::string& why) {
  SG_RETURN_IF_ERROR(EmitNote(
      s, absl::StrCat("the escalated FRAGILITY fixes failed (", why,
                      ") while skipping the window removed the spike: the DATA fix stands")));
  Bisection b;
  if (s.bisect_done && !s.culprits.empty()) {
    b.culprits = s.culprits;
  } else {
    b.culprits = WindowPositions(s);
    b.untested = true;
  }
  return CulpritsFound(s, b, {}, {}, /*after_escalation=*/true);
}

absl::Status IncidentEngine::State::EmitTransient(IncidentCase& s) {
  SG_ASSIGN_OR_RETURN(std::vector<StepObservation> spike,
                      view->Steps(s.run(), s.opened.generation(), s.onset(),
                                  std::max(s.onset(), s.opened.peak_step())));
  std::set<uint32_t> ranks;
  for (const auto& o : spike) ranks.insert(o.max_loss_rank);
  std::vector<std::string> recs;
  const std::string rank_list = absl::StrJoin(ranks, ", ");
  if (!ranks.empty()) {
    recs.push_back(absl::StrCat("check the hosts of rank(s) ", rank_list,
                                " (ECC errors, GPU health, NCCL/network)"));
  }
  if (s.nondet_step >= 0) {
    recs.push_back("make the run deterministic (fixed reduction order, deterministic kernels) "
                   "so replays are bit-exact");
  }
  return EmitVerdict(
      s, v1::TRANSIENT, Confidence(s, 0.9),
      absl::StrCat("the replay from step ", s.chosen->checkpoint().step(),
                   " did not spike at step ", s.onset(), ": a transient fault (hardware) or nondeterminism",
                   ranks.empty() ? "" : absl::StrCat("; outlier rank(s) ", rank_list)),
      std::move(recs),
      absl::StrCat("continue from the replay (generation ", s.probe_generation, ")"));
}

}  // namespace spikeguard::incident
