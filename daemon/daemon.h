// daemon.h
// -----------------------------------------------------------------------------
// `Daemon` is spikeguardd without its flags: it opens (and migrates) the
// catalog, serves WorkerService and SupervisorService plus the standard gRPC
// health service and server reflection, and shuts down cleanly: stop accepting,
// let in-flight calls finish (their commits are acknowledged), close the
// catalog.
//
//   Daemon::Options options;
//   options.listen = "127.0.0.1:0";
//   options.data_dir = "/var/lib/spikeguard";
//   SG_ASSIGN_OR_RETURN(auto daemon, Daemon::Start(options));
//   std::cout << daemon->port();
//   daemon->Shutdown(absl::Seconds(5));
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "spikeguard/v1/policy.pb.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/ingest/limits.h"

namespace grpc {
class Server;
}

namespace spikeguard::storage {
class Catalog;
}

namespace spikeguard::daemon {

struct DaemonState;
class WorkerServiceImpl;
class SupervisorServiceImpl;
class Supervisor;
class LocalLauncher;
class LaunchProfiles;
class CheckpointGuard;

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
  };

  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const Options& options);
  ~Daemon();

  int port() const { return port_; }
  const std::string& catalog_path() const { return catalog_path_; }

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
  std::unique_ptr<storage::Catalog> catalog_;
  std::unique_ptr<LaunchProfiles> profiles_;
  std::unique_ptr<CheckpointGuard> checkpoints_;
  std::unique_ptr<DaemonState> state_;
  std::unique_ptr<Supervisor> supervisor_;
  std::unique_ptr<LocalLauncher> launcher_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<SupervisorServiceImpl> supervisor_service_;
  std::unique_ptr<grpc::Server> server_;
  bool shut_down_ = false;
};

}  // namespace spikeguard::daemon
