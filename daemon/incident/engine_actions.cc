// The engine's requests: each is logged (*_requested) before it is executed,
// and its completion is a separate event, so Recover() re-issues exactly what
// was requested but not confirmed, with the same request id.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/incident/engine_internal.h"
#include "daemon/incident/fix_ladder.h"
#include "daemon/incident/plan_proto.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

std::string IncidentEngine::State::RequestId(const IncidentCase& s, const std::string& what) {
  return absl::StrCat("incident-", s.id(), "/", s.actions + 1, "-", what);
}

absl::StatusOr<v1::HParams> IncidentEngine::State::ProbeHParams(
    const IncidentCase& s, const std::optional<v1::HParams>& overrides) {
  SG_ASSIGN_OR_RETURN(v1::HParams h, view->HParams(s.run(), s.opened.generation()));
  if (!overrides) return h;
  const double inherited_lr = h.has_lr_scale() ? h.lr_scale() : 1.0;
  v1::HParams out = h;
  // A new warmup ramps from the probe's own checkpoint.
  if (overrides->has_extra_warmup_steps()) out.clear_warmup_start_step();
  out.MergeFrom(*overrides);
  if (overrides->has_lr_scale()) out.set_lr_scale(inherited_lr * overrides->lr_scale());
  return out;
}

int64_t IncidentEngine::State::Clamp(const IncidentCase& s, int64_t step) {
  const std::optional<int64_t> final_step = view->FinalStep(s.run());
  return final_step && *final_step >= 0 ? std::min(step, *final_step) : step;
}

absl::Status IncidentEngine::State::RequestRewind(
    IncidentCase& s, ProbeKind probe_kind, const CheckpointInfo& ckpt, const v1::DataPlan& plan,
    int64_t stop_after, const std::optional<v1::HParams>& overrides, int64_t judge_from, int rung,
    int64_t hole_begin, int64_t hole_end, const std::string& why,
    const std::vector<int64_t>& include, const std::vector<std::pair<int64_t, int64_t>>& holes,
    int64_t sample_position, const std::vector<int64_t>& kept_documents,
    int64_t checkpoint_at_step) {
  const v1::Policy& pol = s.policy;
  const std::string kind_name = ProbeKindName(probe_kind);
  stop_after = Clamp(s, stop_after);
  SG_ASSIGN_OR_RETURN(const v1::HParams hp, ProbeHParams(s, overrides));
  const std::optional<v1::HParams> hparams =
      hp.ByteSizeLong() > 0 ? std::optional<v1::HParams>(hp) : std::nullopt;
  if (s.probes >= pol.budget().max_probes()) {
    return Inconclusive(s, absl::StrCat("budget exhausted: ", s.probes, " probes run (max_probes ",
                                        pol.budget().max_probes(), ") before the ", kind_name,
                                        " probe"));
  }
  if (s.reexecuted >= pol.budget().max_reexecuted_steps()) {
    return Inconclusive(s, absl::StrCat("budget exhausted: ", s.reexecuted,
                                        " steps re-executed (max_reexecuted_steps ",
                                        pol.budget().max_reexecuted_steps(), ")"));
  }
  lg::Action a;
  a.set_kind(ActionKindName(ActionKind::kRewind));
  a.set_request_id(RequestId(s, kind_name));
  a.set_probe_kind(kind_name);
  *a.mutable_checkpoint() = ToRecord(ckpt);
  *a.mutable_plan() = plan;
  a.set_stop_after_step(stop_after);
  if (checkpoint_at_step > ckpt.step && checkpoint_at_step <= stop_after) {
    a.set_checkpoint_at_step(checkpoint_at_step);
  }
  if (hparams) {
    *a.mutable_hparams() = *hparams;
    a.set_with_hparams(true);
  }
  a.set_judge_from(judge_from);
  a.set_judge_to(stop_after);
  a.set_rung(rung);
  a.set_hole_begin(hole_begin);
  a.set_hole_end(hole_end);
  for (int64_t x : include) a.add_include(x);
  if (sample_position >= 0) {
    a.set_sample_position(sample_position);
    for (int64_t x : kept_documents) a.add_kept_documents(x);
  }
  for (const auto& [b, e] : holes) {
    v1::DataRange* r = a.add_holes();
    r->set_begin(b);
    r->set_end(e);
  }
  a.set_needs_approval(ModeFor(s.run()) == v1::MODE_PROPOSE);
  a.set_reason(absl::StrCat(kind_name, " probe: rewind to step ", ckpt.step, ", plan ",
                            PlanText(plan), ", horizon step ", stop_after,
                            hparams ? absl::StrCat(", ", HParamsString(*hparams)) : "",
                            a.checkpoint_at_step() > 0
                                ? absl::StrCat(", checkpoint at step ", a.checkpoint_at_step())
                                : "",
                            why.empty() ? "" : " (", why, why.empty() ? "" : ")"));
  lg::EventPayload p;
  p.set_detail(a.reason());
  *p.mutable_action() = a;
  return Emit(s, EventKind::kRewindRequested, p);
}

