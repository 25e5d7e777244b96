// End to end with real processes over loopback: spikeguardd, the synthetic
// telemetry source (8 ranks, one stream each) and spikectl; then kill -9 of the
// daemon in the middle of the stream.
#include <signal.h>
#include <stdlib.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"
#include "tests/e2e/process.h"
#include "tests/e2e/security.h"

namespace spikeguard::testing {
namespace {

namespace v1 = spikeguard::v1;
using ::testing::HasSubstr;

class TelemetryE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = FreePort();
    addr_ = absl::StrCat("127.0.0.1:", port_);
    // tracegen, like any worker started by hand, takes the token and the CA
    // from its environment.
    setenv("SPIKEGUARD_TOKEN_FILE", security_.token_file().c_str(), 1);
    setenv("SPIKEGUARD_TLS_CA", TestSecurity::Tls("ca.pem").c_str(), 1);
  }

  // `binary`: spikeguardd, or the test-only SPIKEGUARDD_CRASH_POINT with
  // its `extra` flags.
  std::unique_ptr<Process> StartDaemon(const std::string& tag,
                                       const std::string& binary = SPIKEGUARDD,
                                       std::vector<std::string> extra = {}) {
    const std::string port_file = dir_.File("port");
    std::remove(port_file.c_str());
    std::vector<std::string> argv =
        Concat({binary, "--listen=" + addr_, "--data-dir=" + dir_.File("data"),
                "--port-file=" + port_file},
               security_.DaemonArgs());
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = std::make_unique<Process>(argv, dir_.File("daemon-" + tag));
    for (int i = 0; i < 500 && ReadFile(port_file).empty(); ++i) {
      EXPECT_TRUE(p->running()) << p->err();
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_FALSE(ReadFile(port_file).empty()) << "daemon did not start: " << p->err();
    return p;
  }

  RunResult Spikectl(std::vector<std::string> args, const std::string& tag) {
    std::vector<std::string> argv = Concat({SPIKECTL, "--addr=" + addr_}, security_.ClientArgs());
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, dir_.File("spikectl-" + tag));
  }

  std::unique_ptr<Process> Tracegen(const std::string& run, int ranks, int steps,
                                    std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {TRACEGEN, "--addr=" + addr_, "--run=" + run,
                                     absl::StrCat("--ranks=", ranks), absl::StrCat("--steps=", steps),
                                     "--layers=4", "--seed=7"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Process>(argv, dir_.File("tracegen-" + run));
  }

  v1::QueryTelemetryResponse QueryAll(const std::string& run) {
    auto stub = v1::SupervisorService::NewStub(security_.Channel(addr_));
    grpc::ClientContext ctx;
    security_.Authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::QueryTelemetryRequest req;
    req.set_run(run);
    req.set_limit(100000);
    v1::QueryTelemetryResponse out;
    grpc::Status s = stub->QueryTelemetry(&ctx, req, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  // reports_accepted and reports_duplicate of the daemon's status; -1 when
  // it does not answer.
  std::pair<int64_t, int64_t> ReportCounts() {
    auto stub = v1::SupervisorService::NewStub(security_.Channel(addr_));
    grpc::ClientContext ctx;
    security_.Authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ServerStatus status;
    if (!stub->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok()) return {-1, -1};
    return {status.reports_accepted(), status.reports_duplicate()};
  }

  int64_t ReportsAccepted() {
    auto stub = v1::SupervisorService::NewStub(security_.Channel(addr_));
    grpc::ClientContext ctx;
    security_.Authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ServerStatus status;
    if (!stub->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok()) return -1;
    return status.reports_accepted();
  }

  static std::vector<std::string> Concat(std::vector<std::string> a,
                                         const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  TempDir dir_;
  TestSecurity security_{dir_};
  int port_ = 0;
  std::string addr_;
};

TEST_F(TelemetryE2E, EightRanksTwoThousandStepsAreStoredAndQueryable) {
  auto daemon = StartDaemon("main");
  RunResult created = Spikectl({"runs", "create", "e2e", "--world-size=8"}, "create");
  ASSERT_EQ(created.code, 0) << created.err;

  auto gen = Tracegen("e2e", 8, 2000, {"--spike-at=1500"});
  auto code = gen->Wait(std::chrono::seconds(300));
  ASSERT_TRUE(code.has_value()) << "tracegen hung";
  ASSERT_EQ(*code, 0) << gen->err();

  RunResult json = Spikectl({"--output=json", "telemetry", "--run", "e2e", "--limit", "5000"}, "json");
  ASSERT_EQ(json.code, 0) << json.err;
  v1::QueryTelemetryResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &parsed).ok()) << json.out.substr(0, 500);
  ASSERT_EQ(parsed.records_size(), 2000);
  for (int s = 0; s < 2000; ++s) {
    ASSERT_EQ(parsed.records(s).step(), s);
    ASSERT_EQ(parsed.records(s).ranks_reported(), 8u) << "step " << s;
  }
  // The spike is in the stored run-level loss.
  EXPECT_GT(parsed.records(1500).loss(), 2.0 * parsed.records(1400).loss());

  RunResult table = Spikectl({"telemetry", "--run", "e2e", "--from", "1498", "--to", "1502"}, "table");
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("1500"));
  EXPECT_THAT(table.out, HasSubstr("loss"));

  RunResult status = Spikectl({"status"}, "status");
  ASSERT_EQ(status.code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("16000"));  // reports accepted

  RunResult missing = Spikectl({"telemetry", "--run", "nope"}, "missing");
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, HasSubstr("nope"));

