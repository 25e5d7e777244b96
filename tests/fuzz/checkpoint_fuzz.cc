// Fuzz target: the checkpoint file loader (storage/checkpoint/checkpoint.h).
//
// The first input byte picks the mode:
//   even: the rest is a checkpoint body; the harness appends the XXH64 trailer
//         and end marker a writer would, so the structure parser is reached
//         past the checksum;
//   odd:  the rest is the whole file as it is (magic, version, checksum and
//         trailer checks).
// The bytes are parsed in memory and read back from a file (ReadCheckpoint),
// and a checkpoint that parses must serialize and parse back to the same.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_common.h"
#include "storage/checkpoint/checkpoint.h"
#include "storage/checkpoint/checksum.h"

namespace {

namespace storage = spikeguard::storage;

// Never destroyed: the atexit handler below uses it.
const std::string& TempPath() {
  static const std::string* const path = [] {
    const char* dir = std::getenv("TMPDIR");
    auto* p = new std::string(std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                              "/sg-checkpoint-fuzz-" + std::to_string(::getpid()) + ".sgck");
    std::atexit([] { ::unlink(TempPath().c_str()); });
    return p;
  }();
  return *path;
}

bool Same(const storage::Checkpoint& a, const storage::Checkpoint& b) {
  if (a.generation != b.generation || a.step != b.step || a.data_position != b.data_position ||
      a.config_fingerprint != b.config_fingerprint || a.rng_state != b.rng_state ||
      a.hparams != b.hparams || a.sections.size() != b.sections.size()) {
    return false;
  }
  for (size_t i = 0; i < a.sections.size(); ++i) {
    if (a.sections[i].name != b.sections[i].name || a.sections[i].data != b.sections[i].data) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    const uint64_t sum = storage::Xxh64Of(bytes);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((sum >> (8 * i)) & 0xff));
    bytes.append("SGCKEND\0", 8);
  }
  auto parsed = storage::ParseCheckpoint(bytes, "fuzz");
  if (!parsed.ok()) {
    const absl::StatusCode code = parsed.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kFailedPrecondition);
  } else {
    auto again = storage::SerializeCheckpoint(*parsed);
    FUZZ_CHECK(again.ok());
    auto back = storage::ParseCheckpoint(*again, "fuzz-roundtrip");
    FUZZ_CHECK(back.ok());
    FUZZ_CHECK(Same(*parsed, *back));
  }
  // The same bytes through the file reader, with and without a fingerprint.
  if (spikeguard::fuzz::WriteFile(TempPath(), bytes)) {
    storage::CheckpointFileInfo info;
    auto read = storage::ReadCheckpoint(TempPath(), std::nullopt, &info);
    FUZZ_CHECK(read.ok() == parsed.ok());
    if (read.ok()) {
      FUZZ_CHECK(info.bytes == bytes.size());
      auto fp = storage::ReadCheckpoint(TempPath(), absl::string_view("fuzz-fingerprint"));
      FUZZ_CHECK(fp.ok() == (read->config_fingerprint == "fuzz-fingerprint"));
    }
  }
  return 0;
}
