// The incident engine's orchestration (engine.h): the public API, the next
// decision of an incident, and the wiring of its probe judge. The concerns it
// drives have their own files (engine_internal.h lists them).
#include "daemon/incident/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "daemon/detect/spike_detector.h"
#include "daemon/incident/engine_internal.h"
#include "daemon/incident/policy.h"
#include "google/protobuf/text_format.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

void IncidentEngine::State::LoadHistory(const std::string& run) {
  if (!history_loaded.insert(run).second) return;
  auto all = store->RunIncidents(run);
  if (!all.ok()) {
    history_loaded.erase(run);
    return;
  }
  for (const v1::Incident& i : *all) {
    if (incidents.count(i.id()) || retired.count(i.id())) continue;
    Past p;
    p.id = i.id();
    p.generation = i.generation();
    p.onset = i.onset_step();
    for (const v1::Probe& pr : i.probes()) p.probe_generations.push_back(pr.generation());
    if (i.has_continued_generation()) p.continued_generation = i.continued_generation();
    history[run].push_back(std::move(p));
  }
}

IncidentEngine::State::Past IncidentEngine::State::PastOf(int64_t id, const IncidentCase& s) {
  Past p;
  p.id = id;
  p.generation = s.opened.generation();
  p.onset = s.onset();
  for (const v1::Probe& pr : s.inc.probes()) p.probe_generations.push_back(pr.generation());
  if (s.inc.has_continued_generation()) p.continued_generation = s.inc.continued_generation();
  return p;
}

void IncidentEngine::State::Retire() {
  for (auto it = incidents.begin(); it != incidents.end();) {
    if (it->second->stage != Stage::kClosed) {
      ++it;
      continue;
    }
    history[it->second->run()].push_back(PastOf(it->first, *it->second));
    retired[it->first] = it->second->inc.state();
    it = incidents.erase(it);
  }
}

void IncidentEngine::State::ForEachKnown(const std::string& run,
                                         const std::function<bool(const Past&)>& visit) {
  LoadHistory(run);
  for (const Past& p : history[run]) {
    if (!visit(p)) return;
  }
  for (const auto& [id, s] : incidents) {
    if (s->run() == run && !visit(PastOf(id, *s))) return;
  }
}

// A probe's generation is an experiment, not the run: its spikes are the
// probe's outcome and never open incidents, unless the run was let go on
// with it (then it is the run's timeline).
bool IncidentEngine::State::IsProbeGeneration(const std::string& run, int64_t generation) {
  bool probe = false, continued = false;
  ForEachKnown(run, [&](const Past& p) {
    if (p.continued_generation && *p.continued_generation == generation) {
      continued = true;
      return false;
    }
    if (std::find(p.probe_generations.begin(), p.probe_generations.end(), generation) !=
        p.probe_generations.end()) {
      probe = true;
    }
    return true;
  });
  return probe && !continued;
}

IncidentCase* IncidentEngine::State::ActiveFor(const std::string& run) {
  for (auto& [id, s] : incidents) {
    if (s->run() == run && s->stage != Stage::kClosed) return s.get();
  }
  return nullptr;
}

v1::Mode IncidentEngine::State::ModeFor(const std::string& run) {
  return view->PolicyFor(run).mode();
}

void IncidentEngine::State::Tell(const IncidentCase& s) {
  if (listener) listener(s.inc, s.inc.events(s.inc.events_size() - 1));
}

absl::Status IncidentEngine::State::Emit(IncidentCase& s, EventKind kind,
                                         lg::EventPayload payload) {
  payload.set_unix_ms(clock->NowUnixMillis());
  // The event and the record it leaves, in one transaction.
  return store
      ->AppendAndSave(
          s.id(), EventKindName(kind), ToText(payload),
          [&](int64_t seq) -> const v1::Incident& {
            Apply(s, seq, kind, payload);
            return s.inc;
          },
          [&] { Tell(s); })
      .status();
}

absl::Status IncidentEngine::State::EmitNote(IncidentCase& s, const std::string& note) {
  lg::EventPayload p;
  p.set_detail(note);
  p.set_note(note);
  return Emit(s, EventKind::kNote, p);
}


