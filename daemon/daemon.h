// daemon.h
// -----------------------------------------------------------------------------
// `Daemon` is spikeguardd without its flags: it opens (and migrates) the
// catalog, serves WorkerService and SupervisorService plus the standard gRPC
// health service (and server reflection when asked), and shuts down cleanly:
// stop accepting, let in-flight calls finish (their commits are
// acknowledged), close the catalog.
//
// Security (docs/ARCHITECTURE.md, "Security model"): every call is authenticated by a bearer token
// from the tokens file and authorized by its principal's role and runs
// (daemon/auth/); mutating calls are audited. Without a tokens file the
// daemon makes one in the data dir with an `admin` principal whose token it
// writes to DATA_DIR/admin.token (mode 0600). TLS (and mutual TLS) when a
// certificate is given; in clear only on loopback, unless `insecure`.
//
//   Daemon::Options options;
//   options.listen = "127.0.0.1:0";
//   options.data_dir = "/var/lib/spikeguard";
//   SG_ASSIGN_OR_RETURN(auto daemon, Daemon::Start(options));
//   std::cout << daemon->port();
//   daemon->Shutdown(absl::Seconds(5));
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "spikeguard/v1/policy.pb.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/control/stream_hub.h"
#include "daemon/ingest/counters.h"
#include "daemon/ingest/limits.h"
#include "daemon/ingest/run_registry.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/metrics/registry.h"

namespace grpc {
class Server;
}

namespace spikeguard::storage {
class Catalog;
}

namespace spikeguard::auth {
class Authorizer;
class TokenGate;
}

namespace spikeguard::daemon {

class HttpServer;

class WorkerServiceImpl;
class SupervisorServiceImpl;
class OperatorHandler;
class Supervisor;
class LocalLauncher;
class SlurmLauncher;
class ProfileLauncher;
class LaunchProfiles;
class CheckpointGuard;
class GroupCommitter;

class Daemon {
 public:
  struct Options {
    // HOST:PORT; port 0 picks a free one (see port()).
    std::string listen = "127.0.0.1:7070";
    // Holds catalog.db unless catalog_path says otherwise.
    std::string data_dir = "./spikeguard-data";
    std::string catalog_path;
    // Where launched workers dial the daemon; default 127.0.0.1:PORT.
    std::string advertise_address;
    Limits limits;
    // Installed as the daemon-wide default policy ("" scope) at startup.
    std::optional<spikeguard::v1::Policy> default_policy;
    Clock* clock = Clock::Real();
    // Launch profiles (daemon/launch/launch_profiles.proto, text format): the
    // only command lines the daemon executes. "": none, no run is launched.
    std::string launch_profiles_file;

    // --- Security -----------------------------------------------------------
    // Tokens file (see daemon/auth/tokens.h). "": DATA_DIR/tokens, created
    // with an admin principal on first start.
    std::string tokens_file;
    // Authentication off: every caller is admin. Refused off loopback.
    bool allow_anonymous = false;
    // PEM files. A certificate and key: TLS. A client CA too: mutual TLS
    // (clients must present a certificate that CA signed).
    std::string tls_cert_file;
    std::string tls_key_file;
    std::string tls_client_ca_file;
    // Listen in clear on a non-loopback address anyway (warned at start).
    bool insecure = false;
    // gRPC server reflection (off: it tells any caller the whole API).
    bool reflection = false;
    // What the ranks the daemon launches use to verify it (default: the
    // certificate itself, right for a self-signed one or a full chain), and
    // their client certificate for mutual TLS.
    std::string worker_tls_ca_file;
    std::string worker_tls_cert_file;
    std::string worker_tls_key_file;
    // The name the workers check in the daemon's certificate ("": the host
    // of the advertised address).
    std::string worker_tls_server_name;

    // --- Web view and /metrics (daemon/http) --------------------------------
    // "": off. HOST:PORT, :PORT or PORT (host 127.0.0.1); port 0 picks one
    // (see http_port()). Uses the TLS files and tokens above.
    std::string http_listen;

    // Benchmarks: each step record's exact detection latency (see
    // Supervisor::SetLatencyObserver); called on the runs' pipelines.
    std::function<void(const metrics::DetectionLatency&)> detection_latency_observer;
    // Crash tests: called on the commit thread after each telemetry group is
    // durable and before its acks (GroupCommitter::Options::after_commit).
    // spikeguardd sets none; tests/e2e/spikeguardd_crash_point.cc does.
    std::function<void(int64_t committed_groups)> after_group_commit = nullptr;
  };

  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const Options& options);
  ~Daemon();

  int port() const { return port_; }
  // The daemon's instruments (what /metrics exports), for in-process
  // benchmarks and tests.
  const metrics::DaemonMetrics& metrics() const;
  const std::string& catalog_path() const { return catalog_path_; }
  // The admin token file the daemon generated ("" when it used a given
  // tokens file or authentication is off).
  const std::string& generated_admin_token_file() const { return admin_token_file_; }
  bool tls() const { return tls_; }
  // The web view's port (0: not serving one).
  int http_port() const;

  // Re-reads the tokens file (SIGHUP); on error the old table stays.
  absl::Status ReloadTokens();

  // Blocks until the server has shut down.
  void Wait();
  // Stops accepting, waits up to `grace` for in-flight calls, then cancels
  // them; closes the catalog. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  Daemon() = default;
  // Loads the launch profiles, sets up the checkpoint confinement, and logs
  // every legacy run (free command, no profile) an admin must map.
  absl::Status StartLaunchProfiles(const Options& options);

  int port_ = 0;
  std::string catalog_path_;
  std::string admin_token_file_;
  bool tls_ = false;
  std::unique_ptr<auth::Authorizer> authorizer_;
  std::shared_ptr<auth::TokenGate> token_gate_;  // null without one (auth/token_gate.h)
  std::unique_ptr<storage::Catalog> catalog_;
  std::unique_ptr<LaunchProfiles> profiles_;
  std::unique_ptr<CheckpointGuard> checkpoints_;
  // Shared by the components built over them in Start: the live ranks, the
  // streams commands are pushed to, ingest's counters, the instruments.
  absl::Time started_;
  std::unique_ptr<RunRegistry> registry_;
  StreamHub hub_;
  Counters counters_;
  metrics::Registry metrics_registry_;
  metrics::DaemonMetrics metrics_{&metrics_registry_};
  // The ingest stage's group commit (declared before the supervisor, which
  // takes from its queue, and the worker service, which feeds it).
  std::unique_ptr<GroupCommitter> ingest_;
  std::unique_ptr<Supervisor> supervisor_;
  std::unique_ptr<LocalLauncher> local_launcher_;
  std::unique_ptr<SlurmLauncher> slurm_launcher_;
  // Routes a run to one of the two by its profile.
  std::unique_ptr<ProfileLauncher> launcher_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<OperatorHandler> operator_handler_;
  std::unique_ptr<SupervisorServiceImpl> supervisor_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_server_;
  bool shut_down_ = false;
};

}  // namespace spikeguard::daemon
