#include "daemon/launch/checkpoint_guard.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "storage/checkpoint/checkpoint.h"
#include "storage/checkpoint/checkpoint_uri.h"
#include "storage/checkpoint/checksum.h"
#include "storage/checkpoint/torch_checkpoint.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;
namespace fs = std::filesystem;

namespace {

// The names of an absolute path's components ("//" and a trailing '/' add
// none; CheckpointPathOfUri has refused "." and "..").
std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (!part.empty()) out.emplace_back(part);
  }
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string Hex(const unsigned char* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 15]);
  }
  return out;
}

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (HexValue(c) < 0) return false;
  }
  return !s.empty();
}

// Reads [from, to) of `fd` in pieces, passing each to `fn`.
template <typename Fn>
absl::Status ReadRange(int fd, int64_t from, int64_t to, const std::string& path, Fn fn) {
  std::string buf(1 << 20, '\0');
  int64_t at = from;
  while (at < to) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(to - at, buf.size()));
    const ssize_t got = pread(fd, buf.data(), want, at);
    if (got <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": read failed at byte ", at));
    }
    fn(buf.data(), static_cast<size_t>(got));
    at += got;
  }
  return absl::OkStatus();
}

struct Sha256 {
  Sha256() : ctx(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(ctx); }
  void Update(const char* data, size_t n) { EVP_DigestUpdate(ctx, data, n); }
  std::string Hex() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, out, &len);
    return ::spikeguard::daemon::Hex(out, len);
  }
  EVP_MD_CTX* ctx;
};

// The checksum a reference-worker checkpoint's trailer carries
// (storage::ParseCheckpointTrailer), read from the file's last bytes.
absl::StatusOr<uint64_t> RefTrailerChecksum(int fd, int64_t size, const std::string& path) {
  char trailer[storage::kCheckpointTrailerSize];
  if (size < static_cast<int64_t>(storage::kCheckpointMinSize) ||
      pread(fd, trailer, sizeof(trailer), size - static_cast<int64_t>(sizeof(trailer))) !=
          static_cast<ssize_t>(sizeof(trailer))) {
    return absl::FailedPreconditionError(absl::StrCat(path, " has no end marker (truncated)"));
  }
  absl::StatusOr<uint64_t> stored =
      storage::ParseCheckpointTrailer(absl::string_view(trailer, sizeof(trailer)), path);
  if (!stored.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(path, " has no end marker (truncated)"));
  }
  return *stored;
}

// The header of a spikeguard PyTorch checkpoint (storage/checkpoint/
// torch_checkpoint.h), given its first bytes, checked against the file's
// size: the payload it describes must end where the file does.
absl::StatusOr<storage::TorchCheckpointHeader> TorchHeader(int fd, int64_t size,
                                                           absl::string_view prefix,
                                                           const std::string& path) {
  absl::StatusOr<uint32_t> header_len = storage::TorchCheckpointHeaderLength(prefix, path);
  if (!header_len.ok() ||
      static_cast<int64_t>(storage::kTorchCheckpointPrefixSize + *header_len) > size) {
    return absl::FailedPreconditionError(absl::StrCat(path, " has a bad header"));
  }
  std::string json(*header_len, '\0');
  if (pread(fd, json.data(), json.size(), storage::kTorchCheckpointPrefixSize) !=
      static_cast<ssize_t>(json.size())) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot read its header"));
  }
  absl::StatusOr<storage::TorchCheckpointHeader> header =
      storage::ParseTorchCheckpointHeader(json, path);
  if (!header.ok()) return absl::FailedPreconditionError(header.status().message());
  if (header->payload_offset + header->payload_bytes != size) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " has ", size, " bytes; its header says ", header->payload_offset, " + a ",
        header->payload_bytes, "-byte payload (truncated or extended)"));
  }
  return header;
}

}  // namespace

std::string CheckpointGuard::FileIdentity(const struct stat& st) {
  return absl::StrFormat("dev=%d ino=%d size=%d mtime=%d.%09d ctime=%d.%09d",
                         static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                         static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                         static_cast<int64_t>(st.st_mtim.tv_nsec),
                         static_cast<int64_t>(st.st_ctim.tv_sec),
                         static_cast<int64_t>(st.st_ctim.tv_nsec));
}

