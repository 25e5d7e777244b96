// Hostile inputs, each against a real daemon (real gRPC, real catalog): every
// one is answered with a clear error naming the field and value, nothing is
// stored that makes the daemon unusable for others, and nothing a client sends
// holds memory or a thread for ever.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <malloc.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/spikectl.h"
#include "base/clock.h"
#include "daemon/ingest/limits.h"
#include "daemon/ingest/run_registry.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "storage/catalog/database.h"
#include "tests/daemon/daemon_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// A report with every per-layer statistic set: ~51 KB at 1,024 layers.
v1::StepReport Wide(int64_t step, int layers) {
  v1::StepReport r;
  r.set_step(step);
  r.set_data_position(step);
  r.set_loss(2.0);
  r.set_grad_norm(0.5);
  r.set_tokens(1024);
  for (int l = 0; l < layers; ++l) {
    auto* ls = r.add_layers();
    ls->set_layer(l);
    ls->set_max_attn_logit(10.0 + l);
    ls->set_grad_norm(0.1 + l);
    ls->set_update_ratio(1e-3 * (l + 1));
    ls->set_act_rms(1.5 + l);
    ls->set_param_norm(20.0 + l);
  }
  return r;
}

class HostileInputTest : public DaemonFixture {
 protected:
  void SetUp() override {
    DaemonFixture::SetUp();
    ASSERT_TRUE(CreateRun("r1").ok());
  }

  static v1::StepReport WideReport(int64_t step, int layers) { return Wide(step, layers); }

  // Streams steps [0, steps) of `layers` layers as rank 0 of r1, then closes.
  void StreamWide(int steps, int layers) {
    auto a = Attach("r1");
    ASSERT_TRUE(a.first.has_welcome()) << a.first.DebugString();
    constexpr int kBatch = 40;
    for (int s = 0; s < steps; s += kBatch) {
      std::vector<v1::StepReport> batch;
      for (int k = s; k < std::min(steps, s + kBatch); ++k) batch.push_back(WideReport(k, layers));
      v1::Ack ack = SendBatch(a.stream.get(), 1 + s / kBatch, batch);
      ASSERT_EQ(ack.accepted(), static_cast<int>(batch.size())) << ack.message();
    }
    a.stream->WritesDone();
    EXPECT_TRUE(a.stream->Finish().ok());
  }

  int Spikectl(const std::vector<std::string>& args, std::string* out, std::string* err) {
    std::vector<std::string> all = {"--addr=" + address_};
    all.insert(all.end(), args.begin(), args.end());
    std::ostringstream o, e;
    const int code = cli::RunSpikectl(all, o, e);
    *out = o.str();
    *err = e.str();
    return code;
  }

  grpc::Status CreateRunWith(const v1::CreateRunRequest& req) {
    grpc::ClientContext ctx;
    v1::Run out;
    return supervisor_->CreateRun(&ctx, req, &out);
  }
};

// A report at step 2^63-1 used to be accepted, and every later report
// of the rank was then a "duplicate".
TEST_F(HostileInputTest, StepFarPastTheRunIsRefusedNamingFieldAndValue) {
  auto a = Attach("r1");
  ASSERT_TRUE(a.first.has_welcome());
  std::vector<v1::StepReport> ten;
  for (int s = 0; s < 10; ++s) ten.push_back(Report(s));
  ASSERT_EQ(SendBatch(a.stream.get(), 1, ten).accepted(), 10);

  v1::Ack far = SendBatch(a.stream.get(), 2, {Report(kInt64Max)});
  EXPECT_EQ(far.accepted(), 0);
  EXPECT_EQ(far.rejected(), 1);
  EXPECT_THAT(far.message(), HasSubstr("reports[0].step: 9223372036854775807"));
  EXPECT_THAT(far.message(), HasSubstr("max_step_ahead"));
  EXPECT_THAT(far.message(), HasSubstr("last step 9"));

  // The rank goes on where it was: step 10 is new, not a duplicate.
  v1::Ack next = SendBatch(a.stream.get(), 3, {Report(10)});
  EXPECT_EQ(next.accepted(), 1) << next.message();
  EXPECT_EQ(next.duplicates(), 0);
  // Nor does a heartbeat at 2^63-1 open the way for one.
  v1::WorkerMessage beat;
  beat.mutable_heartbeat()->set_step(kInt64Max);
  ASSERT_TRUE(a.stream->Write(beat));
  v1::Ack after = SendBatch(a.stream.get(), 4, {Report(kInt64Max / 2)});
  EXPECT_EQ(after.rejected(), 1);
  EXPECT_THAT(after.message(), HasSubstr("max_step_ahead"));
  a.stream->WritesDone();
  a.stream->Finish();
  EXPECT_EQ(Query("r1").size(), 11u);
}

