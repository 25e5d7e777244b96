// launch_profiles.h
// -----------------------------------------------------------------------------
// Launch profiles: the operator-owned command lines the daemon may execute
// (format and placeholders in launch_profiles.proto). Nothing sent over the
// wire is executed: a RunSpec names a profile and gives values for the
// parameters that profile declares; ValidateSpec checks every value (type,
// range, characters, length) before a run is stored, and Build turns a
// profile and a stored spec into the argv, environment and working
// directory of one rank, re-validating everything (the file may have
// changed since).
//
// The file is read at startup and again whenever its modification time or
// size changes (checked at every lookup), so an edited file applies to the
// next launch or restart without restarting the daemon. A file that no
// longer parses is logged and the previous profiles stay in force.
//
//   SG_ASSIGN_OR_RETURN(auto profiles, LaunchProfiles::Load("/etc/spikeguard/profiles.textproto"));
//   SG_RETURN_IF_ERROR(profiles->ValidateSpec(spec, world_size, "spec"));
//   SG_ASSIGN_OR_RETURN(LaunchCommand cmd, profiles->Build(spec, values));
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/launch/launch_profiles.pb.h"
#include "spikeguard/v1/supervisor.pb.h"

namespace spikeguard::daemon {

// What the launcher executes for one rank.
struct LaunchCommand {
  std::vector<std::string> argv;
  // Name -> value from the profile (allow-listed daemon variables, then the
  // fixed values); the launcher adds its own on top.
  std::map<std::string, std::string> env;
  std::string workdir;
  int max_restarts = 0;  // 0: the policy's
};

// nodes x tasks_per_node (each at least 1).
uint32_t SlurmWorldSize(const launch::SlurmOptions& s);

// A value shown in an error message: at most 64 bytes, escaped.
std::string Quoted(const std::string& value);

class LaunchProfiles {
 public:
  // An empty set (no --launch-profiles): every run that asks to be launched
  // is refused.
  LaunchProfiles() = default;
  // Reads and checks `path` (every profile: argv[0] absolute, placeholders
  // known, parameters well-formed, roots absolute).
  static absl::StatusOr<std::unique_ptr<LaunchProfiles>> Load(const std::string& path);
  // The same checks on text (tests).
  static absl::StatusOr<std::unique_ptr<LaunchProfiles>> FromText(const std::string& text);

  // The profile named `name` (after re-reading an edited file); NOT_FOUND
  // naming the known ones.
  absl::StatusOr<launch::LaunchProfile> Find(const std::string& name);
  std::vector<std::string> Names();

  // Checks that `spec` may be stored: no command, env or workdir; a known
  // profile; every parameter declared, valid, and given unless defaulted;
  // world_size within the profile's max; manifest.corpus_dir inside the
  // profile's corpus_root. INVALID_ARGUMENT naming the field and the value.
  // `field` prefixes the field names ("spec" or "" for SetRunProfile).
  absl::Status ValidateSpec(const spikeguard::v1::RunSpec& spec, uint32_t world_size,
                            const std::string& field);

  // The command of one rank of a stored run: the profile's argv with
  // `values` (rank, world_size, run, addr, generation, resume, plan,
  // master_port) and the validated parameters substituted. FAILED_PRECONDITION
  // for a legacy spec (a command, no profile) and for one that no longer
  // validates.
  absl::StatusOr<LaunchCommand> Build(const std::string& run, const spikeguard::v1::RunSpec& spec,
                                      uint32_t world_size,
                                      const std::map<std::string, std::string>& values);

  // The canonical corpus dir of a stored run, checked again at every use
  // (the corpus of a manifest resolution, a document preview): the dir is
  // resolved now, through whatever symlinks it holds today, and must still
  // be inside its profile's corpus_root; FAILED_PRECONDITION naming the dir,
  // where it resolves and the root otherwise. NOT_FOUND when the spec names
  // no corpus dir.
  absl::StatusOr<std::string> CorpusDir(const std::string& run,
                                        const spikeguard::v1::RunSpec& spec);

  // The run's checkpoint root per its profile ("{run}" substituted), or
  // nullopt when the spec names no profile. NOT_FOUND when the profile is
  // gone.
  absl::StatusOr<std::optional<std::string>> CheckpointRoot(const std::string& run,
                                                            const spikeguard::v1::RunSpec& spec);

 private:
  absl::Status ReloadIfChanged();
  static absl::StatusOr<std::map<std::string, launch::LaunchProfile>> Parse(
      const std::string& text, const std::string& source);

  absl::Mutex mu_;
  std::string path_;
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t size_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<std::string, launch::LaunchProfile> profiles_ ABSL_GUARDED_BY(mu_);
};

// "Legacy" runs: stored before launch profiles with a free command line and
// no profile. Never launched until an admin maps them (SetRunProfile).
bool IsLegacySpec(const spikeguard::v1::RunSpec& spec);
std::string LegacyRunMessage(const std::string& run);

}  // namespace spikeguard::daemon