absl::StatusOr<std::string> CheckpointGuard::PathOfUri(const std::string& uri) {
  return storage::CheckpointPathOfUri(uri);
}

absl::StatusOr<std::string> CheckpointGuard::RootFor(const std::string& run) {
  SG_ASSIGN_OR_RETURN(Roots roots, RootsFor(run));
  return roots.canonical;
}

absl::StatusOr<CheckpointGuard::Roots> CheckpointGuard::RootsFor(const std::string& run) {
  SG_ASSIGN_OR_RETURN(v1::Run row, catalog_->GetRun(run));
  std::optional<std::string> root;
  if (profiles_ != nullptr) {
    SG_ASSIGN_OR_RETURN(root, profiles_->CheckpointRoot(run, row.spec()));
  } else if (!row.spec().profile().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "' names launch profile ", Quoted(row.spec().profile()),
        " but the daemon has no --launch-profiles"));
  }
  if (!root) root = (fs::path(data_dir_) / "runs" / run).string();
  std::error_code ec;
  const fs::path absolute = fs::absolute(*root, ec).lexically_normal();
  // A root that is itself a symbolic link confines to wherever it points,
  // and whoever can write its parent (a run's workers, often) can point it
  // at "/": such a root confines nothing and is refused.
  const fs::path own = absolute.has_filename() ? absolute : absolute.parent_path();
  struct stat st {};
  if (lstat(own.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint root ", Quoted(own.string()), " of run '", run,
        "' is a symbolic link: checkpoints are confined to a real directory (name the link's "
        "target in the launch profile, or replace the link)"));
  }
  fs::path canonical = fs::weakly_canonical(absolute, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("checkpoint root ", *root, ": ", ec.message()));
  if (canonical == canonical.root_path()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint root ", Quoted(*root), " of run '", run, "' resolves to the file system's root"));
  }
  Roots roots;
  roots.canonical = canonical.string();
  while (roots.canonical.size() > 1 && roots.canonical.back() == '/') roots.canonical.pop_back();
  roots.configured = own.string();
  return roots;
}

absl::StatusOr<CheckpointGuard::Place> CheckpointGuard::Locate(const std::string& run,
                                                              const std::string& uri) {
  SG_ASSIGN_OR_RETURN(std::string path, PathOfUri(uri));
  SG_ASSIGN_OR_RETURN(Roots roots, RootsFor(run));
  // Lexically beneath the root, as configured or canonical (the path a
  // worker reports may go through the symbolic links above the root); the
  // rest is opened from the root's descriptor (OpenBeneath), not resolved
  // here.
  const std::vector<std::string> parts = Components(path);
  for (const std::string* root : {&roots.canonical, &roots.configured}) {
    const std::vector<std::string> base = Components(*root);
    if (parts.size() > base.size() && std::equal(base.begin(), base.end(), parts.begin())) {
      Place place;
      place.root = roots.canonical;
      place.components.assign(parts.begin() + static_cast<ptrdiff_t>(base.size()), parts.end());
      place.path = roots.canonical;
      for (const std::string& c : place.components) place.path += "/" + c;
      return place;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "uri ", Quoted(uri), " names ", Quoted(path), ", outside the checkpoint root ",
      Quoted(roots.canonical), " of run '", run, "'"));
}

absl::StatusOr<ScopedFd> CheckpointGuard::Open(const Place& place, int flags) {
  SG_ASSIGN_OR_RETURN(ScopedFd root, OpenDirectory(place.root));
  return OpenBeneath(root.get(), place.root, place.components, flags);
}

absl::StatusOr<std::string> CheckpointGuard::Confine(const std::string& run, const std::string& uri) {
  SG_ASSIGN_OR_RETURN(Admitted admitted, Admit(run, uri));
  return admitted.path;
}

absl::StatusOr<CheckpointGuard::Admitted> CheckpointGuard::Admit(const std::string& run,
                                                               const std::string& uri) {
  SG_ASSIGN_OR_RETURN(Place place, Locate(run, uri));
  // What is already there must be reachable from the root without a
  // symbolic link; a path not there yet (a file announced before it is
  // written, a directory still to be made) is checked again at every use.
  absl::StatusOr<ScopedFd> fd = Open(place, O_PATH);
  if (!fd.ok() && !absl::IsNotFound(fd.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("uri ", Quoted(uri), " is refused: ", fd.status().message()));
  }
  Admitted admitted;
  admitted.path = place.path;
  struct stat st {};
  if (fd.ok() && fstat(fd->get(), &st) == 0 && S_ISREG(st.st_mode)) {
    admitted.file_identity = FileIdentity(st);
  }
  return admitted;
}

