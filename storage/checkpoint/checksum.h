// checksum.h
// -----------------------------------------------------------------------------
// XXH64, the 64-bit xxHash (seed 0 by default): the one content checksum of
// spikeguard's files. Checkpoints carry it in their trailer and corpora use it
// for their fingerprint. It is fast (several GB/s), stable across machines and
// releases, and has published test vectors, so a checksum written by one build
// is checked by any other.
//
//   Xxh64 h;
//   h.Update(header);
//   h.Update(payload);
//   uint64_t sum = h.Digest();          // same as Xxh64Of(header + payload)
//
// Not a cryptographic hash: it detects corruption, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

namespace spikeguard::storage {

// Streaming XXH64. Update() may be called with pieces of any size; the digest
// equals the one-shot hash of their concatenation.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);

  void Update(const void* data, size_t size);
  void Update(absl::string_view data) { Update(data.data(), data.size()); }

  // The hash of everything passed to Update() so far; does not reset.
  uint64_t Digest() const;

 private:
  uint64_t seed_;
  uint64_t v_[4];
  unsigned char buf_[32];
  size_t buf_len_ = 0;
  uint64_t total_len_ = 0;
};

// One-shot XXH64.
uint64_t Xxh64Of(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t Xxh64Of(absl::string_view data, uint64_t seed = 0) {
  return Xxh64Of(data.data(), data.size(), seed);
}

// 16 lowercase hex digits, the form checksums and fingerprints are printed in.
std::string ChecksumHex(uint64_t value);

}  // namespace spikeguard::storage
