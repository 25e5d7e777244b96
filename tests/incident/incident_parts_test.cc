// The engine's pure parts: the fold over the event log and its names, the
// probe judge, bisection, the fix ladder's rungs and the plan conversions.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/strip.h"
#include "daemon/incident/bisection.h"
#include "daemon/incident/fix_ladder.h"
#include "daemon/incident/incident_state.h"
#include "daemon/incident/plan_proto.h"
#include "daemon/incident/policy.h"
#include "daemon/incident/probe_judge.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace spikeguard::incident {
namespace {

namespace v1 = spikeguard::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---- Names: the persisted strings -------------------------------------------

TEST(IncidentStateTest, NamesRoundTripAndAreThePersistedStrings) {
  EXPECT_STREQ(EventKindName(EventKind::kProbeFinished), "probe_finished");
  EXPECT_STREQ(EventKindName(EventKind::kVerificationFailed), "verification_failed");
  for (int k = 0; k <= static_cast<int>(EventKind::kAborted); ++k) {
    const auto kind = static_cast<EventKind>(k);
    EXPECT_EQ(ParseEventKind(EventKindName(kind)), kind) << EventKindName(kind);
  }
  EXPECT_EQ(ParseEventKind("no_such_event"), std::nullopt);
  EXPECT_EQ(ParseActionKind("quarantine"), ActionKind::kQuarantine);
  EXPECT_STREQ(ProbeKindName(ProbeKind::kSampleBisect), "bisect_samples");
  EXPECT_EQ(ParseProbeKind("transplant"), ProbeKind::kTransplant);
  EXPECT_EQ(ParseProbeKind(""), ProbeKind::kNone);
  EXPECT_STREQ(ProbeOutcomeName(ProbeOutcome::kNonFinite), "nonfinite");
  EXPECT_EQ(ParseProbeOutcome("clean"), ProbeOutcome::kClean);
}

// Every name the incident log stores (incident_events.kind, the payloads'
// action, probe kind and outcome, incidents.trigger_kind), written out: a
// reordered or renamed enumerator must not change what a stored log says,
// and a new one must be added here (docs/ARCHITECTURE.md, "The catalog
// schema").
TEST(IncidentStateTest, EveryPersistedNameIsPinned) {
  const std::vector<std::pair<EventKind, std::string>> events = {
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
  };
  ASSERT_EQ(static_cast<size_t>(EventKind::kWindowCheckpoint) + 1, events.size())
      << "a new event kind needs a row here";
  for (const auto& [kind, name] : events) {
    EXPECT_EQ(EventKindName(kind), name);
    EXPECT_EQ(ParseEventKind(name), kind) << name;
  }
  const std::vector<std::pair<ActionKind, std::string>> actions = {
      {ActionKind::kRewind, "rewind"},
      {ActionKind::kContinue, "continue"},
      {ActionKind::kPause, "pause"},
      {ActionKind::kQuarantine, "quarantine"}};
  for (const auto& [kind, name] : actions) {
    EXPECT_EQ(ActionKindName(kind), name);
    EXPECT_EQ(ParseActionKind(name), kind) << name;
  }
  const std::vector<std::pair<ProbeKind, std::string>> probes = {
      {ProbeKind::kNone, ""},          {ProbeKind::kReplay, "replay"},
      {ProbeKind::kSkip, "skip"},      {ProbeKind::kBisect, "bisect"},
      {ProbeKind::kSampleBisect, "bisect_samples"},
      {ProbeKind::kTransplant, "transplant"}, {ProbeKind::kFix, "fix"}};
  for (const auto& [kind, name] : probes) {
    EXPECT_EQ(ProbeKindName(kind), name);
    EXPECT_EQ(ParseProbeKind(name), kind) << name;
  }
  const std::vector<std::pair<ProbeOutcome, std::string>> outcomes = {
      {ProbeOutcome::kPending, "pending"},     {ProbeOutcome::kClean, "clean"},
      {ProbeOutcome::kSpiked, "spiked"},       {ProbeOutcome::kNonFinite, "nonfinite"},
      {ProbeOutcome::kFailed, "failed"}};
  for (const auto& [outcome, name] : outcomes) {
    EXPECT_EQ(ProbeOutcomeName(outcome), name);
    EXPECT_EQ(ParseProbeOutcome(name), outcome) << name;
  }
  EXPECT_EQ(TriggerName(Detection::Kind::kLossSpike), "loss_spike");
  EXPECT_EQ(TriggerName(Detection::Kind::kGradNormSpike), "grad_norm_spike");
  EXPECT_EQ(TriggerName(Detection::Kind::kNonFinite), "nonfinite");
  EXPECT_EQ(TriggerName(Detection::Kind::kPrecursor), "precursor");
}

// Detection::Kind is persisted by explicit number (Opened.kind), not by the
// enum's position: these are the numbers stored "opened" events carry.
TEST(IncidentStateTest, DetectionKindsArePersistedByTheirExplicitNumbers) {
  EXPECT_EQ(PersistedKind(Detection::Kind::kLossSpike), 0);
  EXPECT_EQ(PersistedKind(Detection::Kind::kGradNormSpike), 1);
  EXPECT_EQ(PersistedKind(Detection::Kind::kNonFinite), 2);
  EXPECT_EQ(PersistedKind(Detection::Kind::kPrecursor), 3);
  for (Detection::Kind k : {Detection::Kind::kLossSpike, Detection::Kind::kGradNormSpike,
                            Detection::Kind::kNonFinite, Detection::Kind::kPrecursor}) {
    lg::Opened o;
    o.set_kind(PersistedKind(k));
    EXPECT_EQ(DetectionKindOf(o), k) << PersistedKind(k);
  }
  lg::Opened unknown;
  unknown.set_kind(9);
  EXPECT_EQ(DetectionKindOf(unknown), std::nullopt);
}

// "opened" payloads exactly as stored by earlier daemons (the text proto of
// incident_events.payload, kind as an int) read back as the same detection,
// and a payload written now stores the same text: the representation did not
// change, so no catalog migration is needed.
TEST(IncidentStateTest, StoredOpenedEventsOfEveryKindReadBackUnchanged) {
  const struct {
    const char* stored;
    const char* trigger;
  } cases[] = {
      {"unix_ms: 1000 opened { run: \"gpt\" generation: 1 onset_step: 1000 world_size: 8 }",
       "loss_spike"},
      {"unix_ms: 1000 opened { run: \"gpt\" kind: 1 generation: 1 onset_step: 1000 world_size: 8 }",
       "grad_norm_spike"},
      {"unix_ms: 1000 opened { run: \"gpt\" kind: 2 generation: 1 onset_step: 1000 world_size: 8 }",
       "nonfinite"},
      {"unix_ms: 1000 opened { run: \"gpt\" kind: 3 generation: 1 onset_step: 1000 world_size: 8 }",
       "precursor"},
      {"unix_ms: 1000 opened { run: \"gpt\" kind: 7 generation: 1 onset_step: 1000 world_size: 8 }",
       "unknown"},
  };
  for (const auto& c : cases) {
    lg::EventPayload p;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(c.stored, &p)) << c.stored;
    IncidentCase s;
    s.inc.set_id(1);
    Apply(s, 1, EventKind::kOpened, p);
    EXPECT_EQ(s.inc.trigger(), c.trigger) << c.stored;
    EXPECT_EQ(s.run(), "gpt");
    if (std::string(c.trigger) != "unknown") {
      lg::EventPayload again;
      again.set_unix_ms(1000);
      lg::Opened* o = again.mutable_opened();
      o->set_run("gpt");
      o->set_kind(PersistedKind(*DetectionKindOf(p.opened())));
      o->set_generation(1);
      o->set_onset_step(1000);
      o->set_world_size(8);
      EXPECT_EQ(absl::StripTrailingAsciiWhitespace(ToText(again)), c.stored);
    }
  }
}

