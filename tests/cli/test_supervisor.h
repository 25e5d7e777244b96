// test_supervisor.h
// -----------------------------------------------------------------------------
// A SupervisorService for spikectl's tests: it records every request and
// answers with canned responses or errors, served by a real gRPC server on
// an ephemeral loopback port.
//
//   RecordingSupervisor supervisor;
//   supervisor.SetError("GetRun", grpc::Status(grpc::StatusCode::NOT_FOUND, "no"));
//   TestServer server(&supervisor);
//   RunSpikectl({"--addr=" + server.address(), "runs", "show", "x"}, out, err);
//   EXPECT_EQ(supervisor.LastRequest<v1::GetRunRequest>("GetRun").name(), "x");
//   EXPECT_EQ(supervisor.LastAuthorization("GetRun"), "Bearer t0ken");
//
// TestServer serves over TLS when given server credentials
// (tests/testdata/test_certs.h makes them).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"

namespace spikeguard::cli::testing {

namespace v1 = ::spikeguard::v1;

class RecordingSupervisor final : public v1::SupervisorService::Service {
 public:
  // `method` (e.g. "GetRun") answers `response` from now on; without one it
  // answers an empty message.
  void SetResponse(const std::string& method, const google::protobuf::Message& response) {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<google::protobuf::Message> copy(response.New());
    copy->CopyFrom(response);
    responses_[method] = std::move(copy);
  }
  // `method` fails with `status` from now on.
  void SetError(const std::string& method, grpc::Status status) {
    absl::MutexLock lock(&mu_);
    errors_[method] = std::move(status);
  }
  // WatchIncidents writes these updates, then ends with `end`.
  void SetUpdates(std::vector<v1::IncidentUpdate> updates, grpc::Status end = grpc::Status::OK) {
    absl::MutexLock lock(&mu_);
    updates_ = std::move(updates);
    watch_end_ = std::move(end);
  }

  // ListAudit answers the page stored under the request's page_token.
  void SetAuditPages(std::map<std::string, v1::ListAuditResponse> pages) {
    absl::MutexLock lock(&mu_);
    audit_pages_ = std::move(pages);
  }

  // The `authorization` metadata of every call, in order ("" when absent).
  std::vector<std::string> authorizations() const {
    absl::MutexLock lock(&mu_);
    return authorizations_;
  }
  // The `authorization` metadata of the last call of `method`.
  std::string LastAuthorization(const std::string& method) const {
    absl::MutexLock lock(&mu_);
    for (size_t i = calls_.size(); i > 0; --i) {
      if (calls_[i - 1].first == method) return authorizations_[i - 1];
    }
    ADD_FAILURE() << method << " was not called";
    return "";
  }

