#include "daemon/launch/local_launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "daemon/control/catalog_adapters.h"
#include "daemon/incident/checkpoint_choice.h"
#include "daemon/incident/plan_proto.h"
#include "storage/corpus/data_plan.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;

namespace {

// SIGTERM to every process, SIGKILL to those still there after `grace`;
// every one is reaped.
void TerminateAndReap(const std::vector<pid_t>& pids, absl::Duration grace) {
  for (pid_t p : pids) kill(p, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  for (pid_t p : pids) {
    int status = 0;
    while (true) {
      const pid_t got = waitpid(p, &status, WNOHANG);
      // Not our child (adopted after a restart): gone when kill(p, 0) fails.
      if (got == p || (got < 0 && kill(p, 0) != 0)) break;
      if (absl::Now() > deadline) {
        kill(p, SIGKILL);
        if (got == 0) waitpid(p, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
}

// A TCP port on 127.0.0.1 nobody listens on now (the kernel's choice).
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  if (port <= 0) return absl::UnavailableError("no free TCP port on 127.0.0.1");
  return port;
}

}  // namespace

LocalLauncher::LocalLauncher(Options options, storage::Catalog* catalog, RunRegistry* registry,
                             Clock* clock)
    : options_(std::move(options)), catalog_(catalog), registry_(registry), clock_(clock) {
  if (!options_.daemon_address.empty()) SetDaemonAddress(options_.daemon_address);
  monitor_ = std::thread([this] { MonitorLoop(); });
}

void LocalLauncher::SetDaemonAddress(const std::string& address) {
  if (address_ready_.HasBeenNotified()) return;
  daemon_address_ = address;
  address_ready_.Notify();
}

LocalLauncher::~LocalLauncher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

absl::Status LocalLauncher::Launch(const std::string& run) {
  SG_ASSIGN_OR_RETURN(v1::Run row, catalog_->GetRun(run));
  if (IsLegacySpec(row.spec())) return absl::FailedPreconditionError(LegacyRunMessage(run));
  if (options_.profiles == nullptr || options_.checkpoints == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "': the daemon has no launch profiles (spikeguardd --launch-profiles FILE)"));
  }
  // Refused before anything starts when the profile is gone or the spec no
  // longer validates against it.
  SG_RETURN_IF_ERROR(options_.profiles
                         ->Build(run, row.spec(), std::max<uint32_t>(1, row.world_size()), {})
                         .status());
  if (!address_ready_.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    return absl::UnavailableError("the daemon is starting: its address is not known yet");
  }
  absl::MutexLock lock(&mu_);
  if (runs_.count(run) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("run '", run, "' is already launched"));
  }
  Run& r = runs_[run];
  r.spec = row.spec();
  r.world_size = std::max<uint32_t>(1, row.world_size());
  r.ranks.resize(r.world_size);
  SG_ASSIGN_OR_RETURN(r.master_port, FreeLoopbackPort());
  for (uint32_t rank = 0; rank < r.world_size; ++rank) {
    SG_RETURN_IF_ERROR(StartRank(run, r, rank, /*restart=*/false));
  }
  (void)catalog_->SetRunState(run, v1::RUN_RUNNING);
  return absl::OkStatus();
}

absl::Status LocalLauncher::StartRank(const std::string& run, Run& r, uint32_t rank, bool restart,
                                      bool count_restart) {
  if (stopped_all_) {
    return absl::UnavailableError(
        absl::StrCat("run '", run, "' rank ", rank, " not started: the daemon is stopping"));
  }
  SG_ASSIGN_OR_RETURN(ResumePoint point,
                      ChooseResumePoint(catalog_, options_.checkpoints, run, restart,
                                        absl::StrCat("rank ", rank)));
  const int64_t generation = point.generation;
  const std::string& resume = point.resume;
  const std::string& plan_text = point.plan;
  if (options_.profiles == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("run '", run, "': no launch profiles"));
  }
  SG_ASSIGN_OR_RETURN(LaunchCommand command,
                      options_.profiles->Build(run, r.spec, r.world_size,
                                               {{"rank", absl::StrCat(rank)},
                                                {"local_rank", absl::StrCat(rank)},
                                                {"world_size", absl::StrCat(r.world_size)},
                                                {"addr", daemon_address_},
                                                {"generation", absl::StrCat(generation)},
                                                {"resume", resume},
                                                {"plan", plan_text},
                                                {"master_port", absl::StrCat(r.master_port)}}));
  r.max_restarts = command.max_restarts;
  const std::vector<std::string>& argv = command.argv;
  const std::string log_dir = (std::filesystem::path(options_.data_dir) / "runs" / run).string();
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  const std::string log_path = absl::StrCat(log_dir, "/rank-", rank, ".log");
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::UnavailableError(absl::StrCat("cannot open ", log_path));
  std::vector<std::string> env_storage;
  std::map<std::string, std::string> ours = {
      {"RANK", absl::StrCat(rank)},
      {"WORLD_SIZE", absl::StrCat(r.world_size)},
      {"LOCAL_RANK", absl::StrCat(rank)},
      {"LOCAL_WORLD_SIZE", absl::StrCat(r.world_size)},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", absl::StrCat(r.master_port)},
      {"SPIKEGUARD_ADDR", daemon_address_},
      {"SPIKEGUARD_RUN", run},
      {"SPIKEGUARD_GENERATION", absl::StrCat(generation)}};
  for (const auto& [k, v] : options_.daemon_env) ours[k] = v;
  if (options_.worker_token) {
    if (std::string token = options_.worker_token(run); !token.empty()) {
      ours["SPIKEGUARD_TOKEN"] = token;
    }
  }
  // Only the profile's environment (its allow-list of the daemon's
  // variables and its fixed values); the launcher's own variables win.
  for (const auto& [k, v] : command.env) {
    if (ours.count(k) == 0) env_storage.push_back(k + "=" + v);
  }
  for (const auto& [k, v] : ours) env_storage.push_back(k + "=" + v);
  SpawnOptions spawn;
  spawn.env = std::move(env_storage);
  spawn.stdout_fd = log_fd;
  spawn.stderr_fd = log_fd;
  spawn.workdir = command.workdir;
  absl::StatusOr<pid_t> spawned = SpawnProcess(argv, spawn);
  close(log_fd);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  Rank& rk = r.ranks[rank];
  rk.pid = pid;
  rk.done = false;
  rk.started = clock_->Now();
  rk.adopted = false;
  rk.lost = false;
  rk.start_ticks = ProcessStartTicks(pid).value_or(0);
  if (restart && count_restart) ++rk.restarts;
  RecordRank(run, rank, rk, generation);
  SG_LOG(INFO) << "run " << run << ": rank " << rank << (restart ? " restarted" : " started")
               << " (pid " << pid << ", generation " << generation
               << (resume.empty() ? "" : ", from " + resume) << "), log " << log_path;
  return absl::OkStatus();
}

