// The CUDA backend. Each kernel gives every output element to exactly one
// thread, which computes it in a fixed order; sums across threads go through
// fixed trees (warp butterflies, shared-memory halving) or two passes over
// fixed chunks. Nothing uses atomics, so results depend only on the inputs.
// The arithmetic mirrors cpu_backend.cc (same exp/tanh polynomials, same
// formulas); only the order of summation differs.
#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

namespace spikeguard::kernels {
namespace {

[[noreturn]] void Fail(const char* expr, const char* error, const char* file, int line) {
  std::fprintf(stderr, "CUDA backend: %s failed: %s (%s:%d)\n", expr, error, file, line);
  std::abort();
}

#define SG_CUDA(expr)                                                                         \
  do {                                                                                        \
    const cudaError_t sg_err_ = (expr);                                                       \
    if (sg_err_ != cudaSuccess) Fail(#expr, cudaGetErrorString(sg_err_), __FILE__, __LINE__); \
  } while (0)

#define SG_CUBLAS(expr)                                                                                  \
  do {                                                                                                   \
    const cublasStatus_t sg_st_ = (expr);                                                                \
    if (sg_st_ != CUBLAS_STATUS_SUCCESS) Fail(#expr, cublasGetStatusString(sg_st_), __FILE__, __LINE__); \
  } while (0)

#define SG_LAUNCHED() SG_CUDA(cudaGetLastError())

constexpr int kThreads = 256;          // threads per block
constexpr int kWarps = kThreads / 32;  // warps per block (row kernels: one row per warp)
constexpr int64_t kChunk = 4096;       // elements per partial sum of a reduction
constexpr int kColumnChunk = 64;       // rows per partial sum of a column reduction
constexpr float kFp16Max = 65504.0f;
constexpr unsigned kFull = 0xffffffffu;

unsigned Grid(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

// ---- device math, the same polynomials as fast_math.h ---------------------

__device__ __forceinline__ float FastExp(float x) {
  x = x < -87.3f ? -87.3f : x;  // std::max/min order: a NaN stays NaN
  x = 88.3f < x ? 88.3f : x;
  const float fn = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int n = static_cast<int>(fn);
  return p * __int_as_float((n + 127) << 23);
}

__device__ __forceinline__ float FastTanh(float x) {
  float xc = x < -9.0f ? -9.0f : x;
  xc = 9.0f < xc ? 9.0f : xc;
  return 1.0f - 2.0f / (FastExp(2.0f * xc) + 1.0f);
}

__device__ __forceinline__ float Overflow16(float x) { return fabsf(x) > kFp16Max ? copysignf(INFINITY, x) : x; }

__device__ __forceinline__ float Gelu(float x) {
  constexpr float kS = 0.7978845608028654f;
  const float u = kS * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + FastTanh(u));
}

__device__ __forceinline__ float GeluGrad(float x) {
  constexpr float kS = 0.7978845608028654f;
  const float u = kS * (x + 0.044715f * x * x * x);
  const float t = FastTanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kS * (1.0f + 3.0f * 0.044715f * x * x);
}

// Butterfly sums: every lane ends with the same bits (each step adds the same
// two values in either order, and float addition commutes).
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Max over the warp; NaN when any lane saw a NaN (like LaneMax on the CPU).
__device__ __forceinline__ float WarpMax(float m, bool nan) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(kFull, m, o);
    m = m < other ? other : m;
  }
  return __any_sync(kFull, nan) ? __int_as_float(0x7fc00000) : m;
}

// Sum of one value per thread of a kThreads block, in a fixed tree.
__device__ double BlockSum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const double r = shared[0];
  __syncthreads();
  return r;
}

// ---- elementwise ----------------------------------------------------------

__global__ void FillBiasKernel(float* y, const float* bias, int64_t rows, int out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * out) y[i] = bias[i % out];
}

__global__ void GeluForwardKernel(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = Gelu(x[i]);
}

__global__ void GeluBackwardKernel(float* dx, const float* dy, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dx[i] = dy[i] * GeluGrad(x[i]);
}

__global__ void AddKernel(float* y, const float* a, const float* b, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}

__global__ void Fp16OverflowKernel(float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = Overflow16(x[i]);
}

