#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "daemon/detect/eval/baselines.h"
#include "daemon/detect/eval/detectors.h"
#include "daemon/detect/eval/scoring.h"
#include "daemon/detect/eval/trace_gen.h"
#include "daemon/detect/eval/trace_io.h"
#include "daemon/detect/eval/wild_corpus.h"
#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/detect_trace_test_" + name;
}

TEST(TraceGenTest, DeterministicPerSeedAndDifferentAcrossSeeds) {
  const auto a = GenerateTrace({Scenario::kSharpSpikes, 5, 3000, 4});
  const auto b = GenerateTrace({Scenario::kSharpSpikes, 5, 3000, 4});
  const auto c = GenerateTrace({Scenario::kSharpSpikes, 6, 3000, 4});
  ASSERT_EQ(a.steps.size(), 3000u);
  for (size_t i = 0; i < a.steps.size(); ++i) {
    ASSERT_EQ(a.steps[i].loss, b.steps[i].loss) << i;
    ASSERT_EQ(a.steps[i].layers[3].max_attn_logit, b.steps[i].layers[3].max_attn_logit);
  }
  ASSERT_EQ(a.labels.size(), b.labels.size());
  EXPECT_NE(a.steps[1000].loss, c.steps[1000].loss);
}

TEST(TraceGenTest, SharpSpikesRecoverWithinThirtySteps) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const auto t = GenerateTrace({Scenario::kSharpSpikes, seed, 5000, 2});
    ASSERT_GE(t.labels.size(), 3u);
    for (const Label& l : t.labels) {
      EXPECT_EQ(l.kind, Label::kSpike);
      EXPECT_LE(l.onset, l.peak);
      EXPECT_GE(l.end - l.peak, 5);
      EXPECT_LE(l.end - l.peak, 30);
      // The peak stands well above its neighbourhood.
      EXPECT_GT(t.steps[l.peak].loss, 1.1 * t.steps[l.onset - 20].loss);
    }
  }
}

TEST(TraceGenTest, GradBlowupFollowsTheIssueSequence) {
  const auto t = GenerateTrace({Scenario::kGradBlowup, 3, 3000, 4});
  for (const Label& l : t.labels) {
    if (l.kind == Label::kPrecursor) continue;
    const int64_t p = l.peak;
    const double base = t.steps[p - 5].grad_norm;
    // ×4, ×10, ×67, ×600, ×4000 up to the healthy noise of each step.
    EXPECT_GT(t.steps[p - 3].grad_norm / base, 3);
    EXPECT_GT(t.steps[p - 1].grad_norm / base, 150);
    EXPECT_GT(t.steps[p].grad_norm / base, 1000);
    EXPECT_GT(t.steps[p].loss, 1.4 * t.steps[p - 20].loss);
  }
}

TEST(WildCorpusTest, DeterministicSplitsAreDisjointAndCoverEveryFamily) {
  const auto a = WildCorpus(CorpusSplit::kHeldOut, 0.2);
  const auto b = WildCorpus(CorpusSplit::kHeldOut, 0.2);
  const auto tuning = WildCorpus(CorpusSplit::kTuning, 0.2);
  ASSERT_EQ(a.size(), b.size());
  std::map<std::string, int> families;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name);
    ASSERT_EQ(a[i].steps.size(), b[i].steps.size());
    for (size_t s = 0; s < a[i].steps.size(); s += 97) {
      if (std::isnan(a[i].steps[s].loss)) continue;
      ASSERT_EQ(a[i].steps[s].loss, b[i].steps[s].loss) << a[i].name << " " << s;
    }
    ++families[a[i].name.substr(0, a[i].name.rfind('-'))];
    for (const auto& t : tuning) EXPECT_NE(t.name, a[i].name);
  }
  EXPECT_EQ(families.size(), AllWildFamilies().size());
}

