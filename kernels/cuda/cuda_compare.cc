// spikeguard_cuda_compare: the CUDA backend against the CPU backend, in the
// manner of llm.c's test_gpt2 (the CPU path is the truth).
//
//   spikeguard_cuda_compare                  compare, determinism, throughput
//   spikeguard_cuda_compare --quick          compare and determinism, small shapes
//   spikeguard_cuda_compare --only=throughput [--bench_batch=16 --bench_seq=256 ...]
//   spikeguard_cuda_compare --candidate=cpu  the same checks with a 1-thread CPU
//                                            backend standing in for the GPU
//   spikeguard_cuda_compare --candidate=cpu-noisy --noise_ulps=8 --only=compare
//                                            ... with every kernel output moved
//                                            by up to 8 ulp: the tolerances
//                                            leave room for rounding noise
//
// 0. kernels: each Backend call alone, on random inputs, against the CPU's.
// 1. compare: for each model case (plain; qk-norm + soft-caps + z-loss + tied
//    embeddings + 3 domains; no biases + fp16 range), both backends run forward
//    and backward from the same weights and batch, then a full step (clipping,
//    weight decay, AdamW), then a few more steps; and AdamW alone on the same
//    parameters, moments and gradients. Each tensor passes when
//      max|candidate - cpu| <= tol · max|cpu|       (tolerances below)
//    and each scalar when |candidate - cpu| <= tol · |cpu|.
// 2. determinism (candidate only): N steps run twice from the same weights,
//    once more on a fresh backend, and a replay from a mid-run snapshot
//    (parameters, moments, update count: what a checkpoint holds) must give
//    the same bits: every step's loss, gradient norm and telemetry, and the
//    final parameters and moments.
// 3. throughput: a GPT-2-small-shaped model (12 layers, width 768, 12 heads,
//    byte vocabulary), tokens/s and model TFLOP/s, as a share of the GPU's
//    dense peak for the precision used (FP32; TF32 tensor cores).
//
// Exit status: 0 everything within tolerance, 1 a tolerance or determinism
// failure, 2 bad flags, 77 no CUDA device (skipped; ctest's SKIP_RETURN_CODE).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "base/splitmix64.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/model_runner.h"

namespace spikeguard::kernels {
namespace {

// Tolerances, relative to the largest |cpu value| of the tensor (or |cpu| for
// scalars). The backends agree on every formula; they differ in the order of
// float32 sums (cuBLAS vs the CPU GEMM, warp trees vs 16-lane sums), which
// moves results by a few ulp per operation.
constexpr double kForwardTol = 2e-5;    // logits, per-token loss and lse
constexpr double kLossTol = 1e-5;       // mean loss and objective
constexpr double kGradTol = 2e-4;       // gradients, per tensor
constexpr double kTelemetryTol = 2e-4;  // gradient norms, activation RMS, max attention logit, domain losses
// The update Δw of one full step, taken from moments as after warm-up (m = 0,
// v = the tensor's mean g², t = 10) so that Δw is smooth in g: a first step
// from zero moments moves each weight by lr·sign(g), and where |g| is at the
// level of rounding noise that sign is noise. lr is 1e-2 there, so that Δw is
// far above the rounding of the weights themselves.
constexpr double kUpdateTol = 1e-3;
constexpr double kTrajectoryTol = 1e-3;  // the loss after 8 further steps
constexpr double kAdamWTol = 1e-6;       // AdamW alone, same inputs

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  double Uniform() { return (static_cast<double>(SplitMix64Hash(state_++) >> 11) + 0.5) * 0x1.0p-53; }
  float Normal() {
    const double r = std::sqrt(-2.0 * std::log(Uniform()));
    return static_cast<float>(r * std::cos(2 * std::numbers::pi * Uniform()));
  }

