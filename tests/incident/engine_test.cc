// Drives every branch of the incident engine with scripted probe outcomes:
// the fake view holds the original generation and the checkpoints, the fake
// controller records commands and hands out generations, and the World plays
// the workers of each new generation.
#include "daemon/incident/engine.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/incident/plan_proto.h"
#include "daemon/incident/policy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/incident/fakes.h"

namespace spikeguard::incident {
namespace {

namespace v1 = spikeguard::v1;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::FakeController;
using testing::FakeStore;
using testing::FakeView;
using testing::Scenario;
using testing::World;

constexpr char kRun[] = "gpt";
constexpr int64_t kOnset = 1000;

class IncidentEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    view.policy = DefaultPolicy();
    view.policy.set_mode(v1::MODE_AUTO);
    // Most tests follow replay → skip → verdict; bisection (on by default)
    // has tests of its own below.
    view.policy.mutable_probe()->set_bisect(false);
    // 900 is the newest complete checkpoint 100–500 steps before step 1000;
    // 950 is too close and 980 incomplete.
    for (int64_t step : {300, 500, 700, 900, 950}) {
      view.checkpoints.push_back({1, step, absl::StrCat("file:///ckpt/", step), "sum", true});
    }
    view.checkpoints.push_back({1, 980, "file:///ckpt/980", "sum", false});
  }

  void Start(Scenario scenario) {
    world = std::make_unique<World>(&ctl, &view, scenario);
    world->SeedOriginal(kOnset + 20);
    engine = NewEngine();
  }

  std::unique_ptr<IncidentEngine> NewEngine() {
    IncidentEngine::Options options;
    options.probe_timeout = absl::Minutes(10);
    auto e = std::make_unique<IncidentEngine>(&clock, &ctl, &view, &store, options);
    e->SetListener([this](const v1::Incident& inc, const v1::IncidentEvent& ev) {
      heard.push_back(ev.kind());
    });
    return e;
  }

  // A fragility spike comes with its precursor: the model moved.
  static Detection FragileSpike(int64_t onset = kOnset) {
    Detection d = Spike(onset);
    d.precursor_onset_step = onset - 300;
    d.precursor = "max_attn_logit";
    return d;
  }

  static Detection Spike(int64_t onset = kOnset, int64_t generation = 1) {
    Detection d;
    d.kind = Detection::Kind::kLossSpike;
    d.generation = generation;
    d.onset_step = onset;
    d.peak_step = onset;
    d.peak_value = 6.0;
    d.baseline = 2.0;
    return d;
  }

  void Detect(const Detection& d = Spike()) {
    absl::Status s = engine->OnDetection(kRun, d);
    ASSERT_TRUE(s.ok()) << s;
  }

  // Detection, then the workers run every generation the engine asks for.
  void RunProtocol(const Detection& d = Spike(), int64_t max_step = 1600) {
    Detect(d);
    world->Pump(engine.get(), kRun, max_step);
  }

  v1::Incident Only() {
    EXPECT_EQ(store.incidents.size(), 1u);
    return store.incidents.begin()->second;
  }

  static std::vector<std::string> Kinds(const v1::Incident& inc) {
    std::vector<std::string> out;
    for (const auto& p : inc.probes()) out.push_back(p.kind() + ":" + p.outcome());
    return out;
  }

  static bool HasEvent(const v1::Incident& inc, const std::string& kind) {
    for (const auto& e : inc.events()) {
      if (e.kind() == kind) return true;
    }
    return false;
  }

  // Every rewind request id was executed exactly once.
  void ExpectEachRequestOnce() {
    std::set<std::string> ids;
    for (const auto& spec : ctl.executed) {
      EXPECT_TRUE(ids.insert(spec.request_id).second) << "executed twice: " << spec.request_id;
    }
  }

  FakeClock clock;
  FakeController ctl;
  FakeView view;
  FakeStore store;
  std::unique_ptr<World> world;
  std::unique_ptr<IncidentEngine> engine;
  std::vector<std::string> heard;
};

// --- Verdicts ---------------------------------------------------------------------

TEST_F(IncidentEngineTest, TransientWhenTheReplayDoesNotSpike) {
  Start({.transient = true});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::TRANSIENT);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_DOUBLE_EQ(inc.confidence(), 0.9);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:clean"));
  // The replay: same checkpoint window choice, same data, horizon onset + 10.
  ASSERT_EQ(ctl.executed.size(), 1u);
  EXPECT_EQ(ctl.executed[0].checkpoint.step, 900);
  EXPECT_EQ(ctl.executed[0].stop_after_step, 1010);
  EXPECT_EQ(ctl.executed[0].plan.ranges_size(), 0);
  // Continued from the replay and verified before closing.
  EXPECT_EQ(ctl.UniqueContinues().size(), 1u);
  EXPECT_TRUE(ctl.continued.count(2));
  EXPECT_TRUE(HasEvent(inc, "verified"));
  EXPECT_TRUE(ctl.pause_calls.empty());
  // The outlier rank of the original spike step is named.
  EXPECT_THAT(inc.note(), HasSubstr("outlier rank(s) 5"));
  EXPECT_THAT(inc.recommendations(), Contains(HasSubstr("rank(s) 5")));
  // Cost: 111 re-executed steps (900 through 1010: the checkpoint's own
  // step runs first) × 1 s × 8 GPUs.
  EXPECT_EQ(inc.cost().probes(), 1);
  EXPECT_EQ(inc.cost().steps_reexecuted(), 111);
  EXPECT_NEAR(inc.cost().gpu_hours(), 111 * 8 / 3600.0, 1e-9);
  EXPECT_EQ(heard.size(), store.events[inc.id()].size());
}

TEST_F(IncidentEngineTest, DataWhenTheSkipIsCleanQuarantinesTheWindow) {
  Start({.poison = {1000}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_DOUBLE_EQ(inc.confidence(), 0.85);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:clean"));
  ASSERT_EQ(ctl.executed.size(), 2u);
  // The skip: a hole [995, 1006) around the onset's data position.
  const v1::DataPlan& plan = ctl.executed[1].plan;
  ASSERT_EQ(plan.ranges_size(), 2);
  EXPECT_EQ(plan.ranges(0).begin(), 0);
  EXPECT_EQ(plan.ranges(0).end(), 995);
  EXPECT_EQ(plan.ranges(1).begin(), 1006);
  EXPECT_EQ(plan.ranges(1).end(), -1);
  EXPECT_EQ(ctl.executed[1].stop_after_step, 1200);
  // The skip generation goes on with its hole.
  EXPECT_TRUE(ctl.continued.count(3));
  EXPECT_TRUE(HasEvent(inc, "verified"));
  // Documents of steps 995..1005: 11 steps × 2 documents, all quarantined.
  EXPECT_EQ(inc.documents_size(), 22);
  ASSERT_EQ(store.quarantine.size(), 22u);
  for (const auto& q : store.quarantine) {
    EXPECT_EQ(q.incident_id(), inc.id());
    EXPECT_EQ(q.run(), kRun);
    EXPECT_THAT(q.reason(), HasSubstr("incident"));
  }
  EXPECT_EQ(store.quarantine[10].document_id(), 10000);  // position 1000's first document
  EXPECT_TRUE(ctl.pause_calls.empty());
  ExpectEachRequestOnce();
}

TEST_F(IncidentEngineTest, GradNormTriggerIsJudgedOnTheGradNorm) {
  Start({.poison = {1000}, .grad_spike = true});
  Detection d = Spike();
  d.kind = Detection::Kind::kGradNormSpike;
  RunProtocol(d);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.trigger(), "grad_norm_spike");
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:clean"));
}

TEST_F(IncidentEngineTest, FragilityFixedByTheFirstRung) {
  Start({.fragile_until_rung = 1});
  Detection d = Spike();
  d.precursor_onset_step = 950;
  d.precursor = "max_attn_logit";
  RunProtocol(d);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::FRAGILITY);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:spiked", "fix:clean"));
  // The precursor dates the onset earlier: window [450, 850] → step 700.
  EXPECT_EQ(ctl.executed[0].checkpoint.step, 700);
  const RewindSpec& rung = ctl.executed[2];
  EXPECT_DOUBLE_EQ(rung.hparams.lr_scale(), 0.7);
  EXPECT_FALSE(rung.hparams.has_clip_norm());
  EXPECT_EQ(rung.plan.ranges_size(), 0);  // the original data
  EXPECT_EQ(rung.stop_after_step, 1200);  // onset + verify_steps
  EXPECT_EQ(ctl.UniqueContinues().size(), 1u);
  EXPECT_TRUE(ctl.continued.count(4));
  EXPECT_THAT(inc.recommendations(), Contains("qk-norm (for the next run)"));
  EXPECT_THAT(inc.recommendations(), Contains("logit soft-capping (for the next run)"));
  EXPECT_THAT(inc.recommendations(), Contains("scaled residual init (for the next run)"));
  EXPECT_TRUE(ctl.pause_calls.empty());
}

