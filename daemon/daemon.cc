#include "daemon/daemon.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/secret.h"
#include "daemon/auth/authorizer.h"
#include "daemon/http/http_server.h"
#include "daemon/metrics/state_collector.h"
#include "daemon/auth/token_gate.h"
#include "daemon/server/audit_interceptor.h"
#include "daemon/server/parse_errors.h"
#include "daemon/control/supervisor.h"
#include "daemon/ingest/group_commit.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "daemon/launch/launcher.h"
#include "daemon/launch/local_launcher.h"
#include "daemon/launch/slurm_launcher.h"
#include "daemon/server/supervisor_service.h"
#include "daemon/server/worker_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "proto/state_names.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {
namespace {

absl::StatusOr<std::string> ReadPem(const char* what, const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat(what, " '", path, "': cannot be read"));
  std::stringstream buffer;
  buffer << f.rdbuf();
  if (buffer.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "': not a PEM file"));
  }
  return buffer.str();
}

// DATA_DIR/tokens with one admin principal, its token in DATA_DIR/admin.token
// (0600); kept as they are when they exist.
absl::Status EnsureDefaultTokens(const std::string& tokens_path, const std::string& token_path) {
  if (std::filesystem::exists(tokens_path)) return absl::OkStatus();
  const std::string token = NewToken();
  const mode_t old = umask(077);
  {
    std::ofstream t(token_path, std::ios::trunc);
    t << token << "\n";
    std::ofstream f(tokens_path, std::ios::trunc);
    f << "# spikeguard tokens: principal role runs sha256:HASH (see spikectl token new).\n"
      << "# Made by spikeguardd on first start; the admin token is in " << token_path << ".\n"
      << "admin admin * " << HashToken(token) << "\n";
    if (!t || !f) {
      umask(old);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write the default tokens file '", tokens_path, "' or '",
                       token_path, "'"));
    }
  }
  umask(old);
  return absl::OkStatus();
}

// The key launched workers' tokens are derived from: DATA_DIR/worker-token.key
// (0600), made on first start, kept across restarts so the workers a crashed
// daemon had launched are still known to the next one.
absl::StatusOr<std::string> WorkerTokenKey(const std::string& path) {
  {
    std::ifstream f(path);
    std::string key;
    if (f && std::getline(f, key) && key.size() == 64) return key;
  }
  const std::string key = NewToken();
  const mode_t old = umask(077);
  std::ofstream f(path, std::ios::trunc);
  f << key << "\n";
  f.close();
  umask(old);
  if (!f) return absl::FailedPreconditionError(absl::StrCat("cannot write '", path, "'"));
  return key;
}

// Removes gRPC's reflection plugin, which linking grpc++_reflection
// registers with every server builder by a static initializer: reflection
// stays off unless asked for.
constexpr int kHandshakeTimeoutMs = 10'000;

