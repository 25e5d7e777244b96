// local_launcher.h
// -----------------------------------------------------------------------------
// The embedded launcher: starts the ranks of a run as local processes from
// its RunSpec, and restarts a rank that crashes or stops heartbeating, from
// the newest complete checkpoint of the run's current generation.
//
// Nothing sent over the wire is executed: the command of a rank comes from
// the run's launch profile (launch_profiles.h), built again at every start so
// an edited profile file applies; a legacy run (free command, no profile) is
// refused with FAILED_PRECONDITION until an admin maps it to a profile. The
// profile's argv template gets these placeholders:
//   {rank} {world_size} {run} {addr} {generation}
//   {resume}  the checkpoint to start from ("" on a fresh start: an argument
//             that becomes empty is dropped, together with a preceding
//             "--resume"-style flag when written as two arguments). Only a
//             catalog checkpoint that CheckpointGuard::Verify accepts (inside
//             the run's checkpoint root, file present, checksum matching) is
//             ever named; others are skipped with the reason logged.
//   {plan}    the current generation's data plan ("0-600,610-")
//   {master_port}  the rendezvous port of this start of the ranks
//   {corpus_dir} {checkpoint_root} and the profile's parameters.
// Every rank's environment is the profile's (its allow-list of the daemon's
// variables, then its fixed values) plus torch.distributed's: RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (one machine: the rank and the
// world size), MASTER_ADDR=127.0.0.1 and MASTER_PORT (a free port, new at
// each start of the ranks, so a restarted group never meets the old one),
// plus SPIKEGUARD_ADDR, SPIKEGUARD_RUN and SPIKEGUARD_GENERATION, which win.
// The working directory is the profile's. No shell: execve with the argv
// (SpawnProcess, base/subprocess.h); a rank whose program or working
// directory cannot be used fails to start, naming which and why.
// A rank's output goes to DATA_DIR/runs/RUN/rank-R.log.
//
// A rank that exits 0 is done; when every rank of a run is done the run is
// "finished". Exit code 3 (rejected by the daemon) is final: the run is
// "failed". Other exits are crashes, restarted up to max_restarts times
// (the profile's, else the policy's): the dead rank alone, or, with
// RunSpec.restart_all_ranks, every rank (the others are stopped first), all
// from the newest complete checkpoint of the generation that verifies.
//
// Every rank started is recorded in the catalog (launches: slot "rank-R",
// the pid and its start time, field 22 of /proc/PID/stat). A daemon started
// again after a crash (AdoptRecorded) takes over the ranks whose pid still
// runs with that start time (a pid with another start time is not ours) and
// restarts the others within the budget, like a crash. An adopted rank is
// not this daemon's child: its exit status is unknown, so when it is gone it
// counts as finished only if the run's progress reached its total steps,
// else as a crash. A graceful StopAll drops the records (it stopped the
// ranks on purpose).
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/clock.h"
#include "daemon/ingest/run_registry.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "daemon/launch/launcher.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class LocalLauncher : public Launcher {
 public:
  struct Options {
    std::string data_dir;
    // The address workers dial.
    std::string daemon_address;
    absl::Duration poll = absl::Milliseconds(250);
    // Where commands come from; null: no run is launched.
    LaunchProfiles* profiles = nullptr;
    // Which checkpoints {resume} may name; null: no run is launched.
    CheckpointGuard* checkpoints = nullptr;
    // The bearer token the ranks of a run present (SPIKEGUARD_TOKEN); unset
    // or "": none (authentication off).
    std::function<std::string(const std::string& run)> worker_token;
    // Set in every rank's environment: how the workers reach the daemon over
    // TLS (SPIKEGUARD_TLS_CA, SPIKEGUARD_TLS_CERT/KEY, _SERVER_NAME).
    std::map<std::string, std::string> daemon_env;
  };

  LocalLauncher(Options options, storage::Catalog* catalog, RunRegistry* registry, Clock* clock);
  ~LocalLauncher() override;

  // The address workers dial, when it was not known at construction (a
  // daemon on port 0 learns its port once listening). Launch waits for it.
  void SetDaemonAddress(const std::string& address) override;

  // Starts every rank of `run` from its launch profile; FAILED_PRECONDITION
  // for a run without a (valid) profile, naming what to do.
  absl::Status Launch(const std::string& run) override;
  // SIGTERM to every child, SIGKILL after `grace`.
  void StopAll(absl::Duration grace) override;

  // Takes over the ranks the catalog records for runs that are not over
  // (call once at startup). Returns how many live ranks were adopted.
  absl::StatusOr<int> AdoptRecorded();
  // A rank's pid (-1 when none runs); tests.
  pid_t PidOf(const std::string& run, uint32_t rank);

 private:
  struct Rank {
    pid_t pid = -1;
    bool done = false;
    int restarts = 0;
    absl::Time started;
    // Not our child (adopted after a restart): watched through /proc.
    bool adopted = false;
    int64_t start_ticks = 0;
    // Recorded, but not running when the daemon started: a crash.
    bool lost = false;
  };
  struct Run {
    spikeguard::v1::RunSpec spec;
    uint32_t world_size = 1;
    int master_port = 0;
    std::vector<Rank> ranks;
    bool finished = false;
    // The profile's, 0: the policy's.
    int max_restarts = 0;
  };

  // `restart`: resume from the newest complete checkpoint of the generation
  // (and, with `count_restart`, spend one of the rank's restarts).
  absl::Status StartRank(const std::string& run, Run& r, uint32_t rank, bool restart,
                         bool count_restart = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MonitorLoop();
  // Stops every other live rank of `r`, then starts all of them again. An
  // error: some rank could not be started (the run cannot go on).
  absl::Status RestartAll(const std::string& run, Run& r, uint32_t dead_rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The run is over and failed: `reason` goes to the log and the audit log
  // ("run-failed") before the run's state says so.
  void Fail(const std::string& run, Run& r, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordRank(const std::string& run, uint32_t rank, const Rank& rk, int64_t generation);

  const Options options_;
  // Options::daemon_address, or the one SetDaemonAddress gave: written once,
  // before address_ready_ is notified, and read only after.
  std::string daemon_address_;
  absl::Notification address_ready_;
  storage::Catalog* const catalog_;
  RunRegistry* const registry_;
  Clock* const clock_;
  absl::Mutex mu_;
  std::map<std::string, Run> runs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // StopAll ran: nothing starts any more (the daemon is shutting down).
  bool stopped_all_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace spikeguard::daemon
