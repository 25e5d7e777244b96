#include "storage/checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "storage/checkpoint/checksum.h"

namespace spikeguard::storage {
namespace {

constexpr char kMagic[kCheckpointMagicSize] = {'S', 'G', 'C', 'K', 'P', 'T', '\0', '\0'};
constexpr char kEndMagic[8] = {'S', 'G', 'C', 'K', 'E', 'N', 'D', '\0'};
constexpr size_t kTrailerSize = kCheckpointTrailerSize;
static_assert(kTrailerSize == 8 + sizeof(kEndMagic));
constexpr char kPrefix[] = "ckpt-g";
constexpr char kSuffix[] = ".sgck";
constexpr char kTempMarker[] = ".tmp";

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  int err = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  // Transient resource shortage may succeed on retry; everything else will not.
  if (err == EINTR || err == EAGAIN || err == ENOSPC || err == EIO || err == EDQUOT) {
    return absl::UnavailableError(msg);
  }
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

absl::Status PutStr(std::string* out, absl::string_view s, absl::string_view field) {
  if (s.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", field, " is over 4 GiB"));
  }
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
  return absl::OkStatus();
}

// Bounds-checked little-endian reader; every failure names the file and field.
class Reader {
 public:
  Reader(absl::string_view bytes, absl::string_view source) : b_(bytes), source_(source) {}

