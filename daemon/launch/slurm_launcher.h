// slurm_launcher.h
// -----------------------------------------------------------------------------
// Runs the ranks of a run as a Slurm job: a run whose launch profile has a
// `slurm { ... }` block (launch_profiles.proto).
//
// Why sbatch and srun (not job steps in a held allocation): a job per start
// of the ranks is what a cluster's accounting, fair share, time limits and
// node-failure handling already understand; a held allocation would sit idle
// on GPUs between restarts and hide failures from Slurm. The price is a trip
// through the queue at each restart, measured by the tests.
//
// A start (first launch, or a restart) writes a batch script (data, read by
// spikeguard-slurm-exec: no shell anywhere, slurm_script.h) to
// DATA_DIR/runs/RUN/slurm-N.sbatch and submits it with `sbatch --parsable`:
// --nodes/--ntasks-per-node/--partition/--account/--time from the profile,
// its allow-listed extra options, --export of exactly the run's environment
// (the profile's plus SPIKEGUARD_ADDR/RUN/GENERATION/TOKEN_FILE and the TLS
// variables), output in DATA_DIR/runs/RUN/slurm-JOBID.out. The worker token
// itself is never in the job's environment (Slurm stores that in its job
// record): it is written to DATA_DIR/runs/RUN/worker.token, mode 0600 (the
// job runs as the daemon's user), named by SPIKEGUARD_TOKEN_FILE, and removed
// when the run finishes or fails. With several nodes DATA_DIR/runs must be on
// a file system the nodes share (the job's output is written there too).
// SPIKEGUARD_ADDR and {addr} are the daemon's advertised address
// (spikeguardd --advertise-address; default 127.0.0.1:PORT, one node only).
// Every task runs
// the profile's argv with {resume} {plan} {generation} {addr} filled in by
// the daemon and {rank} {local_rank} {world_size} by the task from Slurm's
// environment (with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR = the first
// node, MASTER_PORT). srun runs with --kill-on-bad-exit=1: one dead rank ends
// the job.
//
// The job's id is stored in the catalog (launches: slot "job"), with the
// restarts the run has spent, before anything else happens to it; a daemon
// started again adopts every recorded job (AdoptRecorded) and supervises it
// as its own.
//
// The job is followed by polling `scontrol show job -o` (no accounting
// daemon is needed): PENDING and its reason and RUNNING are logged as they
// change; COMPLETED with exit code 0 finishes the run. Any other end
// (FAILED with its exit code and reason, NODE_FAIL, TIMEOUT, CANCELLED by
// someone else, OUT_OF_MEMORY, a job Slurm no longer knows) is a crash: the
// job is started again, from the newest complete checkpoint of the run's
// current generation that verifies (ChooseResumePoint), while the run has
// restarts left (the profile's max_restarts, else the policy's, else 3); then
// the run is "failed", with the reason in the log and the audit trail. Exit
// code 3 (a worker the daemon rejected) is final at once. A rank silent past
// the heartbeat timeout gets its job cancelled and restarted the same way.
// A new job is submitted only once the previous one has left RUNNING and
// COMPLETING, so two starts of a run never overlap.
//
// A job that fails while an incident's probe runs is restarted like any
// other failure (from the newest verified checkpoint of the probe's
// generation, within the budget), exactly as LocalLauncher restarts a probe's
// crashed rank: no launcher tells the incident engine about a crash. The
// engine learns of a probe's end only from its workers (OnGenerationEnded,
// OnCommandFailed) or, when the restarts are spent, from its probe timeout
// (EngineOptions::probe_timeout, 10 min: the probe fails and the incident
// becomes INCONCLUSIVE).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/clock.h"
#include "daemon/ingest/run_registry.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "daemon/launch/launcher.h"
#include "daemon/launch/slurm_cli.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class SlurmLauncher : public Launcher {
 public:
  struct Options {
    std::string data_dir;
    std::string daemon_address;
    absl::Duration poll = absl::Milliseconds(500);
    LaunchProfiles* profiles = nullptr;
    CheckpointGuard* checkpoints = nullptr;
    std::function<std::string(const std::string& run)> worker_token;
    std::map<std::string, std::string> daemon_env;
    // sbatch/scontrol/scancel: where, and their environment (SLURM_CONF).
    SlurmCli::Options slurm;
    std::string srun = "/usr/bin/srun";
    // spikeguard-slurm-exec when the profile names none; "" for the one
    // beside this program (/proc/self/exe).
    std::string exec_path;
  };

  // What the launcher knows of a run (tests, logs).
  struct JobView {
    int64_t job_id = 0;
    int restarts = 0;
    std::string state;  // the last Slurm state seen ("" before the first poll)
    bool finished = false;
  };

  SlurmLauncher(Options options, storage::Catalog* catalog, RunRegistry* registry, Clock* clock);
  ~SlurmLauncher() override;

  void SetDaemonAddress(const std::string& address) override;
  absl::Status Launch(const std::string& run) override;
  // Stops polling; the jobs stay with Slurm.
  void StopAll(absl::Duration grace) override;

  // Takes over every Slurm job the catalog records for a run that is not
  // finished or failed (call once at startup, after a crash or a restart).
  // Returns how many were adopted.
  absl::StatusOr<int> AdoptRecorded();

  std::optional<JobView> View(const std::string& run);

  // Where the run's worker token is written for its tasks
  // (DATA_DIR/runs/RUN/worker.token, mode 0600; SPIKEGUARD_TOKEN_FILE).
  std::string TokenFile(const std::string& run) const;

 private:
  struct Run {
    spikeguard::v1::RunSpec spec;
    int64_t job_id = 0;
    int64_t submitted_generation = 0;
    int restarts = 0;
    int max_restarts = 0;  // 0: the policy's
    std::string last_state;
    std::string last_reason;
    // Cancelled by us (hung rank): start again once it has ended.
    bool cancelled_for_restart = false;
    bool finished = false;
    absl::Time started;
    // When this job was first seen RUNNING (InfinitePast: not yet).
    absl::Time running_since = absl::InfinitePast();
    int query_failures = 0;
  };

  // Writes the script and submits the run's next job; records the job id.
  absl::Status Submit(const std::string& run, Run& r, bool restart)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MonitorLoop();
  void Poll(const std::string& run, Run& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A crash (or a cancel for a restart) ended the job: restart within budget
  // or fail the run with `reason`.
  void Ended(const std::string& run, Run& r, const std::string& reason, bool spend)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(const std::string& run, Run& r, spikeguard::v1::RunState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Record(const std::string& run, const Run& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int MaxRestarts(const std::string& run, const Run& r);

  const Options options_;
  const SlurmCli slurm_;
  std::string daemon_address_;
  absl::Notification address_ready_;
  storage::Catalog* const catalog_;
  RunRegistry* const registry_;
  Clock* const clock_;
  absl::Mutex mu_;
  std::map<std::string, Run> runs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace spikeguard::daemon