// Invalid UTF-8 in a batch after the hello ended the stream with OK.
TEST_F(HostileInputTest, InvalidUtf8AfterHelloEndsTheStreamInvalidArgument) {
  auto a = Attach("r1");
  ASSERT_TRUE(a.first.has_welcome());
  v1::StepReport bad = Report(0);
  auto* d = bad.add_domain_losses();
  d->set_domain(std::string("pro\xff\xfese", 7));  // serialized as given
  v1::WorkerMessage msg;
  msg.mutable_reports()->set_seq(1);
  *msg.mutable_reports()->add_reports() = bad;
  a.stream->Write(msg);
  v1::ControllerMessage in;
  EXPECT_FALSE(a.stream->Read(&in)) << in.DebugString();
  grpc::Status s = a.stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("DomainLoss.domain"));
  EXPECT_THAT(s.error_message(), HasSubstr("UTF-8"));
  EXPECT_TRUE(Serving());
}

// Unary requests with invalid UTF-8 got `INTERNAL: ''`.
TEST_F(HostileInputTest, UnaryInvalidUtf8IsInvalidArgumentNamingTheField) {
  {
    v1::CreateRunRequest req;
    req.set_name(std::string("r\xc3", 2));
    req.set_world_size(1);
    grpc::Status s = CreateRunWith(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("CreateRunRequest.name"));
    EXPECT_THAT(s.error_message(), HasSubstr("UTF-8"));
  }
  {
    grpc::ClientContext ctx;
    v1::AddQuarantineRequest req;
    req.mutable_entry()->set_run("r1");
    req.mutable_entry()->set_domain("web");
    req.mutable_entry()->set_reason(std::string("bad \xff reason", 12));
    v1::QuarantineEntry out;
    grpc::Status s = supervisor_->AddQuarantine(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("QuarantineEntry.reason"));
  }
  {
    // A server-streaming call too.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::WatchIncidentsRequest req;
    req.set_run(std::string("r1\xfe", 3));
    auto reader = supervisor_->WatchIncidents(&ctx, req);
    v1::IncidentUpdate update;
    EXPECT_FALSE(reader->Read(&update));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("WatchIncidentsRequest.run"));
  }
  EXPECT_TRUE(Serving());
}

// Bytes that are no protobuf at all: INVALID_ARGUMENT too, not INTERNAL ''.
TEST_F(HostileInputTest, MalformedUnaryRequestIsInvalidArgument) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  const std::string garbage("\x0a\xff\xff\xff\xff\x0f", 6);  // a length past the end
  grpc::Slice slice(garbage);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call = generic.PrepareUnaryCall(&ctx, "/spikeguard.v1.SupervisorService/GetRun", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("could not be parsed"));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// Connections that never send gRPC's preface (a TCP connect, then nothing,
