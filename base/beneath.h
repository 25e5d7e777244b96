// beneath.h
// -----------------------------------------------------------------------------
// Opening a file beneath a directory, relative to a descriptor of that
// directory, following no symbolic link on the way: the confinement the
// daemon applies to checkpoint files (docs/ARCHITECTURE.md, checkpoint
// files). A check on path strings (canonicalize, compare prefixes, then open
// the string) can be raced: a directory swapped for a symbolic link between
// the check and the open sends the open elsewhere. Resolving every component
// from the directory's descriptor, refusing symbolic links, leaves nothing to
// race: what is opened is what was checked.
//
//   SG_ASSIGN_OR_RETURN(ScopedFd root, OpenDirectory("/ckpt/run-1"));
//   SG_ASSIGN_OR_RETURN(ScopedFd fd,
//                       OpenBeneath(root.get(), "/ckpt/run-1", {"g1", "step-10"}, O_RDONLY));
//
// openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
// where the kernel has it (Linux 5.6); elsewhere (or where a seccomp filter
// refuses it) a walk down from the descriptor, one openat(O_NOFOLLOW) per
// component, directories with O_DIRECTORY. Both refuse the same paths.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace spikeguard {

// An owned file descriptor, closed on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// How OpenBeneath resolves: kAuto uses openat2 when the kernel allows it;
// kWalk always walks component by component (tests prove both agree).
enum class BeneathResolver { kAuto, kWalk };

// Opens the directory `path` itself (its last component must not be a
// symbolic link; the ones above it are the caller's configuration and are
// followed). NOT_FOUND when it is missing; FAILED_PRECONDITION naming it
// otherwise.
absl::StatusOr<ScopedFd> OpenDirectory(const std::string& path);

// Opens `components` (names, none empty, "." or "..", nor holding '/')
// beneath the directory `root_fd`, whose path `root_path` names it in
// errors. `flags` is O_RDONLY (O_NONBLOCK is added, so a FIFO does not
// block) or O_PATH; O_CLOEXEC is added. What the last component is (a
// regular file, a directory, a FIFO) is the caller's to check (fstat).
//
// Errors name the path and the component:
//   NOT_FOUND            a component does not exist;
//   FAILED_PRECONDITION  a component is a symbolic link (whatever it points
//                        at, inside or outside), or one above the last is not
//                        a directory;
//   PERMISSION_DENIED    the OS refused (EACCES, EPERM);
//   INVALID_ARGUMENT     no components, or one that is not a plain name.
absl::StatusOr<ScopedFd> OpenBeneath(int root_fd, absl::string_view root_path,
                                     const std::vector<std::string>& components, int flags,
                                     BeneathResolver resolver = BeneathResolver::kAuto);

// Whether openat2(2) served the last OpenBeneath of this process (for tests
// and the log); false before any call.
bool OpenBeneathUsedOpenat2();

}  // namespace spikeguard
