// slurm_script.h
// -----------------------------------------------------------------------------
// How a generation of a run starts under Slurm without a shell anywhere.
//
// The daemon submits (sbatch) a batch script whose interpreter is
// `spikeguard-slurm-exec` (its #! line) and whose body is data, not code:
//
//   #!/usr/local/bin/spikeguard-slurm-exec
//   # spikeguard batch script (written by spikeguardd; data, not a shell script)
//   srun /usr/bin/srun
//   srun_option --kill-on-bad-exit=1
//   master_port 29517
//   arg /opt/train/worker
//   arg --rank={rank}
//   arg --corpus=/data/a\x20b        (each value C-escaped: one line, any bytes)
//
// Slurm runs the script on the job's first node: spikeguard-slurm-exec reads
// it and executes `srun OPTIONS -- spikeguard-slurm-exec --task SCRIPT`; on
// every task, the task mode takes its identity from Slurm's environment
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST), fills in
// the per-task placeholders {rank} {local_rank} {world_size}, sets RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (the job's first
// node) and MASTER_PORT, and execs the argv. Everything else of the argv was
// expanded by the daemon from the launch profile before submission.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace spikeguard::daemon {

struct SlurmScript {
  // The #! interpreter: spikeguard-slurm-exec's absolute path.
  std::string exec_path;
  std::string srun = "/usr/bin/srun";
  std::vector<std::string> srun_options;
  int master_port = 0;
  // The rank's command: absolute argv[0]; may hold {rank}, {local_rank},
  // {world_size}.
  std::vector<std::string> argv;
};

// The script's text; INVALID_ARGUMENT when a path is not absolute or the
// argv is empty.
absl::StatusOr<std::string> RenderSlurmScript(const SlurmScript& script);
// Its inverse; INVALID_ARGUMENT naming the line that is not one of the
// script's forms.
absl::StatusOr<SlurmScript> ParseSlurmScript(absl::string_view text);

// What one task of the job is.
struct SlurmTask {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
};

// From Slurm's task environment (`getenv` is ::getenv in the program, a map
// in tests). INVALID_ARGUMENT naming the variable that is missing or wrong.
absl::StatusOr<SlurmTask> SlurmTaskFromEnv(
    const std::function<const char*(const char*)>& getenv);

// The first host of a Slurm host list: "vm" -> "vm", "node[07-09,12],gpu1"
// -> "node07", "a[001-004]" -> "a001".
absl::StatusOr<std::string> FirstSlurmHost(absl::string_view nodelist);

// `argv` with {rank} {local_rank} {world_size} replaced.
std::vector<std::string> ExpandTaskArgv(const std::vector<std::string>& argv, const SlurmTask& task);

}  // namespace spikeguard::daemon
