#include "kernels/gemm.h"

#include <cmath>
#include <cstring>
#include <ostream>
#include <vector>

#include "gtest/gtest.h"

namespace spikeguard::kernels {
namespace {

std::vector<float> Fill(size_t n, float phase) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + phase);
  return v;
}

struct Shape {
  int m, n, k;
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.m << "x" << s.n << "x" << s.k; }

class GemmTest : public ::testing::TestWithParam<Shape> {};

// Compared with a double-precision reference within tol + |ref|·eps (llm.c).
TEST_P(GemmTest, MatchesDoubleReference) {
  const auto [m, n, k] = GetParam();
  for (bool trans : {false, true}) {
    for (bool accumulate : {false, true}) {
      const std::vector<float> a = Fill(static_cast<size_t>(m) * k, 0.1f), b = Fill(static_cast<size_t>(k) * n, 0.7f);
      std::vector<float> c = Fill(static_cast<size_t>(m) * n, 1.3f);
      const std::vector<float> c0 = c;
      Gemm({.m = m,
            .n = n,
            .k = k,
            .a = a.data(),
            .lda = trans ? m : k,
            .trans_a = trans,
            .b = b.data(),
            .ldb = n,
            .c = c.data(),
            .ldc = n,
            .accumulate = accumulate});
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double ref = accumulate ? c0[static_cast<size_t>(i) * n + j] : 0.0;
          double mag = std::fabs(ref);
          for (int p = 0; p < k; ++p) {
            const double av = trans ? a[static_cast<size_t>(p) * m + i] : a[static_cast<size_t>(i) * k + p];
            ref += av * b[static_cast<size_t>(p) * n + j];
            mag += std::fabs(av * b[static_cast<size_t>(p) * n + j]);
          }
          ASSERT_NEAR(c[static_cast<size_t>(i) * n + j], ref, 1e-5 + 1e-6 * mag)
              << "i=" << i << " j=" << j << " trans=" << trans << " acc=" << accumulate;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTest,
                         ::testing::Values(Shape{1, 1, 1}, Shape{7, 5, 3}, Shape{13, 70, 33}, Shape{64, 64, 32},
                                           Shape{37, 131, 300}, Shape{6, 200, 513}));

// Splitting rows between calls (as threads do) must not change a single bit.
TEST(GemmSplitTest, RowRangesGiveIdenticalBits) {
  const int m = 50, n = 83, k = 270;
  const std::vector<float> a = Fill(m * k, 0.2f), b = Fill(k * n, 0.4f);
  std::vector<float> whole(m * n), split(m * n);
  Gemm({.m = m, .n = n, .k = k, .a = a.data(), .lda = k, .b = b.data(), .ldb = n, .c = whole.data(), .ldc = n});
  for (int rb : {0, 1, 8, 9, 31}) {
    std::fill(split.begin(), split.end(), -1.0f);
    Gemm({.m = m,
          .n = n,
          .k = k,
          .a = a.data(),
          .lda = k,
          .b = b.data(),
          .ldb = n,
          .c = split.data(),
          .ldc = n,
          .row_begin = 0,
          .row_end = rb});
    Gemm({.m = m,
          .n = n,
          .k = k,
          .a = a.data(),
          .lda = k,
          .b = b.data(),
          .ldb = n,
          .c = split.data(),
          .ldc = n,
          .row_begin = rb,
          .row_end = m});
    EXPECT_EQ(0, std::memcmp(whole.data(), split.data(), whole.size() * sizeof(float))) << "split at " << rb;
  }
}

}  // namespace
}  // namespace spikeguard::kernels
