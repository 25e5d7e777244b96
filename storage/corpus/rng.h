// rng.h
// -----------------------------------------------------------------------------
// SplitMix64, the generator behind every shuffle and synthetic byte of the
// corpus library. The data order must be identical on every machine and
// standard library, so nothing here uses <random>'s distributions, whose
// algorithms are implementation-defined.
//
//   SplitMix64 rng(seed);
//   uint64_t r = rng.Next();
//   int64_t i = rng.Uniform(10);     // 0..9, unbiased
#pragma once

#include <cstdint>

namespace spikeguard::storage {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  // Uniform in [0, n), n > 0, by rejection so every value is equally likely.
  uint64_t Uniform(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do {
      r = Next();
    } while (r >= limit);
    return r % n;
  }

  // Uniform in [lo, hi], lo <= hi.
  int64_t Range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Uniform(static_cast<uint64_t>(hi - lo) + 1));
  }

 private:
  uint64_t state_;
};

}  // namespace spikeguard::storage