TEST(WildCorpusTest, FamiliesCarryWhatTheyPromise) {
  for (uint64_t seed : {1, 2, 3, 4}) {
    // Slow builds: a precursor label that starts hundreds of steps before
    // the event it announces, and the event label.
    for (WildFamily f : {WildFamily::kGradDivergence, WildFamily::kRatioDivergence,
                         WildFamily::kAttnGrowth, WildFamily::kLseDrift}) {
      const LabeledTrace t = GenerateWildTrace({f, seed, 6000, 4});
      int events = 0, precursors = 0;
      for (const Label& l : t.labels) {
        if (l.kind == Label::kPrecursor) {
          ++precursors;
          EXPECT_GE(l.peak - l.onset, 150) << t.name;
        } else {
          ++events;
        }
      }
      EXPECT_EQ(events, 1) << t.name;
      EXPECT_GE(precursors, 1) << t.name;
    }
    // Healthy families carry no labels; spikes recover within 100 steps.
    for (WildFamily f : {WildFamily::kNoisyHealthy, WildFamily::kLevelShifts, WildFamily::kBatchRamp}) {
      EXPECT_TRUE(GenerateWildTrace({f, seed, 3000, 2}).labels.empty());
    }
    const LabeledTrace sp = GenerateWildTrace({WildFamily::kIrregularSpikes, seed, 6000, 4});
    ASSERT_GE(sp.labels.size(), 2u);
    for (const Label& l : sp.labels) {
      EXPECT_EQ(l.kind, Label::kSpike);
      EXPECT_LE(l.end - l.peak, 100);
      EXPECT_GT(sp.steps[l.peak].loss, 1.1 * sp.steps[l.onset - 20].loss) << sp.name;
    }
  }
}

TEST(TraceIoTest, JsonlRoundTripKeepsNonFiniteValuesAndLayers) {
  const auto t = GenerateTrace({Scenario::kNanBurst, 2, 2500, 3});
  const std::string path = TempPath("roundtrip.jsonl");
  ASSERT_TRUE(WriteTraceJsonl(path, t.steps).ok());
  auto back = ReadTraceJsonl(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), t.steps.size());
  int nan_steps = 0;
  for (size_t i = 0; i < t.steps.size(); ++i) {
    const StepSample& a = t.steps[i];
    const StepSample& b = (*back)[i];
    ASSERT_EQ(a.step, b.step);
    if (std::isnan(a.loss)) {
      ++nan_steps;
      EXPECT_TRUE(std::isnan(b.loss));
      EXPECT_TRUE(std::isinf(b.grad_norm));
      EXPECT_EQ(a.nonfinite, b.nonfinite);
    } else {
      EXPECT_EQ(a.loss, b.loss);
    }
    ASSERT_EQ(b.layers.size(), 3u);
    EXPECT_EQ(a.layers[2].update_ratio, b.layers[2].update_ratio);
  }
  EXPECT_GT(nan_steps, 0);
  std::remove(path.c_str());
}

TEST(TraceIoTest, JsonlRoundTripKeepsPerDomainLosses) {
  // The domain_spikes family carries per-domain losses; a trace file keeps
  // them (domain_losses in proto JSON), so spikeguard-detect sees them too.
  const auto t = GenerateWildTrace({WildFamily::kDomainSpikes, 900001, 1500, 2});
  ASSERT_GE(t.steps[10].domains.size(), 3u);
  const std::string path = TempPath("domains.jsonl");
  ASSERT_TRUE(WriteTraceJsonl(path, t.steps).ok());
  auto back = ReadTraceJsonl(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), t.steps.size());
  for (size_t i = 0; i < t.steps.size(); ++i) {
    const auto& a = t.steps[i].domains;
    const auto& b = (*back)[i].domains;
    ASSERT_EQ(a.size(), b.size()) << i;
    for (size_t d = 0; d < a.size(); ++d) {
      EXPECT_EQ(a[d].domain, b[d].domain);
      EXPECT_EQ(a[d].loss, b[d].loss);
      EXPECT_EQ(a[d].tokens, b[d].tokens);
    }
  }
  // The run loss is the token-weighted mean of the domains'.
  double sum = 0;
  int64_t tokens = 0;
  for (const DomainSample& d : t.steps[10].domains) {
    sum += d.loss * static_cast<double>(d.tokens);
    tokens += d.tokens;
  }
  EXPECT_NEAR(sum / static_cast<double>(tokens), t.steps[10].loss, 1e-3 * t.steps[10].loss);
  // Families without per-domain losses write none.
  EXPECT_TRUE(GenerateWildTrace({WildFamily::kNoisyHealthy, 1000, 200, 2}).steps[5].domains.empty());
  std::remove(path.c_str());
}

