#include "kernels/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace spikeguard::kernels {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "ModelRunner: %s\n", what);
  std::abort();
}

// n elements of T in a backend's memory.
template <typename T>
class Buf {
 public:
  Buf() = default;
  Buf(Backend& be, size_t n) : be_(&be), n_(n), p_(static_cast<T*>(be.Allocate(n * sizeof(T)))) {
    if (p_ == nullptr) Die("allocation failed");
  }
  ~Buf() {
    if (be_ != nullptr) be_->Free(p_);
  }
  Buf(Buf&& o) noexcept : be_(o.be_), n_(o.n_), p_(o.p_) { o.be_ = nullptr, o.p_ = nullptr, o.n_ = 0; }
  Buf& operator=(Buf&& o) noexcept {
    std::swap(be_, o.be_);
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    return *this;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  std::vector<T> Host() const {
    std::vector<T> h(n_);
    if (n_ > 0) be_->CopyOut(h.data(), p_, n_ * sizeof(T));
    return h;
  }
  void Set(std::span<const T> h) {
    if (h.size() != n_) Die("size mismatch on upload");
    if (n_ > 0) be_->CopyIn(p_, h.data(), n_ * sizeof(T));
  }

 private:
  Backend* be_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

constexpr size_t kNone = ~size_t{0};

}  // namespace

struct ModelRunner::Buffers {
  struct Offsets {
    size_t ln1_g = kNone, ln1_b = kNone, w_qkv = kNone, b_qkv = kNone;
    size_t q_g = kNone, q_b = kNone, k_g = kNone, k_b = kNone;
    size_t w_o = kNone, b_o = kNone, ln2_g = kNone, ln2_b = kNone;
    size_t w_fc = kNone, b_fc = kNone, w_proj = kNone, b_proj = kNone;
  };
  struct Layer {
    Buf<float> ln1, ln1_mean, ln1_rstd, qkv, q, k, v, qn, kn, q_mean, q_rstd, k_mean, k_rstd;
    Buf<float> att_logits, att_probs, row_max, att_heads, att, res1;
    Buf<float> ln2, ln2_mean, ln2_rstd, fc, gelu, res2;
  };
  std::vector<Offsets> offsets;
  size_t wte = kNone, wpe = kNone, lnf_g = kNone, lnf_b = kNone, lm_head = kNone;
  Buf<float> params, grads, m, v;
  Buf<int32_t> inputs, targets;
  Buf<float> x0, lnf, lnf_mean, lnf_rstd, logits, dlogits, losses, lse;
  std::vector<Layer> layers;
  Buf<float> dres, dln, dfc, datt, dheads, dq, dk, dv, dq_pre, dk_pre, dqkv;
  Buf<float> wlm_t, dwlm;