__global__ void EmbeddingForwardKernel(float* x, const int32_t* tokens, const float* wte, const float* wpe, int seq,
                                       int dim, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t r = i / dim;
  const int c = static_cast<int>(i % dim);
  x[i] = wte[static_cast<int64_t>(tokens[r]) * dim + c] + wpe[(r % seq) * dim + c];
}

// heads[((b·H+h)·T+t)·D+d] <-> rows[(b·T+t)·stride + h·D + d], one element per thread.
template <bool kToHeads>
__global__ void LayoutKernel(float* heads, float* rows, int stride, int seq, int nh, int hd, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int d = static_cast<int>(i % hd);
  const int64_t t = (i / hd) % seq;
  const int64_t h = (i / (static_cast<int64_t>(hd) * seq)) % nh;
  const int64_t b = i / (static_cast<int64_t>(hd) * seq * nh);
  float* row = rows + (b * seq + t) * stride + h * hd + d;
  if (kToHeads) {
    heads[i] = *row;
  } else {
    *row = heads[i];
  }
}

// ---- column reductions (bias and norm gains) ------------------------------

// partial[chunk·cols + c] = Σ over rows of the chunk, in order, of dy[r, c].
// Grid: x = row chunks, y = tiles of kThreads columns.
__global__ void ColumnPartialsKernel(float* partial, const float* dy, int64_t rows, int cols) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kColumnChunk;
  const int64_t r1 = min(rows, r0 + kColumnChunk);
  float s = 0;
  for (int64_t r = r0; r < r1; ++r) s += dy[r * cols + c];
  partial[static_cast<int64_t>(blockIdx.x) * cols + c] = s;
}

// dst[c] += Σ over chunks, in order, of partial[chunk·cols + c].
__global__ void ColumnFinishKernel(float* dst, const float* partial, int chunks, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0;
  for (int k = 0; k < chunks; ++k) s += partial[static_cast<int64_t>(k) * cols + c];
  dst[c] += s;
}

// The layernorm gain and bias gradients: partial sums of dy·x̂ and dy (grid
// as above).
__global__ void LayerNormColumnPartialsKernel(float* pg, float* pb, const float* dy, const float* x, const float* mean,
                                              const float* rstd, int64_t rows, int dim) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kColumnChunk;
  const int64_t r1 = min(rows, r0 + kColumnChunk);
  float sg = 0, sb = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const float d = dy[r * dim + c];
    sg += d * ((x[r * dim + c] - mean[r]) * rstd[r]);
    sb += d;
  }
  pg[static_cast<int64_t>(blockIdx.x) * dim + c] = sg;
  if (pb != nullptr) pb[static_cast<int64_t>(blockIdx.x) * dim + c] = sb;
}

// ---- layernorm ------------------------------------------------------------

__global__ void LayerNormForwardKernel(float* y, float* mean, float* rstd, const float* x, const float* g,
                                       const float* b, int64_t rows, int dim) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  const float* xr = x + row * dim;
  float s = 0;
  for (int i = lane; i < dim; i += 32) s += xr[i];
  const float mu = WarpSum(s) / dim;
  float v = 0;
  for (int i = lane; i < dim; i += 32) {
    const float d = xr[i] - mu;
    v += d * d;
  }
  const float var = WarpSum(v) / dim;
  const float rs = 1.0f / sqrtf(var + 1e-5f);
  float* yr = y + row * dim;
  for (int i = lane; i < dim; i += 32) yr[i] = (xr[i] - mu) * rs * g[i] + (b != nullptr ? b[i] : 0.0f);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

__global__ void LayerNormBackwardKernel(float* dx, const float* dy, const float* x, const float* mean,
                                        const float* rstd, const float* g, int64_t rows, int dim) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + row * dim;
  const float* dyr = dy + row * dim;
  const float mu = mean[row], rs = rstd[row];
  float s1 = 0, s2 = 0;
  for (int i = lane; i < dim; i += 32) {
    const float dn = dyr[i] * g[i];
    s1 += dn;
    s2 += dn * ((xr[i] - mu) * rs);
  }
  const float m1 = WarpSum(s1) / dim;
  const float m2 = WarpSum(s2) / dim;
  float* dxr = dx + row * dim;
  for (int i = lane; i < dim; i += 32) {
    const float dn = dyr[i] * g[i];
    dxr[i] += rs * (dn - m1 - ((xr[i] - mu) * rs) * m2);
  }
}

