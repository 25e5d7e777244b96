#include "daemon/launch/slurm_launcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "daemon/control/catalog_adapters.h"
#include "daemon/launch/slurm_script.h"
#include "proto/state_names.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;

namespace {

constexpr char kSlot[] = "job";

std::string BesideThisProgram(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (self.parent_path() / name).string();
}

bool RunOver(v1::RunState state) { return state == v1::RUN_FINISHED || state == v1::RUN_FAILED; }

// Writes `token` to `path`, readable by this user only (0600 whatever the
// umask), atomically (a task reading it sees the old or the new file).
absl::Status WriteTokenFile(const std::string& path, const std::string& token) {
  const std::string tmp = path + ".tmp";
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  const std::string text = token + "\n";
  bool ok = fchmod(fd, 0600) == 0;
  size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && fsync(fd) == 0;
  ok = (close(fd) == 0) && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write the worker token file ", path, ": ", why));
  }
  return absl::OkStatus();
}

}  // namespace

SlurmLauncher::SlurmLauncher(Options options, storage::Catalog* catalog, RunRegistry* registry,
                             Clock* clock)
    : options_(std::move(options)),
      slurm_(options_.slurm),
      catalog_(catalog),
      registry_(registry),
      clock_(clock) {
  if (!options_.daemon_address.empty()) SetDaemonAddress(options_.daemon_address);
  monitor_ = std::thread([this] { MonitorLoop(); });
}

SlurmLauncher::~SlurmLauncher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

void SlurmLauncher::SetDaemonAddress(const std::string& address) {
  if (address_ready_.HasBeenNotified()) return;
  daemon_address_ = address;
  address_ready_.Notify();
}

void SlurmLauncher::StopAll(absl::Duration) {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

std::string SlurmLauncher::TokenFile(const std::string& run) const {
  return (std::filesystem::path(options_.data_dir) / "runs" / run / "worker.token").string();
}

std::optional<SlurmLauncher::JobView> SlurmLauncher::View(const std::string& run) {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it == runs_.end()) return std::nullopt;
  return JobView{it->second.job_id, it->second.restarts, it->second.last_state,
                 it->second.finished};
}

int SlurmLauncher::MaxRestarts(const std::string& run, const Run& r) {
  if (r.max_restarts > 0) return r.max_restarts;
  const v1::Policy policy = EffectivePolicy(catalog_, run);
  return policy.launch().max_restarts() > 0 ? policy.launch().max_restarts() : 3;
}

absl::Status SlurmLauncher::Launch(const std::string& run) {
  SG_ASSIGN_OR_RETURN(v1::Run row, catalog_->GetRun(run));
  if (IsLegacySpec(row.spec())) return absl::FailedPreconditionError(LegacyRunMessage(run));
  if (options_.profiles == nullptr || options_.checkpoints == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "': the daemon has no launch profiles (spikeguardd --launch-profiles FILE)"));
  }
  SG_ASSIGN_OR_RETURN(launch::LaunchProfile profile, options_.profiles->Find(row.spec().profile()));
  if (!profile.has_slurm()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "': launch profile '", profile.name(), "' has no slurm block"));
  }
  const uint32_t world = std::max<uint32_t>(1, row.world_size());
  SG_RETURN_IF_ERROR(options_.profiles->Build(run, row.spec(), world, {}).status());
  if (!address_ready_.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    return absl::UnavailableError("the daemon is starting: its address is not known yet");
  }
  absl::MutexLock lock(&mu_);
  if (auto it = runs_.find(run); it != runs_.end() && !it->second.finished) {
    return absl::AlreadyExistsError(absl::StrCat("run '", run, "' is already launched (Slurm job ",
                                                 it->second.job_id, ")"));
  }
  Run& r = runs_[run];
  r = Run{};
  r.spec = row.spec();
  if (absl::Status s = Submit(run, r, /*restart=*/false); !s.ok()) {
    runs_.erase(run);  // nothing was submitted: a later Launch may try again
    return s;
  }
  (void)catalog_->SetRunState(run, v1::RUN_RUNNING);
  return absl::OkStatus();
}

