// client_security.h
// -----------------------------------------------------------------------------
// How a client reaches spikeguardd: the bearer token every call carries and
// the channel's TLS credentials. Shared by spikectl, the C++ worker client
// (spikeguard-worker, spikeguard-tracegen) and mirrored by the Python package
// (worker/python/spikeguard/client.py).
//
// The token travels as gRPC metadata `authorization: Bearer <token>` on every
// call and on the Attach stream (added to each ClientContext: gRPC's call
// credentials are not sent over an insecure channel). TLS is on when a CA is
// given: the daemon's certificate must chain to it. A client certificate and
// key add mutual TLS.
//
// Environment variables (flags override them):
//   SPIKEGUARD_TOKEN            the token
//   SPIKEGUARD_TOKEN_FILE       a file whose first line is the token (trimmed)
//   SPIKEGUARD_TLS_CA           PEM roots that verify the daemon; set => TLS
//   SPIKEGUARD_TLS_CERT         client certificate (PEM), for mutual TLS
//   SPIKEGUARD_TLS_KEY          its private key (PEM)
//   SPIKEGUARD_TLS_SERVER_NAME  the name checked in the daemon's certificate
//                               (default: the host of the address)
// A token given directly wins over a token file from the same level (flag or
// environment); any flag wins over the environment.
//
// The token is never printed or logged: errors name where it came from
// ("SPIKEGUARD_TOKEN", "--token-file '/etc/sg/token'"), never its value.
//
//   ClientSecurity security = ClientSecurity::FromEnv();
//   security.SetTokenFile(path, "--token-file");       // a flag overrides
//   absl::StatusOr<ResolvedSecurity> resolved = security.Resolve();
//   auto channel = CreateClientChannel(address, *resolved, grpc::ChannelArguments());
//   grpc::ClientContext ctx;
//   resolved->Authorize(&ctx);
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace spikeguard {

struct ResolvedSecurity;

// What a client was told; Resolve() reads the files and checks it.
class ClientSecurity {
 public:
  // Every SPIKEGUARD_* variable that is set and not empty.
  static ClientSecurity FromEnv();

  // Each setter replaces the value (and where it came from, e.g. "--tls-ca",
  // used in errors). A token and a token file replace each other.
  void SetToken(std::string token, std::string origin);
  void SetTokenFile(std::string path, std::string origin);
  void SetTlsCa(std::string path, std::string origin);
  void SetTlsCert(std::string path, std::string origin);
  void SetTlsKey(std::string path, std::string origin);
  void SetTlsServerName(std::string name, std::string origin);

  bool has_token() const { return !token_.value.empty() || !token_file_.value.empty(); }
  bool tls() const { return !tls_ca_.value.empty(); }

  // Reads the token file and the PEM files. Errors name the file and the
  // flag or variable that gave it, never the token.
  absl::StatusOr<ResolvedSecurity> Resolve() const;

 private:
  struct Setting {
    std::string value;
    std::string origin;
  };
  Setting token_, token_file_, tls_ca_, tls_cert_, tls_key_, tls_server_name_;
};

struct ResolvedSecurity {
  // The token ("" = none) and where it came from ("SPIKEGUARD_TOKEN",
  // "--token-file '/path'"), for messages.
  std::string token;
  std::string token_origin;
  bool tls = false;
  std::string tls_origin;  // e.g. "--tls-ca '/path'"
  bool mutual_tls = false;
  std::string server_name;  // "" = the address's host
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // insecure without TLS

  // Adds `authorization: Bearer <token>` to `context` (nothing without one).
  void Authorize(grpc::ClientContext* context) const;

  // A hint for a failed call, "" when there is none to give: what to set
  // for UNAUTHENTICATED, what the token lacks for PERMISSION_DENIED, what to
  // check for a connection that failed (TLS or not).
  std::string Hint(grpc::StatusCode code) const;
};

// A channel to `address` with `resolved`'s credentials; the server name
// override goes into `args`.
std::shared_ptr<grpc::Channel> CreateClientChannel(const std::string& address,
                                                   const ResolvedSecurity& resolved,
                                                   grpc::ChannelArguments args);

// The first line of `path`, trimmed, checked to be a usable bearer token;
// `what` names the source in errors ("--token-file").
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view what);

}  // namespace spikeguard