void LocalLauncher::RecordRank(const std::string& run, uint32_t rank, const Rank& rk,
                               int64_t generation) {
  storage::LaunchRecord rec;
  rec.run = run;
  rec.slot = absl::StrCat("rank-", rank);
  rec.kind = "local";
  rec.handle = rk.pid;
  rec.start_ticks = rk.start_ticks;
  rec.generation = generation;
  rec.restarts = rk.restarts;
  if (auto s = catalog_->PutLaunch(rec); !s.ok()) {
    SG_LOG(ERROR) << "run " << run << ": rank " << rank << " (pid " << rk.pid
                  << ") not recorded in the catalog: " << s;
  }
}

absl::StatusOr<int> LocalLauncher::AdoptRecorded() {
  SG_ASSIGN_OR_RETURN(std::vector<storage::LaunchRecord> records, catalog_->ListLaunches());
  int adopted = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& rec : records) {
    if (rec.kind != "local") continue;
    uint32_t rank = 0;
    if (!absl::SimpleAtoi(absl::string_view(rec.slot).substr(5), &rank) ||
        rec.slot.rfind("rank-", 0) != 0) {
      continue;
    }
    auto row = catalog_->GetRun(rec.run);
    if (!row.ok() || row->state() == v1::RUN_FINISHED || row->state() == v1::RUN_FAILED ||
        rank >= std::max<uint32_t>(1, row->world_size())) {
      (void)catalog_->DeleteLaunches(rec.run, rec.slot);
      continue;
    }
    Run& r = runs_[rec.run];
    if (r.ranks.empty()) {
      r.spec = row->spec();
      r.world_size = std::max<uint32_t>(1, row->world_size());
      r.ranks.resize(r.world_size);
      // Unknown after a restart: a group restart gets a new one.
      r.master_port = FreeLoopbackPort().value_or(0);
      if (options_.profiles != nullptr) {
        if (auto p = options_.profiles->Find(r.spec.profile()); p.ok()) {
          r.max_restarts = p->max_restarts();
        }
      }
    }
    Rank& rk = r.ranks[rank];
    rk.restarts = rec.restarts;
    rk.started = clock_->Now();
    auto ticks = ProcessStartTicks(rec.handle);
    if (ticks.ok() && *ticks == rec.start_ticks && rec.start_ticks != 0) {
      rk.pid = static_cast<pid_t>(rec.handle);
      rk.adopted = true;
      rk.start_ticks = rec.start_ticks;
      ++adopted;
      SG_LOG(INFO) << "run " << rec.run << ": adopted rank " << rank << " (pid " << rec.handle
                   << ")";
    } else {
      rk.pid = -1;
      rk.lost = true;
      SG_LOG(WARNING) << "run " << rec.run << ": rank " << rank << " (pid " << rec.handle
                      << ") is not running any more"
                      << (ticks.ok() ? " (the pid is another process's now)" : "");
    }
  }
  return adopted;
}