absl::Status SlurmLauncher::Submit(const std::string& run, Run& r, bool restart) {
  if (stopping_) {
    return absl::UnavailableError(
        absl::StrCat("run '", run, "' not submitted: the daemon is stopping"));
  }
  SG_ASSIGN_OR_RETURN(v1::Run row, catalog_->GetRun(run));
  SG_ASSIGN_OR_RETURN(launch::LaunchProfile profile, options_.profiles->Find(r.spec.profile()));
  if (!profile.has_slurm()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "': launch profile '", profile.name(), "' no longer has a slurm block"));
  }
  const launch::SlurmOptions& so = profile.slurm();
  const uint32_t world = SlurmWorldSize(so);
  SG_ASSIGN_OR_RETURN(ResumePoint point, ChooseResumePoint(catalog_, options_.checkpoints, run,
                                                            restart, "the Slurm job"));
  const int attempt = r.restarts + (restart ? 1 : 0);
  const int port = so.master_port() > 0
                       ? static_cast<int>(so.master_port())
                       : 20000 + static_cast<int>((std::hash<std::string>{}(run) + 7919u * attempt +
                                                   131u * point.generation) % 10000);
  // {rank} {local_rank} {world_size} stay for the task to fill in.
  SG_ASSIGN_OR_RETURN(LaunchCommand command,
                      options_.profiles->Build(run, r.spec, world,
                                               {{"rank", "{rank}"},
                                                {"local_rank", "{local_rank}"},
                                                {"world_size", "{world_size}"},
                                                {"addr", daemon_address_},
                                                {"generation", absl::StrCat(point.generation)},
                                                {"resume", point.resume},
                                                {"plan", point.plan},
                                                {"master_port", absl::StrCat(port)}}));
  r.max_restarts = command.max_restarts;

  const std::string dir = (std::filesystem::path(options_.data_dir) / "runs" / run).string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SlurmScript script;
  script.exec_path = !so.exec_path().empty() ? so.exec_path()
                     : !options_.exec_path.empty()
                         ? options_.exec_path
                         : BesideThisProgram("spikeguard-slurm-exec");
  script.srun = options_.srun;
  script.srun_options = {"--kill-on-bad-exit=1"};
  script.master_port = port;
  script.argv = command.argv;
  SG_ASSIGN_OR_RETURN(std::string text, RenderSlurmScript(script));
  const std::string script_path = absl::StrCat(dir, "/slurm-", attempt, ".sbatch");
  {
    std::ofstream f(script_path, std::ios::trunc);
    f << text;
    if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", script_path));
  }
  chmod(script_path.c_str(), 0700);

  SlurmSubmission sub;
  sub.job_name = absl::StrCat("sg-", run, "-g", point.generation);
  sub.partition = so.partition();
  sub.account = so.account();
  sub.nodes = static_cast<int>(std::max<uint32_t>(1, so.nodes()));
  sub.ntasks_per_node = static_cast<int>(std::max<uint32_t>(1, so.tasks_per_node()));
  sub.time_limit = so.time_limit();
  sub.workdir = command.workdir.empty() ? dir : command.workdir;
  sub.output_path = absl::StrCat(dir, "/slurm-%j.out");
  sub.extra_options.assign(so.extra_sbatch_options().begin(), so.extra_sbatch_options().end());
  sub.script_path = script_path;
  std::map<std::string, std::string> ours = {
      {"SPIKEGUARD_ADDR", daemon_address_},
      {"SPIKEGUARD_RUN", run},
      {"SPIKEGUARD_GENERATION", absl::StrCat(point.generation)}};
  for (const auto& [k, v] : options_.daemon_env) ours[k] = v;
  // The token never travels in the job's environment (Slurm keeps that in
  // its job record and state files, and `scontrol show job` users may see
  // it): the tasks read it from a file only this user can read.
  const std::string token_file = TokenFile(run);
  std::string token = options_.worker_token ? options_.worker_token(run) : "";
  if (!token.empty()) {
    SG_RETURN_IF_ERROR(WriteTokenFile(token_file, token));
    ours["SPIKEGUARD_TOKEN_FILE"] = token_file;
  } else {
    unlink(token_file.c_str());
  }
  sub.env = command.env;
  // SPIKEGUARD_TOKEN would win over the file in the worker.
  sub.env.erase("SPIKEGUARD_TOKEN");
  for (const auto& [k, v] : ours) sub.env[k] = v;

  auto id = slurm_.Submit(sub);
  if (!id.ok()) {
    return absl::Status(id.status().code(),
                        absl::StrCat("run '", run, "': ", id.status().message()));
  }
  if (restart) ++r.restarts;
  r.job_id = *id;
  r.submitted_generation = point.generation;
  r.last_state.clear();
  r.last_reason.clear();
  r.cancelled_for_restart = false;
  r.started = clock_->Now();
  r.running_since = absl::InfinitePast();
  r.query_failures = 0;
  Record(run, r);
  SG_LOG(INFO) << "run " << run << ": Slurm job " << *id << (restart ? " restarts" : " starts")
               << " generation " << point.generation << " ("
               << (point.resume.empty() ? "fresh" : "from " + point.resume) << ", "
               << sub.nodes << "x" << sub.ntasks_per_node << " tasks), output "
               << absl::StrCat(dir, "/slurm-", *id, ".out");
  return absl::OkStatus();
}

