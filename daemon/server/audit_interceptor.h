// audit_interceptor.h
// -----------------------------------------------------------------------------
// Writes one audit row per mutating call (and per call refused for want of
// a token or a permission) once its status is known: the principal, the
// role, the RPC, the run, the outcome (the status code's name), what was
// asked or why it was refused (escaped, bounded), and the peer. Installed on
// the gRPC server, so no handler can forget it; `spikectl audit` reads it.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"

namespace spikeguard::storage {
class Catalog;
}

namespace spikeguard::auth {
class Authorizer;
}

namespace spikeguard::daemon {

// Whether a SupervisorService / WorkerService method (its short name,
// e.g. "Rewind") changes state and is audited whatever its outcome.
bool IsMutatingRpc(const std::string& method);

// Records a stream refused UNAUTHENTICATED or PERMISSION_DENIED (other
// outcomes are not recorded), as the interceptor does for other calls.
void AuditRefusedStream(const auth::Authorizer* authorizer, storage::Catalog* catalog,
                        const grpc::ServerContextBase& context, const std::string& rpc,
                        const std::string& run, const grpc::Status& status);

// Records a call refused UNAUTHENTICATED before its request was read
// (auth/token_gate.h): `method` is the full name ("/spikeguard.v1.X/Rewind");
// the run is unknown, so the row has none. Other services are not recorded.
void AuditRefusedBeforeRead(storage::Catalog* catalog, const std::string& method,
                            const grpc::Status& status);

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeAuditInterceptorFactory(
    const auth::Authorizer* authorizer, storage::Catalog* catalog);

}  // namespace spikeguard::daemon
