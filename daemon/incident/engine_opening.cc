// engine_opening.cc
// -----------------------------------------------------------------------------
// How an incident opens: one incident per event (another detector firing for
// the same onset is a note on it), the "opened" record persisted and
// published first, then the deferred localization as a "localized" event,
// then the engine acts (IncidentEngine::State::Advance).
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "daemon/incident/engine.h"
#include "daemon/incident/engine_internal.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

absl::Status IncidentEngine::OnDetection(const std::string& run, const Detection& d) {
  State& st = *state_;
  st.Retire();
  auto it = st.watched.try_emplace(run, d.generation).first;
  if (d.generation < it->second) return absl::OkStatus();  // a stale timeline
  it->second = d.generation;
  // A probe's own spikes are its outcome, never an incident of their own.
  if (st.IsProbeGeneration(run, d.generation)) return absl::OkStatus();
  // One event, one incident: another detector firing for the same onset of
  // the same generation is evidence of the incident already opened for it.
  // Read once: each read of the policy is a few catalog queries.
  const v1::Policy policy = st.view->PolicyFor(run);
  const v1::ProbePolicy& probe = policy.probe();
  const int64_t same_event = std::max<int64_t>(8, probe.skip_before() + probe.skip_after());
  std::optional<int64_t> same;
  st.ForEachKnown(run, [&](const State::Past& past) {
    if (past.generation != d.generation || std::llabs(past.onset - d.onset_step) > same_event) {
      return true;
    }
    same = past.id;
    return false;
  });
  if (same) {
    auto open = st.incidents.find(*same);
    if (open != st.incidents.end() && open->second->stage != Stage::kClosed) {
      lg::EventPayload p;
      p.set_detail(absl::StrFormat("also %s at step %d (peak %.4g, baseline %.4g)",
                                   TriggerName(d.kind), d.onset_step, d.peak_value, d.baseline));
      p.set_note(p.detail());
      SG_RETURN_IF_ERROR(st.Emit(*open->second, EventKind::kNote, p));
    }
    return absl::OkStatus();
  }
  if (st.ActiveFor(run) != nullptr) return absl::OkStatus();  // belongs to the active incident

  v1::Incident initial;
  initial.set_run(run);
  initial.set_state(v1::DETECTED);
  initial.set_trigger(TriggerName(d.kind));
  initial.set_generation(d.generation);
  initial.set_onset_step(d.onset_step);
  initial.set_opened_unix_ms(st.clock->NowUnixMillis());
  auto s = std::make_unique<IncidentCase>();
  s->inc = initial;
  IncidentCase& inc = *s;

  lg::EventPayload p;
  lg::Opened* o = p.mutable_opened();
  o->set_run(run);
  o->set_kind(PersistedKind(d.kind));
  o->set_generation(d.generation);
  o->set_onset_step(d.onset_step);
  o->set_peak_step(d.peak_step);
  o->set_peak_value(d.peak_value);
  o->set_baseline(d.baseline);
  o->set_has_precursor(d.precursor_onset_step.has_value());
  o->set_precursor_onset_step(d.precursor_onset_step.value_or(0));
  o->set_precursor(d.precursor);
  o->set_localized_signal(d.localized_signal);
  o->set_localized_layer(d.localized_layer);
  for (const auto& x : d.localization_order) o->add_localization_order(x);
  *o->mutable_policy() = policy;
  o->set_world_size(st.view->WorldSize(run));
  p.set_detail(absl::StrFormat(
      "%s at step %d (peak %.4g at step %d, baseline %.4g) in generation %d%s%s",
      TriggerName(d.kind), d.onset_step, d.peak_value, d.peak_step, d.baseline, d.generation,
      d.precursor_onset_step ? absl::StrCat("; precursor ", d.precursor, " from step ",
                                            *d.precursor_onset_step)
                             : std::string(),
      d.also.empty() ? std::string() : absl::StrCat("; also ", absl::StrJoin(d.also, ", "))));
  // The incident and its "opened" event in one transaction: no incident
  // is ever stored without the event that explains it.
  p.set_unix_ms(st.clock->NowUnixMillis());
  const std::string text = ToText(p);
  if (st.decided) st.decided(run);
  SG_ASSIGN_OR_RETURN(int64_t id, st.store->CreateWithEvent(
                                      run, initial, EventKindName(EventKind::kOpened), text,
                                      [&](int64_t new_id, int64_t seq) -> const v1::Incident& {
                                        inc.inc.set_id(new_id);
                                        Apply(inc, seq, EventKind::kOpened, p);
                                        return inc.inc;
                                      },
                                      [&] { st.Tell(inc); }));
  st.incidents[id] = std::move(s);
  if (d.localize) SG_RETURN_IF_ERROR(st.EmitLocalized(inc, d));
  return st.Advance(inc);
}

absl::Status IncidentEngine::State::EmitLocalized(IncidentCase& s, const Detection& d) {
  Detection found = d;
  d.localize(&found);
  if (found.localized_signal.empty() && found.localization_order.empty()) {
    return absl::OkStatus();  // no series left its baseline: nothing to add
  }
  lg::EventPayload p;
  lg::Localized* l = p.mutable_localized();
  l->set_localized_signal(found.localized_signal);
  l->set_localized_layer(found.localized_layer);
  for (const std::string& x : found.localization_order) l->add_localization_order(x);
  p.set_detail(absl::StrCat(
      "localized: ", found.localized_signal,
      found.localized_layer >= 0 ? absl::StrCat(" in layer ", found.localized_layer) : "",
      " moved first",
      found.localization_order.empty()
          ? std::string()
          : absl::StrCat(" (order: ", absl::StrJoin(found.localization_order, ", "), ")")));
  return Emit(s, EventKind::kLocalized, std::move(p));
}

}  // namespace spikeguard::incident
