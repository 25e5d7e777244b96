#include "daemon/incident/policy.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spikeguard::incident {
namespace {

namespace v1 = spikeguard::v1;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/spikeguard_policy_test_" + name;
}

TEST(PolicyDefaultsTest, IsSafeAndValid) {
  const v1::Policy p = DefaultPolicy();
  // A supervisor must be told to touch a run.
  EXPECT_EQ(p.mode(), v1::MODE_OBSERVE);
  EXPECT_EQ(p.loss_spike().window(), 128);
  EXPECT_EQ(p.loss_spike().min_samples(), 64);
  EXPECT_DOUBLE_EQ(p.loss_spike().z_threshold(), 6.0);
  EXPECT_DOUBLE_EQ(p.loss_spike().relative_floor(), 0.05);
  // Thresholds from the run's own tails, blips and level shifts.
  EXPECT_DOUBLE_EQ(p.loss_spike().tail_factor(), 2.0);
  EXPECT_EQ(p.loss_spike().blip_steps(), 1);
  EXPECT_EQ(p.loss_spike().blip_escalate_count(), 3);
  EXPECT_EQ(p.loss_spike().blip_window(), 50);
  EXPECT_DOUBLE_EQ(p.loss_spike().shift_tolerance(), 0.12);
  const detect::SpikeDetector::Options lo = SpikeOptions(p.loss_spike());
  EXPECT_DOUBLE_EQ(lo.tail_factor, 2.0);
  EXPECT_EQ(lo.blip_steps, 1);
  EXPECT_EQ(lo.blip_escalate_count, 3);
  EXPECT_EQ(lo.blip_window, 50);
  EXPECT_DOUBLE_EQ(lo.shift_tolerance, 0.12);
  // A policy that turns the blip rule off gets every onset as an incident.
  v1::SpikeDetectorPolicy off = p.loss_spike();
  off.set_blip_steps(0);
  EXPECT_EQ(SpikeOptions(off).blip_steps, 0);
  // Healthy grad norms have 2-5x outliers: a grad-norm spike must reach 8x.
  EXPECT_DOUBLE_EQ(p.grad_norm_spike().relative_floor(), 7.0);
  EXPECT_EQ(p.probe().min_steps_before_onset(), 100);
  EXPECT_EQ(p.probe().max_steps_before_onset(), 500);
  EXPECT_EQ(p.probe().skip_horizon(), 200);
  // Exact culprits by default: bisect on, with probes for two culprits.
  EXPECT_TRUE(p.probe().bisect());
  EXPECT_EQ(p.budget().max_probes(), 12);
  EXPECT_EQ(p.escalation().data_incidents(), 3);
  EXPECT_EQ(p.escalation().window_steps(), 5000);
  EXPECT_DOUBLE_EQ(p.fix().lr_factor(), 0.7);
  EXPECT_DOUBLE_EQ(p.fix().tight_clip_norm(), 0.5);
  EXPECT_DOUBLE_EQ(p.fix().beta2(), 0.95);
  EXPECT_EQ(p.launch().heartbeat_timeout_ms(), 30000);
  EXPECT_TRUE(ValidatePolicy(p).ok()) << ValidatePolicy(p);
}

TEST(PolicyMergeTest, SetFieldsWinAndUnsetFieldsKeepTheBase) {
  v1::Policy o;
  o.set_mode(v1::MODE_AUTO);
  o.mutable_probe()->set_skip_horizon(400);
  o.mutable_probe()->set_bisect(false);
  o.mutable_loss_spike()->set_z_threshold(7.0);
  const v1::Policy merged = MergePolicy(DefaultPolicy(), o);
  EXPECT_EQ(merged.mode(), v1::MODE_AUTO);
  EXPECT_EQ(merged.probe().skip_horizon(), 400);
  EXPECT_FALSE(merged.probe().bisect());
  EXPECT_DOUBLE_EQ(merged.loss_spike().z_threshold(), 7.0);
  // Untouched knobs keep the base values.
  EXPECT_EQ(merged.loss_spike().window(), 128);
  EXPECT_EQ(merged.probe().skip_before(), 5);
  EXPECT_EQ(merged.budget().max_probes(), 12);
  EXPECT_DOUBLE_EQ(merged.fix().eps(), 1e-8);
  // An empty override changes nothing.
  EXPECT_EQ(MergePolicy(DefaultPolicy(), v1::Policy()).DebugString(),
            DefaultPolicy().DebugString());
}