pid_t LocalLauncher::PidOf(const std::string& run, uint32_t rank) {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it == runs_.end() || rank >= it->second.ranks.size()) return -1;
  return it->second.ranks[rank].pid;
}

void LocalLauncher::MonitorLoop() {
  while (true) {
    absl::SleepFor(options_.poll);
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    // Adopted ranks are restarted only once workers can be told where the
    // daemon is (a port-0 daemon learns it after listening).
    if (!address_ready_.HasBeenNotified()) continue;
    for (auto& [name, r] : runs_) {
      if (r.finished) continue;
      const v1::Policy policy = EffectivePolicy(catalog_, name);
      const int max_restarts =
          r.max_restarts > 0 ? r.max_restarts
                             : (policy.launch().max_restarts() > 0 ? policy.launch().max_restarts() : 3);
      const int64_t heartbeat_ms = policy.launch().heartbeat_timeout_ms() > 0
                                       ? policy.launch().heartbeat_timeout_ms()
                                       : 30'000;
      const auto live = registry_->Ranks(name);
      bool all_done = true;
      for (uint32_t rank = 0; rank < r.ranks.size(); ++rank) {
        Rank& rk = r.ranks[rank];
        if (rk.done) continue;
        all_done = false;
        // Why the rank is down, when it is (then it is restarted, or the
        // run fails with this reason).
        std::string crashed;
        int status = 0;
        if (rk.lost) {
          rk.lost = false;
          crashed = absl::StrCat("rank ", rank, " was lost while the daemon was down");
          SG_LOG(WARNING) << "run " << name << ": " << crashed;
        } else if (rk.pid <= 0) {
          continue;
        } else if (rk.adopted) {
          auto ticks = ProcessStartTicks(rk.pid);
          if (!ticks.ok() || *ticks != rk.start_ticks) {
            // Not our child: no exit status. Done if the run got to its end.
            rk.pid = -1;
            rk.adopted = false;
            auto row = catalog_->GetRun(name);
            if (row.ok() && row->total_steps() > 0 && row->last_step() + 1 >= row->total_steps()) {
              rk.done = true;
              SG_LOG(INFO) << "run " << name << ": adopted rank " << rank << " finished";
              continue;
            }
            crashed = absl::StrCat("adopted rank ", rank, " is gone before the run's end");
            SG_LOG(WARNING) << "run " << name << ": " << crashed;
          }
        }
        const pid_t got = (rk.pid > 0 && !rk.adopted) ? waitpid(rk.pid, &status, WNOHANG) : 0;
        if (got == rk.pid && got > 0) {
          const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          rk.pid = -1;
          if (code == 0) {
            rk.done = true;
            SG_LOG(INFO) << "run " << name << ": rank " << rank << " finished";
            continue;
          }
          if (code == 3) {
            Fail(name, r,
                 absl::StrCat("rank ", rank,
                              " was rejected by the daemon (exit code 3); not restarting"));
            break;
          }
          crashed = WIFEXITED(status)
                        ? absl::StrCat("rank ", rank, " exited with code ", code)
                        : absl::StrCat("rank ", rank, " was killed by signal ", WTERMSIG(status));
          SG_LOG(WARNING) << "run " << name << ": " << crashed;
        } else if (crashed.empty() && rk.pid > 0) {
          // Hung: attached once, silent past the heartbeat timeout.
          for (const auto& s : live) {
            if (s.rank() != rank || s.last_seen_unix_ms() == 0) continue;
            const int64_t silent = clock_->NowUnixMillis() - s.last_seen_unix_ms();
            if (silent > heartbeat_ms && clock_->Now() - rk.started > absl::Milliseconds(heartbeat_ms)) {
              crashed = absl::StrCat("rank ", rank, " was silent for ", silent,
                                     " ms (heartbeat timeout ", heartbeat_ms, " ms) and killed");
              SG_LOG(WARNING) << "run " << name << ": " << crashed;
              kill(rk.pid, SIGKILL);
              if (!rk.adopted) waitpid(rk.pid, &status, 0);
              rk.pid = -1;
              rk.adopted = false;
              break;
            }
          }
        }
        if (!crashed.empty()) {
          if (rk.restarts >= max_restarts) {
            Fail(name, r,
                 absl::StrCat(crashed, "; out of restarts (", rk.restarts, " of ", max_restarts,
                              " spent)"));
            break;
          }
          if (r.spec.restart_all_ranks() && r.world_size > 1) {
            // Every rank was just started again, or the run failed.
            if (absl::Status s = RestartAll(name, r, rank); !s.ok()) {
              Fail(name, r, absl::StrCat(crashed, "; the ranks could not be restarted: ",
                                         s.message()));
            }
            break;
          }
          if (absl::Status s = StartRank(name, r, rank, /*restart=*/true); !s.ok()) {
            // Not running and never to be restarted: the run cannot end
            // any other way.
            Fail(name, r, absl::StrCat(crashed, "; the restart could not be started: ",
                                       s.message()));
            break;
          }
        }
      }
      if (!r.finished && all_done) {
        r.finished = true;
        (void)catalog_->EndRun(name, v1::RUN_FINISHED);
        SG_LOG(INFO) << "run " << name << " finished";
      }
    }
  }
}