TEST_F(IncidentEngineTest, FragilityClimbsTheLadderToRungThree) {
  Start({.fragile_until_rung = 3});
  Detection d = Spike();
  d.precursor_onset_step = 950;
  d.precursor = "lse_max";
  RunProtocol(d);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::FRAGILITY);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:spiked", "fix:spiked", "fix:spiked",
                                      "fix:clean"));
  const v1::HParams& r2 = ctl.executed[3].hparams;
  EXPECT_DOUBLE_EQ(r2.lr_scale(), 0.7);
  EXPECT_EQ(r2.extra_warmup_steps(), 200);
  EXPECT_DOUBLE_EQ(r2.clip_norm(), 0.5);
  EXPECT_FALSE(r2.has_beta2());
  const v1::HParams& r3 = ctl.executed[4].hparams;
  EXPECT_DOUBLE_EQ(r3.beta2(), 0.95);
  EXPECT_DOUBLE_EQ(r3.eps(), 1e-8);
  EXPECT_DOUBLE_EQ(r3.clip_norm(), 0.5);
  EXPECT_THAT(inc.recommendations(), Contains(HasSubstr("z-loss 1e-4")));
  EXPECT_TRUE(ctl.continued.count(6));
}

TEST_F(IncidentEngineTest, AllRungsFailingIsInconclusiveAndPauses) {
  Start({.fragile_until_rung = 4});
  RunProtocol(FragileSpike());
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::INCONCLUSIVE);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:spiked", "fix:spiked", "fix:spiked",
                                      "fix:spiked"));
  EXPECT_THAT(inc.note(), HasSubstr("all three fix rungs"));
  EXPECT_THAT(inc.note(), HasSubstr("awaiting an operator"));
  EXPECT_EQ(ctl.pause_calls.size(), 1u);
  EXPECT_TRUE(ctl.continue_calls.empty());
}

TEST_F(IncidentEngineTest, NumericsNamesTheFirstNonFiniteLayerAndPauses) {
  Start({.nonfinite = true, .nonfinite_layer = 3});
  Detection d = Spike();
  d.kind = Detection::Kind::kNonFinite;
  RunProtocol(d);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::NUMERICS);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_EQ(inc.trigger(), "nonfinite");
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:nonfinite", "skip:nonfinite"));
  EXPECT_EQ(inc.localization().layer(), 3);
  EXPECT_THAT(inc.note(), HasSubstr("first non-finite layer 3"));
  EXPECT_THAT(inc.recommendations(), Contains(HasSubstr("fp32 softmax")));
  EXPECT_THAT(inc.recommendations(), Contains(HasSubstr("bf16")));
  EXPECT_EQ(ctl.pause_calls.size(), 1u);
  EXPECT_TRUE(ctl.continue_calls.empty());
}

// After a transient fault, a spike while the continuation is verified is
// another event (the replay showed this one does not recur): the verdict
// stands, the run is not paused, and the detectors open the new spike.
TEST_F(IncidentEngineTest, ASpikeWhileVerifyingATransientIsAnotherEvent) {
  Start({.transient = true, .late_spike_step = 1100});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::TRANSIENT);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_TRUE(HasEvent(inc, "verification_failed"));
  EXPECT_THAT(inc.note(), HasSubstr("the TRANSIENT verdict stands"));
  EXPECT_THAT(inc.note(), HasSubstr("step 1100"));
  EXPECT_TRUE(ctl.pause_calls.empty());
}

// A fix whose verification spikes again is not trusted: INCONCLUSIVE, and
// the run waits for an operator.
TEST_F(IncidentEngineTest, SpikeWhileVerifyingADataFixIsInconclusive) {
  Start({.poison = {1000}, .late_spike_step = 1250});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::INCONCLUSIVE) << inc.note();
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_TRUE(HasEvent(inc, "verification_failed"));
  EXPECT_THAT(inc.note(), HasSubstr("spike returned while verifying the fix"));
  EXPECT_THAT(inc.note(), HasSubstr("step 1250"));
  EXPECT_EQ(ctl.pause_calls.size(), 1u);
}

TEST_F(IncidentEngineTest, NonFiniteProbesMakeNumericsEvenForALossTrigger) {
  Start({.nonfinite = true, .nonfinite_layer = 7});
  RunProtocol();
  EXPECT_EQ(Only().verdict(), v1::NUMERICS);
  EXPECT_EQ(Only().localization().layer(), 7);
}

// --- Escalation -------------------------------------------------------------------------

class IncidentEscalationTest : public IncidentEngineTest {
 protected:
  void AddPastData(int64_t onset) {
    v1::Incident past;
    past.set_run(kRun);
    past.set_state(v1::CLOSED);
    past.set_verdict(v1::DATA);
    past.set_onset_step(onset);
    ASSERT_TRUE(store.CreateIncident(kRun, past).ok());
  }

  // The run's third DATA incident within 5000 steps (two before it), run
  // through the protocol; returns it.
  v1::Incident ThirdDataIncident(Scenario scenario) {
    AddPastData(3000);
    AddPastData(5500);
    Start(scenario);
    RunProtocol();
    return store.incidents.rbegin()->second;
  }
};

TEST_F(IncidentEscalationTest, ThirdDataIncidentWithinTheWindowIsFragility) {
  // The poison spikes only at full lr: the lr rung fixes it.
  const v1::Incident inc =
      ThirdDataIncident({.poison = {1000}, .poison_needs_full_lr = true});
  EXPECT_EQ(inc.verdict(), v1::FRAGILITY);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(inc.note(), HasSubstr("escalated: 3 DATA incidents within 5000 steps"));
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:clean", "fix:clean"));
  EXPECT_DOUBLE_EQ(ctl.executed[2].hparams.lr_scale(), 0.7);
  EXPECT_TRUE(store.quarantine.empty());
}

// The incident's own evidence decides: a clean skip whose bisect names the
// culprit batch stays DATA however many DATA incidents came before.
TEST_F(IncidentEscalationTest, ACleanSkipWithANamedCulpritBatchIsNotEscalated) {
  view.policy.mutable_probe()->set_bisect(true);
  const v1::Incident inc = ThirdDataIncident({.poison = {1000}});
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(inc.culprit_positions(), ElementsAre(1000));
  EXPECT_THAT(inc.note(), HasSubstr("not escalated to FRAGILITY although the run has 3 DATA "
                                    "incidents within 5000 steps"));
  for (const RewindSpec& spec : ctl.executed) EXPECT_FALSE(spec.hparams.has_lr_scale());
  EXPECT_FALSE(store.quarantine.empty());
  EXPECT_TRUE(ctl.pause_calls.empty());
}

// Escalated without a named culprit (bisect off), every fragility rung
// spikes again, but skipping the window was clean: the DATA fix stands and
// the run goes on instead of waiting for an operator.
TEST_F(IncidentEscalationTest, FailedEscalatedFixesLeaveTheCleanSkipsDataFixStanding) {
  const v1::Incident inc = ThirdDataIncident({.poison = {1000}});
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:clean", "fix:spiked", "fix:spiked",
                                      "fix:spiked", "fix:clean"));
  EXPECT_THAT(inc.note(), HasSubstr("escalated: 3 DATA incidents within 5000 steps"));
  EXPECT_THAT(inc.note(), HasSubstr("the escalated FRAGILITY fixes failed (all three fix rungs "
                                    "spiked again) while skipping the window removed the spike: "
                                    "the DATA fix stands"));
  // The DATA fix: the window's hole, no rung's hparams; documents quarantined.
  const RewindSpec& fix = ctl.executed.back();
  EXPECT_FALSE(fix.hparams.has_lr_scale());
  EXPECT_FALSE(fix.hparams.has_beta2());
  ASSERT_GT(fix.plan.ranges_size(), 1);
  EXPECT_FALSE(store.quarantine.empty());
  EXPECT_TRUE(ctl.pause_calls.empty());
  EXPECT_FALSE(ctl.paused);
  EXPECT_TRUE(ctl.continued.count(ctl.current_generation));
}

TEST_F(IncidentEscalationTest, DataIncidentsOutsideTheWindowDoNotEscalate) {
  AddPastData(3000);
  AddPastData(7000);  // 6000 steps away
  Start({.poison = {1000}});
  RunProtocol();
  EXPECT_EQ(store.incidents.rbegin()->second.verdict(), v1::DATA);
}

// --- Fidelity ------------------------------------------------------------------------------