absl::Status IncidentEngine::State::RequestContinue(IncidentCase& s, bool needs_approval,
                                                    int64_t verify_generation, int64_t verify_from,
                                                    int64_t verify_until, const std::string& why) {
  // The verification horizon, clamped to the schedule and said so.
  std::string reason = why;
  if (verify_until > 0) {
    const int64_t asked = verify_until;
    verify_until = Clamp(s, verify_until);
    if (verify_until < verify_from) {
      // Nothing of the schedule is left to verify.
      verify_until = 0;
      absl::StrAppend(&reason, "; nothing to verify: the run's schedule ends at step ",
                      Clamp(s, asked));
    } else if (verify_until < asked) {
      absl::StrAppend(&reason, "; verify through step ", verify_until,
                      ", the last step of the run's schedule (", asked, " asked)");
    } else {
      absl::StrAppend(&reason, "; verify through step ", verify_until);
    }
  }
  lg::Action a;
  a.set_kind(ActionKindName(ActionKind::kContinue));
  a.set_request_id(RequestId(s, "continue"));
  a.set_needs_approval(needs_approval);
  a.set_verify_generation(verify_generation);
  a.set_judge_from(verify_from);
  a.set_verify_until(verify_until);
  a.set_reason(reason);
  lg::EventPayload p;
  p.set_detail(reason);
  *p.mutable_action() = a;
  return Emit(s, EventKind::kContinueRequested, p);
}

absl::Status IncidentEngine::State::RequestPause(IncidentCase& s, const std::string& why) {
  lg::Action a;
  a.set_kind(ActionKindName(ActionKind::kPause));
  a.set_request_id(RequestId(s, "pause"));
  a.set_reason(why);
  lg::EventPayload p;
  p.set_detail(why);
  *p.mutable_action() = a;
  return Emit(s, EventKind::kPauseRequested, p);
}

absl::Status IncidentEngine::State::RequestQuarantine(IncidentCase& s) {
  lg::Action a;
  a.set_kind(ActionKindName(ActionKind::kQuarantine));
  a.set_request_id(RequestId(s, "quarantine"));
  const int64_t now_ms = clock->NowUnixMillis();
  std::set<std::pair<std::string, int64_t>> seen;
  for (const v1::DocumentRef& d : s.inc.documents()) {
    if (!seen.insert({d.domain(), d.document_id()}).second) continue;
    v1::QuarantineEntry* e = a.add_quarantine();
    e->set_run(s.run());
    e->set_domain(d.domain());
    e->set_document_id(d.document_id());
    const bool culprit = std::find(s.culprits.begin(), s.culprits.end(), d.data_position()) !=
                         s.culprits.end();
    e->set_reason(absl::StrCat(culprit ? "culprit batch (bisect) of " : "spike window of ",
                               "incident ", s.id(), ": step ", d.step(), ", data position ",
                               d.data_position()));
    e->set_incident_id(s.id());
    e->set_created_unix_ms(now_ms);
  }
  a.set_reason(absl::StrCat("quarantine ", a.quarantine_size(), " document(s) of the ",
                            s.culprits.empty() ? "window" : "culprit batch(es)"));
  lg::EventPayload p;
  p.set_detail(a.reason());
  *p.mutable_action() = a;
  return Emit(s, EventKind::kQuarantineRequested, p);
}

absl::Status IncidentEngine::State::Execute(IncidentCase& s) {
  const lg::Action a = *s.pending;
  lg::EventPayload p;
  p.mutable_done()->set_request_id(a.request_id());
  const std::optional<ActionKind> kind = ActionKindOf(a);
  if (!kind) return absl::InternalError(absl::StrCat("unknown action kind '", a.kind(), "'"));
  switch (*kind) {
    case ActionKind::kRewind: {
      RewindSpec spec;
      spec.request_id = a.request_id();
      spec.checkpoint = FromRecord(a.checkpoint());
      spec.plan = a.plan();
      spec.stop_after_step = a.stop_after_step();
      spec.checkpoint_at_step = a.checkpoint_at_step();
      if (a.with_hparams()) spec.hparams = a.hparams();
      spec.reason = a.reason();
      absl::StatusOr<int64_t> gen = controller->Rewind(s.run(), spec);
      if (!gen.ok()) {
        return absl::Status(gen.status().code(),
                            absl::StrCat("incident ", s.id(), ": rewind ", a.request_id(), ": ",
                                         gen.status().message()));
      }
      p.mutable_done()->set_generation(*gen);
      p.set_detail(absl::StrCat(a.probe_kind(), " probe started as generation ", *gen));
      if (*gen > watched[s.run()]) watched[s.run()] = *gen;
      return Emit(s, EventKind::kProbeStarted, p);
    }
    case ActionKind::kContinue:
      SG_RETURN_IF_ERROR(controller->Continue(s.run(), a.request_id(), std::nullopt));
      p.set_detail(a.verify_until() > 0
                       ? absl::StrCat("run continues; verifying through step ", a.verify_until())
                       : "run continues");
      return Emit(s, EventKind::kContinued, p);
    case ActionKind::kPause:
      SG_RETURN_IF_ERROR(controller->Pause(s.run(), a.request_id()));
      p.set_detail("run paused");
      return Emit(s, EventKind::kPaused, p);
    case ActionKind::kQuarantine:
      for (const v1::QuarantineEntry& e : a.quarantine()) {
        SG_RETURN_IF_ERROR(store->Quarantine(e));
      }
      p.set_detail(absl::StrCat(a.quarantine_size(), " document(s) quarantined"));
      return Emit(s, EventKind::kQuarantined, p);
  }
  return absl::InternalError(absl::StrCat("unknown action kind '", a.kind(), "'"));
}

}  // namespace spikeguard::incident