void SlurmLauncher::Record(const std::string& run, const Run& r) {
  storage::LaunchRecord rec;
  rec.run = run;
  rec.slot = kSlot;
  rec.kind = "slurm";
  rec.handle = r.job_id;
  rec.generation = r.submitted_generation;
  rec.restarts = r.restarts;
  if (auto s = catalog_->PutLaunch(rec); !s.ok()) {
    SG_LOG(ERROR) << "run " << run << ": Slurm job " << r.job_id
                  << " not recorded in the catalog (a restarted daemon will not adopt it): " << s;
  }
}

absl::StatusOr<int> SlurmLauncher::AdoptRecorded() {
  SG_ASSIGN_OR_RETURN(std::vector<storage::LaunchRecord> records, catalog_->ListLaunches());
  int adopted = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& rec : records) {
    if (rec.kind != "slurm" || rec.slot != kSlot) continue;
    auto row = catalog_->GetRun(rec.run);
    if (!row.ok() || RunOver(row->state())) {
      (void)catalog_->DeleteLaunches(rec.run, kSlot);
      continue;
    }
    if (runs_.count(rec.run) > 0) continue;
    Run& r = runs_[rec.run];
    r.spec = row->spec();
    r.job_id = rec.handle;
    r.submitted_generation = rec.generation;
    r.restarts = rec.restarts;
    r.started = clock_->Now();
    if (options_.profiles != nullptr) {
      if (auto p = options_.profiles->Find(r.spec.profile()); p.ok()) {
        r.max_restarts = p->max_restarts();
      }
    }
    ++adopted;
    SG_LOG(INFO) << "run " << rec.run << ": adopted Slurm job " << rec.handle << " (generation "
                 << rec.generation << ", " << rec.restarts << " restarts spent)";
  }
  return adopted;
}

void SlurmLauncher::Finish(const std::string& run, Run& r, v1::RunState state,
                           const std::string& reason) {
  r.finished = true;
  // The reason is on record and the token file gone before the state says
  // the run is over: whoever sees it finished or failed (spikectl, a
  // watcher) finds why in the audit log, and no launch record (EndRun
  // changes both in one transaction).
  if (state == v1::RUN_FAILED) {
    SG_LOG(ERROR) << "run " << run << " failed: " << reason;
    (void)catalog_->AppendAudit("launcher", "run-failed", run, reason);
  } else {
    SG_LOG(INFO) << "run " << run << " " << RunStateName(state) << ": " << reason;
  }
  // No job of the run runs any more: its token file goes.
  unlink(TokenFile(run).c_str());
  if (auto s = catalog_->EndRun(run, state, kSlot); !s.ok()) {
    SG_LOG(ERROR) << "run " << run << ": could not record the run " << RunStateName(state)
                  << ": " << s;
  }
}

void SlurmLauncher::Ended(const std::string& run, Run& r, const std::string& reason, bool spend) {
  const int max = MaxRestarts(run, r);
  if (spend && r.restarts >= max) {
    Finish(run, r, v1::RUN_FAILED,
           absl::StrCat(reason, "; out of restarts (", r.restarts, " of ", max, " spent)"));
    return;
  }
  SG_LOG(WARNING) << "run " << run << ": " << reason << "; restarting (restart " << r.restarts + 1
                  << " of " << max << ")";
  if (auto s = Submit(run, r, /*restart=*/true); !s.ok()) {
    Finish(run, r, v1::RUN_FAILED,
           absl::StrCat(reason, "; the restart could not be submitted: ", s.message()));
  }
}

