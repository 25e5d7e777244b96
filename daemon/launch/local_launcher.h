// local_launcher.h
// -----------------------------------------------------------------------------
// The embedded launcher: starts the ranks of a run as local processes from
// its RunSpec, and restarts a rank that crashes or stops heartbeating, from
// the newest complete checkpoint of the run's current generation (DESIGN §8).
//
// The spec's command is an argv template; these placeholders are replaced:
//   {rank} {world_size} {run} {addr} {generation}
//   {resume}  the checkpoint to start from ("" on a fresh start: an argument
//             that becomes empty is dropped, together with a preceding
//             "--resume"-style flag when written as two arguments)
//   {plan}    the current generation's data plan ("0-600,610-")
//   {master_port}  the rendezvous port of this start of the ranks
// Every rank also gets torch.distributed's environment: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE (one machine: the rank and the world size),
// MASTER_ADDR=127.0.0.1 and MASTER_PORT (a free port, new at each start of
// the ranks, so a restarted group never meets the old one), plus
// SPIKEGUARD_ADDR, SPIKEGUARD_RUN and SPIKEGUARD_GENERATION. The spec's env
// is applied last and wins.
// A rank's output goes to DATA_DIR/runs/RUN/rank-R.log.
//
// A rank that exits 0 is done; when every rank of a run is done the run is
// "finished". Exit code 3 (rejected by the daemon) is final: the run is
// "failed". Other exits are crashes, restarted up to max_restarts times:
// the dead rank alone, or, with RunSpec.restart_all_ranks, every rank (the
// others are stopped first), all from the newest complete checkpoint of the
// generation.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "daemon/ingest/run_registry.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class LocalLauncher {
 public:
  struct Options {
    std::string data_dir;
    // The address workers dial.
    std::string daemon_address;
    absl::Duration poll = absl::Milliseconds(250);
  };

  LocalLauncher(Options options, storage::Catalog* catalog, RunRegistry* registry, Clock* clock);
  ~LocalLauncher();

  // Starts every rank of `run` (its spec must have a command).
  absl::Status Launch(const std::string& run);
  // SIGTERM to every child, SIGKILL after `grace`.
  void StopAll(absl::Duration grace);

  // Expands the spec's command for one rank (exposed for tests).
  static std::vector<std::string> Expand(const std::vector<std::string>& command,
                                         const std::map<std::string, std::string>& values);

 private:
  struct Rank {
    pid_t pid = -1;
    bool done = false;
    int restarts = 0;
    absl::Time started;
  };
  struct Run {
    spikeguard::v1::RunSpec spec;
    uint32_t world_size = 1;
    int master_port = 0;
    std::vector<Rank> ranks;
    bool finished = false;
  };

  // `restart`: resume from the newest complete checkpoint of the generation
  // (and, with `count_restart`, spend one of the rank's restarts).
  absl::Status StartRank(const std::string& run, Run& r, uint32_t rank, bool restart,
                         bool count_restart = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MonitorLoop();
  // Stops every other live rank of `r`, then starts all of them again.
  void RestartAll(const std::string& run, Run& r, uint32_t dead_rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  storage::Catalog* const catalog_;
  RunRegistry* const registry_;
  Clock* const clock_;
  absl::Mutex mu_;
  std::map<std::string, Run> runs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace spikeguard::daemon
