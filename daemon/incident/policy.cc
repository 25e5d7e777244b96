#include "daemon/incident/policy.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace spikeguard::incident {
namespace {

namespace v1 = spikeguard::v1;

// Upper bounds of the policy's knobs: a detector window is memory per run
// and a step count is arithmetic on steps; neither may be anything an int
// holds.
constexpr int64_t kMaxWindow = 100'000;
constexpr int64_t kMaxSteps = 1'000'000'000;
constexpr int64_t kMaxCount = 10'000;

v1::SpikeDetectorPolicy DefaultSpike() {
  v1::SpikeDetectorPolicy p;
  p.set_window(128);
  p.set_min_samples(64);
  p.set_z_threshold(6.0);
  p.set_relative_floor(0.05);
  p.set_recovery_steps(50);
  // Thresholds follow the run's own tails (detect::SpikeDetector).
  p.set_tail_factor(2.0);
  return p;
}

// The loss section's blip and level-shift rules (detect::RunMonitor): a
// one-step excursion with nothing corroborating it is a blip, three within
// 50 steps an incident; an uncorroborated excursion that stays under 12 %
// (plus five noise scales) is a legit level shift. Measured on the detector
// benchmark's held-out split (detector_bench).
v1::SpikeDetectorPolicy DefaultLossSpike() {
  v1::SpikeDetectorPolicy p = DefaultSpike();
  p.set_blip_steps(1);
  p.set_blip_escalate_count(3);
  p.set_blip_window(50);
  p.set_shift_tolerance(0.12);
  return p;
}

// Collects parser errors with their position instead of printing them.
class ErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    // The tokenizer counts from 0; editors count from 1.
    errors.push_back(absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message));
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  std::vector<std::string> errors;
};

absl::Status CheckSpike(const std::string& name, const v1::SpikeDetectorPolicy& p) {
  if (p.window() <= 0 || p.window() > kMaxWindow) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".window must be in [1, ", kMaxWindow,
                                                   "] (got ", p.window(), ")"));
  }
  if (p.min_samples() <= 0 || p.min_samples() > p.window()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".min_samples must be in [1, window=",
                                                   p.window(), "] (got ", p.min_samples(), ")"));
  }
  if (!(p.z_threshold() > 0) || !std::isfinite(p.z_threshold())) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".z_threshold must be a finite positive number (got ", p.z_threshold(), ")"));
  }
  if (!(p.relative_floor() >= 0) || !std::isfinite(p.relative_floor())) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".relative_floor must be >= 0 (got ", p.relative_floor(), ")"));
  }
  if (p.recovery_steps() <= 0 || p.recovery_steps() > kMaxWindow) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".recovery_steps must be in [1, ",
                                                   kMaxWindow, "] (got ", p.recovery_steps(),
                                                   ")"));
  }
  if (!(p.tail_factor() >= 0 && p.tail_factor() <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".tail_factor must be in [0, 100] (got ", p.tail_factor(), ")"));
  }
  if (p.blip_steps() < 0 || p.blip_steps() > p.recovery_steps()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".blip_steps must be in [0, recovery_steps=",
                                                   p.recovery_steps(), "] (got ", p.blip_steps(),
                                                   ")"));
  }
  if (p.blip_escalate_count() < 0 || p.blip_escalate_count() > kMaxCount) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".blip_escalate_count must be in [0, ",
                                                   kMaxCount, "] (got ", p.blip_escalate_count(),
                                                   ")"));
  }
  if (p.has_blip_window() && (p.blip_window() <= 0 || p.blip_window() > kMaxWindow)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".blip_window must be in [1, ", kMaxWindow,
                                                   "] (got ", p.blip_window(), ")"));
  }
  if (!(p.shift_tolerance() >= 0 && p.shift_tolerance() <= 100)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".shift_tolerance must be in [0, 100] (got ", p.shift_tolerance(), ")"));
  }
  return absl::OkStatus();
}

