// Table and JSON output of spikectl for representative daemon answers.
#include "cli/format.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "cli/table.h"
#include "cli/telemetry_metrics.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace spikeguard::cli {
namespace {

namespace v1 = ::spikeguard::v1;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

template <typename T>
T ParseText(const std::string& text) {
  T message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// Whitespace-separated cells of a table line.
std::vector<std::string> Cells(const std::string& line) {
  return absl::StrSplit(line, ' ', absl::SkipEmpty());
}

bool EqualWithNaN(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  return differencer.Compare(a, b);
}

v1::QueryTelemetryResponse SpikeTelemetry() {
  return ParseText<v1::QueryTelemetryResponse>(R"pb(
    records {
      generation: 2 step: 600 ranks_reported: 8 loss: 1.9 grad_norm: 0.7 lr: 0.001
      clipped: false lse_max: 12.5 nonfinite_count: 0 step_time_s: 0.25
      data_position: 600 tokens: 8192 loss_hash: 0xdeadbeef
      layers { layer: 0 max_attn_logit: 40 update_ratio: 0.001 }
      layers { layer: 1 max_attn_logit: 5100 update_ratio: 0.002 }
    }
    records {
      generation: 2 step: 601 ranks_reported: 8 loss: nan grad_norm: inf lr: 0.001
      clipped: true lse_max: -inf nonfinite_count: 3 step_time_s: 0.26
      layers { layer: 0 max_attn_logit: 41 }
      layers { layer: 1 max_attn_logit: nan }
    }
  )pb");
}

TEST(FormatDoubleTest, NonFiniteValuesReadAsNanAndInf) {
  EXPECT_EQ(FormatDouble(kNaN), "nan");
  EXPECT_EQ(FormatDouble(-kNaN), "nan");
  EXPECT_EQ(FormatDouble(kInf), "inf");
  EXPECT_EQ(FormatDouble(-kInf), "-inf");
  EXPECT_EQ(FormatDouble(2.5), "2.5");
  EXPECT_EQ(FormatDouble(3e-4), "0.0003");
  EXPECT_EQ(FormatDouble(77000), "77000");
}

TEST(TableTest, PadsColumnsRightAlignsNumbersAndLeavesNoTrailingSpaces) {
  Table t({"NAME", "STEPS", "NOTE"});
  t.AlignRight(1);
  t.AddRow({"a", "5", ""});
  t.AddRow({"longer-name", "12345", "x"});
  EXPECT_EQ(t.Render(),
            "NAME         STEPS  NOTE\n"
            "a                5\n"
            "longer-name  12345  x\n");
}

TEST(TableTest, KeyValueBlockAlignsValues) {
  KeyValueBlock b;
  b.Add("run", "r1");
  b.Add("world size", "8");
  EXPECT_EQ(b.Render(), "run:         r1\nworld size:  8\n");
}

TEST(TableTest, TimesAreUtcAndUnsetIsADash) {
  EXPECT_EQ(FormatUnixMillis(0), "-");
  EXPECT_EQ(FormatUnixMillis(1'700'000'000'123), "2023-11-14 22:13:20");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3LL << 30), "3.0 GiB");
}

TEST(TelemetryMetricTest, AcceptsTheDocumentedNamesAndRejectsOthers) {
  for (const char* name : {"loss", "grad_norm", "lr", "clipped", "lse_max", "lse_mean",
                           "nonfinite", "max_attn_logit", "step_time_s", "data_position", "tokens",
                           "loss_hash", "update_ratio", "act_rms", "param_norm", "loss_scale",
                           "layer0.max_attn_logit", "layer31.grad_norm", "layer7.act_rms"}) {
    EXPECT_TRUE(TelemetryMetric::Parse(name).ok()) << name;
  }
  for (const char* name : {"", "Loss", "layer.max_attn_logit", "layer-1.act_rms", "layer1",
                           "layer1.", "layer1.loss", "layer+1.act_rms", "nonfinite_count"}) {
    absl::StatusOr<TelemetryMetric> metric = TelemetryMetric::Parse(name);
    ASSERT_FALSE(metric.ok()) << name;
    EXPECT_EQ(metric.status().message(), std::string("unknown metric '") + name + "'");
  }
}

TEST(TelemetryMetricTest, RequestNamesStepRecordFieldsOnce) {
  auto metrics = ParseTelemetryMetrics(std::vector<std::string>{
      "loss", "nonfinite", "max_attn_logit", "layer3.max_attn_logit", "layer3.act_rms",
      "layer2.grad_norm", "grad_norm", "loss"});
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(RequestFields(*metrics),
            (std::vector<std::string>{"loss", "nonfinite_count", "max_attn_logit", "act_rms",
                                      "layers", "grad_norm"}));
}