 private:
  uint64_t state_;
};

// printf into a std::string.
template <typename... Args>
std::string Format(const char* fmt, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

uint64_t HashFloats(const std::vector<float>& v) {
  uint64_t h = SplitMix64Hash(v.size());
  for (float f : v) h = SplitMix64Hash(h ^ std::bit_cast<uint32_t>(f));
  return h;
}

struct Case {
  std::string name;
  RunnerModel model;
  float init_std = 0.02f;
  int batch = 4, seq = 64, domains = 1;
};

// Weights like Trainer::InitParameters, plus noise on gains and biases so the
// gradients of every parameter kind are exercised.
std::vector<float> InitWeights(const ModelRunner& r, const Case& c, uint64_t seed) {
  std::vector<float> w(r.num_parameters());
  Rng rng(seed);
  const float residual_std = c.init_std / std::sqrt(2.0f * c.model.layers);
  for (const RunnerTensor& t : r.tensors()) {
    float* p = w.data() + t.offset;
    const bool gain = t.name.ends_with("_g");
    const bool residual = t.name.ends_with("w_o") || t.name.ends_with("w_proj");
    for (size_t i = 0; i < t.size; ++i) {
      if (gain) {
        p[i] = 1.0f + 0.1f * rng.Normal();
      } else if (t.decay) {
        p[i] = (residual ? residual_std : c.init_std) * rng.Normal();
      } else {
        p[i] = 0.02f * rng.Normal();
      }
    }
  }
  return w;
}

// Printable bytes with repeats, batch·(seq+1) of them.
std::vector<uint8_t> MakeTokens(int batch, int seq, int vocab, uint64_t seed) {
  std::vector<uint8_t> t(static_cast<size_t>(batch) * (seq + 1));
  Rng rng(seed);
  const int lo = vocab > 127 ? 32 : 0, hi = vocab > 127 ? 127 : vocab;
  for (size_t i = 0; i < t.size(); ++i) {
    const bool repeat = i >= 8 && rng.Uniform() < 0.3;
    t[i] = repeat ? t[i - 8] : static_cast<uint8_t>(lo + static_cast<int>(rng.Uniform() * (hi - lo)) % (hi - lo));
  }
  return t;
}

std::vector<int> MakeDomains(int batch, int domains) {
  std::vector<int> d(batch);
  for (int b = 0; b < batch; ++b) d[b] = b % domains;
  return d;
}

// ---- checks ----------------------------------------------------------------

class Checks {
 public:
  void Tensor(const std::string& what, std::span<const float> ref, std::span<const float> got, double tol) {
    double max_abs = 0, max_ref = 0, max_rel = 0;
    bool mismatch = ref.size() != got.size();
    for (size_t i = 0; i < ref.size() && !mismatch; ++i) max_ref = std::max<double>(max_ref, std::fabs(ref[i]));
    for (size_t i = 0; i < ref.size() && !mismatch; ++i) {
      const double a = ref[i], b = got[i];
      if (!std::isfinite(a) || !std::isfinite(b)) {  // NaN with NaN, ±Inf with the same ±Inf
        mismatch |= !(std::isnan(a) && std::isnan(b)) && a != b;
        continue;
      }
      const double d = std::fabs(a - b);
      max_abs = std::max(max_abs, d);
      if (std::fabs(a) >= 1e-3 * max_ref) max_rel = std::max(max_rel, d / std::fabs(a));
    }
    const double norm = max_ref > 0 ? max_abs / max_ref : max_abs;
    const bool ok = !mismatch && norm <= tol;
    Print(what, ok, "max_abs %.3e  max|ref| %.3e  err/max|ref| %.3e  (tol %.0e)  max_rel %.3e%s", max_abs, max_ref,
          norm, tol, max_rel, mismatch ? "  NON-FINITE MISMATCH" : "");
  }

  void Scalar(const std::string& what, double ref, double got, double tol) {
    const double d = std::fabs(ref - got);
    const bool same_nonfinite = !std::isfinite(ref) && (std::isnan(ref) ? std::isnan(got) : ref == got);
    const bool ok = same_nonfinite || (std::isfinite(got) && d <= tol * std::fabs(ref));
    Print(what, ok, "cpu %.9g  candidate %.9g  rel %.3e  (tol %.0e)", ref, got, ref != 0 ? d / std::fabs(ref) : d, tol);
  }

  void Exact(const std::string& what, bool equal, const std::string& detail) {
    Print(what, equal, "%s", detail.c_str());
  }

  int failures() const { return failures_; }
  int count() const { return count_; }

 private:
  template <typename... Args>
  void Print(const std::string& what, bool ok, const char* fmt, Args... args) {
    ++count_;
    if (!ok) ++failures_;
    char buf[512];
    std::snprintf(buf, sizeof(buf), fmt, args...);
    std::printf("  %-4s %-34s %s\n", ok ? "ok" : "FAIL", what.c_str(), buf);
  }

  int failures_ = 0, count_ = 0;
};

// ---- flags -----------------------------------------------------------------

struct Flags {
  bool quick = false;
  std::string only;                // "", compare, determinism, throughput
  std::string candidate = "cuda";  // cuda, cpu
  int steps = 12;                  // determinism
  int bench_batch = 16, bench_seq = 256, bench_layers = 12, bench_width = 768, bench_heads = 12;
  int bench_steps = 6;
  int threads = 0;     // CPU reference threads; 0 = hardware, at most 16
  int noise_ulps = 4;  // --candidate=cpu-noisy
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&](std::string_view name) -> std::optional<std::string> {
      const std::string prefix = "--" + std::string(name) + "=";
      if (a.substr(0, prefix.size()) == prefix) return std::string(a.substr(prefix.size()));
      return std::nullopt;
    };
    std::optional<std::string> v;
    if (a == "--quick") {
      f->quick = true;
    } else if ((v = value("only"))) {
      f->only = *v;
    } else if ((v = value("candidate"))) {
      f->candidate = *v;
    } else if ((v = value("steps"))) {
      f->steps = std::stoi(*v);
    } else if ((v = value("bench_batch"))) {
      f->bench_batch = std::stoi(*v);
    } else if ((v = value("bench_seq"))) {
      f->bench_seq = std::stoi(*v);
    } else if ((v = value("bench_layers"))) {
      f->bench_layers = std::stoi(*v);
    } else if ((v = value("bench_width"))) {
      f->bench_width = std::stoi(*v);
    } else if ((v = value("bench_heads"))) {
      f->bench_heads = std::stoi(*v);
    } else if ((v = value("bench_steps"))) {
      f->bench_steps = std::stoi(*v);
    } else if ((v = value("noise_ulps"))) {
      f->noise_ulps = std::stoi(*v);
    } else if ((v = value("threads"))) {
      f->threads = std::stoi(*v);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return false;
    }
  }
  if (f->candidate != "cuda" && f->candidate != "cpu" && f->candidate != "cpu-noisy") {
    std::fprintf(stderr, "--candidate must be cuda, cpu or cpu-noisy\n");
    return false;
  }
  if (!f->only.empty() && f->only != "compare" && f->only != "determinism" && f->only != "throughput") {
    std::fprintf(stderr, "--only must be compare, determinism or throughput\n");
    return false;
  }
  return true;
}

