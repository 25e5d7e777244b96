#include "daemon/incident/engine.h"

#include "daemon/incident/policy.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "daemon/detect/spike_detector.h"
#include "daemon/incident/engine_events.pb.h"
#include "google/protobuf/text_format.h"

namespace spikeguard::incident {
namespace {

namespace v1 = spikeguard::v1;
namespace lg = spikeguard::incident::log;

// Event kinds of the log. The names are part of the persisted format.
constexpr char kOpened[] = "opened";
constexpr char kCheckpoint[] = "checkpoint";
constexpr char kRewindRequested[] = "rewind_requested";
constexpr char kContinueRequested[] = "continue_requested";
constexpr char kPauseRequested[] = "pause_requested";
constexpr char kQuarantineRequested[] = "quarantine_requested";
constexpr char kAbortRequested[] = "abort_requested";
constexpr char kApproved[] = "approved";
constexpr char kProbeStarted[] = "probe_started";
constexpr char kContinued[] = "continued";
constexpr char kPaused[] = "paused";
constexpr char kQuarantined[] = "quarantined";
constexpr char kNondeterminism[] = "nondeterminism";
constexpr char kProbeFinished[] = "probe_finished";
constexpr char kVerdict[] = "verdict";
constexpr char kBisectResult[] = "bisect_result";
constexpr char kTransplantSkipped[] = "transplant_skipped";
constexpr char kVerified[] = "verified";
constexpr char kVerificationFailed[] = "verification_failed";
constexpr char kNote[] = "note";
constexpr char kClosed[] = "closed";
constexpr char kAborted[] = "aborted";

constexpr char kReplay[] = "replay";
constexpr char kSkip[] = "skip";
constexpr char kBisect[] = "bisect";
constexpr char kSampleBisect[] = "bisect_samples";
constexpr char kTransplant[] = "transplant";
constexpr char kFix[] = "fix";

// Skip probes extended to spikes at other batches before the model is
// called fragile.
constexpr int kMaxSkipExtensions = 2;

enum class Stage {
  kOpened,     // needs a checkpoint (or closes at once in observe mode)
  kReady,      // checkpoint chosen, replay next
  kProbing,    // a probe generation runs; judged from its steps
  kJudge,      // a probe finished before any verdict
  kFix,        // verdict reached; the fix ladder decides the next action
  kVerifying,  // a continued generation is watched for a spike
  kClosed,     // CLOSED or ABORTED
};

detect::SpikeDetector::Options DetectorOptions(const v1::SpikeDetectorPolicy& p) {
  return SpikeOptions(p);
}

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

// An empty plan means the whole stream, [0, ∞).
v1::DataPlan Normalized(const v1::DataPlan& plan) {
  if (plan.ranges_size() > 0) return plan;
  v1::DataPlan p;
  v1::DataRange* r = p.add_ranges();
  r->set_begin(0);
  r->set_end(-1);
  return p;
}

// `plan` without the positions [begin, end).
v1::DataPlan WithHole(const v1::DataPlan& plan, int64_t begin, int64_t end) {
  v1::DataPlan out;
  const v1::DataPlan normalized = Normalized(plan);
  for (const v1::DataRange& r : normalized.ranges()) {
    const bool unbounded = r.end() < 0;
    if (r.begin() < begin) {
      v1::DataRange* left = out.add_ranges();
      left->set_begin(r.begin());
      left->set_end(unbounded ? begin : std::min(r.end(), begin));
    }
    if (unbounded || r.end() > end) {
      v1::DataRange* right = out.add_ranges();
      right->set_begin(std::max(r.begin(), end));
      right->set_end(r.end());
    }
  }
  return out;
}

// `plan` without every range of `holes`.
v1::DataPlan WithHoles(const v1::DataPlan& plan, const std::vector<std::pair<int64_t, int64_t>>& holes) {
  v1::DataPlan out = Normalized(plan);
  for (const auto& [b, e] : holes) out = WithHole(out, b, e);
  return out;
}

// Sorted positions as half-open ranges of consecutive positions.
std::vector<std::pair<int64_t, int64_t>> Ranges(std::vector<int64_t> positions) {
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t x : positions) {
    if (!out.empty() && out.back().second == x) {
      out.back().second = x + 1;
    } else {
      out.emplace_back(x, x + 1);
    }
  }
  return out;
}

// Merges overlapping or touching ranges.
std::vector<std::pair<int64_t, int64_t>> MergeRanges(std::vector<std::pair<int64_t, int64_t>> r) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

// The step (index in the plan) at which `plan` feeds `position`; -1 never.
int64_t StepOf(const v1::DataPlan& plan, int64_t position) {
  int64_t index = 0;
  const v1::DataPlan normalized = Normalized(plan);
  for (const v1::DataRange& r : normalized.ranges()) {
    if (position >= r.begin() && (r.end() < 0 || position < r.end())) {
      return index + (position - r.begin());
    }
    if (r.end() < 0) return -1;
    index += r.end() - r.begin();
  }
  return -1;
}

// `plan` with [begin, end) spliced in just before position `at`.
v1::DataPlan WithSplice(const v1::DataPlan& plan, int64_t at, int64_t begin, int64_t end) {
  v1::DataPlan out;
  bool spliced = false;
  const v1::DataPlan normalized = Normalized(plan);
  for (const v1::DataRange& r : normalized.ranges()) {
    const bool contains = r.begin() <= at && (r.end() < 0 || at < r.end());
    if (!spliced && contains) {
      if (r.begin() < at) {
        v1::DataRange* left = out.add_ranges();
        left->set_begin(r.begin());
        left->set_end(at);
      }
      v1::DataRange* splice = out.add_ranges();
      splice->set_begin(begin);
      splice->set_end(end);
      v1::DataRange* right = out.add_ranges();
      right->set_begin(at);
      right->set_end(r.end());
      spliced = true;
      continue;
    }
    *out.add_ranges() = r;
  }
  return out;
}

// The position the plan feeds at `index` (step s consumes the s-th
// position); -1 when the plan ends earlier. Used only when the step record
// lacks its data position.
int64_t PositionAt(const v1::DataPlan& plan, int64_t index) {
  const v1::DataPlan normalized = Normalized(plan);
  for (const v1::DataRange& r : normalized.ranges()) {
    if (r.end() < 0) return r.begin() + index;
    const int64_t len = r.end() - r.begin();
    if (index < len) return r.begin() + index;
    index -= len;
  }
  return -1;
}

std::string PlanString(const v1::DataPlan& plan) {
  std::vector<std::string> parts;
  const v1::DataPlan normalized = Normalized(plan);
  for (const v1::DataRange& r : normalized.ranges()) {
    parts.push_back(r.end() < 0 ? absl::StrCat("[", r.begin(), ",∞)")
                                : absl::StrCat("[", r.begin(), ",", r.end(), ")"));
  }
  for (const v1::SampleMask& m : plan.masks()) {
    parts.push_back(absl::StrCat("(batch ", m.position(), " without sample(s) ",
                                 absl::StrJoin(m.slots(), ","), ")"));
  }
  return absl::StrJoin(parts, " ");
}

std::string HParamsString(const v1::HParams& h) {
  std::vector<std::string> parts;
  if (h.has_lr_scale()) parts.push_back(absl::StrCat("lr×", h.lr_scale()));
  if (h.has_extra_warmup_steps()) parts.push_back(absl::StrCat("+", h.extra_warmup_steps(), " warmup"));
  if (h.has_clip_norm()) parts.push_back(absl::StrCat("clip ", h.clip_norm()));
  if (h.has_beta2()) parts.push_back(absl::StrCat("β2 ", h.beta2()));
  if (h.has_eps()) parts.push_back(absl::StrCat("ε ", h.eps()));
  return absl::StrJoin(parts, ", ");
}

// The cumulative hparams of fix rung 1..3 of the FRAGILITY ladder.
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

v1::IncidentState StateForProbe(const std::string& kind) {
  if (kind == kReplay) return v1::REPLAYING;
  if (kind == kSkip) return v1::SKIPPING;
  if (kind == kBisect || kind == kSampleBisect) return v1::BISECTING;
  if (kind == kTransplant) return v1::TRANSPLANTING;
  return v1::FIXING;
}

std::string TriggerName(Detection::Kind kind) {
  switch (kind) {
    case Detection::Kind::kLossSpike:
      return "loss_spike";
    case Detection::Kind::kGradNormSpike:
      return "grad_norm_spike";
    case Detection::Kind::kNonFinite:
      return "nonfinite";
  }
  return "unknown";
}

bool NonFinite(const StepObservation& o) {
  return o.nonfinite_count > 0 || !std::isfinite(o.loss) || !std::isfinite(o.grad_norm);
}

std::string ToText(const lg::EventPayload& payload) {
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  std::string text;
  printer.PrintToString(payload, &text);
  return text;
}

// Judges one generation from its steps: the outcome of a probe, or the
// verification of a fix. Runtime state only; rebuilt from the view after a
// restart, and idempotent per step so re-delivered steps change nothing.
//
// Steps: a checkpoint "at step c" holds the state after steps 0..c-1, so the
// first step a probe from it executes is c itself; that step is judged like
// every other (a culprit batch may sit exactly there).
struct Judge {
  int64_t generation = 0;
  // The checkpoint's step: the first step the probe executes.
  int64_t checkpoint_step = 0;
  // A spike counts when its onset lies in [from, to]; done at a step >= to.
  int64_t from = 0;
  int64_t to = 0;
  bool use_grad = false;
  bool verification = false;
  // A probe's spike must be of the same kind as the original: at least this
  // log(peak / median). Healthy series (grad norms above all) have outliers
  // that pass the z-score rule; a replay is bit-exact, so a spike that truly
  // repeats has the original's size, and a 2x blip does not stand in for a
  // 1e38 bit flip.
  double min_log_ratio = 0;
  // The first spike of a probe, reported at the horizon.
  struct Spike {
    int64_t step = 0;
    int64_t position = -1;
    std::string detail;
  };
  std::optional<Spike> first_spike;
  // Re-executed steps this probe may still spend (budget).
  int64_t budget_left = std::numeric_limits<int64_t>::max();
  // Replay fidelity: the original generation's loss hash per step.
  std::map<int64_t, uint64_t> original_hash;
  std::unique_ptr<detect::SpikeDetector> detector;
  // Data position of the recent steps (the spike's position is evidence).
  std::map<int64_t, int64_t> positions;
  // The workers' schedule ended at this step (no later step will come).
  std::optional<int64_t> ended_at;
  std::string ended_reason;