absl::StatusOr<bool> IncidentEngine::State::Decide(IncidentCase& s) {
  switch (s.stage) {
    case Stage::kOpened: {
      const v1::Mode mode = ModeFor(s.run());
      if (mode == v1::MODE_OBSERVE || mode == v1::MODE_UNSPECIFIED) {
        SG_RETURN_IF_ERROR(EmitVerdict(s, v1::VERDICT_UNSPECIFIED, 0.0,
                                       "observe mode: no probes", {}, "none (observe mode)", {},
                                       false, /*leave_running=*/true));
        return true;
      }
      SG_RETURN_IF_ERROR(PickProbeCheckpoint(s));
      return true;
    }
    case Stage::kReady:
      SG_RETURN_IF_ERROR(ProposeReplay(s));
      return true;
    case Stage::kProbing:
    case Stage::kVerifying:
      if (NeedsQuarantine(s)) {
        SG_RETURN_IF_ERROR(RequestQuarantine(s));
        return true;
      }
      if (!s.judge) SG_RETURN_IF_ERROR(BuildJudge(s));
      return HandleJudge(s);
    case Stage::kJudge: {
      const ProbeKind kind = s.probe_kind();
      const std::string kind_name = s.probe ? s.probe->probe_kind() : "";
      const ProbeOutcome outcome =
          s.last_finished ? OutcomeOf(*s.last_finished) : ProbeOutcome::kFailed;
      if (outcome == ProbeOutcome::kFailed) {
        const std::string detail = s.last_finished ? s.last_finished->detail() : "no outcome";
        if (s.last_finished && s.last_finished->command_failed()) {
          // The workers could not start the probe (e.g. the checkpoint is
          // gone): the next candidate checkpoint, or a clear verdict.
          SG_RETURN_IF_ERROR(RetryCheckpoint(s, detail));
        } else {
          SG_RETURN_IF_ERROR(Inconclusive(s, absl::StrCat(kind_name, " probe failed: ", detail)));
        }
        return true;
      }
      if (kind == ProbeKind::kReplay) {
        if (outcome == ProbeOutcome::kClean) {
          SG_RETURN_IF_ERROR(EmitTransient(s));
        } else {
          SG_RETURN_IF_ERROR(FindWindowCheckpoint(s));
          SG_RETURN_IF_ERROR(ProposeSkip(s));
        }
        return true;
      }
      if (kind == ProbeKind::kSkip) {
        SG_RETURN_IF_ERROR(VerdictAfterSkip(s));
        return true;
      }
      if (kind == ProbeKind::kBisect || kind == ProbeKind::kSampleBisect) {
        SG_RETURN_IF_ERROR(BisectStep(s));
        return true;
      }
      SG_RETURN_IF_ERROR(Inconclusive(s, absl::StrCat("unexpected probe '", kind_name, "'")));
      return true;
    }
    case Stage::kFix:
      return FixStep(s);
    case Stage::kClosed:
      return false;
  }
  return false;
}

absl::Status IncidentEngine::State::Advance(IncidentCase& s) {
  for (int guard = 0; guard < 256; ++guard) {
    if (s.stage == Stage::kClosed) return absl::OkStatus();
    if (s.pending) {
      if (s.approval_wait()) return absl::OkStatus();
      SG_RETURN_IF_ERROR(Execute(s));
      continue;
    }
    SG_ASSIGN_OR_RETURN(bool progressed, Decide(s));
    if (!progressed) return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("incident ", s.id(), ": no fixed point"));
}


// -----------------------------------------------------------------------------

IncidentEngine::IncidentEngine(Clock* clock, RunController* controller, RunView* view,
                               IncidentStore* store, Options options)
    : state_(std::make_unique<State>()) {
  state_->clock = clock;
  state_->controller = controller;
  state_->view = view;
  state_->store = store;
  state_->options = options;
}

IncidentEngine::~IncidentEngine() = default;

void IncidentEngine::SetListener(Listener listener) { state_->listener = std::move(listener); }

void IncidentEngine::SetDecisionObserver(DecisionObserver observer) {
  state_->decided = std::move(observer);
}

absl::Status IncidentEngine::Recover() {
  State& st = *state_;
  SG_ASSIGN_OR_RETURN(std::vector<v1::Incident> open, st.store->OpenIncidents());
  std::vector<IncidentCase*> resumed;
  for (const v1::Incident& stored : open) {
    if (st.incidents.count(stored.id())) continue;
    SG_ASSIGN_OR_RETURN(std::vector<IncidentStore::StoredEvent> events,
                        st.store->Events(stored.id()));
    auto s = std::make_unique<IncidentCase>();
    s->inc.set_id(stored.id());
    s->inc.set_run(stored.run());
    for (const auto& e : events) {
      lg::EventPayload p;
      if (!google::protobuf::TextFormat::ParseFromString(e.payload, &p)) {
        return absl::DataLossError(absl::StrCat("incident ", stored.id(), ": event ", e.seq, " (",
                                                e.kind, ") has an unreadable payload"));
      }
      Apply(*s, e.seq, e.kind, p);
    }
    if (events.empty() || s->opened.run().empty()) {
      // Created but crashed before its first event: nothing was done for it.
      v1::Incident dead = stored;
      dead.set_state(v1::ABORTED);
      dead.set_note("the daemon stopped before the incident's first event; nothing was done");
      dead.set_closed_unix_ms(st.clock->NowUnixMillis());
      SG_RETURN_IF_ERROR(st.store->SaveIncident(dead));
      continue;
    }
    int64_t& watched = st.watched[s->run()];
    watched =
        std::max({watched, s->opened.generation(), s->probe_generation, s->verify_generation});
    IncidentCase* raw = s.get();
    st.incidents[stored.id()] = std::move(s);
    resumed.push_back(raw);
  }
  absl::Status first;
  for (IncidentCase* s : resumed) {
    SG_LOG(INFO) << "incident " << s->id() << " (run " << s->run() << "): resuming from "
                 << s->inc.events_size() << " event(s), state "
                 << v1::IncidentState_Name(s->inc.state());
    if (absl::Status status = st.Advance(*s); !status.ok() && first.ok()) first = status;
  }
  return first;
}

