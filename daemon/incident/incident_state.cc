#include "daemon/incident/incident_state.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

namespace {

constexpr std::array<std::pair<EventKind, const char*>, 24> kEventNames = {{
    {EventKind::kOpened, "opened"},
    {EventKind::kLocalized, "localized"},
    {EventKind::kCheckpoint, "checkpoint"},
    {EventKind::kRewindRequested, "rewind_requested"},
    {EventKind::kContinueRequested, "continue_requested"},
    {EventKind::kPauseRequested, "pause_requested"},
    {EventKind::kQuarantineRequested, "quarantine_requested"},
    {EventKind::kAbortRequested, "abort_requested"},
    {EventKind::kApproved, "approved"},
    {EventKind::kProbeStarted, "probe_started"},
    {EventKind::kContinued, "continued"},
    {EventKind::kPaused, "paused"},
    {EventKind::kQuarantined, "quarantined"},
    {EventKind::kNondeterminism, "nondeterminism"},
    {EventKind::kProbeFinished, "probe_finished"},
    {EventKind::kVerdict, "verdict"},
    {EventKind::kBisectResult, "bisect_result"},
    {EventKind::kTransplantSkipped, "transplant_skipped"},
    {EventKind::kVerified, "verified"},
    {EventKind::kVerificationFailed, "verification_failed"},
    {EventKind::kNote, "note"},
    {EventKind::kClosed, "closed"},
    {EventKind::kAborted, "aborted"},
    {EventKind::kWindowCheckpoint, "window_checkpoint"},
}};

constexpr std::array<std::pair<ActionKind, const char*>, 4> kActionNames = {{
    {ActionKind::kRewind, "rewind"},
    {ActionKind::kContinue, "continue"},
    {ActionKind::kPause, "pause"},
    {ActionKind::kQuarantine, "quarantine"},
}};

constexpr std::array<std::pair<ProbeKind, const char*>, 7> kProbeNames = {{
    {ProbeKind::kNone, ""},
    {ProbeKind::kReplay, "replay"},
    {ProbeKind::kSkip, "skip"},
    {ProbeKind::kBisect, "bisect"},
    {ProbeKind::kSampleBisect, "bisect_samples"},
    {ProbeKind::kTransplant, "transplant"},
    {ProbeKind::kFix, "fix"},
}};

constexpr std::array<std::pair<ProbeOutcome, const char*>, 5> kOutcomeNames = {{
    {ProbeOutcome::kPending, "pending"},
    {ProbeOutcome::kClean, "clean"},
    {ProbeOutcome::kSpiked, "spiked"},
    {ProbeOutcome::kNonFinite, "nonfinite"},
    {ProbeOutcome::kFailed, "failed"},
}};

template <typename E, size_t N>
const char* NameOf(const std::array<std::pair<E, const char*>, N>& names, E value) {
  for (const auto& [v, name] : names) {
    if (v == value) return name;
  }
  return "unknown";
}

template <typename E, size_t N>
std::optional<E> ValueOf(const std::array<std::pair<E, const char*>, N>& names,
                         absl::string_view name) {
  for (const auto& [v, n] : names) {
    if (name == n) return v;
  }
  return std::nullopt;
}

void AppendNote(IncidentCase& s, const std::string& note) {
  if (note.empty()) return;
  s.base_note = s.base_note.empty() ? note : absl::StrCat(s.base_note, "; ", note);
}

void RefreshNote(IncidentCase& s) {
  if (s.approval_wait()) {
    s.inc.set_note(absl::StrCat("awaiting approval: ", s.pending->reason(),
                                s.base_note.empty() ? "" : "; ", s.base_note));
  } else {
    s.inc.set_note(s.base_note);
  }
}

v1::IncidentState StateForAction(const IncidentCase& s, const lg::Action& a) {
  const std::optional<ActionKind> kind = ActionKindOf(a);
  if (kind == ActionKind::kRewind) return StateForProbe(ParseProbeKind(a.probe_kind()));
  if (kind == ActionKind::kContinue && a.verify_until() > 0) return v1::VERIFYING;
  return s.has_verdict ? v1::FIXING : s.inc.state();
}

void RefreshCost(IncidentCase& s, int64_t now_ms) {
  v1::Cost* cost = s.inc.mutable_cost();
  cost->set_probes(s.probes);
  cost->set_steps_reexecuted(s.reexecuted);
  const int64_t end_ms = s.inc.closed_unix_ms() > 0 ? s.inc.closed_unix_ms() : now_ms;
  cost->set_wall_time_s(std::max<int64_t>(0, end_ms - s.inc.opened_unix_ms()) / 1000.0);
  const double mean_step_s = s.time_count > 0 ? s.time_sum / s.time_count : 0.0;
  cost->set_gpu_hours(static_cast<double>(s.reexecuted) * mean_step_s *
                      std::max<uint32_t>(1, s.opened.world_size()) / 3600.0);
}

}  // namespace