TEST(FormatTelemetryTest, DefaultColumnsShowNonFiniteValuesAndLayerMaxima) {
  auto metrics = ParseTelemetryMetrics(DefaultTelemetryMetrics());
  ASSERT_TRUE(metrics.ok());
  std::vector<std::string> lines = Lines(FormatTelemetry(SpikeTelemetry(), *metrics));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(Cells(lines[0]),
            (std::vector<std::string>{"STEP", "GEN", "RANKS", "loss", "grad_norm", "lr", "clipped",
                                      "lse_max", "nonfinite", "max_attn_logit", "step_time_s"}));
  EXPECT_EQ(Cells(lines[1]), (std::vector<std::string>{"600", "2", "8", "1.9", "0.7", "0.001",
                                                       "no", "12.5", "0", "5100", "0.25"}));
  // A NaN in any layer is the news: the max over layers keeps it.
  EXPECT_EQ(Cells(lines[2]), (std::vector<std::string>{"601", "2", "8", "nan", "inf", "0.001",
                                                       "yes", "-inf", "3", "nan", "0.26"}));
  // Columns line up: every line is as long as the header, numbers right-aligned.
  EXPECT_EQ(lines[1].size(), lines[0].size());
  EXPECT_EQ(lines[2].size(), lines[0].size());
}

TEST(FormatTelemetryTest, LayerColumnsAndMissingLayers) {
  auto metrics = ParseTelemetryMetrics(std::vector<std::string>{
      "layer1.max_attn_logit", "layer9.max_attn_logit", "update_ratio", "loss_hash", "tokens"});
  ASSERT_TRUE(metrics.ok());
  std::vector<std::string> lines = Lines(FormatTelemetry(SpikeTelemetry(), *metrics));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(Cells(lines[1]),
            (std::vector<std::string>{"600", "2", "8", "5100", "-", "0.002", "00000000deadbeef",
                                      "8192"}));
  EXPECT_EQ(Cells(lines[2])[3], "nan");
}

TEST(FormatTelemetryTest, SaysWhenTheLimitCutTheResult) {
  v1::QueryTelemetryResponse response = SpikeTelemetry();
  auto metrics = ParseTelemetryMetrics(std::vector<std::string>{"loss"});
  EXPECT_THAT(FormatTelemetry(response, *metrics), Not(HasSubstr("truncated")));
  response.set_truncated(true);
  EXPECT_THAT(FormatTelemetry(response, *metrics), HasSubstr("truncated after 2 records"));
}

TEST(JsonTest, OneLineWithProtoFieldNamesAndZeroFields) {
  const std::string json = ToJson(SpikeTelemetry());
  EXPECT_EQ(json.find('\n'), std::string::npos);
  EXPECT_THAT(json, HasSubstr("\"ranks_reported\":8"));
  EXPECT_THAT(json, HasSubstr("\"nonfinite_count\":\"0\""));  // int64 zero still printed
  EXPECT_THAT(json, HasSubstr("\"truncated\":false"));
  EXPECT_THAT(json, HasSubstr("\"loss\":\"NaN\""));
  EXPECT_THAT(json, HasSubstr("\"grad_norm\":\"Infinity\""));
  EXPECT_THAT(json, Not(HasSubstr("ranksReported")));
}

TEST(JsonTest, ParsesBackToTheSameProto) {
  const v1::QueryTelemetryResponse telemetry = SpikeTelemetry();
  v1::QueryTelemetryResponse telemetry_back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ToJson(telemetry), &telemetry_back).ok());
  EXPECT_TRUE(EqualWithNaN(telemetry, telemetry_back));
  EXPECT_TRUE(std::isnan(telemetry_back.records(1).loss()));
  EXPECT_EQ(telemetry_back.records(1).grad_norm(), kInf);

  const auto incident = ParseText<v1::Incident>(R"pb(
    id: 7 run: "r1" state: CLOSED verdict: DATA confidence: 0.9 trigger: "loss_spike"
    probes { kind: "replay" generation: 3 data_plan { ranges { begin: 0 end: -1 } } outcome: "spiked" }
    recommendations: "z-loss 1e-4"
    cost { probes: 2 steps_reexecuted: 400 gpu_hours: 1.5 }
  )pb");
  v1::Incident incident_back;
  const std::string json = ToJson(incident);
  EXPECT_THAT(json, HasSubstr("\"state\":\"CLOSED\""));
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &incident_back).ok());
  EXPECT_TRUE(EqualWithNaN(incident, incident_back)) << json;
}