// The CPU backend with every float output moved by up to `ulps` units in the
// last place (a fixed pseudo-random pattern): a stand-in for a backend that
// sums in another order. If the compare fails against it, the tolerances are
// tighter than float32 rounding allows.
class NoisyBackend final : public Backend {
 public:
  NoisyBackend(std::unique_ptr<Backend> inner, int ulps) : in_(std::move(inner)), ulps_(ulps) {}
  std::string name() const override { return "cpu-noisy"; }
  int threads() const override { return in_->threads(); }
  void MatmulForward(float* y, const float* x, const float* w, const float* b, int rows, int in, int out) override {
    in_->MatmulForward(y, x, w, b, rows, in, out);
    Jitter(y, static_cast<size_t>(rows) * out);
  }
  void MatmulBackward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, int rows,
                      int in, int out) override {
    in_->MatmulBackward(dx, dw, db, dy, x, w, rows, in, out);
    if (dx != nullptr) Jitter(dx, static_cast<size_t>(rows) * in);
    Jitter(dw, static_cast<size_t>(in) * out);
    if (db != nullptr) Jitter(db, out);
  }
  void LayerNormForward(float* y, float* mean, float* rstd, const float* x, const float* g, const float* b, int rows,
                        int dim) override {
    in_->LayerNormForward(y, mean, rstd, x, g, b, rows, dim);
    Jitter(y, static_cast<size_t>(rows) * dim);
  }
  void LayerNormBackward(float* dx, float* dg, float* db, const float* dy, const float* x, const float* mean,
                         const float* rstd, const float* g, int rows, int dim) override {
    in_->LayerNormBackward(dx, dg, db, dy, x, mean, rstd, g, rows, dim);
    Jitter(dx, static_cast<size_t>(rows) * dim);
    Jitter(dg, dim);
    if (db != nullptr) Jitter(db, dim);
  }
  void GeluForward(float* y, const float* x, size_t n) override {
    in_->GeluForward(y, x, n);
    Jitter(y, n);
  }
  void GeluBackward(float* dx, const float* dy, const float* x, size_t n) override {
    in_->GeluBackward(dx, dy, x, n);
    Jitter(dx, n);
  }
  void EmbeddingForward(float* x, const int32_t* t, const float* wte, const float* wpe, int b, int s, int d) override {
    in_->EmbeddingForward(x, t, wte, wpe, b, s, d);
  }
  void EmbeddingBackward(float* dwte, float* dwpe, const float* dx, const int32_t* t, int b, int s, int d) override {
    in_->EmbeddingBackward(dwte, dwpe, dx, t, b, s, d);
  }
  void Add(float* y, const float* a, const float* b, size_t n) override { in_->Add(y, a, b, n); }
  void Fp16Overflow(float* x, size_t n) override { in_->Fp16Overflow(x, n); }
  void RowsToHeads(float* h, const float* r, int stride, int b, int s, int nh, int hd) override {
    in_->RowsToHeads(h, r, stride, b, s, nh, hd);
  }
  void HeadsToRows(float* r, int stride, const float* h, int b, int s, int nh, int hd) override {
    in_->HeadsToRows(r, stride, h, b, s, nh, hd);
  }
  void Zero(float* x, size_t n) override { in_->Zero(x, n); }
  void AttentionForward(float* out, float* logits, float* probs, float* row_max, const float* q, const float* k,
                        const float* v, const AttentionShape& s) override {
    in_->AttentionForward(out, logits, probs, row_max, q, k, v, s);
    Jitter(out, static_cast<size_t>(s.batch) * s.heads * s.seq * s.head_dim);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                         const float* v, const float* logits, const float* probs, const AttentionShape& s) override {
    in_->AttentionBackward(dq, dk, dv, dout, q, k, v, logits, probs, s);
    const size_t n = static_cast<size_t>(s.batch) * s.heads * s.seq * s.head_dim;
    Jitter(dq, n);
    Jitter(dk, n);
    Jitter(dv, n);
  }
  void SoftmaxCrossEntropy(float* dlogits, float* loss, float* lse, const float* logits, const int32_t* targets,
                           int rows, int vocab, float softcap, float z_loss, float grad_scale) override {
    in_->SoftmaxCrossEntropy(dlogits, loss, lse, logits, targets, rows, vocab, softcap, z_loss, grad_scale);
    if (dlogits != nullptr) Jitter(dlogits, static_cast<size_t>(rows) * vocab);
    Jitter(loss, rows);
    Jitter(lse, rows);
  }
  void AdamW(float* p, float* m, float* v, const float* g, size_t n, const AdamWArgs& a, bool decay, double* dsq,
             double* psq) override {
    in_->AdamW(p, m, v, g, n, a, decay, dsq, psq);
    Jitter(m, n);
  }
  double SumSquares(const float* x, size_t n) override { return in_->SumSquares(x, n); }
  int64_t CountNonFinite(const float* x, size_t n) override { return in_->CountNonFinite(x, n); }

 private:
  void Jitter(float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = SplitMix64Hash(state_++);
      const int steps = static_cast<int>(r % (2 * ulps_ + 1)) - ulps_;
      for (int s = 0; s < std::abs(steps); ++s) x[i] = std::nextafter(x[i], steps > 0 ? INFINITY : -INFINITY);
    }
  }
  std::unique_ptr<Backend> in_;
  int ulps_;
  uint64_t state_ = 1;
};

std::unique_ptr<Backend> MakeCandidate(const Flags& f, bool tf32 = false) {
  if (f.candidate == "cpu") return MakeCpuBackend(1);
  if (f.candidate == "cpu-noisy") return std::make_unique<NoisyBackend>(MakeCpuBackend(1), f.noise_ulps);
  return MakeCudaBackend({.device = 0, .tf32 = tf32});
}

int ReferenceThreads(const Flags& f) {
  if (f.threads > 0) return f.threads;
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
}

std::vector<Case> CompareCases() {
  std::vector<Case> cases;
  Case plain;
  plain.name = "plain";
  plain.model = {.vocab = 256, .layers = 2, .heads = 4, .width = 128, .context = 64};
  cases.push_back(plain);
  Case stab;
  stab.name = "qknorm+softcaps+zloss+tied";
  stab.model = {.vocab = 256,
                .layers = 2,
                .heads = 4,
                .width = 128,
                .context = 64,
                .qk_norm = true,
                .tie_embeddings = true,
                .z_loss = 1e-3f,
                .attn_softcap = 2.0f,
                .logit_softcap = 1.5f};
  stab.init_std = 0.1f;  // logits large enough for the caps to bend them
  stab.domains = 3;
  cases.push_back(stab);
  Case fp16;
  fp16.name = "nobias+fp16range";
  fp16.model = {
      .vocab = 200, .layers = 2, .heads = 2, .width = 96, .context = 48, .bias = false, .fp16_emulation = true};
  fp16.seq = 48;
  fp16.batch = 3;
  cases.push_back(fp16);
  return cases;
}

// ---- 0. kernel by kernel -------------------------------------------------------
// Each Backend call alone on random inputs, with shapes that are not multiples
// of a warp or a block, and outputs that accumulate pre-filled with noise: a
// difference found here names the kernel, before the model-level compare.

// One buffer with the same contents on the reference and on the candidate.
template <typename T>
class Twin {
 public:
  Twin(Backend& ref, Backend& cand, const std::vector<T>& init) : ref_(ref), cand_(cand), n_(init.size()) {
    r_ = static_cast<T*>(ref.Allocate(n_ * sizeof(T)));
    c_ = static_cast<T*>(cand.Allocate(n_ * sizeof(T)));
    ref.CopyIn(r_, init.data(), n_ * sizeof(T));
    cand.CopyIn(c_, init.data(), n_ * sizeof(T));
  }
  ~Twin() {
    ref_.Free(r_);
    cand_.Free(c_);
  }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;
  T* r() const { return r_; }
  T* c() const { return c_; }
  std::vector<T> HostRef() const { return Host(ref_, r_); }
  std::vector<T> HostCand() const { return Host(cand_, c_); }

 private:
  std::vector<T> Host(Backend& be, const T* p) const {
    std::vector<T> h(n_);
    be.CopyOut(h.data(), p, n_ * sizeof(T));
    return h;
  }
  Backend& ref_;
  Backend& cand_;
  size_t n_;
  T* r_ = nullptr;
  T* c_ = nullptr;
};