// An explicit 0 is a value, not "unset": it used to be replaced by the
// default (skip_before 5, min_steps_before_onset 100).
TEST(PolicyMergeTest, ExplicitZeroInAPolicyFileIsKept) {
  auto file = ParsePolicyText(
      "probe { skip_before: 0 min_steps_before_onset: 0 replay_steps_past_onset: 0 }\n"
      "fix { extra_warmup_steps: 0 }\n"
      "loss_spike { relative_floor: 0 }\n"
      "launch { max_restarts: 0 }\n",
      "inline");
  ASSERT_TRUE(file.ok()) << file.status();
  const v1::Policy merged = MergePolicy(DefaultPolicy(), *file);
  EXPECT_EQ(merged.probe().skip_before(), 0);
  EXPECT_EQ(merged.probe().min_steps_before_onset(), 0);
  EXPECT_EQ(merged.probe().replay_steps_past_onset(), 0);
  EXPECT_EQ(merged.fix().extra_warmup_steps(), 0);
  EXPECT_DOUBLE_EQ(merged.loss_spike().relative_floor(), 0);
  EXPECT_EQ(merged.launch().max_restarts(), 0);
  // Fields the file leaves out take the defaults.
  EXPECT_EQ(merged.probe().skip_after(), 5);
  EXPECT_EQ(merged.probe().max_steps_before_onset(), 500);
  EXPECT_EQ(merged.fix().verify_steps(), 200);
  EXPECT_DOUBLE_EQ(merged.grad_norm_spike().relative_floor(), 7.0);
  EXPECT_EQ(merged.launch().heartbeat_timeout_ms(), 30000);
  EXPECT_TRUE(ValidatePolicy(merged).ok()) << ValidatePolicy(merged);
  // The spike rule follows the explicit 0 too.
  EXPECT_DOUBLE_EQ(SpikeOptions(merged.loss_spike()).relative_floor, 0);
  detect::SpikeDetector::Options base;
  base.relative_floor = 0.3;
  EXPECT_DOUBLE_EQ(SpikeOptions(v1::SpikeDetectorPolicy(), base).relative_floor, 0.3);
}

TEST(PolicyMergeTest, ExplicitFalseTurnsAFlagOff) {
  auto daemon = ParsePolicyText("probe { bisect: true transplant: true }", "daemon");
  auto run = ParsePolicyText("probe { bisect: false }", "run");
  ASSERT_TRUE(daemon.ok() && run.ok());
  const v1::Policy merged = MergePolicy(MergePolicy(DefaultPolicy(), *daemon), *run);
  EXPECT_FALSE(merged.probe().bisect());
  EXPECT_TRUE(merged.probe().transplant());
}

// Layering as the daemon does it: built-in defaults, the daemon-wide policy,
// then the run's own.
TEST(PolicyMergeTest, DaemonValueSurvivesARunPolicyThatLeavesItUnset) {
  auto daemon = ParsePolicyText(
      "probe { skip_before: 0 min_steps_before_onset: 0 skip_horizon: 300 }", "daemon");
  auto run = ParsePolicyText("mode: MODE_AUTO\nprobe { skip_after: 1 }", "run");
  ASSERT_TRUE(daemon.ok() && run.ok());
  const v1::Policy merged = MergePolicy(MergePolicy(DefaultPolicy(), *daemon), *run);
  EXPECT_EQ(merged.mode(), v1::MODE_AUTO);
  EXPECT_EQ(merged.probe().skip_before(), 0);
  EXPECT_EQ(merged.probe().min_steps_before_onset(), 0);
  EXPECT_EQ(merged.probe().skip_horizon(), 300);
  EXPECT_EQ(merged.probe().skip_after(), 1);
  // A run policy that does set it wins, 0 or not.
  auto run2 = ParsePolicyText("probe { skip_before: 7 }", "run");
  ASSERT_TRUE(run2.ok());
  EXPECT_EQ(MergePolicy(MergePolicy(DefaultPolicy(), *daemon), *run2).probe().skip_before(), 7);
}

// An explicit value that cannot run is kept by the merge and rejected by
// validation, naming the field (it used to be silently replaced).
TEST(PolicyMergeTest, ExplicitUnrunnableValuesAreRejectedNamingTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {"loss_spike { window: 0 }", "loss_spike.window"},
      {"probe { skip_before: -2 }", "probe.skip_before"},
      {"probe { min_steps_before_onset: -1 }", "probe.min_steps_before_onset"},
      {"fix { extra_warmup_steps: -5 }", "fix.extra_warmup_steps"},
      {"fix { lr_factor: 0 }", "fix.lr_factor"},
      {"precursor { trend_window: 0 }", "precursor.trend_window"},
      {"budget { max_probes: 0 }", "budget.max_probes"},
      {"launch { max_restarts: -1 }", "launch.max_restarts"},
  };
  for (const auto& [text, field] : cases) {
    auto file = ParsePolicyText(text, "inline");
    ASSERT_TRUE(file.ok()) << text;
    const absl::Status s = ValidatePolicy(MergePolicy(DefaultPolicy(), *file));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field)) << text;
  }
}

TEST(PolicyLoadFileTest, ReadsTextFormat) {
  const std::string path = TempPath("ok.txtpb");
  {
    std::ofstream out(path);
    out << "# demo policy\nmode: MODE_AUTO\nprobe { skip_horizon: 300 bisect: true }\n"
           "budget { max_probes: 12 }\n";
  }
  auto p = LoadPolicyFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->mode(), v1::MODE_AUTO);
  EXPECT_EQ(p->probe().skip_horizon(), 300);
  EXPECT_EQ(p->budget().max_probes(), 12);
  const v1::Policy merged = MergePolicy(DefaultPolicy(), *p);
  EXPECT_TRUE(ValidatePolicy(merged).ok());
  EXPECT_EQ(merged.probe().skip_before(), 5);
  std::remove(path.c_str());
}