// ---- The fold ---------------------------------------------------------------

lg::EventPayload Opened() {
  lg::EventPayload p;
  p.set_unix_ms(1000);
  lg::Opened* o = p.mutable_opened();
  o->set_run("gpt");
  o->set_generation(1);
  o->set_onset_step(1000);
  o->set_world_size(8);
  *o->mutable_policy() = DefaultPolicy();
  return p;
}

TEST(IncidentStateTest, FoldsAProbeFromRequestToOutcome) {
  IncidentCase s;
  s.inc.set_id(7);
  Apply(s, 1, EventKind::kOpened, Opened());
  EXPECT_EQ(s.stage, Stage::kOpened);
  EXPECT_EQ(s.inc.state(), v1::DETECTED);
  EXPECT_EQ(s.run(), "gpt");

  lg::EventPayload req;
  req.set_unix_ms(2000);
  lg::Action* a = req.mutable_action();
  a->set_kind("rewind");
  a->set_probe_kind("skip");
  a->set_hole_begin(995);
  a->set_hole_end(1006);
  Apply(s, 2, EventKind::kRewindRequested, req);
  EXPECT_EQ(s.inc.state(), v1::SKIPPING);
  EXPECT_THAT(s.holes, ElementsAre(std::make_pair(int64_t{995}, int64_t{1006})));

  lg::EventPayload started;
  started.set_unix_ms(3000);
  started.mutable_done()->set_generation(2);
  Apply(s, 3, EventKind::kProbeStarted, started);
  EXPECT_EQ(s.stage, Stage::kProbing);
  EXPECT_EQ(s.probe_kind(), ProbeKind::kSkip);
  ASSERT_EQ(s.inc.probes_size(), 1);
  EXPECT_EQ(s.inc.probes(0).outcome(), "pending");

  lg::EventPayload done;
  done.set_unix_ms(4000);
  done.mutable_finished()->set_outcome("clean");
  done.mutable_finished()->set_steps_executed(120);
  done.mutable_finished()->set_step_time_sum(120);
  done.mutable_finished()->set_step_count(120);
  Apply(s, 4, EventKind::kProbeFinished, done);
  EXPECT_EQ(s.stage, Stage::kJudge);
  EXPECT_EQ(s.outcomes.at(ProbeKind::kSkip), ProbeOutcome::kClean);
  EXPECT_EQ(s.inc.probes(0).outcome(), "clean");
  EXPECT_EQ(s.inc.cost().steps_reexecuted(), 120);
  // 120 steps × 1 s × 8 ranks.
  EXPECT_NEAR(s.inc.cost().gpu_hours(), 120.0 * 8 / 3600, 1e-12);
  ASSERT_EQ(s.inc.events_size(), 4);
  EXPECT_EQ(s.inc.events(3).kind(), "probe_finished");
}