  int64_t last_fed = -1;
  double time_sum = 0;
  int64_t count = 0;
  absl::Time last_progress;
  int64_t mismatch_step = -1;
  uint64_t mismatch_original = 0, mismatch_replayed = 0;
  std::optional<lg::ProbeFinished> result;

  void Finish(const std::string& outcome, const std::string& detail, int64_t spike_step,
              int layer, int64_t spike_position = -1) {
    lg::ProbeFinished f;
    f.set_outcome(outcome);
    f.set_detail(detail);
    f.set_steps_executed(std::max<int64_t>(0, last_fed - checkpoint_step + 1));
    f.set_last_step(last_fed);
    f.set_step_time_sum(time_sum);
    f.set_step_count(count);
    f.set_nonfinite_layer(layer);
    f.set_spike_step(spike_step);
    f.set_spike_position(spike_position);
    f.set_ended_early(ended_at.has_value() && last_fed < to);
    result = f;
  }

  // The schedule ended: judge with what came. A probe that never reached the
  // steps it was to judge has failed; otherwise what it saw stands.
  void EndEarly() {
    if (result || !ended_at || last_fed < *ended_at) return;
    const std::string why = absl::StrCat("the workers' schedule ended at step ", *ended_at,
                                         ", before the horizon step ", to,
                                         ended_reason.empty() ? "" : " (", ended_reason,
                                         ended_reason.empty() ? "" : ")");
    if (first_spike) {
      Finish("spiked", absl::StrCat(first_spike->detail, "; ", why), first_spike->step, -1,
             first_spike->position);
    } else if (last_fed < from && !verification) {
      Finish("failed", absl::StrCat(why, "; no judged step was executed"), -1, -1);
    } else {
      Finish("clean", absl::StrCat("no spike through step ", last_fed, "; ", why), -1, -1);
    }
  }

  void Feed(const StepObservation& o, absl::Time now) {
    if (result || o.generation != generation || o.step <= last_fed) return;
    last_fed = o.step;
    last_progress = now;
    ++count;
    if (std::isfinite(o.step_time_s)) time_sum += o.step_time_s;
    positions[o.step] = o.data_position;
    while (positions.size() > 1024) positions.erase(positions.begin());
    if (mismatch_step < 0) {
      auto it = original_hash.find(o.step);
      if (it != original_hash.end() && it->second != o.loss_hash) {
        mismatch_step = o.step;
        mismatch_original = it->second;
        mismatch_replayed = o.loss_hash;
      }
    }
    if (NonFinite(o) && o.step >= from) {
      Finish("nonfinite",
             absl::StrCat("non-finite values at step ", o.step, " (data position ",
                          o.data_position, ")",
                          o.first_nonfinite_layer >= 0
                              ? absl::StrCat(", first in layer ", o.first_nonfinite_layer)
                              : std::string()),
             o.step, o.first_nonfinite_layer, o.data_position);
      return;
    }
    const double value = use_grad ? o.grad_norm : o.loss;
    if (auto e = NonFinite(o) ? std::nullopt : detector->Observe(o.step, value);
        e && e->state == detect::SpikeEvent::kOnset && e->onset_step >= from &&
        e->onset_step <= to && e->baseline > 0 &&
        std::log(e->peak_value / e->baseline) >= min_log_ratio) {
      auto pos = positions.find(e->onset_step);
      const int64_t position = pos == positions.end() ? -1 : pos->second;
      const std::string detail = absl::StrFormat(
          "%s spike at step %d (data position %d): %.4g against a median of %.4g (z %.1f)",
          use_grad ? "grad-norm" : "loss", e->onset_step, position, e->peak_value, e->baseline,
          e->onset_z);
      if (verification) {
        Finish("spiked", detail, e->onset_step, -1, position);
        return;
      }
      // A probe runs on to its horizon after a spike: whether the spike is
      // followed by non-finite values (NUMERICS, not FRAGILITY) is evidence.
      if (!first_spike) first_spike = Spike{e->onset_step, position, detail};
    }
    if (first_spike && o.step >= to) {
      Finish("spiked", first_spike->detail, first_spike->step, -1, first_spike->position);
      return;
    }
    if (!verification && o.step - checkpoint_step + 1 > budget_left) {
      Finish("failed",
             absl::StrCat("budget: the re-executed steps cap was reached at step ", o.step),
             -1, -1);
      return;
    }
    if (o.step >= to) {
      Finish("clean", absl::StrCat("no spike through step ", o.step), -1, -1);
      return;
    }
    EndEarly();
  }
};

// -----------------------------------------------------------------------------
// One incident's state: rebuilt from its event log by Apply().

struct Inc {
  v1::Incident inc;
  lg::Opened opened;
  v1::Policy policy;
  Stage stage = Stage::kOpened;
  std::string base_note;
  std::optional<lg::CheckpointChosen> chosen;

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
  std::map<std::string, std::string> outcomes;
  bool any_nonfinite = false;
  int nonfinite_layer = -1;
  int64_t nondet_step = -1;
  double confidence_factor = 1.0;

  bool has_verdict = false;
  v1::Verdict verdict = v1::VERDICT_UNSPECIFIED;
  bool leave_running = false;
  int64_t verdict_ms = 0;

  // Every hole of the newest skip probe (the window, extended to spikes
  // found at other positions).
  std::vector<std::pair<int64_t, int64_t>> holes;
  int skip_extensions = 0;
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

  std::unique_ptr<Judge> judge;