TEST(FormatRunTest, ShowsRanksWithLastStepAndLastSeenAndGenerations) {
  const auto run = ParseText<v1::Run>(R"pb(
    name: "gpt-small" id: 3 mode: MODE_PROPOSE world_size: 2 current_generation: 2
    state: RUN_RUNNING last_step: 812 created_unix_ms: 1700000000000
    ranks { rank: 0 connected: true last_step: 812 last_seen_unix_ms: 1700000100000 host: "node-a" generation: 2 }
    ranks { rank: 1 connected: false last_step: 640 last_seen_unix_ms: 1700000050000 host: "node-b" generation: 1 }
    generations { generation: 1 parent: -1 created_unix_ms: 1700000000000 reason: "start" }
    generations {
      generation: 2 parent: 1 from_checkpoint_step: 400 reason: "rewind by operator"
      data_plan { ranges { begin: 0 end: 598 } ranges { begin: 604 end: -1 } }
      hparams { lr_scale: 0.7 }
    }
  )pb");
  const std::string text = FormatRun(run);
  EXPECT_THAT(text, HasSubstr("state:       running"));
  EXPECT_THAT(text, HasSubstr("mode:        propose"));
  EXPECT_THAT(text, ContainsRegex("1 +node-b +no +1 +640 +2023-11-14 22:14:10"));
  EXPECT_THAT(text, ContainsRegex("0 +node-a +yes +2 +812 +2023-11-14 22:15:00"));
  EXPECT_THAT(text, ContainsRegex("1 +- +0 +\\[0,inf\\) +- +2023-11-14 22:13:20 +start"));
  EXPECT_THAT(text, ContainsRegex(
                        R"(2 +1 +400 +\[0,598\) \[604,inf\) +lr_scale=0.7 +- +rewind by operator)"));
}

TEST(FormatIncidentTest, ShowsEvidenceDocumentsFixRecommendationsAndCost) {
  const auto incident = ParseText<v1::Incident>(R"pb(
    id: 12 run: "gpt-small" state: CLOSED verdict: DATA confidence: 0.95
    trigger: "loss_spike" onset_step: 600 peak_step: 601 peak_value: 10.9 baseline_value: 1.9
    precursor: "" generation: 4
    probes {
      kind: "replay" generation: 3 checkpoint_step: 400
      data_plan { ranges { begin: 0 end: -1 } } horizon_step: 610 outcome: "spiked"
      steps_executed: 210
    }
    probes {
      kind: "skip" generation: 4 checkpoint_step: 400
      data_plan { ranges { begin: 0 end: 598 } ranges { begin: 604 end: -1 } }
      horizon_step: 700 outcome: "clean" steps_executed: 300
    }
    documents { domain: "web" document_id: 991 data_position: 600 step: 600 }
    fix: "kept skip window [598,604), quarantined 1 document"
    recommendations: "filter documents similar to web:991"
    cost { probes: 2 steps_reexecuted: 510 wall_time_s: 130 gpu_hours: 2.5 }
    events { seq: 1 unix_ms: 1700000000000 kind: "opened" detail: "loss 10.9 vs median 1.9" }
  )pb");
  const std::string text = FormatIncident(incident);
  EXPECT_THAT(text, HasSubstr("verdict:     data (confidence 0.95)"));
  EXPECT_THAT(text, HasSubstr("KIND    GEN  CKPT STEP  DATA PLAN"));
  EXPECT_THAT(text, ContainsRegex(R"(replay +3 +400 +\[0,inf\) +610 +spiked +210)"));
  EXPECT_THAT(text, ContainsRegex(R"(skip +4 +400 +\[0,598\) \[604,inf\) +700 +clean +300)"));
  EXPECT_THAT(text, ContainsRegex("600 +600 +web +991"));
  EXPECT_THAT(text, HasSubstr("Fix: kept skip window [598,604), quarantined 1 document"));
  EXPECT_THAT(text, HasSubstr("  - filter documents similar to web:991"));
  EXPECT_THAT(text, HasSubstr("Cost: 2 probes, 510 steps re-executed, 130 s wall, 2.5 rank-hours"));
  EXPECT_THAT(text, HasSubstr("opened  loss 10.9 vs median 1.9"));
}

TEST(FormatIncidentTest, ShowsCulpritsSuspectsAndNearDuplicates) {
  v1::Incident incident;
  incident.set_id(4);
  incident.set_verdict(v1::DATA);
  incident.add_culprit_positions(331);
  incident.add_culprit_positions(336);
  v1::DocumentRef* suspect = incident.add_suspects();
  suspect->set_domain("prose");
  suspect->set_document_id(77);
  v1::NearDuplicate* n = incident.add_near_duplicates();
  n->set_domain("code");
  n->set_document_id(912);
  n->set_similarity(0.8123);
  n->set_similar_to_domain("code");
  n->set_similar_to_document_id(15);
  const std::string text = FormatIncident(incident);
  EXPECT_THAT(text, HasSubstr("Culprit data positions: 331, 336"));
  EXPECT_THAT(text, HasSubstr("Suspects (the rest of the skip window, fed without a spike): prose:77"));
  EXPECT_THAT(text, HasSubstr("Near-duplicates elsewhere in the corpus"));
  EXPECT_THAT(text, ::testing::ContainsRegex("code +912 +0\\.81 +code:15"));
}