TEST(IncidentStateTest, AnUnknownEventIsKeptAndChangesNothingElse) {
  IncidentCase s;
  Apply(s, 1, EventKind::kOpened, Opened());
  lg::EventPayload p;
  p.set_detail("from a newer build");
  p.set_note("must not be noted");
  Apply(s, 2, std::string("from_the_future"), p);
  EXPECT_EQ(s.stage, Stage::kOpened);
  ASSERT_EQ(s.inc.events_size(), 2);
  EXPECT_EQ(s.inc.events(1).kind(), "from_the_future");
  EXPECT_EQ(s.inc.note(), "");
}

TEST(IncidentStateTest, PayloadTextIsOneLine) {
  const std::string text = ToText(Opened());
  EXPECT_EQ(text.find('\n'), std::string::npos);
  EXPECT_THAT(text, HasSubstr("run: \"gpt\""));
}

// ---- The probe judge --------------------------------------------------------

StepObservation Step(int64_t step, double loss) {
  StepObservation o;
  o.generation = 2;
  o.step = step;
  o.data_position = step;
  o.loss = loss;
  o.grad_norm = 1.0;
  o.step_time_s = 1.0;
  return o;
}

// Noise with a few distinct values, so the median absolute deviation is not 0.
double Noise(int64_t step) {
  return 2.0 + 0.02 * (static_cast<double>((step * 7919) % 13) - 6.0) / 6.0;
}

std::unique_ptr<ProbeJudge> Judge(int64_t from, int64_t to) {
  auto j = std::make_unique<ProbeJudge>();
  j->generation = 2;
  j->checkpoint_step = 900;
  j->from = from;
  j->to = to;
  j->detector = std::make_unique<detect::SpikeDetector>(SpikeOptions(DefaultPolicy().loss_spike()));
  for (int64_t s = 700; s < 900; ++s) j->detector->Observe(s, Noise(s));
  j->last_fed = j->checkpoint_step - 1;
  return j;
}