std::vector<float> Noise(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.Normal();
  return v;
}

constexpr double kKernelTol = 2e-5;

void CompareKernels(const Flags& flags, Checks& checks) {
  std::printf("kernels one by one\n");
  std::unique_ptr<Backend> ref_be = MakeCpuBackend(ReferenceThreads(flags));
  std::unique_ptr<Backend> cand_be = MakeCandidate(flags);
  Backend& R = *ref_be;
  Backend& G = *cand_be;
  auto same = [&](const std::string& what, const Twin<float>& t, double tol = kKernelTol) {
    checks.Tensor("kernel " + what, t.HostRef(), t.HostCand(), tol);
  };
  {  // MatmulForward and MatmulBackward, rows 70, in 50, out 90
    const int rows = 70, in = 50, out = 90;
    Twin<float> x(R, G, Noise(rows * in, 1)), w(R, G, Noise(in * out, 2, 0.2f)), bias(R, G, Noise(out, 3));
    Twin<float> y(R, G, Noise(rows * out, 4)), y2(R, G, Noise(rows * out, 5));
    R.MatmulForward(y.r(), x.r(), w.r(), bias.r(), rows, in, out);
    G.MatmulForward(y.c(), x.c(), w.c(), bias.c(), rows, in, out);
    same("MatmulForward (bias)", y);
    R.MatmulForward(y2.r(), x.r(), w.r(), nullptr, rows, in, out);
    G.MatmulForward(y2.c(), x.c(), w.c(), nullptr, rows, in, out);
    same("MatmulForward", y2);
    Twin<float> dy(R, G, Noise(rows * out, 6)), dx(R, G, Noise(rows * in, 7)), dw(R, G, Noise(in * out, 8)),
        db(R, G, Noise(out, 9));
    R.MatmulBackward(dx.r(), dw.r(), db.r(), dy.r(), x.r(), w.r(), rows, in, out);
    G.MatmulBackward(dx.c(), dw.c(), db.c(), dy.c(), x.c(), w.c(), rows, in, out);
    same("MatmulBackward dx", dx);
    same("MatmulBackward dw (+=)", dw);
    same("MatmulBackward dbias (+=)", db);
  }
  {  // LayerNorm, rows 37, dim 72 (and 37·3 rows of 24, the qk-norm shape)
    for (const auto& [rows, dim, with_b] : {std::tuple{37, 72, true}, std::tuple{111, 24, false}}) {
      const std::string s = Format("(%dx%d%s)", rows, dim, with_b ? ", bias" : "");
      Twin<float> x(R, G, Noise(rows * dim, 10, 2.0f)), g(R, G, Noise(dim, 11)), b(R, G, Noise(dim, 12));
      Twin<float> y(R, G, Noise(rows * dim, 13)), mean(R, G, Noise(rows, 14)), rstd(R, G, Noise(rows, 15));
      R.LayerNormForward(y.r(), mean.r(), rstd.r(), x.r(), g.r(), with_b ? b.r() : nullptr, rows, dim);
      G.LayerNormForward(y.c(), mean.c(), rstd.c(), x.c(), g.c(), with_b ? b.c() : nullptr, rows, dim);
      same("LayerNormForward y " + s, y);
      same("LayerNormForward mean " + s, mean);
      same("LayerNormForward rstd " + s, rstd);
      Twin<float> dy(R, G, Noise(rows * dim, 16)), dx(R, G, Noise(rows * dim, 17)), dg(R, G, Noise(dim, 18)),
          db(R, G, Noise(dim, 19));
      // Both sides from the reference's mean and rstd, so only the backward differs.
      const std::vector<float> m = mean.HostRef(), r = rstd.HostRef();
      G.CopyIn(mean.c(), m.data(), m.size() * sizeof(float));
      G.CopyIn(rstd.c(), r.data(), r.size() * sizeof(float));
      R.LayerNormBackward(dx.r(), dg.r(), with_b ? db.r() : nullptr, dy.r(), x.r(), mean.r(), rstd.r(), g.r(), rows,
                          dim);
      G.LayerNormBackward(dx.c(), dg.c(), with_b ? db.c() : nullptr, dy.c(), x.c(), mean.c(), rstd.c(), g.c(), rows,
                          dim);
      same("LayerNormBackward dx (+=) " + s, dx);
      same("LayerNormBackward dg (+=) " + s, dg);
      if (with_b) same("LayerNormBackward db (+=) " + s, db);
    }
  }
  {  // GELU, Add, Fp16Overflow, Zero: n = 1000
    const int n = 1000;
    Twin<float> x(R, G, Noise(n, 20, 3.0f)), y(R, G, Noise(n, 21)), dy(R, G, Noise(n, 22));
    R.GeluForward(y.r(), x.r(), n);
    G.GeluForward(y.c(), x.c(), n);
    same("GeluForward", y);
    R.GeluBackward(dy.r(), dy.r(), x.r(), n);  // in place, as the trainer calls it
    G.GeluBackward(dy.c(), dy.c(), x.c(), n);
    same("GeluBackward (in place)", dy);
    R.Add(y.r(), y.r(), x.r(), n);
    G.Add(y.c(), y.c(), x.c(), n);
    same("Add (in place)", y);
    Twin<float> big(R, G, Noise(n, 23, 70000.0f));
    R.Fp16Overflow(big.r(), n);
    G.Fp16Overflow(big.c(), n);
    checks.Exact("kernel Fp16Overflow", big.HostRef() == big.HostCand(), "bit-identical expected");
    R.Zero(big.r(), n / 2);
    G.Zero(big.c(), n / 2);
    checks.Exact("kernel Zero", big.HostRef() == big.HostCand(), "bit-identical expected");
  }
  {  // Embedding: B 3, T 17, C 40, vocab 50 (tokens repeat)
    const int B = 3, T = 17, C = 40, V = 50;
    std::vector<int32_t> tok(B * T);
    for (int i = 0; i < B * T; ++i) tok[i] = static_cast<int32_t>(SplitMix64Hash(i) % 7 == 0 ? 3 : SplitMix64Hash(i + 99) % V);
    Twin<int32_t> tokens(R, G, tok);
    Twin<float> wte(R, G, Noise(V * C, 24)), wpe(R, G, Noise(T * C, 25)), x(R, G, Noise(B * T * C, 26));
    R.EmbeddingForward(x.r(), tokens.r(), wte.r(), wpe.r(), B, T, C);
    G.EmbeddingForward(x.c(), tokens.c(), wte.c(), wpe.c(), B, T, C);
    checks.Exact("kernel EmbeddingForward", x.HostRef() == x.HostCand(), "bit-identical expected");
    Twin<float> dwte(R, G, Noise(V * C, 27)), dwpe(R, G, Noise(T * C, 28)), dx(R, G, Noise(B * T * C, 29));
    R.EmbeddingBackward(dwte.r(), dwpe.r(), dx.r(), tokens.r(), B, T, C);
    G.EmbeddingBackward(dwte.c(), dwpe.c(), dx.c(), tokens.c(), B, T, C);
    // Same order of additions as the CPU: bit-identical.
    checks.Exact("kernel EmbeddingBackward dwte (+=)", dwte.HostRef() == dwte.HostCand(), "bit-identical expected");
    checks.Exact("kernel EmbeddingBackward dwpe (+=)", dwpe.HostRef() == dwpe.HostCand(), "bit-identical expected");
  }
  {  // Layout: B 2, T 9, H 3, head_dim 8, from the k third of a qkv row
    const int B = 2, T = 9, H = 3, D = 8, C = H * D;
    Twin<float> qkv(R, G, Noise(B * T * 3 * C, 30)), heads(R, G, Noise(B * T * C, 31));
    R.RowsToHeads(heads.r(), qkv.r() + C, 3 * C, B, T, H, D);
    G.RowsToHeads(heads.c(), qkv.c() + C, 3 * C, B, T, H, D);
    checks.Exact("kernel RowsToHeads", heads.HostRef() == heads.HostCand(), "bit-identical expected");
    Twin<float> back(R, G, Noise(B * T * 3 * C, 32));
    R.HeadsToRows(back.r() + 2 * C, 3 * C, heads.r(), B, T, H, D);
    G.HeadsToRows(back.c() + 2 * C, 3 * C, heads.c(), B, T, H, D);
    checks.Exact("kernel HeadsToRows", back.HostRef() == back.HostCand(), "bit-identical expected");
  }
  // Attention: B 2, H 3, T 45, D 40; plain, soft-capped, fp16 range.
  for (const auto& [softcap, fp16] : {std::pair{0.0f, false}, std::pair{1.5f, false}, std::pair{0.0f, true}}) {
    const int B = 2, H = 3, T = 45, D = 40;
    const size_t hsz = static_cast<size_t>(B) * H * T * D, ssz = static_cast<size_t>(B) * H * T * T;
    const std::string s = softcap > 0 ? " (softcap)" : fp16 ? " (fp16 range)" : "";
    const AttentionShape shape{.batch = B,
                               .heads = H,
                               .seq = T,
                               .head_dim = D,
                               .scale = 1.0f / std::sqrt(static_cast<float>(D)),
                               .softcap = softcap,
                               .fp16_overflow = fp16};
    Twin<float> q(R, G, Noise(hsz, 33, 1.5f)), k(R, G, Noise(hsz, 34, 1.5f)), v(R, G, Noise(hsz, 35));
    Twin<float> out(R, G, Noise(hsz, 36)), logits(R, G, std::vector<float>(ssz)), probs(R, G, Noise(ssz, 37));
    Twin<float> row_max(R, G, Noise(static_cast<size_t>(B) * H * T, 38));
    R.AttentionForward(out.r(), logits.r(), probs.r(), row_max.r(), q.r(), k.r(), v.r(), shape);
    G.AttentionForward(out.c(), logits.c(), probs.c(), row_max.c(), q.c(), k.c(), v.c(), shape);
    same("AttentionForward out" + s, out);
    same("AttentionForward probs" + s, probs);
    same("AttentionForward row_max" + s, row_max);
    // Logits above the diagonal are unspecified: compare the causal part.
    std::vector<float> lr = logits.HostRef(), lc = logits.HostCand();
    for (size_t i = 0; i < ssz; ++i) {
      if (static_cast<int>(i % T) > static_cast<int>((i / T) % T)) lr[i] = lc[i] = 0;
    }
    checks.Tensor("kernel AttentionForward logits (causal)" + s, lr, lc, kKernelTol);
    // Backward from the reference's saved logits and probabilities.
    const std::vector<float> pr = probs.HostRef();
    const std::vector<float> lfull = logits.HostRef();
    G.CopyIn(probs.c(), pr.data(), ssz * sizeof(float));
    G.CopyIn(logits.c(), lfull.data(), ssz * sizeof(float));
    Twin<float> dout(R, G, Noise(hsz, 39)), dq(R, G, Noise(hsz, 40)), dk(R, G, Noise(hsz, 41)),
        dv(R, G, Noise(hsz, 42));
    R.AttentionBackward(dq.r(), dk.r(), dv.r(), dout.r(), q.r(), k.r(), v.r(), logits.r(), probs.r(), shape);
    G.AttentionBackward(dq.c(), dk.c(), dv.c(), dout.c(), q.c(), k.c(), v.c(), logits.c(), probs.c(), shape);
    same("AttentionBackward dq" + s, dq);
    same("AttentionBackward dk" + s, dk);
    same("AttentionBackward dv" + s, dv);
  }
  // Cross-entropy: rows 33, vocab 77; plain, and soft-cap with z-loss and
  // dlogits aliasing the logits (as the trainer may).
  for (const bool capped : {false, true}) {
    const int rows = 33, V = 77;
    const float softcap = capped ? 2.5f : 0.0f, z = capped ? 1e-2f : 0.0f;
    const std::string s = capped ? " (softcap, z-loss, in place)" : "";
    std::vector<int32_t> tgt(rows);
    for (int i = 0; i < rows; ++i) tgt[i] = static_cast<int32_t>(SplitMix64Hash(i + 7) % V);
    Twin<int32_t> targets(R, G, tgt);
    Twin<float> logits(R, G, Noise(rows * V, 43, 3.0f)), loss(R, G, Noise(rows, 44)), lse(R, G, Noise(rows, 45));
    Twin<float> dl(R, G, Noise(rows * V, 46));
    float* dr = capped ? logits.r() : dl.r();
    float* dc = capped ? logits.c() : dl.c();
    R.SoftmaxCrossEntropy(dr, loss.r(), lse.r(), logits.r(), targets.r(), rows, V, softcap, z, 1.0f / rows);
    G.SoftmaxCrossEntropy(dc, loss.c(), lse.c(), logits.c(), targets.c(), rows, V, softcap, z, 1.0f / rows);
    same("SoftmaxCrossEntropy loss" + s, loss);
    same("SoftmaxCrossEntropy lse" + s, lse);
    same("SoftmaxCrossEntropy dlogits" + s, capped ? logits : dl);
  }
  {  // Reductions: n = 3·4096 + 7, with three non-finite values
    const size_t n = 3 * 4096 + 7;
    std::vector<float> x = Noise(n, 47);
    Twin<float> a(R, G, x);
    checks.Scalar("kernel SumSquares", R.SumSquares(a.r(), n), G.SumSquares(a.c(), n), 1e-12);
    x[5] = std::numeric_limits<float>::infinity();
    x[4096] = -std::numeric_limits<float>::infinity();
    x[n - 1] = std::numeric_limits<float>::quiet_NaN();
    Twin<float> b(R, G, x);
    const int64_t cr = R.CountNonFinite(b.r(), n), cc = G.CountNonFinite(b.c(), n);
    checks.Exact("kernel CountNonFinite", cr == cc && cr == 3,
                 Format("%lld vs %lld", static_cast<long long>(cr), static_cast<long long>(cc)));
  }
}