TEST(FormatTest, EnumsPrintInLowerCaseWithoutPrefix) {
  EXPECT_EQ(ModeName(v1::MODE_AUTO), "auto");
  EXPECT_EQ(ModeName(v1::MODE_UNSPECIFIED), "-");
  EXPECT_EQ(IncidentStateName(v1::AWAITING_APPROVAL), "awaiting_approval");
  EXPECT_EQ(VerdictName(v1::FRAGILITY), "fragility");
  EXPECT_EQ(VerdictName(static_cast<v1::Verdict>(42)), "42");
}

TEST(FormatTest, EmptyListsSaySo) {
  EXPECT_EQ(FormatRunList(v1::ListRunsResponse()), "No runs.\n");
  EXPECT_EQ(FormatIncidentList(v1::ListIncidentsResponse()), "No incidents.\n");
  EXPECT_EQ(FormatCheckpoints(v1::ListCheckpointsResponse()), "No checkpoints.\n");
  EXPECT_EQ(FormatTelemetry(v1::QueryTelemetryResponse(), {}), "No telemetry for these steps.\n");
}

TEST(FormatTest, PolicyPrintsAsTextThatParsesBack) {
  const auto policy = ParseText<v1::Policy>(R"pb(
    mode: MODE_AUTO loss_spike { window: 128 z_threshold: 6 } budget { max_probes: 6 }
  )pb");
  v1::Policy back;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(FormatPolicy(policy), &back));
  EXPECT_TRUE(EqualWithNaN(policy, back));
}

TEST(FormatTest, ManifestListsDocumentsPerStep) {
  const auto manifest = ParseText<v1::ResolveManifestResponse>(R"pb(
    steps { step: 600 data_position: 600 documents { domain: "web" document_id: 1 } documents { domain: "code" document_id: 2 } }
    steps { step: 601 data_position: 605 }
  )pb");
  std::vector<std::string> lines = Lines(FormatManifest(manifest));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(Cells(lines[1]), (std::vector<std::string>{"600", "600", "web:1", "code:2"}));
  EXPECT_EQ(Cells(lines[2]), (std::vector<std::string>{"601", "605", "-"}));
}

TEST(FormatTest, WarningsAreListedApartFromIncidentsWithStateLayerAndLead) {
  v1::ListWarningsResponse list;
  EXPECT_EQ(FormatWarningList(list), "No precursor warnings.\n");
  EXPECT_EQ(FormatWarningSummary(list), "");
  EXPECT_EQ(FormatActiveWarnings(list), "");
  v1::PrecursorWarning* w = list.add_warnings();
  w->set_id(4);
  w->set_run("gpt");
  w->set_signal("max_attn_logit");
  w->set_layer(3);
  w->set_state(v1::WARNING_ACTIVE);
  w->set_onset_step(300);
  w->set_last_step(520);
  w->set_lead_steps(220);
  w->set_peak_value(2e4);
  w->set_threshold(1e4);
  v1::PrecursorWarning* p = list.add_warnings();
  *p = *w;
  p->set_id(5);
  p->set_state(v1::WARNING_PRECEDED_INCIDENT);
  p->set_incident_id(9);
  p->set_incident_lead_steps(260);
  const std::string table = FormatWarningList(list);
  EXPECT_THAT(table, HasSubstr("ACTIVE"));
  EXPECT_THAT(table, HasSubstr("preceded incident 9"));
  EXPECT_THAT(table, HasSubstr("260 (to incident)"));
  EXPECT_THAT(FormatActiveWarnings(list), HasSubstr("Active precursor warnings:"));
  EXPECT_EQ(FormatWarningSummary(list),
            "\nPrecursor warnings (not incidents): 1 active, 0 cleared, 1 preceded an incident; "
            "see spikectl warnings list\n");

  v1::IncidentUpdate update;
  *update.mutable_warning() = *w;
  update.mutable_event()->set_kind("warning_opened");
  update.mutable_event()->set_detail("max_attn_logit layer 3 at 12000");
  const std::string line = FormatIncidentUpdate(update);
  EXPECT_THAT(line, HasSubstr("warning 4  run gpt  ACTIVE  warning_opened: max_attn_logit layer 3"));
  EXPECT_THAT(line, Not(HasSubstr("incident 0")));
}

}  // namespace
}  // namespace spikeguard::cli
