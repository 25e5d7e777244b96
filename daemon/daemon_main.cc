// The spikeguard daemon's command line: its flags, signal handling and run
// loop (DaemonMain). spikeguardd's main (main.cc) is DaemonMain alone.
//
//   spikeguardd --listen=127.0.0.1:7070 --data-dir=/var/lib/spikeguard
//   spikeguardd --listen=0.0.0.0:7070 --tls-cert=server.pem --tls-key=server.key
//               --tls-client-ca=clients-ca.pem --tokens=/etc/spikeguard/tokens
//
// SIGHUP re-reads the tokens file; SIGTERM/SIGINT shut down.
#include "daemon/daemon_main.h"

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "base/flag_dashes.h"
#include "base/flag_usage.h"
#include "base/logging.h"
#include "daemon/daemon.h"
#include "daemon/incident/policy.h"
#include "daemon/launch/launcher.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "HOST:PORT to serve on (port 0: pick one)");
ABSL_FLAG(std::string, advertise_address, "",
          "HOST[:PORT] the workers the daemon launches dial ({addr}, SPIKEGUARD_ADDR): this "
          "node's name or address as other nodes reach it (port: --listen's). Default: "
          "127.0.0.1 and the bound port, which only works when every rank runs on this node");
ABSL_FLAG(std::string, data_dir, "./spikeguard-data", "directory of the catalog and daemon files");
ABSL_FLAG(std::string, catalog, "", "catalog path (default DATA_DIR/catalog.db)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once serving");
ABSL_FLAG(int64_t, max_message_bytes, 16 << 20, "largest message accepted");
ABSL_FLAG(absl::Duration, hello_timeout, absl::Seconds(10),
          "a worker stream that sends no hello within this ends DEADLINE_EXCEEDED");
ABSL_FLAG(int, max_pending_hellos, 64,
          "most worker streams waiting for their hello at once (others: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_pending_hellos_per_principal, 16,
          "most worker streams of one principal (token) waiting for their hello at once");
ABSL_FLAG(int64_t, max_step_ahead, 1 << 24,
          "most steps a report may lead the run's last step (or the hello's total_steps)");
ABSL_FLAG(std::string, launch_profiles, "",
          "launch profiles (text LaunchProfiles, daemon/launch/launch_profiles.proto): the only "
          "command lines the daemon runs; re-read when the file changes. Without it no run is "
          "launched");
ABSL_FLAG(std::string, policy, "",
          "textproto Policy installed as the daemon-wide default at startup (runs' own "
          "policies and `spikectl policy set` still apply on top)");

ABSL_FLAG(std::string, tokens, "",
          "tokens file: one 'principal role runs sha256:HASH' per line (spikectl token new); "
          "re-read on SIGHUP. Default: DATA_DIR/tokens, made with an admin principal on first "
          "start (its token in DATA_DIR/admin.token)");
ABSL_FLAG(bool, allow_anonymous, false,
          "authentication off: every caller is admin (loopback addresses only)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate (chain) the daemon presents: TLS on");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mutual TLS)");
ABSL_FLAG(bool, insecure, false,
          "allow listening in clear on a non-loopback address (warned at every start)");
ABSL_FLAG(std::string, http_listen, "",
          "serve the read-only web view, /metrics and /healthz on HOST:PORT (or :PORT, loopback); "
          "off when empty; same TLS files and tokens as gRPC");
ABSL_FLAG(bool, reflection, false, "serve gRPC server reflection (off: it describes the API)");
ABSL_FLAG(std::string, worker_tls_ca, "",
          "CA the workers the daemon launches verify it with (default: --tls-cert)");
ABSL_FLAG(std::string, worker_tls_cert, "",
          "client certificate the launched workers present (mutual TLS)");
ABSL_FLAG(std::string, worker_tls_key, "", "key of --worker-tls-cert");
ABSL_FLAG(std::string, worker_tls_server_name, "",
          "name the launched workers check in the daemon's certificate");