// ---- 1. compare --------------------------------------------------------------

void CompareCase(const Case& c, const Flags& flags, Checks& checks) {
  std::printf("case %s: B=%d T=%d width=%d layers=%d heads=%d vocab=%d\n", c.name.c_str(), c.batch, c.seq,
              c.model.width, c.model.layers, c.model.heads, c.model.vocab);
  std::unique_ptr<Backend> cpu = MakeCpuBackend(ReferenceThreads(flags));
  std::unique_ptr<Backend> cand = MakeCandidate(flags);
  ModelRunner rc(c.model, *cpu, c.batch, c.seq), rg(c.model, *cand, c.batch, c.seq);
  const std::vector<float> w = InitWeights(rc, c, 7);
  const std::vector<uint8_t> tokens = MakeTokens(c.batch, c.seq, c.model.vocab, 11);
  const std::vector<int> domains = MakeDomains(c.batch, c.domains);
  rc.SetParameters(w);
  rg.SetParameters(w);

  // Forward and backward.
  const ModelRunner::Loss lc = rc.Forward(tokens, true), lg = rg.Forward(tokens, true);
  checks.Scalar("loss", lc.cross_entropy, lg.cross_entropy, kLossTol);
  checks.Scalar("objective (with z-loss)", lc.objective, lg.objective, kLossTol);
  checks.Tensor("logits", rc.Logits(), rg.Logits(), kForwardTol);
  checks.Tensor("per-token loss", rc.Losses(), rg.Losses(), kForwardTol);
  checks.Tensor("per-token lse", rc.Lse(), rg.Lse(), kForwardTol);
  const std::vector<float> gc = rc.Gradients(), gg = rg.Gradients();
  for (const RunnerTensor& t : rc.tensors()) {
    checks.Tensor("grad " + t.name, std::span(gc).subspan(t.offset, t.size), std::span(gg).subspan(t.offset, t.size),
                  kGradTol);
  }

  // One full step from the same weights: clipping, weight decay, AdamW, telemetry.
  std::vector<float> m0(w.size(), 0.0f), v0(w.size());
  for (const RunnerTensor& t : rc.tensors()) {
    double sq = 0;
    for (size_t i = t.offset; i < t.offset + t.size; ++i) sq += static_cast<double>(gc[i]) * gc[i];
    // v̂ = v/(1 - β2^10) then starts near the tensor's mean g².
    std::fill_n(v0.begin() + t.offset, t.size, static_cast<float>(sq / t.size * (1 - std::pow(0.999, 10))));
  }
  rc.SetOptimizerState(m0, v0, 10);
  rg.SetOptimizerState(m0, v0, 10);
  // lr 1e-2: updates of ~1e-3, far above the rounding of a weight near 1 (1.2e-7).
  const RunnerOptim step_opt{.lr = 1e-2f, .weight_decay = 0.1f, .clip_norm = 0.5f};
  const RunnerOptim opt{.lr = 1e-3f, .weight_decay = 0.1f, .clip_norm = 0.5f};
  const RunnerStepResult sc = rc.Step(tokens, domains, c.domains, step_opt);
  const RunnerStepResult sg = rg.Step(tokens, domains, c.domains, step_opt);
  checks.Scalar("step grad_norm", sc.grad_norm, sg.grad_norm, kTelemetryTol);
  checks.Exact("step clipped", sc.clipped == sg.clipped, sc.clipped ? "both clipped" : "clipped differs or neither");
  checks.Exact(
      "step nonfinite_count", sc.nonfinite_count == sg.nonfinite_count,
      Format("%lld vs %lld", static_cast<long long>(sc.nonfinite_count), static_cast<long long>(sg.nonfinite_count)));
  checks.Scalar("step lse_mean", sc.lse_mean, sg.lse_mean, kTelemetryTol);
  checks.Scalar("step lse_max", sc.lse_max, sg.lse_max, kTelemetryTol);
  for (int d = 0; d < c.domains; ++d) {
    checks.Scalar(Format("step domain_loss[%d]", d), sc.domain_loss[d], sg.domain_loss[d], kTelemetryTol);
  }
  for (size_t l = 0; l < sc.layers.size(); ++l) {
    const std::string p = Format("step layer%zu.", l);
    checks.Scalar(p + "max_attn_logit", sc.layers[l].max_attn_logit, sg.layers[l].max_attn_logit, kTelemetryTol);
    checks.Scalar(p + "grad_norm", sc.layers[l].grad_norm, sg.layers[l].grad_norm, kTelemetryTol);
    checks.Scalar(p + "update_ratio", sc.layers[l].update_ratio, sg.layers[l].update_ratio, 1e-2);
    checks.Scalar(p + "act_rms", sc.layers[l].act_rms, sg.layers[l].act_rms, kTelemetryTol);
    checks.Scalar(p + "param_norm", sc.layers[l].param_norm, sg.layers[l].param_norm, 1e-9);
  }
  const std::vector<float> pc = rc.Parameters(), pg = rg.Parameters();
  std::vector<float> dc(w.size()), dg(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    dc[i] = pc[i] - w[i];
    dg[i] = pg[i] - w[i];
  }
  for (const RunnerTensor& t : rc.tensors()) {
    checks.Tensor("update " + t.name, std::span(dc).subspan(t.offset, t.size), std::span(dg).subspan(t.offset, t.size),
                  kUpdateTol);
  }

  // A short trajectory: the loss after 8 more steps on new batches.
  double worst = 0, last_c = 0, last_g = 0;
  for (int s = 1; s <= 8; ++s) {
    const std::vector<uint8_t> b = MakeTokens(c.batch, c.seq, c.model.vocab, 100 + s);
    last_c = rc.Step(b, domains, c.domains, opt).loss;
    last_g = rg.Step(b, domains, c.domains, opt).loss;
    worst = std::max(worst, std::fabs(last_c - last_g) / std::fabs(last_c));
  }
  checks.Scalar("loss after 8 more steps", last_c, last_g, kTrajectoryTol);
  std::printf("       (largest relative loss difference over those steps: %.3e)\n", worst);
}

