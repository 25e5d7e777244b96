// Shared by the fuzz targets of tests/fuzz: an invariant check that says
// which one failed, and quiet protobuf logging (parse errors of hostile
// inputs are expected, thousands per second).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace spikeguard::fuzz {

// Writes `bytes` to `path` (created or truncated, 0600); false on any error.
inline bool WriteFile(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  return ok;
}

[[noreturn]] inline void Fail(const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", file, line, what);
  std::abort();
}

}  // namespace spikeguard::fuzz

#define FUZZ_CHECK(cond) ((cond) ? (void)0 : ::spikeguard::fuzz::Fail(#cond, __FILE__, __LINE__))

#ifdef SPIKEGUARD_FUZZ_PROTOBUF
#include "google/protobuf/stubs/logging.h"
namespace spikeguard::fuzz {
inline const bool kProtobufLogsOff = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();
}  // namespace spikeguard::fuzz
#endif
