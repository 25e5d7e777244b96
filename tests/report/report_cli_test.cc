// `spikectl report`: fetches over the public API and writes one HTML file.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/spikectl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/test_supervisor.h"

namespace spikeguard::cli {
namespace {

using ::spikeguard::cli::testing::RecordingSupervisor;
using ::spikeguard::cli::testing::TestServer;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name + "-" + std::to_string(getpid());
}

TEST(ReportCliTest, WritesTheReportWithTelemetryOfEveryGeneration) {
  RecordingSupervisor supervisor;
  v1::Incident incident;
  incident.set_id(7);
  incident.set_run("demo<script>");
  incident.set_verdict(v1::DATA);
  incident.set_confidence(0.8);
  incident.set_onset_step(300);
  incident.set_peak_step(300);
  v1::Probe* p = incident.add_probes();
  p->set_kind("replay");
  p->set_generation(1);
  p->set_checkpoint_step(200);
  p->set_horizon_step(305);
  supervisor.SetResponse("GetIncident", incident);
  v1::QueryTelemetryResponse telemetry;
  for (int step = 200; step < 210; ++step) {
    v1::StepRecord* r = telemetry.add_records();
    r->set_step(step);
    r->set_loss(2.0);
  }
  supervisor.SetResponse("QueryTelemetry", telemetry);
  TestServer server(&supervisor);
  const std::string path = TempPath("report.html");
  std::ostringstream out, err;
  ASSERT_EQ(RunSpikectl({"--addr=" + server.address(), "--token=t0ken", "report", "7",
                         "--out=" + path},
                        out, err),
            0)
      << err.str();
  EXPECT_THAT(out.str(), HasSubstr("wrote " + path));
  EXPECT_EQ(supervisor.LastRequest<v1::GetIncidentRequest>("GetIncident").id(), 7);
  EXPECT_EQ(supervisor.LastRequest<v1::GetRunRequest>("GetRun").name(), "demo<script>");
  EXPECT_EQ(supervisor.LastAuthorization("QueryTelemetry"), "Bearer t0ken");
  // Generation 0 (the incident's) and 1 (the replay's), over the window.
  int queried = 0;
  for (const std::string& m : supervisor.methods()) queried += m == "QueryTelemetry";
  EXPECT_EQ(queried, 2);
  const v1::QueryTelemetryRequest last =
      supervisor.LastRequest<v1::QueryTelemetryRequest>("QueryTelemetry");
  EXPECT_EQ(last.from_step(), 200);
  EXPECT_GE(last.to_step(), 305);
  const std::string html = ReadFile(path);
  EXPECT_THAT(html, HasSubstr("<!DOCTYPE html>"));
  EXPECT_THAT(html, HasSubstr("data-name=\"replay (gen 1)\""));
  EXPECT_THAT(html, HasSubstr("demo&lt;script&gt;"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  std::remove(path.c_str());
}

TEST(ReportCliTest, UnknownIncidentFailsAndWritesNothing) {
  RecordingSupervisor supervisor;
  supervisor.SetError("GetIncident", grpc::Status(grpc::StatusCode::NOT_FOUND, "incident 9 not found"));
  TestServer server(&supervisor);
  const std::string path = TempPath("missing.html");
  std::ostringstream out, err;
  EXPECT_EQ(RunSpikectl({"--addr=" + server.address(), "report", "9", "--out=" + path}, out, err), 1);
  EXPECT_THAT(err.str(), HasSubstr("spikectl: NOT_FOUND: incident 9 not found"));
  EXPECT_FALSE(std::ifstream(path).good());
}

TEST(ReportCliTest, BadIdIsAUsageError) {
  std::ostringstream out, err;
  EXPECT_EQ(RunSpikectl({"--addr=127.0.0.1:1", "report", "x"}, out, err), 2);
  EXPECT_EQ(RunSpikectl({"--addr=127.0.0.1:1", "report", "1", "--out="}, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("empty --out"));
}

}  // namespace
}  // namespace spikeguard::cli