// AdamW alone on the same parameters, moments and gradients (t = 7, decay,
// grad_scale as after clipping).
void CompareAdamW(const Flags& flags, Checks& checks) {
  std::printf("case adamw: n=1048613 t=7 lr=1e-3 weight_decay=0.1 grad_scale=0.7\n");
  const size_t n = (size_t{1} << 20) + 37;
  Rng rng(3);
  std::vector<float> p(n), m(n), v(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = rng.Normal();
    g[i] = 1e-2f * rng.Normal();
    m[i] = 1e-2f * rng.Normal();
    const float s = 1e-2f * rng.Normal();
    v[i] = s * s;
  }
  const AdamWArgs args{.lr = 1e-3f, .weight_decay = 0.1f, .grad_scale = 0.7f, .t = 7};
  struct Out {
    std::vector<float> p, m, v;
    double delta_sq = 0, param_sq = 0;
  };
  auto run = [&](Backend& be) {
    const size_t bytes = n * sizeof(float);
    float* bp = static_cast<float*>(be.Allocate(bytes));
    float* bm = static_cast<float*>(be.Allocate(bytes));
    float* bv = static_cast<float*>(be.Allocate(bytes));
    float* bg = static_cast<float*>(be.Allocate(bytes));
    be.CopyIn(bp, p.data(), bytes);
    be.CopyIn(bm, m.data(), bytes);
    be.CopyIn(bv, v.data(), bytes);
    be.CopyIn(bg, g.data(), bytes);
    Out o;
    be.AdamW(bp, bm, bv, bg, n, args, /*decay=*/true, &o.delta_sq, &o.param_sq);
    o.p.resize(n);
    o.m.resize(n);
    o.v.resize(n);
    be.CopyOut(o.p.data(), bp, bytes);
    be.CopyOut(o.m.data(), bm, bytes);
    be.CopyOut(o.v.data(), bv, bytes);
    for (float* b : {bp, bm, bv, bg}) be.Free(b);
    return o;
  };
  std::unique_ptr<Backend> cpu = MakeCpuBackend(ReferenceThreads(flags));
  std::unique_ptr<Backend> cand = MakeCandidate(flags);
  const Out oc = run(*cpu), og = run(*cand);
  checks.Tensor("adamw param", oc.p, og.p, kAdamWTol);
  checks.Tensor("adamw m", oc.m, og.m, kAdamWTol);
  checks.Tensor("adamw v", oc.v, og.v, kAdamWTol);
  checks.Scalar("adamw Σ Δ²", oc.delta_sq, og.delta_sq, 1e-5);
  checks.Scalar("adamw Σ w²", oc.param_sq, og.param_sq, 1e-12);
}

