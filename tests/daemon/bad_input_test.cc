// Bad input of every kind gets a clear error naming what was wrong, the daemon
// stays up, and nothing already accepted is lost.
#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "tests/daemon/daemon_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;

class BadInputTest : public DaemonFixture {
 protected:
  void SetUp() override {
    limits_.max_message_bytes = 256 << 10;
    limits_.max_layers_per_report = 64;
    limits_.max_domains_per_report = 8;
    DaemonFixture::SetUp();
    ASSERT_TRUE(CreateRun("r1").ok());
  }

  // Accepts steps 0..9 so later tests can check nothing accepted was lost.
  void AcceptTen(Stream* stream) {
    std::vector<v1::StepReport> reports;
    for (int s = 0; s < 10; ++s) reports.push_back(Report(s, 2.0 + s));
    v1::Ack ack = SendBatch(stream, 1, reports);
    ASSERT_EQ(ack.accepted(), 10);
  }

  void ExpectTenStillThere() {
    auto records = Query("r1");
    ASSERT_EQ(records.size(), 10u);
    for (int s = 0; s < 10; ++s) {
      EXPECT_EQ(records[s].step(), s);
      EXPECT_EQ(records[s].ranks_reported(), 1u);
      EXPECT_DOUBLE_EQ(records[s].loss(), 2.0 + s);
    }
    EXPECT_TRUE(Serving());
  }
};

TEST_F(BadInputTest, UnknownRunIsRejectedByName) {
  auto a = Attach("no-such-run");
  ASSERT_TRUE(a.first.has_reject());
  EXPECT_EQ(a.first.reject().reason(), v1::Reject::UNKNOWN_RUN);
  EXPECT_THAT(a.first.reject().message(), HasSubstr("no-such-run"));
  grpc::Status s = a.stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Serving());
}

TEST_F(BadInputTest, StaleGenerationIsRejected) {
  auto a = Attach("r1", 0, 1, /*generation=*/3);
  ASSERT_TRUE(a.first.has_reject());
  EXPECT_EQ(a.first.reject().reason(), v1::Reject::STALE_GENERATION);
  EXPECT_EQ(a.first.reject().current_generation(), 0);
  EXPECT_THAT(a.first.reject().message(), HasSubstr("generation 3"));
  EXPECT_EQ(a.stream->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // A batch that claims another generation than its stream is fenced too.
  auto ok = Attach("r1");
  ASSERT_TRUE(ok.first.has_welcome());
  AcceptTen(ok.stream.get());
  v1::WorkerMessage msg;
  msg.mutable_reports()->set_seq(2);
  msg.mutable_reports()->set_generation(7);
  *msg.mutable_reports()->add_reports() = Report(10);
  ASSERT_TRUE(ok.stream->Write(msg));
  v1::ControllerMessage in;
  ASSERT_TRUE(ok.stream->Read(&in));
  ASSERT_TRUE(in.has_reject());
  EXPECT_EQ(in.reject().reason(), v1::Reject::STALE_GENERATION);
  ok.stream->Finish();
  ExpectTenStillThere();
}

TEST_F(BadInputTest, HelloMustComeFirstAndBeValid) {
  v1::WorkerMessage heartbeat;
  heartbeat.mutable_heartbeat()->set_step(1);
  auto a = AttachWith(heartbeat);
  ASSERT_TRUE(a.first.has_reject());
  EXPECT_EQ(a.first.reject().reason(), v1::Reject::INVALID_HELLO);
  EXPECT_THAT(a.first.reject().message(), HasSubstr("hello"));
  a.stream->Finish();

  auto b = Attach("r1", /*rank=*/4, /*world_size=*/2);
  ASSERT_TRUE(b.first.has_reject());
  EXPECT_THAT(b.first.reject().message(), HasSubstr("hello.rank"));
  b.stream->Finish();

  auto c = Attach("r1", 0, /*world_size=*/4);  // the run has world size 1
  ASSERT_TRUE(c.first.has_reject());
  EXPECT_THAT(c.first.reject().message(), HasSubstr("world_size"));
  c.stream->Finish();
  EXPECT_TRUE(Serving());
}

TEST_F(BadInputTest, GarbageStringsAreRefused) {
  auto a = Attach(std::string("r1\x01\x00zz", 5));
  ASSERT_TRUE(a.first.has_reject());
  EXPECT_EQ(a.first.reject().reason(), v1::Reject::INVALID_HELLO);
  EXPECT_THAT(a.first.reject().message(), HasSubstr("hello.run"));
  a.stream->Finish();

  {
    // Invalid UTF-8 in a string field never parses: the stream fails, the
    // daemon does not.
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_run(std::string("r1\xff\xfe", 4));
    hello.mutable_hello()->set_world_size(1);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = worker_->Attach(&ctx);
    stream->Write(hello);
    v1::ControllerMessage in;
    EXPECT_FALSE(stream->Read(&in) && in.has_welcome());
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("could not be parsed"));
  }

  auto b = Attach(std::string(10000, 'x'));
  ASSERT_TRUE(b.first.has_reject());
  EXPECT_THAT(b.first.reject().message(), HasSubstr("longer than"));
  b.stream->Finish();

  auto ok = Attach("r1");
  ASSERT_TRUE(ok.first.has_welcome());
  AcceptTen(ok.stream.get());
  v1::StepReport bad = Report(10);
  auto* d = bad.add_domain_losses();
  d->set_domain(std::string("pro\x01se\n", 7));
  d->set_loss(1.0);
  v1::Ack ack = SendBatch(ok.stream.get(), 2, {bad});
  EXPECT_EQ(ack.accepted(), 0);
  EXPECT_EQ(ack.rejected(), 1);
  EXPECT_THAT(ack.message(), HasSubstr("reports[0].domain_losses[0].domain"));
  EXPECT_THAT(ack.message(), HasSubstr("control character"));

  grpc::ClientContext ctx;
  v1::CreateRunRequest req;
  req.set_name("bad name; DROP TABLE runs");
  req.set_world_size(1);
  v1::Run run;
  grpc::Status s = supervisor_->CreateRun(&ctx, req, &run);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("run: name"));
  ok.stream->WritesDone();
  ok.stream->Finish();
  ExpectTenStillThere();
}

