// gemm.h
// -----------------------------------------------------------------------------
// The single-precision matrix multiply every CPU kernel is built on.
//
//   // C[m×n] = A[m×k] · B[k×n], row-major, all rows.
//   Gemm({.m = m, .n = n, .k = k, .a = a, .lda = k, .b = b, .ldb = n, .c = c, .ldc = n});
//
// Determinism: every element of C is computed as one chain of fused
// multiply-adds over k in ascending order, starting from 0 (or from C's old
// value when `accumulate`). How rows are blocked or split between threads
// therefore never changes a result, which is what makes threads=1 and
// threads=2 bit-identical.
#pragma once

#include <cstdint>

namespace spikeguard::kernels {

struct GemmArgs {
  int m = 0, n = 0, k = 0;
  // A is m×k (lda ≥ k), or when trans_a, A is stored k×m (lda ≥ m) and used
  // transposed, which computes Aᵀ·B without materializing Aᵀ.
  const float* a = nullptr;
  int lda = 0;
  bool trans_a = false;
  const float* b = nullptr;  // k×n, ldb ≥ n
  int ldb = 0;
  float* c = nullptr;  // m×n, ldc ≥ n
  int ldc = 0;
  bool accumulate = false;  // C += A·B instead of C = A·B
  // Only rows [row_begin, row_end) of C are computed; row_end < 0 means m.
  int row_begin = 0, row_end = -1;
};

void Gemm(const GemmArgs& args);

}  // namespace spikeguard::kernels