TEST(TraceIoTest, ReadsWorkerStyleLinesAndLetsALaterTimelineWin) {
  // What spikeguard-worker --telemetry-out writes (proto field names, all
  // fields), including a resumed run appended to the same file.
  const std::string text =
      "{\"step\":\"0\",\"loss\":5.5,\"grad_norm\":1.2,\"layers\":[{\"layer\":1,\"max_attn_logit\":12}]}\n"
      "{\"step\":\"1\",\"loss\":5.4,\"grad_norm\":1.1}\n"
      "{\"step\":\"2\",\"loss\":\"NaN\",\"grad_norm\":\"Infinity\",\"nonfinite_count\":\"4\"}\n"
      "\n"
      "{\"step\":\"1\",\"loss\":5.3,\"grad_norm\":1.0}\n";
  auto steps = ParseTraceJsonl(text);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].layers.size(), 2u);
  EXPECT_EQ((*steps)[0].layers[1].max_attn_logit, 12);
  EXPECT_EQ((*steps)[1].step, 1);
  EXPECT_EQ((*steps)[1].loss, 5.3);
}

TEST(TraceIoTest, BadLineIsNamed) {
  auto steps = ParseTraceJsonl("{\"step\":\"0\",\"loss\":1}\nnot json\n");
  ASSERT_FALSE(steps.ok());
  EXPECT_EQ(steps.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(steps.status().message().find("line 2"), std::string::npos);
  EXPECT_EQ(ReadTraceJsonl("/nonexistent/trace.jsonl").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TraceIoTest, ReadsPythonJsonDumpsBareNonFiniteTokens) {
  // json.dumps({"loss": float("nan"), ...}) writes bare NaN / Infinity /
  // -Infinity; one such line used to reject the whole file. A string that
  // merely contains the word stays a string.
  const std::string text =
      "{\"step\": 0, \"loss\": 2.5, \"grad_norm\": 0.3}\n"
      "{\"step\": 1, \"loss\": NaN, \"grad_norm\": Infinity, \"layers\": [{\"layer\": 1, "
      "\"max_attn_logit\": -Infinity}]}\n"
      "{\"step\": 2, \"loss\": 2.4, \"grad_norm\": 0.3, \"domain_losses\": [{\"domain\": "
      "\"NaN Infinity\", \"loss\": NaN}]}\n";
  auto steps = ParseTraceJsonl(text);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 3u);
  EXPECT_TRUE(std::isnan((*steps)[1].loss));
  EXPECT_TRUE(std::isinf((*steps)[1].grad_norm) && (*steps)[1].grad_norm > 0);
  ASSERT_EQ((*steps)[1].layers.size(), 2u);
  EXPECT_TRUE(std::isinf((*steps)[1].layers[1].max_attn_logit) &&
              (*steps)[1].layers[1].max_attn_logit < 0);
  EXPECT_EQ((*steps)[2].loss, 2.4);
  // Still no JSON for anything else that is not JSON.
  EXPECT_FALSE(ParseTraceJsonl("{\"step\": 0, \"loss\": nan}\n").ok());
  EXPECT_FALSE(ParseTraceJsonl("{\"step\": 0, \"loss\": NaNa}\n").ok());
}

TEST(TraceIoTest, ReadsThePyTorchTrainersTelemetryLines) {
  // worker/examples/torch_gpt/train.py --telemetry-out writes each
  // StepReport with three annotations beside it (its rank, its generation,
  // how max_attn_logit was measured); they used to reject the whole file.
  const std::string text =
      "{\"step\": \"0\", \"loss\": 5.5, \"grad_norm\": 2.6, \"domain_losses\": [{\"domain\": "
      "\"code\", \"loss\": 5.4, \"tokens\": \"256\"}], \"layers\": [{\"layer\": 0, "
      "\"max_attn_logit\": 0.13}], \"max_attn_logit_kind\": \"explicit\", \"rank\": 0, "
      "\"generation\": 0}\n";
  auto steps = ParseTraceJsonl(text);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ((*steps)[0].loss, 5.5);
  ASSERT_EQ((*steps)[0].domains.size(), 1u);
  EXPECT_EQ((*steps)[0].domains[0].domain, "code");
  EXPECT_EQ((*steps)[0].domains[0].tokens, 256);
  EXPECT_EQ((*steps)[0].layers[0].max_attn_logit, 0.13);
  // Only at the top level, and only those three names.
  auto nested = ParseTraceJsonl(
      "{\"step\": 0, \"loss\": 1, \"layers\": [{\"layer\": 0, \"rank\": 1}]}\n");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("layers[0].rank"), std::string::npos)
      << nested.status();
  auto other = ParseTraceJsonl("{\"step\": 0, \"loss\": 1, \"rank_id\": 0}\n");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("rank_id"), std::string::npos);
}