TEST(PolicyLoadFileTest, ParseErrorNamesTheLine) {
  const std::string path = TempPath("bad.txtpb");
  {
    std::ofstream out(path);
    out << "mode: MODE_AUTO\nprobe {\n  skip_horizon: \"lots\"\n}\n";
  }
  auto p = LoadPolicyFile(path);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("line 3"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(path));
  std::remove(path.c_str());

  auto unknown = ParsePolicyText("probe { skip_window: 3 }", "inline");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("skip_window"));
}

TEST(PolicyPrecursorActionTest, DefaultIsAWarningAndAPolicyFileChoosesAnIncidentOrAnUnknownNameIsRefused) {
  EXPECT_EQ(DefaultPolicy().precursor().on_critical(), v1::PRECURSOR_WARN);
  auto incident = ParsePolicyText("precursor { on_critical: PRECURSOR_INCIDENT }", "inline");
  ASSERT_TRUE(incident.ok()) << incident.status();
  const v1::Policy merged = MergePolicy(DefaultPolicy(), *incident);
  EXPECT_TRUE(ValidatePolicy(merged).ok());
  EXPECT_EQ(merged.precursor().on_critical(), v1::PRECURSOR_INCIDENT);
  auto bogus = ParsePolicyText("precursor { on_critical: PAGE_SOMEONE }", "inline");
  ASSERT_FALSE(bogus.ok());
  EXPECT_THAT(std::string(bogus.status().message()), HasSubstr("on_critical"));
}

TEST(PolicyLoadFileTest, MissingFileIsNotFound) {
  auto p = LoadPolicyFile(TempPath("does-not-exist.txtpb"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
}

struct BadCase {
  std::string name;
  std::string field;
  void (*mutate)(v1::Policy*);
};

TEST(PolicyValidateTest, RejectsUnrunnablePoliciesNamingTheField) {
  const BadCase cases[] = {
      {"negative window", "loss_spike.window", [](v1::Policy* p) { p->mutable_loss_spike()->set_window(-3); }},
      {"zero z", "grad_norm_spike.z_threshold",
       [](v1::Policy* p) { p->mutable_grad_norm_spike()->set_z_threshold(0); }},
      {"min_samples over window", "loss_spike.min_samples",
       [](v1::Policy* p) { p->mutable_loss_spike()->set_min_samples(500); }},
      {"min > max before onset", "probe.min_steps_before_onset",
       [](v1::Policy* p) { p->mutable_probe()->set_min_steps_before_onset(900); }},
      {"negative skip", "probe.skip_before", [](v1::Policy* p) { p->mutable_probe()->set_skip_before(-1); }},
      {"no probes", "budget.max_probes", [](v1::Policy* p) { p->mutable_budget()->set_max_probes(0); }},
      {"lr factor above 1", "fix.lr_factor", [](v1::Policy* p) { p->mutable_fix()->set_lr_factor(1.5); }},
      {"beta2 of 1", "fix.beta2", [](v1::Policy* p) { p->mutable_fix()->set_beta2(1.0); }},
      {"negative tail factor", "loss_spike.tail_factor",
       [](v1::Policy* p) { p->mutable_loss_spike()->set_tail_factor(-1); }},
      {"blip longer than recovery", "loss_spike.blip_steps",
       [](v1::Policy* p) { p->mutable_loss_spike()->set_blip_steps(51); }},
      {"negative escalation", "loss_spike.blip_escalate_count",
       [](v1::Policy* p) { p->mutable_loss_spike()->set_blip_escalate_count(-1); }},
      {"zero blip window", "loss_spike.blip_window",
       [](v1::Policy* p) { p->mutable_loss_spike()->set_blip_window(0); }},
      {"NaN shift tolerance", "loss_spike.shift_tolerance",
       [](v1::Policy* p) { p->mutable_loss_spike()->set_shift_tolerance(NAN); }},
      {"critical below warn", "precursor.attn_logit_critical",
       [](v1::Policy* p) { p->mutable_precursor()->set_attn_logit_critical(10); }},
      {"unknown precursor action", "precursor.on_critical",
       [](v1::Policy* p) {
         p->mutable_precursor()->set_on_critical(static_cast<v1::PrecursorAction>(7));
       }},
      {"unspecified precursor action", "precursor.on_critical",
       [](v1::Policy* p) {
         p->mutable_precursor()->set_on_critical(v1::PRECURSOR_ACTION_UNSPECIFIED);
       }},
  };
  for (const BadCase& c : cases) {
    v1::Policy p = DefaultPolicy();
    c.mutate(&p);
    const absl::Status s = ValidatePolicy(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.field)) << c.name;
  }
}

}  // namespace
}  // namespace spikeguard::incident