  int64_t id() const { return inc.id(); }
  const std::string& run() const { return opened.run(); }
  int64_t onset() const { return opened.onset_step(); }
  bool approval_wait() const { return pending && pending->needs_approval() && !approved; }
};

void AppendNote(Inc& s, const std::string& note) {
  if (note.empty()) return;
  s.base_note = s.base_note.empty() ? note : absl::StrCat(s.base_note, "; ", note);
}

void RefreshNote(Inc& s) {
  if (s.approval_wait()) {
    s.inc.set_note(absl::StrCat("awaiting approval: ", s.pending->reason(),
                                s.base_note.empty() ? "" : "; ", s.base_note));
  } else {
    s.inc.set_note(s.base_note);
  }
}

v1::IncidentState StateForAction(const Inc& s, const lg::Action& a) {
  if (a.kind() == "rewind") return StateForProbe(a.probe_kind());
  if (a.kind() == "continue" && a.verify_until() > 0) return v1::VERIFYING;
  return s.has_verdict ? v1::FIXING : s.inc.state();
}

void RefreshCost(Inc& s, int64_t now_ms) {
  v1::Cost* cost = s.inc.mutable_cost();
  cost->set_probes(s.probes);
  cost->set_steps_reexecuted(s.reexecuted);
  const int64_t end_ms = s.inc.closed_unix_ms() > 0 ? s.inc.closed_unix_ms() : now_ms;
  cost->set_wall_time_s(std::max<int64_t>(0, end_ms - s.inc.opened_unix_ms()) / 1000.0);
  const double mean_step_s = s.time_count > 0 ? s.time_sum / s.time_count : 0.0;
  cost->set_gpu_hours(static_cast<double>(s.reexecuted) * mean_step_s *
                      std::max<uint32_t>(1, s.opened.world_size()) / 3600.0);
}

// The one transition function: live events and replayed ones go through it.
void Apply(Inc& s, int64_t seq, const std::string& kind, const lg::EventPayload& p) {
  v1::IncidentEvent* ev = s.inc.add_events();
  ev->set_seq(seq);
  ev->set_unix_ms(p.unix_ms());
  ev->set_kind(kind);
  ev->set_detail(p.detail());

  if (kind == kOpened) {
    const lg::Opened& o = p.opened();
    s.opened = o;
    s.policy = o.policy();
    s.stage = Stage::kOpened;
    s.inc.set_run(o.run());
    s.inc.set_state(v1::DETECTED);
    s.inc.set_trigger(TriggerName(static_cast<Detection::Kind>(o.kind())));
    s.inc.set_generation(o.generation());
    s.inc.set_onset_step(o.onset_step());
    s.inc.set_peak_step(o.peak_step());
    s.inc.set_peak_value(o.peak_value());
    s.inc.set_baseline_value(o.baseline());
    if (o.has_precursor()) s.inc.set_precursor_onset_step(o.precursor_onset_step());
    s.inc.set_precursor(o.precursor());
    s.inc.set_opened_unix_ms(p.unix_ms());
    v1::Localization* loc = s.inc.mutable_localization();
    loc->set_signal(o.localized_signal());
    loc->set_layer(o.localized_layer());
    loc->set_start_step(o.has_precursor() ? std::min(o.precursor_onset_step(), o.onset_step())
                                          : o.onset_step());
    loc->clear_ordered();
    for (const std::string& x : o.localization_order()) loc->add_ordered(x);
  } else if (kind == kCheckpoint) {
    s.chosen = p.checkpoint();
    s.stage = Stage::kReady;
    s.excluded_uris.assign(p.checkpoint().excluded_uris().begin(),
                           p.checkpoint().excluded_uris().end());
    // A retry from another checkpoint starts the protocol over.
    s.outcomes.clear();
    s.holes.clear();
    s.skip_extensions = 0;
    s.bisect_tests.clear();
    s.sample_tests.clear();
    s.probe.reset();
    s.last_finished.reset();
    AppendNote(s, p.note());
  } else if (kind == kRewindRequested || kind == kContinueRequested || kind == kPauseRequested ||
             kind == kQuarantineRequested) {
    s.pending = p.action();
    s.approved = false;
    ++s.actions;
    const lg::Action& a = p.action();
    if (a.kind() == "continue" || (a.kind() == "rewind" && a.probe_kind() == kFix)) {
      s.fix_requested = true;
    }
    if (a.kind() == "rewind" && a.rung() > s.rung) s.rung = a.rung();
    // The rung that held becomes the incident's fix.
    if (a.kind() == "continue" && s.rung > 0 && s.inc.verdict() == v1::FRAGILITY) {
      s.inc.set_fix(a.reason());
    }
    if (a.kind() == "rewind" && a.probe_kind() == kSkip) {
      if (!s.holes.empty()) ++s.skip_extensions;
      s.holes.clear();
      for (const v1::DataRange& r : a.holes()) s.holes.emplace_back(r.begin(), r.end());
      if (s.holes.empty()) s.holes.emplace_back(a.hole_begin(), a.hole_end());
    }
    s.inc.set_state(s.approval_wait() ? v1::AWAITING_APPROVAL : StateForAction(s, a));
  } else if (kind == kAbortRequested) {
    s.pending = p.action();
    s.approved = true;
    ++s.actions;
    s.aborting = true;
    s.judge.reset();
    s.stage = Stage::kFix;
    AppendNote(s, p.note());
  } else if (kind == kApproved) {
    s.approved = true;
    if (s.pending) s.inc.set_state(StateForAction(s, *s.pending));
  } else if (kind == kProbeStarted) {
    if (s.pending) s.probe = *s.pending;
    s.pending.reset();
    s.probe_generation = p.done().generation();
    ++s.probes;
    s.stage = Stage::kProbing;
    s.judge.reset();
    s.inc.set_state(StateForProbe(s.probe ? s.probe->probe_kind() : ""));
    v1::Probe* probe = s.inc.add_probes();
    if (s.probe) {
      probe->set_kind(s.probe->probe_kind());
      probe->set_checkpoint_step(s.probe->checkpoint().step());
      *probe->mutable_data_plan() = s.probe->plan();
      probe->set_horizon_step(s.probe->stop_after_step());
      probe->set_detail(s.probe->reason());
    }
    probe->set_generation(p.done().generation());
    probe->set_outcome("pending");
    probe->set_started_unix_ms(p.unix_ms());
  } else if (kind == kNondeterminism) {
    s.nondet_step = p.step();
    s.confidence_factor = 0.5;
    if (s.has_verdict) s.inc.set_confidence(s.inc.confidence() * 0.5);
    AppendNote(s, p.note());
  } else if (kind == kProbeFinished) {
    const lg::ProbeFinished& f = p.finished();
    s.last_finished = f;
    s.judge.reset();
    const std::string probe_kind = s.probe ? s.probe->probe_kind() : "";
    s.outcomes[probe_kind] = f.outcome();
    s.reexecuted += f.steps_executed();
    s.time_sum += f.step_time_sum();
    s.time_count += f.step_count();
    if (f.outcome() == "nonfinite") {
      s.any_nonfinite = true;
      if (f.nonfinite_layer() >= 0 && s.nonfinite_layer < 0) s.nonfinite_layer = f.nonfinite_layer();
    }
    if (probe_kind == kBisect && s.probe &&
        (f.outcome() == "clean" || f.outcome() == "spiked" || f.outcome() == "nonfinite")) {
      s.bisect_tests.emplace_back(
          std::vector<int64_t>(s.probe->include().begin(), s.probe->include().end()),
          f.outcome() != "clean");
    }
    if (probe_kind == kSampleBisect && s.probe &&
        (f.outcome() == "clean" || f.outcome() == "spiked" || f.outcome() == "nonfinite")) {
      s.sample_tests[s.probe->sample_position()].emplace_back(
          std::vector<int64_t>(s.probe->kept_documents().begin(), s.probe->kept_documents().end()),
          f.outcome() != "clean");
    }
    if (probe_kind == kTransplant) {
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
  } else if (kind == kVerdict) {
    const lg::VerdictRecord& v = p.verdict();
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
  } else if (kind == kBisectResult) {
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
  } else if (kind == kTransplantSkipped) {
    s.transplant_done = true;
    AppendNote(s, p.note());
  } else if (kind == kContinued) {
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
  } else if (kind == kPaused) {
    s.pending.reset();
    s.paused = true;
  } else if (kind == kQuarantined) {
    s.pending.reset();
    s.quarantined = true;
  } else if (kind == kVerified) {
    s.verified = true;
    s.judge.reset();
    s.stage = Stage::kFix;
    s.inc.set_state(v1::FIXING);
  } else if (kind == kVerificationFailed) {
    s.judge.reset();
    s.stage = Stage::kFix;
    AppendNote(s, p.note());
  } else if (kind == kNote) {
    AppendNote(s, p.note());
  } else if (kind == kClosed || kind == kAborted) {
    s.pending.reset();
    s.judge.reset();
    s.stage = Stage::kClosed;
    s.inc.set_state(kind == kClosed ? v1::CLOSED : v1::ABORTED);
    s.inc.set_closed_unix_ms(p.unix_ms());
    AppendNote(s, p.note());
  }
  RefreshNote(s);
  RefreshCost(s, p.unix_ms());
}

}  // namespace

// -----------------------------------------------------------------------------

struct IncidentEngine::State {
  Clock* clock;
  RunController* controller;
  RunView* view;
  IncidentStore* store;
  Options options;
  Listener listener;
  std::map<int64_t, std::unique_ptr<Inc>> incidents;
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
  std::map<std::string, std::vector<Past>> history;

  void LoadHistory(const std::string& run) {
    if (!history_loaded.insert(run).second) return;
    auto all = store->RunIncidents(run);
    if (!all.ok()) {
      history_loaded.erase(run);
      return;
    }
    for (const v1::Incident& i : *all) {
      if (incidents.count(i.id())) continue;
      Past p;
      p.id = i.id();
      p.generation = i.generation();
      p.onset = i.onset_step();
      for (const v1::Probe& pr : i.probes()) p.probe_generations.push_back(pr.generation());
      if (i.has_continued_generation()) p.continued_generation = i.continued_generation();
      history[run].push_back(std::move(p));
    }
  }

  // Every incident of the run this process knows, as Past records.
  std::vector<Past> Known(const std::string& run) {
    LoadHistory(run);
    std::vector<Past> out = history[run];
    for (const auto& [id, s] : incidents) {
      if (s->run() != run) continue;
      Past p;
      p.id = id;
      p.generation = s->opened.generation();
      p.onset = s->onset();
      for (const v1::Probe& pr : s->inc.probes()) p.probe_generations.push_back(pr.generation());
      if (s->inc.has_continued_generation()) p.continued_generation = s->inc.continued_generation();
      out.push_back(std::move(p));
    }
    return out;
  }

  // A probe's generation is an experiment, not the run: its spikes are the
  // probe's outcome and never open incidents, unless the run was let go on
  // with it (then it is the run's timeline).
  bool IsProbeGeneration(const std::string& run, int64_t generation) {
    bool probe = false;
    for (const Past& p : Known(run)) {
      if (p.continued_generation && *p.continued_generation == generation) return false;
      if (std::find(p.probe_generations.begin(), p.probe_generations.end(), generation) !=
          p.probe_generations.end()) {
        probe = true;
      }
    }
    return probe;
  }

  Inc* ActiveFor(const std::string& run) {
    for (auto& [id, s] : incidents) {
      if (s->run() == run && s->stage != Stage::kClosed) return s.get();
    }
    return nullptr;
  }

  v1::Mode ModeFor(const std::string& run) { return view->PolicyFor(run).mode(); }

  // Appends the event, applies it, saves the incident and tells the listener.
  absl::Status Emit(Inc& s, const std::string& kind, lg::EventPayload payload) {
    payload.set_unix_ms(clock->NowUnixMillis());
    SG_ASSIGN_OR_RETURN(int64_t seq, store->AppendEvent(s.id(), kind, ToText(payload)));
    Apply(s, seq, kind, payload);
    SG_RETURN_IF_ERROR(store->SaveIncident(s.inc));
    if (listener) listener(s.inc, s.inc.events(s.inc.events_size() - 1));
    return absl::OkStatus();
  }

  absl::Status EmitNote(Inc& s, const std::string& note) {
    lg::EventPayload p;
    p.set_detail(note);
    p.set_note(note);
    return Emit(s, kNote, p);
  }

  // ---- Actions ---------------------------------------------------------------

  std::string RequestId(const Inc& s, const std::string& what) {
    return absl::StrCat("incident-", s.id(), "/", s.actions + 1, "-", what);
  }