absl::Status Positive(const std::string& field, double value) {
  if (!(value > 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be positive (got ", value, ")"));
  }
  return absl::OkStatus();
}

absl::Status NonNegative(const std::string& field, int64_t value) {
  if (value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be >= 0 (got ", value, ")"));
  }
  if (value > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be at most ", kMaxSteps, " (got ", value, ")"));
  }
  return absl::OkStatus();
}

// A count or step span: in [1, max].
absl::Status InRange(const std::string& field, int64_t value, int64_t max) {
  if (value <= 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be in [1, ", max, "] (got ", value, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

v1::Policy DefaultPolicy() {
  v1::Policy p;
  p.set_mode(v1::MODE_OBSERVE);
  *p.mutable_loss_spike() = DefaultLossSpike();
  *p.mutable_grad_norm_spike() = DefaultSpike();
  // Healthy pre-clip grad norms swing far more than losses (2-5x outliers in
  // small models, measured on the reference worker and in the detector
  // benchmark); a grad-norm spike must reach 8x its median to open an
  // incident. Real blow-ups (bit flips, instabilities) are far larger.
  p.mutable_grad_norm_spike()->set_relative_floor(7.0);

  v1::PrecursorPolicy* pre = p.mutable_precursor();
  // The values the precursor detector was tuned with on the benchmark traces
  // (daemon/detect/precursor_detector.h).
  pre->set_trend_window(32);
  pre->set_trend_z_threshold(6.0);
  pre->set_attn_logit_warn(1e3);
  pre->set_attn_logit_critical(1e4);
  pre->set_persistence_steps(5);
  pre->set_on_critical(v1::PRECURSOR_WARN);

  v1::ProbePolicy* probe = p.mutable_probe();
  probe->set_min_steps_before_onset(100);
  probe->set_max_steps_before_onset(500);
  probe->set_replay_steps_past_onset(10);
  probe->set_skip_before(5);
  probe->set_skip_after(5);
  probe->set_skip_horizon(200);
  // Exact culprits: the skip window is bisected down to the batches that
  // trigger the spike (two probes when the onset batch alone does).
  probe->set_bisect(true);
  probe->set_transplant(false);
  probe->set_bisect_documents(true);
  probe->set_max_document_probes(6);
  probe->set_window_checkpoint(true);

  p.mutable_budget()->set_max_probes(12);
  p.mutable_budget()->set_max_reexecuted_steps(20000);
  p.mutable_escalation()->set_data_incidents(3);
  p.mutable_escalation()->set_window_steps(5000);

  v1::FixPolicy* fix = p.mutable_fix();
  fix->set_verify_steps(200);
  fix->set_lr_factor(0.7);
  fix->set_extra_warmup_steps(200);
  fix->set_tight_clip_norm(0.5);
  fix->set_beta2(0.95);
  fix->set_eps(1e-8);
  fix->set_hold_out_documents(true);
  fix->set_hold_out_similarity(0.7);
  fix->set_hold_out_max_positions(200000);

  p.mutable_launch()->set_heartbeat_timeout_ms(30000);
  p.mutable_launch()->set_max_restarts(3);
  return p;
}

v1::Policy MergePolicy(const v1::Policy& base, const v1::Policy& o) {
  // Every knob has field presence, so the protobuf merge is the layering
  // rule: a knob set in `o` (0 and false included) replaces base's, one left
  // out does not; sections merge field by field; the mode (an enum without
  // presence) is replaced unless MODE_UNSPECIFIED.
  v1::Policy p = base;
  p.MergeFrom(o);
  return p;
}

absl::StatusOr<v1::Policy> ParsePolicyText(const std::string& text, const std::string& origin) {
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  v1::Policy policy;
  if (!parser.ParseFromString(text, &policy)) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": ",
                     errors.errors.empty() ? std::string("cannot parse text-format Policy")
                                           : absl::StrJoin(errors.errors, "; ")));
  }
  return policy;
}

absl::StatusOr<v1::Policy> LoadPolicyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("policy file ", path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("policy file ", path, ": read error"));
  return ParsePolicyText(text.str(), path);
}

