#include "base/secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>

namespace spikeguard {
namespace {

std::string Hex(const unsigned char* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

}  // namespace

std::string NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::fprintf(stderr, "spikeguard: the system's random generator failed; no token made\n");
    std::abort();
  }
  return Hex(bytes, sizeof(bytes));
}

std::string HashToken(absl::string_view token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(token.data(), token.size(), digest, &n, EVP_sha256(), nullptr) != 1) {
    std::fprintf(stderr, "spikeguard: SHA-256 failed\n");
    std::abort();
  }
  return "sha256:" + Hex(digest, n);
}

std::string HmacSha256Hex(absl::string_view key, absl::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &n) == nullptr) {
    std::fprintf(stderr, "spikeguard: HMAC-SHA256 failed\n");
    std::abort();
  }
  return Hex(mac, n);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool TokenMatches(absl::string_view presented, absl::string_view stored) {
  // Hashing first makes both sides the same length whatever was presented.
  return ConstantTimeEquals(HashToken(presented), stored);
}

}  // namespace spikeguard