class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const Options& options) {
  std::unique_ptr<Daemon> d(new Daemon());
  const bool loopback = auth::IsLoopbackAddress(options.listen);
  const bool want_tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!options.tls_client_ca_file.empty() && !want_tls) {
    return absl::InvalidArgumentError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key");
  }
  if (!want_tls && !loopback && !options.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen in clear on ", options.listen,
        ", which is not a loopback address: give --tls-cert and --tls-key, or --insecure to "
        "accept that tokens and telemetry cross the network unencrypted"));
  }
  if (options.allow_anonymous && !loopback) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--allow-anonymous (authentication off) is only allowed on a loopback address, not ",
        options.listen));
  }
  if (!want_tls && !loopback) {
    SG_LOG(WARNING) << "--insecure: listening in clear on " << options.listen
                    << "; bearer tokens and telemetry travel unencrypted";
  }
  d->catalog_path_ = options.catalog_path;
  if (d->catalog_path_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.data_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("data dir '", options.data_dir, "': ", ec.message()));
    }
    d->catalog_path_ = (std::filesystem::path(options.data_dir) / "catalog.db").string();
  }
  if (options.allow_anonymous) {
    d->authorizer_ = auth::Authorizer::Disabled();
    SG_LOG(WARNING) << "authentication is off (--allow-anonymous): every client that reaches "
                    << options.listen << " is admin";
  } else {
    std::string tokens_file = options.tokens_file;
    if (tokens_file.empty()) {
      const std::string dir = std::filesystem::path(d->catalog_path_).parent_path().string();
      tokens_file = (std::filesystem::path(dir.empty() ? "." : dir) / "tokens").string();
      const std::string token_file =
          (std::filesystem::path(dir.empty() ? "." : dir) / "admin.token").string();
      const bool existed = std::filesystem::exists(tokens_file);
      if (absl::Status s = EnsureDefaultTokens(tokens_file, token_file); !s.ok()) return s;
      if (!existed) {
        d->admin_token_file_ = token_file;
        SG_LOG(INFO) << "no --tokens: made " << tokens_file << " with principal 'admin'; its token "
                     << "is in " << token_file << " (spikectl --token-file=" << token_file << ")";
      }
    }
    auto authorizer = auth::Authorizer::FromFile(tokens_file);
    if (!authorizer.ok()) return authorizer.status();
    d->authorizer_ = std::move(*authorizer);
    const std::string dir = std::filesystem::path(d->catalog_path_).parent_path().string();
    auto key = WorkerTokenKey(
        (std::filesystem::path(dir.empty() ? "." : dir) / "worker-token.key").string());
    if (!key.ok()) return key.status();
    d->authorizer_->SetWorkerTokenKey(*key);
  }
  storage::CatalogOptions catalog_options;
  catalog_options.path = d->catalog_path_;
  // The ingest stage checkpoints between groups (GroupCommitter).
  catalog_options.deferred_checkpoints = true;
  auto catalog = storage::Catalog::Open(catalog_options);
  if (!catalog.ok()) return catalog.status();
  d->catalog_ = std::move(*catalog);
  if (d->authorizer_->enabled()) {
    // A launched worker's token is bound to its run's incarnation and ends
    // with the run (Authorizer::WorkerTokenFor).
    storage::Catalog* runs = d->catalog_.get();
    d->authorizer_->SetWorkerRunLookup(
        [runs](const std::string& run) -> absl::StatusOr<auth::Authorizer::WorkerRun> {
          absl::StatusOr<storage::Catalog::RunIncarnation> found = runs->GetRunIncarnation(run);
          if (!found.ok()) return found.status();
          auth::Authorizer::WorkerRun w;
          w.incarnation = std::move(found->incarnation);
          w.ended = RunEnded(found->state);
          w.state = std::string(RunStateName(found->state));
          return w;
        });
  }
  if (options.default_policy) {
    if (absl::Status s = d->catalog_->PutPolicy("", *options.default_policy); !s.ok()) return s;
  }
  d->started_ = options.clock->Now();
  d->registry_ = std::make_unique<RunRegistry>(options.clock);
  if (absl::Status s = d->StartLaunchProfiles(options); !s.ok()) return s;
  GroupCommitter::Options ingest;
  ingest.metrics = &d->metrics_;
  ingest.after_commit = options.after_group_commit;
  d->ingest_ = std::make_unique<GroupCommitter>(d->catalog_.get(), ingest);
  Supervisor::Deps detection;
  detection.catalog = d->catalog_.get();
  detection.hub = &d->hub_;
  detection.clock = options.clock;
  detection.completed = d->ingest_->completed();
  detection.checkpoints = d->checkpoints_.get();
  detection.profiles = d->profiles_.get();
  detection.metrics = &d->metrics_;
  detection.latency_observer = options.detection_latency_observer;
  d->supervisor_ = std::make_unique<Supervisor>(std::move(detection));
  if (absl::Status s = d->supervisor_->Start(); !s.ok()) return s;
  metrics::RegisterStateCollector(
      &d->metrics_registry_,
      {.catalog = d->catalog_.get(), .catalog_path = d->catalog_path_, .clock = options.clock,
       .started = d->started_, .supervisor = d->supervisor_.get(), .registry = d->registry_.get(),
       .counters = &d->counters_});

  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (want_tls) {
    grpc::SslServerCredentialsOptions ssl;
    auto cert = ReadPem("--tls-cert", options.tls_cert_file);
    if (!cert.ok()) return cert.status();
    auto key = ReadPem("--tls-key", options.tls_key_file);
    if (!key.ok()) return key.status();
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options.tls_client_ca_file.empty()) {
      auto ca = ReadPem("--tls-client-ca", options.tls_client_ca_file);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    credentials = grpc::SslServerCredentials(ssl);
    d->tls_ = true;
  }
  // A caller's token is checked as its call arrives, before gRPC reads the
  // request message (auth/token_gate.h). gRPC runs the check only on secure
  // credentials: clear text on loopback uses local credentials, which are
  // clear text on the wire too.
  if (d->authorizer_->enabled() && (d->tls_ || loopback)) {
    if (!d->tls_) credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
    storage::Catalog* catalog = d->catalog_.get();
    d->token_gate_ = std::make_shared<auth::TokenGate>(
        d->authorizer_.get(), [catalog](const std::string& method, const grpc::Status& status) {
          AuditRefusedBeforeRead(catalog, method, status);
        });
    credentials->SetAuthMetadataProcessor(d->token_gate_);
  }

  LocalLauncher::Options launch;
  launch.data_dir = std::filesystem::path(d->catalog_path_).parent_path().string();
  if (launch.data_dir.empty()) launch.data_dir = ".";
  // With --listen on port 0 the port is known only once listening: set
  // below, and Launch waits for it.
  launch.daemon_address = options.advertise_address;
  if (d->authorizer_->enabled()) {
    auth::Authorizer* authorizer = d->authorizer_.get();
    launch.worker_token = [authorizer](const std::string& run) {
      return authorizer->WorkerTokenFor(run);
    };
  }
  if (d->tls_) {
    launch.daemon_env["SPIKEGUARD_TLS_CA"] = options.worker_tls_ca_file.empty()
                                                 ? options.tls_cert_file
                                                 : options.worker_tls_ca_file;
    if (!options.worker_tls_cert_file.empty()) {
      launch.daemon_env["SPIKEGUARD_TLS_CERT"] = options.worker_tls_cert_file;
      launch.daemon_env["SPIKEGUARD_TLS_KEY"] = options.worker_tls_key_file;
    }
    if (!options.worker_tls_server_name.empty()) {
      launch.daemon_env["SPIKEGUARD_TLS_SERVER_NAME"] = options.worker_tls_server_name;
    }
  }
  launch.profiles = d->profiles_.get();
  launch.checkpoints = d->checkpoints_.get();
  d->local_launcher_ = std::make_unique<LocalLauncher>(launch, d->catalog_.get(),
                                                       d->registry_.get(), options.clock);
  // Runs whose profile has a slurm block: sbatch/scontrol/scancel from PATH,
  // with the daemon's environment (SLURM_CONF).
  SlurmLauncher::Options slurm;
  slurm.data_dir = launch.data_dir;
  slurm.daemon_address = launch.daemon_address;
  slurm.profiles = launch.profiles;
  slurm.checkpoints = launch.checkpoints;
  slurm.worker_token = launch.worker_token;
  slurm.daemon_env = launch.daemon_env;
  d->slurm_launcher_ = std::make_unique<SlurmLauncher>(slurm, d->catalog_.get(),
                                                       d->registry_.get(), options.clock);
  // What the previous daemon started (it may have been killed): adopted.
  for (auto adopt : {+[](Daemon* x) { return x->local_launcher_->AdoptRecorded(); },
                     +[](Daemon* x) { return x->slurm_launcher_->AdoptRecorded(); }}) {
    if (auto n = adopt(d.get()); !n.ok()) {
      SG_LOG(ERROR) << "launches recorded by the previous daemon not adopted: " << n.status();
    } else if (*n > 0) {
      SG_LOG(INFO) << "adopted " << *n << " launch(es) of the previous daemon";
    }
  }
  d->launcher_ = std::make_unique<ProfileLauncher>(d->catalog_.get(), d->profiles_.get(),
                                                   d->local_launcher_.get(),
                                                   d->slurm_launcher_.get());

  // The services, over everything above (all of it outlives them).
  WorkerSession::Deps session;
  session.catalog = d->catalog_.get();
  session.clock = options.clock;
  session.limits = options.limits;
  session.registry = d->registry_.get();
  session.supervisor = d->supervisor_.get();
  session.checkpoints = d->checkpoints_.get();
  session.counters = &d->counters_;
  d->worker_service_ = std::make_unique<WorkerServiceImpl>(
      WorkerServiceImpl::Deps{.session = session,
                              .authorizer = d->authorizer_.get(),
                              .hub = &d->hub_,
                              .metrics = &d->metrics_},
      d->ingest_.get());
  DaemonOperatorHandler::Deps handler;
  handler.catalog = d->catalog_.get();
  handler.catalog_path = d->catalog_path_;
  handler.clock = options.clock;
  handler.limits = options.limits;
  handler.registry = d->registry_.get();
  handler.counters = &d->counters_;
  handler.supervisor = d->supervisor_.get();
  handler.launcher = d->launcher_.get();
  handler.profiles = d->profiles_.get();
  handler.checkpoints = d->checkpoints_.get();
  handler.tls = d->tls_;
  handler.started = d->started_;
  d->operator_handler_ = std::make_unique<DaemonOperatorHandler>(std::move(handler));
  d->supervisor_service_ = std::make_unique<SupervisorServiceImpl>(
      d->authorizer_.get(), d->catalog_.get(), d->operator_handler_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (options.reflection) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  } else {
    builder.SetOption(std::make_unique<WithoutReflection>());
  }
  builder.AddListeningPort(options.listen, credentials, &d->port_);
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeParseErrorInterceptorFactory());
    creators.push_back(MakeAuditInterceptorFactory(d->authorizer_.get(), d->catalog_.get()));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.limits.max_message_bytes));
  // A connection that has not finished its handshake (TLS, and the HTTP/2
  // preface and settings) within 10 s is closed: gRPC's default, 120 s, let
  // hundreds of silent connections stay open for two minutes each.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
  builder.RegisterService(d->worker_service_.get());
  builder.RegisterService(d->supervisor_service_.get());
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr || d->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  if (options.advertise_address.empty()) {
    d->launcher_->SetDaemonAddress(absl::StrCat("127.0.0.1:", d->port_));
  }
  if (!options.http_listen.empty()) {
    HttpOptions http;
    http.listen = options.http_listen;
    http.tls_cert_file = options.tls_cert_file;
    http.tls_key_file = options.tls_key_file;
    http.tls_client_ca_file = options.tls_client_ca_file;
    http.insecure = options.insecure;
    // The pages are SupervisorService calls on the caller's behalf, in process.
    auto started = HttpServer::Start(http, d->authorizer_.get(), &d->metrics_registry_,
                                     d->server_->InProcessChannel(grpc::ChannelArguments()));
    if (!started.ok()) {
      d->Shutdown(absl::ZeroDuration());
      return started.status();
    }
    d->http_server_ = std::move(*started);
  }
  d->server_->GetHealthCheckService()->SetServingStatus(true);
  SG_LOG(INFO) << "spikeguardd listening on port " << d->port_
               << (d->tls_ ? (options.tls_client_ca_file.empty() ? " (TLS)" : " (mutual TLS)")
                           : " (clear text)")
               << ", authentication " << (d->authorizer_->enabled() ? "on" : "OFF")
               << ", catalog " << d->catalog_path_ << " (schema "
               << d->catalog_->schema_version() << ")";
  return d;
}