TEST(TraceIoTest, UnknownFieldAndIndexlessLayerAreErrorsNamingLineAndField) {
  auto unknown = ParseTraceJsonl(
      "{\"step\":0,\"loss\":1}\n{\"step\":1,\"loss\":1,\"train_loss\":2}\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("line 2"), std::string::npos) << unknown.status();
  EXPECT_NE(unknown.status().message().find("\"train_loss\""), std::string::npos)
      << unknown.status();
  // Unknown inside a layer is named with its path.
  auto nested = ParseTraceJsonl(
      "{\"step\":0,\"loss\":1,\"layers\":[{\"layer\":0,\"max_attn\":3}]}\n");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("layers[0].max_attn"), std::string::npos)
      << nested.status();
  // Two layers without an index used to collapse into layer 0.
  auto indexless = ParseTraceJsonl(
      "{\"step\":0,\"loss\":1}\n\n{\"step\":1,\"loss\":1,\"layers\":[{\"layer\":0,"
      "\"max_attn_logit\":3},{\"max_attn_logit\":900}]}\n");
  ASSERT_FALSE(indexless.ok());
  EXPECT_NE(indexless.status().message().find("line 3"), std::string::npos) << indexless.status();
  EXPECT_NE(indexless.status().message().find("layers[1]"), std::string::npos)
      << indexless.status();
  EXPECT_NE(indexless.status().message().find("\"layer\" index"), std::string::npos);
  auto twice = ParseTraceJsonl(
      "{\"step\":0,\"loss\":1,\"layers\":[{\"layer\":2},{\"layer\":2}]}\n");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("layer 2 appears twice"), std::string::npos);
  // The camelCase JSON names proto JSON also allows are fields, not unknown.
  EXPECT_TRUE(ParseTraceJsonl("{\"step\":0,\"loss\":1,\"gradNorm\":2,\"lseMean\":3}\n").ok());
}

TEST(TraceIoTest, ReadsWandbAndTensorboardStyleCsv) {
  // W&B: quoted headers "RUN - metric" with __MIN/__MAX companions, empty
  // cells where a metric was not logged; per-layer columns with an index.
  const std::string wandb =
      "\"Step\",\"run-7 - train/loss\",\"run-7 - train/loss__MIN\",\"run-7 - train/loss__MAX\","
      "\"run-7 - grad_norm\",\"layers/1/max_attn_logit\",\"layer0.update_ratio\",\"lr\"\r\n"
      "10,2.50,2.4,2.6,0.30,21,1e-3,0.001\r\n"
      "11,2.45,,,,22,,0.001\r\n"
      "\r\n"
      "12,nan,,,inf,23,1.1e-3,\r\n";
  auto steps = ParseTrace(wandb);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 3u);
  EXPECT_EQ((*steps)[0].step, 10);
  EXPECT_EQ((*steps)[0].loss, 2.50);
  EXPECT_EQ((*steps)[1].loss, 2.45);
  EXPECT_EQ((*steps)[1].grad_norm, 0.30);  // not logged: the last value
  ASSERT_EQ((*steps)[1].layers.size(), 2u);
  EXPECT_EQ((*steps)[1].layers[1].max_attn_logit, 22);
  EXPECT_EQ((*steps)[1].layers[0].update_ratio, 1e-3);
  EXPECT_TRUE(std::isnan((*steps)[2].loss));
  EXPECT_TRUE(std::isinf((*steps)[2].grad_norm));
  // TensorBoard: Wall time, Step, then the metric named after its tag.
  auto tb = ParseTraceCsv("Wall time,Step,loss\n1.7e9,0,3.0\n1.7e9,1,2.9\n");
  ASSERT_TRUE(tb.ok()) << tb.status();
  ASSERT_EQ(tb->size(), 2u);
  EXPECT_EQ((*tb)[1].step, 1);
  EXPECT_EQ((*tb)[1].loss, 2.9);
}

