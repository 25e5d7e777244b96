// The one SplitMix64 (base/splitmix64.h) against the published sequence and
// against the copies it replaced, so every deterministic stream built on it
// (data order, synthetic corpora, trainer init, loss hashes, traces) keeps
// its exact outputs.
#include "base/splitmix64.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace spikeguard {
namespace {

// The stateless copies that lived in kernels/trainer.cc, kernels/cuda,
// daemon/detect/eval/trace_gen.cc and the kernels tests, verbatim.
uint64_t OldStateless(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// storage/catalog/merge.cc's LossHashContribution, verbatim.
uint64_t OldContribution(uint32_t rank, uint64_t loss_hash) {
  uint64_t z = (loss_hash ^ rank) + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// storage/corpus/rng.h's generator, verbatim.
class OldGenerator {
 public:
  explicit OldGenerator(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

TEST(SplitMix64, MatchesThePublishedSequenceFromSeedZero) {
  // Also what worker/python's spikeguard.torch.splitmix64(0) is pinned to.
  static_assert(SplitMix64Hash(0) == 0xE220A8397B1DCDAFULL);
  SplitMix64 rng(0);
  EXPECT_EQ(rng.Next(), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(rng.Next(), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(rng.Next(), 0x06C45D188009454FULL);
  EXPECT_EQ(rng.Next(), 0xF88BB8A8724C81ECULL);
}

TEST(SplitMix64, IsBitExactWithTheCopiesItReplaced) {
  uint64_t x = 1;
  for (int i = 0; i < 10000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;  // spread the inputs
    ASSERT_EQ(SplitMix64Hash(x), OldStateless(x)) << x;
    ASSERT_EQ(SplitMix64Hash(x ^ static_cast<uint32_t>(i)), OldContribution(i, x)) << x;
  }
  for (uint64_t seed : {0ULL, 1ULL, 99ULL, 2024ULL, 0xFFFFFFFFFFFFFFFFULL, 0x123456789ABCDEFULL}) {
    SplitMix64 now(seed);
    OldGenerator before(seed);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(now.Next(), before.Next()) << seed << " #" << i;
  }
}

TEST(SplitMix64, UniformAndRangeStayInBounds) {
  SplitMix64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    EXPECT_LT(rng.Uniform(10), 10u);
    const int64_t r = rng.Range(-3, 3);
    EXPECT_GE(r, -3);
    EXPECT_LE(r, 3);
  }
}

}  // namespace
}  // namespace spikeguard