// ---- embedding gradient ---------------------------------------------------

// One block: positions of each token value in ascending order (a stable
// counting sort), so the scatter below adds in the CPU's order without atomics.
__global__ void TokenPositionsKernel(int32_t* starts, int32_t* positions, const int32_t* tokens, int64_t n, int vocab) {
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    int32_t count = 0;
    for (int64_t r = 0; r < n; ++r) count += tokens[r] == v ? 1 : 0;
    starts[v + 1] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    starts[0] = 0;
    for (int v = 0; v < vocab; ++v) starts[v + 1] += starts[v];
  }
  __syncthreads();
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    int32_t at = starts[v];
    for (int64_t r = 0; r < n; ++r) {
      if (tokens[r] == v) positions[at++] = static_cast<int32_t>(r);
    }
  }
}

// dwte[v, c] += dx[r, c] for every position r of token v, in ascending r.
__global__ void EmbeddingTokenGradKernel(float* dwte, const float* dx, const int32_t* starts, const int32_t* positions,
                                         int vocab, int dim) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(vocab) * dim) return;
  const int v = static_cast<int>(i / dim), c = static_cast<int>(i % dim);
  if (starts[v] == starts[v + 1]) return;  // rows of tokens not seen (or beyond the vocabulary) stay untouched
  float acc = dwte[i];
  for (int32_t k = starts[v]; k < starts[v + 1]; ++k) acc += dx[static_cast<int64_t>(positions[k]) * dim + c];
  dwte[i] = acc;
}

// dwpe[t, c] += dx[b·T + t, c] for b ascending.
__global__ void EmbeddingPositionGradKernel(float* dwpe, const float* dx, int batch, int seq, int dim) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(seq) * dim) return;
  float acc = dwpe[i];
  for (int b = 0; b < batch; ++b) acc += dx[static_cast<int64_t>(b) * seq * dim + i];
  dwpe[i] = acc;
}

// ---- attention: one warp per query row ------------------------------------

__global__ void AttentionForwardKernel(float* out, float* logits, float* probs, float* row_max, const float* q,
                                       const float* k, const float* v, int64_t rows, int T, int D, float scale,
                                       float softcap, bool fp16) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t pair = row / T;
  const int t = static_cast<int>(row % T), n = t + 1;
  const float* qr = q + row * D;
  const float* kb = k + pair * T * D;
  const float* vb = v + pair * T * D;
  float* L = logits + row * T;
  float* P = probs + row * T;
  float mx = -INFINITY;
  bool nan = false;
  for (int j = lane; j < n; j += 32) {
    const float* kr = kb + static_cast<int64_t>(j) * D;
    float dot = 0;
    for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
    float z = dot * scale;
    if (fp16) z = Overflow16(z);
    if (softcap > 0) z = softcap * FastTanh(z / softcap);
    L[j] = z;
    nan |= isnan(z);
    mx = mx < z ? z : mx;
  }
  mx = WarpMax(mx, nan);
  float s = 0;
  for (int j = lane; j < n; j += 32) {
    const float e = FastExp(L[j] - mx);
    P[j] = e;
    s += e;
  }
  const float inv = 1.0f / WarpSum(s);
  for (int j = lane; j < n; j += 32) P[j] *= inv;
  for (int j = n + lane; j < T; j += 32) P[j] = 0.0f;
  if (lane == 0) row_max[row] = mx;
  __syncwarp();
  float* o = out + row * D;
  for (int d = lane; d < D; d += 32) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += P[j] * vb[static_cast<int64_t>(j) * D + d];
    o[d] = fp16 ? Overflow16(acc) : acc;
  }
}