TEST(TraceIoTest, HostileCsvIsRefusedWithLineAndField) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"step,loss,max_attn_logit\n0,1,2\n", "has no layer index"},
      {"step,loss,layers/max_attn_logit\n0,1,2\n", "has no layer index"},
      {"step,loss,accuracy\n0,1,2\n", "unknown field \"accuracy\""},
      {"loss,grad_norm\n1,2\n", "no step column"},
      {"step,grad_norm\n1,2\n", "no loss column"},
      {"step,loss\n0,1\n1,2,3\n", "line 3"},
      {"step,loss\n0,abc\n", "line 2, field \"abc\""},
      {"step,loss\n0.5,1\n", "not a step number"},
      {"step,loss\n-3,1\n", "not a step number"},
      {"step,loss\n1e300,1\n", "not a step number"},
      {"\"step,loss\n0,1\n", "unterminated"},
      {"step,loss,loss\n0,1,1\n", "second loss column"},
  };
  for (const Case& c : cases) {
    auto r = ParseTraceCsv(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.text << " -> " << r.status();
  }
}

TEST(TraceIoTest, LabelsRoundTripAndValidation) {
  const auto t = GenerateTrace({Scenario::kFragility, 4, 4000, 4});
  auto back = LabelsFromJson(LabelsToJson(t.name, 4000, t.labels));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), t.labels.size());
  for (size_t i = 0; i < back->size(); ++i) {
    EXPECT_EQ((*back)[i].kind, t.labels[i].kind);
    EXPECT_EQ((*back)[i].onset, t.labels[i].onset);
    EXPECT_EQ((*back)[i].peak, t.labels[i].peak);
    EXPECT_EQ((*back)[i].end, t.labels[i].end);
    EXPECT_EQ((*back)[i].layer, t.labels[i].layer);
  }
  EXPECT_FALSE(LabelsFromJson("{\"labels\":[{\"kind\":\"blip\",\"onset\":3}]}").ok());
  EXPECT_FALSE(LabelsFromJson("{\"labels\":[{\"kind\":\"spike\"}]}").ok());
  EXPECT_FALSE(LabelsFromJson("[1,2]").ok());
  // peak and end default to the onset.
  auto minimal = LabelsFromJson("{\"labels\":[{\"kind\":\"spike\",\"onset\":30}]}");
  ASSERT_TRUE(minimal.ok());
  EXPECT_EQ((*minimal)[0].end, 30);
}

Alarm At(int64_t step, std::string kind = "loss_spike") {
  Alarm a;
  a.step = a.start_step = step;
  a.kind = std::move(kind);
  a.signal = "loss";
  return a;
}

