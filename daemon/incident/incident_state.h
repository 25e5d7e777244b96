// incident_state.h
// -----------------------------------------------------------------------------
// One incident's state, and the fold that builds it from its event log. The
// `incident_events` log is the truth (engine.h): the engine appends an event
// and then applies it with Apply(); Recover() applies the stored events in
// order, so a restarted daemon reaches the same state by the same code.
//
// Event kinds, action kinds, probe kinds and probe outcomes are enums here;
// their names are the persisted (and wire: v1::IncidentEvent.kind,
// v1::Probe.kind/outcome) strings, converted only at that edge by the
// *Name / Parse* functions below, so existing logs load unchanged.
//
//   IncidentCase c;
//   for (const auto& e : stored_events) Apply(c, e.seq, e.kind, payload_of(e));
//   if (c.stage == Stage::kProbing) ...
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "daemon/incident/engine.h"
#include "daemon/incident/engine_events.pb.h"
#include "daemon/incident/probe_judge.h"

namespace spikeguard::incident {

namespace lg = spikeguard::incident::log;

// Event kinds of the log; the names are the persisted format.
enum class EventKind {
  kOpened,
  kLocalized,
  kCheckpoint,
  kRewindRequested,
  kContinueRequested,
  kPauseRequested,
  kQuarantineRequested,
  kAbortRequested,
  kApproved,
  kProbeStarted,
  kContinued,
  kPaused,
  kQuarantined,
  kNondeterminism,
  kProbeFinished,
  kVerdict,
  kBisectResult,
  kTransplantSkipped,
  kVerified,
  kVerificationFailed,
  kNote,
  kClosed,
  kAborted,
  // The replay's checkpoint where the skip window starts, found
  // (payload.checkpoint): data-only probes start there.
  kWindowCheckpoint,
};
const char* EventKindName(EventKind kind);
// nullopt for a name this build does not know (such an event is kept in the
// incident's history and changes nothing else).
std::optional<EventKind> ParseEventKind(absl::string_view name);

// lg::Action.kind.
enum class ActionKind { kRewind, kContinue, kPause, kQuarantine };
const char* ActionKindName(ActionKind kind);
std::optional<ActionKind> ParseActionKind(absl::string_view name);
std::optional<ActionKind> ActionKindOf(const lg::Action& a);

// lg::Action.probe_kind and v1::Probe.kind. kNone: not a probe ("").
enum class ProbeKind { kNone, kReplay, kSkip, kBisect, kSampleBisect, kTransplant, kFix };
const char* ProbeKindName(ProbeKind kind);
// kNone for "" and for a name this build does not know.
ProbeKind ParseProbeKind(absl::string_view name);

// lg::ProbeFinished.outcome and v1::Probe.outcome.
const char* ProbeOutcomeName(ProbeOutcome outcome);
// kFailed for a name this build does not know.
ProbeOutcome ParseProbeOutcome(absl::string_view name);
ProbeOutcome OutcomeOf(const lg::ProbeFinished& f);

enum class Stage {
  kOpened,     // needs a checkpoint (or closes at once in observe mode)
  kReady,      // checkpoint chosen, replay next
  kProbing,    // a probe generation runs; judged from its steps
  kJudge,      // a probe finished before any verdict
  kFix,        // verdict reached; the fix ladder decides the next action
  kVerifying,  // a continued generation is watched for a spike
  kClosed,     // CLOSED or ABORTED
};

lg::CheckpointRecord ToRecord(const CheckpointInfo& c);
CheckpointInfo FromRecord(const lg::CheckpointRecord& r);
std::string TriggerName(Detection::Kind kind);
// Detection::Kind <-> its persisted number (Opened.kind, lg::DetectionKind),
// by an explicit table rather than the enum's position. DetectionKindOf is
// nullopt for a number this binary does not know.
int32_t PersistedKind(Detection::Kind kind);
std::optional<Detection::Kind> DetectionKindOf(const lg::Opened& opened);
spikeguard::v1::IncidentState StateForProbe(ProbeKind kind);

// One incident's state: rebuilt from its event log by Apply().
struct IncidentCase {
  spikeguard::v1::Incident inc;
  lg::Opened opened;
  spikeguard::v1::Policy policy;
  Stage stage = Stage::kOpened;
  std::string base_note;
  std::optional<lg::CheckpointChosen> chosen;
  // The replay's checkpoint where the skip window starts (kWindowCheckpoint).
  std::optional<lg::CheckpointRecord> window_checkpoint;

  std::optional<lg::Action> pending;
  bool approved = false;
  int actions = 0;

  int probes = 0;
  int64_t reexecuted = 0;
  double time_sum = 0;
  int64_t time_count = 0;
  std::optional<lg::Action> probe;
  int64_t probe_generation = -1;
  std::optional<lg::ProbeFinished> last_finished;
  std::map<ProbeKind, ProbeOutcome> outcomes;
  bool any_nonfinite = false;
  int nonfinite_layer = -1;
  int64_t nondet_step = -1;
  double confidence_factor = 1.0;

  bool has_verdict = false;
  spikeguard::v1::Verdict verdict = spikeguard::v1::VERDICT_UNSPECIFIED;
  // The verdict is FRAGILITY by escalation (repeated DATA incidents), not by
  // this incident's own skip probe.
  bool escalated = false;
  bool leave_running = false;
  int64_t verdict_ms = 0;

  // Every hole of the newest skip probe (the window, extended to spikes
  // found at other positions).
  std::vector<std::pair<int64_t, int64_t>> holes;
  int skip_extensions = 0;
  // What the newest skip probe found.
  std::optional<lg::ProbeFinished> skip_finished;
  // Bisect: each probe's fed part of the window and whether it spiked.
  std::vector<std::pair<std::vector<int64_t>, bool>> bisect_tests;
  // Sample bisect: per culprit batch, each probe's fed slots and outcome.
  std::map<int64_t, std::vector<std::pair<std::vector<int64_t>, bool>>> sample_tests;
  bool bisect_done = false;
  bool transplant_done = false;
  std::vector<int64_t> culprits;
  std::vector<std::string> excluded_uris;

  int rung = 0;
  bool fix_requested = false;
  bool continued = false;
  bool verified = false;
  bool paused = false;
  bool quarantined = false;
  bool aborting = false;
  int64_t verify_generation = -1;
  int64_t verify_from = 0;
  int64_t verify_until = 0;

  // Runtime only: rebuilt from the view after a restart.
  std::unique_ptr<ProbeJudge> judge;

  int64_t id() const { return inc.id(); }
  const std::string& run() const { return opened.run(); }
  int64_t onset() const { return opened.onset_step(); }
  bool approval_wait() const { return pending && pending->needs_approval() && !approved; }
  // The kind of the running (or last) probe; kNone before the first.
  ProbeKind probe_kind() const {
    return probe ? ParseProbeKind(probe->probe_kind()) : ProbeKind::kNone;
  }
};

// The one transition function: live events and replayed ones go through it.
// `kind` is the stored name (kept verbatim in the incident's history).
void Apply(IncidentCase& s, int64_t seq, const std::string& kind, const lg::EventPayload& p);
inline void Apply(IncidentCase& s, int64_t seq, EventKind kind, const lg::EventPayload& p) {
  Apply(s, seq, EventKindName(kind), p);
}

// The event payload as stored (one-line text format), and back.
std::string ToText(const lg::EventPayload& payload);

}  // namespace spikeguard::incident