  float* P(size_t o) const { return o == kNone ? nullptr : params.get() + o; }
  float* G(size_t o) const { return o == kNone ? nullptr : grads.get() + o; }
};

ModelRunner::ModelRunner(const RunnerModel& model, Backend& backend, int batch, int seq)
    : model_(model), be_(backend), batch_(batch), seq_(seq), buf_(std::make_unique<Buffers>()) {
  if (model.layers < 1 || model.heads < 1 || model.width % model.heads != 0 || seq < 1 || seq > model.context ||
      batch < 1 || model.vocab < 1) {
    Die("invalid model or batch shape");
  }
  Buffers& b = *buf_;
  // The layout of Trainer::BuildLayout.
  const size_t C = model.width, V = model.vocab, hd = model.width / model.heads;
  size_t total = 0;
  auto add = [&](const std::string& name, size_t size, int layer, bool decay) {
    tensors_.push_back({name, total, size, layer, decay});
    total += size;
    return total - size;
  };
  b.wte = add("wte", V * C, -1, true);
  b.wpe = add("wpe", static_cast<size_t>(model.context) * C, -1, true);
  b.offsets.resize(model.layers);
  for (int l = 0; l < model.layers; ++l) {
    Buffers::Offsets& o = b.offsets[l];
    const std::string p = "layer" + std::to_string(l) + ".";
    o.ln1_g = add(p + "ln1_g", C, l, false);
    if (model.bias) o.ln1_b = add(p + "ln1_b", C, l, false);
    o.w_qkv = add(p + "w_qkv", C * 3 * C, l, true);
    if (model.bias) o.b_qkv = add(p + "b_qkv", 3 * C, l, false);
    if (model.qk_norm) {
      o.q_g = add(p + "q_norm_g", hd, l, false);
      if (model.bias) o.q_b = add(p + "q_norm_b", hd, l, false);
      o.k_g = add(p + "k_norm_g", hd, l, false);
      if (model.bias) o.k_b = add(p + "k_norm_b", hd, l, false);
    }
    o.w_o = add(p + "w_o", C * C, l, true);
    if (model.bias) o.b_o = add(p + "b_o", C, l, false);
    o.ln2_g = add(p + "ln2_g", C, l, false);
    if (model.bias) o.ln2_b = add(p + "ln2_b", C, l, false);
    o.w_fc = add(p + "w_fc", C * 4 * C, l, true);
    if (model.bias) o.b_fc = add(p + "b_fc", 4 * C, l, false);
    o.w_proj = add(p + "w_proj", 4 * C * C, l, true);
    if (model.bias) o.b_proj = add(p + "b_proj", C, l, false);
  }
  b.lnf_g = add("lnf_g", C, -1, false);
  if (model.bias) b.lnf_b = add("lnf_b", C, -1, false);
  if (!model.tie_embeddings) b.lm_head = add("lm_head", C * V, -1, true);
  num_params_ = total;
  Backend& be = be_;
  b.params = Buf<float>(be, total);
  b.grads = Buf<float>(be, total);
  b.m = Buf<float>(be, total);
  b.v = Buf<float>(be, total);

  const size_t N = static_cast<size_t>(batch) * seq, H = model.heads;
  const size_t S = static_cast<size_t>(batch) * H * seq * seq;
  b.inputs = Buf<int32_t>(be, N);
  b.targets = Buf<int32_t>(be, N);
  b.x0 = Buf<float>(be, N * C);
  b.lnf = Buf<float>(be, N * C);
  b.lnf_mean = Buf<float>(be, N);
  b.lnf_rstd = Buf<float>(be, N);
  b.logits = Buf<float>(be, N * V);
  b.dlogits = Buf<float>(be, N * V);
  b.losses = Buf<float>(be, N);
  b.lse = Buf<float>(be, N);
  b.layers.resize(model.layers);
  for (auto& L : b.layers) {
    for (auto* x : {&L.ln1, &L.q, &L.k, &L.v, &L.att_heads, &L.att, &L.res1, &L.ln2, &L.res2})
      *x = Buf<float>(be, N * C);
    for (auto* x : {&L.ln1_mean, &L.ln1_rstd, &L.ln2_mean, &L.ln2_rstd}) *x = Buf<float>(be, N);
    L.qkv = Buf<float>(be, N * 3 * C);
    if (model.qk_norm) {
      L.qn = Buf<float>(be, N * C);
      L.kn = Buf<float>(be, N * C);
      for (auto* x : {&L.q_mean, &L.q_rstd, &L.k_mean, &L.k_rstd}) *x = Buf<float>(be, N * H);
    }
    L.att_logits = Buf<float>(be, S);
    L.att_probs = Buf<float>(be, S);
    L.row_max = Buf<float>(be, static_cast<size_t>(batch) * H * seq);
    L.fc = Buf<float>(be, N * 4 * C);
    L.gelu = Buf<float>(be, N * 4 * C);
  }
  for (auto* x : {&b.dres, &b.dln, &b.datt, &b.dheads, &b.dq, &b.dk, &b.dv, &b.dq_pre, &b.dk_pre}) {
    *x = Buf<float>(be, N * C);
  }
  b.dfc = Buf<float>(be, N * 4 * C);
  b.dqkv = Buf<float>(be, N * 3 * C);
  if (model.tie_embeddings) {
    b.wlm_t = Buf<float>(be, C * V);
    b.dwlm = Buf<float>(be, C * V);
  }
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::SetParameters(std::span<const float> params) { buf_->params.Set(params); }

void ModelRunner::SetOptimizerState(std::span<const float> m, std::span<const float> v, int64_t updates) {
  buf_->m.Set(m);
  buf_->v.Set(v);
  adam_t_ = updates;
}

std::vector<float> ModelRunner::Parameters() const { return buf_->params.Host(); }
std::vector<float> ModelRunner::Gradients() const { return buf_->grads.Host(); }
std::vector<float> ModelRunner::FirstMoments() const { return buf_->m.Host(); }
std::vector<float> ModelRunner::SecondMoments() const { return buf_->v.Host(); }
std::vector<float> ModelRunner::Logits() const { return buf_->logits.Host(); }
std::vector<float> ModelRunner::Losses() const { return buf_->losses.Host(); }
std::vector<float> ModelRunner::Lse() const { return buf_->lse.Host(); }

ModelRunner::Loss ModelRunner::Forward(std::span<const uint8_t> tokens, bool backward) {
  const int B = batch_, T = seq_, C = model_.width, V = model_.vocab, H = model_.heads;
  const int hd = C / H, N = B * T;
  if (tokens.size() != static_cast<size_t>(B) * (T + 1)) Die("tokens must hold batch·(seq+1) bytes");
  Buffers& a = *buf_;
  Backend& be = be_;
  const bool fp16 = model_.fp16_emulation;
  auto overflow = [&](const Buf<float>& x) {
    if (fp16) be.Fp16Overflow(x.get(), x.size());
  };
  std::vector<int32_t> inputs(N), targets(N);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      inputs[b * T + t] = tokens[static_cast<size_t>(b) * (T + 1) + t];
      targets[b * T + t] = tokens[static_cast<size_t>(b) * (T + 1) + t + 1];
      if (inputs[b * T + t] >= V || targets[b * T + t] >= V) Die("token >= vocab");
    }
  }
  a.inputs.Set(inputs);
  a.targets.Set(targets);
  be.EmbeddingForward(a.x0.get(), a.inputs.get(), a.P(a.wte), a.P(a.wpe), B, T, C);
  const AttentionShape shape{.batch = B,
                             .heads = H,
                             .seq = T,
                             .head_dim = hd,
                             .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
                             .softcap = model_.attn_softcap,
                             .fp16_overflow = fp16};
  const float* x = a.x0.get();
  for (int l = 0; l < model_.layers; ++l) {
    const Buffers::Offsets& o = a.offsets[l];
    Buffers::Layer& L = a.layers[l];
    be.LayerNormForward(L.ln1.get(), L.ln1_mean.get(), L.ln1_rstd.get(), x, a.P(o.ln1_g), a.P(o.ln1_b), N, C);
    be.MatmulForward(L.qkv.get(), L.ln1.get(), a.P(o.w_qkv), a.P(o.b_qkv), N, C, 3 * C);
    overflow(L.qkv);
    be.RowsToHeads(L.q.get(), L.qkv.get(), 3 * C, B, T, H, hd);
    be.RowsToHeads(L.k.get(), L.qkv.get() + C, 3 * C, B, T, H, hd);
    be.RowsToHeads(L.v.get(), L.qkv.get() + 2 * C, 3 * C, B, T, H, hd);
    const float* q = L.q.get();
    const float* k = L.k.get();
    if (model_.qk_norm) {
      be.LayerNormForward(L.qn.get(), L.q_mean.get(), L.q_rstd.get(), q, a.P(o.q_g), a.P(o.q_b), N * H, hd);
      be.LayerNormForward(L.kn.get(), L.k_mean.get(), L.k_rstd.get(), k, a.P(o.k_g), a.P(o.k_b), N * H, hd);
      q = L.qn.get();
      k = L.kn.get();
    }
    be.AttentionForward(L.att_heads.get(), L.att_logits.get(), L.att_probs.get(), L.row_max.get(), q, k, L.v.get(),
                        shape);
    be.HeadsToRows(L.att.get(), C, L.att_heads.get(), B, T, H, hd);
    be.MatmulForward(L.res1.get(), L.att.get(), a.P(o.w_o), a.P(o.b_o), N, C, C);
    overflow(L.res1);
    be.Add(L.res1.get(), L.res1.get(), x, L.res1.size());
    overflow(L.res1);
    be.LayerNormForward(L.ln2.get(), L.ln2_mean.get(), L.ln2_rstd.get(), L.res1.get(), a.P(o.ln2_g), a.P(o.ln2_b), N,
                        C);
    be.MatmulForward(L.fc.get(), L.ln2.get(), a.P(o.w_fc), a.P(o.b_fc), N, C, 4 * C);
    overflow(L.fc);
    be.GeluForward(L.gelu.get(), L.fc.get(), L.fc.size());
    overflow(L.gelu);
    be.MatmulForward(L.res2.get(), L.gelu.get(), a.P(o.w_proj), a.P(o.b_proj), N, 4 * C, C);
    overflow(L.res2);
    be.Add(L.res2.get(), L.res2.get(), L.res1.get(), L.res2.size());
    overflow(L.res2);
    x = L.res2.get();
  }
  be.LayerNormForward(a.lnf.get(), a.lnf_mean.get(), a.lnf_rstd.get(), x, a.P(a.lnf_g), a.P(a.lnf_b), N, C);
  const float* wlm = a.P(a.lm_head);
  if (model_.tie_embeddings) {
    // wteᵀ through the host: V·C floats, small next to a step.
    std::vector<float> wte(static_cast<size_t>(V) * C), wt(static_cast<size_t>(C) * V);
    be.CopyOut(wte.data(), a.P(a.wte), wte.size() * sizeof(float));
    for (int v = 0; v < V; ++v) {
      for (int c = 0; c < C; ++c) wt[static_cast<size_t>(c) * V + v] = wte[static_cast<size_t>(v) * C + c];
    }
    a.wlm_t.Set(wt);
    wlm = a.wlm_t.get();
  }
  be.MatmulForward(a.logits.get(), a.lnf.get(), wlm, nullptr, N, C, V);
  overflow(a.logits);
  be.SoftmaxCrossEntropy(backward ? a.dlogits.get() : nullptr, a.losses.get(), a.lse.get(), a.logits.get(),
                         a.targets.get(), N, V, model_.logit_softcap, model_.z_loss, 1.0f / N);
  const std::vector<float> losses = a.losses.Host(), lse = a.lse.Host();
  double ce = 0, z = 0;
  for (int i = 0; i < N; ++i) {
    ce += losses[i];
    z += static_cast<double>(lse[i]) * lse[i];
  }
  Loss loss;
  loss.cross_entropy = ce / N;
  loss.objective = loss.cross_entropy + model_.z_loss * (z / N);
  if (backward) Backward();
  return loss;
}

