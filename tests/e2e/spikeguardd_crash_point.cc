// spikeguardd with a crash point, for tests only: the daemon's own program
// (daemon_main.h) plus one flag,
//
//   --exit-after-groups=N   after the N-th telemetry group is durable, and
//                           before any of its batches is acknowledged, the
//                           process _exits with code 86
//
// so a test can kill the daemon between a group's commit and its acks
// (telemetry_e2e_test). The hook is injected through
// Daemon::Options::after_group_commit; spikeguardd itself has none.
#include <unistd.h>

#include <cstdint>

#include "absl/flags/flag.h"
#include "base/logging.h"
#include "daemon/daemon_main.h"

ABSL_FLAG(int64_t, exit_after_groups, 0,
          "exit (code 86) after this many committed telemetry groups, before their acks "
          "(0: never)");

int main(int argc, char** argv) {
  return spikeguard::daemon::DaemonMain(
      argc, argv, [](spikeguard::daemon::Daemon::Options& options) {
        const int64_t n = absl::GetFlag(FLAGS_exit_after_groups);
        if (n <= 0) return;
        options.after_group_commit = [n](int64_t committed_groups) {
          if (committed_groups < n) return;
          // Durable but unanswered: the test's workers resend all of it.
          SG_LOG(WARNING) << "ingest: exiting after group " << committed_groups
                          << " (crash point), before its acks";
          _exit(86);
        };
      });
}