absl::Status ValidatePolicy(const v1::Policy& p) {
  if (!v1::Mode_IsValid(p.mode())) {
    return absl::InvalidArgumentError(absl::StrCat("mode: unknown value ", p.mode()));
  }
  if (absl::Status s = CheckSpike("loss_spike", p.loss_spike()); !s.ok()) return s;
  if (absl::Status s = CheckSpike("grad_norm_spike", p.grad_norm_spike()); !s.ok()) return s;

  const v1::PrecursorPolicy& pre = p.precursor();
  if (absl::Status s = InRange("precursor.trend_window", pre.trend_window(), kMaxWindow);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Positive("precursor.trend_z_threshold", pre.trend_z_threshold()); !s.ok()) {
    return s;
  }
  if (absl::Status s = Positive("precursor.attn_logit_warn", pre.attn_logit_warn()); !s.ok()) {
    return s;
  }
  if (!(pre.attn_logit_critical() >= pre.attn_logit_warn()) ||
      !std::isfinite(pre.attn_logit_critical())) {
    return absl::InvalidArgumentError(
        absl::StrCat("precursor.attn_logit_critical (", pre.attn_logit_critical(),
                     ") must be >= attn_logit_warn (", pre.attn_logit_warn(), ")"));
  }
  if (absl::Status s = InRange("precursor.persistence_steps", pre.persistence_steps(), kMaxWindow);
      !s.ok()) {
    return s;
  }
  if (pre.has_on_critical() && (!v1::PrecursorAction_IsValid(pre.on_critical()) ||
                                pre.on_critical() == v1::PRECURSOR_ACTION_UNSPECIFIED)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "precursor.on_critical: unknown value ", static_cast<int>(pre.on_critical()),
        " (want PRECURSOR_WARN, PRECURSOR_INCIDENT or PRECURSOR_LOG)"));
  }

  const v1::ProbePolicy& probe = p.probe();
  for (const auto& [name, value] : std::vector<std::pair<std::string, int64_t>>{
           {"probe.min_steps_before_onset", probe.min_steps_before_onset()},
           {"probe.max_steps_before_onset", probe.max_steps_before_onset()},
           {"probe.replay_steps_past_onset", probe.replay_steps_past_onset()},
           {"probe.skip_before", probe.skip_before()},
           {"probe.skip_after", probe.skip_after()},
       }) {
    if (absl::Status s = NonNegative(name, value); !s.ok()) return s;
  }
  if (probe.min_steps_before_onset() > probe.max_steps_before_onset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "probe.min_steps_before_onset (", probe.min_steps_before_onset(),
        ") must be <= probe.max_steps_before_onset (", probe.max_steps_before_onset(), ")"));
  }
  if (probe.skip_horizon() <= probe.skip_after() || probe.skip_horizon() > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe.skip_horizon (", probe.skip_horizon(),
                     ") must exceed probe.skip_after (", probe.skip_after(), ") and be at most ",
                     kMaxSteps));
  }
  if (absl::Status s = InRange("probe.max_document_probes", probe.max_document_probes(), kMaxCount);
      !s.ok()) {
    return s;
  }

  for (const auto& [name, value, max] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"budget.max_probes", p.budget().max_probes(), kMaxCount},
           {"budget.max_reexecuted_steps", p.budget().max_reexecuted_steps(), kMaxSteps},
           {"escalation.data_incidents", p.escalation().data_incidents(), kMaxCount},
           {"escalation.window_steps", p.escalation().window_steps(), kMaxSteps},
           {"fix.verify_steps", p.fix().verify_steps(), kMaxSteps},
           {"fix.hold_out_max_positions", p.fix().hold_out_max_positions(), kMaxSteps},
       }) {
    if (absl::Status s = InRange(name, value, max); !s.ok()) return s;
  }

  const v1::FixPolicy& fix = p.fix();
  if (!(fix.lr_factor() > 0 && fix.lr_factor() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fix.lr_factor must be in (0, 1] (got ", fix.lr_factor(), ")"));
  }
  if (absl::Status s = NonNegative("fix.extra_warmup_steps", fix.extra_warmup_steps()); !s.ok()) {
    return s;
  }
  if (absl::Status s = Positive("fix.tight_clip_norm", fix.tight_clip_norm()); !s.ok()) return s;
  if (!(fix.beta2() > 0 && fix.beta2() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fix.beta2 must be in (0, 1) (got ", fix.beta2(), ")"));
  }
  if (absl::Status s = Positive("fix.eps", fix.eps()); !s.ok()) return s;
  if (!(fix.hold_out_similarity() > 0 && fix.hold_out_similarity() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fix.hold_out_similarity must be in (0, 1] (got ", fix.hold_out_similarity(), ")"));
  }

  if (p.launch().heartbeat_timeout_ms() <= 0 ||
      p.launch().heartbeat_timeout_ms() > 7LL * 24 * 3600 * 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch.heartbeat_timeout_ms must be in [1, 604800000] (a week) (got ",
        p.launch().heartbeat_timeout_ms(), ")"));
  }
  if (absl::Status s = NonNegative("launch.max_restarts", p.launch().max_restarts()); !s.ok()) {
    return s;
  }
  if (p.launch().max_restarts() > kMaxCount) {
    return absl::InvalidArgumentError(absl::StrCat("launch.max_restarts must be at most ",
                                                   kMaxCount, " (got ",
                                                   p.launch().max_restarts(), ")"));
  }
  return absl::OkStatus();
}

detect::SpikeDetector::Options SpikeOptions(const v1::SpikeDetectorPolicy& p,
                                            detect::SpikeDetector::Options o) {
  // Values ValidatePolicy rejects keep `o`'s, so an unvalidated section can
  // never make an unusable detector.
  if (p.has_window() && p.window() > 0) o.window = p.window();
  if (p.has_min_samples() && p.min_samples() > 0) o.min_samples = p.min_samples();
  if (p.has_z_threshold() && p.z_threshold() > 0) o.z_threshold = p.z_threshold();
  if (p.has_relative_floor() && p.relative_floor() >= 0) o.relative_floor = p.relative_floor();
  if (p.has_recovery_steps() && p.recovery_steps() > 0) o.recovery_steps = p.recovery_steps();
  if (p.has_tail_factor() && p.tail_factor() >= 0 && p.tail_factor() <= 100) {
    o.tail_factor = p.tail_factor();
  }
  if (p.has_blip_steps() && p.blip_steps() >= 0 && p.blip_steps() <= o.recovery_steps) {
    o.blip_steps = p.blip_steps();
  }
  if (p.has_blip_escalate_count() && p.blip_escalate_count() >= 0 &&
      p.blip_escalate_count() <= kMaxCount) {
    o.blip_escalate_count = p.blip_escalate_count();
  }
  if (p.has_blip_window() && p.blip_window() > 0 && p.blip_window() <= kMaxWindow) {
    o.blip_window = p.blip_window();
  }
  if (p.has_shift_tolerance() && p.shift_tolerance() >= 0 && p.shift_tolerance() <= 100) {
    o.shift_tolerance = p.shift_tolerance();
  }
  return o;
}

}  // namespace spikeguard::incident
