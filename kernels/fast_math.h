// fast_math.h
// -----------------------------------------------------------------------------
// Internal to the CPU backend. exp and tanh written so the compiler can
// vectorize loops that call them (glibc's expf/tanhf are scalar calls unless
// -ffast-math, which this project does not use). Same bits for the same input
// on every call, in vector and scalar code alike.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace spikeguard::kernels::internal {

// The float-to-int conversion of fn below sees a NaN when x is NaN (p is NaN
// then and so is the result, whatever n is; x86's conversion gives INT_MIN).
// UBSan's float-cast-overflow check is switched off for this function in the
// clang sanitizer build only: guarding the conversion with a select changed
// how g++ vectorizes and contracts the polynomial, hence the training
// trajectories (the fragility scenario's first spike moved from step 1156 to
// 911), which determinism forbids.
#if defined(__clang__)
#define SPIKEGUARD_NO_FLOAT_CAST_CHECK __attribute__((no_sanitize("float-cast-overflow")))
#else
#define SPIKEGUARD_NO_FLOAT_CAST_CHECK
#endif

// e^x with a relative error of a few ulp; NaN stays NaN, results saturate at
// ~e^88.3 and ~e^-87.3 instead of overflowing or going denormal.
SPIKEGUARD_NO_FLOAT_CAST_CHECK inline float FastExp(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  const float fn = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x/ln2)
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t n = static_cast<int32_t>(fn);
  return p * std::bit_cast<float>(static_cast<int32_t>((n + 127) << 23));
}

// tanh(x) = 1 - 2/(e^{2x} + 1); absolute error ~1e-7.
inline float FastTanh(float x) {
  const float xc = std::min(std::max(x, -9.0f), 9.0f);
  return 1.0f - 2.0f / (FastExp(2.0f * xc) + 1.0f);
}

}  // namespace spikeguard::kernels::internal