  absl::Status U32(uint32_t* v, absl::string_view field) {
    SG_RETURN_IF_ERROR(Need(4, field));
    *v = 0;
    for (int i = 3; i >= 0; --i) *v = (*v << 8) | static_cast<unsigned char>(b_[pos_ + i]);
    pos_ += 4;
    return absl::OkStatus();
  }
  absl::Status U64(uint64_t* v, absl::string_view field) {
    SG_RETURN_IF_ERROR(Need(8, field));
    *v = 0;
    for (int i = 7; i >= 0; --i) *v = (*v << 8) | static_cast<unsigned char>(b_[pos_ + i]);
    pos_ += 8;
    return absl::OkStatus();
  }
  absl::Status I64(int64_t* v, absl::string_view field) {
    uint64_t u;
    SG_RETURN_IF_ERROR(U64(&u, field));
    *v = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  absl::Status Bytes(uint64_t n, std::string* out, absl::string_view field) {
    SG_RETURN_IF_ERROR(Need(n, field));
    out->assign(b_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status Str(std::string* out, absl::string_view field) {
    uint32_t n;
    SG_RETURN_IF_ERROR(U32(&n, field));
    return Bytes(n, out, field);
  }
  size_t pos() const { return pos_; }

 private:
  absl::Status Need(uint64_t n, absl::string_view field) {
    if (n > b_.size() - pos_) {
      return absl::DataLossError(absl::StrCat("checkpoint ", source_, " is corrupt: ", field,
                                              " at byte ", pos_, " needs ", n,
                                              " bytes but the body ends at byte ", b_.size()));
    }
    return absl::OkStatus();
  }

  absl::string_view b_;
  absl::string_view source_;
  size_t pos_ = 0;
};

// Parses "ckpt-g<gen>-s<step>.sgck"; false for anything else (temp files too).
bool ParseName(absl::string_view name, int64_t* gen, int64_t* step) {
  if (!absl::StartsWith(name, kPrefix) || !absl::EndsWith(name, kSuffix)) return false;
  name.remove_prefix(sizeof(kPrefix) - 1);
  name.remove_suffix(sizeof(kSuffix) - 1);
  size_t dash = name.find("-s");
  if (dash == absl::string_view::npos) return false;
  return absl::SimpleAtoi(name.substr(0, dash), gen) &&
         absl::SimpleAtoi(name.substr(dash + 2), step) && *gen >= 0 && *step >= 0;
}

bool IsTempName(absl::string_view name) {
  return absl::StartsWith(name, ".") && absl::StrContains(name, kTempMarker);
}

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open directory", dir);
  int rc = ::fsync(fd);
  absl::Status st = rc == 0 ? absl::OkStatus() : ErrnoStatus("cannot fsync directory", dir);
  ::close(fd);
  return st;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open checkpoint", path);
  std::string out;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoStatus("cannot read checkpoint", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

void Checkpoint::AddSection(std::string name, const void* data, size_t size) {
  sections.push_back(
      CheckpointSection{std::move(name), std::string(static_cast<const char*>(data), size)});
}

const CheckpointSection* Checkpoint::FindSection(absl::string_view name) const {
  for (const auto& s : sections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

bool HasCheckpointMagic(absl::string_view head) {
  return head.size() >= sizeof(kMagic) && std::memcmp(head.data(), kMagic, sizeof(kMagic)) == 0;
}

absl::StatusOr<uint64_t> ParseCheckpointTrailer(absl::string_view trailer,
                                                absl::string_view source) {
  if (trailer.size() != kTrailerSize ||
      std::memcmp(trailer.data() + 8, kEndMagic, sizeof(kEndMagic)) != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", source,
                                            " is corrupt: truncated or damaged: no end marker"));
  }
  uint64_t stored = 0;
  Reader r(trailer.substr(0, 8), source);
  SG_RETURN_IF_ERROR(r.U64(&stored, "checksum"));
  return stored;
}

absl::StatusOr<std::string> SerializeCheckpoint(const Checkpoint& ckpt) {
  std::string out;
  size_t total = 128 + ckpt.config_fingerprint.size() + ckpt.rng_state.size();
  for (const auto& [k, v] : ckpt.hparams) total += 8 + k.size() + v.size();
  for (const auto& s : ckpt.sections) total += 12 + s.name.size() + s.data.size();
  out.reserve(total);
  out.append(kMagic, sizeof(kMagic));
  PutU32(&out, kCheckpointFormatVersion);
  PutU32(&out, 0);
  PutU64(&out, static_cast<uint64_t>(ckpt.generation));
  PutU64(&out, static_cast<uint64_t>(ckpt.step));
  PutU64(&out, static_cast<uint64_t>(ckpt.data_position));
  SG_RETURN_IF_ERROR(PutStr(&out, ckpt.config_fingerprint, "config fingerprint"));
  SG_RETURN_IF_ERROR(PutStr(&out, ckpt.rng_state, "RNG state"));
  PutU32(&out, static_cast<uint32_t>(ckpt.hparams.size()));
  for (const auto& [k, v] : ckpt.hparams) {
    SG_RETURN_IF_ERROR(PutStr(&out, k, "hparam key"));
    SG_RETURN_IF_ERROR(PutStr(&out, v, "hparam value"));
  }
  PutU32(&out, static_cast<uint32_t>(ckpt.sections.size()));
  for (const auto& s : ckpt.sections) {
    SG_RETURN_IF_ERROR(PutStr(&out, s.name, "section name"));
    PutU64(&out, s.data.size());
    out.append(s.data);
  }
  PutU64(&out, Xxh64Of(out));
  out.append(kEndMagic, sizeof(kEndMagic));
  return out;
}

absl::StatusOr<Checkpoint> ParseCheckpoint(absl::string_view bytes, absl::string_view source) {
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", source, " is corrupt: ", what));
  };
  if (!HasCheckpointMagic(bytes)) {
    return corrupt("bad magic (not a spikeguard checkpoint)");
  }
  if (bytes.size() < kCheckpointMinSize) {
    return corrupt(absl::StrCat("truncated: only ", bytes.size(), " bytes"));
  }
  {
    uint32_t version = 0;
    Reader r(bytes.substr(sizeof(kMagic)), source);
    SG_RETURN_IF_ERROR(r.U32(&version, "format version"));
    if (version != kCheckpointFormatVersion) {
      // A newer writer's file: this binary must not guess at it.
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", source, " has format version ", version,
                       "; this build reads version ", kCheckpointFormatVersion));
    }
  }
  absl::string_view body = bytes.substr(0, bytes.size() - kTrailerSize);
  SG_ASSIGN_OR_RETURN(uint64_t stored, ParseCheckpointTrailer(bytes.substr(body.size()), source));
  uint64_t actual = Xxh64Of(body);
  if (stored != actual) {
    return corrupt(absl::StrCat("checksum mismatch: trailer says ", ChecksumHex(stored),
                                ", contents hash to ", ChecksumHex(actual)));
  }

  Checkpoint ckpt;
  Reader r(body, source);
  std::string magic;
  uint32_t version = 0, flags = 0, count = 0;
  SG_RETURN_IF_ERROR(r.Bytes(sizeof(kMagic), &magic, "magic"));
  SG_RETURN_IF_ERROR(r.U32(&version, "format version"));
  SG_RETURN_IF_ERROR(r.U32(&flags, "flags"));
  SG_RETURN_IF_ERROR(r.I64(&ckpt.generation, "generation"));
  SG_RETURN_IF_ERROR(r.I64(&ckpt.step, "step"));
  SG_RETURN_IF_ERROR(r.I64(&ckpt.data_position, "data position"));
  SG_RETURN_IF_ERROR(r.Str(&ckpt.config_fingerprint, "config fingerprint"));
  SG_RETURN_IF_ERROR(r.Str(&ckpt.rng_state, "RNG state"));
  SG_RETURN_IF_ERROR(r.U32(&count, "hparam count"));
  for (uint32_t i = 0; i < count; ++i) {
    std::string k, v;
    SG_RETURN_IF_ERROR(r.Str(&k, "hparam key"));
    SG_RETURN_IF_ERROR(r.Str(&v, "hparam value"));
    ckpt.hparams[std::move(k)] = std::move(v);
  }
  SG_RETURN_IF_ERROR(r.U32(&count, "section count"));
  for (uint32_t i = 0; i < count; ++i) {
    CheckpointSection s;
    uint64_t size = 0;
    SG_RETURN_IF_ERROR(r.Str(&s.name, "section name"));
    SG_RETURN_IF_ERROR(r.U64(&size, "section size"));
    SG_RETURN_IF_ERROR(r.Bytes(size, &s.data, absl::StrCat("section '", s.name, "'")));
    ckpt.sections.push_back(std::move(s));
  }
  if (r.pos() != body.size()) {
    return corrupt(absl::StrCat(body.size() - r.pos(), " unexpected bytes after the last section"));
  }
  return ckpt;
}

absl::StatusOr<CheckpointFileInfo> WriteCheckpoint(const std::string& path,
                                                   const Checkpoint& ckpt) {
  SG_ASSIGN_OR_RETURN(std::string bytes, SerializeCheckpoint(ckpt));
  std::filesystem::path final_path(path);
  std::string dir = final_path.parent_path().empty() ? "." : final_path.parent_path().string();
  // Hidden, pid-qualified temp name in the same directory: rename is atomic
  // only within one filesystem, and listing never mistakes it for a checkpoint.
  std::string tmp = (std::filesystem::path(dir) /
                     absl::StrCat(".", final_path.filename().string(), kTempMarker, ".",
                                  ::getpid()))
                        .string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp);
  absl::Status st = WriteAll(fd, bytes, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoStatus("cannot fsync", tmp);
  if (::close(fd) != 0 && st.ok()) st = ErrnoStatus("cannot close", tmp);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoStatus(absl::StrCat("cannot rename ", tmp, " to"), path);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  SG_RETURN_IF_ERROR(FsyncDir(dir));
  CheckpointFileInfo info;
  info.path = path;
  info.generation = ckpt.generation;
  info.step = ckpt.step;
  info.bytes = bytes.size();
  info.checksum = Xxh64Of(absl::string_view(bytes).substr(0, bytes.size() - kTrailerSize));
  return info;
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path,
                                          std::optional<absl::string_view> expected_fingerprint,
                                          CheckpointFileInfo* info) {
  SG_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  SG_ASSIGN_OR_RETURN(Checkpoint ckpt, ParseCheckpoint(bytes, path));
  if (info != nullptr) {
    info->path = path;
    info->generation = ckpt.generation;
    info->step = ckpt.step;
    info->bytes = bytes.size();
    // ParseCheckpoint verified the trailer, so it is the checksum of the body.
    SG_ASSIGN_OR_RETURN(info->checksum, ParseCheckpointTrailer(
                                            absl::string_view(bytes).substr(bytes.size() - kTrailerSize), path));
  }
  if (expected_fingerprint.has_value() && ckpt.config_fingerprint != *expected_fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", path, " belongs to config fingerprint '",
                     ckpt.config_fingerprint, "', not the expected '", *expected_fingerprint,
                     "'"));
  }
  return ckpt;
}

CheckpointDir::CheckpointDir(std::string dir) : dir_(std::move(dir)) {}

std::string CheckpointDir::PathFor(int64_t generation, int64_t step) const {
  return (std::filesystem::path(dir_) /
          absl::StrFormat("%s%06d-s%012d%s", kPrefix, generation, step, kSuffix))
      .string();
}

absl::StatusOr<CheckpointFileInfo> CheckpointDir::Write(const Checkpoint& ckpt) {
  if (ckpt.generation < 0 || ckpt.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint generation ", ckpt.generation,
                                                   " and step ", ckpt.step,
                                                   " must not be negative"));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create checkpoint directory ", dir_, ": ", ec.message()));
  }
  return WriteCheckpoint(PathFor(ckpt.generation, ckpt.step), ckpt);
}