void ModelRunner::Backward() {
  Buffers& a = *buf_;
  Backend& be = be_;
  const int B = batch_, T = seq_, C = model_.width, V = model_.vocab, H = model_.heads;
  const int hd = C / H, N = B * T;
  const AttentionShape shape{.batch = B,
                             .heads = H,
                             .seq = T,
                             .head_dim = hd,
                             .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
                             .softcap = model_.attn_softcap,
                             .fp16_overflow = model_.fp16_emulation};
  be.Zero(a.grads.get(), a.grads.size());
  be.Zero(a.dres.get(), a.dres.size());
  if (model_.tie_embeddings) {
    be.Zero(a.dwlm.get(), a.dwlm.size());
    be.MatmulBackward(a.dln.get(), a.dwlm.get(), nullptr, a.dlogits.get(), a.lnf.get(), a.wlm_t.get(), N, C, V);
    std::vector<float> dwlm = a.dwlm.Host(), dwte(static_cast<size_t>(V) * C);
    be.CopyOut(dwte.data(), a.G(a.wte), dwte.size() * sizeof(float));
    for (int v = 0; v < V; ++v) {
      for (int c = 0; c < C; ++c) dwte[static_cast<size_t>(v) * C + c] += dwlm[static_cast<size_t>(c) * V + v];
    }
    be.CopyIn(a.G(a.wte), dwte.data(), dwte.size() * sizeof(float));
  } else {
    be.MatmulBackward(a.dln.get(), a.G(a.lm_head), nullptr, a.dlogits.get(), a.lnf.get(), a.P(a.lm_head), N, C, V);
  }
  const float* x_last = a.layers.back().res2.get();
  be.LayerNormBackward(a.dres.get(), a.G(a.lnf_g), a.G(a.lnf_b), a.dln.get(), x_last, a.lnf_mean.get(),
                       a.lnf_rstd.get(), a.P(a.lnf_g), N, C);
  for (int l = model_.layers - 1; l >= 0; --l) {
    const Buffers::Offsets& o = a.offsets[l];
    Buffers::Layer& L = a.layers[l];
    const float* x_in = l == 0 ? a.x0.get() : a.layers[l - 1].res2.get();
    be.MatmulBackward(a.dfc.get(), a.G(o.w_proj), a.G(o.b_proj), a.dres.get(), L.gelu.get(), a.P(o.w_proj), N, 4 * C,
                      C);
    be.GeluBackward(a.dfc.get(), a.dfc.get(), L.fc.get(), a.dfc.size());
    be.MatmulBackward(a.dln.get(), a.G(o.w_fc), a.G(o.b_fc), a.dfc.get(), L.ln2.get(), a.P(o.w_fc), N, C, 4 * C);
    be.LayerNormBackward(a.dres.get(), a.G(o.ln2_g), a.G(o.ln2_b), a.dln.get(), L.res1.get(), L.ln2_mean.get(),
                         L.ln2_rstd.get(), a.P(o.ln2_g), N, C);
    be.MatmulBackward(a.datt.get(), a.G(o.w_o), a.G(o.b_o), a.dres.get(), L.att.get(), a.P(o.w_o), N, C, C);
    be.RowsToHeads(a.dheads.get(), a.datt.get(), C, B, T, H, hd);
    const float* q = model_.qk_norm ? L.qn.get() : L.q.get();
    const float* k = model_.qk_norm ? L.kn.get() : L.k.get();
    be.AttentionBackward(a.dq.get(), a.dk.get(), a.dv.get(), a.dheads.get(), q, k, L.v.get(), L.att_logits.get(),
                         L.att_probs.get(), shape);
    const float* dq = a.dq.get();
    const float* dk = a.dk.get();
    if (model_.qk_norm) {
      be.Zero(a.dq_pre.get(), a.dq_pre.size());
      be.Zero(a.dk_pre.get(), a.dk_pre.size());
      be.LayerNormBackward(a.dq_pre.get(), a.G(o.q_g), a.G(o.q_b), a.dq.get(), L.q.get(), L.q_mean.get(),
                           L.q_rstd.get(), a.P(o.q_g), N * H, hd);
      be.LayerNormBackward(a.dk_pre.get(), a.G(o.k_g), a.G(o.k_b), a.dk.get(), L.k.get(), L.k_mean.get(),
                           L.k_rstd.get(), a.P(o.k_g), N * H, hd);
      dq = a.dq_pre.get();
      dk = a.dk_pre.get();
    }
    be.HeadsToRows(a.dqkv.get(), 3 * C, dq, B, T, H, hd);
    be.HeadsToRows(a.dqkv.get() + C, 3 * C, dk, B, T, H, hd);
    be.HeadsToRows(a.dqkv.get() + 2 * C, 3 * C, a.dv.get(), B, T, H, hd);
    be.MatmulBackward(a.dln.get(), a.G(o.w_qkv), a.G(o.b_qkv), a.dqkv.get(), L.ln1.get(), a.P(o.w_qkv), N, C, 3 * C);
    be.LayerNormBackward(a.dres.get(), a.G(o.ln1_g), a.G(o.ln1_b), a.dln.get(), x_in, L.ln1_mean.get(),
                         L.ln1_rstd.get(), a.P(o.ln1_g), N, C);
  }
  be.EmbeddingBackward(a.G(a.wte), a.G(a.wpe), a.dres.get(), a.inputs.get(), B, T, C);
}

