// The CPU backend. Work is split between threads by output rows (or output
// columns for gradient reductions over rows), so every output element is
// computed by exactly one thread in a fixed order: results do not depend on the
// thread count. Sums that feed telemetry use fixed chunks whose partial sums are
// added in chunk order.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/fast_math.h"
#include "kernels/gemm.h"
#include "kernels/thread_pool.h"

namespace spikeguard::kernels {
namespace {

using internal::FastExp;
using internal::FastTanh;

constexpr float kFp16Max = 65504.0f;
constexpr int64_t kChunk = 4096;  // elements per partial sum of a reduction
constexpr int64_t kLanes = 16;    // columns per task of a column-split reduction
constexpr int64_t kColumns = 64;  // columns per task of a bias gradient
constexpr int kGemmRows = 48;     // rows of C per GEMM task (a multiple of the 6-row micro-kernel)
constexpr int64_t kElementwiseGrain = 16384;

// Sum of x[0, n) in 16 interleaved partial sums, combined in lane order.
inline float LaneSum(const float* x, int n) {
  float part[16] = {};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) part[j] += x[i + j];
  }
  float s = 0;
  for (int j = 0; j < 16; ++j) s += part[j];
  for (; i < n; ++i) s += x[i];
  return s;
}

inline float LaneMax(const float* x, int n) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    nan |= std::isnan(x[i]);
    m = std::max(m, x[i]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

inline float Gelu(float x) {
  constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
  const float u = kS * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + FastTanh(u));
}

inline float GeluGrad(float x) {
  constexpr float kS = 0.7978845608028654f;
  const float u = kS * (x + 0.044715f * x * x * x);
  const float t = FastTanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kS * (1.0f + 3.0f * 0.044715f * x * x);
}

inline float Overflow16(float x) {
  return std::fabs(x) > kFp16Max ? std::copysign(std::numeric_limits<float>::infinity(), x) : x;
}