// or a few bytes) held their slot for gRPC's default handshake timeout,
// 120 s. The daemon closes them after 10 s and serves on meanwhile.
TEST_F(HostileInputTest, SilentConnectionsAreClosedAfterTheHandshakeTimeout) {
  std::vector<int> silent;
  for (int i = 0; i < 50; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(daemon_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (i % 2 == 1) (void)send(fd, "PRI * HTTP/2.0\r\n", 16, MSG_NOSIGNAL);  // half a preface
    silent.push_back(fd);
  }
  EXPECT_TRUE(Serving());
  const absl::Time start = absl::Now();
  std::vector<bool> closed(silent.size(), false);
  size_t open = silent.size();
  while (open > 0 && absl::Now() - start < absl::Seconds(30)) {
    for (size_t i = 0; i < silent.size(); ++i) {
      if (closed[i]) continue;
      char buf[256];
      const ssize_t n = recv(silent[i], buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        closed[i] = true;
        --open;
      }
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::printf("50 silent connections: %zu still open after %s\n", open,
              absl::FormatDuration(absl::Now() - start).c_str());
  EXPECT_EQ(open, 0u);
  for (int fd : silent) close(fd);
  EXPECT_TRUE(Serving());
}

// The walker the fuzzers and tools use names the path, indices included.
TEST(FindInvalidUtf8FieldTest, NamesThePath) {
  v1::WorkerMessage msg;
  auto* batch = msg.mutable_reports();
  batch->add_reports()->add_domain_losses()->set_domain("ok");
  auto* r = batch->add_reports();
  r->add_domain_losses()->set_domain("fine");
  r->add_domain_losses()->set_domain("xx");
  std::string bytes = msg.SerializeAsString();
  EXPECT_EQ(daemon::FindInvalidUtf8Field(v1::WorkerMessage::descriptor(), bytes), "");
  bytes[bytes.rfind("xx")] = '\xff';
  EXPECT_EQ(daemon::FindInvalidUtf8Field(v1::WorkerMessage::descriptor(), bytes),
            "reports.reports[1].domain_losses[1].domain");
}

// Replay from_step=-3 and Skip from=-10 named to_step; Skip
// 20..INT64_MAX reported a wrapped negative number.
TEST_F(HostileInputTest, ReplayAndSkipNameTheRightFieldWithoutOverflow) {
  {
    grpc::ClientContext ctx;
    v1::ReplayRequest req;
    req.set_run("r1");
    req.set_from_step(-3);
    v1::ActionResponse out;
    grpc::Status s = supervisor_->Replay(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("from_step: -3 is negative"));
  }
  {
    grpc::ClientContext ctx;
    v1::SkipRequest req;
    req.set_run("r1");
    req.set_from_step(-10);
    req.set_to_step(5);
    v1::ActionResponse out;
    grpc::Status s = supervisor_->Skip(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("from_step: -10 is negative"));
  }
  {
    grpc::ClientContext ctx;
    v1::SkipRequest req;
    req.set_run("r1");
    req.set_from_step(20);
    req.set_to_step(kInt64Max);
    v1::ActionResponse out;
    grpc::Status s = supervisor_->Skip(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("to_step: 9223372036854775807"));
    EXPECT_THAT(s.error_message(), Not(HasSubstr("-9223372036854775808")));
  }
  {
    grpc::ClientContext ctx;
    v1::RewindRequest req;
    req.set_run("r1");
    req.set_to_step(0);
    auto* w = req.add_skip();
    w->set_from_step(3);
    w->set_to_step(1);
    v1::ActionResponse out;
    grpc::Status s = supervisor_->Rewind(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("skip[0].to_step: 1 is before skip[0].from_step 3"));
  }
}

// CreateRun stored mode=99, NaN blend weights, negative plan ranges;
// SetPolicy accepted z_threshold=inf and windows of 2^31-1.
TEST_F(HostileInputTest, CreateRunAndSetPolicyValidateEveryField) {
  auto base = [] {
    v1::CreateRunRequest req;
    req.set_name("r2");
    req.set_world_size(1);
    return req;
  };
  {
    v1::CreateRunRequest req = base();
    req.set_mode(static_cast<v1::Mode>(99));
    grpc::Status s = CreateRunWith(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("mode: 99"));
  }
  {
    v1::CreateRunRequest req = base();
    (*req.mutable_spec()->mutable_manifest()->mutable_blend())["web"] =
        std::numeric_limits<double>::quiet_NaN();
    grpc::Status s = CreateRunWith(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("spec.manifest.blend['web']"));
  }
  {
    v1::CreateRunRequest req = base();
    auto* range = req.mutable_spec()->mutable_manifest()->mutable_data_plan()->add_ranges();
    range->set_begin(-5);
    range->set_end(10);
    grpc::Status s = CreateRunWith(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("spec.manifest.data_plan.ranges[0].begin: -5"));
  }
  {
    v1::CreateRunRequest req = base();
    auto* range = req.mutable_spec()->mutable_manifest()->mutable_data_plan()->add_ranges();
    range->set_begin(10);
    range->set_end(4);
    grpc::Status s = CreateRunWith(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("spec.manifest.data_plan.ranges[0].end: 4"));
  }
  {
    // A 5 MB spec is not stored (it made `runs list` unreadable for all).
    v1::CreateRunRequest req = base();
    req.mutable_spec()->mutable_manifest()->set_dataset_fingerprint(std::string(5 << 20, 'f'));
    grpc::Status s = CreateRunWith(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("spec: "));
    EXPECT_THAT(s.error_message(), HasSubstr("more than the limit"));
  }
  {
    grpc::ClientContext ctx;
    v1::GetRunRequest req;
    req.set_name("r2");
    v1::Run run;
    EXPECT_EQ(supervisor_->GetRun(&ctx, req, &run).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  auto set_policy = [&](const v1::Policy& policy) {
    grpc::ClientContext ctx;
    v1::SetPolicyRequest req;
    req.set_run("r1");
    *req.mutable_policy() = policy;
    v1::Policy out;
    return supervisor_->SetPolicy(&ctx, req, &out);
  };
  {
    v1::Policy p;
    p.mutable_loss_spike()->set_z_threshold(std::numeric_limits<double>::infinity());
    grpc::Status s = set_policy(p);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("loss_spike.z_threshold"));
  }
  {
    v1::Policy p;
    p.mutable_grad_norm_spike()->set_window(std::numeric_limits<int32_t>::max());
    grpc::Status s = set_policy(p);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("grad_norm_spike.window"));
    EXPECT_THAT(s.error_message(), HasSubstr("2147483647"));
  }
  {
    v1::Policy p;
    p.mutable_precursor()->set_trend_window(std::numeric_limits<int32_t>::max());
    grpc::Status s = set_policy(p);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("precursor.trend_window"));
  }
  EXPECT_TRUE(Serving());
}

class PagingTest : public HostileInputTest {
 protected:
  void SetUp() override {
    limits_.max_response_bytes = 4096;
    HostileInputTest::SetUp();
  }
};

// Every list response is paged under a byte budget, and spikectl
// follows the pages.
TEST_F(PagingTest, ListRunsAndQuarantineComeInPagesThatSpikectlFollows) {
  constexpr int kRuns = 40;
  for (int i = 0; i < kRuns; ++i) {
    v1::CreateRunRequest req;
    req.set_name(absl::StrCat("paged-", i));
    req.set_world_size(1);
    req.mutable_spec()->mutable_manifest()->set_dataset_fingerprint(std::string(400, 'a' + i % 26));
    ASSERT_TRUE(CreateRunWith(req).ok());
  }
  std::set<std::string> names;
  v1::ListRunsRequest req;
  int pages = 0;
  while (true) {
    grpc::ClientContext ctx;
    v1::ListRunsResponse page;
    ASSERT_TRUE(supervisor_->ListRuns(&ctx, req, &page).ok());
    EXPECT_LE(page.ByteSizeLong(), 4096u + 1024u);
    for (const auto& r : page.runs()) EXPECT_TRUE(names.insert(r.name()).second) << r.name();
    ++pages;
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
    ASSERT_LT(pages, 100);
  }
  EXPECT_GT(pages, 2);
  EXPECT_EQ(names.size(), static_cast<size_t>(kRuns + 1));

  {
    grpc::ClientContext ctx;
    v1::ListRunsRequest bad;
    bad.set_page_token("not-a-token");
    v1::ListRunsResponse page;
    grpc::Status s = supervisor_->ListRuns(&ctx, bad, &page);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("page_token"));
  }

  std::string out, err;
  ASSERT_EQ(Spikectl({"runs", "list", "--output=json"}, &out, &err), 0) << err;
  for (int i = 0; i < kRuns; ++i) EXPECT_THAT(out, HasSubstr(absl::StrCat("paged-", i, "\"")));

  for (int i = 0; i < 60; ++i) {
    grpc::ClientContext ctx;
    v1::AddQuarantineRequest add;
    add.mutable_entry()->set_run("r1");
    add.mutable_entry()->set_domain("web");
    add.mutable_entry()->set_document_id(i);
    add.mutable_entry()->set_reason(std::string(200, 'r'));
    v1::QuarantineEntry stored;
    ASSERT_TRUE(supervisor_->AddQuarantine(&ctx, add, &stored).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::ListQuarantineRequest list;
    list.set_run("r1");
    v1::ListQuarantineResponse page;
    ASSERT_TRUE(supervisor_->ListQuarantine(&ctx, list, &page).ok());
    EXPECT_LT(page.entries_size(), 60);
    EXPECT_FALSE(page.next_page_token().empty());
  }
  ASSERT_EQ(Spikectl({"quarantine", "list", "--run=r1", "--output=json"}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("\"document_id\":\"59\""));
  EXPECT_THAT(out, HasSubstr("\"document_id\":\"0\""));
}

TEST_F(PagingTest, ListCheckpointsComesInPagesThatSpikectlFollows) {
  constexpr int kCheckpoints = 40;
  for (int i = 0; i < kCheckpoints; ++i) {
    grpc::ClientContext ctx;
    v1::RegisterCheckpointRequest req;
    v1::Checkpoint* c = req.mutable_checkpoint();
    c->set_run("r1");
    c->set_step(i * 10);
    // Inside the run's checkpoint root (DATA_DIR/runs/RUN without a profile).
    c->set_uri(absl::StrCat("file://", dir_.path(), "/runs/r1/", std::string(250, 'c'), "-", i));
    c->set_complete(true);
    v1::Checkpoint out;
    grpc::Status s = supervisor_->RegisterCheckpoint(&ctx, req, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  std::set<int64_t> steps;
  v1::ListCheckpointsRequest req;
  req.set_run("r1");
  int pages = 0;
  while (true) {
    grpc::ClientContext ctx;
    v1::ListCheckpointsResponse page;
    ASSERT_TRUE(supervisor_->ListCheckpoints(&ctx, req, &page).ok());
    for (const auto& c : page.checkpoints()) EXPECT_TRUE(steps.insert(c.step()).second);
    ++pages;
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
    ASSERT_LT(pages, 100);
  }
  EXPECT_GT(pages, 2);
  EXPECT_EQ(steps.size(), static_cast<size_t>(kCheckpoints));
  std::string out, err;
  ASSERT_EQ(Spikectl({"checkpoints", "list", "--run=r1", "--output=json"}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("\"step\":\"390\""));
  EXPECT_THAT(out, HasSubstr("\"step\":\"0\""));
}

// 600 steps x 1,024 layers made a 31 MB QueryTelemetry response that
// `spikectl telemetry` could not read.
TEST_F(HostileInputTest, WideTelemetryComesInPagesThatSpikectlFollows) {
  StreamWide(600, 1024);
  grpc::ClientContext ctx;
  v1::QueryTelemetryRequest req;
  req.set_run("r1");
  v1::QueryTelemetryResponse page;
  grpc::Status s = supervisor_->QueryTelemetry(&ctx, req, &page);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_TRUE(page.truncated());
  EXPECT_GT(page.records_size(), 0);
  EXPECT_LT(page.records_size(), 600);
  EXPECT_EQ(page.next_from_step(), page.records(page.records_size() - 1).step() + 1);
  EXPECT_LE(page.ByteSizeLong(), 2u << 20);

  std::string out, err;
  ASSERT_EQ(Spikectl({"telemetry", "--run=r1", "--metrics=loss,max_attn_logit", "--output=json"},
                     &out, &err),
            0)
      << err;
  EXPECT_THAT(out, HasSubstr("\"step\":\"599\""));
  EXPECT_THAT(out, HasSubstr("\"step\":\"0\""));
}

// The per-rank raw-report windows kept 512 reports per rank (~50 MB
// at 1,024 layers) that nothing read, never freed after the streams closed.
TEST(RunRegistryTest, KeepsNoRawReports) {
  daemon::RunRegistry registry(Clock::Real());
  registry.Connect("r", 0, 0, "host");
  const size_t heap_before = mallinfo2().uordblks;
  for (int round = 0; round < 10; ++round) {
    std::vector<v1::StepReport> reports;
    for (int k = 0; k < 64; ++k) reports.push_back(Wide(round * 64 + k, 1024));
    registry.AddReports("r", 0, reports);
  }
  const size_t heap_after = mallinfo2().uordblks;
  EXPECT_LT(heap_after, heap_before + (1u << 20))
      << "the registry holds " << (heap_after - heap_before) / (1 << 20) << " MB";
  auto ranks = registry.Ranks("r");
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].last_step(), 639);
}

// WatchIncidents on an unknown run stayed open while ListIncidents
// said NOT_FOUND.
TEST_F(HostileInputTest, WatchIncidentsOnAnUnknownRunIsNotFound) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::WatchIncidentsRequest req;
  req.set_run("ghost");
  auto reader = supervisor_->WatchIncidents(&ctx, req);
  v1::IncidentUpdate update;
  EXPECT_FALSE(reader->Read(&update));
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("ghost"));
}

// Checkpoint notices with an empty URI or a negative step were only
// logged; the worker now gets an Ack (seq 0: no batch) saying why.
TEST_F(HostileInputTest, InvalidCheckpointNoticesAreAnsweredToTheWorker) {
  auto a = Attach("r1");
  ASSERT_TRUE(a.first.has_welcome());
  auto send = [&](const v1::WorkerMessage& m) {
    EXPECT_TRUE(a.stream->Write(m));
    v1::ControllerMessage in;
    EXPECT_TRUE(a.stream->Read(&in));
    EXPECT_TRUE(in.has_ack()) << in.DebugString();
    return in.ack();
  };
  {
    v1::WorkerMessage m;
    m.mutable_checkpoint()->set_step(5);
    v1::Ack ack = send(m);
    EXPECT_EQ(ack.seq(), 0u);
    EXPECT_EQ(ack.rejected(), 1);
    EXPECT_THAT(ack.message(), HasSubstr("checkpoint.uri: empty"));
  }
  {
    v1::WorkerMessage m;
    m.mutable_checkpoint()->set_step(-1);
    m.mutable_checkpoint()->set_uri("ckpt/step-1");
    v1::Ack ack = send(m);
    EXPECT_THAT(ack.message(), HasSubstr("checkpoint.step: -1 is negative"));
  }
  {
    v1::WorkerMessage m;
    m.mutable_checkpoint_deleted()->set_step(3);
    v1::Ack ack = send(m);
    EXPECT_THAT(ack.message(), HasSubstr("checkpoint_deleted.uri: empty"));
  }
  a.stream->WritesDone();
  a.stream->Finish();
}

// Captures what the process writes to stderr (the daemon's log) meanwhile.
class StderrCapture {
 public:
  StderrCapture() : path_(std::filesystem::temp_directory_path() /
                          absl::StrCat("sg-stderr-", getpid(), ".log")) {
    fflush(stderr);
    saved_ = dup(2);
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
  }
  std::string Stop() {
    fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    std::filesystem::remove(path_);
    return text.str();
  }

 private:
  std::filesystem::path path_;
  int saved_ = -1;
};

// Worker text (command results, errors) went raw into the log,
// control characters included.
TEST_F(HostileInputTest, WorkerTextIsEscapedAndCutInTheLog) {
  auto a = Attach("r1");
  ASSERT_TRUE(a.first.has_welcome());
  StderrCapture capture;
  v1::WorkerMessage m;
  m.mutable_command_result()->set_command_id("c1");
  m.mutable_command_result()->set_ok(false);
  m.mutable_command_result()->set_message("boom\nE1202 00:00:00.000 forged.cc:1] all good\x1b[2J" +
                                          std::string(10000, 'x'));
  ASSERT_TRUE(a.stream->Write(m));
  // A heartbeat round trip is not answered; a batch is: it orders the log.
  ASSERT_EQ(SendBatch(a.stream.get(), 1, {Report(0)}).accepted(), 1);
  const std::string log = capture.Stop();
  a.stream->WritesDone();
  a.stream->Finish();
  EXPECT_THAT(log, HasSubstr("boom\\nE1202 00:00:00.000 forged.cc:1] all good\\x1b[2J"));
  EXPECT_THAT(log, Not(HasSubstr("\nE1202 00:00:00.000 forged.cc:1]")));
  EXPECT_THAT(log, Not(HasSubstr("\x1b")));
  EXPECT_THAT(log, Not(HasSubstr(std::string(1000, 'x'))));
  EXPECT_THAT(log, HasSubstr("bytes)"));
}

TEST(LogTextTest, EscapesAndCuts) {
  EXPECT_EQ(daemon::LogText("a\nb\x01\\c\t"), "a\\nb\\x01\\\\c\\t");
  EXPECT_EQ(daemon::LogText("caf\xc3\xa9"), "caf\xc3\xa9");  // valid UTF-8 kept
  EXPECT_EQ(daemon::LogText(std::string("x\xff", 2)), "x\\xff");
  EXPECT_EQ(daemon::LogText(std::string(20, 'y'), 5), "yyyyy...(20 bytes)");
}

class HelloDeadlineTest : public DaemonFixture {
 protected:
  void SetUp() override {
    limits_.hello_timeout = absl::Seconds(1);
    limits_.max_pending_hellos = 2;
    DaemonFixture::SetUp();
    ASSERT_TRUE(CreateRun("r1").ok());
  }

  struct Silent {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<Stream> stream;
  };
  Silent OpenSilent() {
    Silent s;
    s.ctx = std::make_unique<grpc::ClientContext>();
    s.ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    s.stream = worker_->Attach(s.ctx.get());
    return s;
  }
};

// A stream that never sent its hello held an OS thread for ever.
TEST_F(HelloDeadlineTest, AStreamWithoutHelloEndsAtTheDeadline) {
  Silent s = OpenSilent();
  const auto start = std::chrono::steady_clock::now();
  v1::ControllerMessage in;
  EXPECT_FALSE(s.stream->Read(&in));
  grpc::Status status = s.stream->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("no hello within 1s"));
  EXPECT_THAT(status.error_message(), HasSubstr("hello_timeout"));
  auto ok = Attach("r1");
  EXPECT_TRUE(ok.first.has_welcome());
  ok.stream->WritesDone();
  ok.stream->Finish();
}

TEST_F(HelloDeadlineTest, TooManyStreamsWaitingForHelloAreRefused) {
  Silent a = OpenSilent();
  Silent b = OpenSilent();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Silent c = OpenSilent();
  v1::ControllerMessage in;
  EXPECT_FALSE(c.stream->Read(&in));
  grpc::Status status = c.stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("max_pending_hellos"));
  // The two silent ones end at their deadline; then a stream attaches.
  EXPECT_EQ(a.stream->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(b.stream->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  auto ok = Attach("r1");
  EXPECT_TRUE(ok.first.has_welcome());
  ok.stream->WritesDone();
  ok.stream->Finish();
}

// A read-only or full data dir: the error names the path and cause.
TEST(DataDirTest, UnwritableDataDirNamesThePathAndTheCause) {
  TempDir dir;
  std::string data_dir;
  if (geteuid() != 0) {
    data_dir = (std::filesystem::path(dir.path()) / "ro").string();
    std::filesystem::create_directories(data_dir);
    std::filesystem::permissions(data_dir, std::filesystem::perms::owner_read |
                                               std::filesystem::perms::owner_exec);
  } else {
    // root writes through permissions: /proc/self holds no new files.
    data_dir = "/proc/self";
  }
  daemon::Daemon::Options options;
  options.listen = "127.0.0.1:0";
  options.data_dir = data_dir;
  options.allow_anonymous = true;
  auto d = daemon::Daemon::Start(options);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr(data_dir + "/"));
  // The cause, as the OS said it.
  EXPECT_THAT(std::string(d.status().message()),
              ::testing::AnyOf(HasSubstr("Permission denied"), HasSubstr("Read-only"),
                               HasSubstr("No such file"), HasSubstr("Operation not permitted")));
  if (geteuid() != 0) {
    std::filesystem::permissions(data_dir, std::filesystem::perms::owner_all);
  }
}

TEST(DataDirTest, ReadOnlyOrFullCatalogWritesNameThePathAndTheCause) {
  TempDir dir;
  const std::string path = (std::filesystem::path(dir.path()) / "c.db").string();
  storage::DatabaseOptions options;
  options.path = path;
  auto db = storage::Database::Open(options);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Execute("CREATE TABLE t(x BLOB)").ok());
  // SQLite's own read-only and size limits stand in for a read-only mount
  // and a full disk (tests may run as root, where chmod does not stop writes).
  ASSERT_TRUE((*db)->Execute("PRAGMA query_only = 1").ok());
  absl::Status ro = (*db)->Execute("INSERT INTO t VALUES (1)");
  ASSERT_FALSE(ro.ok());
  EXPECT_THAT(std::string(ro.message()), HasSubstr(path));
  EXPECT_THAT(std::string(ro.message()), HasSubstr("readonly"));
  ASSERT_TRUE((*db)->Execute("PRAGMA query_only = 0").ok());
  ASSERT_TRUE((*db)->Execute("PRAGMA max_page_count = 3").ok());
  absl::Status full = (*db)->Execute("INSERT INTO t VALUES (randomblob(100000))");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr(path));
  EXPECT_THAT(std::string(full.message()), HasSubstr("full"));
}

}  // namespace
}  // namespace spikeguard::testing