absl::Status Daemon::StartLaunchProfiles(const Options& options) {
  if (options.launch_profiles_file.empty()) {
    profiles_ = std::make_unique<LaunchProfiles>();
  } else {
    auto loaded = LaunchProfiles::Load(options.launch_profiles_file);
    if (!loaded.ok()) return loaded.status();
    profiles_ = std::move(*loaded);
  }
  std::string data_dir = std::filesystem::path(catalog_path_).parent_path().string();
  if (data_dir.empty()) data_dir = ".";
  checkpoints_ = std::make_unique<CheckpointGuard>(catalog_.get(), profiles_.get(), data_dir);
  // Runs stored before launch profiles, with a free command line: never
  // launched until an admin maps them to a profile.
  if (auto runs = catalog_->ListRuns(); runs.ok()) {
    for (const auto& r : *runs) {
      if (IsLegacySpec(r.spec())) SG_LOG(WARNING) << LegacyRunMessage(r.name());
    }
  }
  return absl::OkStatus();
}

Daemon::~Daemon() { Shutdown(absl::Seconds(2)); }

const metrics::DaemonMetrics& Daemon::metrics() const { return metrics_; }

int Daemon::http_port() const { return http_server_ ? http_server_->port() : 0; }

absl::Status Daemon::ReloadTokens() {
  if (!authorizer_) return absl::OkStatus();
  return authorizer_->Reload();
}

void Daemon::Wait() {
  if (server_) server_->Wait();
}

void Daemon::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (http_server_) http_server_->Stop();
  // The ranks stop first (and no launcher starts one again); the launchers
  // themselves outlive the calls in flight that may use them.
  if (launcher_) launcher_->StopAll(absl::Seconds(5));
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  server_->Wait();
  launcher_.reset();
  slurm_launcher_.reset();
  local_launcher_.reset();
  // Detection processes what ingest queued and stops taking; the ingest
  // stage commits what is left, then lets go of the catalog before it closes.
  supervisor_->Stop();
  ingest_.reset();
  supervisor_.reset();
  catalog_.reset();
  SG_LOG(INFO) << "spikeguardd stopped; catalog closed";
}

}  // namespace spikeguard::daemon