// ---- 2. determinism ------------------------------------------------------------

struct Trace {
  std::vector<uint64_t> bits;  // per step: loss, grad_norm, lse_max, per-layer telemetry
  std::vector<float> params, m, v;
  int64_t updates = 0;
};

struct Snapshot {
  std::vector<float> params, m, v;
  int64_t updates = 0;
};

// Steps [from, to) of a run; the batch of step s depends on s alone.
Trace RunSteps(ModelRunner& r, const Case& c, int from, int to, Snapshot* snapshot_at_mid, int mid) {
  Trace t;
  const RunnerOptim opt{.lr = 3e-3f, .weight_decay = 0.1f, .clip_norm = 1.0f};
  const std::vector<int> domains = MakeDomains(c.batch, c.domains);
  for (int s = from; s < to; ++s) {
    if (snapshot_at_mid != nullptr && s == mid) {
      *snapshot_at_mid = {r.Parameters(), r.FirstMoments(), r.SecondMoments(), r.optimizer_updates()};
    }
    const RunnerStepResult x = r.Step(MakeTokens(c.batch, c.seq, c.model.vocab, 1000 + s), domains, c.domains, opt);
    for (double d : {x.loss, x.grad_norm, x.lse_max, x.lse_mean}) t.bits.push_back(std::bit_cast<uint64_t>(d));
    for (const auto& l : x.layers) {
      for (double d : {l.max_attn_logit, l.grad_norm, l.update_ratio, l.act_rms}) {
        t.bits.push_back(std::bit_cast<uint64_t>(d));
      }
    }
  }
  t.params = r.Parameters();
  t.m = r.FirstMoments();
  t.v = r.SecondMoments();
  t.updates = r.optimizer_updates();
  return t;
}

void CheckDeterminism(const Case& c, const Flags& flags, Checks& checks) {
  const int steps = flags.steps, mid = flags.steps / 2;
  std::printf("determinism %s: B=%d T=%d width=%d layers=%d, %d steps, snapshot at step %d\n", c.name.c_str(), c.batch,
              c.seq, c.model.width, c.model.layers, steps, mid);
  std::unique_ptr<Backend> be = MakeCandidate(flags);
  std::vector<float> w;
  Snapshot snap;
  Trace a, b;
  {
    ModelRunner r(c.model, *be, c.batch, c.seq);
    w = InitWeights(r, c, 21);
    r.SetParameters(w);
    a = RunSteps(r, c, 0, steps, &snap, mid);
  }
  {
    ModelRunner r(c.model, *be, c.batch, c.seq);
    r.SetParameters(w);
    b = RunSteps(r, c, 0, steps, nullptr, -1);
  }
  auto same = [](const Trace& x, const Trace& y, size_t skip_bits) {
    return std::equal(x.bits.begin() + skip_bits, x.bits.end(), y.bits.begin(), y.bits.end()) && x.params == y.params &&
           x.m == y.m && x.v == y.v && x.updates == y.updates;
  };
  auto detail = [&](const Trace& x) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "params %016llx  m %016llx  v %016llx  %zu telemetry values",
                  static_cast<unsigned long long>(HashFloats(x.params)),
                  static_cast<unsigned long long>(HashFloats(x.m)), static_cast<unsigned long long>(HashFloats(x.v)),
                  x.bits.size());
    return std::string(buf);
  };
  std::printf("       run 1: %s\n", detail(a).c_str());
  checks.Exact("rerun, same backend: bit-exact", same(a, b, 0), detail(b));
  std::unique_ptr<Backend> fresh = MakeCandidate(flags);
  Trace replay;
  {
    ModelRunner r(c.model, *fresh, c.batch, c.seq);
    r.SetParameters(snap.params);
    r.SetOptimizerState(snap.m, snap.v, snap.updates);
    replay = RunSteps(r, c, mid, steps, nullptr, -1);
  }
  // The replay starts at `mid`: compare the telemetry of steps mid.. only.
  const size_t per_step = a.bits.size() / steps;
  checks.Exact("replay from snapshot, fresh backend: bit-exact", same(a, replay, per_step * mid), detail(replay));
}

