#include "base/beneath.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#endif

namespace spikeguard {
namespace {

#if defined(SYS_openat2) && defined(RESOLVE_BENEATH)
constexpr bool kHaveOpenat2 = true;
#else
constexpr bool kHaveOpenat2 = false;
#endif

// Set once the kernel said it has no openat2 (ENOSYS), or a filter refused it.
std::atomic<bool> openat2_unavailable{false};
std::atomic<bool> last_used_openat2{false};

std::string PathUpTo(absl::string_view root_path, const std::vector<std::string>& components,
                     size_t last) {
  std::string path(root_path);
  for (size_t i = 0; i <= last && i < components.size(); ++i) {
    if (path.empty() || path.back() != '/') path.push_back('/');
    path += components[i];
  }
  return path;
}

int OpenFlags(int flags) {
  int out = flags | O_CLOEXEC;
  if ((flags & O_PATH) == 0) out |= O_NONBLOCK;
  return out;
}

// Why component `i` could not be opened, given the
// errno of the attempt.
absl::Status SymbolicLink(const std::string& path, absl::string_view root_path) {
  return absl::FailedPreconditionError(absl::StrCat(
      "'", path, "' is a symbolic link; nothing beneath '", root_path,
      "' is opened through one (it could lead outside)"));
}

absl::Status Missing(const std::string& path) {
  return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(ENOENT)));
}

// Why component `i` could not be opened, from the
// errno of the attempt: with O_NOFOLLOW, ELOOP means a symbolic link.
absl::Status Refused(absl::string_view root_path, const std::vector<std::string>& components,
                     size_t i, int err) {
  const std::string path = PathUpTo(root_path, components, i);
  switch (err) {
    case ELOOP:
      return SymbolicLink(path, root_path);
    case ENOENT:
      return Missing(path);
    case ENOTDIR:
      return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a directory"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          absl::StrCat("cannot open '", path, "': ", std::strerror(err)));
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open '", path, "': ", std::strerror(err)));
  }
}

// Each component is opened from the one above it with O_NOFOLLOW, and what
// was opened is looked at through its descriptor (fstat), so the verdict is
// about the object opened, not about whatever the name holds a moment later.
absl::StatusOr<ScopedFd> Walk(int root_fd, absl::string_view root_path,
                              const std::vector<std::string>& components, int flags) {
  ScopedFd held;
  int dir = root_fd;
  for (size_t i = 0; i < components.size(); ++i) {
    const bool last = i + 1 == components.size();
    // O_PATH | O_NOFOLLOW opens a symbolic link itself rather than failing;
    // fstat then says what it is.
    const int fd = openat(dir, components[i].c_str(),
                          (last ? OpenFlags(flags) : O_PATH | O_CLOEXEC) | O_NOFOLLOW);
    if (fd < 0) return Refused(root_path, components, i, errno);
    ScopedFd opened(fd);
    struct stat st {};
    if (fstat(opened.get(), &st) != 0) return Refused(root_path, components, i, errno);
    if (S_ISLNK(st.st_mode)) return Refused(root_path, components, i, ELOOP);
    if (last) return opened;
    if (!S_ISDIR(st.st_mode)) return Refused(root_path, components, i, ENOTDIR);
    held = std::move(opened);
    dir = held.get();
  }
  return absl::InvalidArgumentError("no path to open");
}

}  // namespace

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<ScopedFd> OpenDirectory(const std::string& path) {
  const int fd = open(path.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) return ScopedFd(fd);
  const int err = errno;
  if (err == ENOENT) return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(err)));
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is a symbolic link"));
  }
  if (err == ENOTDIR) return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a directory"));
  return absl::FailedPreconditionError(absl::StrCat("cannot open '", path, "': ", std::strerror(err)));
}

absl::StatusOr<ScopedFd> OpenBeneath(int root_fd, absl::string_view root_path,
                                     const std::vector<std::string>& components, int flags,
                                     BeneathResolver resolver) {
  if (components.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("nothing to open beneath '", root_path, "'"));
  }
  for (const std::string& c : components) {
    if (c.empty() || c == "." || c == ".." || c.find('/') != std::string::npos ||
        c.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", c, "' is not a plain file name (beneath '", root_path, "')"));
    }
  }
  if (kHaveOpenat2 && resolver == BeneathResolver::kAuto && !openat2_unavailable.load()) {
#if defined(SYS_openat2) && defined(RESOLVE_BENEATH)
    std::string relative;
    for (const std::string& c : components) {
      if (!relative.empty()) relative.push_back('/');
      relative += c;
    }
    struct open_how how {};
    how.flags = static_cast<uint64_t>(OpenFlags(flags));
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    for (int attempt = 0; attempt < 16; ++attempt) {
      const long fd = syscall(SYS_openat2, root_fd, relative.c_str(), &how, sizeof(how));
      if (fd >= 0) {
        ScopedFd opened(static_cast<int>(fd));
        if ((flags & O_PATH) != 0) {
          // As the walk: a trailing symbolic link opened by O_PATH is refused.
          struct stat st {};
          if (fstat(opened.get(), &st) == 0 && S_ISLNK(st.st_mode)) break;
        }
        last_used_openat2 = true;
        return opened;
      }
      // EAGAIN: a rename raced the lookup; the kernel asks to try again.
      if (errno == EAGAIN) continue;
      // No openat2 in this kernel (or not this struct): the walk from now on.
      // EPERM (a seccomp filter, or the file's own permissions) falls back
      // this once.
      if (errno == ENOSYS || errno == E2BIG || errno == EINVAL) openat2_unavailable = true;
      break;
    }
#endif
  }
  // The walk opens, or names the component that is refused and why (also
  // after openat2 refused: it says only ELOOP, ENOENT or EXDEV).
  last_used_openat2 = false;
  return Walk(root_fd, root_path, components, flags);
}

bool OpenBeneathUsedOpenat2() { return last_used_openat2.load(); }

}  // namespace spikeguard
