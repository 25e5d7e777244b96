// secret.h
// -----------------------------------------------------------------------------
// Bearer tokens: how they are made, stored and compared. A token is 32 random
// bytes from OpenSSL's CSPRNG, written as 64 hex digits. The daemon never
// keeps a token, only its hash ("sha256:" + 64 hex digits), and compares
// hashes in constant time (CRYPTO_memcmp), so neither the file nor the
// comparison's timing gives a token away.
//
//   std::string token = NewToken();            // hand to the client
//   std::string stored = HashToken(token);     // put in the tokens file
//   bool ok = TokenMatches(presented, stored); // constant time
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace spikeguard {

// 64 hex digits from RAND_bytes; aborts if the CSPRNG fails (never silently
// weak).
std::string NewToken();

// "sha256:<64 lowercase hex digits>".
std::string HashToken(absl::string_view token);

// Whether `stored` (a HashToken result) is the hash of `presented`. The
// time taken does not depend on where the two differ.
bool TokenMatches(absl::string_view presented, absl::string_view stored);

// HMAC-SHA256 of `data` under `key`, as 64 lowercase hex digits.
std::string HmacSha256Hex(absl::string_view key, absl::string_view data);

// Constant-time equality of two strings of the same length (false, in time
// independent of content, when the lengths differ).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace spikeguard