void SlurmLauncher::MonitorLoop() {
  while (true) {
    absl::SleepFor(options_.poll);
    // An adopted job is restarted only once workers can be told where the
    // daemon is (a port-0 daemon learns it after listening).
    if (!address_ready_.HasBeenNotified()) {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      continue;
    }
    std::vector<std::pair<std::string, int64_t>> jobs;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      for (const auto& [name, r] : runs_) {
        if (!r.finished && r.job_id > 0) jobs.emplace_back(name, r.job_id);
      }
    }
    // scontrol outside the lock: Launch and View do not wait on Slurm.
    std::vector<absl::StatusOr<SlurmJob>> states;
    for (const auto& [name, id] : jobs) states.push_back(slurm_.Query(id));
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    for (size_t i = 0; i < jobs.size(); ++i) {
      auto it = runs_.find(jobs[i].first);
      if (it == runs_.end() || it->second.finished || it->second.job_id != jobs[i].second) continue;
      Run& r = it->second;
      const std::string& run = it->first;
      const absl::StatusOr<SlurmJob>& job = states[i];
      if (!job.ok()) {
        if (absl::IsNotFound(job.status())) {
          // Purged (MinJobAge) while nobody looked: its end is unknown.
          Ended(run, r, absl::StrCat("Slurm job ", r.job_id, " is gone (", job.status().message(), ")"),
                /*spend=*/!r.cancelled_for_restart);
        } else if (++r.query_failures % 20 == 1) {
          SG_LOG(WARNING) << "run " << run << ": cannot ask Slurm about job " << r.job_id << ": "
                          << job.status();
        }
        continue;
      }
      r.query_failures = 0;
      if (job->state_text != r.last_state || job->reason != r.last_reason) {
        SG_LOG(INFO) << "run " << run << ": Slurm job " << r.job_id << " " << job->state_text
                     << (job->reason.empty() || job->reason == "None" ? ""
                                                                       : " (" + job->reason + ")");
        r.last_state = job->state_text;
        r.last_reason = job->reason;
      }
      if (!SlurmJobEnded(job->state)) {
        if (job->state != SlurmJobState::kRunning || r.cancelled_for_restart) continue;
        // The heartbeat clock starts when this job runs (not when it was
        // queued: a long PENDING must not make the previous job's last
        // report look like a silence of this one).
        if (r.running_since == absl::InfinitePast()) r.running_since = clock_->Now();
        // Hung: a rank attached once and silent past the heartbeat timeout.
        const v1::Policy policy = EffectivePolicy(catalog_, run);
        const int64_t heartbeat_ms = policy.launch().heartbeat_timeout_ms() > 0
                                         ? policy.launch().heartbeat_timeout_ms()
                                         : 30'000;
        for (const auto& s : registry_->Ranks(run)) {
          if (s.last_seen_unix_ms() == 0) continue;
          const int64_t silent = clock_->NowUnixMillis() - s.last_seen_unix_ms();
          if (silent > heartbeat_ms &&
              clock_->Now() - r.running_since > absl::Milliseconds(heartbeat_ms)) {
            SG_LOG(WARNING) << "run " << run << ": rank " << s.rank() << " silent for " << silent
                            << " ms; cancelling Slurm job " << r.job_id << " to restart it";
            if (auto c = slurm_.Cancel(r.job_id); !c.ok()) {
              SG_LOG(ERROR) << "run " << run << ": " << c;
            } else {
              r.cancelled_for_restart = true;
            }
            break;
          }
        }
        continue;
      }
      // The job has ended: nothing of it runs, so the next one may start.
      const std::string what =
          absl::StrCat("Slurm job ", r.job_id, " ended ", job->state_text, " (exit code ",
                       job->exit_code, job->exit_signal ? absl::StrCat(", signal ", job->exit_signal) : "",
                       ", reason ", job->reason.empty() ? "none" : job->reason, ")");
      if (r.cancelled_for_restart) {
        Ended(run, r, what, /*spend=*/true);
      } else if (job->state == SlurmJobState::kCompleted && job->exit_code == 0) {
        Finish(run, r, v1::RUN_FINISHED, what);
      } else if (job->exit_code == 3) {
        Finish(run, r, v1::RUN_FAILED, absl::StrCat(what, ": a rank was rejected by the daemon"));
      } else {
        Ended(run, r, what, /*spend=*/true);
      }
    }
  }
}

}  // namespace spikeguard::daemon
