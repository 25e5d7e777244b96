// subprocess.h
// -----------------------------------------------------------------------------
// The one place spikeguard starts programs (fork and exec), three ways:
//   SpawnProcess  starts a program and returns its pid once it is executing
//                 (the local launcher's ranks: output to a log, exact
//                 environment, working directory); the caller waits for it.
//   RunSubprocess runs a command to completion and captures what it printed
//                 (below), on top of SpawnProcess.
//   ExecProcess   replaces the calling process (spikeguard-slurm-exec).
// None involves a shell: the argv is executed as given.
//
// RunSubprocess: for the short
// client commands the daemon drives (sbatch, scontrol, scancel). No shell:
// the argv is executed as given (execvp, so argv[0] may be a bare name found
// on PATH), with the caller's environment plus `env` overrides. Output beyond
// `max_output_bytes` per stream is dropped (and said so); a command still
// running at `timeout` is killed (SIGKILL to its process group) and the
// result is DEADLINE_EXCEEDED naming it.
//
//   auto r = RunSubprocess({"scontrol", "show", "job", "-o", "42"}, {});
//   if (r.ok() && r->exit_code == 0) Parse(r->out);
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace spikeguard {

struct SpawnOptions {
  // The child's whole environment, "KEY=VALUE" each; absent: the caller's.
  std::optional<std::vector<std::string>> env;
  // Become the child's stdin, stdout, stderr; -1: the caller's.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // The child's working directory; "": the caller's.
  std::string workdir;
  // The child leads a new process group (kill(-pid, ...) reaches all of it).
  bool new_process_group = false;
  // execvpe: argv[0] may be a bare name found on PATH. Otherwise execve:
  // argv[0] is the path executed.
  bool search_path = false;
};

// Starts `argv` and returns the child's pid once it executes argv[0]; the
// caller reaps it (waitpid). NOT_FOUND naming argv[0] (or the working
// directory) and the reason when the child could not execute it (that child
// is already reaped), INVALID_ARGUMENT for an empty argv, INTERNAL when a
// pipe or fork fails.
absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                   const SpawnOptions& options = {});

// Replaces the calling process with `argv` (execv: argv[0] is a path, the
// environment is the current one). Returns only when that fails: NOT_FOUND
// naming argv[0] and the reason (INVALID_ARGUMENT for an empty argv).
absl::Status ExecProcess(const std::vector<std::string>& argv);

struct SubprocessOptions {
  // Set (or, with an empty value, overridden to "") in the child's
  // environment on top of the caller's.
  std::map<std::string, std::string> env;
  // Written to the child's stdin, which is then closed.
  std::string stdin_text;
  absl::Duration timeout = absl::Seconds(30);
  size_t max_output_bytes = 1 << 20;
};

struct SubprocessResult {
  // The exit status; 128 + N when killed by signal N.
  int exit_code = -1;
  std::string out;
  std::string err;
};

// NOT_FOUND when argv[0] cannot be executed, DEADLINE_EXCEEDED when it ran
// past the timeout, INVALID_ARGUMENT for an empty argv; otherwise the result,
// whatever the exit code.
absl::StatusOr<SubprocessResult> RunSubprocess(const std::vector<std::string>& argv,
                                               const SubprocessOptions& options = {});

// "prog arg1 'arg two'": for messages and logs only (never executed).
std::string ArgvForDisplay(const std::vector<std::string>& argv);

}  // namespace spikeguard
