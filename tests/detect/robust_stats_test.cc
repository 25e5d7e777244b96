#include "daemon/detect/robust_stats.h"

#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

uint64_t Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}

// The sorted window gives bit for bit what a copy and two selections give,
// for odd and even sizes, growing and sliding windows, and repeated values.
TEST(SortedWindowTest, MatchesComputeRobustStatsBitForBit) {
  std::mt19937_64 rng(17);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::vector<double> scratch;
  for (size_t window : {1u, 2u, 5u, 8u, 64u, 256u}) {
    std::deque<double> values;
    SortedWindow sorted;
    for (int i = 0; i < 3000; ++i) {
      // Every fourth value repeats a coarse grid, so ties are common.
      double x = noise(rng) * (i % 7 == 0 ? 50.0 : 1.0);
      if (i % 4 == 0) x = static_cast<double>(static_cast<int>(x * 4)) / 4;
      values.push_back(x);
      sorted.Insert(x);
      while (values.size() > window) {
        sorted.Erase(values.front());
        values.pop_front();
      }
      ASSERT_EQ(sorted.size(), values.size());
      const RobustStats want = ComputeRobustStats(values.begin(), values.end(), &scratch);
      const RobustStats got = sorted.Stats();
      ASSERT_EQ(Bits(got.median), Bits(want.median)) << "window " << window << " step " << i;
      ASSERT_EQ(Bits(got.sigma), Bits(want.sigma)) << "window " << window << " step " << i;
      scratch.assign(values.begin(), values.end());
      ASSERT_EQ(Bits(sorted.Median()), Bits(MedianInPlace(scratch)));
    }
  }
}

TEST(SortedWindowTest, EmptyIsZero) {
  SortedWindow w;
  EXPECT_EQ(w.Median(), 0);
  EXPECT_EQ(w.Stats().median, 0);
  EXPECT_EQ(w.Stats().sigma, 0);
  w.Insert(3);
  w.Erase(3);
  EXPECT_TRUE(w.empty());
}

}  // namespace
}  // namespace spikeguard::detect