// Per query row i: dS[i, j] = ∂loss/∂(q_i·k_j) for j <= i, and dq_i.
__global__ void AttentionBackwardQueryKernel(float* dq, float* dS, const float* dout, const float* k, const float* v,
                                             const float* logits, const float* probs, int64_t rows, int T, int D,
                                             float scale, float softcap) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t pair = row / T;
  const int t = static_cast<int>(row % T), n = t + 1;
  const float* dO = dout + row * D;
  const float* kb = k + pair * T * D;
  const float* vb = v + pair * T * D;
  const float* L = logits + row * T;
  const float* P = probs + row * T;
  float* S = dS + row * T;
  float s = 0;
  for (int j = lane; j < n; j += 32) {
    const float* vr = vb + static_cast<int64_t>(j) * D;
    float dp = 0;
    for (int d = 0; d < D; ++d) dp += dO[d] * vr[d];
    S[j] = dp;
    s += P[j] * dp;
  }
  const float dot = WarpSum(s);
  for (int j = lane; j < n; j += 32) {
    float dz = P[j] * (S[j] - dot);
    if (softcap > 0) {
      const float th = L[j] / softcap;
      dz *= 1.0f - th * th;
    }
    S[j] = dz * scale;
  }
  __syncwarp();
  for (int d = lane; d < D; d += 32) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += S[j] * kb[static_cast<int64_t>(j) * D + d];
    dq[row * D + d] = acc;
  }
}

// Per key row j: dk_j = Σ_{i>=j} dS[i, j]·q_i and dv_j = Σ_{i>=j} P[i, j]·dout_i.
__global__ void AttentionBackwardKeyKernel(float* dk, float* dv, const float* dS, const float* probs, const float* q,
                                           const float* dout, int64_t rows, int T, int D) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t pair = row / T;
  const int j = static_cast<int>(row % T);
  const float* S = dS + pair * T * T;
  const float* P = probs + pair * T * T;
  const float* qb = q + pair * T * D;
  const float* ob = dout + pair * T * D;
  for (int d = lane; d < D; d += 32) {
    float ak = 0, av = 0;
    for (int i = j; i < T; ++i) {
      const int64_t ij = static_cast<int64_t>(i) * T + j;
      ak += S[ij] * qb[static_cast<int64_t>(i) * D + d];
      av += P[ij] * ob[static_cast<int64_t>(i) * D + d];
    }
    dk[row * D + d] = ak;
    dv[row * D + d] = av;
  }
}

// ---- loss: one warp per row -----------------------------------------------

__global__ void SoftmaxCrossEntropyKernel(float* dlogits, float* loss, float* lse, const float* logits,
                                          const int32_t* targets, int64_t rows, int vocab, float softcap, float z_loss,
                                          float grad_scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* lr = logits + row * vocab;
  auto cap = [softcap](float x) { return softcap > 0 ? softcap * FastTanh(x / softcap) : x; };
  const int target = targets[row];
  const float y_target = cap(lr[target]);  // read before dlogits (which may alias) is written
  float mx = -INFINITY;
  bool nan = false;
  for (int i = lane; i < vocab; i += 32) {
    const float y = cap(lr[i]);
    nan |= isnan(y);
    mx = mx < y ? y : mx;
  }
  mx = WarpMax(mx, nan);
  float s = 0;
  for (int i = lane; i < vocab; i += 32) s += FastExp(cap(lr[i]) - mx);
  const float l = mx + logf(WarpSum(s));
  if (lane == 0) {
    lse[row] = l;
    loss[row] = l - y_target;
  }
  if (dlogits == nullptr) return;
  __syncwarp();  // every lane has read its logits
  float* dr = dlogits + row * vocab;
  const float zc = 2.0f * z_loss * l;
  for (int i = lane; i < vocab; i += 32) {
    const float y = cap(lr[i]);
    const float p = FastExp(y - l);
    float d = grad_scale * (p + zc * p);
    if (softcap > 0) {
      const float th = y / softcap;
      d *= 1.0f - th * th;
    }
    dr[i] = d;
  }
  __syncwarp();
  if (lane == 0) {
    float dt = -grad_scale;
    if (softcap > 0) {
      const float th = y_target / softcap;
      dt *= 1.0f - th * th;
    }
    dr[target] += dt;
  }
}

// ---- optimizer and reductions ---------------------------------------------

struct AdamWDevArgs {
  float lr, b1, b2, eps, wd, grad_scale, bc1, bc2;
};