RunnerStepResult ModelRunner::Step(std::span<const uint8_t> tokens, std::span<const int> domain, int num_domains,
                                   const RunnerOptim& optim) {
  Backend& be = be_;
  Buffers& a = *buf_;
  const Loss loss = Forward(tokens, /*backward=*/true);
  const int N = batch_ * seq_, T = seq_;

  RunnerStepResult out;
  out.loss = loss.cross_entropy;
  out.objective = loss.objective;
  out.domain_loss.assign(num_domains, 0.0);
  out.domain_tokens.assign(num_domains, 0);
  const std::vector<float> losses = a.losses.Host();
  for (int b = 0; b < batch_; ++b) {
    const int d = domain.empty() ? 0 : domain[b];
    if (d < 0 || d >= num_domains) Die("domain out of range");
    double sum = 0;
    for (int t = 0; t < T; ++t) sum += losses[b * T + t];
    out.domain_loss[d] += sum;
    out.domain_tokens[d] += T;
  }
  for (int d = 0; d < num_domains; ++d) {
    if (out.domain_tokens[d] > 0) out.domain_loss[d] /= static_cast<double>(out.domain_tokens[d]);
  }

  std::vector<double> tensor_sq(tensors_.size());
  double grad_sq = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    tensor_sq[i] = be.SumSquares(a.grads.get() + tensors_[i].offset, tensors_[i].size);
    grad_sq += tensor_sq[i];
  }
  out.grad_norm = std::sqrt(grad_sq);
  int64_t nonfinite = (std::isfinite(loss.objective) ? 0 : 1) + be.CountNonFinite(a.logits.get(), a.logits.size());
  const bool grads_finite = std::isfinite(grad_sq);
  if (!grads_finite) nonfinite += be.CountNonFinite(a.grads.get(), a.grads.size());
  out.nonfinite_count = nonfinite;

  float grad_scale = 1.0f;
  if (optim.clip_norm > 0 && grads_finite && out.grad_norm > optim.clip_norm) {
    grad_scale = static_cast<float>(optim.clip_norm / out.grad_norm);
    out.clipped = true;
  }
  const int layers = model_.layers;
  std::vector<double> layer_grad_sq(layers, 0), layer_param_sq(layers, 0), layer_delta_sq(layers, 0);
  out.update_skipped = !grads_finite || !std::isfinite(loss.objective);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const int l = tensors_[i].layer;
    if (l < 0) continue;
    layer_grad_sq[l] += tensor_sq[i];
    if (out.update_skipped) layer_param_sq[l] += be.SumSquares(a.params.get() + tensors_[i].offset, tensors_[i].size);
  }
  if (!out.update_skipped) {
    ++adam_t_;
    const AdamWArgs args{.lr = optim.lr,
                         .beta1 = optim.beta1,
                         .beta2 = optim.beta2,
                         .eps = optim.eps,
                         .weight_decay = optim.weight_decay,
                         .grad_scale = grad_scale,
                         .t = adam_t_};
    for (const RunnerTensor& t : tensors_) {
      const bool stats = t.layer >= 0;
      be.AdamW(a.params.get() + t.offset, a.m.get() + t.offset, a.v.get() + t.offset, a.grads.get() + t.offset, t.size,
               args, t.decay, stats ? &layer_delta_sq[t.layer] : nullptr, stats ? &layer_param_sq[t.layer] : nullptr);
    }
  }

  const std::vector<float> lse = a.lse.Host();
  double lse_sum = 0, lse_max = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < N; ++r) {
    lse_sum += lse[r];
    lse_max = std::isnan(lse[r]) || std::isnan(lse_max) ? std::numeric_limits<double>::quiet_NaN()
                                                        : std::max<double>(lse_max, lse[r]);
  }
  out.lse_mean = lse_sum / N;
  out.lse_max = lse_max;
  out.layers.resize(layers);
  for (int l = 0; l < layers; ++l) {
    RunnerStepResult::Layer& lt = out.layers[l];
    const Buffers::Layer& L = a.layers[l];
    double mx = -std::numeric_limits<double>::infinity();
    for (float v : L.row_max.Host()) mx = std::isnan(v) || std::isnan(mx) ? v : std::max<double>(mx, v);
    lt.max_attn_logit = mx;
    lt.grad_norm = std::sqrt(layer_grad_sq[l]);
    lt.param_norm = std::sqrt(layer_param_sq[l]);
    lt.update_ratio = lt.param_norm > 0 ? std::sqrt(layer_delta_sq[l]) / lt.param_norm : 0;
    lt.act_rms = std::sqrt(be.SumSquares(L.res2.get(), L.res2.size()) / static_cast<double>(L.res2.size()));
  }
  return out;
}

}  // namespace spikeguard::kernels