TEST_F(BadInputTest, NegativeStepIsRejectedAndTheStreamGoesOn) {
  auto a = Attach("r1");
  ASSERT_TRUE(a.first.has_welcome());
  v1::Ack bad = SendBatch(a.stream.get(), 1, {Report(-5)});
  EXPECT_EQ(bad.rejected(), 1);
  EXPECT_THAT(bad.message(), HasSubstr("reports[0].step: -5 is negative"));
  // The same stream still delivers valid reports.
  std::vector<v1::StepReport> reports;
  for (int s = 0; s < 10; ++s) reports.push_back(Report(s, 2.0 + s));
  EXPECT_EQ(SendBatch(a.stream.get(), 2, reports).accepted(), 10);
  a.stream->WritesDone();
  a.stream->Finish();
  ExpectTenStillThere();
}

TEST_F(BadInputTest, TooManyLayersOrDomainsAreRejected) {
  auto a = Attach("r1");
  AcceptTen(a.stream.get());
  v1::Ack layers = SendBatch(a.stream.get(), 2, {Report(10, 2.0, /*layers=*/65)});
  EXPECT_EQ(layers.rejected(), 1);
  EXPECT_THAT(layers.message(), HasSubstr("reports[0].layers: 65 layers, more than the limit 64"));
  v1::StepReport domains = Report(10);
  for (int i = 0; i < 9; ++i) {
    auto* d = domains.add_domain_losses();
    d->set_domain("d" + std::to_string(i));
  }
  v1::Ack dom = SendBatch(a.stream.get(), 3, {domains});
  EXPECT_EQ(dom.rejected(), 1);
  EXPECT_THAT(dom.message(), HasSubstr("domain_losses: 9 domains"));
  a.stream->WritesDone();
  a.stream->Finish();
  ExpectTenStillThere();
}