namespace spikeguard::daemon {

int DaemonMain(int argc, char** argv,
               const std::function<void(Daemon::Options&)>& customize) {
  // --help lists the flags of this file (absl would look for spikeguardd.cc).
  spikeguard::SetFlagsUsage("spikeguardd --listen=HOST:PORT --data-dir=DIR", {__FILE__});
  std::vector<std::string> args = spikeguard::DashesToUnderscores(argc, argv);
  std::vector<char*> argv_ptrs = spikeguard::ArgvPointers(args);
  absl::ParseCommandLine(static_cast<int>(args.size()), argv_ptrs.data());

  // SIGTERM/SIGINT are taken by one thread with sigwait, so shutdown runs as
  // ordinary code, not in a signal handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  spikeguard::daemon::Daemon::Options options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  {
    auto advertised = spikeguard::daemon::ResolveAdvertiseAddress(
        absl::GetFlag(FLAGS_advertise_address), options.listen);
    if (!advertised.ok()) {
      std::cerr << "spikeguardd: " << advertised.status().message() << "\n";
      return 2;
    }
    options.advertise_address = *advertised;
  }
  options.catalog_path = absl::GetFlag(FLAGS_catalog);
  options.launch_profiles_file = absl::GetFlag(FLAGS_launch_profiles);
  options.limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.limits.hello_timeout = absl::GetFlag(FLAGS_hello_timeout);
  options.limits.max_pending_hellos = absl::GetFlag(FLAGS_max_pending_hellos);
  options.limits.max_pending_hellos_per_principal =
      absl::GetFlag(FLAGS_max_pending_hellos_per_principal);
  options.limits.max_step_ahead = absl::GetFlag(FLAGS_max_step_ahead);
  options.tokens_file = absl::GetFlag(FLAGS_tokens);
  options.allow_anonymous = absl::GetFlag(FLAGS_allow_anonymous);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.http_listen = absl::GetFlag(FLAGS_http_listen);
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.worker_tls_ca_file = absl::GetFlag(FLAGS_worker_tls_ca);
  options.worker_tls_cert_file = absl::GetFlag(FLAGS_worker_tls_cert);
  options.worker_tls_key_file = absl::GetFlag(FLAGS_worker_tls_key);
  options.worker_tls_server_name = absl::GetFlag(FLAGS_worker_tls_server_name);
  if (const std::string path = absl::GetFlag(FLAGS_policy); !path.empty()) {
    auto policy = spikeguard::incident::LoadPolicyFile(path);
    if (!policy.ok()) {
      std::cerr << "spikeguardd: --policy: " << policy.status().message() << "\n";
      return 2;
    }
    auto merged = spikeguard::incident::MergePolicy(spikeguard::incident::DefaultPolicy(), *policy);
    if (auto s = spikeguard::incident::ValidatePolicy(merged); !s.ok()) {
      std::cerr << "spikeguardd: --policy " << path << ": " << s.message() << "\n";
      return 2;
    }
    options.default_policy = *policy;
  }
  if (customize) customize(options);
  auto daemon = spikeguard::daemon::Daemon::Start(options);
  if (!daemon.ok()) {
    std::cerr << "spikeguardd: " << daemon.status().message() << "\n";
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    {
      std::ofstream f(tmp);
      f << (*daemon)->port() << "\n";
    }
    std::rename(tmp.c_str(), port_file.c_str());
  }

  std::thread waiter([&] {
    while (true) {
      int sig = 0;
      sigwait(&signals, &sig);
      if (sig == SIGHUP) {
        absl::Status s = (*daemon)->ReloadTokens();
        if (s.ok()) {
          SG_LOG(INFO) << "SIGHUP: tokens file re-read";
        } else {
          SG_LOG(ERROR) << "SIGHUP: " << s.message() << "; the previous tokens stay in force";
        }
        continue;
      }
      SG_LOG(INFO) << "signal " << sig << ": shutting down";
      (*daemon)->Shutdown(absl::Seconds(5));
      return;
    }
  });
  (*daemon)->Wait();
  waiter.join();
  daemon->reset();
  return 0;
}

}  // namespace spikeguard::daemon