absl::Status IncidentEngine::OnStep(const std::string& run, const StepObservation& step) {
  State& st = *state_;
  st.Retire();
  int64_t& watched = st.watched[run];
  watched = std::max(watched, step.generation);
  // The run's past incidents are read with its first steps, not at its
  // first detection: that one is judged while the group that carried it
  // holds its commit for the incident to join.
  st.LoadHistory(run);
  IncidentCase* s = st.ActiveFor(run);
  if (s == nullptr || (s->stage != Stage::kProbing && s->stage != Stage::kVerifying)) {
    return absl::OkStatus();
  }
  if (!s->judge) {
    // Built from the view, which already holds this step.
    SG_RETURN_IF_ERROR(st.BuildJudge(*s));
  }
  s->judge->Feed(step, st.clock->Now());
  SG_ASSIGN_OR_RETURN(bool changed, st.HandleJudge(*s));
  if (!changed && !s->pending) return absl::OkStatus();
  return st.Advance(*s);
}

absl::Status IncidentEngine::OnGenerationEnded(const std::string& run, int64_t generation,
                                               int64_t last_step, const std::string& reason) {
  State& st = *state_;
  st.Retire();
  auto [it, fresh] = st.ended.try_emplace({run, generation}, last_step, reason);
  if (!fresh) {
    if (it->second.first <= last_step) return absl::OkStatus();  // an earlier rank said more
    it->second = {last_step, reason};
  }
  IncidentCase* s = st.ActiveFor(run);
  if (s == nullptr || (s->stage != Stage::kProbing && s->stage != Stage::kVerifying) ||
      s->pending) {
    return absl::OkStatus();
  }
  if (!s->judge) SG_RETURN_IF_ERROR(st.BuildJudge(*s));
  if (s->judge->generation != generation) return absl::OkStatus();
  s->judge->ended_at = last_step;
  s->judge->ended_reason = reason;
  s->judge->EndEarly();
  SG_ASSIGN_OR_RETURN(bool changed, st.HandleJudge(*s));
  if (!changed) return absl::OkStatus();
  return st.Advance(*s);
}

absl::Status IncidentEngine::OnCommandFailed(const std::string& run, const std::string& command_id,
                                             const std::string& message) {
  State& st = *state_;
  st.Retire();
  IncidentCase* s = st.ActiveFor(run);
  if (s == nullptr) return absl::OkStatus();
  const bool probe_command = s->stage == Stage::kProbing && !s->pending && s->probe &&
                             s->probe->request_id() == command_id;
  if (!probe_command) {
    // Not a probe's rewind (e.g. a continue): noted; the engine goes on.
    if (absl::StartsWith(command_id, absl::StrCat("incident-", s->id(), "/"))) {
      SG_RETURN_IF_ERROR(
          st.EmitNote(*s, absl::StrCat("command ", command_id, " failed: ", message)));
    }
    return absl::OkStatus();
  }
  if (!s->judge) SG_RETURN_IF_ERROR(st.BuildJudge(*s));
  if (s->judge->result) return absl::OkStatus();  // judged already
  lg::EventPayload p;
  lg::ProbeFinished* f = p.mutable_finished();
  f->set_outcome(ProbeOutcomeName(ProbeOutcome::kFailed));
  f->set_command_failed(true);
  f->set_detail(absl::StrCat("the workers could not execute ", command_id, ": ", message));
  f->set_last_step(s->judge->last_fed);
  f->set_steps_executed(std::max<int64_t>(0, s->judge->last_fed - s->judge->checkpoint_step + 1));
  f->set_spike_step(-1);
  f->set_spike_position(-1);
  f->set_nonfinite_layer(-1);
  p.set_detail(absl::StrCat(s->probe->probe_kind(), " probe (generation ", s->probe_generation,
                            "): failed: ", f->detail()));
  SG_RETURN_IF_ERROR(st.Emit(*s, EventKind::kProbeFinished, p));
  return st.Advance(*s);
}