  // The hparams a probe of this incident runs with: those of the generation
  // under diagnosis (a fix in force stays in force), with `overrides` on
  // top (a fix rung; its lr scale multiplies the one in force).
  absl::StatusOr<v1::HParams> ProbeHParams(const Inc& s, const std::optional<v1::HParams>& overrides) {
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

  // The horizon clamped to the last step the run's schedule executes.
  int64_t Clamp(const Inc& s, int64_t step) {
    const std::optional<int64_t> final_step = view->FinalStep(s.run());
    return final_step && *final_step >= 0 ? std::min(step, *final_step) : step;
  }

  absl::Status RequestRewind(Inc& s, const std::string& probe_kind, const CheckpointInfo& ckpt,
                             const v1::DataPlan& plan, int64_t stop_after,
                             const std::optional<v1::HParams>& overrides, int64_t judge_from,
                             int rung, int64_t hole_begin, int64_t hole_end,
                             const std::string& why, const std::vector<int64_t>& include = {},
                             const std::vector<std::pair<int64_t, int64_t>>& holes = {},
                             int64_t sample_position = -1,
                             const std::vector<int64_t>& kept_documents = {}) {
    const v1::Policy& pol = s.policy;
    stop_after = Clamp(s, stop_after);
    SG_ASSIGN_OR_RETURN(const v1::HParams hp, ProbeHParams(s, overrides));
    const std::optional<v1::HParams> hparams =
        hp.ByteSizeLong() > 0 ? std::optional<v1::HParams>(hp) : std::nullopt;
    if (s.probes >= pol.budget().max_probes()) {
      return Inconclusive(s, absl::StrCat("budget exhausted: ", s.probes, " probes run (max_probes ",
                                          pol.budget().max_probes(), ") before the ", probe_kind,
                                          " probe"));
    }
    if (s.reexecuted >= pol.budget().max_reexecuted_steps()) {
      return Inconclusive(s, absl::StrCat("budget exhausted: ", s.reexecuted,
                                          " steps re-executed (max_reexecuted_steps ",
                                          pol.budget().max_reexecuted_steps(), ")"));
    }
    lg::Action a;
    a.set_kind("rewind");
    a.set_request_id(RequestId(s, probe_kind));
    a.set_probe_kind(probe_kind);
    *a.mutable_checkpoint() = ToRecord(ckpt);
    *a.mutable_plan() = plan;
    a.set_stop_after_step(stop_after);
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
    a.set_reason(absl::StrCat(probe_kind, " probe: rewind to step ", ckpt.step, ", plan ",
                              PlanString(plan), ", horizon step ", stop_after,
                              hparams ? absl::StrCat(", ", HParamsString(*hparams)) : "",
                              why.empty() ? "" : " (", why, why.empty() ? "" : ")"));
    lg::EventPayload p;
    p.set_detail(a.reason());
    *p.mutable_action() = a;
    return Emit(s, kRewindRequested, p);
  }

  absl::Status RequestContinue(Inc& s, bool needs_approval, int64_t verify_generation,
                               int64_t verify_from, int64_t verify_until,
                               const std::string& why) {
    if (verify_until > 0) {
      verify_until = Clamp(s, verify_until);
      // Nothing of the schedule is left to verify.
      if (verify_until < verify_from) verify_until = 0;
    }
    lg::Action a;
    a.set_kind("continue");
    a.set_request_id(RequestId(s, "continue"));
    a.set_needs_approval(needs_approval);
    a.set_verify_generation(verify_generation);
    a.set_judge_from(verify_from);
    a.set_verify_until(verify_until);
    a.set_reason(why);
    lg::EventPayload p;
    p.set_detail(why);
    *p.mutable_action() = a;
    return Emit(s, kContinueRequested, p);
  }

  absl::Status RequestPause(Inc& s, const std::string& why) {
    lg::Action a;
    a.set_kind("pause");
    a.set_request_id(RequestId(s, "pause"));
    a.set_reason(why);
    lg::EventPayload p;
    p.set_detail(why);
    *p.mutable_action() = a;
    return Emit(s, kPauseRequested, p);
  }

  absl::Status RequestQuarantine(Inc& s) {
    lg::Action a;
    a.set_kind("quarantine");
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
    return Emit(s, kQuarantineRequested, p);
  }

  // Performs the pending action and logs its completion.
  absl::Status Execute(Inc& s) {
    const lg::Action a = *s.pending;
    lg::EventPayload p;
    p.mutable_done()->set_request_id(a.request_id());
    if (a.kind() == "rewind") {
      RewindSpec spec;
      spec.request_id = a.request_id();
      spec.checkpoint = FromRecord(a.checkpoint());
      spec.plan = a.plan();
      spec.stop_after_step = a.stop_after_step();
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
      return Emit(s, kProbeStarted, p);
    }
    if (a.kind() == "continue") {
      SG_RETURN_IF_ERROR(controller->Continue(s.run(), a.request_id(), std::nullopt));
      p.set_detail(a.verify_until() > 0
                       ? absl::StrCat("run continues; verifying through step ", a.verify_until())
                       : "run continues");
      return Emit(s, kContinued, p);
    }
    if (a.kind() == "pause") {
      SG_RETURN_IF_ERROR(controller->Pause(s.run(), a.request_id()));
      p.set_detail("run paused");
      return Emit(s, kPaused, p);
    }
    if (a.kind() == "quarantine") {
      for (const v1::QuarantineEntry& e : a.quarantine()) {
        SG_RETURN_IF_ERROR(store->Quarantine(e));
      }
      p.set_detail(absl::StrCat(a.quarantine_size(), " document(s) quarantined"));
      return Emit(s, kQuarantined, p);
    }
    return absl::InternalError(absl::StrCat("unknown action kind '", a.kind(), "'"));
  }

  // ---- Verdicts ----------------------------------------------------------------

  absl::Status EmitVerdict(Inc& s, v1::Verdict verdict, double confidence, const std::string& note,
                           std::vector<std::string> recommendations, const std::string& fix,
                           const std::vector<v1::DocumentRef>& documents = {},
                           bool escalated = false, bool leave_running = false) {
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
    return Emit(s, kVerdict, p);
  }

  absl::Status Inconclusive(Inc& s, const std::string& reason) {
    return EmitVerdict(s, v1::INCONCLUSIVE, 0.0,
                       absl::StrCat(reason, "; run paused, awaiting an operator"), {},
                       "none: paused for an operator");
  }

  std::vector<std::string> FragilityRecommendations(const Inc& s) {
    std::vector<std::string> r;
    const std::string pre = absl::StrCat(s.opened.precursor(), " ", s.opened.localized_signal());
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

  double Confidence(const Inc& s, double base) { return base * s.confidence_factor; }

  // Every data position of the skip probe's holes.
  static std::vector<int64_t> WindowPositions(const Inc& s) {
    std::vector<int64_t> out;
    for (const auto& [b, e] : s.holes) {
      for (int64_t x = b; x < e; ++x) out.push_back(x);
    }
    return out;
  }

  static bool InHoles(const Inc& s, int64_t position) {
    for (const auto& [b, e] : s.holes) {
      if (position >= b && position < e) return true;
    }
    return false;
  }

  // The documents the original generation consumed at `positions` (each
  // position resolved at the step the original plan fed it).
  absl::StatusOr<std::vector<v1::DocumentRef>> DocumentsAt(const Inc& s,
                                                           const std::vector<int64_t>& positions) {
    std::vector<v1::DocumentRef> out;
    std::set<std::tuple<std::string, int64_t, int64_t>> seen;
    for (int64_t x : positions) {
      const int64_t step = StepOf(s.chosen->plan(), x);
      if (step < 0) continue;
      SG_ASSIGN_OR_RETURN(std::vector<v1::DocumentRef> docs,
                          view->Documents(s.run(), s.opened.generation(), step, step));
      for (const auto& d : docs) {
        if (seen.insert({d.domain(), d.document_id(), d.data_position()}).second) {
          out.push_back(d);
        }
      }
    }
    return out;
  }

  absl::Status VerdictAfterSkip(Inc& s) {
    const v1::Policy& pol = s.policy;
    const std::string skip_outcome = s.outcomes[kSkip];
    if (skip_outcome == "clean") {
      // Escalation: skipping only postpones the next spike of a fragile run.
      SG_ASSIGN_OR_RETURN(std::vector<v1::Incident> all, store->RunIncidents(s.run()));
      int near = 0;
      for (const v1::Incident& other : all) {
        if (other.id() == s.id() || other.verdict() != v1::DATA) continue;
        if (std::llabs(other.onset_step() - s.onset()) <= pol.escalation().window_steps()) ++near;
      }
      if (near >= pol.escalation().data_incidents() - 1) {
        return EmitVerdict(
            s, v1::FRAGILITY, Confidence(s, 0.8),
            absl::StrCat("escalated: ", near + 1, " DATA incidents within ",
                         pol.escalation().window_steps(),
                         " steps; skipping data only postpones the next spike"),
            FragilityRecommendations(s),
            "fix ladder: lr × factor, then longer warmup and tighter clipping, then β2/ε", {},
            /*escalated=*/true);
      }
      if (pol.probe().bisect()) return BisectStep(s);
      Bisection whole;
      whole.culprits = WindowPositions(s);
      whole.untested = true;
      return CulpritsFound(s, whole);
    }
    const bool numerics = s.opened.kind() == static_cast<int>(Detection::Kind::kNonFinite) ||
                          s.any_nonfinite;
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
    // The skip probe spiked on another batch. Without evidence that the
    // model moved (a precursor), that batch may be a trigger of its own:
    // skip it too before calling the model fragile.
    const int64_t q = s.last_finished ? s.last_finished->spike_position() : -1;
    if (q >= 0 && !InHoles(s, q) && !s.opened.has_precursor() &&
        s.skip_extensions < kMaxSkipExtensions) {
      return ProposeSkip(s, q);
    }
    std::string why = "the spike reproduces on replay and survives skipping the batches around it";
    if (s.skip_extensions > 0) {
      why = absl::StrCat(why, " and around ", s.skip_extensions,
                         " more spike(s) at other batches");
    } else if (s.opened.has_precursor()) {
      why = absl::StrCat(why, " (precursor ", s.opened.precursor(), " since step ",
                         s.opened.precursor_onset_step(), ")");
    }
    return EmitVerdict(s, v1::FRAGILITY, Confidence(s, 0.8),
                       absl::StrCat(why, ": the model state is fragile"),
                       FragilityRecommendations(s),
                       "fix ladder: lr × factor, then longer warmup and tighter clipping, then β2/ε");
  }

  // ---- Bisection ------------------------------------------------------------------
  //
  // Group testing over the window W (every position of the skip holes): the
  // replay fed all of W and spiked, the skip fed none and was clean. A bisect
  // probe feeds one part of W and skips the rest of it. Each round descends
  // from a set known to spike to one position: a part that spikes is kept;
  // when it does not, the other part must hold the culprit (implied). A
  // position is named only after a probe that fed it alone spiked, so an
  // implied position is confirmed with one more probe; when it does not
  // spike alone, the spike needs several batches together (or is no data
  // trigger at all, when nothing was found). Then the window without the
  // culprits found is fed: clean, every culprit is known; spiked, another
  // round looks for the next one. The onset's own position is tried alone
  // first, so a single culprit there costs two probes.
  struct Bisection {
    std::optional<std::vector<int64_t>> need;  // the next part to feed
    std::vector<int64_t> culprits;             // spike alone
    std::vector<int64_t> group;                // spike only together
    bool none_reproduced = false;              // no part of W spiked
    bool partial = false;                      // stopped by the budget
    bool untested = false;                     // no bisect: the whole window
  };

  static Bisection NextBisect(const std::vector<int64_t>& window, int64_t onset_position,
                              const std::vector<std::pair<std::vector<int64_t>, bool>>& tests) {
    Bisection b;
    std::map<std::vector<int64_t>, bool> known;
    for (const auto& [set, spiked] : tests) {
      std::vector<int64_t> key = set;
      std::sort(key.begin(), key.end());
      known[key] = spiked;
    }
    std::vector<int64_t> w = window;
    std::sort(w.begin(), w.end());
    w.erase(std::unique(w.begin(), w.end()), w.end());
    std::vector<int64_t> found;
    std::vector<int64_t> round = w;  // known to spike
    for (size_t guard = 0; guard <= w.size() && !round.empty(); ++guard) {
      std::vector<int64_t> node = round;
      bool tested = true;
      while (node.size() > 1) {
        std::vector<int64_t> a, rest;
        if (std::find(node.begin(), node.end(), onset_position) != node.end()) {
          a = {onset_position};
          for (int64_t x : node) {
            if (x != onset_position) rest.push_back(x);
          }
        } else {
          const size_t half = (node.size() + 1) / 2;
          a.assign(node.begin(), node.begin() + half);
          rest.assign(node.begin() + half, node.end());
        }
        auto ra = known.find(a);
        if (ra == known.end()) {
          b.need = a;
          b.culprits = found;
          return b;
        }
        node = ra->second ? a : rest;
        tested = ra->second;
      }
      if (!tested) {
        auto r = known.find(node);
        if (r == known.end()) {
          b.need = node;
          b.culprits = found;
          return b;
        }
        if (!r->second) {
          // The set spikes, yet no single batch of it does.
          if (found.empty() && round == w) {
            b.none_reproduced = true;
          } else {
            b.group = round;
          }
          break;
        }
      }
      found.push_back(node.front());
      std::vector<int64_t> left;
      for (int64_t x : w) {
        if (std::find(found.begin(), found.end(), x) == found.end()) left.push_back(x);
      }
      if (left.empty()) break;
      auto r = known.find(left);
      if (r == known.end()) {
        b.need = left;
        b.culprits = found;
        return b;
      }
      if (!r->second) break;
      round = left;
    }
    std::sort(found.begin(), found.end());
    b.culprits = found;
    return b;
  }

  absl::Status BisectStep(Inc& s) {
    const v1::Policy& pol = s.policy;
    const std::vector<int64_t> window = WindowPositions(s);
    Bisection b = NextBisect(window, s.chosen->onset_position(), s.bisect_tests);
    if (b.need) {
      // One probe stays for the fix.
      if (s.probes + 2 <= pol.budget().max_probes() &&
          s.reexecuted < pol.budget().max_reexecuted_steps()) {
        std::vector<int64_t> skipped;
        for (int64_t x : window) {
          if (std::find(b.need->begin(), b.need->end(), x) == b.need->end()) skipped.push_back(x);
        }
        const v1::DataPlan plan = WithHoles(s.chosen->plan(), Ranges(skipped));
        int64_t first = std::numeric_limits<int64_t>::max(), last = -1;
        for (int64_t x : *b.need) {
          const int64_t step = StepOf(plan, x);
          if (step < 0) continue;
          first = std::min(first, step);
          last = std::max(last, step);
        }
        if (last < 0) first = last = s.onset();
        const v1::ProbePolicy& probe = pol.probe();
        const int64_t horizon = last + probe.skip_before() + probe.replay_steps_past_onset();
        std::vector<std::string> parts;
        for (const auto& [lo, hi] : Ranges(*b.need)) {
          parts.push_back(hi == lo + 1 ? absl::StrCat(lo) : absl::StrCat(lo, "–", hi - 1));
        }
        return RequestRewind(s, kBisect, Chosen(s), plan, horizon, std::nullopt,
                             std::max(first, s.chosen->checkpoint().step()), 0, 0, 0,
                             absl::StrCat("feed only position(s) ", absl::StrJoin(parts, ","),
                                          " of the window"),
                             *b.need, Ranges(skipped));
      }
      b.partial = true;
      b.need.reset();
    }
    if (pol.probe().bisect_documents() && !b.partial && !b.none_reproduced &&
        !b.culprits.empty()) {
      return SampleBisectStep(s, b);
    }
    return CulpritsFound(s, b);
  }

  // Group testing over the documents of each culprit batch (NextBisect over
  // them: the whole batch fed alone spiked). A probe feeds the batch alone,
  // as the bisect probe that named it, with only the samples made entirely
  // of the documents under test: the others are masked out. A set of
  // documents without a sample of its own feeds nothing and counts as clean
  // without a probe (it clears nobody).
  absl::Status SampleBisectStep(Inc& s, const Bisection& b) {
    const v1::Policy& pol = s.policy;
    const std::vector<int64_t> window = WindowPositions(s);
    std::map<int64_t, std::vector<v1::DocumentRef>> refined;
    std::vector<lg::SampleCulprit> results;
    for (int64_t p : b.culprits) {
      SG_ASSIGN_OR_RETURN(std::vector<SampleContent> rows,
                          view->Samples(s.run(), s.opened.generation(), p));
      // The batch's documents in the order their samples come.
      std::vector<v1::DocumentRef> docs;
      std::map<std::pair<std::string, int64_t>, int64_t> index;
      std::vector<std::vector<int64_t>> row_docs(rows.size());
      for (size_t j = 0; j < rows.size(); ++j) {
        for (const auto& d : rows[j].documents) {
          auto [it, added] = index.emplace(std::make_pair(d.domain(), d.document_id()),
                                           static_cast<int64_t>(docs.size()));
          if (added) docs.push_back(d);
          row_docs[j].push_back(it->second);
        }
      }
      if (docs.size() < 2 || rows.size() < 2) continue;  // unknown, or nothing to split
      auto kept_rows = [&](const std::vector<int64_t>& kept_docs) {
        std::vector<int64_t> out;
        for (size_t j = 0; j < rows.size(); ++j) {
          bool all = true;
          for (int64_t d : row_docs[j]) {
            all = all && std::find(kept_docs.begin(), kept_docs.end(), d) != kept_docs.end();
          }
          if (all) out.push_back(static_cast<int64_t>(j));
        }
        return out;
      };
      std::vector<int64_t> all(docs.size());
      for (size_t k = 0; k < docs.size(); ++k) all[k] = static_cast<int64_t>(k);
      const auto& probed = s.sample_tests[p];
      std::vector<std::pair<std::vector<int64_t>, bool>> tests = probed;
      Bisection r = NextBisect(all, -1, tests);
      while (r.need && kept_rows(*r.need).empty()) {
        tests.emplace_back(*r.need, false);  // feeds nothing: clean, no probe
        r = NextBisect(all, -1, tests);
      }
      bool partial = false;
      if (r.need) {
        if (s.probes + 2 <= pol.budget().max_probes() &&
            s.reexecuted < pol.budget().max_reexecuted_steps() &&
            static_cast<int64_t>(probed.size()) < pol.probe().max_document_probes()) {
          const std::vector<int64_t> keep = kept_rows(*r.need);
          std::vector<int64_t> skipped;
          for (int64_t x : window) {
            if (x != p) skipped.push_back(x);
          }
          v1::DataPlan plan = WithHoles(s.chosen->plan(), Ranges(skipped));
          v1::SampleMask* mask = plan.add_masks();
          mask->set_position(p);
          for (size_t j = 0; j < rows.size(); ++j) {
            if (std::find(keep.begin(), keep.end(), static_cast<int64_t>(j)) == keep.end()) {
              mask->add_slots(static_cast<int32_t>(j));
            }
          }
          int64_t step = StepOf(plan, p);
          if (step < 0) step = s.onset();
          const v1::ProbePolicy& probe = pol.probe();
          const int64_t horizon = step + probe.skip_before() + probe.replay_steps_past_onset();
          std::vector<std::string> names;
          for (int64_t k : *r.need) {
            names.push_back(absl::StrCat(docs[k].domain(), ":", docs[k].document_id()));
          }
          return RequestRewind(
              s, kSampleBisect, Chosen(s), plan, horizon, std::nullopt,
              std::max(step, s.chosen->checkpoint().step()), 0, 0, 0,
              absl::StrCat("feed batch ", p, " alone with only the sample(s) ",
                           absl::StrJoin(keep, ","), " of document(s) ",
                           absl::StrJoin(names, " ")),
              {p}, Ranges(skipped), p, *r.need);
        }
        partial = true;
      }
      std::set<int64_t> named;
      if (r.none_reproduced) {
        named.insert(all.begin(), all.end());
      } else {
        named.insert(r.culprits.begin(), r.culprits.end());
        named.insert(r.group.begin(), r.group.end());
        if (partial) {
          // Every document a clean probe did not feed stays a culprit.
          std::set<int64_t> cleared;
          for (const auto& [set, spiked] : probed) {
            if (!spiked) cleared.insert(set.begin(), set.end());
          }
          for (int64_t k : all) {
            if (!cleared.count(k)) named.insert(k);
          }
        }
      }
      std::vector<v1::DocumentRef>& out = refined[p];
      lg::SampleCulprit sc;
      sc.set_position(p);
      std::set<int64_t> named_rows;
      for (int64_t k : named) {
        v1::DocumentRef d = docs[k];
        d.set_data_position(p);
        d.set_step(StepOf(s.chosen->plan(), p));
        out.push_back(d);
      }
      for (size_t j = 0; j < rows.size(); ++j) {
        for (int64_t k : row_docs[j]) {
          if (named.count(k)) named_rows.insert(static_cast<int64_t>(j));
        }
      }
      for (int64_t j : named_rows) sc.add_slots(j);
      sc.set_batch_samples(static_cast<int32_t>(rows.size()));
      sc.set_partial(partial);
      sc.set_none_reproduced(r.none_reproduced);
      sc.set_documents(static_cast<int32_t>(docs.size()));
      sc.set_named_documents(static_cast<int32_t>(named.size()));
      results.push_back(sc);
    }
    return CulpritsFound(s, b, refined, results);
  }

  // Logs the culprits (documents, suspects, near-duplicates), then the
  // verdict they support.
  // `refined`: for batches whose samples were bisected, the documents named
  // there (the rest of those batches become suspects).
  absl::Status CulpritsFound(Inc& s, Bisection b,
                             const std::map<int64_t, std::vector<v1::DocumentRef>>& refined = {},
                             const std::vector<lg::SampleCulprit>& samples = {}) {
    const std::vector<int64_t> window = WindowPositions(s);
    std::vector<int64_t> named = b.culprits;
    named.insert(named.end(), b.group.begin(), b.group.end());
    if (b.partial) named = window;  // the untested rest stays skipped too
    std::sort(named.begin(), named.end());
    std::vector<int64_t> others;
    for (int64_t x : window) {
      if (!std::binary_search(named.begin(), named.end(), x)) others.push_back(x);
    }
    SG_ASSIGN_OR_RETURN(std::vector<v1::DocumentRef> docs, DocumentsAt(s, named));
    SG_ASSIGN_OR_RETURN(std::vector<v1::DocumentRef> suspects, DocumentsAt(s, others));
    if (!refined.empty()) {
      std::vector<v1::DocumentRef> kept;
      std::set<std::pair<std::string, int64_t>> in_refined;
      for (const auto& [p, list] : refined) {
        for (const auto& d : list) in_refined.insert({d.domain(), d.document_id()});
      }
      for (const auto& d : docs) {
        const auto r = refined.find(d.data_position());
        if (r == refined.end() || in_refined.count({d.domain(), d.document_id()})) {
          kept.push_back(d);
        } else {
          suspects.push_back(d);  // cleared by the sample bisect
        }
      }
      docs = std::move(kept);
    }
    // A document that spans a culprit batch and another is a culprit.
    std::set<std::pair<std::string, int64_t>> culprit_ids;
    for (const auto& d : docs) culprit_ids.insert({d.domain(), d.document_id()});
    lg::EventPayload p;
    lg::Culprit* c = p.mutable_culprit();
    for (int64_t x : b.culprits) {
      c->add_positions(x);
      c->add_steps(StepOf(s.chosen->plan(), x));
    }
    for (int64_t x : b.partial ? named : b.group) {
      if (std::find(b.culprits.begin(), b.culprits.end(), x) == b.culprits.end()) {
        c->add_group_positions(x);
      }
    }
    c->set_none_reproduced(b.none_reproduced);
    c->set_partial(b.partial);
    for (const auto& sc : samples) *c->add_samples() = sc;
    for (const auto& d : docs) *c->add_documents() = d;
    // Each suspect once (a document spanning batches appears at each).
    std::set<std::pair<std::string, int64_t>> listed = culprit_ids;
    for (const auto& d : suspects) {
      if (listed.insert({d.domain(), d.document_id()}).second) *c->add_suspects() = d;
    }
    if (!b.none_reproduced && !docs.empty()) {
      absl::StatusOr<std::vector<v1::NearDuplicate>> similar = view->NearDuplicates(s.run(), docs);
      if (similar.ok()) {
        for (const auto& d : *similar) *c->add_near_duplicates() = d;
      } else {
        SG_LOG(WARNING) << "incident " << s.id() << ": near-duplicate search: " << similar.status();
      }
    }
    std::vector<std::string> names;
    for (const auto& d : docs) names.push_back(absl::StrCat(d.domain(), ":", d.document_id()));
    auto list = [](const std::vector<int64_t>& v) { return absl::StrJoin(v, ","); };
    std::string note;
    if (b.none_reproduced) {
      note = absl::StrCat("bisect: no part of the window [", list(window),
                          "] reproduces the spike when fed without the rest");
    } else if (b.untested) {
      note = absl::StrCat("culprits: the skipped window, data positions ", list(named),
                          " (bisect off)");
    } else {
      note = absl::StrCat(
          "bisect: ",
          b.culprits.empty() ? std::string()
                             : absl::StrCat("culprit batch(es) at data position(s) ",
                                            list(b.culprits), " spike alone"),
          !b.culprits.empty() && !b.group.empty() ? "; " : "",
          b.group.empty() ? std::string()
                          : absl::StrCat("positions ", list(b.group),
                                         " spike only together"),
          b.partial ? absl::StrCat(b.culprits.empty() ? "" : "; ",
                                   "the probe budget ran out before the rest of the window was "
                                   "tested: the window [", list(named), "] is kept whole")
                    : "",
          names.empty() ? "" : "; documents ", absl::StrJoin(names, " "),
          suspects.empty() ? "" : absl::StrCat("; ", c->suspects_size(), " suspect document(s)"));
    }
    for (const lg::SampleCulprit& sc : samples) {
      absl::StrAppend(
          &note, "; batch ", sc.position(), ": ",
          sc.none_reproduced()
              ? absl::StrCat("no document of its ", sc.documents(),
                             " reproduces the spike in its own samples: all are named")
              : absl::StrCat(sc.named_documents(), " of its ", sc.documents(),
                             " documents spike in their own samples (",
                             absl::StrJoin(sc.slots(), ","), " of ", sc.batch_samples(), ")",
                             sc.partial() ? "; the document probes ran out: the documents not "
                                            "cleared are kept"
                                          : ""));
    }
    p.set_note(note);
    p.set_detail(note);
    SG_RETURN_IF_ERROR(Emit(s, kBisectResult, p));

    if (b.none_reproduced) {
      return EmitVerdict(
          s, v1::FRAGILITY, Confidence(s, 0.6),
          "the spike reproduces with the full data and is gone with the window skipped, but no "
          "batch of the window reproduces it when fed without the others: not a data trigger; "
          "the model state is fragile",
          FragilityRecommendations(s),
          "fix ladder: lr × factor, then longer warmup and tighter clipping, then β2/ε");
    }
    const double conf = b.untested || b.partial ? 0.85 : b.culprits.empty() ? 0.7 : 0.95;
    std::vector<std::string> holes;
    for (const auto& [lo, hi] : Ranges(named)) holes.push_back(absl::StrCat("[", lo, ", ", hi, ")"));
    return EmitVerdict(
        s, v1::DATA, Confidence(s, conf),
        absl::StrCat("skipping data position(s) ", list(window),
                     " removed the spike; the data there triggers it"),
        {"filter the near-duplicates of the quarantined documents from the corpus"},
        absl::StrCat("keep the hole(s) ", absl::StrJoin(holes, " "),
                     " in the data plan; quarantine ", docs.size(), " document(s)"),
        docs);
  }

  // ---- Deciding -------------------------------------------------------------------

  // The workers could not load the chosen checkpoint (or another command of
  // a probe failed): give that checkpoint up and start over from the next
  // candidate, or say clearly that none is left.
  absl::Status RetryCheckpoint(Inc& s, const std::string& why) {
    std::vector<std::string> excluded = s.excluded_uris;
    const int64_t failed_step = s.chosen ? s.chosen->checkpoint().step() : -1;
    if (s.chosen) {
      excluded.push_back(s.chosen->checkpoint().uri());
      (void)store->PinCheckpoint(s.run(), failed_step, false);
    }
    return ChooseCheckpoint(
        s, excluded,
        absl::StrCat("checkpoint step ", failed_step, " given up: ", why));
  }

  absl::Status ChooseCheckpoint(Inc& s, const std::vector<std::string>& excluded = {},
                                const std::string& retry_note = "") {
    const v1::ProbePolicy& probe = s.policy.probe();
    int64_t onset = s.opened.has_precursor()
                        ? std::min(s.onset(), s.opened.precursor_onset_step())
                        : s.onset();
    SG_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, view->Checkpoints(s.run()));
    std::optional<CheckpointInfo> in_window, older;
    auto better = [&](const std::optional<CheckpointInfo>& cur, const CheckpointInfo& c) {
      if (!cur) return true;
      if (c.step != cur->step) return c.step > cur->step;
      // Same step: prefer the watched generation's own checkpoint.
      return c.generation == s.opened.generation() && cur->generation != c.generation;
    };
    auto scan = [&](int64_t before) {
      in_window.reset();
      older.reset();
      for (const CheckpointInfo& c : all) {
        if (!c.complete || c.generation > s.opened.generation() || c.step >= before) continue;
        if (std::find(excluded.begin(), excluded.end(), c.uri) != excluded.end()) continue;
        if (c.step >= before - probe.max_steps_before_onset() &&
            c.step <= before - probe.min_steps_before_onset() && better(in_window, c)) {
          in_window = c;
        }
        if (better(older, c)) older = c;
      }
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
    if (position < 0) position = PositionAt(plan, s.onset());
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
    return Emit(s, kCheckpoint, p);
  }

  CheckpointInfo Chosen(const Inc& s) { return FromRecord(s.chosen->checkpoint()); }

  absl::Status ProposeReplay(Inc& s) {
    const int64_t stop = s.onset() + s.policy.probe().replay_steps_past_onset();
    return RequestRewind(s, kReplay, Chosen(s), s.chosen->plan(), stop, std::nullopt,
                         s.onset() - 2, 0, 0, 0, "same checkpoint, same data");
  }

  // The hole around `position`. Step s consumes the s-th position of the
  // plan, and the checkpoint already holds the positions consumed before
  // its step: a hole never starts before the position the checkpoint's step
  // consumes, or it would shift every later step's data instead.
  std::pair<int64_t, int64_t> HoleAround(const Inc& s, int64_t position) {
    const v1::ProbePolicy& probe = s.policy.probe();
    int64_t first = PositionAt(s.chosen->plan(), s.chosen->checkpoint().step());
    if (first < 0) first = 0;
    return {std::max<int64_t>(first, position - probe.skip_before()),
            std::max<int64_t>(first, position) + probe.skip_after() + 1};
  }

  // The skip probe: a hole around the onset's position, or (extending) the
  // holes so far plus one around `extra`, where the previous skip spiked.
  absl::Status ProposeSkip(Inc& s, std::optional<int64_t> extra = std::nullopt) {
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
    return RequestRewind(s, kSkip, Chosen(s), WithHoles(s.chosen->plan(), holes), horizon,
                         std::nullopt, s.chosen->checkpoint().step(), 0, holes.front().first,
                         holes.front().second, why, {}, holes);
  }

  absl::Status ProposeRung(Inc& s, int rung) {
    const int64_t ckpt = s.chosen->checkpoint().step();
    return RequestRewind(s, kFix, Chosen(s), s.chosen->plan(),
                         s.onset() + s.policy.fix().verify_steps(),
                         RungHParams(s.policy.fix(), rung), ckpt, rung, 0, 0,
                         absl::StrCat("FRAGILITY fix rung ", rung));
  }

  absl::Status ProposeTransplant(Inc& s) {
    // A much earlier model state: the newest complete checkpoint at least
    // max_steps_before_onset before the probe checkpoint, else the oldest.
    SG_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, view->Checkpoints(s.run()));
    const int64_t probe_ckpt = s.chosen->checkpoint().step();
    const int64_t far = probe_ckpt - s.policy.probe().max_steps_before_onset();
    std::optional<CheckpointInfo> pick, oldest;
    for (const CheckpointInfo& c : all) {
      if (!c.complete || c.generation > s.opened.generation() || c.step >= probe_ckpt) continue;
      if (c.step <= far && (!pick || c.step > pick->step)) pick = c;
      if (!oldest || c.step < oldest->step) oldest = c;
    }
    if (!pick) pick = oldest;
    std::optional<int64_t> at;
    if (pick) {
      SG_ASSIGN_OR_RETURN(std::vector<StepObservation> next,
                          view->Steps(s.run(), s.opened.generation(), pick->step + 1, pick->step + 1));
      for (const auto& o : next) at = o.data_position;
    }
    if (!pick || !at || s.culprits.empty()) {
      lg::EventPayload p;
      p.set_note("transplant skipped: no earlier complete checkpoint with a known data position");
      p.set_detail(p.note());
      return Emit(s, kTransplantSkipped, p);
    }
    const int64_t culprit = s.culprits.front();
    return RequestRewind(s, kTransplant, *pick, WithSplice(s.chosen->plan(), *at, culprit, culprit + 1),
                         pick->step + 1 + s.policy.probe().replay_steps_past_onset(), std::nullopt,
                         pick->step + 1, 0, culprit, culprit + 1,
                         absl::StrCat("culprit position ", culprit, " fed at step ", pick->step + 1));
  }

  absl::Status Close(Inc& s) {
    lg::EventPayload p;
    const int64_t now = clock->NowUnixMillis();
    const double to_verdict = s.verdict_ms > 0 ? (s.verdict_ms - s.inc.opened_unix_ms()) / 1000.0 : 0;
    p.set_detail(absl::StrFormat(
        "closed: %s; verdict after %.0f s, closed after %.0f s; %d probe(s), %d steps "
        "re-executed, %.3f GPU-hours",
        v1::Verdict_Name(s.verdict), to_verdict, (now - s.inc.opened_unix_ms()) / 1000.0, s.probes,
        s.reexecuted, s.inc.cost().gpu_hours()));
    SG_RETURN_IF_ERROR(Emit(s, kClosed, p));
    if (s.chosen) (void)store->PinCheckpoint(s.run(), s.chosen->checkpoint().step(), false);
    return absl::OkStatus();
  }

  bool NeedsQuarantine(const Inc& s) {
    return s.verdict == v1::DATA && s.fix_requested && !s.quarantined && !s.pending &&
           s.inc.documents_size() > 0;
  }

  // The fix ladder after a verdict. Returns false when waiting.
  absl::StatusOr<bool> FixStep(Inc& s) {
    const v1::Policy& pol = s.policy;
    if (s.aborting) {
      if (!s.continued) return false;
      lg::EventPayload p;
      p.set_detail("aborted; the run continues as it is");
      SG_RETURN_IF_ERROR(Emit(s, kAborted, p));
      if (s.chosen) (void)store->PinCheckpoint(s.run(), s.chosen->checkpoint().step(), false);
      return true;
    }
    const std::string last_kind = s.probe ? s.probe->probe_kind() : "";
    const std::string last_outcome = s.last_finished ? s.last_finished->outcome() : "";
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
              absl::StrCat("fix: continue from the replay (generation ", s.probe_generation,
                           "), verify through step ", horizon + pol.fix().verify_steps())));
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
          if (!s.culprits.empty()) keep = Ranges(s.culprits);
          if (last_kind == kSkip) {
            // The skip generation is the fix: let it go on with its holes.
            const int64_t horizon = s.probe->stop_after_step();
            SG_RETURN_IF_ERROR(RequestContinue(
                s, ModeFor(s.run()) == v1::MODE_PROPOSE, s.probe_generation, horizon + 1,
                horizon + pol.fix().verify_steps(),
                absl::StrCat("fix: continue the skip generation ", s.probe_generation,
                             " with its hole(s); verify through step ",
                             Clamp(s, horizon + pol.fix().verify_steps()))));
          } else {
            // Bisect or transplant moved the run: rewind once more, with
            // holes at the culprits only.
            std::vector<std::string> parts;
            for (const auto& [lo, hi] : keep) parts.push_back(absl::StrCat("[", lo, ", ", hi, ")"));
            SG_RETURN_IF_ERROR(RequestRewind(
                s, kFix, Chosen(s), WithHoles(s.chosen->plan(), keep),
                s.onset() + pol.fix().verify_steps(), std::nullopt, s.chosen->checkpoint().step(),
                0, keep.empty() ? 0 : keep.front().first, keep.empty() ? 0 : keep.front().second,
                absl::StrCat("DATA fix: hole(s) ", absl::StrJoin(parts, " "), " only"), {},
                keep));
          }
          return true;
        }
        if (NeedsQuarantine(s)) {
          SG_RETURN_IF_ERROR(RequestQuarantine(s));
          return true;
        }
        if (last_kind == kFix && !s.continued) {
          if (last_outcome == "clean") {
            SG_RETURN_IF_ERROR(RequestContinue(s, false, -1, 0, 0,
                                               "DATA fix verified: the run continues"));
          } else if (last_outcome == "failed") {
            SG_RETURN_IF_ERROR(Inconclusive(
                s, absl::StrCat("the DATA fix probe failed: ", s.last_finished->detail())));
          } else {
            SG_RETURN_IF_ERROR(Inconclusive(
                s, absl::StrCat("the spike returned with the window skipped: ",
                                s.last_finished->detail())));
          }
          return true;
        }
        if (s.continued && (s.verified || last_kind == kFix) &&
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
        if (last_kind == kFix && s.last_finished) {
          if (last_outcome == "clean") {
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
          if (last_outcome == "failed") {
            SG_RETURN_IF_ERROR(Inconclusive(s, s.last_finished->detail()));
            return true;
          }
          if (s.rung < 3) {
            SG_RETURN_IF_ERROR(ProposeRung(s, s.rung + 1));
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

  // The next decision when nothing is pending. Returns false when waiting.
  absl::StatusOr<bool> Decide(Inc& s) {
    switch (s.stage) {
      case Stage::kOpened: {
        const v1::Mode mode = ModeFor(s.run());
        if (mode == v1::MODE_OBSERVE || mode == v1::MODE_UNSPECIFIED) {
          SG_RETURN_IF_ERROR(EmitVerdict(s, v1::VERDICT_UNSPECIFIED, 0.0,
                                         "observe mode: no probes", {}, "none (observe mode)", {},
                                         false, /*leave_running=*/true));
          return true;
        }
        SG_RETURN_IF_ERROR(ChooseCheckpoint(s));
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
        const std::string kind = s.probe ? s.probe->probe_kind() : "";
        const std::string outcome = s.last_finished ? s.last_finished->outcome() : "failed";
        if (outcome == "failed") {
          const std::string detail = s.last_finished ? s.last_finished->detail() : "no outcome";
          if (s.last_finished && s.last_finished->command_failed()) {
            // The workers could not start the probe (e.g. the checkpoint is
            // gone): the next candidate checkpoint, or a clear verdict.
            SG_RETURN_IF_ERROR(RetryCheckpoint(s, detail));
          } else {
            SG_RETURN_IF_ERROR(Inconclusive(s, absl::StrCat(kind, " probe failed: ", detail)));
          }
          return true;
        }
        if (kind == kReplay) {
          if (outcome == "clean") {
            SG_RETURN_IF_ERROR(EmitTransient(s));
          } else {
            SG_RETURN_IF_ERROR(ProposeSkip(s));
          }
          return true;
        }
        if (kind == kSkip) {
          SG_RETURN_IF_ERROR(VerdictAfterSkip(s));
          return true;
        }
        if (kind == kBisect || kind == kSampleBisect) {
          SG_RETURN_IF_ERROR(BisectStep(s));
          return true;
        }
        SG_RETURN_IF_ERROR(Inconclusive(s, absl::StrCat("unexpected probe '", kind, "'")));
        return true;
      }
      case Stage::kFix:
        return FixStep(s);
      case Stage::kClosed:
        return false;
    }
    return false;
  }

  absl::Status EmitTransient(Inc& s) {
    SG_ASSIGN_OR_RETURN(
        std::vector<StepObservation> spike,
        view->Steps(s.run(), s.opened.generation(), s.onset(), std::max(s.onset(), s.opened.peak_step())));
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
                     " did not spike at step ", s.onset(),
                     ": a transient fault (hardware) or nondeterminism",
                     ranks.empty() ? "" : absl::StrCat("; outlier rank(s) ", rank_list)),
        std::move(recs),
        absl::StrCat("continue from the replay (generation ", s.probe_generation, ")"));
  }

  // ---- Judging -------------------------------------------------------------------

  absl::Status BuildJudge(Inc& s) {
    if (!s.probe) {
      return absl::DataLossError(absl::StrCat("incident ", s.id(), ": a probe runs but its request is not in the log"));
    }
    auto j = std::make_unique<Judge>();
    const bool grad = s.opened.kind() == static_cast<int>(Detection::Kind::kGradNormSpike);
    const v1::SpikeDetectorPolicy& sp = grad ? s.policy.grad_norm_spike() : s.policy.loss_spike();
    j->use_grad = grad;
    j->detector = std::make_unique<detect::SpikeDetector>(DetectorOptions(sp));
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
    const int window = DetectorOptions(sp).window;
    SG_ASSIGN_OR_RETURN(std::vector<StepObservation> before,
                        view->Steps(s.run(), s.opened.generation(),
                                    std::max<int64_t>(0, j->checkpoint_step - window),
                                    j->checkpoint_step - 1));
    for (const auto& o : before) {
      if (!NonFinite(o)) j->detector->Observe(o.step, grad ? o.grad_norm : o.loss);
    }
    if (s.probe->probe_kind() == kReplay && s.stage == Stage::kProbing && s.nondet_step < 0) {
      SG_ASSIGN_OR_RETURN(std::vector<StepObservation> original,
                          view->Steps(s.run(), s.opened.generation(), j->checkpoint_step,
                                      s.onset() - 1));
      for (const auto& o : original) j->original_hash[o.step] = o.loss_hash;
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
  absl::StatusOr<bool> HandleJudge(Inc& s) {
    Judge* j = s.judge.get();
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
      SG_RETURN_IF_ERROR(Emit(s, kNondeterminism, p));
      changed = true;
      j = s.judge.get();
      if (!j) return true;
    }
    if (!j->result) return changed;
    const lg::ProbeFinished f = *j->result;
    lg::EventPayload p;
    if (j->verification) {
      if (f.outcome() == "clean") {
        p.set_detail(absl::StrCat("verified: no spike through step ", f.last_step()));
        SG_RETURN_IF_ERROR(Emit(s, kVerified, p));
      } else {
        const std::string what = absl::StrCat("spike returned while verifying the fix: ", f.detail());
        p.set_note(what);
        p.set_detail(what);
        SG_RETURN_IF_ERROR(Emit(s, kVerificationFailed, p));
        SG_RETURN_IF_ERROR(Inconclusive(s, what));
      }
      return true;
    }
    *p.mutable_finished() = f;
    const std::string kind = s.probe->probe_kind();
    if (kind == kTransplant) {
      p.set_note(f.outcome() == "clean"
                     ? absl::StrCat("transplant: the culprit batch does not spike the step-",
                                    s.probe->checkpoint().step(),
                                    " model: data × state (the model was fragile too)")
                     : absl::StrCat("transplant: the culprit batch spikes the step-",
                                    s.probe->checkpoint().step(), " model as well: the data alone"));
    }
    p.set_detail(absl::StrCat(kind, " probe (generation ", j->generation, "): ", f.outcome(), ": ",
                              f.detail()));
    SG_RETURN_IF_ERROR(Emit(s, kProbeFinished, p));
    return true;
  }

  absl::Status Advance(Inc& s) {
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
};

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

absl::Status IncidentEngine::Recover() {
  State& st = *state_;
  SG_ASSIGN_OR_RETURN(std::vector<v1::Incident> open, st.store->OpenIncidents());
  std::vector<Inc*> resumed;
  for (const v1::Incident& stored : open) {
    if (st.incidents.count(stored.id())) continue;
    SG_ASSIGN_OR_RETURN(std::vector<IncidentStore::StoredEvent> events, st.store->Events(stored.id()));
    auto s = std::make_unique<Inc>();
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
    watched = std::max({watched, s->opened.generation(), s->probe_generation, s->verify_generation});
    Inc* raw = s.get();
    st.incidents[stored.id()] = std::move(s);
    resumed.push_back(raw);
  }
  absl::Status first;
  for (Inc* s : resumed) {
    SG_LOG(INFO) << "incident " << s->id() << " (run " << s->run() << "): resuming from "
                 << s->inc.events_size() << " event(s), state "
                 << v1::IncidentState_Name(s->inc.state());
    if (absl::Status status = st.Advance(*s); !status.ok() && first.ok()) first = status;
  }
  return first;
}

absl::Status IncidentEngine::OnDetection(const std::string& run, const Detection& d) {
  State& st = *state_;
  auto it = st.watched.try_emplace(run, d.generation).first;
  if (d.generation < it->second) return absl::OkStatus();  // a stale timeline
  it->second = d.generation;
  // A probe's own spikes are its outcome, never an incident of their own.
  if (st.IsProbeGeneration(run, d.generation)) return absl::OkStatus();
  // One event, one incident: another detector firing for the same onset of
  // the same generation is evidence of the incident already opened for it.
  const v1::ProbePolicy probe = st.view->PolicyFor(run).probe();
  const int64_t same_event = std::max<int64_t>(8, probe.skip_before() + probe.skip_after());
  for (const State::Past& past : st.Known(run)) {
    if (past.generation != d.generation || std::llabs(past.onset - d.onset_step) > same_event) {
      continue;
    }
    auto open = st.incidents.find(past.id);
    if (open != st.incidents.end() && open->second->stage != Stage::kClosed) {
      lg::EventPayload p;
      p.set_detail(absl::StrFormat("also %s at step %d (peak %.4g, baseline %.4g)",
                                   TriggerName(d.kind), d.onset_step, d.peak_value, d.baseline));
      p.set_note(p.detail());
      SG_RETURN_IF_ERROR(st.Emit(*open->second, kNote, p));
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
  SG_ASSIGN_OR_RETURN(int64_t id, st.store->CreateIncident(run, initial));
  auto s = std::make_unique<Inc>();
  s->inc = initial;
  s->inc.set_id(id);
  Inc& inc = *s;
  st.incidents[id] = std::move(s);

  lg::EventPayload p;
  lg::Opened* o = p.mutable_opened();
  o->set_run(run);
  o->set_kind(static_cast<int>(d.kind));
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
  *o->mutable_policy() = st.view->PolicyFor(run);
  o->set_world_size(st.view->WorldSize(run));
  p.set_detail(absl::StrFormat(
      "%s at step %d (peak %.4g at step %d, baseline %.4g) in generation %d%s%s",
      TriggerName(d.kind), d.onset_step, d.peak_value, d.peak_step, d.baseline, d.generation,
      d.precursor_onset_step ? absl::StrCat("; precursor ", d.precursor, " from step ",
                                            *d.precursor_onset_step)
                             : std::string(),
      d.also.empty() ? std::string() : absl::StrCat("; also ", absl::StrJoin(d.also, ", "))));
  SG_RETURN_IF_ERROR(st.Emit(inc, kOpened, p));
  return st.Advance(inc);
}

absl::Status IncidentEngine::OnStep(const std::string& run, const StepObservation& step) {
  State& st = *state_;
  int64_t& watched = st.watched[run];
  watched = std::max(watched, step.generation);
  Inc* s = st.ActiveFor(run);
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
  auto [it, fresh] = st.ended.try_emplace({run, generation}, last_step, reason);
  if (!fresh) {
    if (it->second.first <= last_step) return absl::OkStatus();  // an earlier rank said more
    it->second = {last_step, reason};
  }
  Inc* s = st.ActiveFor(run);
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
  Inc* s = st.ActiveFor(run);
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
  f->set_outcome("failed");
  f->set_command_failed(true);
  f->set_detail(absl::StrCat("the workers could not execute ", command_id, ": ", message));
  f->set_last_step(s->judge->last_fed);
  f->set_steps_executed(std::max<int64_t>(0, s->judge->last_fed - s->judge->checkpoint_step + 1));
  f->set_spike_step(-1);
  f->set_spike_position(-1);
  f->set_nonfinite_layer(-1);
  p.set_detail(absl::StrCat(s->probe->probe_kind(), " probe (generation ", s->probe_generation,
                            "): failed: ", f->detail()));
  SG_RETURN_IF_ERROR(st.Emit(*s, kProbeFinished, p));
  return st.Advance(*s);
}

absl::Status IncidentEngine::Tick() {
  State& st = *state_;
  absl::Status first;
  const absl::Time now = st.clock->Now();
  std::vector<Inc*> active;
  for (auto& [id, s] : st.incidents) {
    if (s->stage != Stage::kClosed) active.push_back(s.get());
  }
  for (Inc* s : active) {
    absl::Status status;
    if (s->stage == Stage::kProbing && !s->pending && s->judge && !s->judge->result &&
        now - s->judge->last_progress >= st.options.probe_timeout) {
      s->judge->Finish("failed",
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
  auto it = st.incidents.find(incident_id);
  if (it == st.incidents.end()) {
    return absl::NotFoundError(absl::StrCat("incident ", incident_id, " is not active"));
  }
  Inc& s = *it->second;
  if (!s.approval_wait()) {
    return absl::FailedPreconditionError(
        absl::StrCat("incident ", incident_id, " is not awaiting approval (state ",
                     v1::IncidentState_Name(s.inc.state()), ")"));
  }
  lg::EventPayload p;
  p.set_detail(absl::StrCat("approved: ", s.pending->reason()));
  SG_RETURN_IF_ERROR(st.Emit(s, kApproved, p));
  return st.Advance(s);
}

absl::Status IncidentEngine::Abort(int64_t incident_id, const std::string& reason) {
  State& st = *state_;
  auto it = st.incidents.find(incident_id);
  if (it == st.incidents.end()) {
    return absl::NotFoundError(absl::StrCat("incident ", incident_id, " is not active"));
  }
  Inc& s = *it->second;
  if (s.inc.state() == v1::ABORTED || s.aborting) return absl::OkStatus();
  if (s.stage == Stage::kClosed) {
    return absl::FailedPreconditionError(
        absl::StrCat("incident ", incident_id, " is already closed"));
  }
  lg::Action a;
  a.set_kind("continue");
  a.set_request_id(absl::StrCat("incident-", s.id(), "/abort"));
  a.set_reason(absl::StrCat("abort: ", reason));
  lg::EventPayload p;
  *p.mutable_action() = a;
  p.set_note(absl::StrCat("aborted by an operator: ", reason.empty() ? "no reason given" : reason));
  p.set_detail(p.note());
  SG_RETURN_IF_ERROR(st.Emit(s, kAbortRequested, p));
  return st.Advance(s);
}

bool IncidentEngine::ProbeRunning(const std::string& run) const {
  for (const auto& [id, s] : state_->incidents) {
    if (s->run() != run || s->stage == Stage::kClosed) continue;
    if (s->stage == Stage::kProbing) return true;
    if (s->pending && s->pending->kind() == "rewind" && !s->approval_wait()) return true;
  }
  return false;
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