TEST(ProbeJudgeTest, CleanThroughTheHorizon) {
  auto j = Judge(998, 1010);
  for (int64_t s = 900; s <= 1010; ++s) j->Feed(Step(s, Noise(s)), absl::Now());
  ASSERT_TRUE(j->result.has_value());
  EXPECT_EQ(OutcomeOf(*j->result), ProbeOutcome::kClean);
  EXPECT_EQ(j->result->steps_executed(), 111);
}

TEST(ProbeJudgeTest, ASpikeIsReportedAtTheHorizonWithItsPosition) {
  auto j = Judge(998, 1010);
  for (int64_t s = 900; s <= 1010; ++s) {
    j->Feed(Step(s, s == 1000 ? 40.0 : Noise(s)), absl::Now());
    if (s < 1010) {
      EXPECT_FALSE(j->result.has_value()) << s;  // runs on to the horizon
    }
  }
  ASSERT_TRUE(j->result.has_value());
  EXPECT_EQ(OutcomeOf(*j->result), ProbeOutcome::kSpiked);
  EXPECT_EQ(j->result->spike_step(), 1000);
  EXPECT_EQ(j->result->spike_position(), 1000);
}

// A replay that repeats the original's event steps bit for bit repeated the
// event, even when the judge's own detector (no corroboration by precursors
// or grad norm, as the live monitor has) does not flag the mild rise.
TEST(ProbeJudgeTest, AReplayThatRepeatsTheEventBitForBitSpikedEvenUnflagged) {
  auto j = Judge(998, 1005);
  for (int64_t s = 1000; s <= 1001; ++s) j->event_hash[s] = 0xabc0 + s;
  for (int64_t s = 900; s <= 1005; ++s) {
    StepObservation o = Step(s, Noise(s));
    o.loss_hash = 0xabc0 + s;
    j->Feed(o, absl::Now());
  }
  ASSERT_TRUE(j->result.has_value());
  EXPECT_EQ(OutcomeOf(*j->result), ProbeOutcome::kSpiked) << j->result->detail();
  EXPECT_EQ(j->result->spike_step(), 1000);
  EXPECT_THAT(j->result->detail(), ::testing::HasSubstr("bit for bit through step 1001"));
}

// One differing step of the event (a fault in the original's update shows in
// the next step's loss) and the replay is clean: the event did not recur.
TEST(ProbeJudgeTest, AReplayThatDiffersInsideTheEventIsClean) {
  auto j = Judge(998, 1005);
  for (int64_t s = 1000; s <= 1001; ++s) j->event_hash[s] = 0xabc0 + s;
  for (int64_t s = 900; s <= 1005; ++s) {
    StepObservation o = Step(s, Noise(s));
    o.loss_hash = s == 1001 ? 0x1234 : 0xabc0 + s;
    j->Feed(o, absl::Now());
  }
  ASSERT_TRUE(j->result.has_value());
  EXPECT_EQ(OutcomeOf(*j->result), ProbeOutcome::kClean) << j->result->detail();
}

// The loss repeats but the judged value does not (a grad-norm event whose
// report the replay does not repeat): not the same event.
TEST(ProbeJudgeTest, AReplayWhoseJudgedValueDiffersAtTheEventIsClean) {
  auto j = Judge(998, 1005);
  j->use_grad = true;
  for (int64_t s = 1000; s <= 1001; ++s) {
    j->event_hash[s] = 0xabc0 + s;
    j->event_value[s] = s == 1000 ? 9.0 : 1.0;
  }
  for (int64_t s = 900; s <= 1005; ++s) {
    StepObservation o = Step(s, Noise(s));
    o.loss_hash = 0xabc0 + s;
    j->Feed(o, absl::Now());
  }
  ASSERT_TRUE(j->result.has_value());
  EXPECT_EQ(OutcomeOf(*j->result), ProbeOutcome::kClean) << j->result->detail();
}

TEST(ProbeJudgeTest, NonFiniteEndsTheProbeAtOnce) {
  auto j = Judge(998, 1010);
  for (int64_t s = 900; s < 1000; ++s) j->Feed(Step(s, Noise(s)), absl::Now());
  StepObservation bad = Step(1000, std::nan(""));
  bad.first_nonfinite_layer = 5;
  j->Feed(bad, absl::Now());
  ASSERT_TRUE(j->result.has_value());
  EXPECT_EQ(OutcomeOf(*j->result), ProbeOutcome::kNonFinite);
  EXPECT_EQ(j->result->nonfinite_layer(), 5);
}

