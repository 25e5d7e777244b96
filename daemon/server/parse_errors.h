// parse_errors.h
// -----------------------------------------------------------------------------
// Requests that do not parse get INVALID_ARGUMENT naming the field, not
// gRPC's `INTERNAL: ''`.
//
// Protobuf refuses a proto3 string field holding invalid UTF-8 while gRPC
// deserializes a request, before any handler runs; gRPC then answers
// INTERNAL with an empty message (unary and server-streaming calls) or ends
// the stream's Read loop as if the client had half-closed (bidi streams).
// Protobuf names the field in the error it logs, on the deserializing
// thread: InstallParseErrorCapture() keeps that name in a thread-local, the
// interceptor turns the empty INTERNAL into INVALID_ARGUMENT with it, and a
// stream handler asks TakeParseError() after its Read loop.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/support/server_interceptor.h"

namespace spikeguard::daemon {

// Idempotent; forwards every protobuf log message to the handler that was
// installed before.
void InstallParseErrorCapture();

// The field ("spikeguard.v1.DomainLoss.domain") whose invalid UTF-8 made the
// last parse on this thread fail, and forgets it; "" when none.
std::string TakeParseError();

// The message a stream or call that failed to parse is answered with.
// The field of the last message of a client-streaming call that failed to
// parse (invalid UTF-8), "" when none did; kept by the interceptor of
// MakeParseErrorInterceptorFactory.
std::string TakeStreamParseError(const grpc::ServerContextBase* context);

std::string ParseErrorMessage(const std::string& field, const char* what);

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory();

}  // namespace spikeguard::daemon
