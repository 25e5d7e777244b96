// status_util.h
// -----------------------------------------------------------------------------
// The one mapping from absl::Status to grpc::Status. Codes keep their
// meaning (Abseil's rule): UNAVAILABLE = retry the same call, ABORTED = retry
// at a higher level, FAILED_PRECONDITION = do not retry until state changes.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace spikeguard::daemon {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace spikeguard::daemon
