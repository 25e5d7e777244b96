#include "storage/checkpoint/checksum.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace spikeguard::storage {
namespace {

constexpr uint64_t kP1 = 11400714785074694791ULL;
constexpr uint64_t kP2 = 14029467366897019727ULL;
constexpr uint64_t kP3 = 1609587929392839161ULL;
constexpr uint64_t kP4 = 9650029242287828579ULL;
constexpr uint64_t kP5 = 2870177450012600261ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads regardless of host order, so the digest is portable.
inline uint64_t Load64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint32_t Load32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

inline uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = Rotl(acc, 31);
  return acc * kP1;
}

inline uint64_t MergeRound(uint64_t acc, uint64_t val) {
  acc ^= Round(0, val);
  return acc * kP1 + kP4;
}

}  // namespace

Xxh64::Xxh64(uint64_t seed) : seed_(seed) {
  v_[0] = seed + kP1 + kP2;
  v_[1] = seed + kP2;
  v_[2] = seed;
  v_[3] = seed - kP1;
}

void Xxh64::Update(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_len_ += size;
  if (buf_len_ + size < 32) {
    if (size > 0) std::memcpy(buf_ + buf_len_, p, size);
    buf_len_ += size;
    return;
  }
  if (buf_len_ > 0) {
    size_t fill = 32 - buf_len_;
    std::memcpy(buf_ + buf_len_, p, fill);
    for (int i = 0; i < 4; ++i) v_[i] = Round(v_[i], Load64(buf_ + 8 * i));
    p += fill;
    size -= fill;
    buf_len_ = 0;
  }
  while (size >= 32) {
    for (int i = 0; i < 4; ++i) v_[i] = Round(v_[i], Load64(p + 8 * i));
    p += 32;
    size -= 32;
  }
  if (size > 0) std::memcpy(buf_, p, size);
  buf_len_ = size;
}

uint64_t Xxh64::Digest() const {
  uint64_t h;
  if (total_len_ >= 32) {
    h = Rotl(v_[0], 1) + Rotl(v_[1], 7) + Rotl(v_[2], 12) + Rotl(v_[3], 18);
    for (int i = 0; i < 4; ++i) h = MergeRound(h, v_[i]);
  } else {
    h = seed_ + kP5;
  }
  h += total_len_;
  const unsigned char* p = buf_;
  size_t n = buf_len_;
  while (n >= 8) {
    h ^= Round(0, Load64(p));
    h = Rotl(h, 27) * kP1 + kP4;
    p += 8;
    n -= 8;
  }
  if (n >= 4) {
    h ^= uint64_t{Load32(p)} * kP1;
    h = Rotl(h, 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  while (n > 0) {
    h ^= (*p) * kP5;
    h = Rotl(h, 11) * kP1;
    ++p;
    --n;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t Xxh64Of(const void* data, size_t size, uint64_t seed) {
  Xxh64 h(seed);
  h.Update(data, size);
  return h.Digest();
}

std::string ChecksumHex(uint64_t value) { return absl::StrFormat("%016x", value); }

}  // namespace spikeguard::storage
