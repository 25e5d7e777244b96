// A scripted stand-in for spikeguardd's WorkerService on a loopback port, for
// tests of what a worker says and how it obeys: it welcomes every hello at
// the generation the worker names, acknowledges every report batch, records
// every message in arrival order, and sends the commands a test gives it to
// the newest stream.
//
//   ScriptedController controller;
//   options.client.address = controller.address();
//   ... start the worker ...
//   ASSERT_TRUE(controller.WaitFor([&] { return controller.MaxStep(0) >= 9; }));
//   controller.Send(rewind);
//
// For security tests it can serve over TLS, record each stream's
// `authorization` metadata, and answer a stream whose bearer token is not
// the expected one with Reject(BAD_TOKEN) or with an RPC status:
//
//   ScriptedController::Config config;
//   config.credentials = GetTestCerts().ServerCredentials();
//   config.expected_token = "t0ken";
//   ScriptedController controller(config);
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "spikeguard/v1/worker.grpc.pb.h"

namespace spikeguard::testing {

class ScriptedController final : public spikeguard::v1::WorkerService::Service {
 public:
  using Stream = grpc::ServerReaderWriter<spikeguard::v1::ControllerMessage,
                                          spikeguard::v1::WorkerMessage>;

  struct Config {
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
    // Set: a stream without `authorization: Bearer <expected_token>` is
    // refused, with `refusal` when it is not OK, else with Reject(BAD_TOKEN).
    std::string expected_token;
    grpc::Status refusal = grpc::Status::OK;
  };

  ScriptedController() : ScriptedController(Config()) {}
  explicit ScriptedController(Config config) : config_(std::move(config)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", config_.credentials, &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedController() override { server_->Shutdown(absl::ToChronoTime(absl::Now())); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::Status Attach(grpc::ServerContext* context, Stream* stream) override {
    std::string authorization;
    if (auto it = context->client_metadata().find("authorization");
        it != context->client_metadata().end()) {
      authorization.assign(it->second.data(), it->second.size());
    }
    {
      absl::MutexLock lock(&mu_);
      authorizations_.push_back(authorization);
    }
    if (!config_.expected_token.empty() &&
        authorization != "Bearer " + config_.expected_token) {
      if (!config_.refusal.ok()) return config_.refusal;
      spikeguard::v1::WorkerMessage hello;
      stream->Read(&hello);
      spikeguard::v1::ControllerMessage reject;
      reject.mutable_reject()->set_reason(spikeguard::v1::Reject::BAD_TOKEN);
      reject.mutable_reject()->set_message("unknown bearer token");
      stream->Write(reject);
      return grpc::Status::OK;
    }
    spikeguard::v1::WorkerMessage msg;
    if (!stream->Read(&msg) || !msg.has_hello()) return grpc::Status::OK;
    {
      absl::MutexLock lock(&mu_);
      messages_.push_back(msg);
      spikeguard::v1::ControllerMessage welcome;
      welcome.mutable_welcome()->set_run(msg.hello().run());
      welcome.mutable_welcome()->set_generation(msg.hello().generation());
      welcome.mutable_welcome()->set_committed_step(-1);
      stream->Write(welcome);
      stream_ = stream;
    }
    while (stream->Read(&msg)) {
      absl::MutexLock lock(&mu_);
      messages_.push_back(msg);
      if (msg.has_reports()) {
        spikeguard::v1::ControllerMessage ack;
        ack.mutable_ack()->set_seq(msg.reports().seq());
        ack.mutable_ack()->set_accepted(msg.reports().reports_size());
        stream->Write(ack);
      }
    }
    absl::MutexLock lock(&mu_);
    if (stream_ == stream) stream_ = nullptr;
    return grpc::Status::OK;
  }

  // Sends `command` on the newest stream, waiting up to 30 s for one.
  bool Send(const spikeguard::v1::Command& command) {
    absl::MutexLock lock(&mu_);
    auto live = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stream_ != nullptr; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&live), absl::Seconds(30))) return false;
    spikeguard::v1::ControllerMessage out;
    *out.mutable_command() = command;
    return stream_->Write(out);
  }

  // Waits up to `timeout` for `done` (evaluated on a snapshot of the messages).
  bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return done();
  }

  // The `authorization` metadata of every stream opened, in order ("" when
  // absent).
  std::vector<std::string> authorizations() const {
    absl::MutexLock lock(&mu_);
    return authorizations_;
  }

  std::vector<spikeguard::v1::WorkerMessage> messages() const {
    absl::MutexLock lock(&mu_);
    return messages_;
  }

  // Every step report of `generation`, in arrival order.
  std::vector<spikeguard::v1::StepReport> Reports(int64_t generation) const {
    std::vector<spikeguard::v1::StepReport> out;
    for (const auto& m : messages()) {
      if (!m.has_reports() || m.reports().generation() != generation) continue;
      out.insert(out.end(), m.reports().reports().begin(), m.reports().reports().end());
    }
    return out;
  }

  // The highest step reported in `generation`; -1 when none.
  int64_t MaxStep(int64_t generation) const {
    int64_t max = -1;
    for (const auto& r : Reports(generation)) max = std::max<int64_t>(max, r.step());
    return max;
  }

  // The report of `step` in `generation`, if any.
  std::optional<spikeguard::v1::StepReport> ReportAt(int64_t generation, int64_t step) const {
    for (const auto& r : Reports(generation)) {
      if (r.step() == step) return r;
    }
    return std::nullopt;
  }

  // Messages with the given body, in arrival order.
  std::vector<spikeguard::v1::WorkerMessage> Of(
      spikeguard::v1::WorkerMessage::BodyCase body) const {
    std::vector<spikeguard::v1::WorkerMessage> out;
    for (const auto& m : messages()) {
      if (m.body_case() == body) out.push_back(m);
    }
    return out;
  }

  // The result of command `id`, if it came.
  std::optional<spikeguard::v1::CommandResult> ResultOf(const std::string& id) const {
    for (const auto& m : Of(spikeguard::v1::WorkerMessage::kCommandResult)) {
      if (m.command_result().command_id() == id) return m.command_result();
    }
    return std::nullopt;
  }

  // The newest CheckpointSaved at `step`, if any.
  std::optional<spikeguard::v1::CheckpointSaved> CheckpointAt(int64_t step) const {
    std::optional<spikeguard::v1::CheckpointSaved> out;
    for (const auto& m : Of(spikeguard::v1::WorkerMessage::kCheckpoint)) {
      if (m.checkpoint().step() == step) out = m.checkpoint();
    }
    return out;
  }

 private:
  const Config config_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  std::vector<spikeguard::v1::WorkerMessage> messages_ ABSL_GUARDED_BY(mu_);
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spikeguard::testing