// ---- 3. throughput -----------------------------------------------------------------

struct Peak {
  double fp32 = 0, tf32 = 0;  // dense TFLOP/s, spec sheet
};

Peak PeakFor(const std::string& name) {
  if (name.find("H100") != std::string::npos && name.find("PCIe") != std::string::npos) return {51.2, 378.0};
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return {66.9, 494.7};
  if (name.find("A100") != std::string::npos) return {19.5, 156.0};
  return {};
}

void Throughput(const Flags& flags) {
  const CudaDeviceInfo info = GetCudaDeviceInfo(0);
  const Peak peak = PeakFor(info.name);
  Case c;
  c.name = "gpt2-small-shaped";
  c.model = {.vocab = 256,
             .layers = flags.bench_layers,
             .heads = flags.bench_heads,
             .width = flags.bench_width,
             .context = flags.bench_seq};
  c.batch = flags.bench_batch;
  c.seq = flags.bench_seq;
  const double C = c.model.width, L = c.model.layers, T = c.seq, V = c.model.vocab;
  // Per token: 6 FLOPs per weight of every matmul (forward 2, backward 4), and
  // causal attention (q·kᵀ and p·v over T/2 keys on average, ×3 for backward).
  const double matmul_weights = L * 12 * C * C + C * V;
  const double flops_per_token = 6 * matmul_weights + 6 * L * T * C;
  std::printf(
      "throughput on %s (%d SMs, %.0f GiB): %s, B=%d T=%d width=%d layers=%d heads=%d, %.1fM matmul weights, "
      "%.2f GFLOP per token\n",
      info.name.c_str(), info.sm_count, info.memory_bytes / 1073741824.0, c.name.c_str(), c.batch, c.seq, c.model.width,
      c.model.layers, c.model.heads, matmul_weights / 1e6, flops_per_token / 1e9);
  for (const bool tf32 : {false, true}) {
    std::unique_ptr<Backend> be = MakeCandidate(flags, tf32);
    ModelRunner r(c.model, *be, c.batch, c.seq);
    r.SetParameters(InitWeights(r, c, 5));
    const std::vector<uint8_t> tokens = MakeTokens(c.batch, c.seq, c.model.vocab, 9);
    const RunnerOptim opt{.lr = 1e-4f, .clip_norm = 1.0f};
    for (int i = 0; i < 2; ++i) r.Step(tokens, {}, 1, opt);  // warm-up: allocations, cuBLAS heuristics
    be->Synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < flags.bench_steps; ++i) r.Step(tokens, {}, 1, opt);
    be->Synchronize();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / flags.bench_steps;
    const auto ft0 = std::chrono::steady_clock::now();
    for (int i = 0; i < flags.bench_steps; ++i) r.Forward(tokens, false);
    be->Synchronize();
    const double fsec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - ft0).count() / flags.bench_steps;
    const double tokens_per_s = c.batch * c.seq / sec;
    const double tflops = tokens_per_s * flops_per_token / 1e12;
    const double pk = tf32 ? peak.tf32 : peak.fp32;
    std::printf("  %-5s step %8.2f ms (forward alone %7.2f ms)  %10.0f tokens/s  %6.2f TFLOP/s  ",
                tf32 ? "TF32" : "FP32", sec * 1e3, fsec * 1e3, tokens_per_s, tflops);
    if (pk > 0) {
      std::printf("%5.1f %% of the %s dense peak (%.1f TFLOP/s)\n", 100 * tflops / pk, tf32 ? "TF32" : "FP32", pk);
    } else {
      std::printf("(peak of this GPU unknown)\n");
    }
  }
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  if (flags.candidate == "cuda") {
    std::string why;
    if (!CudaDeviceAvailable(&why)) {
      std::printf("SKIPPED: %s; the CUDA compare needs a GPU\n", why.c_str());
      return 77;
    }
    const CudaDeviceInfo info = GetCudaDeviceInfo(0);
    std::printf("device: %s, compute capability %d.%d, %d SMs\n", info.name.c_str(), info.compute_major,
                info.compute_minor, info.sm_count);
  } else {
    std::printf("candidate: the CPU backend with 1 thread (checks the harness, not the GPU)\n");
  }
  std::printf("reference: the CPU backend with %d threads\n", ReferenceThreads(flags));
  Checks checks;
  const auto t0 = std::chrono::steady_clock::now();
  if (flags.only.empty() || flags.only == "compare") {
    CompareKernels(flags, checks);
    for (const Case& c : CompareCases()) CompareCase(c, flags, checks);
    CompareAdamW(flags, checks);
  }
  if (flags.only.empty() || flags.only == "determinism") {
    std::vector<Case> cases = CompareCases();
    CheckDeterminism(cases[1], flags, checks);
    if (!flags.quick) {
      Case big = cases[1];
      big.name = "qknorm+softcaps+zloss+tied, wider";
      big.model.width = 384;
      big.model.heads = 6;
      big.model.layers = 4;
      big.model.context = 128;
      big.seq = 128;
      big.batch = 8;
      big.init_std = 0.05f;
      CheckDeterminism(big, flags, checks);
    }
  }
  if ((flags.only.empty() && !flags.quick) || flags.only == "throughput") {
    if (flags.candidate == "cuda") {
      Throughput(flags);
    } else {
      std::printf("throughput: skipped (GPU only)\n");
    }
  }
  std::printf("%d checks, %d failed (%.1f s)\n", checks.count(), checks.failures(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return checks.failures() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace spikeguard::kernels

int main(int argc, char** argv) { return spikeguard::kernels::Main(argc, argv); }