  RunResult usage = Spikectl({"telemetry"}, "usage");
  EXPECT_EQ(usage.code, 2);

  daemon->Kill(SIGTERM);
  auto exit_code = daemon->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(exit_code.has_value());
  EXPECT_EQ(*exit_code, 0);
  EXPECT_THAT(daemon->err(), HasSubstr("catalog closed"));
}

// tracegen --checkpoint-every named synthetic:// URIs, which the daemon
// refuses (only files inside the run's checkpoint root are registered): each
// notice came back rejected and tracegen exited 1 ("2 reports refused"). It
// writes small checkpoint files in --checkpoint-dir now and registers them by
// their file:// URIs: the run's checkpoints are listed, and a rewind to one
// verifies it.
TEST_F(TelemetryE2E, TracegenCheckpointsAreFilesTheDaemonRegisters) {
  auto daemon = StartDaemon("main");
  RunResult created = Spikectl({"runs", "create", "ck", "--world-size=2"}, "create");
  ASSERT_EQ(created.code, 0) << created.err;
  const std::string dir = dir_.File("data/runs/ck/ckpt");

  auto usage = Tracegen("ck", 2, 10, {"--checkpoint-every=5"});
  auto usage_code = usage->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(usage_code.has_value());
  EXPECT_EQ(*usage_code, 2);
  EXPECT_THAT(usage->err(), HasSubstr("--checkpoint-every needs --checkpoint-dir"));

  auto gen = Tracegen("ck", 2, 200, {"--checkpoint-every=50", "--checkpoint-dir=" + dir});
  auto code = gen->Wait(std::chrono::seconds(300));
  ASSERT_TRUE(code.has_value()) << "tracegen hung";
  ASSERT_EQ(*code, 0) << gen->err();

  RunResult json = Spikectl({"--output=json", "checkpoints", "list", "--run=ck"}, "list");
  ASSERT_EQ(json.code, 0) << json.err;
  v1::ListCheckpointsResponse listed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &listed).ok())
      << json.out.substr(0, 500);
  ASSERT_EQ(listed.checkpoints_size(), 3) << json.out.substr(0, 2000);
  for (int i = 0; i < 3; ++i) {
    const v1::Checkpoint& c = listed.checkpoints(i);
    EXPECT_EQ(c.step(), 50 * (i + 1));
    EXPECT_TRUE(c.complete());
    EXPECT_THAT(c.uri(), ::testing::StartsWith("file://" + dir + "/"));
    EXPECT_EQ(c.checksum().size(), 16u);
    EXPECT_GT(c.bytes(), 0);
    const std::string path = c.uri().substr(7);
    EXPECT_EQ(static_cast<int64_t>(ReadFile(path).size()), c.bytes()) << path;
  }
  RunResult rewind = Spikectl({"rewind", "--run=ck", "--to-step=100"}, "rewind");
  EXPECT_EQ(rewind.code, 0) << rewind.err;
}