absl::StatusOr<std::vector<CheckpointFileInfo>> CheckpointDir::List() const {
  std::vector<CheckpointFileInfo> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir_, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list checkpoint directory ", dir_, ": ", ec.message()));
  }
  for (const auto& entry : it) {
    std::string name = entry.path().filename().string();
    CheckpointFileInfo info;
    if (!ParseName(name, &info.generation, &info.step)) continue;
    if (!entry.is_regular_file(ec)) continue;
    info.path = entry.path().string();
    info.bytes = entry.file_size(ec);
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.generation, a.step) < std::tie(b.generation, b.step);
  });
  return out;
}

absl::StatusOr<Checkpoint> CheckpointDir::LoadNewestValid(absl::string_view expected_fingerprint,
                                                          CheckpointFileInfo* info) const {
  SG_ASSIGN_OR_RETURN(std::vector<CheckpointFileInfo> all, List());
  std::string skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    absl::StatusOr<Checkpoint> ckpt = ReadCheckpoint(it->path, expected_fingerprint, info);
    if (ckpt.ok()) return ckpt;
    absl::StrAppend(&skipped, "; skipped ", ckpt.status().message());
  }
  return absl::NotFoundError(
      absl::StrCat("no valid checkpoint in ", dir_, " (", all.size(), " listed)", skipped));
}