absl::StatusOr<std::string> CheckpointGuard::Verify(const v1::Checkpoint& c) {
  const std::string what = absl::StrCat("checkpoint at step ", c.step(), " (", Quoted(c.uri()), ")");
  auto place = Locate(c.run(), c.uri());
  if (!place.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is not usable: ", place.status().message()));
  }
  absl::StatusOr<ScopedFd> fd = Open(*place, O_RDONLY);
  if (!fd.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is not usable: ", fd.status().message()));
  }
  if (auto s = CheckFile(fd->get(), place->path, c); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is not usable: ", s.message()));
  }
  return place->path;
}

absl::Status CheckpointGuard::CheckFile(int fd, const std::string& path,
                                       const v1::Checkpoint& c) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  if (c.bytes() > 0 && st.st_size != c.bytes()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has ", st.st_size, " bytes; it was registered with ", c.bytes()));
  }
  // The file the registration saw, unchanged (same inode, size, times; the
  // change time cannot be set back): its checksum is the one registered,
  // and the worker checks it as it loads the file, which it reads anyway.
  // Only the head or trailer is read here, whatever the file's size.
  const std::string identity = FileIdentity(st);
  absl::StatusOr<std::string> recorded =
      catalog_->CheckpointFileIdentity(c.run(), c.step(), c.uri());
  if (recorded.ok() && *recorded == identity) return CheckRegisteredChecksum(fd, st.st_size, path, c);
  const absl::Status full = CheckContents(fd, st, path, c);
  if (full.ok() && recorded.ok()) {
    // Verified whole: no full read the next time, unless it changes.
    if (absl::Status s = catalog_->SetCheckpointFileIdentity(c.run(), c.step(), c.uri(), identity);
        !s.ok()) {
      SG_LOG(WARNING) << "run " << c.run() << ": file identity of " << path << " not recorded: " << s;
    }
  }
  return full;
}

absl::Status CheckpointGuard::CheckRegisteredChecksum(int fd, int64_t size, const std::string& path,
                                                      const v1::Checkpoint& c) {
  const std::string registered = absl::AsciiStrToLower(c.checksum());
  char head[storage::kTorchCheckpointPrefixSize] = {};
  const bool has_head = size >= static_cast<int64_t>(sizeof(head)) &&
                        pread(fd, head, sizeof(head), 0) == sizeof(head);
  const absl::string_view prefix(head, has_head ? sizeof(head) : 0);
  if (storage::HasCheckpointMagic(prefix)) {
    // The XXH64 in its trailer is what the reference worker checks on load.
    SG_ASSIGN_OR_RETURN(const uint64_t stored, RefTrailerChecksum(fd, size, path));
    if (!registered.empty() && registered != storage::ChecksumHex(stored)) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": its trailer says XXH64 ", storage::ChecksumHex(stored),
          "; it was registered with ", Quoted(c.checksum())));
    }
    return absl::OkStatus();
  }
  if (storage::HasTorchCheckpointMagic(prefix)) {
    SG_ASSIGN_OR_RETURN(const storage::TorchCheckpointHeader header,
                        TorchHeader(fd, size, prefix, path));
    if (!registered.empty() && registered != header.sha256) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": its header says sha256 ", header.sha256, "; it was registered with ",
          Quoted(c.checksum())));
    }
    return absl::OkStatus();
  }
  if (registered.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was registered without a checksum and is not a format the daemon can check"));
  }
  if ((registered.size() == 16 || registered.size() == 64) && IsHex(registered)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      path, ": registered checksum ", Quoted(c.checksum()),
      " is neither XXH64 (16 hex digits) nor sha256 (64), and the file's format is unknown"));
}