TEST_F(IncidentEngineTest, NonDeterminismIsReportedAndHalvesConfidence) {
  Start({.transient = true, .nondeterministic = true});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::TRANSIENT);
  EXPECT_DOUBLE_EQ(inc.confidence(), 0.45);
  ASSERT_TRUE(HasEvent(inc, "nondeterminism"));
  for (const auto& e : inc.events()) {
    if (e.kind() == "nondeterminism") {
      EXPECT_THAT(e.detail(), HasSubstr("step 900"));
    }
  }
  EXPECT_THAT(inc.note(), HasSubstr("not deterministic"));
  // Reported once, not per step.
  int count = 0;
  for (const auto& e : inc.events()) count += e.kind() == "nondeterminism";
  EXPECT_EQ(count, 1);
}

TEST_F(IncidentEngineTest, BitExactReplayReportsNoNonDeterminism) {
  Start({.transient = true});
  RunProtocol();
  EXPECT_FALSE(HasEvent(Only(), "nondeterminism"));
}

// --- Checkpoint choice --------------------------------------------------------------------------

TEST_F(IncidentEngineTest, CheckpointFallsBackToTheNearestOlderOneWithANote) {
  view.checkpoints = {{1, 200, "file:///ckpt/200", "s", true},
                      {1, 950, "file:///ckpt/950", "s", true},
                      {1, 1100, "file:///ckpt/1100", "s", true}};
  Start({.transient = true});
  RunProtocol();
  const v1::Incident inc = Only();
  ASSERT_FALSE(ctl.executed.empty());
  EXPECT_EQ(ctl.executed[0].checkpoint.step, 950);
  EXPECT_EQ(ctl.executed[0].checkpoint.uri, "file:///ckpt/950");
  EXPECT_THAT(inc.note(), HasSubstr("nearest older one, step 950"));
  EXPECT_EQ(inc.verdict(), v1::TRANSIENT);
}

TEST_F(IncidentEngineTest, NoCheckpointIsInconclusiveAndLeavesTheRunTraining) {
  view.checkpoints = {{1, 980, "file:///ckpt/980", "s", false},
                      {1, 1200, "file:///ckpt/1200", "s", true}};
  Start({.transient = true});
  Detect();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::INCONCLUSIVE);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(inc.note(), HasSubstr("no complete checkpoint before the onset"));
  EXPECT_EQ(ctl.rewind_calls, 0);
  EXPECT_TRUE(ctl.pause_calls.empty());
}

// After a fix changed the trajectory, a later incident rewinds only to a
// checkpoint on the current generation's line: not one the original
// generation saved after the fix branched off it, nor one of an earlier
// incident's probes (another data plan, other hparams).
TEST_F(IncidentEngineTest, LaterIncidentsRewindOnlyOnTheCurrentGenerationsLine) {
  view.tree_of = &ctl;
  Start({.fragile_until_rung = 2});
  RunProtocol(Spike(), 1250);
  const v1::Incident first = Only();
  ASSERT_EQ(first.verdict(), v1::FRAGILITY);
  ASSERT_EQ(first.state(), v1::CLOSED);
  const int64_t line = ctl.current_generation;  // rung 2, continued from gen 1 @ 900
  ASSERT_EQ(ctl.spec_of[line].checkpoint.step, 900);
  // The skip probe (generation 3) saved step 1100; the line saved nothing
  // yet in the window of an onset at 1300.
  view.checkpoints.push_back({3, 1100, "file:///ckpt/g3-1100", "sum", true});
  const size_t rewinds = ctl.executed.size();
  Detect(Spike(1300, line));
  ASSERT_EQ(store.incidents.size(), 2u);
  ASSERT_GT(ctl.executed.size(), rewinds);
  // Not gen 3 @ 1100, not gen 1 @ 950 (after the branch at 900).
  EXPECT_EQ(ctl.executed[rewinds].checkpoint.generation, 1);
  EXPECT_EQ(ctl.executed[rewinds].checkpoint.step, 900);
  // The new generation's parent is the generation whose checkpoint it
  // started from.
  EXPECT_EQ(ctl.tree.back().parent(), 1);
  EXPECT_EQ(ctl.tree.back().from_checkpoint_step(), 900);
}

// The replay saves a checkpoint where the skip window starts; the probes
// that change only the window's data start there, with the same verdict and
// culprit, and re-execute fewer steps.
TEST_F(IncidentEngineTest, DataOnlyProbesStartAtTheReplaysWindowCheckpoint) {
  view.policy.mutable_probe()->set_bisect(true);
  view.tree_of = &ctl;
  Start({.poison = {1000}});
  world->save_asked_checkpoints = true;
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(inc.culprit_positions(), ElementsAre(1000));
  EXPECT_FALSE(HasEvent(inc, "nondeterminism"));
  ASSERT_TRUE(HasEvent(inc, "window_checkpoint"));
  ASSERT_GE(ctl.executed.size(), 3u);
  // The replay from 900 asks for step 995, the first of the window
  // [995, 1006); every later probe starts there, from the replay's line.
  EXPECT_EQ(ctl.executed[0].checkpoint.step, 900);
  EXPECT_EQ(ctl.executed[0].checkpoint_at_step, 995);
  for (size_t k = 1; k < ctl.executed.size(); ++k) {
    EXPECT_EQ(ctl.executed[k].checkpoint.step, 995) << ctl.executed[k].reason;
    EXPECT_EQ(ctl.executed[k].checkpoint.generation, 2) << ctl.executed[k].reason;
  }
  EXPECT_TRUE(store.pins.count(995));
  EXPECT_FALSE(store.pins[995]);  // released at close
  const int64_t with = inc.cost().steps_reexecuted();

  // The same incident with workers that ignore the request.
  engine.reset();
  ctl = FakeController();
  store = FakeStore();
  view.steps.clear();
  view.checkpoints.resize(6);  // SetUp's
  Start({.poison = {1000}});
  RunProtocol();
  const v1::Incident without = Only();
  EXPECT_EQ(without.verdict(), v1::DATA);
  EXPECT_THAT(without.culprit_positions(), ElementsAre(1000));
  EXPECT_THAT(without.note(), HasSubstr("the replay saved no checkpoint at step 995"));
  EXPECT_EQ(ctl.executed.back().checkpoint.step, 900);
  const int64_t before = without.cost().steps_reexecuted();
  // Every probe after the replay saved 95 of its steps (900 -> 995); the
  // ratio is diagnosis_bench's figure (0.46x on the demo's DATA incident).
  EXPECT_EQ(before - with, 95 * static_cast<int64_t>(ctl.executed.size() - 1));
  std::printf("steps re-executed: %lld with the window checkpoint, %lld without\n",
              static_cast<long long>(with), static_cast<long long>(before));
}

// --- Budgets and timeouts ------------------------------------------------------------------------

