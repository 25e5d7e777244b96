#include "daemon/daemon.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "daemon/control/supervisor.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "daemon/launch/local_launcher.h"
#include "daemon/server/daemon_state.h"
#include "daemon/server/parse_errors.h"
#include "daemon/server/supervisor_service.h"
#include "daemon/server/worker_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const Options& options) {
  std::unique_ptr<Daemon> d(new Daemon());
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
  storage::CatalogOptions catalog_options;
  catalog_options.path = d->catalog_path_;
  auto catalog = storage::Catalog::Open(catalog_options);
  if (!catalog.ok()) return catalog.status();
  d->catalog_ = std::move(*catalog);
  if (options.default_policy) {
    if (absl::Status s = d->catalog_->PutPolicy("", *options.default_policy); !s.ok()) return s;
  }
  d->state_ = std::make_unique<DaemonState>(d->catalog_.get(), options.clock, options.limits,
                                            d->catalog_path_);
  if (absl::Status s = d->StartLaunchProfiles(options); !s.ok()) return s;
  d->supervisor_ = std::make_unique<Supervisor>(d->catalog_.get(), &d->state_->hub, options.clock);
  d->supervisor_->view()->set_checkpoint_guard(d->checkpoints_.get());
  if (absl::Status s = d->supervisor_->Start(); !s.ok()) return s;
  d->state_->supervisor = d->supervisor_.get();
  d->worker_service_ = std::make_unique<WorkerServiceImpl>(d->state_.get());
  d->supervisor_service_ = std::make_unique<SupervisorServiceImpl>(d->state_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &d->port_);
  {
    // Requests that do not parse (invalid UTF-8) are answered INVALID_ARGUMENT
    // naming the field.
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeParseErrorInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.limits.max_message_bytes));
  builder.RegisterService(d->worker_service_.get());
  builder.RegisterService(d->supervisor_service_.get());
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr || d->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  LocalLauncher::Options launch;
  launch.data_dir = std::filesystem::path(d->catalog_path_).parent_path().string();
  if (launch.data_dir.empty()) launch.data_dir = ".";
  launch.daemon_address = options.advertise_address.empty()
                              ? absl::StrCat("127.0.0.1:", d->port_)
                              : options.advertise_address;
  launch.profiles = d->profiles_.get();
  launch.checkpoints = d->checkpoints_.get();
  d->launcher_ = std::make_unique<LocalLauncher>(launch, d->catalog_.get(), &d->state_->registry,
                                                 options.clock);
  d->state_->launcher = d->launcher_.get();
  d->server_->GetHealthCheckService()->SetServingStatus(true);
  SG_LOG(INFO) << "spikeguardd listening on port " << d->port_ << ", catalog "
               << d->catalog_path_ << " (schema " << d->catalog_->schema_version() << ")";
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
  state_->profiles = profiles_.get();
  state_->checkpoints = checkpoints_.get();
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

void Daemon::Wait() {
  if (server_) server_->Wait();
}

void Daemon::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (launcher_) {
    state_->launcher = nullptr;
    launcher_->StopAll(absl::Seconds(5));
    launcher_.reset();
  }
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  server_->Wait();
  supervisor_->Stop();
  state_->supervisor = nullptr;
  supervisor_.reset();
  catalog_.reset();
  SG_LOG(INFO) << "spikeguardd stopped; catalog closed";
}

}  // namespace spikeguard::daemon