TEST_F(BadInputTest, OversizedMessageFailsTheStreamOnly) {
  auto a = Attach("r1");
  AcceptTen(a.stream.get());
  v1::WorkerMessage huge;
  huge.mutable_reports()->set_seq(2);
  v1::StepReport r = Report(10);
  auto* d = r.add_domain_losses();
  d->set_domain(std::string(512 << 10, 'a'));
  *huge.mutable_reports()->add_reports() = r;
  a.stream->Write(huge);
  v1::ControllerMessage in;
  EXPECT_FALSE(a.stream->Read(&in));
  grpc::Status s = a.stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  ExpectTenStillThere();
}

TEST_F(BadInputTest, DuplicateAndOutOfOrderStepsAreNotStoredTwice) {
  auto a = Attach("r1");
  AcceptTen(a.stream.get());
  // A resend of steps 5..9: all duplicates.
  std::vector<v1::StepReport> again;
  for (int s = 5; s < 10; ++s) again.push_back(Report(s, 99.0));
  v1::Ack dup = SendBatch(a.stream.get(), 2, again);
  EXPECT_EQ(dup.accepted(), 0);
  EXPECT_EQ(dup.duplicates(), 5);
  EXPECT_THAT(dup.message(), HasSubstr("already committed step 9"));
  // Out of order inside one batch: refused, naming the step.
  v1::Ack order = SendBatch(a.stream.get(), 3, {Report(12), Report(11)});
  EXPECT_EQ(order.rejected(), 2);
  EXPECT_THAT(order.message(), HasSubstr("reports[1].step: 11 is out of order"));
  a.stream->WritesDone();
  a.stream->Finish();
  ExpectTenStillThere();  // losses are the first delivery's, not 99
}

TEST_F(BadInputTest, NanAndInfAreStoredAsData) {
  auto a = Attach("r1");
  v1::StepReport r = Report(0, std::numeric_limits<double>::quiet_NaN());
  r.set_grad_norm(std::numeric_limits<double>::infinity());
  r.set_lse_max(-std::numeric_limits<double>::infinity());
  r.set_nonfinite_count(3);
  r.mutable_layers(1)->set_max_attn_logit(std::numeric_limits<double>::infinity());
  EXPECT_EQ(SendBatch(a.stream.get(), 1, {r}).accepted(), 1);
  a.stream->WritesDone();
  a.stream->Finish();
  RestartDaemon();  // from the file, not from memory
  auto records = Query("r1");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_TRUE(std::isnan(records[0].loss()));
  EXPECT_TRUE(std::isinf(records[0].grad_norm()) && records[0].grad_norm() > 0);
  EXPECT_TRUE(std::isinf(records[0].lse_max()) && records[0].lse_max() < 0);
  EXPECT_EQ(records[0].nonfinite_count(), 3);
  ASSERT_EQ(records[0].layers_size(), 2);
  EXPECT_TRUE(std::isinf(records[0].layers(1).max_attn_logit()));
}