TEST_F(TelemetryE2E, KillNineMidStreamLosesNothingAcknowledgedAndStoresNothingTwice) {
  auto daemon = StartDaemon("first");
  RunResult created = Spikectl({"runs", "create", "crash", "--world-size=8"}, "create");
  ASSERT_EQ(created.code, 0) << created.err;

  // Paced so the kill lands in the middle of the stream.
  auto gen = Tracegen("crash", 8, 2000, {"--steps-per-second=400"});
  int64_t accepted = 0;
  for (int i = 0; i < 3000 && accepted < 4000; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    accepted = ReportsAccepted();
  }
  ASSERT_GE(accepted, 4000) << "the stream never got going: " << gen->err();
  daemon->Kill(SIGKILL);
  ASSERT_TRUE(gen->running()) << "tracegen finished before the kill; slow it down";
  absl::SleepFor(absl::Milliseconds(500));

  auto restarted = StartDaemon("second");
  auto code = gen->Wait(std::chrono::seconds(300));
  ASSERT_TRUE(code.has_value()) << "tracegen hung after the restart: " << gen->err();
  ASSERT_EQ(*code, 0) << gen->err();

  v1::QueryTelemetryResponse all = QueryAll("crash");
  ASSERT_EQ(all.records_size(), 2000);
  for (int s = 0; s < 2000; ++s) {
    ASSERT_EQ(all.records(s).step(), s);
    ASSERT_EQ(all.records(s).ranks_reported(), 8u) << "step " << s << " merged a wrong number of times";
  }
  restarted->Kill(SIGTERM);
  EXPECT_EQ(restarted->Wait(std::chrono::seconds(30)).value_or(-1), 0);
}

// The daemon dies after a group of batches is durable and before any of its
// acks is written (the test-only spikeguardd_crash_point binary _exits right
// there, through Daemon::Options::after_group_commit): the workers
// resend what was not acknowledged, the restarted daemon counts it as
// duplicates, and every step is stored once per rank.
TEST_F(TelemetryE2E, ExitBetweenGroupCommitAndAcksLosesNothingAndStoresNothingTwice) {
  auto daemon = StartDaemon("first", SPIKEGUARDD_CRASH_POINT, {"--exit-after-groups=60"});
  RunResult created = Spikectl({"runs", "create", "commit-crash", "--world-size=8"}, "create");
  ASSERT_EQ(created.code, 0) << created.err;

  auto gen = Tracegen("commit-crash", 8, 1000, {"--steps-per-second=400"});
  const auto exited = daemon->Wait(std::chrono::seconds(120));
  ASSERT_TRUE(exited.has_value()) << "the daemon did not reach its 60th group";
  ASSERT_EQ(*exited, 86) << daemon->err();
  EXPECT_THAT(daemon->err(), HasSubstr("before its acks"));
  ASSERT_TRUE(gen->running()) << "tracegen finished before the exit; slow it down";

  auto restarted = StartDaemon("second");
  auto code = gen->Wait(std::chrono::seconds(300));
  ASSERT_TRUE(code.has_value()) << "tracegen hung after the restart: " << gen->err();
  ASSERT_EQ(*code, 0) << gen->err();

  v1::QueryTelemetryResponse all = QueryAll("commit-crash");
  ASSERT_EQ(all.records_size(), 1000);
  for (int s = 0; s < 1000; ++s) {
    ASSERT_EQ(all.records(s).step(), s);
    ASSERT_EQ(all.records(s).ranks_reported(), 8u) << "step " << s << " merged a wrong number of times";
  }
  // The last group was durable but unacknowledged: its reports came back
  // as resends and were recognised as such.
  const auto [accepted, duplicates] = ReportCounts();
  EXPECT_GT(duplicates, 0);
  EXPECT_LT(accepted, 8000);
  restarted->Kill(SIGTERM);
  EXPECT_EQ(restarted->Wait(std::chrono::seconds(30)).value_or(-1), 0);
}

}  // namespace
}  // namespace spikeguard::testing