TEST(ProbeJudgeTest, AScheduleThatEndsBeforeTheJudgedStepsFails) {
  auto j = Judge(998, 1010);
  for (int64_t s = 900; s <= 950; ++s) j->Feed(Step(s, Noise(s)), absl::Now());
  j->ended_at = 950;
  j->EndEarly();
  ASSERT_TRUE(j->result.has_value());
  EXPECT_EQ(OutcomeOf(*j->result), ProbeOutcome::kFailed);
  EXPECT_TRUE(j->result->ended_early());
}

// A worker whose first report of the probe's generation is a step past the
// horizon (one of its old timeline, sent late), or whose reports leave out
// judged steps, has shown nothing clean: the probe fails (inconclusive), it
// is not a replay without the spike (TRANSIENT).
TEST(ProbeJudgeTest, AReplayWhoseReportsSkipTheJudgedStepsIsNotClean) {
  auto far = Judge(998, 1010);
  far->Feed(Step(1015, Noise(1015)), absl::Now());
  ASSERT_TRUE(far->result.has_value());
  EXPECT_EQ(OutcomeOf(*far->result), ProbeOutcome::kFailed) << far->result->detail();
  EXPECT_THAT(far->result->detail(),
              ::testing::HasSubstr("skip 13 of the 13 judged steps [998, 1010]"));
  EXPECT_THAT(far->result->detail(), ::testing::HasSubstr("was step 1015"));

  auto gap = Judge(998, 1010);
  for (int64_t s = 900; s <= 1010; ++s) {
    if (s < 1001 || s > 1003) gap->Feed(Step(s, Noise(s)), absl::Now());
  }
  ASSERT_TRUE(gap->result.has_value());
  EXPECT_EQ(OutcomeOf(*gap->result), ProbeOutcome::kFailed) << gap->result->detail();
  EXPECT_THAT(gap->result->detail(), ::testing::HasSubstr("skip 3 of the 13"));

  // Ended early after every step it reached: what it saw stands.
  auto ended = Judge(998, 1010);
  for (int64_t s = 900; s <= 1004; ++s) ended->Feed(Step(s, Noise(s)), absl::Now());
  ended->ended_at = 1004;
  ended->EndEarly();
  ASSERT_TRUE(ended->result.has_value());
  EXPECT_EQ(OutcomeOf(*ended->result), ProbeOutcome::kClean) << ended->result->detail();
}

TEST(ProbeJudgeTest, RepeatedAndForeignStepsAreIgnored) {
  auto j = Judge(998, 1010);
  j->Feed(Step(900, Noise(900)), absl::Now());
  j->Feed(Step(900, Noise(900)), absl::Now());
  StepObservation other = Step(901, Noise(901));
  other.generation = 1;
  j->Feed(other, absl::Now());
  EXPECT_EQ(j->count, 1);
  EXPECT_EQ(j->last_fed, 900);
}

// ---- Bisection --------------------------------------------------------------

TEST(BisectionTest, ACulpritAtTheOnsetCostsTwoProbes) {
  const std::vector<int64_t> window = {998, 999, 1000, 1001};
  std::vector<std::pair<std::vector<int64_t>, bool>> tests;
  Bisection b = NextBisect(window, 1000, tests);
  ASSERT_TRUE(b.need.has_value());
  EXPECT_THAT(*b.need, ElementsAre(1000));  // the onset's own position first
  tests.emplace_back(*b.need, true);
  b = NextBisect(window, 1000, tests);
  ASSERT_TRUE(b.need.has_value());
  EXPECT_THAT(*b.need, ElementsAre(998, 999, 1001));  // the rest, without it
  tests.emplace_back(*b.need, false);
  b = NextBisect(window, 1000, tests);
  EXPECT_FALSE(b.need.has_value());
  EXPECT_THAT(b.culprits, ElementsAre(1000));
  EXPECT_FALSE(b.none_reproduced);
}

TEST(BisectionTest, NoBatchAloneReproduces) {
  const std::vector<int64_t> window = {10, 11};
  std::vector<std::pair<std::vector<int64_t>, bool>> tests = {{{10}, false}, {{11}, false}};
  const Bisection b = NextBisect(window, -1, tests);
  EXPECT_FALSE(b.need.has_value());
  EXPECT_TRUE(b.none_reproduced);
  EXPECT_TRUE(b.culprits.empty());
}