TEST(ScoringTest, MatchingWindowDuplicatesAndFalseAlarms) {
  const std::vector<Label> labels = {{Label::kSpike, 100, 102, 130, "loss", -1},
                                     {Label::kSpike, 500, 500, 520, "loss", -1}};
  MatchRule rule;  // [onset − 10, peak + 5], duplicates to end + 5
  // 90: first step of label 1's window (lead 12). 95: duplicate. 125:
  // duplicate (recovering). 136: false. 480: false (before 490). 505: hit at
  // the last step of label 2's window.
  const std::vector<Alarm> alarms = {At(90), At(95), At(125), At(136), At(480), At(505)};
  ScoreCounts c = ScoreTrace(alarms, labels, 10000, rule);
  EXPECT_EQ(c.labels, 2);
  EXPECT_EQ(c.detected, 2);
  EXPECT_EQ(c.duplicates, 2);
  EXPECT_EQ(c.false_alarms, 2);
  ASSERT_EQ(c.leads.size(), 2u);
  EXPECT_EQ(c.leads[0], 12);
  EXPECT_EQ(c.leads[1], -5);
  DetectorScore s = Summarize("x", c);
  EXPECT_DOUBLE_EQ(s.precision, 0.5);
  EXPECT_DOUBLE_EQ(s.recall, 1.0);
  EXPECT_NEAR(s.f1, 2.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(s.false_alarms_per_10k, 2.0);
  EXPECT_DOUBLE_EQ(s.median_lead, 3.5);
}

TEST(ScoringTest, UnscoredAlarmsAndPrecursors) {
  const std::vector<Label> labels = {{Label::kSpike, 1000, 1002, 1020, "loss", -1},
                                     {Label::kPrecursor, 700, 1002, 1002, "max_attn_logit", 2}};
  Alarm pre = At(760, "precursor");
  pre.signal = "max_attn_logit";
  pre.layer = 2;
  pre.start_step = 703;
  Alarm wrong_layer = pre;
  wrong_layer.layer = 1;
  wrong_layer.step = 5000;
  Alarm info = At(3000, "spike_recovered");
  info.scored = false;
  ScoreCounts c = ScoreTrace({pre, wrong_layer, info, At(1001)}, labels, 8000);
  EXPECT_EQ(c.detected, 1);
  EXPECT_EQ(c.false_alarms, 0);
  EXPECT_EQ(c.precursors_detected, 1);
  ASSERT_EQ(c.start_errors.size(), 1u);
  EXPECT_EQ(c.start_errors[0], 3);
  EXPECT_EQ(c.false_warnings, 1);
}

TEST(DetectorsTest, EveryDetectorRunsAndUnknownIsRejected) {
  const auto t = GenerateTrace({Scenario::kNanBurst, 8, 3000, 2});
  for (const std::string& d : DetectorNames()) {
    auto alarms = RunDetector(d, t.steps);
    ASSERT_TRUE(alarms.ok()) << d;
    // Every detector gets the non-finite alarm, once per burst.
    int nf = 0;
    for (const Alarm& a : *alarms) nf += a.kind == "nonfinite";
    EXPECT_EQ(nf, static_cast<int>(t.labels.size())) << d;
  }
  EXPECT_EQ(RunDetector("nope", t.steps).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DetectorsTest, SpikeguardBeatsTheBaselinesOnASmallCorpus) {
  // The benchmark's claim, at a size a unit test can afford: spikeguard's
  // F1 is the best and it raises no more false alarms than any baseline.
  const auto corpus = BenchmarkCorpus(/*seed=*/3, /*scale=*/0.25);
  std::map<std::string, ScoreCounts> counts;
  for (const auto& t : corpus) {
    for (const std::string& d : DetectorNames()) {
      auto alarms = RunDetector(d, t.steps);
      ASSERT_TRUE(alarms.ok());
      counts[d].Add(ScoreTrace(*alarms, t.labels, static_cast<int64_t>(t.steps.size())));
    }
  }
  const DetectorScore sg = Summarize("spikeguard", counts["spikeguard"]);
  EXPECT_GT(sg.counts.labels, 10);
  for (std::string_view b : kBaselineNames) {
    const DetectorScore s = Summarize(std::string(b), counts[std::string(b)]);
    EXPECT_GT(sg.f1, s.f1) << b;
    EXPECT_LE(sg.counts.false_alarms, s.counts.false_alarms) << b;
  }
}

}  // namespace
// Found by tests/fuzz/trace_fuzz (UBSan: float-cast-overflow): label numbers
// that no integer holds are refused, naming the label and field.
TEST(TraceIoTest, LabelNumbersOutOfRangeAreRefused) {
  for (const char* json : {R"({"labels":[{"kind":"spike","onset":1e300}]})",
                           R"({"labels":[{"kind":"spike","onset":1,"layer":1e10}]})",
                           R"({"labels":[{"kind":"spike","onset":1,"end":-1e19}]})"}) {
    auto labels = LabelsFromJson(json);
    ASSERT_FALSE(labels.ok()) << json;
    EXPECT_EQ(labels.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(labels.status().message().find("labels[0]."), std::string::npos) << labels.status();
  }
}

}  // namespace spikeguard::detect