const char* EventKindName(EventKind kind) { return NameOf(kEventNames, kind); }
std::optional<EventKind> ParseEventKind(absl::string_view name) {
  return ValueOf(kEventNames, name);
}
const char* ActionKindName(ActionKind kind) { return NameOf(kActionNames, kind); }
std::optional<ActionKind> ParseActionKind(absl::string_view name) {
  return ValueOf(kActionNames, name);
}
std::optional<ActionKind> ActionKindOf(const lg::Action& a) { return ParseActionKind(a.kind()); }
const char* ProbeKindName(ProbeKind kind) { return NameOf(kProbeNames, kind); }
ProbeKind ParseProbeKind(absl::string_view name) {
  return ValueOf(kProbeNames, name).value_or(ProbeKind::kNone);
}
const char* ProbeOutcomeName(ProbeOutcome outcome) { return NameOf(kOutcomeNames, outcome); }
ProbeOutcome ParseProbeOutcome(absl::string_view name) {
  return ValueOf(kOutcomeNames, name).value_or(ProbeOutcome::kFailed);
}
ProbeOutcome OutcomeOf(const lg::ProbeFinished& f) { return ParseProbeOutcome(f.outcome()); }

lg::CheckpointRecord ToRecord(const CheckpointInfo& c) {
  lg::CheckpointRecord r;
  r.set_generation(c.generation);
  r.set_step(c.step);
  r.set_uri(c.uri);
  r.set_checksum(c.checksum);
  r.set_complete(c.complete);
  return r;
}

CheckpointInfo FromRecord(const lg::CheckpointRecord& r) {
  return CheckpointInfo{r.generation(), r.step(), r.uri(), r.checksum(), r.complete()};
}

int32_t PersistedKind(Detection::Kind kind) {
  switch (kind) {
    case Detection::Kind::kLossSpike:
      return lg::LOSS_SPIKE;
    case Detection::Kind::kGradNormSpike:
      return lg::GRAD_NORM_SPIKE;
    case Detection::Kind::kNonFinite:
      return lg::NON_FINITE;
    case Detection::Kind::kPrecursor:
      return lg::PRECURSOR;
  }
  return lg::LOSS_SPIKE;
}

std::optional<Detection::Kind> DetectionKindOf(const lg::Opened& opened) {
  switch (opened.kind()) {
    case lg::LOSS_SPIKE:
      return Detection::Kind::kLossSpike;
    case lg::GRAD_NORM_SPIKE:
      return Detection::Kind::kGradNormSpike;
    case lg::NON_FINITE:
      return Detection::Kind::kNonFinite;
    case lg::PRECURSOR:
      return Detection::Kind::kPrecursor;
    default:
      return std::nullopt;
  }
}

std::string TriggerName(Detection::Kind kind) {
  switch (kind) {
    case Detection::Kind::kLossSpike:
      return "loss_spike";
    case Detection::Kind::kGradNormSpike:
      return "grad_norm_spike";
    case Detection::Kind::kNonFinite:
      return "nonfinite";
    case Detection::Kind::kPrecursor:
      return "precursor";
  }
  return "unknown";
}

v1::IncidentState StateForProbe(ProbeKind kind) {
  switch (kind) {
    case ProbeKind::kReplay:
      return v1::REPLAYING;
    case ProbeKind::kSkip:
      return v1::SKIPPING;
    case ProbeKind::kBisect:
    case ProbeKind::kSampleBisect:
      return v1::BISECTING;
    case ProbeKind::kTransplant:
      return v1::TRANSPLANTING;
    default:
      return v1::FIXING;
  }
}

std::string ToText(const lg::EventPayload& payload) {
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  std::string text;
  printer.PrintToString(payload, &text);
  return text;
}