TEST(BisectionTest, RunsAndMerges) {
  using R = std::pair<int64_t, int64_t>;
  EXPECT_THAT(PositionRuns({3, 1, 2, 7, 2}), ElementsAre(R{1, 4}, R{7, 8}));
  EXPECT_THAT(MergeRanges({{5, 8}, {1, 3}, {3, 4}, {7, 10}}), ElementsAre(R{1, 4}, R{5, 10}));
}

// ---- The fix ladder ---------------------------------------------------------

TEST(FixLadderTest, RungsAreCumulative) {
  const v1::FixPolicy fix = DefaultPolicy().fix();
  const v1::HParams one = RungHParams(fix, 1);
  EXPECT_TRUE(one.has_lr_scale());
  EXPECT_FALSE(one.has_clip_norm());
  EXPECT_FALSE(one.has_beta2());
  const v1::HParams two = RungHParams(fix, 2);
  EXPECT_EQ(two.lr_scale(), fix.lr_factor());
  EXPECT_EQ(two.clip_norm(), fix.tight_clip_norm());
  EXPECT_EQ(two.extra_warmup_steps(), fix.extra_warmup_steps());
  EXPECT_FALSE(two.has_beta2());
  const v1::HParams three = RungHParams(fix, 3);
  EXPECT_EQ(three.beta2(), fix.beta2());
  EXPECT_EQ(three.eps(), fix.eps());
  EXPECT_EQ(three.lr_scale(), fix.lr_factor());
}

TEST(FixLadderTest, HParamsAndAdviceRead) {
  v1::HParams h;
  h.set_lr_scale(0.5);
  h.set_clip_norm(0.25);
  EXPECT_EQ(HParamsString(h), "lr×0.5, clip 0.25");
  EXPECT_EQ(HParamsString(v1::HParams()), "");
  EXPECT_EQ(FragilityRecommendations("max_attn_logit", "").front(), "qk-norm (for the next run)");
  EXPECT_THAT(FragilityRecommendations("", "lse_max")[0], HasSubstr("z-loss"));
  EXPECT_EQ(FragilityRecommendations("grad_norm", "").size(), 3u);
}

// ---- Plans ------------------------------------------------------------------

TEST(PlanProtoTest, AnEmptyPlanIsTheWholeStream) {
  const v1::DataPlan empty;
  EXPECT_EQ(PositionOfStep(empty, 1234), 1234);
  EXPECT_EQ(StepOfPosition(empty, 1234), 1234);
  EXPECT_EQ(PlanText(empty), "[0,∞)");
  absl::StatusOr<storage::DataPlan> p = PlanFromProto(empty);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, storage::DataPlan::Default());
}

TEST(PlanProtoTest, HolesShiftLaterStepsAndPrint) {
  absl::StatusOr<v1::DataPlan> plan = PlanWithHoles(v1::DataPlan(), {{600, 610}, {700, 701}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(PlanText(*plan), "[0,600) [610,700) [701,∞)");
  EXPECT_EQ(PositionOfStep(*plan, 600), 610);
  EXPECT_EQ(StepOfPosition(*plan, 605), -1);  // never fed
  EXPECT_EQ(StepOfPosition(*plan, 701), 690);
  v1::DataPlan masked = *plan;
  v1::SampleMask* m = masked.add_masks();
  m->set_position(300);
  m->add_slots(0);
  m->add_slots(2);
  EXPECT_EQ(PlanText(masked), "[0,600) [610,700) [701,∞) (batch 300 without sample(s) 0,2)");
  absl::StatusOr<storage::DataPlan> back = PlanFromProto(masked);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToString(), "0-600,610-700,701-;drop=300:0.2");
  EXPECT_EQ(PlanToProto(*back).SerializeAsString(), masked.SerializeAsString());
}

TEST(PlanProtoTest, AnInvalidPlanIsRefused) {
  v1::DataPlan bad;
  v1::DataRange* r = bad.add_ranges();
  r->set_begin(10);
  r->set_end(5);
  EXPECT_EQ(PlanFromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PositionOfStep(bad, 0), -1);
}

}  // namespace
}  // namespace spikeguard::incident
