#include "kernels/gemm.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace spikeguard::kernels {
namespace {

// 16 floats: one AVX-512 register with -march=native, split by the compiler
// into narrower registers on older targets.
using v16 = float __attribute__((vector_size(64)));

constexpr int kRowBlock = 6;    // rows of C per micro-kernel call
constexpr int kMaxVectors = 4;  // 64 columns of C per micro-kernel call
// K is processed in slices so a slice of the B panel stays in L1/L2.
constexpr int kDepthBlock = 256;

inline v16 Load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }

template <int MR, int NV, bool kTransA>
inline void MicroKernel(int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc, bool accumulate) {
  v16 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? Load(c + r * ldc + 16 * v) : v16{};
  }
  for (int p = 0; p < k; ++p) {
    const float* bp = b + static_cast<size_t>(p) * ldb;
    v16 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = Load(bp + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const float av = kTransA ? a[static_cast<size_t>(p) * lda + r] : a[static_cast<size_t>(r) * lda + p];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) Store(c + r * ldc + 16 * v, acc[r][v]);
  }
}

template <int NV, bool kTransA>
void RowSweep(const GemmArgs& g, int col, int p0, int kc, bool accumulate, int rb, int re) {
  const float* b = g.b + static_cast<size_t>(p0) * g.ldb + col;
  auto a_at = [&](int row) {
    return kTransA ? g.a + static_cast<size_t>(p0) * g.lda + row : g.a + static_cast<size_t>(row) * g.lda + p0;
  };
  auto c_at = [&](int row) { return g.c + static_cast<size_t>(row) * g.ldc + col; };
  int i = rb;
  for (; i + kRowBlock <= re; i += kRowBlock) {
    MicroKernel<kRowBlock, NV, kTransA>(kc, a_at(i), g.lda, b, g.ldb, c_at(i), g.ldc, accumulate);
  }
  switch (re - i) {
    case 5:
      MicroKernel<5, NV, kTransA>(kc, a_at(i), g.lda, b, g.ldb, c_at(i), g.ldc, accumulate);
      break;
    case 4:
      MicroKernel<4, NV, kTransA>(kc, a_at(i), g.lda, b, g.ldb, c_at(i), g.ldc, accumulate);
      break;
    case 3:
      MicroKernel<3, NV, kTransA>(kc, a_at(i), g.lda, b, g.ldb, c_at(i), g.ldc, accumulate);
      break;
    case 2:
      MicroKernel<2, NV, kTransA>(kc, a_at(i), g.lda, b, g.ldb, c_at(i), g.ldc, accumulate);
      break;
    case 1:
      MicroKernel<1, NV, kTransA>(kc, a_at(i), g.lda, b, g.ldb, c_at(i), g.ldc, accumulate);
      break;
    default:
      break;
  }
}

// Columns that do not fill a 16-wide vector: the same FMA chain, one lane.
template <bool kTransA>
void ScalarColumns(const GemmArgs& g, int col_begin, int p0, int kc, bool accumulate, int rb, int re) {
  for (int i = rb; i < re; ++i) {
    for (int j = col_begin; j < g.n; ++j) {
      float* cp = g.c + static_cast<size_t>(i) * g.ldc + j;
      float acc = accumulate ? *cp : 0.0f;
      for (int p = p0; p < p0 + kc; ++p) {
        const float av = kTransA ? g.a[static_cast<size_t>(p) * g.lda + i] : g.a[static_cast<size_t>(i) * g.lda + p];
        acc = __builtin_fmaf(av, g.b[static_cast<size_t>(p) * g.ldb + j], acc);
      }
      *cp = acc;
    }
  }
}

template <bool kTransA>
void GemmImpl(const GemmArgs& g, int rb, int re) {
  if (g.k == 0) {
    if (!g.accumulate) {
      for (int i = rb; i < re; ++i) std::fill_n(g.c + static_cast<size_t>(i) * g.ldc, g.n, 0.0f);
    }
    return;
  }
  for (int p0 = 0; p0 < g.k; p0 += kDepthBlock) {
    const int kc = std::min(kDepthBlock, g.k - p0);
    const bool accumulate = g.accumulate || p0 > 0;
    int col = 0;
    for (; col + 16 * kMaxVectors <= g.n; col += 16 * kMaxVectors) {
      RowSweep<kMaxVectors, kTransA>(g, col, p0, kc, accumulate, rb, re);
    }
    switch ((g.n - col) / 16) {
      case 3:
        RowSweep<3, kTransA>(g, col, p0, kc, accumulate, rb, re);
        col += 48;
        break;
      case 2:
        RowSweep<2, kTransA>(g, col, p0, kc, accumulate, rb, re);
        col += 32;
        break;
      case 1:
        RowSweep<1, kTransA>(g, col, p0, kc, accumulate, rb, re);
        col += 16;
        break;
      default:
        break;
    }
    if (col < g.n) ScalarColumns<kTransA>(g, col, p0, kc, accumulate, rb, re);
  }
}

}  // namespace

void Gemm(const GemmArgs& g) {
  const int rb = std::max(0, g.row_begin);
  const int re = g.row_end < 0 ? g.m : std::min(g.m, g.row_end);
  if (rb >= re || g.n <= 0) return;
  if (g.trans_a) {
    GemmImpl<true>(g, rb, re);
  } else {
    GemmImpl<false>(g, rb, re);
  }
}

}  // namespace spikeguard::kernels
