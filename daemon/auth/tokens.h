// tokens.h
// -----------------------------------------------------------------------------
// Who may call the daemon. The operator keeps a tokens file (--tokens FILE,
// reloaded on SIGHUP), one principal per line:
//
//   # principal  role      runs          token hash
//   alice        operator  *             sha256:9f86d081884c7d65...
//   trainer      worker    llama-7b,l2   sha256:60303ae22b998861...
//   ci           viewer    *             sha256:fd61a03af4f77d87...
//   root         admin     *             sha256:a4e624d686e03ed2...
//
// Only hashes are stored (`spikectl token new` makes a token and its line);
// a presented token is hashed and compared with every entry in constant
// time. Roles:
//   worker    Attach, and checkpoint registration, for the runs it names;
//             read-only calls on those runs.
//   viewer    read-only calls (on the runs it names).
//   operator  viewer + actions, approvals, policy and quarantine of the runs
//             it names (`*`: all).
//   admin     everything: create runs, map runs to launch profiles, the
//             daemon-wide default policy, the whole audit log. Its runs
//             must be `*` (a list is refused, not silently ignored).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace spikeguard::auth {

enum class Role { kWorker = 0, kViewer = 1, kOperator = 2, kAdmin = 3 };

std::string RoleName(Role role);
absl::StatusOr<Role> ParseRole(absl::string_view name);

struct Principal {
  std::string name;
  Role role = Role::kViewer;
  // Empty with all_runs: every run.
  bool all_runs = false;
  std::set<std::string> runs;

  bool MayUseRun(absl::string_view run) const {
    return SeesEveryRun() || runs.count(std::string(run)) > 0;
  }
  // Whether daemon-wide figures (counts over every run, the audit of no
  // run) are this principal's to read: not for one scoped to some runs.
  bool SeesEveryRun() const { return all_runs || role == Role::kAdmin; }
};

struct TokenEntry {
  Principal principal;
  std::string hash;  // "sha256:<64 hex>"
};

// Parses a tokens file's text. Errors name the line and what is wrong with
// it (never the hash). Duplicate principal names and duplicate hashes are
// refused.
absl::StatusOr<std::vector<TokenEntry>> ParseTokens(absl::string_view text);
// Reads and parses FILE; the error names the path.
absl::StatusOr<std::vector<TokenEntry>> LoadTokensFile(const std::string& path);

// The entry whose hash matches `token`, compared against every entry in
// constant time per entry (no early exit); nullptr when none does.
const TokenEntry* FindToken(const std::vector<TokenEntry>& entries, absl::string_view token);

}  // namespace spikeguard::auth
