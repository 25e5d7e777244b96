// token_gate.h
// -----------------------------------------------------------------------------
// Authentication before a request is read. gRPC reads a unary call's whole
// request message (up to the daemon's 16 MB receive limit) before any
// handler runs, so a caller without a token could make the daemon buffer
// and parse megabytes per call. TokenGate is a grpc::AuthMetadataProcessor:
// gRPC runs it on the call's metadata as the call arrives, and a call it
// refuses ends UNAUTHENTICATED before its message is read. It authenticates
// only (the token names a principal of the live table, reloads included);
// the handlers still authorize roles and runs as before.
//
// Calls that need no token pass: the standard health check
// (/grpc.health.v1.Health/) and, when enabled, server reflection. So does
// the worker stream (WorkerService/Attach), which authenticates as it opens,
// before reading its first message, and answers a bad token with a Reject
// the worker reports. A refused call is handed to `on_refused` (the audit
// log) with its method's full name; what it asked is unknown, its run too.
//
// gRPC runs a processor only on secure credentials: the daemon installs it
// with TLS, and for clear text on a loopback address through local
// credentials (grpc::experimental::LocalServerCredentials(LOCAL_TCP), clear
// text as before for any client). Clear text on another address
// (--insecure) has no gate: there handlers authenticate after the read.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "daemon/auth/authorizer.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace spikeguard::auth {

class TokenGate final : public grpc::AuthMetadataProcessor {
 public:
  using RefusedFn = std::function<void(const std::string& method, const grpc::Status& status)>;
  TokenGate(const Authorizer* authorizer, RefusedFn on_refused)
      : authorizer_(authorizer), on_refused_(std::move(on_refused)) {}

  // On a thread of gRPC's auth executor: on_refused may write.
  bool IsBlocking() const override { return true; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // Calls refused before their message was read.
  int64_t refused() const { return refused_.load(); }

 private:
  const Authorizer* const authorizer_;
  const RefusedFn on_refused_;
  std::atomic<int64_t> refused_{0};
};

}  // namespace spikeguard::auth
