// spikectl against a real gRPC server on a loopback port: each command calls
// the right RPC with the right fields, prints the answer, and turns server
// errors and unreachable daemons into exit 1 with the reason.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "cli/spikectl.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/cli/test_supervisor.h"
#include "tests/storage/corpus/test_dir.h"

namespace spikeguard::cli {
namespace {

namespace v1 = ::spikeguard::v1;
using ::google::protobuf::util::MessageDifferencer;
using ::spikeguard::cli::testing::RecordingSupervisor;
using ::spikeguard::cli::testing::TestServer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

template <typename T>
T ParseText(const std::string& text) {
  T message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

template <typename T>
T ParseJson(const std::string& json) {
  T message;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &message).ok()) << json;
  return message;
}

using storage::testing_util::WriteTestFile;

class SpikectlServerTest : public ::testing::Test {
 protected:
  struct Result {
    int code;
    std::string out;
    std::string err;
  };

  Result Spikectl(std::vector<std::string> args) {
    args.insert(args.begin(), "--addr=" + server_.address());
    std::ostringstream out, err;
    const int code = RunSpikectl(args, out, err);
    return {code, out.str(), err.str()};
  }

  RecordingSupervisor supervisor_;
  TestServer server_{&supervisor_};
};

TEST_F(SpikectlServerTest, StatusPrintsCounters) {
  supervisor_.SetResponse("GetStatus", ParseText<v1::ServerStatus>(R"pb(
    version: "0.1.0" uptime_s: 42 runs: 2 connected_ranks: 16 reports_accepted: 1000
    reports_dropped: 7 open_incidents: 1
  )pb"));
  Result r = Spikectl({"status"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, HasSubstr("version:            0.1.0"));
  EXPECT_THAT(r.out, HasSubstr("reports dropped:    7"));
  EXPECT_THAT(r.out, HasSubstr("connected ranks:    16"));
  EXPECT_THAT(supervisor_.methods(), ElementsAre("GetStatus"));
}

TEST_F(SpikectlServerTest, RunsListAsTableAndAsJson) {
  const auto runs = ParseText<v1::ListRunsResponse>(R"pb(
    runs { name: "gpt-small" id: 1 mode: MODE_AUTO state: RUN_RUNNING world_size: 8 last_step: 1200 }
    runs { name: "gpt-large" id: 2 mode: MODE_OBSERVE state: RUN_CREATED world_size: 512 }
  )pb");
  supervisor_.SetResponse("ListRuns", runs);
  Result table = Spikectl({"runs", "list"});
  EXPECT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, ::testing::ContainsRegex("gpt-small +1 +auto +running +8 +0 +1200"));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("gpt-large +2 +observe +created +512"));

  Result json = Spikectl({"runs", "list", "--output=json"});  // global flag after the command
  EXPECT_EQ(json.code, 0) << json.err;
  EXPECT_EQ(std::count(json.out.begin(), json.out.end(), '\n'), 1);
  EXPECT_TRUE(MessageDifferencer::Equals(ParseJson<v1::ListRunsResponse>(json.out), runs));
  // JSON is the proto's mapping: the enumerator's name, as for mode.
  EXPECT_THAT(json.out, HasSubstr("\"state\":\"RUN_RUNNING\""));
  EXPECT_THAT(supervisor_.methods(), ElementsAre("ListRuns", "ListRuns"));
}

TEST_F(SpikectlServerTest, RunsCreateSendsNameWorldSizeAndMode) {
  Result r = Spikectl({"runs", "create", "gpt-small", "--world-size", "8", "--mode=propose"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto request = supervisor_.LastRequest<v1::CreateRunRequest>("CreateRun");
  EXPECT_EQ(request.name(), "gpt-small");
  EXPECT_EQ(request.world_size(), 8u);
  EXPECT_EQ(request.mode(), v1::MODE_PROPOSE);
  EXPECT_FALSE(request.launch());
  EXPECT_FALSE(request.has_spec());
}

TEST_F(SpikectlServerTest, RunsCreateWithSpecLaunches) {
  const std::string spec = WriteTestFile("spec.txtpb", R"pb(
    profile: "ref-worker"
    params { key: "args" value: "--steps=600" }
    manifest { seed: 1234 global_batch_size: 16 sequence_length: 64 }
  )pb");
  Result r = Spikectl({"runs", "create", "gpt-small", "--spec=" + spec});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto request = supervisor_.LastRequest<v1::CreateRunRequest>("CreateRun");
  EXPECT_TRUE(request.launch());
  EXPECT_EQ(request.world_size(), 1u);
  EXPECT_EQ(request.spec().profile(), "ref-worker");
  EXPECT_EQ(request.spec().params().at("args"), "--steps=600");
  EXPECT_EQ(request.spec().manifest().seed(), 1234u);
  // Without --world-size the launch is one rank, and spikectl says so.
  EXPECT_THAT(r.err, ::testing::HasSubstr("no --world-size: the daemon launches 1 rank of "
                                          "profile 'ref-worker'"));
  Result two = Spikectl({"runs", "create", "gpt-2", "--world-size=2", "--spec=" + spec});
  EXPECT_EQ(two.code, 0) << two.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::CreateRunRequest>("CreateRun").world_size(), 2u);
  EXPECT_THAT(two.err, ::testing::Not(::testing::HasSubstr("--world-size")));
}

TEST_F(SpikectlServerTest, RunsSetProfileSendsTheProfileAndParams) {
  Result r = Spikectl({"runs", "set-profile", "old", "--profile=ref-worker", "--param=scenario=data",
                       "--param", "args=--steps=600 --set=a=b"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto request = supervisor_.LastRequest<v1::SetRunProfileRequest>("SetRunProfile");
  EXPECT_EQ(request.run(), "old");
  EXPECT_EQ(request.profile(), "ref-worker");
  EXPECT_EQ(request.params().at("scenario"), "data");
  EXPECT_EQ(request.params().at("args"), "--steps=600 --set=a=b");
  r = Spikectl({"runs", "set-profile", "old", "--profile=p", "--param=novalue"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("want NAME=VALUE"));
  r = Spikectl({"runs", "set-profile", "old"});
  EXPECT_EQ(r.code, 2);
}

TEST_F(SpikectlServerTest, RunsShowPrintsRanksAndGenerations) {
  supervisor_.SetResponse("GetRun", ParseText<v1::Run>(R"pb(
    name: "gpt-small" world_size: 2 current_generation: 2
    ranks { rank: 0 connected: true last_step: 812 last_seen_unix_ms: 1700000100000 host: "node-a" }
    generations { generation: 2 parent: 1 from_checkpoint_step: 400 reason: "rewind" }
  )pb"));
  Result r = Spikectl({"runs", "show", "gpt-small"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::GetRunRequest>("GetRun").name(), "gpt-small");
  EXPECT_THAT(r.out, ::testing::ContainsRegex("0 +node-a +yes +0 +812 +2023-11-14 22:15:00"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("2 +1 +400 +\\[0,inf\\)"));
}

TEST_F(SpikectlServerTest, ServerErrorExitsOneWithCodeAndMessage) {
  supervisor_.SetError("GetRun", grpc::Status(grpc::StatusCode::NOT_FOUND, "run 'x' not found"));
  Result r = Spikectl({"runs", "show", "x"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "spikectl: NOT_FOUND: run 'x' not found\n");
  EXPECT_THAT(r.out, IsEmpty());
}

TEST_F(SpikectlServerTest, UnimplementedRpcPrintsServerMessage) {
  supervisor_.SetError("ListIncidents", grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                                     "incidents arrive with the incident engine"));
  Result r = Spikectl({"incidents", "list"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "spikectl: UNIMPLEMENTED: incidents arrive with the incident engine\n");
}

TEST_F(SpikectlServerTest, CheckpointsListSendsRun) {
  supervisor_.SetResponse("ListCheckpoints", ParseText<v1::ListCheckpointsResponse>(R"pb(
    checkpoints { run: "r" step: 400 generation: 1 complete: true bytes: 1048576 uri: "file:///ckpt/400" }
    checkpoints { run: "r" step: 500 generation: 1 complete: true uri: "file:///ckpt/500"
                  rewind_target: true rolling_pin: true pinned: true }
    checkpoints { run: "r" step: 600 generation: 2 complete: true uri: "file:///ckpt/600"
                  rewind_note: "saved by generation 2, not on generation 3's line" }
  )pb"));
  Result r = Spikectl({"checkpoints", "list", "--run", "r"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::ListCheckpointsRequest>("ListCheckpoints").run(), "r");
  EXPECT_THAT(r.out,
              ::testing::ContainsRegex("400 +1 +0 +yes +no +- +1.0 MiB +- +- +file:///ckpt/400"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("500 +1 +0 +yes +yes \\(rolling\\) +yes +"));
  EXPECT_THAT(r.out, ::testing::HasSubstr(
                         "no: saved by generation 2, not on generation 3's line"));
}

TEST_F(SpikectlServerTest, TelemetrySendsRangeGenerationLimitAndFields) {
  supervisor_.SetResponse("QueryTelemetry", ParseText<v1::QueryTelemetryResponse>(R"pb(
    records { generation: 3 step: 601 ranks_reported: 8 loss: nan grad_norm: inf
              layers { layer: 2 max_attn_logit: 1e4 } }
  )pb"));
  Result r = Spikectl({"telemetry", "--run=r", "--gen=3", "--from=590", "--to=610",
                  "--metrics=loss,grad_norm", "--metrics", "layer2.max_attn_logit", "--limit=50"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto request = supervisor_.LastRequest<v1::QueryTelemetryRequest>("QueryTelemetry");
  EXPECT_EQ(request.run(), "r");
  ASSERT_TRUE(request.has_generation());
  EXPECT_EQ(request.generation(), 3);
  EXPECT_EQ(request.from_step(), 590);
  ASSERT_TRUE(request.has_to_step());
  EXPECT_EQ(request.to_step(), 610);
  EXPECT_EQ(request.limit(), 50);
  EXPECT_THAT(request.metrics(), ElementsAre("loss", "grad_norm", "max_attn_logit"));
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[1], ' ', absl::SkipEmpty())),
            (std::vector<std::string>{"601", "3", "8", "nan", "inf", "10000"}));
}

TEST_F(SpikectlServerTest, TelemetryDefaultsLeaveRangeAndGenerationUnset) {
  Result r = Spikectl({"telemetry", "--run=r"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto request = supervisor_.LastRequest<v1::QueryTelemetryRequest>("QueryTelemetry");
  EXPECT_FALSE(request.has_generation());
  EXPECT_FALSE(request.has_to_step());
  EXPECT_EQ(request.from_step(), 0);
  EXPECT_EQ(request.limit(), 0);
  EXPECT_THAT(request.metrics(), ElementsAre("loss", "grad_norm", "lr", "clipped", "lse_max",
                                             "nonfinite_count", "max_attn_logit", "step_time_s"));
  EXPECT_EQ(r.out, "No telemetry for these steps.\n");
}

TEST_F(SpikectlServerTest, TelemetryJsonKeepsNonFiniteValues) {
  const auto response = ParseText<v1::QueryTelemetryResponse>(R"pb(
    records { step: 601 loss: nan grad_norm: inf }
  )pb");
  supervisor_.SetResponse("QueryTelemetry", response);
  Result r = Spikectl({"--output", "json", "telemetry", "--run=r"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto back = ParseJson<v1::QueryTelemetryResponse>(r.out);
  ASSERT_EQ(back.records_size(), 1);
  EXPECT_TRUE(std::isnan(back.records(0).loss()));
  EXPECT_TRUE(std::isinf(back.records(0).grad_norm()));
}

// JSON prints every field of a record; a projection to the table's default
// columns used to print data_position, loss_hash, tokens and unix_ms as 0.
TEST_F(SpikectlServerTest, TelemetryJsonWithoutMetricsAsksForWholeRecords) {
  supervisor_.SetResponse("QueryTelemetry", ParseText<v1::QueryTelemetryResponse>(R"pb(
    records { step: 601 data_position: 9617 loss: 2.5 tokens: 1024
              loss_hash: 15837569197777765867 unix_ms: 1796251201867
              layers { layer: 0 max_attn_logit: 12 act_rms: 3 } }
  )pb"));
  Result r = Spikectl({"--output=json", "telemetry", "--run=r", "--from=600"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto request = supervisor_.LastRequest<v1::QueryTelemetryRequest>("QueryTelemetry");
  EXPECT_THAT(request.metrics(), IsEmpty());
  EXPECT_EQ(request.from_step(), 600);
  const auto back = ParseJson<v1::QueryTelemetryResponse>(r.out);
  ASSERT_EQ(back.records_size(), 1);
  EXPECT_EQ(back.records(0).data_position(), 9617);
  EXPECT_EQ(back.records(0).tokens(), 1024);
  EXPECT_EQ(back.records(0).loss_hash(), 15837569197777765867u);
  EXPECT_EQ(back.records(0).unix_ms(), 1796251201867);
  ASSERT_EQ(back.records(0).layers_size(), 1);
  EXPECT_DOUBLE_EQ(back.records(0).layers(0).act_rms(), 3);

  // An explicit --metrics still asks for just those fields, in JSON too.
  r = Spikectl({"--output=json", "telemetry", "--run=r", "--metrics=loss,data_position"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(supervisor_.LastRequest<v1::QueryTelemetryRequest>("QueryTelemetry").metrics(),
              ElementsAre("loss", "data_position"));
}

TEST_F(SpikectlServerTest, IncidentsListSendsFilters) {
  Result r = Spikectl({"incidents", "list", "--run=r", "--state=awaiting-approval", "--verdict=DATA"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto request = supervisor_.LastRequest<v1::ListIncidentsRequest>("ListIncidents");
  EXPECT_EQ(request.run(), "r");
  EXPECT_EQ(request.state(), v1::AWAITING_APPROVAL);
  EXPECT_EQ(request.verdict(), v1::DATA);
  EXPECT_EQ(r.out, "No incidents.\n");
}

TEST_F(SpikectlServerTest, IncidentsShowPrintsEvidence) {
  supervisor_.SetResponse("GetIncident", ParseText<v1::Incident>(R"pb(
    id: 12 run: "r" state: CLOSED verdict: TRANSIENT
    probes { kind: "replay" generation: 3 checkpoint_step: 400 horizon_step: 610 outcome: "clean" steps_executed: 210 }
  )pb"));
  Result r = Spikectl({"incidents", "show", "12"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::GetIncidentRequest>("GetIncident").id(), 12);
  EXPECT_THAT(r.out, HasSubstr("verdict:"));
  EXPECT_THAT(r.out, HasSubstr("transient"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("replay +3 +400 +\\[0,inf\\) +610 +clean +210"));
}

TEST_F(SpikectlServerTest, IncidentsWatchPrintsEveryUpdate) {
  std::vector<v1::IncidentUpdate> updates = {
      ParseText<v1::IncidentUpdate>(R"pb(
        incident { id: 1 run: "r" state: DETECTED }
        event { seq: 1 unix_ms: 1700000000000 kind: "opened" detail: "loss spike at 600" }
      )pb"),
      ParseText<v1::IncidentUpdate>(R"pb(
        incident { id: 1 run: "r" state: CLOSED verdict: DATA }
        event { seq: 5 unix_ms: 1700000060000 kind: "closed" }
      )pb")};
  supervisor_.SetUpdates(updates);
  Result table = Spikectl({"incidents", "watch", "--run=r"});
  EXPECT_EQ(table.code, 0) << table.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::WatchIncidentsRequest>("WatchIncidents").run(), "r");
  std::vector<std::string> lines = absl::StrSplit(table.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("incident 1"));
  EXPECT_THAT(lines[0], HasSubstr("opened: loss spike at 600"));
  EXPECT_THAT(lines[1], HasSubstr("verdict data"));

  Result json = Spikectl({"incidents", "watch", "--output=json"});
  EXPECT_EQ(json.code, 0) << json.err;
  lines = absl::StrSplit(json.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals(ParseJson<v1::IncidentUpdate>(lines[i]), updates[i]));
  }
}

TEST_F(SpikectlServerTest, IncidentsWatchStreamErrorExitsOne) {
  supervisor_.SetUpdates({}, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no watch yet"));
  Result r = Spikectl({"incidents", "watch"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "spikectl: UNIMPLEMENTED: no watch yet\n");
}

TEST_F(SpikectlServerTest, RewindSendsWindowsHorizonAndRequestId) {
  supervisor_.SetResponse("Rewind", ParseText<v1::ActionResponse>(R"pb(
    accepted: true message: "rewinding to 400" generation: 5 command_id: "cmd-9"
  )pb"));
  Result r = Spikectl({"rewind", "--run=r", "--to-step=400", "--skip=598:604", "--skip", "700:701",
                  "--stop-after=650"});
  EXPECT_EQ(r.code, 0) << r.err;
  const auto request = supervisor_.LastRequest<v1::RewindRequest>("Rewind");
  EXPECT_EQ(request.run(), "r");
  EXPECT_EQ(request.to_step(), 400);
  ASSERT_EQ(request.skip_size(), 2);
  EXPECT_EQ(request.skip(0).from_step(), 598);
  EXPECT_EQ(request.skip(0).to_step(), 604);
  EXPECT_EQ(request.skip(1).from_step(), 700);
  EXPECT_EQ(request.stop_after_step(), 650);
  EXPECT_FALSE(request.request_id().empty());
  EXPECT_THAT(r.out, HasSubstr("generation:  5"));
  EXPECT_THAT(r.out, HasSubstr("cmd-9"));
}

TEST_F(SpikectlServerTest, EachInvocationGetsItsOwnRequestId) {
  Spikectl({"skip", "--run=r", "--from=1", "--to=2"});
  const std::string first = supervisor_.LastRequest<v1::SkipRequest>("Skip").request_id();
  Spikectl({"skip", "--run=r", "--from=1", "--to=2"});
  EXPECT_NE(supervisor_.LastRequest<v1::SkipRequest>("Skip").request_id(), first);
}

TEST_F(SpikectlServerTest, ActionNotAcceptedExitsOne) {
  supervisor_.SetResponse("Pause", ParseText<v1::ActionResponse>(R"pb(
    accepted: false message: "run is already paused"
  )pb"));
  Result r = Spikectl({"pause", "--run=r"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "spikectl: not accepted: run is already paused\n");
  EXPECT_THAT(r.out, HasSubstr("accepted:  no"));
}

TEST_F(SpikectlServerTest, ActionsCallTheirRpcWithTheirFields) {
  v1::ActionResponse ok;
  ok.set_accepted(true);
  for (const char* method : {"Replay", "Skip", "Pause", "Resume", "Approve", "Abort"}) {
    supervisor_.SetResponse(method, ok);
  }
  EXPECT_EQ(Spikectl({"replay", "--run=r", "--from-step=400", "--stop-after=620"}).code, 0);
  EXPECT_EQ(Spikectl({"skip", "--run=r", "--from=598", "--to=604"}).code, 0);
  EXPECT_EQ(Spikectl({"pause", "--run=r"}).code, 0);
  EXPECT_EQ(Spikectl({"resume", "--run=r"}).code, 0);
  EXPECT_EQ(Spikectl({"approve", "12"}).code, 0);
  EXPECT_EQ(Spikectl({"abort", "13", "--reason", "operator took over"}).code, 0);
  EXPECT_THAT(supervisor_.methods(),
              ElementsAre("Replay", "Skip", "Pause", "Resume", "Approve", "Abort"));

  const auto replay = supervisor_.LastRequest<v1::ReplayRequest>("Replay");
  EXPECT_EQ(replay.run(), "r");
  EXPECT_EQ(replay.from_step(), 400);
  EXPECT_EQ(replay.stop_after_step(), 620);
  EXPECT_FALSE(replay.request_id().empty());
  const auto skip = supervisor_.LastRequest<v1::SkipRequest>("Skip");
  EXPECT_EQ(skip.from_step(), 598);
  EXPECT_EQ(skip.to_step(), 604);
  EXPECT_EQ(supervisor_.LastRequest<v1::PauseRequest>("Pause").run(), "r");
  EXPECT_EQ(supervisor_.LastRequest<v1::ResumeRequest>("Resume").run(), "r");
  EXPECT_EQ(supervisor_.LastRequest<v1::ApproveRequest>("Approve").incident_id(), 12);
  const auto abort = supervisor_.LastRequest<v1::AbortRequest>("Abort");
  EXPECT_EQ(abort.incident_id(), 13);
  EXPECT_EQ(abort.reason(), "operator took over");
}

TEST_F(SpikectlServerTest, PolicySetSendsFileAndGetPrintsText) {
  const std::string file = WriteTestFile("policy.txtpb", R"pb(
    mode: MODE_PROPOSE
    loss_spike { window: 128 min_samples: 64 z_threshold: 6 relative_floor: 0.05 }
    budget { max_probes: 6 }
  )pb");
  Result set = Spikectl({"policy", "set", "--run=r", "--file=" + file});
  EXPECT_EQ(set.code, 0) << set.err;
  const auto request = supervisor_.LastRequest<v1::SetPolicyRequest>("SetPolicy");
  EXPECT_EQ(request.run(), "r");
  EXPECT_EQ(request.policy().mode(), v1::MODE_PROPOSE);
  EXPECT_EQ(request.policy().loss_spike().window(), 128);
  EXPECT_EQ(request.policy().budget().max_probes(), 6);

  supervisor_.SetResponse("GetPolicy", request.policy());
  Result get = Spikectl({"policy", "get"});
  EXPECT_EQ(get.code, 0) << get.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::GetPolicyRequest>("GetPolicy").run(), "");
  EXPECT_TRUE(MessageDifferencer::Equals(ParseText<v1::Policy>(get.out), request.policy()));
}

TEST_F(SpikectlServerTest, ManifestAndQuarantine) {
  supervisor_.SetResponse("ResolveManifest", ParseText<v1::ResolveManifestResponse>(R"pb(
    steps { step: 600 data_position: 600 documents { domain: "web" document_id: 991 } }
  )pb"));
  Result manifest = Spikectl({"manifest", "--run=r", "--from=600", "--to=605", "--gen=2"});
  EXPECT_EQ(manifest.code, 0) << manifest.err;
  const auto request = supervisor_.LastRequest<v1::ResolveManifestRequest>("ResolveManifest");
  EXPECT_EQ(request.run(), "r");
  EXPECT_EQ(request.from_step(), 600);
  EXPECT_EQ(request.to_step(), 605);
  EXPECT_EQ(request.generation(), 2);
  EXPECT_THAT(manifest.out, ::testing::ContainsRegex("600 +600 +web:991"));

  // Without --gen: the run's current generation, as the help says (not 0).
  supervisor_.SetResponse("GetRun", ParseText<v1::Run>(R"pb(name: "r" current_generation: 3)pb"));
  Result current = Spikectl({"manifest", "--run=r", "--from=600", "--to=605"});
  EXPECT_EQ(current.code, 0) << current.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::GetRunRequest>("GetRun").name(), "r");
  EXPECT_EQ(supervisor_.LastRequest<v1::ResolveManifestRequest>("ResolveManifest").generation(), 3);

  supervisor_.SetResponse("ListQuarantine", ParseText<v1::ListQuarantineResponse>(R"pb(
    entries { run: "r" domain: "web" document_id: 991 reason: "poisoned batch" incident_id: 12 }
  )pb"));
  Result quarantine = Spikectl({"quarantine", "list", "--run=r"});
  EXPECT_EQ(quarantine.code, 0) << quarantine.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::ListQuarantineRequest>("ListQuarantine").run(), "r");
  EXPECT_THAT(quarantine.out, ::testing::ContainsRegex("web +991 +12 +- +poisoned batch"));
}

TEST_F(SpikectlServerTest, AddressComesFromEnvironmentWhenNoFlag) {
  ::setenv("SPIKEGUARD_ADDR", server_.address().c_str(), 1);
  std::ostringstream out, err;
  const int code = RunSpikectl(std::vector<std::string>{"status"}, out, err);
  ::unsetenv("SPIKEGUARD_ADDR");
  EXPECT_EQ(code, 0) << err.str();
  EXPECT_THAT(supervisor_.methods(), ElementsAre("GetStatus"));
}

// A loopback port nobody listens on: bound, never listened, then closed.
int ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(SpikectlUnreachableTest, UnreachableDaemonExitsOneNamingTheAddress) {
  const std::string addr = "127.0.0.1:" + std::to_string(ClosedPort());
  for (std::vector<std::string> command :
       {std::vector<std::string>{"status"}, std::vector<std::string>{"incidents", "watch"}}) {
    command.insert(command.begin(), {"--addr=" + addr, "--timeout=5"});
    std::ostringstream out, err;
    EXPECT_EQ(RunSpikectl(command, out, err), 1);
    EXPECT_THAT(err.str(), HasSubstr("spikectl: UNAVAILABLE: cannot reach spikeguardd at " + addr));
    EXPECT_THAT(out.str(), IsEmpty());
  }
}

}  // namespace
}  // namespace spikeguard::cli
