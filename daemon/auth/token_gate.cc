#include "daemon/auth/token_gate.h"

#include <string>

#include "absl/strings/match.h"

namespace spikeguard::auth {

grpc::Status TokenGate::Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                                OutputMetadata* consumed_auth_metadata,
                                OutputMetadata* response_metadata) {
  (void)context;
  (void)consumed_auth_metadata;
  (void)response_metadata;
  std::string method;
  if (auto path = auth_metadata.find(":path"); path != auth_metadata.end()) {
    method.assign(path->second.data(), path->second.size());
    if (absl::StartsWith(method, "/grpc.health.v1.Health/") ||
        absl::StartsWith(method, "/grpc.reflection.v1alpha.ServerReflection/") ||
        absl::StartsWith(method, "/grpc.reflection.v1.ServerReflection/") ||
        method == "/spikeguard.v1.WorkerService/Attach") {
      return grpc::Status::OK;
    }
  }
  std::string value;
  const bool present = auth_metadata.count("authorization") > 0;
  if (present) {
    const auto& v = auth_metadata.find("authorization")->second;
    value.assign(v.data(), v.size());
  }
  absl::StatusOr<Principal> who = authorizer_->Authenticate(present ? &value : nullptr);
  if (who.ok()) return grpc::Status::OK;
  ++refused_;
  grpc::Status refused(grpc::StatusCode::UNAUTHENTICATED, std::string(who.status().message()));
  if (on_refused_) on_refused_(method, refused);
  return refused;
}

}  // namespace spikeguard::auth