  // Names of the methods called, in order.
  std::vector<std::string> methods() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> names;
    for (const auto& call : calls_) names.push_back(call.first);
    return names;
  }
  // The last request `method` received; fails the test if there was none.
  template <typename Request>
  Request LastRequest(const std::string& method) const {
    absl::MutexLock lock(&mu_);
    for (auto it = calls_.rbegin(); it != calls_.rend(); ++it) {
      if (it->first == method) {
        Request request;
        request.CopyFrom(*it->second);
        return request;
      }
    }
    ADD_FAILURE() << method << " was not called";
    return Request();
  }

#define SG_TEST_UNARY(Method, Request, Response)                                          \
  grpc::Status Method(grpc::ServerContext* context, const v1::Request* request,           \
                      v1::Response* response) override {                                 \
    return Handle(context, #Method, *request, response);                                  \
  }
  SG_TEST_UNARY(GetStatus, GetStatusRequest, ServerStatus)
  SG_TEST_UNARY(CreateRun, CreateRunRequest, Run)
  SG_TEST_UNARY(GetRun, GetRunRequest, Run)
  SG_TEST_UNARY(ListRuns, ListRunsRequest, ListRunsResponse)
  SG_TEST_UNARY(SetRunProfile, SetRunProfileRequest, Run)
  SG_TEST_UNARY(ListCheckpoints, ListCheckpointsRequest, ListCheckpointsResponse)
  SG_TEST_UNARY(RegisterCheckpoint, RegisterCheckpointRequest, Checkpoint)
  SG_TEST_UNARY(PinCheckpoint, PinCheckpointRequest, Checkpoint)
  SG_TEST_UNARY(QueryTelemetry, QueryTelemetryRequest, QueryTelemetryResponse)
  SG_TEST_UNARY(ListIncidents, ListIncidentsRequest, ListIncidentsResponse)
  SG_TEST_UNARY(GetIncident, GetIncidentRequest, Incident)
  SG_TEST_UNARY(Rewind, RewindRequest, ActionResponse)
  SG_TEST_UNARY(Replay, ReplayRequest, ActionResponse)
  SG_TEST_UNARY(Skip, SkipRequest, ActionResponse)
  SG_TEST_UNARY(Pause, PauseRequest, ActionResponse)
  SG_TEST_UNARY(Resume, ResumeRequest, ActionResponse)
  SG_TEST_UNARY(Approve, ApproveRequest, ActionResponse)
  SG_TEST_UNARY(Abort, AbortRequest, ActionResponse)
  SG_TEST_UNARY(GetPolicy, GetPolicyRequest, Policy)
  SG_TEST_UNARY(SetPolicy, SetPolicyRequest, Policy)
  SG_TEST_UNARY(ResolveManifest, ResolveManifestRequest, ResolveManifestResponse)
  SG_TEST_UNARY(ListQuarantine, ListQuarantineRequest, ListQuarantineResponse)
  SG_TEST_UNARY(AddQuarantine, AddQuarantineRequest, QuarantineEntry)
#undef SG_TEST_UNARY

  grpc::Status ListAudit(grpc::ServerContext* context, const v1::ListAuditRequest* request,
                         v1::ListAuditResponse* response) override {
    grpc::Status status = Handle(context, "ListAudit", *request, response);
    absl::MutexLock lock(&mu_);
    if (auto it = audit_pages_.find(request->page_token()); status.ok() && it != audit_pages_.end()) {
      response->CopyFrom(it->second);
    }
    return status;
  }

  grpc::Status WatchIncidents(grpc::ServerContext* context,
                              const v1::WatchIncidentsRequest* request,
                              grpc::ServerWriter<v1::IncidentUpdate>* writer) override {
    std::vector<v1::IncidentUpdate> updates;
    grpc::Status end;
    {
      absl::MutexLock lock(&mu_);
      Record(context, "WatchIncidents", *request);
      updates = updates_;
      end = watch_end_;
    }
    for (const v1::IncidentUpdate& update : updates) writer->Write(update);
    return end;
  }

 private:
  void Record(grpc::ServerContext* context, const std::string& method,
              const google::protobuf::Message& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::shared_ptr<google::protobuf::Message> copy(request.New());
    copy->CopyFrom(request);
    calls_.emplace_back(method, std::move(copy));
    std::string authorization;
    const auto& metadata = context->client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      authorization.assign(it->second.data(), it->second.size());
    }
    authorizations_.push_back(std::move(authorization));
  }

  grpc::Status Handle(grpc::ServerContext* context, const std::string& method,
                      const google::protobuf::Message& request,
                      google::protobuf::Message* response) {
    absl::MutexLock lock(&mu_);
    Record(context, method, request);
    if (auto it = errors_.find(method); it != errors_.end()) return it->second;
    if (auto it = responses_.find(method); it != responses_.end()) {
      response->CopyFrom(*it->second);
    }
    return grpc::Status::OK;
  }

  mutable absl::Mutex mu_;
  std::vector<std::pair<std::string, std::shared_ptr<google::protobuf::Message>>> calls_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<google::protobuf::Message>> responses_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, grpc::Status> errors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);  // one per call
  std::map<std::string, v1::ListAuditResponse> audit_pages_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::IncidentUpdate> updates_ ABSL_GUARDED_BY(mu_);
  grpc::Status watch_end_ ABSL_GUARDED_BY(mu_);
};

// A real gRPC server on 127.0.0.1 at a port the kernel picks; in clear
// unless given credentials (TLS).
class TestServer {
 public:
  explicit TestServer(grpc::Service* service,
                      std::shared_ptr<grpc::ServerCredentials> credentials =
                          grpc::InsecureServerCredentials()) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    EXPECT_GT(port_, 0);
  }
  ~TestServer() {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace spikeguard::cli::testing