void LocalLauncher::Fail(const std::string& run, Run& r, const std::string& reason) {
  r.finished = true;
  // As the Slurm launcher: whoever sees the run failed (spikectl, a
  // watcher) finds why in the audit log. The state and the launch records
  // change together (EndRun).
  SG_LOG(ERROR) << "run " << run << " failed: " << reason;
  if (absl::StatusOr<int64_t> a = catalog_->AppendAudit("launcher", "run-failed", run, reason);
      !a.ok()) {
    SG_LOG(ERROR) << "run " << run << ": could not record why it failed: " << a.status();
  }
  if (absl::Status s = catalog_->EndRun(run, v1::RUN_FAILED); !s.ok()) {
    SG_LOG(ERROR) << "run " << run << ": could not record the run failed: " << s;
  }
}

absl::Status LocalLauncher::RestartAll(const std::string& run, Run& r, uint32_t dead_rank) {
  SG_LOG(WARNING) << "run " << run << ": rank " << dead_rank
                  << " died; stopping the other ranks to restart all of them together";
  std::vector<pid_t> pids;
  for (Rank& rk : r.ranks) {
    if (rk.pid > 0) pids.push_back(rk.pid);
  }
  TerminateAndReap(pids, absl::Seconds(5));
  auto port = FreeLoopbackPort();
  if (!port.ok()) {
    return absl::Status(port.status().code(),
                        absl::StrCat("no free port for the ranks: ", port.status().message()));
  }
  r.master_port = *port;
  for (uint32_t rank = 0; rank < r.ranks.size(); ++rank) {
    Rank& rk = r.ranks[rank];
    rk.pid = -1;
    rk.done = false;
    // Every rank resumes from the same checkpoint; only the dead one spends
    // a restart.
    if (absl::Status s =
            StartRank(run, r, rank, /*restart=*/true, /*count_restart=*/rank == dead_rank);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rank ", rank, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

void LocalLauncher::StopAll(absl::Duration grace) {
  std::vector<pid_t> pids;
  {
    absl::MutexLock lock(&mu_);
    stopped_all_ = true;
    for (auto& [name, r] : runs_) {
      for (auto& rk : r.ranks) {
        if (rk.pid > 0) pids.push_back(rk.pid);
      }
      r.finished = true;
      // Stopped on purpose: nothing for a restarted daemon to adopt.
      (void)catalog_->DeleteLaunches(name);
    }
  }
  TerminateAndReap(pids, grace);
}

}  // namespace spikeguard::daemon
