// Fuzz target: an HTTP request's Authorization header, as the web view reads
// it (auth::BearerFromHttpAuthorization) before it becomes the metadata of a
// gRPC call on the daemon's in-process channel.
//
// The input is the header's value. Invariants: the parser answers every
// input; what it accepts is "" or "Bearer TOKEN" with a token of 1-4096
// visible ASCII bytes, a value gRPC's own check accepts as metadata (a value
// it refuses aborts the process inside gRPC's client); what it refuses is
// UNAUTHENTICATED and its message never repeats the token.
#include <cstddef>
#include <cstdint>
#include <string>

#include "daemon/auth/authorizer.h"
#include "grpc/grpc.h"
#include "grpc/slice.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string header(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::string> bearer = spikeguard::auth::BearerFromHttpAuthorization(header);
  if (!bearer.ok()) {
    FUZZ_CHECK(bearer.status().code() == absl::StatusCode::kUnauthenticated);
    FUZZ_CHECK(!bearer.status().message().empty());
    return 0;
  }
  if (bearer->empty()) return 0;
  FUZZ_CHECK(bearer->rfind("Bearer ", 0) == 0);
  const std::string token = bearer->substr(7);
  FUZZ_CHECK(!token.empty() && token.size() <= 4096);
  for (unsigned char c : token) FUZZ_CHECK(c >= 0x21 && c <= 0x7e);
  grpc_slice slice = grpc_slice_from_copied_buffer(bearer->data(), bearer->size());
  FUZZ_CHECK(grpc_header_nonbin_value_is_legal(slice));
  grpc_slice_unref(slice);
  // The metadata value is what the gRPC side authenticates: the same rule.
  FUZZ_CHECK(spikeguard::auth::CheckTokenText(token).ok());
  return 0;
}
