// checkpoint.h
// -----------------------------------------------------------------------------
// The checkpoint file of spikeguard's reference worker, and the directory that
// holds a run's checkpoints.
//
// A checkpoint carries everything a resumed run needs to continue bit for bit
// (docs/ARCHITECTURE.md, "Determinism and checkpoints"): the generation and
// step it was taken at, the data position the next step will consume after, the
// config fingerprint it belongs to, the RNG state, the hyperparameter overrides
// in force, and any number of named binary sections (parameters, optimizer
// moments, ...) whose bytes are the caller's business. This library never
// interprets them.
//
//   Checkpoint ckpt;
//   ckpt.generation = 3;
//   ckpt.step = 1200;
//   ckpt.data_position = 1210;            // the plan has a 10-batch hole
//   ckpt.config_fingerprint = "gpt-4L-128d:9c1e...";
//   ckpt.rng_state = rng.Serialize();
//   ckpt.hparams["lr_scale"] = "0.7";
//   ckpt.AddSection("params", weights.data(), weights.size() * sizeof(float));
//   ckpt.AddSection("adam_m", m.data(), m.size() * sizeof(float));
//
//   CheckpointDir dir("/runs/r1/ckpt");
//   SG_ASSIGN_OR_RETURN(CheckpointFileInfo saved, dir.Write(ckpt));
//   SG_RETURN_IF_ERROR(dir.Retain(/*keep_last=*/5));
//   ...
//   SG_ASSIGN_OR_RETURN(Checkpoint back, ReadCheckpoint(saved.path, "gpt-4L-128d:9c1e..."));
//
// File layout (all integers little-endian; version 1):
//
//   "SGCKPT\0\0"                  8-byte magic
//   u32 format version (1)        u32 reserved flags (0)
//   i64 generation  i64 step  i64 data_position
//   str config_fingerprint        str rng_state     (str = u32 length + bytes)
//   u32 hparam count, then (str key, str value) sorted by key
//   u32 section count, then (str name, u64 size, size bytes) in caller order
//   trailer: u64 XXH64 of every byte above, "SGCKEND\0"
//
// Writes are atomic: the bytes go to a hidden temp file in the same directory,
// which is fsynced, renamed to its final name, and the directory fsynced. A
// crash leaves either the old state or the complete new file, plus at most a
// temp file that CheckpointDir ignores and cleans.
//
// Errors follow the Abseil rule: a bad or foreign file is DATA_LOSS (corrupt)
// or FAILED_PRECONDITION (valid but for another config); I/O failures are
// UNAVAILABLE or INTERNAL as the OS reports; a missing file is NOT_FOUND.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace spikeguard::storage {

inline constexpr uint32_t kCheckpointFormatVersion = 1;

// One named opaque blob.
struct CheckpointSection {
  std::string name;
  std::string data;
};

struct Checkpoint {
  int64_t generation = 0;
  // Training steps completed; a resumed run's first step is `step`.
  int64_t step = 0;
  // The global batch index (data position) that step `step` consumes under the
  // run's data plan; stored so a resume can check it against the plan.
  int64_t data_position = 0;
  std::string config_fingerprint;
  std::string rng_state;
  std::map<std::string, std::string> hparams;
  std::vector<CheckpointSection> sections;

  void AddSection(std::string name, const void* data, size_t size);
  // The section called `name`, or nullptr.
  const CheckpointSection* FindSection(absl::string_view name) const;
};

// What a written or listed checkpoint file is, without its contents.
struct CheckpointFileInfo {
  std::string path;
  int64_t generation = 0;
  int64_t step = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;  // XXH64 from the trailer; 0 when only listed
};

// The file's head and trailer by the layout above, for readers that check a
// file without parsing it whole (the daemon's CheckpointGuard reads only
// these, or hashes the body itself).
inline constexpr size_t kCheckpointMagicSize = 8;
inline constexpr size_t kCheckpointTrailerSize = 16;
// The smallest well-formed file: magic, version and flags, trailer.
inline constexpr size_t kCheckpointMinSize = kCheckpointMagicSize + 8 + kCheckpointTrailerSize;