absl::Status IncidentEngine::Tick() {
  State& st = *state_;
  st.Retire();
  absl::Status first;
  const absl::Time now = st.clock->Now();
  std::vector<IncidentCase*> active;
  for (auto& [id, s] : st.incidents) {
    if (s->stage != Stage::kClosed) active.push_back(s.get());
  }
  for (IncidentCase* s : active) {
    absl::Status status;
    if (s->stage == Stage::kProbing && !s->pending && s->judge && !s->judge->result &&
        now - s->judge->last_progress >= st.options.probe_timeout) {
      s->judge->Finish(ProbeOutcome::kFailed,
                       absl::StrCat("timeout: no step of generation ", s->judge->generation,
                                    " for ", absl::FormatDuration(now - s->judge->last_progress)),
                       -1, -1);
      auto handled = st.HandleJudge(*s);
      status = handled.status();
    }
    // Retries actions that failed (e.g. workers not reachable) and moves on.
    if (status.ok()) status = st.Advance(*s);
    if (!status.ok()) {
      SG_LOG(WARNING) << "incident " << s->id() << ": " << status;
      if (first.ok()) first = status;
    }
  }
  return first;
}

absl::Status IncidentEngine::Approve(int64_t incident_id) {
  State& st = *state_;
  st.Retire();
  auto it = st.incidents.find(incident_id);
  if (it == st.incidents.end()) {
    if (auto r = st.retired.find(incident_id); r != st.retired.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("incident ", incident_id, " is not awaiting approval (state ",
                       v1::IncidentState_Name(r->second), ")"));
    }
    return absl::NotFoundError(absl::StrCat("incident ", incident_id, " is not active"));
  }
  IncidentCase& s = *it->second;
  if (!s.approval_wait()) {
    return absl::FailedPreconditionError(
        absl::StrCat("incident ", incident_id, " is not awaiting approval (state ",
                     v1::IncidentState_Name(s.inc.state()), ")"));
  }
  lg::EventPayload p;
  p.set_detail(absl::StrCat("approved: ", s.pending->reason()));
  SG_RETURN_IF_ERROR(st.Emit(s, EventKind::kApproved, p));
  return st.Advance(s);
}

absl::Status IncidentEngine::Abort(int64_t incident_id, const std::string& reason) {
  State& st = *state_;
  st.Retire();
  auto it = st.incidents.find(incident_id);
  if (it == st.incidents.end()) {
    if (auto r = st.retired.find(incident_id); r != st.retired.end()) {
      if (r->second == v1::ABORTED) return absl::OkStatus();
      return absl::FailedPreconditionError(
          absl::StrCat("incident ", incident_id, " is already closed"));
    }
    return absl::NotFoundError(absl::StrCat("incident ", incident_id, " is not active"));
  }
  IncidentCase& s = *it->second;
  if (s.inc.state() == v1::ABORTED || s.aborting) return absl::OkStatus();
  if (s.stage == Stage::kClosed) {
    return absl::FailedPreconditionError(
        absl::StrCat("incident ", incident_id, " is already closed"));
  }
  lg::Action a;
  a.set_kind(ActionKindName(ActionKind::kContinue));
  a.set_request_id(absl::StrCat("incident-", s.id(), "/abort"));
  a.set_reason(absl::StrCat("abort: ", reason));
  lg::EventPayload p;
  *p.mutable_action() = a;
  p.set_note(absl::StrCat("aborted by an operator: ", reason.empty() ? "no reason given" : reason));
  p.set_detail(p.note());
  SG_RETURN_IF_ERROR(st.Emit(s, EventKind::kAbortRequested, p));
  return st.Advance(s);
}

bool IncidentEngine::ProbeRunning(const std::string& run) const {
  for (const auto& [id, s] : state_->incidents) {
    if (s->run() != run || s->stage == Stage::kClosed) continue;
    if (s->stage == Stage::kProbing) return true;
    if (s->pending && ActionKindOf(*s->pending) == ActionKind::kRewind && !s->approval_wait()) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<int64_t> IncidentEngine::OperatorRewind(const std::string& run,
                                                       const RewindSpec& spec) {
  if (ProbeRunning(run)) {
    return absl::FailedPreconditionError(
        absl::StrCat("run '", run, "' is running an incident probe; wait for it or "
                     "abort the incident first"));
  }
  return state_->controller->Rewind(run, spec);
}

std::optional<v1::Incident> IncidentEngine::Get(int64_t incident_id) const {
  auto it = state_->incidents.find(incident_id);
  if (it == state_->incidents.end()) return std::nullopt;
  return it->second->inc;
}

std::vector<v1::Incident> IncidentEngine::Active() const {
  std::vector<v1::Incident> out;
  for (const auto& [id, s] : state_->incidents) {
    if (s->stage != Stage::kClosed) out.push_back(s->inc);
  }
  return out;
}

}  // namespace spikeguard::incident
