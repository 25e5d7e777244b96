// launcher.h
// -----------------------------------------------------------------------------
// What starts and restarts the ranks of a run. Two kinds: local processes
// (local_launcher.h) and Slurm jobs (slurm_launcher.h); a run's launch profile
// chooses (a `slurm { ... }` block: Slurm), and ProfileLauncher routes each run
// to the one its profile names.
//
// Both record what they started in the catalog (table `launches`: a Slurm
// job id, or a pid with its start time) and, when the daemon starts again
// after a crash, adopt what is still there instead of starting it twice.
//
//   ProfileLauncher launcher(profiles, &local, &slurm);
//   SG_RETURN_IF_ERROR(launcher.Launch("run-1"));
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class LaunchProfiles;
class CheckpointGuard;

class Launcher {
 public:
  virtual ~Launcher() = default;
  // The address workers dial, once the daemon knows it (port 0 is learnt
  // after listening). Launch waits for it.
  virtual void SetDaemonAddress(const std::string& address) = 0;
  // Starts `run` from its launch profile; FAILED_PRECONDITION for a run
  // without a (valid) profile, naming what to do; ALREADY_EXISTS when it is
  // already launched.
  virtual absl::Status Launch(const std::string& run) = 0;
  // Stops supervising: local processes get SIGTERM, then SIGKILL after
  // `grace`; Slurm jobs stay with Slurm (a restarted daemon adopts them).
  virtual void StopAll(absl::Duration grace) = 0;
};

// Where a start of the run's current generation begins.
struct ResumePoint {
  int64_t generation = 0;
  // The checkpoint {resume} names ("" for a fresh start).
  std::string resume;
  // The generation's data plan ("0-600,610-").
  std::string plan = "0-";
};

// On a restart (or any start of a generation > 0): the newest complete
// checkpoint of the current generation, else the one it was rewound to; only
// one CheckpointGuard::Verify accepts (others are skipped, logged with
// `who`). A fresh start of generation 0 resumes from nothing.
absl::StatusOr<ResumePoint> ChooseResumePoint(storage::Catalog* catalog,
                                              CheckpointGuard* checkpoints, const std::string& run,
                                              bool restart, const std::string& who);

// Routes a run to the local or the Slurm launcher by its profile.
class ProfileLauncher : public Launcher {
 public:
  // `slurm` may be null (then a Slurm profile's run is refused).
  ProfileLauncher(storage::Catalog* catalog, LaunchProfiles* profiles, Launcher* local,
                  Launcher* slurm)
      : catalog_(catalog), profiles_(profiles), local_(local), slurm_(slurm) {}
  void SetDaemonAddress(const std::string& address) override;
  absl::Status Launch(const std::string& run) override;
  void StopAll(absl::Duration grace) override;

 private:
  storage::Catalog* const catalog_;
  LaunchProfiles* const profiles_;
  Launcher* const local_;
  Launcher* const slurm_;
};

// spikeguardd --advertise-address: the address workers on other nodes dial
// ({addr} in a profile's argv, SPIKEGUARD_ADDR). `flag` is HOST or HOST:PORT
// (an IPv6 address in brackets: [fd00::1]:7070); without a port, the port of
// `listen` (HOST:PORT), which must then be fixed (not 0). Returns "HOST:PORT",
// or "" for an empty flag (the default: 127.0.0.1 and the bound port, one
// node only). INVALID_ARGUMENT naming the flag when it is not an address a
// worker can dial (empty host, bad port, 0.0.0.0 or [::], a bare IPv6).
absl::StatusOr<std::string> ResolveAdvertiseAddress(const std::string& flag,
                                                    const std::string& listen);

// Field 22 of /proc/PID/stat (the start time in clock ticks since boot), or
// NOT_FOUND when there is no such process. A pid reused by another process
// has another start time.
absl::StatusOr<int64_t> ProcessStartTicks(int64_t pid);

}  // namespace spikeguard::daemon
