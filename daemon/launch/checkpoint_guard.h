// checkpoint_guard.h
// -----------------------------------------------------------------------------
// Confined checkpoints. Every run has a checkpoint root: its launch profile's
// checkpoint_root ("{run}" substituted), or, for a run without a profile,
// DATA_DIR/runs/RUN. A checkpoint is registered (RegisterCheckpoint, the
// worker stream's CheckpointSaved) only when its URI is a plain absolute path
// or a file:// URI (file:///p or file://localhost/p, %XX decoded) inside
// that root (storage/checkpoint/checkpoint_uri.h); any other scheme
// (http://, s3://, ...), a relative path, or a path outside is refused before
// anything is stored.
//
// "Inside" is decided by opening, not by comparing strings: the path must
// name the root (as configured or canonical) followed by plain names, and
// the file is opened relative to a descriptor of the root, following no
// symbolic link (OpenBeneath, base/beneath.h: openat2 with RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS, or a walk of O_NOFOLLOW
// opens). A symbolic link anywhere below the root (a directory of the path or
// the file itself) is refused, naming it, whether it leads out or not; a
// directory swapped for one after the check cannot redirect the open, since
// the check is the open. Registration refuses what is already there and
// refused; a path not there yet is checked again at every use.
//
// A catalog checkpoint is used (rewinds chosen by the engine or asked with
// spikectl rewind, the launcher's {resume}) only after Verify: it still
// opens beneath the root as above (a symlink may have been planted since),
// is a regular file, has the registered size, and its checksum still matches:
//   - a reference-worker checkpoint ("SGCKPT"): the XXH64 of its trailer,
//     recomputed, and equal to the registered checksum when one was given;
//   - a spikeguard PyTorch checkpoint ("SGTORCH1"): the sha256 of its
//     payload, equal to the registered checksum (else its header's);
//   - any other file: the registered checksum, 16 hex digits (XXH64) or 64
//     (sha256) of the whole file; a file of unknown format registered without
//     a checksum cannot be verified and is not used.
//
// Without reading the file when it is the one registered: registration
// records the file's identity (FileIdentity: device, inode, size,
// modification and change times; the change time moves on every write and
// cannot be set back) in the catalog. A file with that identity still is the
// registered file; only its head or trailer is read (the registered checksum
// must agree with the one the file carries, and be one a worker can check),
// and the worker checks the checksum as it loads the file, which it reads
// anyway (the rewind command carries it). A rewind to a checkpoint of many
// GiB therefore costs a few small reads on the daemon's decision path, not a
// hash of the whole file. A file without a recorded identity (registered
// before it was written, or before the catalog kept identities) or with
// another one (rewritten, copied back, touched) is read whole and checked as
// above, and, when it passes, its identity recorded; results of that check
// are cached per file and identity.
#pragma once

#include <sys/stat.h>

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/beneath.h"
#include "daemon/launch/launch_profiles.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class CheckpointGuard {
 public:
  // `profiles` may be null (no profiles: every run's root is DATA_DIR/runs/RUN).
  CheckpointGuard(storage::Catalog* catalog, LaunchProfiles* profiles, std::string data_dir)
      : catalog_(catalog), profiles_(profiles), data_dir_(std::move(data_dir)) {}

  // The run's checkpoint root, canonical.
  absl::StatusOr<std::string> RootFor(const std::string& run);

  // The canonical path `uri` names when it may be registered for `run`;
  // INVALID_ARGUMENT naming the URI and why otherwise (FAILED_PRECONDITION
  // when the run's root itself is unusable).
  absl::StatusOr<std::string> Confine(const std::string& run, const std::string& uri);
  // The same, with the identity of the file when it is already there (""
  // when not): what registration stores with the checkpoint
  // (Catalog::UpsertCheckpoint).
  struct Admitted {
    std::string path;
    std::string file_identity;
  };
  absl::StatusOr<Admitted> Admit(const std::string& run, const std::string& uri);

  // The canonical path of `c` when it may be used (see the header comment);
  // FAILED_PRECONDITION naming the checkpoint and why otherwise.
  absl::StatusOr<std::string> Verify(const spikeguard::v1::Checkpoint& c);

  // The path a file:// URI or plain path names (storage::CheckpointPathOfUri),
  // without confinement; INVALID_ARGUMENT naming what is wrong otherwise.
  static absl::StatusOr<std::string> PathOfUri(const std::string& uri);

  // "dev=D ino=I size=S mtime=SEC.NSEC ctime=SEC.NSEC" of a file's stat.
  static std::string FileIdentity(const struct stat& st);

 private:
  struct Roots {
    std::string canonical;   // symbolic links above the root resolved
    std::string configured;  // absolute, as the profile (or DATA_DIR) names it
  };
  // Where a checkpoint URI points: the root and the names below it.
  struct Place {
    std::string root;                     // canonical
    std::vector<std::string> components;  // at least one
    std::string path;                     // root + "/" + components
  };
  absl::StatusOr<Roots> RootsFor(const std::string& run);
  // The place `uri` names when it is lexically beneath the run's root;
  // INVALID_ARGUMENT naming the URI otherwise.
  absl::StatusOr<Place> Locate(const std::string& run, const std::string& uri);
  // Opens `place` beneath its root (OpenBeneath).
  static absl::StatusOr<ScopedFd> Open(const Place& place, int flags);

  struct Verified {
    std::string identity;  // FileIdentity
    std::string checksum;
    int64_t bytes = 0;
    absl::Status result;
  };
  absl::Status CheckFile(int fd, const std::string& path, const spikeguard::v1::Checkpoint& c);
  // For a file with the identity recorded at registration: the checksum it
  // carries (trailer, header) against the registered one, without reading
  // the rest.
  static absl::Status CheckRegisteredChecksum(int fd, int64_t size, const std::string& path,
                                              const spikeguard::v1::Checkpoint& c);
  // The whole file against its checksum (cached per file and stat).
  absl::Status CheckContents(int fd, const struct stat& st, const std::string& path,
                             const spikeguard::v1::Checkpoint& c);

  storage::Catalog* const catalog_;
  LaunchProfiles* const profiles_;
  const std::string data_dir_;
  absl::Mutex mu_;
  std::map<std::string, Verified> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spikeguard::daemon
