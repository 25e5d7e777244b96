// slurm_cli.h
// -----------------------------------------------------------------------------
// What the Slurm launcher asks of Slurm, through its client commands (no
// library: slurm-wlm's ABI changes every release, its commands do not):
//   Submit  sbatch --parsable ... SCRIPT   -> the job id
//   Query   scontrol show job -o ID        -> state, exit code, reason, nodes
//   Cancel  scancel [--signal=SIG] ID
// Every command runs without a shell (base/subprocess.h) with the options'
// environment (SLURM_CONF for a test cluster), under a timeout. Output is
// parsed strictly: a line that is not what Slurm prints is an error naming
// what was expected, never a guessed state. A job Slurm no longer knows
// (purged after MinJobAge) is NOT_FOUND.
//
//   SlurmCli slurm({.env = {{"SLURM_CONF", conf}}});
//   SG_ASSIGN_OR_RETURN(int64_t id, slurm.Submit(submission));
//   SG_ASSIGN_OR_RETURN(SlurmJob job, slurm.Query(id));
//   if (job.state == SlurmJobState::kFailed) ... job.exit_code, job.reason
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace spikeguard::daemon {

enum class SlurmJobState {
  kPending,
  kRunning,
  kSuspended,
  kCompleting,
  kCompleted,
  kFailed,
  kCancelled,
  kTimeout,
  kNodeFail,
  kPreempted,
  kOutOfMemory,
  kBootFail,
  kDeadline,
  kRequeued,
  kOther,  // a state this code does not know: reported with its text
};

// "RUNNING", ... (the names Slurm prints).
absl::string_view SlurmJobStateName(SlurmJobState s);
// Whether the job has ended (no task of it runs or will run).
bool SlurmJobEnded(SlurmJobState s);

struct SlurmJob {
  int64_t id = 0;
  std::string name;
  SlurmJobState state = SlurmJobState::kOther;
  std::string state_text;  // as printed, e.g. "CANCELLED"
  std::string reason;      // "None", "NonZeroExitCode", "Resources", ...
  int exit_code = 0;       // ExitCode=CODE:SIGNAL of the batch step
  int exit_signal = 0;
  std::string node_list;   // "vm" or "node[01-04]"; "" while pending
  std::string batch_host;
  int64_t num_tasks = 0;
};

// One line of `scontrol show job -o`: "JobId=42 JobName=x ... JobState=RUNNING
// Reason=None ... ExitCode=0:0 ...". INVALID_ARGUMENT naming the missing or
// malformed field.
absl::StatusOr<SlurmJob> ParseScontrolJobLine(absl::string_view line);
// `sbatch --parsable` prints "ID" or "ID;CLUSTER".
absl::StatusOr<int64_t> ParseSbatchParsable(absl::string_view out);

struct SlurmSubmission {
  std::string job_name;
  std::string partition;
  std::string account;
  int nodes = 1;
  int ntasks_per_node = 1;
  // Slurm's format ("30", "1:00:00", "2-00:00:00"); "" for the partition's.
  std::string time_limit;
  std::string workdir;      // --chdir; "" for sbatch's
  std::string output_path;  // --output (%j is the job id); "" for sbatch's
  // Further sbatch options ("--exclusive", "--gres=gpu:8"), already checked
  // against the launch profile's allow-list by the caller.
  std::vector<std::string> extra_options;
  // Exported to the job (--export=NAME,...; the values are set in sbatch's
  // own environment, so none appears on a command line). Nothing else of the
  // daemon's environment is (--export=NIL when empty).
  std::map<std::string, std::string> env;
  // The batch script's path (a file Slurm copies at submission).
  std::string script_path;
};

class SlurmCli {
 public:
  struct Options {
    // Directory of sbatch/scontrol/scancel; "" to find them on PATH.
    std::string bin_dir;
    // Set for every command (SLURM_CONF=... for a test cluster).
    std::map<std::string, std::string> env;
    absl::Duration timeout = absl::Seconds(30);
  };

  explicit SlurmCli(Options options) : options_(std::move(options)) {}

  // The sbatch argv of `s` (exposed for tests and for the logs).
  std::vector<std::string> SbatchArgv(const SlurmSubmission& s) const;
  absl::StatusOr<int64_t> Submit(const SlurmSubmission& s) const;
  absl::StatusOr<SlurmJob> Query(int64_t job_id) const;
  // `signal` "" for scancel's default (the whole job ends).
  absl::Status Cancel(int64_t job_id, const std::string& signal = "") const;

 private:
  std::string Bin(const std::string& name) const;
  const Options options_;
};

}  // namespace spikeguard::daemon