// One chunk of kChunk parameters per block; partial[2·block] = Σ Δ², [2·block+1] = Σ w².
__global__ void AdamWKernel(float* param, float* m, float* v, const float* grad, int64_t n, AdamWDevArgs a,
                            double* partial) {
  __shared__ double shared[kThreads];
  const int64_t begin = blockIdx.x * kChunk, end = min(n, begin + kChunk);
  double dsum = 0, wsum = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float g = grad[i] * a.grad_scale;
    const float mi = a.b1 * m[i] + (1.0f - a.b1) * g;
    const float vi = a.b2 * v[i] + (1.0f - a.b2) * (g * g);
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / a.bc1, vhat = vi / a.bc2;
    const float w = param[i];
    const float delta = -a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.wd * w);
    param[i] = w + delta;
    dsum += static_cast<double>(delta) * delta;
    wsum += static_cast<double>(w) * w;
  }
  const double d = BlockSum(dsum, shared);
  const double w = BlockSum(wsum, shared);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = d;
    partial[2 * blockIdx.x + 1] = w;
  }
}

template <bool kCountNonFinite>
__global__ void ChunkSumKernel(double* partial, const float* x, int64_t n) {
  __shared__ double shared[kThreads];
  const int64_t begin = blockIdx.x * kChunk, end = min(n, begin + kChunk);
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    if (kCountNonFinite) {
      s += isfinite(x[i]) ? 0.0 : 1.0;
    } else {
      s += static_cast<double>(x[i]) * x[i];
    }
  }
  const double total = BlockSum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// One block: out[k] = Σ_c partial[c·stride + k] for k < stride, in a fixed order.
__global__ void FinishSumKernel(double* out, const double* partial, int64_t chunks, int stride) {
  __shared__ double shared[kThreads];
  for (int k = 0; k < stride; ++k) {
    double s = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) s += partial[c * stride + k];
    const double total = BlockSum(s, shared);
    if (threadIdx.x == 0) out[k] = total;
  }
}