absl::Status CheckpointGuard::CheckContents(int fd, const struct stat& st, const std::string& path,
                                           const v1::Checkpoint& c) {
  // Keyed by the whole identity: the modification time alone can be set
  // back after a write, the change time cannot.
  const std::string identity = FileIdentity(st);
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(path);
    if (it != cache_.end() && it->second.identity == identity &&
        it->second.checksum == c.checksum() && it->second.bytes == c.bytes()) {
      return it->second.result;
    }
  }
  auto check = [&]() -> absl::Status {
    const int64_t size = st.st_size;
    const std::string registered = absl::AsciiStrToLower(c.checksum());
    char head[storage::kTorchCheckpointPrefixSize] = {};
    const bool has_head = size >= static_cast<int64_t>(sizeof(head)) &&
                          pread(fd, head, sizeof(head), 0) == sizeof(head);
    const absl::string_view prefix(head, has_head ? sizeof(head) : 0);
    if (storage::HasCheckpointMagic(prefix)) {
      if (size < static_cast<int64_t>(storage::kCheckpointMinSize)) {
        return absl::FailedPreconditionError(absl::StrCat(path, " is truncated"));
      }
      SG_ASSIGN_OR_RETURN(const uint64_t stored, RefTrailerChecksum(fd, size, path));
      storage::Xxh64 h;
      SG_RETURN_IF_ERROR(ReadRange(fd, 0, size - static_cast<int64_t>(storage::kCheckpointTrailerSize),
                                   path, [&](const char* d, size_t n) { h.Update(d, n); }));
      const std::string actual = storage::ChecksumHex(h.Digest());
      if (storage::ChecksumHex(stored) != actual) {
        return absl::FailedPreconditionError(absl::StrCat(path, " is corrupt: its contents hash to ",
                                                          actual, ", its trailer says ",
                                                          storage::ChecksumHex(stored)));
      }
      if (!registered.empty() && registered != actual) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, " has checksum ", actual, "; it was registered with ", Quoted(c.checksum())));
      }
      return absl::OkStatus();
    }
    if (storage::HasTorchCheckpointMagic(prefix)) {
      SG_ASSIGN_OR_RETURN(const storage::TorchCheckpointHeader header,
                          TorchHeader(fd, size, prefix, path));
      const std::string want = registered.empty() ? header.sha256 : registered;
      if (want.size() != 64 || !IsHex(want)) {
        return absl::FailedPreconditionError(absl::StrCat(path, ": no sha256 checksum to check"));
      }
      Sha256 sha;
      SG_RETURN_IF_ERROR(ReadRange(fd, header.payload_offset, size, path,
                                   [&](const char* d, size_t n) { sha.Update(d, n); }));
      const std::string actual = sha.Hex();
      if (actual != want) {
        return absl::FailedPreconditionError(absl::StrCat(path, ": its payload has sha256 ", actual,
                                                          ", expected ", want));
      }
      return absl::OkStatus();
    }
    if (registered.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " was registered without a checksum and is not a format the daemon can check"));
    }
    if (registered.size() == 16 && IsHex(registered)) {
      storage::Xxh64 h;
      SG_RETURN_IF_ERROR(ReadRange(fd, 0, size, path, [&](const char* d, size_t n) { h.Update(d, n); }));
      const std::string actual = storage::ChecksumHex(h.Digest());
      if (actual != registered) {
        return absl::FailedPreconditionError(absl::StrCat(path, " has XXH64 ", actual,
                                                          "; it was registered with ", registered));
      }
      return absl::OkStatus();
    }
    if (registered.size() == 64 && IsHex(registered)) {
      Sha256 sha;
      SG_RETURN_IF_ERROR(ReadRange(fd, 0, size, path, [&](const char* d, size_t n) { sha.Update(d, n); }));
      const std::string actual = sha.Hex();
      if (actual != registered) {
        return absl::FailedPreconditionError(absl::StrCat(path, " has sha256 ", actual,
                                                          "; it was registered with ", registered));
      }
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": registered checksum ", Quoted(c.checksum()),
        " is neither XXH64 (16 hex digits) nor sha256 (64), and the file's format is unknown"));
  };
  absl::Status result = check();
  absl::MutexLock lock(&mu_);
  if (cache_.size() > 4096) cache_.clear();
  cache_[path] = Verified{identity, c.checksum(), c.bytes(), result};
  return result;
}

}  // namespace spikeguard::daemon