TEST_F(IncidentEngineTest, ProbeBudgetExhaustedIsInconclusive) {
  view.policy.mutable_budget()->set_max_probes(1);
  Start({.poison = {1000}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::INCONCLUSIVE);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked"));
  EXPECT_THAT(inc.note(), HasSubstr("budget exhausted"));
  EXPECT_EQ(ctl.pause_calls.size(), 1u);
}

TEST_F(IncidentEngineTest, ReexecutedStepsBudgetStopsAProbe) {
  view.policy.mutable_budget()->set_max_reexecuted_steps(50);
  Start({.poison = {1000}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::INCONCLUSIVE);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:failed"));
  EXPECT_LE(inc.cost().steps_reexecuted(), 51);
  EXPECT_THAT(inc.note(), HasSubstr("budget"));
  EXPECT_EQ(ctl.pause_calls.size(), 1u);
}

TEST_F(IncidentEngineTest, SilentProbeTimesOut) {
  Start({.poison = {1000}});
  Detect();
  ASSERT_TRUE(engine->ProbeRunning(kRun));
  clock.Advance(absl::Minutes(5));
  ASSERT_TRUE(engine->Tick().ok());
  EXPECT_EQ(Only().state(), v1::REPLAYING);
  world->Feed(engine.get(), kRun, 2, 901, 905);  // progress resets the clock
  clock.Advance(absl::Minutes(9));
  ASSERT_TRUE(engine->Tick().ok());
  EXPECT_EQ(Only().state(), v1::REPLAYING);
  clock.Advance(absl::Minutes(2));
  ASSERT_TRUE(engine->Tick().ok());
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::INCONCLUSIVE);
  EXPECT_THAT(inc.note(), HasSubstr("timeout"));
  EXPECT_EQ(ctl.pause_calls.size(), 1u);
  EXPECT_FALSE(engine->ProbeRunning(kRun));
}

TEST_F(IncidentEngineTest, OperatorRewindIsRefusedWhileAProbeRuns) {
  Start({.poison = {1000}});
  Detect();
  ASSERT_TRUE(engine->ProbeRunning(kRun));
  RewindSpec spec;
  spec.request_id = "manual/rewind-1";
  spec.checkpoint = view.checkpoints.front();
  const int rewinds = ctl.rewind_calls;
  absl::StatusOr<int64_t> refused = engine->OperatorRewind(kRun, spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("is running an incident probe"));
  EXPECT_EQ(ctl.rewind_calls, rewinds);
  // Another run has no probe: its rewind goes to the controller.
  absl::StatusOr<int64_t> other = engine->OperatorRewind("other", spec);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(ctl.rewind_calls, rewinds + 1);
}

TEST_F(IncidentEngineTest, FailedRewindIsRetriedOnTick) {
  Start({.poison = {1000}});
  ctl.fail_next_rewind = absl::UnavailableError("no workers connected");
  EXPECT_EQ(engine->OnDetection(kRun, Spike()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Only().state(), v1::REPLAYING);
  EXPECT_TRUE(ctl.executed.empty());
  ASSERT_TRUE(engine->Tick().ok());
  ASSERT_EQ(ctl.executed.size(), 1u);
  world->Pump(engine.get(), kRun, 1600);
  EXPECT_EQ(Only().verdict(), v1::DATA);
}

// --- Modes ---------------------------------------------------------------------------------------

TEST_F(IncidentEngineTest, ObserveModeOpensAndClosesWithoutProbes) {
  view.policy.set_mode(v1::MODE_OBSERVE);
  Start({.poison = {1000}});
  Detection d = Spike();
  d.localized_signal = "max_attn_logit";
  d.localized_layer = 2;
  Detect(d);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_EQ(inc.verdict(), v1::VERDICT_UNSPECIFIED);
  EXPECT_THAT(inc.note(), HasSubstr("observe mode: no probes"));
  EXPECT_EQ(inc.onset_step(), kOnset);
  EXPECT_EQ(inc.localization().layer(), 2);
  EXPECT_EQ(ctl.rewind_calls, 0);
  EXPECT_TRUE(ctl.continue_calls.empty());
  EXPECT_TRUE(ctl.pause_calls.empty());
}

TEST_F(IncidentEngineTest, TheDecisionToOpenIsToldOnceBeforeTheIncidentIsWritten) {
  // The daemon's detection latency ends at this decision; "opened" follows
  // once the incident is durable.
  view.policy.set_mode(v1::MODE_PROPOSE);
  Start({.poison = {1000}});
  std::vector<std::string> decided;
  size_t stored_when_decided = 99;
  engine->SetDecisionObserver([&](const std::string& run) {
    decided.push_back(run);
    stored_when_decided = store.incidents.size();
    EXPECT_TRUE(heard.empty()) << "decided after \"" << heard.front() << "\" was told";
  });
  Detect();
  EXPECT_THAT(decided, ElementsAre(kRun));
  EXPECT_EQ(stored_when_decided, 0u);
  ASSERT_FALSE(heard.empty());
  EXPECT_EQ(heard.front(), "opened");
  // A detection while the incident is active opens nothing: no decision.
  Detect(Spike(kOnset + 5));
  EXPECT_EQ(decided.size(), 1u);
  EXPECT_EQ(store.incidents.size(), 1u);
}

TEST_F(IncidentEngineTest, ADeferredLocalizationFollowsTheOpenedEventAndSurvivesRecovery) {
  // The daemon opens the incident before the per-layer fit (about a
  // millisecond at 32 layers) and localizes it right after: the "opened"
  // event is out without it, a "localized" event follows before any probe.
  view.policy.set_mode(v1::MODE_PROPOSE);
  Start({.poison = {1000}});
  bool localized = false, opened_before_localizing = false;
  engine->SetListener([&](const v1::Incident& inc, const v1::IncidentEvent& ev) {
    heard.push_back(ev.kind());
    if (ev.kind() == "opened") {
      opened_before_localizing = !localized;
      EXPECT_EQ(inc.localization().layer(), -1);
    }
  });
  Detection d = Spike();
  d.localize = [&](Detection* out) {
    localized = true;
    out->localized_signal = "max_attn_logit";
    out->localized_layer = 4;
    out->localization_order = {"max_attn_logit@4", "act_rms@4"};
  };
  Detect(d);
  EXPECT_TRUE(opened_before_localizing);
  ASSERT_GE(heard.size(), 2u);
  EXPECT_EQ(heard[0], "opened");
  EXPECT_EQ(heard[1], "localized");
  v1::Incident inc = Only();
  EXPECT_EQ(inc.localization().signal(), "max_attn_logit");
  EXPECT_EQ(inc.localization().layer(), 4);
  EXPECT_THAT(inc.localization().ordered(), ElementsAre("max_attn_logit@4", "act_rms@4"));
  EXPECT_THAT(inc.events(1).detail(), HasSubstr("max_attn_logit in layer 4 moved first"));

  // Folded back from the event log after a restart.
  engine.reset();
  engine = NewEngine();
  ASSERT_TRUE(engine->Recover().ok());
  ASSERT_EQ(engine->Active().size(), 1u);
  EXPECT_EQ(engine->Active()[0].localization().layer(), 4);
  EXPECT_EQ(engine->Active()[0].localization().signal(), "max_attn_logit");
}

TEST_F(IncidentEngineTest, ADeferredLocalizationThatFindsNothingAddsNoEvent) {
  view.policy.set_mode(v1::MODE_OBSERVE);
  Start({.poison = {1000}});
  bool called = false;
  Detection d = Spike();
  d.localize = [&](Detection*) { called = true; };
  Detect(d);
  EXPECT_TRUE(called);
  const v1::Incident inc = Only();
  EXPECT_FALSE(HasEvent(inc, "localized"));
  EXPECT_EQ(inc.state(), v1::CLOSED);
}

TEST_F(IncidentEngineTest, ProposeModeWaitsForApprovalBeforeEachProbeAndFix) {
  view.policy.set_mode(v1::MODE_PROPOSE);
  Start({.poison = {1000}});
  Detect();
  const int64_t id = Only().id();
  EXPECT_EQ(Only().state(), v1::AWAITING_APPROVAL);
  EXPECT_THAT(Only().note(), HasSubstr("awaiting approval: replay probe: rewind to step 900"));
  EXPECT_EQ(ctl.rewind_calls, 0);
  EXPECT_FALSE(engine->ProbeRunning(kRun));

  ASSERT_TRUE(engine->Approve(id).ok());
  EXPECT_EQ(ctl.executed.size(), 1u);
  EXPECT_EQ(Only().state(), v1::REPLAYING);
  // Nothing waits during the probe.
  EXPECT_EQ(engine->Approve(id).code(), absl::StatusCode::kFailedPrecondition);

  world->Pump(engine.get(), kRun, 1600);
  EXPECT_EQ(Only().state(), v1::AWAITING_APPROVAL);
  EXPECT_THAT(Only().note(), HasSubstr("skip probe"));
  EXPECT_EQ(ctl.executed.size(), 1u);
  ASSERT_TRUE(engine->Approve(id).ok());
  world->Pump(engine.get(), kRun, 1600);

  // The fix (continue the skip generation) waits too.
  EXPECT_EQ(Only().verdict(), v1::DATA);
  EXPECT_EQ(Only().state(), v1::AWAITING_APPROVAL);
  EXPECT_THAT(Only().note(), HasSubstr("fix: continue the skip generation"));
  EXPECT_TRUE(ctl.continue_calls.empty());
  ASSERT_TRUE(engine->Approve(id).ok());
  world->Pump(engine.get(), kRun, 1600);
  EXPECT_EQ(Only().state(), v1::CLOSED);
  EXPECT_EQ(store.quarantine.size(), 22u);
  EXPECT_EQ(engine->Approve(id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->Approve(12345).code(), absl::StatusCode::kNotFound);
}

TEST_F(IncidentEngineTest, AbortContinuesTheRunAsItIs) {
  Start({.poison = {1000}});
  Detect();
  world->Feed(engine.get(), kRun, 2, 901, 950);
  const int64_t id = Only().id();
  ASSERT_TRUE(engine->Abort(id, "operator takes over").ok());
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.state(), v1::ABORTED);
  EXPECT_THAT(inc.note(), HasSubstr("operator takes over"));
  EXPECT_THAT(ctl.continue_calls, ElementsAre(absl::StrCat("incident-", id, "/abort")));
  EXPECT_TRUE(engine->Abort(id, "again").ok());  // idempotent
  EXPECT_EQ(ctl.continue_calls.size(), 1u);
  EXPECT_EQ(engine->Approve(id).code(), absl::StatusCode::kFailedPrecondition);
  // The rest of the probe generation changes nothing.
  world->Pump(engine.get(), kRun, 1600);
  EXPECT_EQ(ctl.executed.size(), 1u);
  EXPECT_EQ(Only().state(), v1::ABORTED);
  EXPECT_TRUE(engine->Active().empty());
}

TEST_F(IncidentEngineTest, AbortOfAClosedIncidentIsRefused) {
  Start({.transient = true});
  RunProtocol();
  EXPECT_EQ(engine->Abort(Only().id(), "late").code(), absl::StatusCode::kFailedPrecondition);
}

// --- Bisect and transplant ----------------------------------------------------------------------

TEST_F(IncidentEngineTest, BisectNamesTheCulpritBatchOffTheOnsetAndQuarantinesOnlyIt) {
  view.policy.mutable_probe()->set_bisect(true);
  // The culprit is not the onset's own batch.
  Start({.poison = {1003}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  int bisects = 0;
  for (const auto& p : inc.probes()) bisects += p.kind() == "bisect";
  // The onset alone (clean), a descent of ⌈log2 10⌉ parts, the implied
  // position confirmed alone, and the window without it (clean).
  EXPECT_GE(bisects, 4);
  EXPECT_LE(bisects, 7);
  EXPECT_THAT(inc.note(), HasSubstr("culprit batch(es) at data position(s) 1003 spike alone"));
  EXPECT_THAT(inc.culprit_positions(), ElementsAre(1003));
  EXPECT_DOUBLE_EQ(inc.confidence(), 0.95);
  // Exactly the culprit's documents; the rest of the window are suspects.
  ASSERT_EQ(inc.documents_size(), 2);
  EXPECT_EQ(inc.documents(0).document_id(), 10030);
  EXPECT_EQ(inc.suspects_size(), 20);
  // The fix rewinds once more with a hole at the culprit only.
  const auto& fix = inc.probes(inc.probes_size() - 1);
  EXPECT_EQ(fix.kind(), "fix");
  EXPECT_EQ(fix.outcome(), "clean");
  ASSERT_EQ(fix.data_plan().ranges_size(), 2);
  EXPECT_EQ(fix.data_plan().ranges(0).end(), 1003);
  EXPECT_EQ(fix.data_plan().ranges(1).begin(), 1004);
  ASSERT_EQ(store.quarantine.size(), 2u);
  for (const auto& q : store.quarantine) EXPECT_THAT(q.reason(), HasSubstr("culprit"));
  ExpectEachRequestOnce();
}

TEST_F(IncidentEngineTest, BisectFindsAnOnsetCulpritInTwoProbes) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_probe()->set_bisect_documents(false);
  Start({.poison = {1000}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:clean", "bisect:spiked",
                                      "bisect:clean", "fix:clean"));
  EXPECT_THAT(inc.culprit_positions(), ElementsAre(1000));
  EXPECT_EQ(store.quarantine.size(), 2u);
  // Batch-level culprits only, and the incident says why.
  EXPECT_THAT(inc.note(), HasSubstr("document bisect is off (probe.bisect_documents: false)"));
}

// --- Sample (document-level) bisect --------------------------------------------------

int CountKind(const v1::Incident& inc, const std::string& kind) {
  int n = 0;
  for (const auto& p : inc.probes()) n += p.kind() == kind;
  return n;
}

TEST_F(IncidentEngineTest, SampleBisectNamesOnlyTheDocumentOfTheSpikingSample) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_probe()->set_bisect_documents(true);
  view.policy.mutable_budget()->set_max_probes(20);
  // Batch 1003 spikes because of its sample 6 alone (document 10031).
  Start({.poison = {1003}, .poison_slots = {{1003, {6}}}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(inc.culprit_positions(), ElementsAre(1003));
  // Group testing over the batch's two documents: 10030 in its own samples
  // 0-2 (clean), then 10031 in 4-7 (spiked).
  EXPECT_EQ(CountKind(inc, "bisect_samples"), 2);
  ASSERT_EQ(inc.documents_size(), 1);
  EXPECT_EQ(inc.documents(0).document_id(), 10031);
  EXPECT_EQ(inc.documents(0).data_position(), 1003);
  // The other document of the batch is cleared: a suspect, not quarantined.
  bool cleared_listed = false;
  for (const auto& d : inc.suspects()) cleared_listed |= d.document_id() == 10030;
  EXPECT_TRUE(cleared_listed);
  ASSERT_EQ(store.quarantine.size(), 1u);
  EXPECT_EQ(store.quarantine[0].document_id(), 10031);
  EXPECT_THAT(inc.note(),
              HasSubstr("batch 1003: 1 of its 2 documents spike in their own samples (3,4,5,6,7 of 8)"));
  // Every document probe fed batch 1003 alone with a mask there: first
  // without 10031's samples (3-7), then without 10030's (0-3).
  std::vector<std::vector<int32_t>> masks;
  for (const auto& p : inc.probes()) {
    if (p.kind() != "bisect_samples") continue;
    ASSERT_EQ(p.data_plan().masks_size(), 1);
    EXPECT_EQ(p.data_plan().masks(0).position(), 1003);
    masks.emplace_back(p.data_plan().masks(0).slots().begin(), p.data_plan().masks(0).slots().end());
  }
  EXPECT_THAT(masks, ElementsAre(ElementsAre(3, 4, 5, 6, 7), ElementsAre(0, 1, 2, 3)));
  // The fix still holes the whole batch.
  const auto& fix = inc.probes(inc.probes_size() - 1);
  EXPECT_EQ(fix.kind(), "fix");
  EXPECT_EQ(fix.data_plan().masks_size(), 0);
  ExpectEachRequestOnce();
}

TEST_F(IncidentEngineTest, ASpikingSampleSharedByTwoDocumentsNamesBoth) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_probe()->set_bisect_documents(true);
  // Sample 3 holds the end of 10030 and the start of 10031: neither spikes
  // in its own samples, so no document is cleared and both are named.
  Start({.poison = {1000}, .poison_slots = {{1000, {3}}}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  std::set<int64_t> ids;
  for (const auto& d : inc.documents()) ids.insert(d.document_id());
  EXPECT_THAT(ids, ElementsAre(10000, 10001));
  EXPECT_THAT(inc.note(), HasSubstr("batch 1000: no document of its 2 reproduces the spike"));
}

TEST_F(IncidentEngineTest, SampleProbesRunningOutKeepTheSamplesNotCleared) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_probe()->set_bisect_documents(true);
  // Replay, skip, two bisect probes, then room for one document probe (one
  // probe always stays for the fix).
  view.policy.mutable_budget()->set_max_probes(6);
  Start({.poison = {1000}, .poison_slots = {{1000, {6}}}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(CountKind(inc, "bisect_samples"), 1);
  // The one probe fed 10000's own samples (clean): it is cleared, 10001
  // stays named.
  ASSERT_EQ(inc.documents_size(), 1);
  EXPECT_EQ(inc.documents(0).document_id(), 10001);
  EXPECT_THAT(inc.note(), HasSubstr("the document probes ran out"));
  EXPECT_THAT(inc.note(), HasSubstr("documents not named exactly: batch 1000: the document "
                                    "probes stopped before its documents were told apart "
                                    "(budget.max_probes 6 spent)"));
}

// A cap sized for small batches does not cut document bisect short: a batch
// of D documents gets ceil(log2 D) + 1 probes.
TEST_F(IncidentEngineTest, DocumentProbesArePlannedFromTheBatchsDocumentCount) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_probe()->set_max_document_probes(1);
  Start({.poison = {1000}, .poison_slots = {{1000, {6}}}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  ASSERT_EQ(inc.documents_size(), 1);
  EXPECT_EQ(inc.documents(0).document_id(), 10001);
  EXPECT_THAT(inc.note(), Not(HasSubstr("documents not named exactly")));
}

// Exact documents are the default; off by policy, every document of the
// culprit batch is named, and the incident says why.
TEST_F(IncidentEngineTest, SampleBisectIsOnByDefaultAndSaysWhenItIsOff) {
  view.policy.mutable_probe()->set_bisect(true);
  Start({.poison = {1000}, .poison_slots = {{1000, {6}}}});
  RunProtocol();
  const v1::Incident exact = Only();
  EXPECT_GE(CountKind(exact, "bisect_samples"), 1);
  ASSERT_EQ(exact.documents_size(), 1);
  EXPECT_EQ(exact.documents(0).document_id(), 10001);
}

// One culprit document, one incident: the DATA fix holds the named document
// (and its near-copy above fix.hold_out_similarity) out of every later batch
// that carries it — a sample mask, or a hole where every sample does.
TEST_F(IncidentEngineTest, ANamedDocumentIsHeldOutOfEveryLaterBatchThatCarriesIt) {
  view.policy.mutable_probe()->set_bisect(true);
  // Batch 1003 spikes through document 10031 (samples 3-7); the same
  // document sits in samples 2 and 5 of batch 1500 (which spikes through
  // them too) and fills batch 1520; its near-copy 60031 (0.9) is in 1300.
  Start({.poison = {1003, 1500}, .poison_slots = {{1003, {6}}, {1500, {2, 5}}}});
  view.carriers[10031] = {{1500, {2, 5}, 8}, {1520, {0, 1, 2, 3, 4, 5, 6, 7}, 8}, {900, {1}, 8}};
  view.carriers[60031] = {{1300, {1}, 8}};
  RunProtocol(Spike(), 1600);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  ASSERT_EQ(inc.documents_size(), 1);
  EXPECT_EQ(inc.documents(0).document_id(), 10031);
  // The later batches were searched for the document and its near-copy.
  ASSERT_FALSE(view.carrier_queries.empty());
  EXPECT_THAT(view.carrier_queries.back(), ElementsAre(10031, 60031));
  const auto& fix = inc.probes(inc.probes_size() - 1);
  ASSERT_EQ(fix.kind(), "fix");
  std::map<int64_t, std::vector<int32_t>> masks;
  for (const auto& m : fix.data_plan().masks()) {
    masks[m.position()] = {m.slots().begin(), m.slots().end()};
  }
  EXPECT_THAT(masks, ElementsAre(std::make_pair(1300, std::vector<int32_t>{1}),
                                 std::make_pair(1500, std::vector<int32_t>{2, 5})));
  // Batch 1520 is skipped whole; batch 900 (before the window) is history.
  EXPECT_EQ(StepOfPosition(fix.data_plan(), 1520), -1);
  EXPECT_EQ(StepOfPosition(fix.data_plan(), 1003), -1);
  EXPECT_GE(StepOfPosition(fix.data_plan(), 1500), 0);
  EXPECT_THAT(inc.note(), HasSubstr("the fix holds the document(s) web:10031 and near-copies "
                                    "web:60031 (0.90 like web:10031) out of 3 later batch(es)"));
  EXPECT_THAT(inc.note(), HasSubstr("3 sample(s) masked at position(s) 1300,1500; position(s) "
                                    "1520 skipped whole"));
  // The run went on through batch 1500 without a spike.
  const int64_t last_gen = ctl.current_generation;
  const int64_t step1500 = StepOfPosition(fix.data_plan(), 1500);
  ASSERT_TRUE(view.steps[last_gen].count(step1500)) << last_gen;
  EXPECT_LT(view.steps[last_gen][step1500].loss, 3.0);
  // Quarantine stays the named document.
  ASSERT_EQ(store.quarantine.size(), 1u);
  EXPECT_EQ(store.quarantine[0].document_id(), 10031);
}

TEST_F(IncidentEngineTest, NearCopiesBelowTheThresholdAreNotHeldOut) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_fix()->set_hold_out_similarity(0.95);
  Start({.poison = {1003}, .poison_slots = {{1003, {6}}}});
  view.carriers[60031] = {{1300, {1}, 8}};
  RunProtocol(Spike(), 1400);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  ASSERT_FALSE(view.carrier_queries.empty());
  EXPECT_THAT(view.carrier_queries.back(), ElementsAre(10031));
  EXPECT_THAT(inc.note(), HasSubstr("no later batch through data position"));
  EXPECT_THAT(inc.note(), HasSubstr("carries the document(s) web:10031"));
  EXPECT_EQ(inc.probes(inc.probes_size() - 1).data_plan().masks_size(), 0);
}

// A view that cannot know the later batches: said, and the fix is the holes
// alone.
TEST_F(IncidentEngineTest, AHoldOutThatCannotSearchSaysWhy) {
  view.policy.mutable_probe()->set_bisect(true);
  view.carriers_known = false;
  Start({.poison = {1003}, .poison_slots = {{1003, {6}}}});
  RunProtocol(Spike(), 1400);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_THAT(inc.note(), HasSubstr("later batches are not searched for the document(s) "
                                    "web:10031 and near-copies web:60031 (0.90 like web:10031): "
                                    "the fake view knows no later batches"));
  EXPECT_EQ(inc.probes(inc.probes_size() - 1).data_plan().masks_size(), 0);
}

TEST_F(IncidentEngineTest, DocumentBisectThatCannotRunSaysWhy) {
  view.policy.mutable_probe()->set_bisect(true);
  view.has_manifest = false;  // no per-sample document map
  Start({.poison = {1000}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(CountKind(inc, "bisect_samples"), 0);
  EXPECT_THAT(inc.note(), HasSubstr("documents not named exactly: batch 1000: no per-sample "
                                    "document map"));
}

TEST_F(IncidentEngineTest, TransplantRecordsDataTimesState) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_probe()->set_transplant(true);
  // The poisoned batch spikes the much earlier model too: the data alone.
  Start({.poison = {1000}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  bool saw = false;
  for (const auto& p : inc.probes()) {
    if (p.kind() != "transplant") continue;
    saw = true;
    EXPECT_EQ(p.checkpoint_step(), 300);  // ≥ 500 steps before the probe checkpoint
    EXPECT_EQ(p.outcome(), "spiked");
  }
  EXPECT_TRUE(saw);
  EXPECT_THAT(inc.note(), HasSubstr("transplant: the culprit batch spikes the step-300 model"));
  EXPECT_EQ(inc.state(), v1::CLOSED);
}

// --- One incident at a time ---------------------------------------------------------------------

TEST_F(IncidentEngineTest, DetectionsDuringAProbeAreIgnored) {
  Start({.poison = {1000}});
  Detect();
  world->Feed(engine.get(), kRun, 2, 901, 1000);
  // The replay's own spike: it belongs to the probe.
  ASSERT_TRUE(engine->OnDetection(kRun, Spike(1000, 2)).ok());
  ASSERT_TRUE(engine->OnDetection(kRun, Spike(1000, 3)).ok());
  EXPECT_EQ(store.incidents.size(), 1u);
  world->Pump(engine.get(), kRun, 1600);
  EXPECT_EQ(Only().verdict(), v1::DATA);
  // A stale timeline's detection after the close is ignored as well...
  ASSERT_TRUE(engine->OnDetection(kRun, Spike(1010, 1)).ok());
  EXPECT_EQ(store.incidents.size(), 1u);
  // ...while one on the generation that trains now opens a new incident.
  ASSERT_TRUE(engine->OnDetection(kRun, Spike(1500, 3)).ok());
  EXPECT_EQ(store.incidents.size(), 2u);
}

// --- Recovery ------------------------------------------------------------------------------------

TEST_F(IncidentEngineTest, RecoveryResumesAProbeFromTheEventLog) {
  Start({.poison = {1000}});
  Detect();
  // The replay finishes and the skip probe runs halfway; then kill -9.
  world->Pump(engine.get(), kRun, 1050);
  ASSERT_EQ(ctl.executed.size(), 2u);
  ASSERT_EQ(Only().state(), v1::SKIPPING);
  const int calls_before = ctl.rewind_calls;
  engine.reset();

  engine = NewEngine();
  ASSERT_TRUE(engine->Recover().ok());
  ASSERT_EQ(engine->Active().size(), 1u);
  EXPECT_EQ(engine->Active()[0].state(), v1::SKIPPING);
  EXPECT_TRUE(engine->ProbeRunning(kRun));
  // The log shows the probe started: the engine does not even ask again.
  EXPECT_EQ(ctl.rewind_calls, calls_before);
  // The workers re-deliver what they sent before the crash, then go on.
  world->next_step[3] = 901;
  world->Pump(engine.get(), kRun, 1600);

  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:clean"));
  EXPECT_EQ(ctl.executed.size(), 2u);
  EXPECT_EQ(ctl.rewind_calls, 2);
  EXPECT_EQ(ctl.UniqueContinues().size(), ctl.continue_calls.size());
  EXPECT_EQ(store.quarantine.size(), 22u);
  ExpectEachRequestOnce();
}

TEST_F(IncidentEngineTest, RecoveryReissuesARewindThatWasNotConfirmed) {
  Start({.poison = {1000}});
  // The controller executes the replay, then the daemon dies before it
  // logs "probe_started".
  store.fail_append_kind = "probe_started";
  EXPECT_FALSE(engine->OnDetection(kRun, Spike()).ok());
  ASSERT_EQ(ctl.executed.size(), 1u);
  engine.reset();

  engine = NewEngine();
  ASSERT_TRUE(engine->Recover().ok());
  // Asked again with the same request id; the controller recognized it.
  EXPECT_EQ(ctl.rewind_calls, 2);
  EXPECT_EQ(ctl.executed.size(), 1u);
  EXPECT_EQ(Only().state(), v1::REPLAYING);
  world->Pump(engine.get(), kRun, 1600);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_EQ(ctl.executed.size(), 2u);
  ExpectEachRequestOnce();
}

TEST_F(IncidentEngineTest, RecoveryMidLadderReachesTheSameVerdict) {
  // Reference run without a crash.
  Start({.fragile_until_rung = 2});
  RunProtocol();
  const v1::Incident reference = Only();
  ASSERT_EQ(reference.verdict(), v1::FRAGILITY);

  // Same world, crash during rung 1 (generation 4).
  ctl = FakeController();
  store = FakeStore();
  view.steps.erase(view.steps.upper_bound(1), view.steps.end());
  Start({.fragile_until_rung = 2});
  Detect();
  world->cap[4] = 960;
  world->Pump(engine.get(), kRun, 1600);
  ASSERT_EQ(ctl.current_generation, 4);
  engine.reset();
  engine = NewEngine();
  ASSERT_TRUE(engine->Recover().ok());
  world->cap.clear();
  world->Pump(engine.get(), kRun, 1600);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), reference.verdict());
  EXPECT_EQ(Kinds(inc), Kinds(reference));
  EXPECT_EQ(inc.cost().steps_reexecuted(), reference.cost().steps_reexecuted());
  ExpectEachRequestOnce();
}

TEST_F(IncidentEngineTest, RecoveryMidVerificationFinishesTheVerification) {
  Start({.transient = true});
  Detect();
  // The replay is continued; verification (through step 1210) is cut at 1100.
  world->cap[2] = 1100;
  world->Pump(engine.get(), kRun, 1600);
  ASSERT_EQ(Only().state(), v1::VERIFYING);
  engine.reset();
  engine = NewEngine();
  ASSERT_TRUE(engine->Recover().ok());
  EXPECT_EQ(engine->Active().size(), 1u);
  world->cap.clear();
  world->Pump(engine.get(), kRun, 1600);
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::TRANSIENT);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_TRUE(HasEvent(inc, "verified"));
  EXPECT_EQ(ctl.continue_calls.size(), 1u);
  EXPECT_EQ(ctl.rewind_calls, 1);
}

TEST_F(IncidentEngineTest, RecoveryOfAProposalStillWaitsForApproval) {
  view.policy.set_mode(v1::MODE_PROPOSE);
  Start({.poison = {1000}});
  Detect();
  const int64_t id = Only().id();
  engine.reset();
  engine = NewEngine();
  ASSERT_TRUE(engine->Recover().ok());
  EXPECT_EQ(ctl.rewind_calls, 0);
  EXPECT_EQ(engine->Get(id)->state(), v1::AWAITING_APPROVAL);
  ASSERT_TRUE(engine->Approve(id).ok());
  EXPECT_EQ(ctl.executed.size(), 1u);
}


// --- Diagnosis off the tuned path (one test per defect class) ------------------------------

// A probe's horizon past the run's last step is clamped to it; the verdict
// comes without waiting for steps that never come.
TEST_F(IncidentEngineTest, HorizonPastTheEndOfTheScheduleIsClamped) {
  view.final_step = 1030;
  Start({.poison = {1000}});
  world->final_step = 1030;
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  ASSERT_EQ(ctl.executed.size(), 2u);
  EXPECT_EQ(ctl.executed[1].stop_after_step, 1030);  // onset + 200, clamped
  EXPECT_TRUE(ctl.pause_calls.empty());
}

// A verification horizon past the schedule's last step is clamped, and the
// continue request says so rather than naming a step the run never reaches.
TEST_F(IncidentEngineTest, VerificationPastTheEndOfTheScheduleIsClampedAndSaysSo) {
  view.final_step = 1100;
  Start({.transient = true});
  world->final_step = 1100;
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::TRANSIENT);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  bool said = false;
  for (const auto& e : inc.events()) {
    if (e.kind() != "continue_requested") continue;
    EXPECT_THAT(e.detail(), Not(HasSubstr("step 1210")));
    said = said || e.detail().find("verify through step 1100, the last step of the run's "
                                   "schedule (1210 asked)") != std::string::npos;
  }
  EXPECT_TRUE(said);
}

// Workers that end their schedule before a horizon the daemon did not know
// about say so, and the probe is judged with the steps it has.
TEST_F(IncidentEngineTest, AWorkerEndingAProbeEarlyIsJudgedAtOnce) {
  Start({.poison = {1000}});
  world->final_step = 1060;  // the daemon does not know it
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(inc.probes(1).detail(), HasSubstr("schedule ended at step 1060"));
  EXPECT_TRUE(ctl.pause_calls.empty());
}

// A NUMERICS verdict pauses the run, and the probes' own non-finite steps
// never open incidents of their own.
TEST_F(IncidentEngineTest, ProbeGenerationsNeverOpenIncidents) {
  Start({.nonfinite = true});
  Detection d = Spike();
  d.kind = Detection::Kind::kNonFinite;
  RunProtocol(d);
  ASSERT_EQ(Only().verdict(), v1::NUMERICS);
  ASSERT_TRUE(ctl.paused);
  // The skip probe's generation spiked too; its detector fires late.
  for (int64_t gen : {2, 3}) {
    Detection late = d;
    late.generation = gen;
    late.onset_step = 1000;
    Detect(late);
    Detection later = Spike(1100, gen);
    Detect(later);
  }
  EXPECT_EQ(store.incidents.size(), 1u);
  EXPECT_TRUE(ctl.paused);
  EXPECT_EQ(ctl.executed.size(), 2u);
}

// The workers lost the chosen checkpoint: the probe fails at once with
// their message and the incident goes on from the next one.
TEST_F(IncidentEngineTest, AFailedRewindMovesToTheNextCheckpointAtOnce) {
  Start({.poison = {1000}});
  world->missing_uris = {"file:///ckpt/900"};
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:failed", "replay:spiked", "skip:clean"));
  EXPECT_THAT(inc.probes(0).detail(), HasSubstr("cannot open checkpoint file:///ckpt/900"));
  EXPECT_EQ(inc.probes(1).checkpoint_step(), 700);
  // Pinned while in use, unpinned when closed.
  EXPECT_EQ(store.pins.count(700), 1u);
  EXPECT_FALSE(store.pins[700]);
  EXPECT_FALSE(store.pins[900]);
}

TEST_F(IncidentEngineTest, NoUsableCheckpointLeftIsAClearVerdict) {
  Start({.poison = {1000}});
  world->missing_uris = {"file:///ckpt/300", "file:///ckpt/500", "file:///ckpt/700",
                         "file:///ckpt/900", "file:///ckpt/950"};
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::INCONCLUSIVE);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(inc.note(), HasSubstr("cannot open checkpoint"));
  EXPECT_THAT(inc.note(), HasSubstr("no other complete checkpoint"));
}

// A second poison just outside the skip window makes the skip probe spike
// on another batch: that batch is skipped too, and both are named.
TEST_F(IncidentEngineTest, ASecondPoisonOutsideTheWindowIsDataNotFragility) {
  view.policy.mutable_probe()->set_bisect(true);
  Start({.poison = {1000, 1008}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_EQ(Kinds(inc)[1], "skip:spiked");
  EXPECT_EQ(Kinds(inc)[2], "skip:clean");
  EXPECT_THAT(inc.culprit_positions(), ElementsAre(1000, 1008));
  EXPECT_EQ(store.quarantine.size(), 4u);
  EXPECT_EQ(inc.near_duplicates_size(), 4);
}

TEST_F(IncidentEngineTest, BisectNamesEveryCulpritInTheWindow) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_budget()->set_max_probes(20);
  Start({.poison = {997, 1000, 1004}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_THAT(inc.culprit_positions(), ElementsAre(997, 1000, 1004));
  EXPECT_EQ(store.quarantine.size(), 6u);
}

// Replay spiked, skip clean, but no batch of the window spikes alone: no
// culprit is named and the verdict is not DATA.
TEST_F(IncidentEngineTest, NoBatchReproducingAloneIsNotData) {
  view.policy.mutable_probe()->set_bisect(true);
  view.policy.mutable_budget()->set_max_probes(20);
  Start({.spike_needs_all = {996, 998, 1000, 1002, 1004}});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_NE(inc.verdict(), v1::DATA);
  bool fragility = false;
  for (const auto& e : inc.events()) {
    if (e.kind() == "verdict" && absl::StrContains(e.detail(), "verdict FRAGILITY")) {
      fragility = true;
    }
  }
  EXPECT_TRUE(fragility);
  EXPECT_EQ(inc.culprit_positions_size(), 0);
  EXPECT_TRUE(store.quarantine.empty());
  EXPECT_THAT(inc.note(), HasSubstr("reproduces the spike when fed without the rest"));
  EXPECT_LT(inc.confidence(), 0.8);
}

// The first step a probe executes is the checkpoint's own step: a culprit
// exactly there is judged, and bisect names it.
TEST_F(IncidentEngineTest, ACulpritAtTheCheckpointStepIsJudged) {
  view.policy.mutable_probe()->set_min_steps_before_onset(0);
  view.policy.mutable_probe()->set_bisect(true);
  view.checkpoints.push_back({1, 997, "file:///ckpt/997", "sum", true});
  Start({.poison = {997}});
  RunProtocol(Spike(998));
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.probes(0).checkpoint_step(), 997);
  EXPECT_EQ(inc.probes(0).outcome(), "spiked");
  EXPECT_EQ(inc.verdict(), v1::DATA);
  EXPECT_THAT(inc.culprit_positions(), ElementsAre(997));
  // Steps 997..1008 (the horizon): 12 steps, the checkpoint's own included.
  EXPECT_EQ(inc.probes(0).steps_executed(), 12);
}

// A probe of a generation running under a fix keeps the fix's settings.
TEST_F(IncidentEngineTest, ProbesInheritTheHyperparametersInForce) {
  v1::HParams fix;
  fix.set_extra_warmup_steps(50);
  fix.set_warmup_start_step(400);  // the ramp of the fix is not restarted
  fix.set_eps(1e-6);
  view.hparams[1] = fix;
  Start({.fragile_until_rung = 1});
  RunProtocol(FragileSpike());
  ASSERT_EQ(Only().verdict(), v1::FRAGILITY);
  ASSERT_GE(ctl.executed.size(), 3u);
  for (size_t i = 0; i < 2; ++i) {  // replay and skip
    EXPECT_EQ(ctl.executed[i].hparams.extra_warmup_steps(), 50) << i;
    EXPECT_EQ(ctl.executed[i].hparams.warmup_start_step(), 400) << i;
    EXPECT_DOUBLE_EQ(ctl.executed[i].hparams.eps(), 1e-6) << i;
    EXPECT_FALSE(ctl.executed[i].hparams.has_lr_scale()) << i;
  }
  // The first rung adds its lr scale on top of what is in force.
  EXPECT_DOUBLE_EQ(ctl.executed[2].hparams.lr_scale(), 0.7);
  EXPECT_EQ(ctl.executed[2].hparams.extra_warmup_steps(), 50);
}

TEST_F(IncidentEngineTest, ARungScalesTheLrInForce) {
  v1::HParams fix;
  fix.set_lr_scale(0.5);
  view.hparams[1] = fix;
  // Rung 1 of the fake world is "an lr scale"; the inherited one counts, so
  // the replay does not spike unless the scenario needs rung 2.
  Start({.fragile_until_rung = 2});
  RunProtocol(FragileSpike());
  ASSERT_GE(ctl.executed.size(), 3u);
  EXPECT_DOUBLE_EQ(ctl.executed[0].hparams.lr_scale(), 0.5);
  EXPECT_DOUBLE_EQ(ctl.executed[2].hparams.lr_scale(), 0.5 * 0.7);
}

// The loss and grad-norm detectors firing for one spike make one incident.
TEST_F(IncidentEngineTest, OneEventOneIncident) {
  // Open: the second detector's event is evidence of the incident.
  view.policy.set_mode(v1::MODE_PROPOSE);
  Start({.poison = {1000}});
  Detect();
  Detection grad = Spike(1001);
  grad.kind = Detection::Kind::kGradNormSpike;
  Detect(grad);
  ASSERT_EQ(store.incidents.size(), 1u);
  EXPECT_THAT(Only().note(), HasSubstr("also grad_norm_spike at step 1001"));
}

TEST_F(IncidentEngineTest, OneEventOneIncidentAfterItClosed) {
  // Observe mode closes at once; the grad norm's onset a step later is the
  // same event, a spike far later is another.
  view.policy.set_mode(v1::MODE_OBSERVE);
  Start({.poison = {1000}});
  Detect();
  Detection grad = Spike(1001);
  grad.kind = Detection::Kind::kGradNormSpike;
  Detect(grad);
  EXPECT_EQ(store.incidents.size(), 1u);
  Detect(Spike(1200));
  EXPECT_EQ(store.incidents.size(), 2u);
}

TEST_F(IncidentEngineTest, ClosedIncidentsLeaveTheEngineAndStillCount) {
  // A long-lived daemon closes thousands of incidents: the engine keeps
  // only the open ones (a closed one is read from the catalog), yet every
  // closed one still counts for deduplication and for operators' calls.
  view.policy.set_mode(v1::MODE_OBSERVE);
  Start({.poison = {1000}});
  constexpr int kSpikes = 20;
  std::vector<int64_t> ids;
  for (int k = 0; k < kSpikes; ++k) {
    Detect(Spike(kOnset + 100 * k));
    ASSERT_EQ(store.incidents.size(), static_cast<size_t>(k + 1));
    ids.push_back(store.incidents.rbegin()->first);
    ASSERT_EQ(store.incidents.rbegin()->second.state(), v1::CLOSED);
  }
  ASSERT_TRUE(engine->Tick().ok());
  EXPECT_TRUE(engine->Active().empty());
  for (int64_t id : ids) EXPECT_FALSE(engine->Get(id).has_value()) << "incident " << id;
  // The same events again (another detector, a step later) open nothing.
  for (int k = 0; k < kSpikes; ++k) {
    Detection grad = Spike(kOnset + 100 * k + 1);
    grad.kind = Detection::Kind::kGradNormSpike;
    Detect(grad);
  }
  EXPECT_EQ(store.incidents.size(), static_cast<size_t>(kSpikes));
  // Operators get the same answers as while the engine held them.
  EXPECT_EQ(engine->Abort(ids.front(), "late").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->Approve(ids.back()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->Approve(12345).code(), absl::StatusCode::kNotFound);
  // A new event still opens its incident.
  Detect(Spike(kOnset + 100 * kSpikes));
  EXPECT_EQ(store.incidents.size(), static_cast<size_t>(kSpikes + 1));
}

TEST_F(IncidentEngineTest, AnAbortedIncidentCanBeAbortedAgainAfterItLeftTheEngine) {
  Start({.poison = {1000}});
  Detect();
  world->Feed(engine.get(), kRun, 2, 901, 950);
  const int64_t id = Only().id();
  ASSERT_TRUE(engine->Abort(id, "operator takes over").ok());
  world->Pump(engine.get(), kRun, 1600);
  ASSERT_EQ(Only().state(), v1::ABORTED);
  ASSERT_TRUE(engine->Tick().ok());
  EXPECT_FALSE(engine->Get(id).has_value());
  EXPECT_TRUE(engine->Abort(id, "again").ok());  // idempotent
  EXPECT_EQ(engine->Approve(id).code(), absl::StatusCode::kFailedPrecondition);
}

// A fragile model whose skip probe ran into another poisoned batch 80 steps
// later: every rung would spike on that batch whatever it fixes, so each
// rung is judged up to the step before it; the first rung holds, the run
// continues and is not paused, and the batch is left to its own incident.
TEST_F(IncidentEngineTest, ALaterPoisonDoesNotFailTheFragilityFix) {
  Start({.poison = {1080}, .fragile_until_rung = 1, .fragile_on_onset_batch_only = true});
  RunProtocol(FragileSpike());
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::FRAGILITY) << inc.note();
  EXPECT_EQ(inc.state(), v1::CLOSED);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:spiked", "fix:clean"));
  ASSERT_EQ(ctl.executed.size(), 3u);
  EXPECT_EQ(ctl.executed[2].stop_after_step, 1079);  // the original feeds 1080 at step 1080
  std::string requests;
  for (const auto& e : inc.events()) {
    if (e.kind() == "rewind_requested") absl::StrAppend(&requests, e.detail(), "\n");
  }
  EXPECT_THAT(requests, HasSubstr("judged through step 1079: data position 1080 (step 1080) "
                                  "spiked the skip probe on its own"));
  EXPECT_EQ(ctl.UniqueContinues().size(), 1u);
  EXPECT_TRUE(ctl.pause_calls.empty());
}

// Without the later batch the rung is judged over its full horizon; a skip
// spike at the onset's own step is the event, not another batch.
TEST_F(IncidentEngineTest, ASkipSpikeAtTheOnsetKeepsTheFullFixHorizon) {
  Start({.fragile_until_rung = 1});
  RunProtocol(FragileSpike());
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::FRAGILITY);
  ASSERT_EQ(ctl.executed.size(), 3u);
  EXPECT_EQ(ctl.executed[2].stop_after_step, kOnset + view.policy.fix().verify_steps());
  for (const auto& e : inc.events()) EXPECT_THAT(e.detail(), Not(HasSubstr("judged through")));
}

// The skip's own spike on another batch is analysed there; when the spikes
// keep coming at other batches, the model is fragile.
TEST_F(IncidentEngineTest, SpikesAtEveryOtherBatchAreFragility) {
  Start({.fragile_until_rung = 1});
  RunProtocol();
  const v1::Incident inc = Only();
  EXPECT_EQ(inc.verdict(), v1::FRAGILITY);
  EXPECT_THAT(Kinds(inc), ElementsAre("replay:spiked", "skip:spiked", "skip:spiked",
                                      "skip:spiked", "fix:clean"));
  EXPECT_THAT(inc.note(), HasSubstr("2 more spike(s) at other batches"));
}

}  // namespace
}  // namespace spikeguard::incident
