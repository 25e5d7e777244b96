// backend.h
// -----------------------------------------------------------------------------
// The kernels of the reference model behind one interface, so the trainer
// (trainer.h) is written once and a CUDA implementation can sit beside the
// CPU one. A backend owns its threads and scratch memory; every pointer it is
// given lives in its memory space (host memory for the CPU backend).
//
//   std::unique_ptr<Backend> cpu = MakeCpuBackend(/*threads=*/2);
//   cpu->MatmulForward(y, x, w, bias, /*rows=*/n, /*in=*/c, /*out=*/3 * c);
//
// Conventions: row-major float32; a weight is stored [in × out] so the forward
// pass is Y = X·W; "+=" in a comment means the kernel accumulates into that
// output (gradients), "=" means it overwrites. Kernels must be deterministic:
// the same inputs give the same bits on every call and for any thread count.
// Reductions return a double, summed in a fixed order.
//
// Memory: Allocate/Free/CopyIn/CopyOut give buffers in the backend's memory
// space (host memory by default; device memory for the CUDA backend, see
// kernels/cuda/cuda_backend.h). The trainer keeps its buffers in host memory
// (std::vector) and so runs on the CPU backend only; ModelRunner
// (model_runner.h) keeps every buffer in backend memory and runs on either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace spikeguard::kernels {

// Shape of one attention call; q, k, v, out are [batch, heads, seq, head_dim].
struct AttentionShape {
  int batch = 0, heads = 0, seq = 0, head_dim = 0;
  float scale = 1.0f;          // usually 1/sqrt(head_dim)
  float softcap = 0.0f;        // > 0: logits become softcap·tanh(logit/softcap)
  bool fp16_overflow = false;  // logits beyond ±65504 become ±Inf
};

struct AdamWArgs {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  float grad_scale = 1.0f;  // gradient clipping factor, applied before the moments
  int64_t t = 1;            // 1-based update count, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int threads() const = 0;

  // ---- memory -------------------------------------------------------------
  // `bytes` of this backend's memory, zeroed; Free(nullptr) does nothing.
  virtual void* Allocate(size_t bytes) { return std::calloc(bytes == 0 ? 1 : bytes, 1); }
  virtual void Free(void* p) { std::free(p); }
  // Host memory -> backend memory and back; both return when the copy is done
  // (CopyOut after every kernel issued before it has finished).
  virtual void CopyIn(void* dst, const void* host_src, size_t bytes) {
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
  }
  virtual void CopyOut(void* host_dst, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
  }
  // Returns when every kernel issued so far has finished (for timing).
  virtual void Synchronize() {}

  // ---- dense layers -------------------------------------------------------
  // y[rows×out] = x[rows×in]·w[in×out] + bias (bias may be null).
  virtual void MatmulForward(float* y, const float* x, const float* w, const float* bias, int rows, int in,
                             int out) = 0;
  // dx[rows×in] = dy·wᵀ (skipped when dx is null); dw += xᵀ·dy;
  // dbias += column sums of dy (skipped when dbias is null).
  virtual void MatmulBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x, const float* w,
                              int rows, int in, int out) = 0;

  // ---- normalization and activations -------------------------------------
  // Per row of `dim`: y = (x - mean)·rstd·g + b (b may be null); saves mean, rstd.
  virtual void LayerNormForward(float* y, float* mean, float* rstd, const float* x, const float* g, const float* b,
                                int rows, int dim) = 0;
  // dx += ∂/∂x, dg += ∂/∂g, db += ∂/∂b (db may be null).
  virtual void LayerNormBackward(float* dx, float* dg, float* db, const float* dy, const float* x, const float* mean,
                                 const float* rstd, const float* g, int rows, int dim) = 0;
  // GELU, tanh approximation (GPT-2): y = gelu(x); dx = dy·gelu'(x).
  virtual void GeluForward(float* y, const float* x, size_t n) = 0;
  virtual void GeluBackward(float* dx, const float* dy, const float* x, size_t n) = 0;

  // ---- embeddings, residual, layout ---------------------------------------
  // x[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; tokens are [batch×seq].
  virtual void EmbeddingForward(float* x, const int32_t* tokens, const float* wte, const float* wpe, int batch, int seq,
                                int dim) = 0;
  // dwte += scatter of dx by token, dwpe += sum over the batch.
  virtual void EmbeddingBackward(float* dwte, float* dwpe, const float* dx, const int32_t* tokens, int batch, int seq,
                                 int dim) = 0;
  // y = a + b, elementwise (y may alias a).
  virtual void Add(float* y, const float* a, const float* b, size_t n) = 0;
  // Emulates the fp16 range: |x| > 65504 becomes ±Inf.
  virtual void Fp16Overflow(float* x, size_t n) = 0;
  // rows[(b·seq+t)·row_stride + h·head_dim + d] <-> heads[((b·H+h)·seq+t)·head_dim + d]
  virtual void RowsToHeads(float* heads, const float* rows, int row_stride, int batch, int seq, int heads_n,
                           int head_dim) = 0;
  virtual void HeadsToRows(float* rows, int row_stride, const float* heads, int batch, int seq, int heads_n,
                           int head_dim) = 0;
  virtual void Zero(float* x, size_t n) = 0;

  // ---- attention (causal) -------------------------------------------------
  // out = softmax(cap(scale·q·kᵀ) masked causally)·v. Saves the capped logits
  // and probabilities ([batch,heads,seq,seq], upper triangle unspecified) for
  // the backward pass, and the largest capped logit of each row in
  // row_max[batch·heads·seq].
  virtual void AttentionForward(float* out, float* logits, float* probs, float* row_max, const float* q, const float* k,
                                const float* v, const AttentionShape& shape) = 0;
  // dq, dk, dv = (overwritten) gradients from dout.
  virtual void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                                 const float* v, const float* logits, const float* probs,
                                 const AttentionShape& shape) = 0;

  // ---- loss ---------------------------------------------------------------
  // Per row r of logits[rows×vocab]: y = cap(logits) (softcap > 0),
  // lse[r] = log Σ exp(y), loss[r] = lse[r] - y[target[r]] (cross-entropy).
  // When dlogits is non-null it receives the gradient of
  //   grad_scale · (loss[r] + z_loss · lse[r]²)
  // with respect to the raw logits (dlogits may alias logits).
  virtual void SoftmaxCrossEntropy(float* dlogits, float* loss, float* lse, const float* logits, const int32_t* targets,
                                   int rows, int vocab, float softcap, float z_loss, float grad_scale) = 0;

  // ---- optimizer and reductions -------------------------------------------
  // One AdamW update of n parameters. When non-null, *delta_sq += Σ(Δparam)²
  // and *param_sq += Σparam² (before the update), for telemetry.
  virtual void AdamW(float* param, float* m, float* v, const float* grad, size_t n, const AdamWArgs& args, bool decay,
                     double* delta_sq, double* param_sq) = 0;
  virtual double SumSquares(const float* x, size_t n) = 0;
  virtual int64_t CountNonFinite(const float* x, size_t n) = 0;
};

// The CPU implementation: `threads` worker threads (1 or more), results
// bit-identical for every thread count.
std::unique_ptr<Backend> MakeCpuBackend(int threads);

}  // namespace spikeguard::kernels