// Whether `head` (at least the file's first 8 bytes) starts with the magic.
bool HasCheckpointMagic(absl::string_view head);

// The XXH64 the trailer carries, given the file's last kCheckpointTrailerSize
// bytes: the u64 before "SGCKEND\0". DATA_LOSS naming `source` when the
// bytes are not a trailer (short, or no end marker: truncated or damaged).
absl::StatusOr<uint64_t> ParseCheckpointTrailer(absl::string_view trailer,
                                                absl::string_view source);

// Serializes `ckpt` (format above). Fails only on names/blobs over 4 GiB.
absl::StatusOr<std::string> SerializeCheckpoint(const Checkpoint& ckpt);

// Parses and verifies bytes produced by SerializeCheckpoint: magic, version,
// structure, checksum. `source` names the bytes in error messages.
absl::StatusOr<Checkpoint> ParseCheckpoint(absl::string_view bytes, absl::string_view source);

// Writes `ckpt` to `path` atomically (temp file, fsync, rename, fsync dir).
absl::StatusOr<CheckpointFileInfo> WriteCheckpoint(const std::string& path,
                                                   const Checkpoint& ckpt);

// Reads `path` and verifies magic, version, checksum and that its config
// fingerprint equals `expected_fingerprint` (FAILED_PRECONDITION naming both
// otherwise). Pass std::nullopt to skip only the fingerprint check. When
// `info` is set it receives the file's path, size and checksum.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path,
                                          std::optional<absl::string_view> expected_fingerprint,
                                          CheckpointFileInfo* info = nullptr);

// A directory of one run's checkpoints, named
// "ckpt-g<generation>-s<step>.sgck" (zero-padded so names sort).
//
// Order: a checkpoint is newer than another when its generation is higher, or
// the generation is equal and its step is higher. A rewind starts a new
// generation from an older step; the abandoned generation's later checkpoints
// are not where the run continues from.
//
// Not thread-safe for concurrent writers to the same directory; the worker is
// its only writer.
class CheckpointDir {
 public:
  explicit CheckpointDir(std::string dir);

  const std::string& dir() const { return dir_; }
  std::string PathFor(int64_t generation, int64_t step) const;

  // Creates the directory (and parents) if needed, then writes atomically.
  absl::StatusOr<CheckpointFileInfo> Write(const Checkpoint& ckpt);

  // Complete checkpoints (final names only; temp files are never listed),
  // oldest first. Does not open the files; `checksum` is 0.
  absl::StatusOr<std::vector<CheckpointFileInfo>> List() const;

  // The newest checkpoint that reads and verifies (checksum, fingerprint),
  // skipping newer ones that do not. NOT_FOUND when none does.
  absl::StatusOr<Checkpoint> LoadNewestValid(absl::string_view expected_fingerprint,
                                             CheckpointFileInfo* info = nullptr) const;

  // Deletes all but the newest `keep_last` complete checkpoints (and any crash
  // leftovers). keep_last must be >= 1.
  absl::Status Retain(int keep_last);
  // The same, except that a checkpoint whose path is in `pinned` is never
  // deleted and does not count towards `keep_last`: what stays is every
  // pinned checkpoint plus the newest `keep_last` unpinned ones. Paths are
  // compared after making them absolute and lexically normal, so
  // "dir/./x.sgck" pins "dir/x.sgck". Returns the checkpoints it deleted,
  // oldest first.
  absl::StatusOr<std::vector<CheckpointFileInfo>> Retain(int keep_last,
                                                         const std::set<std::string>& pinned);

  // Deletes temp files left by an interrupted write; returns how many.
  absl::StatusOr<int> CleanTemporaries();

 private:
  std::string dir_;
};

}  // namespace spikeguard::storage
