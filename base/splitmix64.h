// splitmix64.h
// -----------------------------------------------------------------------------
// SplitMix64 (Steele, Lea and Flood, 2014): the one copy of the generator and
// mixing function behind every deterministic stream in spikeguard — the data
// order's shuffles and the synthetic corpora (storage/corpus), the reference
// trainer's initialisation and loss hash (kernels), the synthetic traces
// (daemon/detect/eval), the order-free combination of per-rank loss hashes
// (storage/catalog/merge.cc) and the CPU-vs-CUDA comparison. Their outputs
// are part of what must repeat bit for bit (data order, loss hashes, traces),
// so the constants live here once. Nothing here uses <random>, whose
// distributions are implementation-defined.
//
// Header-only and dependency-free: kernels/ builds alone (`cmake -S kernels`)
// and includes it too. The Python package's `spikeguard.torch.splitmix64` is
// the same function as SplitMix64Hash (the loss hash must agree across
// languages); tests pin both to SplitMix64Hash(0) = 0xE220A8397B1DCDAF.
//
//   uint64_t h = SplitMix64Hash(x);  // stateless: one mix of x
//   SplitMix64 rng(seed);            // the sequential generator
//   uint64_t r = rng.Next();         // = SplitMix64Hash(seed), then onwards
//   uint64_t i = rng.Uniform(10);    // 0..9, unbiased
#pragma once

#include <cstdint>

namespace spikeguard {

inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ULL;

// SplitMix64's output for state x: x advanced by the golden gamma, then
// mixed. A bijection of 64-bit values; SplitMix64Hash(0) = 0xE220A8397B1DCDAF.
constexpr uint64_t SplitMix64Hash(uint64_t x) {
  uint64_t z = x + kSplitMix64Gamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The sequential generator: Next() returns SplitMix64Hash(state) and advances
// the state by the gamma.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    const uint64_t out = SplitMix64Hash(state_);
    state_ += kSplitMix64Gamma;
    return out;
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

}  // namespace spikeguard
