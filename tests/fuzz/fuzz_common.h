// Shared by the fuzz targets of tests/fuzz: an invariant check that says
// which one failed, and quiet protobuf logging (parse errors of hostile
// inputs are expected, thousands per second).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace spikeguard::fuzz {

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