absl::Status CheckpointDir::Retain(int keep_last) { return Retain(keep_last, {}).status(); }

absl::StatusOr<std::vector<CheckpointFileInfo>> CheckpointDir::Retain(
    int keep_last, const std::set<std::string>& pinned) {
  if (keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_last must be at least 1, got ", keep_last));
  }
  auto normal = [](const std::string& path) {
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(path, ec);
    if (ec) p = path;
    return p.lexically_normal().string();
  };
  std::set<std::string> pinned_paths;
  for (const std::string& p : pinned) pinned_paths.insert(normal(p));
  SG_RETURN_IF_ERROR(CleanTemporaries().status());
  SG_ASSIGN_OR_RETURN(std::vector<CheckpointFileInfo> all, List());
  std::vector<CheckpointFileInfo> deleted;
  int kept_unpinned = 0;
  // Newest first: the first `keep_last` unpinned ones stay.
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (pinned_paths.count(normal(it->path)) > 0) continue;
    if (kept_unpinned < keep_last) {
      ++kept_unpinned;
      continue;
    }
    if (::unlink(it->path.c_str()) != 0) {
      if (errno == ENOENT) continue;
      return ErrnoStatus("cannot delete old checkpoint", it->path);
    }
    deleted.push_back(*it);
  }
  std::reverse(deleted.begin(), deleted.end());
  if (!deleted.empty()) SG_RETURN_IF_ERROR(FsyncDir(dir_));
  return deleted;
}

absl::StatusOr<int> CheckpointDir::CleanTemporaries() {
  int removed = 0;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir_, ec);
  if (ec == std::errc::no_such_file_or_directory) return 0;
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list checkpoint directory ", dir_, ": ", ec.message()));
  }
  for (const auto& entry : it) {
    std::string name = entry.path().filename().string();
    if (!IsTempName(name)) continue;
    std::string path = entry.path().string();
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus("cannot delete temp file", path);
    }
    ++removed;
  }
  return removed;
}

}  // namespace spikeguard::storage
