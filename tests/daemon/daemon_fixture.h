// A real spikeguardd (the Daemon class) on an ephemeral loopback port with a
// real catalog file in a temp dir, and real gRPC stubs to talk to it.
#pragma once

#include <cmath>
#include <memory>
#include <string>

#include "daemon/daemon.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"
#include "spikeguard/v1/worker.grpc.pb.h"
#include "tests/e2e/process.h"

namespace spikeguard::testing {

namespace v1 = spikeguard::v1;

class DaemonFixture : public ::testing::Test {
 protected:
  void SetUp() override { StartDaemon(); }

  void StartDaemon(int port = 0) {
    daemon::Daemon::Options options;
    options.listen = "127.0.0.1:" + std::to_string(port);
    options.data_dir = dir_.path();
    options.limits = limits_;
    // These tests exercise ingest and validation; authentication has its
    // own tests (auth_test.cc), which override ConfigureDaemon.
    options.allow_anonymous = true;
    ConfigureDaemon(options);
    auto d = daemon::Daemon::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    address_ = "127.0.0.1:" + std::to_string(daemon_->port());
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    supervisor_ = v1::SupervisorService::NewStub(channel_);
    worker_ = v1::WorkerService::NewStub(channel_);
  }

  // Adjusts the daemon's options before each start.
  virtual void ConfigureDaemon(daemon::Daemon::Options& options) { (void)options; }

  void RestartDaemon() {
    const int port = daemon_->port();
    daemon_->Shutdown(absl::Seconds(1));
    daemon_.reset();
    StartDaemon(port);
  }

  grpc::Status CreateRun(const std::string& name, uint32_t world_size = 1) {
    grpc::ClientContext ctx;
    v1::CreateRunRequest req;
    req.set_name(name);
    req.set_world_size(world_size);
    v1::Run out;
    return supervisor_->CreateRun(&ctx, req, &out);
  }

  std::vector<v1::StepRecord> Query(const std::string& run, int64_t from = 0,
                                    std::optional<int64_t> generation = std::nullopt) {
    grpc::ClientContext ctx;
    v1::QueryTelemetryRequest req;
    req.set_run(run);
    req.set_from_step(from);
    if (generation) req.set_generation(*generation);
    v1::QueryTelemetryResponse out;
    grpc::Status s = supervisor_->QueryTelemetry(&ctx, req, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {out.records().begin(), out.records().end()};
  }

  // The daemon still answers.
  bool Serving() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ServerStatus status;
    return supervisor_->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok();
  }

  static v1::StepReport Report(int64_t step, double loss = 2.0, int layers = 2) {
    v1::StepReport r;
    r.set_step(step);
    r.set_data_position(step);
    r.set_loss(loss);
    r.set_grad_norm(0.5);
    r.set_lr(1e-3);
    r.set_tokens(1024);
    for (int l = 0; l < layers; ++l) {
      auto* ls = r.add_layers();
      ls->set_layer(l);
      ls->set_max_attn_logit(10.0 + l);
    }
    return r;
  }

  using Stream = grpc::ClientReaderWriter<v1::WorkerMessage, v1::ControllerMessage>;

  // An attached stream: sends the hello and reads the first answer.
  struct Attached {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<Stream> stream;
    v1::ControllerMessage first;
  };

  Attached Attach(const std::string& run, uint32_t rank = 0, uint32_t world_size = 1,
                  int64_t generation = 0) {
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_run(run);
    hello.mutable_hello()->set_rank(rank);
    hello.mutable_hello()->set_world_size(world_size);
    hello.mutable_hello()->set_generation(generation);
    return AttachWith(hello);
  }

  Attached AttachWith(const v1::WorkerMessage& first_message) {
    Attached a;
    a.ctx = std::make_unique<grpc::ClientContext>();
    a.ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    a.stream = worker_->Attach(a.ctx.get());
    EXPECT_TRUE(a.stream->Write(first_message));
    EXPECT_TRUE(a.stream->Read(&a.first));
    return a;
  }

  // Sends a batch and returns its ack.
  static v1::Ack SendBatch(Stream* stream, uint64_t seq, const std::vector<v1::StepReport>& reports) {
    v1::WorkerMessage msg;
    msg.mutable_reports()->set_seq(seq);
    for (const auto& r : reports) *msg.mutable_reports()->add_reports() = r;
    EXPECT_TRUE(stream->Write(msg));
    v1::ControllerMessage in;
    EXPECT_TRUE(stream->Read(&in));
    EXPECT_TRUE(in.has_ack()) << in.DebugString();
    return in.ack();
  }

  TempDir dir_;
  daemon::Limits limits_;
  std::unique_ptr<daemon::Daemon> daemon_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SupervisorService::Stub> supervisor_;
  std::unique_ptr<v1::WorkerService::Stub> worker_;
};

}  // namespace spikeguard::testing
