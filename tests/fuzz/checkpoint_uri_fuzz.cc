// Fuzz target: the one reading of a checkpoint URI
// (storage/checkpoint/checkpoint_uri.h), which the daemon's confinement
// check and the reference worker share.
//
// The input is a URI. Invariants: every input is answered; an accepted one
// names an absolute path without NUL and without a "." or ".." segment (the
// segments readers disagree about), and writing that path back as a URI
// reads as the same path; a refused one is INVALID_ARGUMENT with a message.
// The input taken as a path: a path the parser would accept round-trips.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_split.h"
#include "storage/checkpoint/checkpoint_uri.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

bool PlainSegments(const std::string& path) {
  for (absl::string_view segment : absl::StrSplit(path, '/')) {
    if (segment == "." || segment == "..") return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using spikeguard::storage::CheckpointPathOfUri;
  using spikeguard::storage::CheckpointUriOfPath;
  const std::string input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::string> path = CheckpointPathOfUri(input);
  if (!path.ok()) {
    FUZZ_CHECK(path.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!path.status().message().empty());
  } else {
    FUZZ_CHECK(!path->empty() && (*path)[0] == '/');
    FUZZ_CHECK(path->find('\0') == std::string::npos);
    FUZZ_CHECK(PlainSegments(*path));
    const std::string again = CheckpointUriOfPath(*path);
    if (again.size() <= spikeguard::storage::kMaxCheckpointUri) {
      absl::StatusOr<std::string> back = CheckpointPathOfUri(again);
      FUZZ_CHECK(back.ok() && *back == *path);
    }
  }
  // The input as a path: what the parser accepts as a plain path is the same
  // path through its file:// form.
  if (!input.empty() && input[0] == '/' && input.find('\0') == std::string::npos &&
      input.find("://") == std::string::npos && PlainSegments(input)) {
    const std::string uri = CheckpointUriOfPath(input);
    if (uri.size() <= spikeguard::storage::kMaxCheckpointUri) {
      absl::StatusOr<std::string> back = CheckpointPathOfUri(uri);
      FUZZ_CHECK(back.ok() && *back == input);
    }
  }
  return 0;
}
