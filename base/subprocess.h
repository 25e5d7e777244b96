// subprocess.h
// -----------------------------------------------------------------------------
// Runs a command to completion and captures what it printed: for the short
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

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace spikeguard {

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