// dst[j·ld_dst + i] = src[i·ld_src + j] for a rows×cols block of src.
void Transpose(float* dst, int ld_dst, const float* src, int ld_src, int rows, int cols) {
  constexpr int kTile = 16;
  for (int i0 = 0; i0 < rows; i0 += kTile) {
    for (int j0 = 0; j0 < cols; j0 += kTile) {
      const int i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      for (int i = i0; i < i1; ++i) {
        for (int j = j0; j < j1; ++j) {
          dst[static_cast<size_t>(j) * ld_dst + i] = src[static_cast<size_t>(i) * ld_src + j];
        }
      }
    }
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(std::max(1, threads)), scratch_(pool_.size()) {}

  std::string name() const override { return "cpu"; }
  int threads() const override { return pool_.size(); }

  void MatmulForward(float* y, const float* x, const float* w, const float* bias, int rows, int in, int out) override {
    Blocks(rows, kGemmRows, [&](int64_t rb, int64_t re, int) {
      if (bias != nullptr) {
        for (int64_t r = rb; r < re; ++r) std::memcpy(y + r * out, bias, sizeof(float) * out);
      }
      Gemm({.m = rows,
            .n = out,
            .k = in,
            .a = x,
            .lda = in,
            .b = w,
            .ldb = out,
            .c = y,
            .ldc = out,
            .accumulate = bias != nullptr,
            .row_begin = static_cast<int>(rb),
            .row_end = static_cast<int>(re)});
    });
  }

  void MatmulBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x, const float* w, int rows,
                      int in, int out) override {
    if (dx != nullptr) {
      wt_.resize(static_cast<size_t>(in) * out);
      Blocks(in, 16, [&](int64_t rb, int64_t re, int) {  // wt[out×in] = wᵀ
        Transpose(wt_.data() + rb, in, w + rb * out, out, static_cast<int>(re - rb), out);
      });
    }
    // One task list: rows of dx, then rows of dw, then columns of dbias.
    const int64_t dx_tasks = dx != nullptr ? NumBlocks(rows, kGemmRows) : 0;
    const int64_t dw_tasks = NumBlocks(in, kGemmRows / 2);
    const int64_t db_tasks = dbias != nullptr ? NumBlocks(out, kColumns) : 0;
    pool_.ParallelFor(dx_tasks + dw_tasks + db_tasks, [&](int64_t task, int) {
      if (task < dx_tasks) {
        const int rb = static_cast<int>(task * kGemmRows), re = std::min<int>(rows, rb + kGemmRows);
        Gemm({.m = rows,
              .n = in,
              .k = out,
              .a = dy,
              .lda = out,
              .b = wt_.data(),
              .ldb = in,
              .c = dx,
              .ldc = in,
              .row_begin = rb,
              .row_end = re});
      } else if (task < dx_tasks + dw_tasks) {
        const int rb = static_cast<int>((task - dx_tasks) * (kGemmRows / 2)),
                  re = std::min<int>(in, rb + kGemmRows / 2);
        Gemm({.m = in,
              .n = out,
              .k = rows,
              .a = x,
              .lda = in,
              .trans_a = true,
              .b = dy,
              .ldb = out,
              .c = dw,
              .ldc = out,
              .accumulate = true,
              .row_begin = rb,
              .row_end = re});
      } else {
        const int64_t cb = (task - dx_tasks - dw_tasks) * kColumns, ce = std::min<int64_t>(out, cb + kColumns);
        for (int r = 0; r < rows; ++r) {
          const float* row = dy + static_cast<size_t>(r) * out;
          for (int64_t c = cb; c < ce; ++c) dbias[c] += row[c];
        }
      }
    });
  }

  void LayerNormForward(float* y, float* mean, float* rstd, const float* x, const float* g, const float* b, int rows,
                        int dim) override {
    Blocks(rows, 32, [&](int64_t rb, int64_t re, int tid) {
      std::vector<float>& tmp = Scratch(tid, 0, dim);
      for (int64_t r = rb; r < re; ++r) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        const float mu = LaneSum(xr, dim) / dim;
        for (int i = 0; i < dim; ++i) {
          const float d = xr[i] - mu;
          tmp[i] = d * d;
        }
        const float var = LaneSum(tmp.data(), dim) / dim;
        const float rs = 1.0f / std::sqrt(var + 1e-5f);
        for (int i = 0; i < dim; ++i) yr[i] = (xr[i] - mu) * rs * g[i] + (b ? b[i] : 0.0f);
        mean[r] = mu;
        rstd[r] = rs;
      }
    });
  }

  void LayerNormBackward(float* dx, float* dg, float* db, const float* dy, const float* x, const float* mean,
                         const float* rstd, const float* g, int rows, int dim) override {
    // Tasks: blocks of rows for dx, then blocks of columns for dg and db.
    const int64_t row_tasks = NumBlocks(rows, 32);
    pool_.ParallelFor(row_tasks + NumBlocks(dim, kLanes), [&](int64_t task, int tid) {
      if (task >= row_tasks) {
        const int64_t cb = (task - row_tasks) * kLanes, ce = std::min<int64_t>(dim, cb + kLanes);
        for (int r = 0; r < rows; ++r) {
          const float* xr = x + static_cast<size_t>(r) * dim;
          const float* dyr = dy + static_cast<size_t>(r) * dim;
          const float mu = mean[r], rs = rstd[r];
          for (int64_t i = cb; i < ce; ++i) dg[i] += dyr[i] * ((xr[i] - mu) * rs);
          if (db != nullptr) {
            for (int64_t i = cb; i < ce; ++i) db[i] += dyr[i];
          }
        }
        return;
      }
      std::vector<float>& dn = Scratch(tid, 0, dim);
      std::vector<float>& dnx = Scratch(tid, 1, dim);
      const int64_t rb = task * 32, re = std::min<int64_t>(rows, rb + 32);
      for (int64_t r = rb; r < re; ++r) {
        const float* xr = x + r * dim;
        const float* dyr = dy + r * dim;
        const float mu = mean[r], rs = rstd[r];
        for (int i = 0; i < dim; ++i) {
          dn[i] = dyr[i] * g[i];
          dnx[i] = dn[i] * ((xr[i] - mu) * rs);
        }
        const float m1 = LaneSum(dn.data(), dim) / dim;
        const float m2 = LaneSum(dnx.data(), dim) / dim;
        float* dxr = dx + r * dim;
        for (int i = 0; i < dim; ++i) dxr[i] += rs * (dn[i] - m1 - ((xr[i] - mu) * rs) * m2);
      }
    });
  }

  void GeluForward(float* y, const float* x, size_t n) override {
    Elementwise(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = Gelu(x[i]);
    });
  }

  void GeluBackward(float* dx, const float* dy, const float* x, size_t n) override {
    Elementwise(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * GeluGrad(x[i]);
    });
  }

  void EmbeddingForward(float* x, const int32_t* tokens, const float* wte, const float* wpe, int batch, int seq,
                        int dim) override {
    Blocks(static_cast<int64_t>(batch) * seq, 64, [&](int64_t rb, int64_t re, int) {
      for (int64_t r = rb; r < re; ++r) {
        const float* e = wte + static_cast<size_t>(tokens[r]) * dim;
        const float* p = wpe + (r % seq) * dim;
        float* xr = x + r * dim;
        for (int i = 0; i < dim; ++i) xr[i] = e[i] + p[i];
      }
    });
  }

  void EmbeddingBackward(float* dwte, float* dwpe, const float* dx, const int32_t* tokens, int batch, int seq,
                         int dim) override {
    Blocks(dim, kLanes, [&](int64_t cb, int64_t ce, int) {
      for (int64_t r = 0; r < static_cast<int64_t>(batch) * seq; ++r) {
        const float* d = dx + r * dim;
        float* e = dwte + static_cast<size_t>(tokens[r]) * dim;
        float* p = dwpe + (r % seq) * dim;
        for (int64_t i = cb; i < ce; ++i) {
          e[i] += d[i];
          p[i] += d[i];
        }
      }
    });
  }

  void Add(float* y, const float* a, const float* b, size_t n) override {
    Elementwise(n, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = a[i] + b[i];
    });
  }

  void Fp16Overflow(float* x, size_t n) override {
    Elementwise(n, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) x[i] = Overflow16(x[i]);
    });
  }

  void Zero(float* x, size_t n) override {
    Elementwise(n, [&](int64_t s, int64_t e) { std::fill(x + s, x + e, 0.0f); });
  }

  void RowsToHeads(float* heads, const float* rows, int row_stride, int batch, int seq, int nh, int hd) override {
    Blocks(static_cast<int64_t>(batch) * seq, 64, [&](int64_t rb, int64_t re, int) {
      for (int64_t r = rb; r < re; ++r) {
        const int64_t b = r / seq, t = r % seq;
        for (int h = 0; h < nh; ++h) {
          std::memcpy(heads + ((b * nh + h) * seq + t) * hd, rows + r * row_stride + h * hd, sizeof(float) * hd);
        }
      }
    });
  }

  void HeadsToRows(float* rows, int row_stride, const float* heads, int batch, int seq, int nh, int hd) override {
    Blocks(static_cast<int64_t>(batch) * seq, 64, [&](int64_t rb, int64_t re, int) {
      for (int64_t r = rb; r < re; ++r) {
        const int64_t b = r / seq, t = r % seq;
        for (int h = 0; h < nh; ++h) {
          std::memcpy(rows + r * row_stride + h * hd, heads + ((b * nh + h) * seq + t) * hd, sizeof(float) * hd);
        }
      }
    });
  }

  void AttentionForward(float* out, float* logits, float* probs, float* row_max, const float* q, const float* k,
                        const float* v, const AttentionShape& s) override {
    const int T = s.seq, D = s.head_dim;
    pool_.ParallelFor(static_cast<int64_t>(s.batch) * s.heads, [&](int64_t pair, int tid) {
      std::vector<float>& kt = Scratch(tid, 0, static_cast<size_t>(T) * D);
      const size_t hoff = static_cast<size_t>(pair) * T * D, soff = static_cast<size_t>(pair) * T * T;
      Transpose(kt.data(), T, k + hoff, D, T, D);
      float* L = logits + soff;
      float* P = probs + soff;
      Gemm({.m = T, .n = T, .k = D, .a = q + hoff, .lda = D, .b = kt.data(), .ldb = T, .c = L, .ldc = T});
      for (int t = 0; t < T; ++t) {
        float* lr = L + static_cast<size_t>(t) * T;
        float* pr = P + static_cast<size_t>(t) * T;
        const int n = t + 1;  // causal: keys 0..t
        for (int j = 0; j < n; ++j) {
          float z = lr[j] * s.scale;
          if (s.fp16_overflow) z = Overflow16(z);
          if (s.softcap > 0) z = s.softcap * FastTanh(z / s.softcap);
          lr[j] = z;
        }
        const float mx = LaneMax(lr, n);
        for (int j = 0; j < n; ++j) pr[j] = FastExp(lr[j] - mx);
        const float inv = 1.0f / LaneSum(pr, n);
        for (int j = 0; j < n; ++j) pr[j] *= inv;
        std::fill(pr + n, pr + T, 0.0f);
        row_max[pair * T + t] = mx;
      }
      float* o = out + hoff;
      Gemm({.m = T, .n = D, .k = T, .a = P, .lda = T, .b = v + hoff, .ldb = D, .c = o, .ldc = D});
      if (s.fp16_overflow) {
        for (int i = 0; i < T * D; ++i) o[i] = Overflow16(o[i]);
      }
    });
  }

  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                         const float* v, const float* logits, const float* probs, const AttentionShape& s) override {
    const int T = s.seq, D = s.head_dim;
    pool_.ParallelFor(static_cast<int64_t>(s.batch) * s.heads, [&](int64_t pair, int tid) {
      std::vector<float>& vt = Scratch(tid, 0, static_cast<size_t>(T) * D);
      std::vector<float>& dp = Scratch(tid, 1, static_cast<size_t>(T) * T);
      std::vector<float>& tmp = Scratch(tid, 2, T);
      const size_t hoff = static_cast<size_t>(pair) * T * D, soff = static_cast<size_t>(pair) * T * T;
      const float* L = logits + soff;
      const float* P = probs + soff;
      const float* dO = dout + hoff;
      Transpose(vt.data(), T, v + hoff, D, T, D);
      Gemm({.m = T, .n = T, .k = D, .a = dO, .lda = D, .b = vt.data(), .ldb = T, .c = dp.data(), .ldc = T});
      for (int t = 0; t < T; ++t) {
        const float* pr = P + static_cast<size_t>(t) * T;
        const float* lr = L + static_cast<size_t>(t) * T;
        float* dr = dp.data() + static_cast<size_t>(t) * T;
        const int n = t + 1;
        for (int j = 0; j < n; ++j) tmp[j] = pr[j] * dr[j];
        const float dot = LaneSum(tmp.data(), n);
        for (int j = 0; j < n; ++j) {
          float dz = pr[j] * (dr[j] - dot);
          if (s.softcap > 0) {
            const float th = lr[j] / s.softcap;
            dz *= 1.0f - th * th;
          }
          dr[j] = dz * s.scale;
        }
        std::fill(dr + n, dr + T, 0.0f);
      }
      Gemm({.m = T, .n = D, .k = T, .a = dp.data(), .lda = T, .b = k + hoff, .ldb = D, .c = dq + hoff, .ldc = D});
      Gemm({.m = T,
            .n = D,
            .k = T,
            .a = dp.data(),
            .lda = T,
            .trans_a = true,
            .b = q + hoff,
            .ldb = D,
            .c = dk + hoff,
            .ldc = D});
      Gemm({.m = T, .n = D, .k = T, .a = P, .lda = T, .trans_a = true, .b = dO, .ldb = D, .c = dv + hoff, .ldc = D});
    });
  }

  void SoftmaxCrossEntropy(float* dlogits, float* loss, float* lse, const float* logits, const int32_t* targets,
                           int rows, int vocab, float softcap, float z_loss, float grad_scale) override {
    Blocks(rows, 16, [&](int64_t rb, int64_t re, int tid) {
      std::vector<float>& y = Scratch(tid, 0, vocab);
      std::vector<float>& e = Scratch(tid, 1, vocab);
      for (int64_t r = rb; r < re; ++r) {
        const float* lr = logits + r * vocab;
        if (softcap > 0) {
          for (int i = 0; i < vocab; ++i) y[i] = softcap * FastTanh(lr[i] / softcap);
        } else {
          std::memcpy(y.data(), lr, sizeof(float) * vocab);
        }
        const float mx = LaneMax(y.data(), vocab);
        for (int i = 0; i < vocab; ++i) e[i] = FastExp(y[i] - mx);
        const float l = mx + std::log(LaneSum(e.data(), vocab));
        lse[r] = l;
        loss[r] = l - y[targets[r]];
        if (dlogits == nullptr) continue;
        float* dr = dlogits + r * vocab;
        const float zc = 2.0f * z_loss * l;
        for (int i = 0; i < vocab; ++i) {
          const float p = FastExp(y[i] - l);
          float d = grad_scale * (p + zc * p);
          if (softcap > 0) {
            const float th = y[i] / softcap;
            d *= 1.0f - th * th;
          }
          dr[i] = d;
        }
        float dt = -grad_scale;
        if (softcap > 0) {
          const float th = y[targets[r]] / softcap;
          dt *= 1.0f - th * th;
        }
        dr[targets[r]] += dt;
      }
    });
  }

  void AdamW(float* param, float* m, float* v, const float* grad, size_t n, const AdamWArgs& a, bool decay,
             double* delta_sq, double* param_sq) override {
    const float b1 = a.beta1, b2 = a.beta2;
    const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), static_cast<double>(a.t)));
    const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), static_cast<double>(a.t)));
    const float wd = decay ? a.weight_decay : 0.0f;
    auto update = [&](int64_t idx, double& w_sq) {
      const float g = grad[idx] * a.grad_scale;
      const float mi = b1 * m[idx] + (1.0f - b1) * g;
      const float vi = b2 * v[idx] + (1.0f - b2) * (g * g);
      m[idx] = mi;
      v[idx] = vi;
      const float mhat = mi / bc1, vhat = vi / bc2;
      const float w = param[idx];
      const float delta = -a.lr * (mhat / (std::sqrt(vhat) + a.eps) + wd * w);
      param[idx] = w + delta;
      w_sq = static_cast<double>(w) * w;
      return static_cast<double>(delta);
    };
    // Always this one loop, sums or not: a second copy of the update could be
    // compiled with different FMA contraction and change the parameters' bits.
    const auto [d_sq, w_sq] = ChunkedPair(n, [&](int64_t s, int64_t e) {
      double dpart[8] = {}, wpart[8] = {};
      int64_t i = s;
      for (; i + 8 <= e; i += 8) {
        for (int j = 0; j < 8; ++j) {
          double ws;
          const double d = update(i + j, ws);
          dpart[j] += d * d;
          wpart[j] += ws;
        }
      }
      double dsum = 0, wsum = 0;
      for (int j = 0; j < 8; ++j) {
        dsum += dpart[j];
        wsum += wpart[j];
      }
      for (; i < e; ++i) {
        double ws;
        const double d = update(i, ws);
        dsum += d * d;
        wsum += ws;
      }
      return std::pair<double, double>(dsum, wsum);
    });
    if (delta_sq != nullptr) *delta_sq += d_sq;
    if (param_sq != nullptr) *param_sq += w_sq;
  }

  double SumSquares(const float* x, size_t n) override {
    return Chunked(n, [&](int64_t s, int64_t e) {
      double part[8] = {};
      int64_t i = s;
      for (; i + 8 <= e; i += 8) {
        for (int j = 0; j < 8; ++j) {
          const double d = x[i + j];
          part[j] += d * d;
        }
      }
      double sum = 0;
      for (int j = 0; j < 8; ++j) sum += part[j];
      for (; i < e; ++i) sum += static_cast<double>(x[i]) * x[i];
      return sum;
    });
  }

  int64_t CountNonFinite(const float* x, size_t n) override {
    return static_cast<int64_t>(Chunked(n, [&](int64_t s, int64_t e) {
      int64_t c = 0;
      for (int64_t i = s; i < e; ++i) c += std::isfinite(x[i]) ? 0 : 1;
      return static_cast<double>(c);
    }));
  }

 private:
  // A per-thread scratch vector (slot 0..3) of at least `size` floats.
  std::vector<float>& Scratch(int tid, int slot, size_t size) {
    auto& v = scratch_[tid][slot];
    if (v.size() < size) v.resize(size);
    return v;
  }

  // fn(begin, end, tid) over [0, n) in blocks of `grain`.
  template <typename Fn>
  void Blocks(int64_t n, int64_t grain, Fn fn) {
    pool_.ParallelFor(NumBlocks(n, grain),
                      [&](int64_t task, int tid) { fn(task * grain, std::min(n, (task + 1) * grain), tid); });
  }

  template <typename Fn>
  void Elementwise(size_t n, Fn fn) {
    Blocks(static_cast<int64_t>(n), kElementwiseGrain, [&](int64_t b, int64_t e, int) { fn(b, e); });
  }

  // Σ over fixed chunks of fn(begin, end), added in chunk order.
  template <typename Fn>
  double Chunked(size_t n, Fn fn) {
    const int64_t chunks = (static_cast<int64_t>(n) + kChunk - 1) / kChunk;
    partials_.assign(chunks, 0.0);
    pool_.ParallelFor(chunks,
                      [&](int64_t c, int) { partials_[c] = fn(c * kChunk, std::min<int64_t>(n, (c + 1) * kChunk)); });
    double total = 0;
    for (double p : partials_) total += p;
    return total;
  }

  // Both sums of fn(begin, end) -> pair over fixed chunks, added in chunk order.
  template <typename Fn>
  std::pair<double, double> ChunkedPair(size_t n, Fn fn) {
    const int64_t chunks = (static_cast<int64_t>(n) + kChunk - 1) / kChunk;
    pair_partials_.assign(chunks, {0.0, 0.0});
    pool_.ParallelFor(chunks, [&](int64_t c, int) {
      pair_partials_[c] = fn(c * kChunk, std::min<int64_t>(n, (c + 1) * kChunk));
    });
    std::pair<double, double> total{0.0, 0.0};
    for (const auto& p : pair_partials_) {
      total.first += p.first;
      total.second += p.second;
    }
    return total;
  }

  ThreadPool pool_;
  std::vector<std::array<std::vector<float>, 4>> scratch_;
  std::vector<float> wt_;
  std::vector<double> partials_;
  std::vector<std::pair<double, double>> pair_partials_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace spikeguard::kernels