TEST_F(BadInputTest, SupervisorRequestsAreValidated) {
  {
    grpc::ClientContext ctx;
    v1::QueryTelemetryRequest req;
    req.set_run("r1");
    req.add_metrics("loss");
    req.add_metrics("bogus_metric");
    v1::QueryTelemetryResponse out;
    grpc::Status s = supervisor_->QueryTelemetry(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("unknown metric 'bogus_metric'"));
  }
  {
    grpc::ClientContext ctx;
    v1::QueryTelemetryRequest req;
    req.set_run("r1");
    req.set_from_step(-1);
    v1::QueryTelemetryResponse out;
    grpc::Status s = supervisor_->QueryTelemetry(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("from_step"));
  }
  {
    grpc::ClientContext ctx;
    v1::GetRunRequest req;
    req.set_name("ghost");
    v1::Run out;
    grpc::Status s = supervisor_->GetRun(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("ghost"));
  }
  {
    EXPECT_EQ(CreateRun("r1").error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_EQ(CreateRun("r2", 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::GetIncidentRequest req;
    req.set_id(-4);
    v1::Incident out;
    grpc::Status s = supervisor_->GetIncident(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("id"));
  }
  {
    grpc::ClientContext ctx;
    v1::GetIncidentRequest req;
    req.set_id(999);
    v1::Incident out;
    EXPECT_EQ(supervisor_->GetIncident(&ctx, req, &out).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    // A manual rewind of a run without checkpoints is refused with the reason.
    grpc::ClientContext ctx;
    v1::RewindRequest req;
    req.set_run("r1");
    req.set_to_step(100);
    v1::ActionResponse out;
    grpc::Status s = supervisor_->Rewind(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("no complete checkpoint"));
  }
  {
    grpc::ClientContext ctx;
    v1::SetPolicyRequest req;
    req.set_run("r1");
    req.mutable_policy()->mutable_loss_spike()->set_z_threshold(-3);
    v1::Policy out;
    grpc::Status s = supervisor_->SetPolicy(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("z_threshold"));
  }
  EXPECT_TRUE(Serving());
}

TEST_F(BadInputTest, MetricsFilterKeepsWhatWasAsked) {
  auto a = Attach("r1");
  AcceptTen(a.stream.get());
  a.stream->WritesDone();
  a.stream->Finish();
  grpc::ClientContext ctx;
  v1::QueryTelemetryRequest req;
  req.set_run("r1");
  req.set_from_step(3);
  req.set_to_step(5);
  req.add_metrics("loss");
  req.add_metrics("max_attn_logit");
  v1::QueryTelemetryResponse out;
  ASSERT_TRUE(supervisor_->QueryTelemetry(&ctx, req, &out).ok());
  ASSERT_EQ(out.records_size(), 3);
  EXPECT_EQ(out.records(0).step(), 3);
  EXPECT_DOUBLE_EQ(out.records(0).loss(), 5.0);
  EXPECT_EQ(out.records(0).grad_norm(), 0.0);  // not asked for
  ASSERT_EQ(out.records(0).layers_size(), 2);
  EXPECT_DOUBLE_EQ(out.records(0).layers(1).max_attn_logit(), 11.0);
}

// Not bad input, but the same real daemon: the run's state (what `spikectl
// runs show` prints) follows PAUSE and CONTINUE, which the incident engine
// and operators send through the same RunControl. It used to stay "running"
// (or "created") while the run was paused.
class RunStateTest : public DaemonFixture {};

TEST_F(RunStateTest, PauseAndResumeShowInTheRunState) {
  ASSERT_TRUE(CreateRun("r1").ok());
  auto state = [&] {
    grpc::ClientContext ctx;
    v1::GetRunRequest req;
    req.set_name("r1");
    v1::Run run;
    EXPECT_TRUE(supervisor_->GetRun(&ctx, req, &run).ok());
    return run.state();
  };
  EXPECT_EQ(state(), v1::RUN_CREATED);
  auto a = Attach("r1");
  ASSERT_FALSE(a.first.has_reject()) << a.first.DebugString();

  {
    grpc::ClientContext ctx;
    v1::PauseRequest req;
    req.set_run("r1");
    v1::ActionResponse out;
    ASSERT_TRUE(supervisor_->Pause(&ctx, req, &out).ok());
    EXPECT_TRUE(out.accepted());
  }
  // The rank gets the command, and the run shows as paused.
  v1::ControllerMessage in;
  ASSERT_TRUE(a.stream->Read(&in));
  ASSERT_TRUE(in.has_command()) << in.DebugString();
  EXPECT_EQ(in.command().kind(), v1::Command::PAUSE);
  EXPECT_EQ(state(), v1::RUN_PAUSED);

  {
    grpc::ClientContext ctx;
    v1::ResumeRequest req;
    req.set_run("r1");
    v1::ActionResponse out;
    ASSERT_TRUE(supervisor_->Resume(&ctx, req, &out).ok());
  }
  ASSERT_TRUE(a.stream->Read(&in));
  EXPECT_EQ(in.command().kind(), v1::Command::CONTINUE);
  EXPECT_EQ(state(), v1::RUN_RUNNING);
  a.stream->WritesDone();
  a.ctx->TryCancel();
}

}  // namespace
}  // namespace spikeguard::testing