namespace {

// The incident's localization, from the opened record.
void SetLocalization(IncidentCase& s) {
  const lg::Opened& o = s.opened;
  v1::Localization* loc = s.inc.mutable_localization();
  loc->set_signal(o.localized_signal());
  loc->set_layer(o.localized_layer());
  loc->set_start_step(o.has_precursor() ? std::min(o.precursor_onset_step(), o.onset_step())
                                        : o.onset_step());
  loc->clear_ordered();
  for (const std::string& x : o.localization_order()) loc->add_ordered(x);
}

void ApplyOpened(IncidentCase& s, const lg::EventPayload& p) {
  const lg::Opened& o = p.opened();
  s.opened = o;
  s.policy = o.policy();
  s.stage = Stage::kOpened;
  s.inc.set_run(o.run());
  s.inc.set_state(v1::DETECTED);
  const std::optional<Detection::Kind> kind = DetectionKindOf(o);
  s.inc.set_trigger(kind ? TriggerName(*kind) : std::string("unknown"));
  s.inc.set_generation(o.generation());
  s.inc.set_onset_step(o.onset_step());
  s.inc.set_peak_step(o.peak_step());
  s.inc.set_peak_value(o.peak_value());
  s.inc.set_baseline_value(o.baseline());
  if (o.has_precursor()) s.inc.set_precursor_onset_step(o.precursor_onset_step());
  s.inc.set_precursor(o.precursor());
  s.inc.set_opened_unix_ms(p.unix_ms());
  SetLocalization(s);
}

// A localization worked out after opening replaces the opened one.
void ApplyLocalized(IncidentCase& s, const lg::Localized& l) {
  s.opened.set_localized_signal(l.localized_signal());
  s.opened.set_localized_layer(l.localized_layer());
  *s.opened.mutable_localization_order() = l.localization_order();
  SetLocalization(s);
}

void ApplyRequested(IncidentCase& s, const lg::EventPayload& p) {
  s.pending = p.action();
  s.approved = false;
  ++s.actions;
  const lg::Action& a = p.action();
  const std::optional<ActionKind> kind = ActionKindOf(a);
  const ProbeKind probe_kind = ParseProbeKind(a.probe_kind());
  if (kind == ActionKind::kContinue ||
      (kind == ActionKind::kRewind && probe_kind == ProbeKind::kFix)) {
    s.fix_requested = true;
  }
  if (kind == ActionKind::kRewind && a.rung() > s.rung) s.rung = a.rung();
  // The rung that held becomes the incident's fix.
  if (kind == ActionKind::kContinue && s.rung > 0 && s.inc.verdict() == v1::FRAGILITY) {
    s.inc.set_fix(a.reason());
  }
  if (kind == ActionKind::kRewind && probe_kind == ProbeKind::kSkip) {
    if (!s.holes.empty()) ++s.skip_extensions;
    s.holes.clear();
    for (const v1::DataRange& r : a.holes()) s.holes.emplace_back(r.begin(), r.end());
    if (s.holes.empty()) s.holes.emplace_back(a.hole_begin(), a.hole_end());
  }
  s.inc.set_state(s.approval_wait() ? v1::AWAITING_APPROVAL : StateForAction(s, a));
}

void ApplyProbeStarted(IncidentCase& s, const lg::EventPayload& p) {
  if (s.pending) s.probe = *s.pending;
  s.pending.reset();
  s.probe_generation = p.done().generation();
  ++s.probes;
  s.stage = Stage::kProbing;
  s.judge.reset();
  s.inc.set_state(StateForProbe(s.probe_kind()));
  v1::Probe* probe = s.inc.add_probes();
  if (s.probe) {
    probe->set_kind(s.probe->probe_kind());
    probe->set_checkpoint_step(s.probe->checkpoint().step());
    *probe->mutable_data_plan() = s.probe->plan();
    probe->set_horizon_step(s.probe->stop_after_step());
    probe->set_detail(s.probe->reason());
  }
  probe->set_generation(p.done().generation());
  probe->set_outcome(ProbeOutcomeName(ProbeOutcome::kPending));
  probe->set_started_unix_ms(p.unix_ms());
}

void ApplyProbeFinished(IncidentCase& s, const lg::EventPayload& p) {
  const lg::ProbeFinished& f = p.finished();
  const ProbeOutcome outcome = OutcomeOf(f);
  s.last_finished = f;
  s.judge.reset();
  const ProbeKind probe_kind = s.probe_kind();
  s.outcomes[probe_kind] = outcome;
  if (probe_kind == ProbeKind::kSkip) s.skip_finished = f;
  s.reexecuted += f.steps_executed();
  s.time_sum += f.step_time_sum();
  s.time_count += f.step_count();
  if (outcome == ProbeOutcome::kNonFinite) {
    s.any_nonfinite = true;
    if (f.nonfinite_layer() >= 0 && s.nonfinite_layer < 0) s.nonfinite_layer = f.nonfinite_layer();
  }
  // A test of the group testing: the probe fed its part and was judged.
  const bool judged = outcome == ProbeOutcome::kClean || outcome == ProbeOutcome::kSpiked ||
                      outcome == ProbeOutcome::kNonFinite;
  if (probe_kind == ProbeKind::kBisect && s.probe && judged) {
    s.bisect_tests.emplace_back(
        std::vector<int64_t>(s.probe->include().begin(), s.probe->include().end()),
        outcome != ProbeOutcome::kClean);
  }
  if (probe_kind == ProbeKind::kSampleBisect && s.probe && judged) {
    s.sample_tests[s.probe->sample_position()].emplace_back(
        std::vector<int64_t>(s.probe->kept_documents().begin(), s.probe->kept_documents().end()),
        outcome != ProbeOutcome::kClean);
  }
  if (probe_kind == ProbeKind::kTransplant) {
    s.transplant_done = true;
    AppendNote(s, p.note());
  }
  if (s.inc.probes_size() > 0) {
    v1::Probe* probe = s.inc.mutable_probes(s.inc.probes_size() - 1);
    probe->set_outcome(f.outcome());
    probe->set_detail(f.detail());
    probe->set_steps_executed(f.steps_executed());
    probe->set_finished_unix_ms(p.unix_ms());
  }
  s.stage = s.has_verdict ? Stage::kFix : Stage::kJudge;
}

void ApplyVerdict(IncidentCase& s, const lg::EventPayload& p) {
  const lg::VerdictRecord& v = p.verdict();
  if (s.has_verdict && s.verdict == v1::FRAGILITY && v.verdict() == v1::DATA) {
    // The escalated fixes failed and the clean skip stands: the DATA fix
    // starts afresh (its own rewind, verification and quarantine).
    s.fix_requested = false;
    s.continued = false;
    s.verified = false;
  }
  s.escalated = v.escalated();
  s.has_verdict = true;
  s.verdict = v.verdict();
  s.verdict_ms = p.unix_ms();
  s.inc.set_verdict(v.verdict());
  s.inc.set_confidence(v.confidence());
  // Advice gathered before (e.g. qk-norm when an INCONCLUSIVE follows a
  // FRAGILITY ladder) is kept; new advice is added once.
  for (const std::string& r : v.recommendations()) {
    if (std::find(s.inc.recommendations().begin(), s.inc.recommendations().end(), r) ==
        s.inc.recommendations().end()) {
      s.inc.add_recommendations(r);
    }
  }
  if (v.documents_size() > 0) {
    s.inc.clear_documents();
    for (const auto& d : v.documents()) *s.inc.add_documents() = d;
  }
  if (!v.fix().empty()) s.inc.set_fix(v.fix());
  AppendNote(s, v.note());
  if (v.verdict() == v1::NUMERICS) {
    const int layer = s.nonfinite_layer >= 0 ? s.nonfinite_layer : s.opened.localized_layer();
    if (layer >= 0) {
      s.inc.mutable_localization()->set_signal("non-finite");
      s.inc.mutable_localization()->set_layer(layer);
    }
  }
  if (p.text() == "leave_running") s.leave_running = true;
  s.judge.reset();
  s.stage = Stage::kFix;
  s.inc.set_state(v1::FIXING);
}

void ApplyContinued(IncidentCase& s) {
  const lg::Action a = s.pending.value_or(lg::Action());
  s.pending.reset();
  s.continued = true;
  if (!s.aborting && s.probe_generation >= 0) {
    s.inc.set_continued_generation(a.verify_generation() >= 0 && a.verify_until() > 0
                                       ? a.verify_generation()
                                       : s.probe_generation);
  }
  if (a.verify_until() <= 0) s.verified = true;  // nothing to verify
  if (a.verify_until() > 0 && !s.aborting) {
    s.stage = Stage::kVerifying;
    s.verify_generation = a.verify_generation();
    s.verify_from = a.judge_from();
    s.verify_until = a.verify_until();
    s.inc.set_state(v1::VERIFYING);
  }
}

void ApplyKnown(IncidentCase& s, EventKind kind, const lg::EventPayload& p) {
  switch (kind) {
    case EventKind::kOpened:
      ApplyOpened(s, p);
      return;
    case EventKind::kLocalized:
      ApplyLocalized(s, p.localized());
      return;
    case EventKind::kCheckpoint:
      s.chosen = p.checkpoint();
      s.stage = Stage::kReady;
      s.excluded_uris.assign(p.checkpoint().excluded_uris().begin(),
                             p.checkpoint().excluded_uris().end());
      // A retry from another checkpoint starts the protocol over.
      s.outcomes.clear();
      s.holes.clear();
      s.skip_extensions = 0;
      s.skip_finished.reset();
      s.bisect_tests.clear();
      s.sample_tests.clear();
      s.probe.reset();
      s.last_finished.reset();
      s.window_checkpoint.reset();
      AppendNote(s, p.note());
      return;
    case EventKind::kWindowCheckpoint:
      s.window_checkpoint = p.checkpoint().checkpoint();
      AppendNote(s, p.note());
      return;
    case EventKind::kRewindRequested:
    case EventKind::kContinueRequested:
    case EventKind::kPauseRequested:
    case EventKind::kQuarantineRequested:
      ApplyRequested(s, p);
      return;
    case EventKind::kAbortRequested:
      s.pending = p.action();
      s.approved = true;
      ++s.actions;
      s.aborting = true;
      s.judge.reset();
      s.stage = Stage::kFix;
      AppendNote(s, p.note());
      return;
    case EventKind::kApproved:
      s.approved = true;
      if (s.pending) s.inc.set_state(StateForAction(s, *s.pending));
      return;
    case EventKind::kProbeStarted:
      ApplyProbeStarted(s, p);
      return;
    case EventKind::kNondeterminism:
      s.nondet_step = p.step();
      s.confidence_factor = 0.5;
      if (s.has_verdict) s.inc.set_confidence(s.inc.confidence() * 0.5);
      AppendNote(s, p.note());
      return;
    case EventKind::kProbeFinished:
      ApplyProbeFinished(s, p);
      return;
    case EventKind::kVerdict:
      ApplyVerdict(s, p);
      return;
    case EventKind::kBisectResult: {
      const lg::Culprit& c = p.culprit();
      s.bisect_done = true;
      s.culprits.assign(c.positions().begin(), c.positions().end());
      s.culprits.insert(s.culprits.end(), c.group_positions().begin(), c.group_positions().end());
      s.inc.clear_culprit_positions();
      for (int64_t x : s.culprits) s.inc.add_culprit_positions(x);
      s.inc.clear_suspects();
      for (const auto& d : c.suspects()) *s.inc.add_suspects() = d;
      s.inc.clear_near_duplicates();
      for (const auto& d : c.near_duplicates()) *s.inc.add_near_duplicates() = d;
      AppendNote(s, p.note());
      return;
    }
    case EventKind::kTransplantSkipped:
      s.transplant_done = true;
      AppendNote(s, p.note());
      return;
    case EventKind::kContinued:
      ApplyContinued(s);
      return;
    case EventKind::kPaused:
      s.pending.reset();
      s.paused = true;
      return;
    case EventKind::kQuarantined:
      s.pending.reset();
      s.quarantined = true;
      return;
    case EventKind::kVerified:
      s.verified = true;
      s.judge.reset();
      s.stage = Stage::kFix;
      s.inc.set_state(v1::FIXING);
      return;
    case EventKind::kVerificationFailed:
      s.judge.reset();
      s.stage = Stage::kFix;
      AppendNote(s, p.note());
      return;
    case EventKind::kNote:
      AppendNote(s, p.note());
      return;
    case EventKind::kClosed:
    case EventKind::kAborted:
      s.pending.reset();
      s.judge.reset();
      s.stage = Stage::kClosed;
      s.inc.set_state(kind == EventKind::kClosed ? v1::CLOSED : v1::ABORTED);
      s.inc.set_closed_unix_ms(p.unix_ms());
      AppendNote(s, p.note());
      return;
  }
}

}  // namespace

void Apply(IncidentCase& s, int64_t seq, const std::string& kind, const lg::EventPayload& p) {
  v1::IncidentEvent* ev = s.inc.add_events();
  ev->set_seq(seq);
  ev->set_unix_ms(p.unix_ms());
  ev->set_kind(kind);
  ev->set_detail(p.detail());
  if (const std::optional<EventKind> known = ParseEventKind(kind)) ApplyKnown(s, *known, p);
  RefreshNote(s);
  RefreshCost(s, p.unix_ms());
}

}  // namespace spikeguard::incident
