// http_server.h
// -----------------------------------------------------------------------------
// The daemon's read-only web view and Prometheus endpoint (--http-listen; off
// by default, loopback by default when on), served by Debian's cpp-httplib:
//
//   /               runs and their state
//   /runs/NAME      the run's telemetry plots by generation, its incidents
//   /incidents/ID   the incident report (report/incident_report.h)
//   /metrics        Prometheus text format (daemon/metrics)
//   /healthz        "ok" (no token needed)
//
// Same TLS files and the same tokens as the gRPC side: the pages are built
// from SupervisorService calls over the daemon's in-process channel carrying
// the caller's token, so a viewer token sees exactly what it sees over gRPC.
// The token comes as "Authorization: Bearer TOKEN", or as the password of
// HTTP Basic authentication (any user name) so a browser can log in; a
// missing or unknown token gets 401 with a Basic challenge. Pages are plain
// HTML with inline SVG and CSS: no scripts, nothing fetched from elsewhere.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/http/http_connections.h"
#include "grpcpp/channel.h"

namespace spikeguard::auth {
class Authorizer;
}
namespace spikeguard::metrics {
class Registry;
}

namespace spikeguard::daemon {

struct HttpOptions {
  // "HOST:PORT", ":PORT" or "PORT" (host 127.0.0.1); port 0 picks one.
  std::string listen;
  // PEM files: TLS on when set (the gRPC side's --tls-cert/--tls-key);
  // client_ca: clients must present a certificate it signed (mutual TLS).
  std::string tls_cert_file, tls_key_file, tls_client_ca_file;
  // Serve clear text on a non-loopback address (refused otherwise).
  bool insecure = false;
  // Connections: how many at once, and how long a request may take to arrive
  // (daemon/http/http_connections.h).
  ConnectionLimits limits;
};

class HttpServer {
 public:
  // Binds and starts serving on threads of its own. `authorizer` decides
  // who may read /metrics, which `metrics` renders; `channel` reaches the
  // daemon's SupervisorService (its in-process channel), which serves the
  // pages on the caller's behalf. The first two outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpOptions& options,
                                                           const auth::Authorizer* authorizer,
                                                           metrics::Registry* metrics,
                                                           std::shared_ptr<grpc::Channel> channel);
  ~HttpServer();

  int port() const { return port_; }
  bool tls() const { return tls_; }
  void Stop();

 private:
  HttpServer() = default;
  void Install();

  const auth::Authorizer* authorizer_ = nullptr;
  metrics::Registry* metrics_ = nullptr;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<httplib::Server> server_;
  RequestServer* requests_ = nullptr;  // server_, its parser and router
  SSL_CTX* ssl_ctx_ = nullptr;         // server_'s when TLS is on
  std::unique_ptr<ConnectionLoop> connections_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace spikeguard::daemon