// ---- the backend ----------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {
    SG_CUDA(cudaSetDevice(options.device));
    SG_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SG_CUBLAS(cublasCreate(&cublas_));
    SG_CUBLAS(cublasSetStream(cublas_, stream_));
    SG_CUBLAS(cublasSetAtomicsMode(cublas_, CUBLAS_ATOMICS_NOT_ALLOWED));
    SG_CUBLAS(cublasSetMathMode(cublas_, options.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    // A workspace of our own, so cuBLAS's choice of algorithm does not depend
    // on what its internal pool happens to hold.
    SG_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
    SG_CUBLAS(cublasSetWorkspace(cublas_, workspace_, kWorkspaceBytes));
    SG_CUDA(cudaMallocHost(&host_sums_, 2 * sizeof(double)));
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    for (void* p : {workspace_, scratch_float_, scratch_int_, scratch_double_}) cudaFree(p);
    cudaFreeHost(host_sums_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return options_.tf32 ? "cuda-tf32" : "cuda"; }
  int threads() const override { return 1; }

  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    SG_CUDA(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    SG_CUDA(cudaMemsetAsync(p, 0, bytes == 0 ? 1 : bytes, stream_));
    SG_CUDA(cudaStreamSynchronize(stream_));
    return p;
  }
  void Free(void* p) override {
    if (p == nullptr) return;
    SG_CUDA(cudaStreamSynchronize(stream_));
    SG_CUDA(cudaFree(p));
  }
  void CopyIn(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    SG_CUDA(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    SG_CUDA(cudaStreamSynchronize(stream_));
  }
  void CopyOut(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    SG_CUDA(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    SG_CUDA(cudaStreamSynchronize(stream_));
  }
  void Synchronize() override { SG_CUDA(cudaStreamSynchronize(stream_)); }

  void MatmulForward(float* y, const float* x, const float* w, const float* bias, int rows, int in, int out) override {
    // Row-major Y = X·W is column-major Yᵀ = Wᵀ·Xᵀ: cuBLAS sees W as out×in and X as in×rows.
    const float one = 1.0f, zero = 0.0f;
    if (bias != nullptr) {
      const int64_t n = static_cast<int64_t>(rows) * out;
      FillBiasKernel<<<Grid(n, kThreads), kThreads, 0, stream_>>>(y, bias, rows, out);
      SG_LAUNCHED();
    }
    SG_CUBLAS(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, &one, w, out, x, in,
                          bias != nullptr ? &one : &zero, y, out));
  }

  void MatmulBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x, const float* w, int rows,
                      int in, int out) override {
    const float one = 1.0f, zero = 0.0f;
    if (dx != nullptr) {  // dx = dy·wᵀ
      SG_CUBLAS(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, in, rows, out, &one, w, out, dy, out, &zero, dx, in));
    }
    // dw += xᵀ·dy
    SG_CUBLAS(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, out, in, rows, &one, dy, out, x, in, &one, dw, out));
    if (dbias != nullptr) ColumnSums(dbias, dy, rows, out);
  }

  void LayerNormForward(float* y, float* mean, float* rstd, const float* x, const float* g, const float* b, int rows,
                        int dim) override {
    LayerNormForwardKernel<<<Grid(rows, kWarps), kThreads, 0, stream_>>>(y, mean, rstd, x, g, b, rows, dim);
    SG_LAUNCHED();
  }

  void LayerNormBackward(float* dx, float* dg, float* db, const float* dy, const float* x, const float* mean,
                         const float* rstd, const float* g, int rows, int dim) override {
    LayerNormBackwardKernel<<<Grid(rows, kWarps), kThreads, 0, stream_>>>(dx, dy, x, mean, rstd, g, rows, dim);
    SG_LAUNCHED();
    const int chunks = static_cast<int>(Grid(rows, kColumnChunk));
    const size_t part = static_cast<size_t>(chunks) * dim;
    float* pg = ScratchFloats(2 * part);
    float* pb = db != nullptr ? pg + part : nullptr;
    const dim3 grid(chunks, Grid(dim, kThreads));
    LayerNormColumnPartialsKernel<<<grid, kThreads, 0, stream_>>>(pg, pb, dy, x, mean, rstd, rows, dim);
    SG_LAUNCHED();
    ColumnFinishKernel<<<Grid(dim, kThreads), kThreads, 0, stream_>>>(dg, pg, chunks, dim);
    SG_LAUNCHED();
    if (db != nullptr) {
      ColumnFinishKernel<<<Grid(dim, kThreads), kThreads, 0, stream_>>>(db, pb, chunks, dim);
      SG_LAUNCHED();
    }
  }

  void GeluForward(float* y, const float* x, size_t n) override {
    if (n == 0) return;
    GeluForwardKernel<<<Grid(n, kThreads), kThreads, 0, stream_>>>(y, x, n);
    SG_LAUNCHED();
  }

  void GeluBackward(float* dx, const float* dy, const float* x, size_t n) override {
    if (n == 0) return;
    GeluBackwardKernel<<<Grid(n, kThreads), kThreads, 0, stream_>>>(dx, dy, x, n);
    SG_LAUNCHED();
  }

  void EmbeddingForward(float* x, const int32_t* tokens, const float* wte, const float* wpe, int batch, int seq,
                        int dim) override {
    const int64_t n = static_cast<int64_t>(batch) * seq * dim;
    EmbeddingForwardKernel<<<Grid(n, kThreads), kThreads, 0, stream_>>>(x, tokens, wte, wpe, seq, dim, n);
    SG_LAUNCHED();
  }

  void EmbeddingBackward(float* dwte, float* dwpe, const float* dx, const int32_t* tokens, int batch, int seq,
                         int dim) override {
    // Only rows of tokens that occur are touched, so the table may have fewer
    // than kMaxVocab rows; ModelConfig allows at most 256.
    const int64_t n = static_cast<int64_t>(batch) * seq;
    int32_t* starts = ScratchInts(kMaxVocab + 1 + n);
    int32_t* positions = starts + kMaxVocab + 1;
    TokenPositionsKernel<<<1, kThreads, 0, stream_>>>(starts, positions, tokens, n, kMaxVocab);
    SG_LAUNCHED();
    EmbeddingTokenGradKernel<<<Grid(static_cast<int64_t>(kMaxVocab) * dim, kThreads), kThreads, 0, stream_>>>(
        dwte, dx, starts, positions, kMaxVocab, dim);
    SG_LAUNCHED();
    EmbeddingPositionGradKernel<<<Grid(static_cast<int64_t>(seq) * dim, kThreads), kThreads, 0, stream_>>>(
        dwpe, dx, batch, seq, dim);
    SG_LAUNCHED();
  }

  void Add(float* y, const float* a, const float* b, size_t n) override {
    if (n == 0) return;
    AddKernel<<<Grid(n, kThreads), kThreads, 0, stream_>>>(y, a, b, n);
    SG_LAUNCHED();
  }

  void Fp16Overflow(float* x, size_t n) override {
    if (n == 0) return;
    Fp16OverflowKernel<<<Grid(n, kThreads), kThreads, 0, stream_>>>(x, n);
    SG_LAUNCHED();
  }

  void RowsToHeads(float* heads, const float* rows, int row_stride, int batch, int seq, int nh, int hd) override {
    const int64_t n = static_cast<int64_t>(batch) * nh * seq * hd;
    LayoutKernel<true>
        <<<Grid(n, kThreads), kThreads, 0, stream_>>>(heads, const_cast<float*>(rows), row_stride, seq, nh, hd, n);
    SG_LAUNCHED();
  }

  void HeadsToRows(float* rows, int row_stride, const float* heads, int batch, int seq, int nh, int hd) override {
    const int64_t n = static_cast<int64_t>(batch) * nh * seq * hd;
    LayoutKernel<false>
        <<<Grid(n, kThreads), kThreads, 0, stream_>>>(const_cast<float*>(heads), rows, row_stride, seq, nh, hd, n);
    SG_LAUNCHED();
  }

  void Zero(float* x, size_t n) override {
    if (n == 0) return;
    SG_CUDA(cudaMemsetAsync(x, 0, n * sizeof(float), stream_));
  }

  void AttentionForward(float* out, float* logits, float* probs, float* row_max, const float* q, const float* k,
                        const float* v, const AttentionShape& s) override {
    const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * s.seq;
    AttentionForwardKernel<<<Grid(rows, kWarps), kThreads, 0, stream_>>>(
        out, logits, probs, row_max, q, k, v, rows, s.seq, s.head_dim, s.scale, s.softcap, s.fp16_overflow);
    SG_LAUNCHED();
  }

  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                         const float* v, const float* logits, const float* probs, const AttentionShape& s) override {
    const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * s.seq;
    float* dS = ScratchFloats(static_cast<size_t>(rows) * s.seq);
    AttentionBackwardQueryKernel<<<Grid(rows, kWarps), kThreads, 0, stream_>>>(dq, dS, dout, k, v, logits, probs, rows,
                                                                               s.seq, s.head_dim, s.scale, s.softcap);
    SG_LAUNCHED();
    AttentionBackwardKeyKernel<<<Grid(rows, kWarps), kThreads, 0, stream_>>>(dk, dv, dS, probs, q, dout, rows, s.seq,
                                                                             s.head_dim);
    SG_LAUNCHED();
  }

  void SoftmaxCrossEntropy(float* dlogits, float* loss, float* lse, const float* logits, const int32_t* targets,
                           int rows, int vocab, float softcap, float z_loss, float grad_scale) override {
    SoftmaxCrossEntropyKernel<<<Grid(rows, kWarps), kThreads, 0, stream_>>>(dlogits, loss, lse, logits, targets, rows,
                                                                            vocab, softcap, z_loss, grad_scale);
    SG_LAUNCHED();
  }

  void AdamW(float* param, float* m, float* v, const float* grad, size_t n, const AdamWArgs& a, bool decay,
             double* delta_sq, double* param_sq) override {
    if (n == 0) return;
    AdamWDevArgs d;
    d.lr = a.lr;
    d.b1 = a.beta1;
    d.b2 = a.beta2;
    d.eps = a.eps;
    d.wd = decay ? a.weight_decay : 0.0f;
    d.grad_scale = a.grad_scale;
    // Bias corrections in double on the host, rounded once, as on the CPU.
    d.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.t)));
    d.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.t)));
    const int64_t chunks = Grid(n, kChunk);
    double* partial = ScratchDoubles(2 * chunks + 2);
    AdamWKernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream_>>>(param, m, v, grad, n, d, partial);
    SG_LAUNCHED();
    if (delta_sq == nullptr && param_sq == nullptr) return;  // no sums wanted: no synchronization
    const double* sums = Finish(partial, chunks, 2);
    if (delta_sq != nullptr) *delta_sq += sums[0];
    if (param_sq != nullptr) *param_sq += sums[1];
  }

  double SumSquares(const float* x, size_t n) override {
    if (n == 0) return 0;
    const int64_t chunks = Grid(n, kChunk);
    double* partial = ScratchDoubles(chunks + 2);
    ChunkSumKernel<false><<<static_cast<unsigned>(chunks), kThreads, 0, stream_>>>(partial, x, n);
    SG_LAUNCHED();
    return Finish(partial, chunks, 1)[0];
  }

  int64_t CountNonFinite(const float* x, size_t n) override {
    if (n == 0) return 0;
    const int64_t chunks = Grid(n, kChunk);
    double* partial = ScratchDoubles(chunks + 2);
    ChunkSumKernel<true><<<static_cast<unsigned>(chunks), kThreads, 0, stream_>>>(partial, x, n);
    SG_LAUNCHED();
    return static_cast<int64_t>(Finish(partial, chunks, 1)[0]);
  }

 private:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  static constexpr int kMaxVocab = 256;

  // dst[c] += Σ_r dy[r, c] over rows, in chunks of kColumnChunk rows.
  void ColumnSums(float* dst, const float* dy, int rows, int cols) {
    const int chunks = static_cast<int>(Grid(rows, kColumnChunk));
    float* partial = ScratchFloats(static_cast<size_t>(chunks) * cols);
    ColumnPartialsKernel<<<dim3(chunks, Grid(cols, kThreads)), kThreads, 0, stream_>>>(partial, dy, rows, cols);
    SG_LAUNCHED();
    ColumnFinishKernel<<<Grid(cols, kThreads), kThreads, 0, stream_>>>(dst, partial, chunks, cols);
    SG_LAUNCHED();
  }

  // Sums the chunk partials (stride values per chunk) and returns them on the host.
  const double* Finish(double* partial, int64_t chunks, int stride) {
    double* out = partial + stride * chunks;
    FinishSumKernel<<<1, kThreads, 0, stream_>>>(out, partial, chunks, stride);
    SG_LAUNCHED();
    SG_CUDA(cudaMemcpyAsync(host_sums_, out, stride * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    SG_CUDA(cudaStreamSynchronize(stream_));
    return host_sums_;
  }

  // Scratch buffers that only grow; kernels on the one stream use them in turn.
  template <typename T>
  T* Grow(void*& buffer, size_t& capacity, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes > capacity) {
      SG_CUDA(cudaStreamSynchronize(stream_));
      SG_CUDA(cudaFree(buffer));
      buffer = nullptr;
      SG_CUDA(cudaMalloc(&buffer, bytes));
      capacity = bytes;
    }
    return static_cast<T*>(buffer);
  }
  float* ScratchFloats(size_t n) { return Grow<float>(scratch_float_, float_bytes_, n); }
  int32_t* ScratchInts(size_t n) { return Grow<int32_t>(scratch_int_, int_bytes_, n); }
  double* ScratchDoubles(size_t n) { return Grow<double>(scratch_double_, double_bytes_, n); }

  CudaBackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* workspace_ = nullptr;
  void* scratch_float_ = nullptr;
  void* scratch_int_ = nullptr;
  void* scratch_double_ = nullptr;
  size_t float_bytes_ = 0, int_bytes_ = 0, double_bytes_ = 0;
  double* host_sums_ = nullptr;
};

}  // namespace

bool CudaDeviceAvailable(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why != nullptr) *why = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "no CUDA device";
    return false;
  }
  return true;
}

std::unique_ptr<Backend> MakeCudaBackend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

CudaDeviceInfo GetCudaDeviceInfo(int device) {
  cudaDeviceProp prop;
  SG_CUDA(cudaGetDeviceProperties(&prop, device));
  CudaDeviceInfo info;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

}  // namespace spikeguard::kernels
