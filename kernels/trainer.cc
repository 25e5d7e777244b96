#include "kernels/trainer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/splitmix64.h"

namespace spikeguard::kernels {
namespace {

// Hash of a byte string, 8 bytes at a time.
uint64_t HashBytes(const uint8_t* data, size_t n, uint64_t seed) {
  uint64_t h = SplitMix64Hash(seed ^ n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    h = SplitMix64Hash(h ^ w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, data + i, n - i);
  return SplitMix64Hash(h ^ tail);
}

// Deterministic normal samples (Box-Muller over splitmix64), the same on
// every platform, unlike std::normal_distribution.
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : state_(seed) {}
  float Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = (static_cast<double>(SplitMix64Hash(state_++) >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(SplitMix64Hash(state_++) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2 * std::numbers::pi * u2));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(2 * std::numbers::pi * u2));
  }

 private:
  uint64_t state_;
  float spare_ = 0;
  bool has_spare_ = false;
};

constexpr char kStateMagic[8] = {'S', 'G', 'K', 'S', 'T', 'A', 'T', 'E'};
constexpr uint32_t kStateVersion = 1;

class Writer {
 public:
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  template <typename T>
  void Pod(T v) {
    Bytes(&v, sizeof(v));
  }
  void String(const std::string& s) {
    Pod<uint64_t>(s.size());
    Bytes(s.data(), s.size());
  }
  void Floats(const std::vector<float>& v) {
    Pod<uint64_t>(v.size());
    Bytes(v.data(), v.size() * sizeof(float));
  }
  std::vector<uint8_t>& out() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool Bytes(void* p, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Pod(T* v) {
    return Bytes(v, sizeof(*v));
  }
  bool String(std::string* s) {
    uint64_t n;
    if (!Pod(&n) || n > in_.size() - pos_) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool Floats(std::vector<float>* v, size_t expected) {
    uint64_t n;
    if (!Pod(&n) || n != expected || n * sizeof(float) > in_.size() - pos_) return false;
    v->resize(n);
    return Bytes(v->data(), n * sizeof(float));
  }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace

uint64_t LossHash(double loss) { return SplitMix64Hash(std::bit_cast<uint64_t>(loss)); }

struct Trainer::LayerOffsets {
  size_t ln1_g = kNone, ln1_b = kNone, w_qkv = kNone, b_qkv = kNone;
  size_t q_g = kNone, q_b = kNone, k_g = kNone, k_b = kNone;
  size_t w_o = kNone, b_o = kNone, ln2_g = kNone, ln2_b = kNone;
  size_t w_fc = kNone, b_fc = kNone, w_proj = kNone, b_proj = kNone;
};

// Everything the backward pass reads, for a batch of B sequences of T tokens
// (N = B·T rows).
struct Trainer::Activations {
  struct Layer {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, q, k, v, qn, kn, q_mean, q_rstd, k_mean, k_rstd;
    std::vector<float> att_logits, att_probs, row_max, att_heads, att, res1;
    std::vector<float> ln2, ln2_mean, ln2_rstd, fc, gelu, res2;
  };
  int batch = 0, seq = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<float> x0, lnf, lnf_mean, lnf_rstd, logits, dlogits, losses, lse;
  std::vector<Layer> layers;
  // Gradient scratch, reused by every layer.
  std::vector<float> dres, dln, dfc, datt, dheads, dq, dk, dv, dq_pre, dk_pre, dqkv;
  std::vector<float> wlm_t, dwlm;  // tied embeddings: wteᵀ and its gradient
};

Trainer::Trainer(ModelConfig model, OptimConfig optim, int threads) : Trainer(model, optim, MakeCpuBackend(threads)) {}

Trainer::Trainer(ModelConfig model, OptimConfig optim, std::unique_ptr<Backend> backend)
    : model_(std::move(model)), optim_(std::move(optim)), backend_(std::move(backend)) {
  const absl::Status ms = model_.Validate(), os = optim_.Validate();
  SG_CHECK(ms.ok()) << ms;
  SG_CHECK(os.ok()) << os;
  BuildLayout();
  InitParameters();
}

Trainer::~Trainer() = default;

void Trainer::BuildLayout() {
  const size_t C = model_.width, V = model_.vocab, hd = model_.width / model_.heads;
  size_t total = 0;
  auto add = [&](const std::string& name, size_t size, int layer, bool decay) {
    tensors_.push_back({name, total, size, layer, decay});
    total += size;
    return total - size;
  };
  wte_ = add("wte", V * C, -1, true);
  wpe_ = add("wpe", static_cast<size_t>(model_.context) * C, -1, true);
  layer_offsets_.resize(model_.layers);
  for (int l = 0; l < model_.layers; ++l) {
    LayerOffsets& o = layer_offsets_[l];
    const std::string p = absl::StrCat("layer", l, ".");
    o.ln1_g = add(p + "ln1_g", C, l, false);
    if (model_.bias) o.ln1_b = add(p + "ln1_b", C, l, false);
    o.w_qkv = add(p + "w_qkv", C * 3 * C, l, true);
    if (model_.bias) o.b_qkv = add(p + "b_qkv", 3 * C, l, false);
    if (model_.qk_norm) {
      o.q_g = add(p + "q_norm_g", hd, l, false);
      if (model_.bias) o.q_b = add(p + "q_norm_b", hd, l, false);
      o.k_g = add(p + "k_norm_g", hd, l, false);
      if (model_.bias) o.k_b = add(p + "k_norm_b", hd, l, false);
    }
    o.w_o = add(p + "w_o", C * C, l, true);
    if (model_.bias) o.b_o = add(p + "b_o", C, l, false);
    o.ln2_g = add(p + "ln2_g", C, l, false);
    if (model_.bias) o.ln2_b = add(p + "ln2_b", C, l, false);
    o.w_fc = add(p + "w_fc", C * 4 * C, l, true);
    if (model_.bias) o.b_fc = add(p + "b_fc", 4 * C, l, false);
    o.w_proj = add(p + "w_proj", 4 * C * C, l, true);
    if (model_.bias) o.b_proj = add(p + "b_proj", C, l, false);
  }
  lnf_g_ = add("lnf_g", C, -1, false);
  if (model_.bias) lnf_b_ = add("lnf_b", C, -1, false);
  if (!model_.tie_embeddings) lm_head_ = add("lm_head", C * V, -1, true);
  params_.assign(total, 0.0f);
  grads_.assign(total, 0.0f);
  m_.assign(total, 0.0f);
  v_.assign(total, 0.0f);
}

void Trainer::InitParameters() {
  NormalRng rng(model_.seed);
  const float residual_std = model_.init_std / std::sqrt(2.0f * model_.layers);
  for (const TensorInfo& t : tensors_) {
    float* p = params_.data() + t.offset;
    const bool gain = t.name.ends_with("_g");
    if (gain) {
      std::fill_n(p, t.size, 1.0f);
    } else if (t.decay) {  // matrices and embeddings
      const bool residual = t.name.ends_with("w_o") || t.name.ends_with("w_proj");
      const float std = residual ? residual_std : model_.init_std;
      for (size_t i = 0; i < t.size; ++i) p[i] = std * rng.Next();
    }  // biases stay 0
  }
}

void Trainer::EnsureActivations(int batch, int seq) {
  if (acts_ && acts_->batch == batch && acts_->seq == seq) return;
  acts_ = std::make_unique<Activations>();
  Activations& a = *acts_;
  a.batch = batch;
  a.seq = seq;
  const size_t N = static_cast<size_t>(batch) * seq, C = model_.width, V = model_.vocab, H = model_.heads;
  const size_t S = static_cast<size_t>(batch) * H * seq * seq;
  a.inputs.resize(N);
  a.targets.resize(N);
  a.x0.resize(N * C);
  a.lnf.resize(N * C);
  a.lnf_mean.resize(N);
  a.lnf_rstd.resize(N);
  a.logits.resize(N * V);
  a.dlogits.resize(N * V);
  a.losses.resize(N);
  a.lse.resize(N);
  a.layers.resize(model_.layers);
  for (auto& L : a.layers) {
    for (auto* v : {&L.ln1, &L.q, &L.k, &L.v, &L.att_heads, &L.att, &L.res1, &L.ln2, &L.res2}) v->resize(N * C);
    for (auto* v : {&L.ln1_mean, &L.ln1_rstd, &L.ln2_mean, &L.ln2_rstd}) v->resize(N);
    L.qkv.resize(N * 3 * C);
    if (model_.qk_norm) {
      L.qn.resize(N * C);
      L.kn.resize(N * C);
      for (auto* v : {&L.q_mean, &L.q_rstd, &L.k_mean, &L.k_rstd}) v->resize(N * H);
    }
    L.att_logits.resize(S);
    L.att_probs.resize(S);
    L.row_max.resize(static_cast<size_t>(batch) * H * seq);
    L.fc.resize(N * 4 * C);
    L.gelu.resize(N * 4 * C);
  }
  for (auto* v : {&a.dres, &a.dln, &a.datt, &a.dheads, &a.dq, &a.dk, &a.dv, &a.dq_pre, &a.dk_pre}) v->resize(N * C);
  a.dfc.resize(N * 4 * C);
  a.dqkv.resize(N * 3 * C);
  if (model_.tie_embeddings) {
    a.wlm_t.resize(C * V);
    a.dwlm.resize(C * V);
  }
}

absl::Status Trainer::ValidateBatch(const Batch& b) const {
  if (b.batch_size < 1) return absl::InvalidArgumentError(absl::StrCat("batch_size must be >= 1, got ", b.batch_size));
  if (b.seq_len < 1 || b.seq_len > model_.context) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be in [1, context=", model_.context, "], got ", b.seq_len));
  }
  const size_t want = static_cast<size_t>(b.batch_size) * (b.seq_len + 1);
  if (b.tokens.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens has ", b.tokens.size(), " bytes, want batch_size·(seq_len+1) = ", want));
  }
  for (uint8_t t : b.tokens) {
    if (t >= model_.vocab) return absl::InvalidArgumentError(absl::StrCat("token ", t, " >= vocab ", model_.vocab));
  }
  if (b.num_domains < 1) return absl::InvalidArgumentError("num_domains must be >= 1");
  if (!b.domain.empty()) {
    if (b.domain.size() != static_cast<size_t>(b.batch_size)) {
      return absl::InvalidArgumentError(absl::StrCat("domain has ", b.domain.size(), " entries, want ", b.batch_size));
    }
    for (int d : b.domain) {
      if (d < 0 || d >= b.num_domains) return absl::InvalidArgumentError(absl::StrCat("domain ", d, " out of range"));
    }
  }
  return absl::OkStatus();
}

Trainer::Loss Trainer::Forward(const Batch& batch, bool backward) {
  const absl::Status valid = ValidateBatch(batch);
  SG_CHECK(valid.ok()) << valid;
  const int B = batch.batch_size, T = batch.seq_len, C = model_.width, V = model_.vocab, H = model_.heads;
  const int hd = C / H, N = B * T;
  EnsureActivations(B, T);
  Activations& a = *acts_;
  Backend& be = *backend_;
  const bool fp16 = model_.fp16_emulation;
  auto overflow = [&](std::vector<float>& x) {
    if (fp16) be.Fp16Overflow(x.data(), x.size());
  };
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      a.inputs[b * T + t] = batch.tokens[static_cast<size_t>(b) * (T + 1) + t];
      a.targets[b * T + t] = batch.tokens[static_cast<size_t>(b) * (T + 1) + t + 1];
    }
  }
  be.EmbeddingForward(a.x0.data(), a.inputs.data(), P(wte_), P(wpe_), B, T, C);
  const AttentionShape shape{.batch = B,
                             .heads = H,
                             .seq = T,
                             .head_dim = hd,
                             .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
                             .softcap = model_.attn_softcap,
                             .fp16_overflow = fp16};
  const float* x = a.x0.data();
  for (int l = 0; l < model_.layers; ++l) {
    const LayerOffsets& o = layer_offsets_[l];
    Activations::Layer& L = a.layers[l];
    be.LayerNormForward(L.ln1.data(), L.ln1_mean.data(), L.ln1_rstd.data(), x, P(o.ln1_g), P(o.ln1_b), N, C);
    be.MatmulForward(L.qkv.data(), L.ln1.data(), P(o.w_qkv), P(o.b_qkv), N, C, 3 * C);
    overflow(L.qkv);
    be.RowsToHeads(L.q.data(), L.qkv.data(), 3 * C, B, T, H, hd);
    be.RowsToHeads(L.k.data(), L.qkv.data() + C, 3 * C, B, T, H, hd);
    be.RowsToHeads(L.v.data(), L.qkv.data() + 2 * C, 3 * C, B, T, H, hd);
    const float* q = L.q.data();
    const float* k = L.k.data();
    if (model_.qk_norm) {
      be.LayerNormForward(L.qn.data(), L.q_mean.data(), L.q_rstd.data(), q, P(o.q_g), P(o.q_b), N * H, hd);
      be.LayerNormForward(L.kn.data(), L.k_mean.data(), L.k_rstd.data(), k, P(o.k_g), P(o.k_b), N * H, hd);
      q = L.qn.data();
      k = L.kn.data();
    }
    be.AttentionForward(L.att_heads.data(), L.att_logits.data(), L.att_probs.data(), L.row_max.data(), q, k, L.v.data(),
                        shape);
    be.HeadsToRows(L.att.data(), C, L.att_heads.data(), B, T, H, hd);
    be.MatmulForward(L.res1.data(), L.att.data(), P(o.w_o), P(o.b_o), N, C, C);
    overflow(L.res1);
    be.Add(L.res1.data(), L.res1.data(), x, L.res1.size());
    overflow(L.res1);
    be.LayerNormForward(L.ln2.data(), L.ln2_mean.data(), L.ln2_rstd.data(), L.res1.data(), P(o.ln2_g), P(o.ln2_b), N,
                        C);
    be.MatmulForward(L.fc.data(), L.ln2.data(), P(o.w_fc), P(o.b_fc), N, C, 4 * C);
    overflow(L.fc);
    be.GeluForward(L.gelu.data(), L.fc.data(), L.fc.size());
    overflow(L.gelu);
    be.MatmulForward(L.res2.data(), L.gelu.data(), P(o.w_proj), P(o.b_proj), N, 4 * C, C);
    overflow(L.res2);
    be.Add(L.res2.data(), L.res2.data(), L.res1.data(), L.res2.size());
    overflow(L.res2);
    x = L.res2.data();
  }
  be.LayerNormForward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, P(lnf_g_), P(lnf_b_), N, C);
  const float* wlm = P(lm_head_);
  if (model_.tie_embeddings) {
    const float* wte = P(wte_);
    for (int v = 0; v < V; ++v) {
      for (int c = 0; c < C; ++c) a.wlm_t[static_cast<size_t>(c) * V + v] = wte[static_cast<size_t>(v) * C + c];
    }
    wlm = a.wlm_t.data();
  }
  be.MatmulForward(a.logits.data(), a.lnf.data(), wlm, nullptr, N, C, V);
  overflow(a.logits);
  be.SoftmaxCrossEntropy(backward ? a.dlogits.data() : nullptr, a.losses.data(), a.lse.data(), a.logits.data(),
                         a.targets.data(), N, V, model_.logit_softcap, model_.z_loss, 1.0f / N);
  double ce = 0, z = 0;
  for (int i = 0; i < N; ++i) {
    ce += a.losses[i];
    z += static_cast<double>(a.lse[i]) * a.lse[i];
  }
  Loss loss;
  loss.cross_entropy = ce / N;
  loss.objective = loss.cross_entropy + model_.z_loss * (z / N);
  if (backward) Backward();
  return loss;
}

void Trainer::Backward() {
  Activations& a = *acts_;
  Backend& be = *backend_;
  const int B = a.batch, T = a.seq, C = model_.width, V = model_.vocab, H = model_.heads;
  const int hd = C / H, N = B * T;
  const AttentionShape shape{.batch = B,
                             .heads = H,
                             .seq = T,
                             .head_dim = hd,
                             .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
                             .softcap = model_.attn_softcap,
                             .fp16_overflow = model_.fp16_emulation};
  be.Zero(grads_.data(), grads_.size());
  // Output head and final norm; dres accumulates dL/d(residual stream).
  be.Zero(a.dres.data(), a.dres.size());
  if (model_.tie_embeddings) {
    be.Zero(a.dwlm.data(), a.dwlm.size());
    be.MatmulBackward(a.dln.data(), a.dwlm.data(), nullptr, a.dlogits.data(), a.lnf.data(), a.wlm_t.data(), N, C, V);
    float* dwte = G(wte_);
    for (int v = 0; v < V; ++v) {
      for (int c = 0; c < C; ++c) dwte[static_cast<size_t>(v) * C + c] += a.dwlm[static_cast<size_t>(c) * V + v];
    }
  } else {
    be.MatmulBackward(a.dln.data(), G(lm_head_), nullptr, a.dlogits.data(), a.lnf.data(), P(lm_head_), N, C, V);
  }
  const float* x_last = model_.layers > 0 ? a.layers.back().res2.data() : a.x0.data();
  be.LayerNormBackward(a.dres.data(), G(lnf_g_), G(lnf_b_), a.dln.data(), x_last, a.lnf_mean.data(), a.lnf_rstd.data(),
                       P(lnf_g_), N, C);
  for (int l = model_.layers - 1; l >= 0; --l) {
    const LayerOffsets& o = layer_offsets_[l];
    Activations::Layer& L = a.layers[l];
    const float* x_in = l == 0 ? a.x0.data() : a.layers[l - 1].res2.data();
    // MLP: res2 = res1 + proj(gelu(fc(ln2(res1)))).
    be.MatmulBackward(a.dfc.data(), G(o.w_proj), G(o.b_proj), a.dres.data(), L.gelu.data(), P(o.w_proj), N, 4 * C, C);
    be.GeluBackward(a.dfc.data(), a.dfc.data(), L.fc.data(), a.dfc.size());
    be.MatmulBackward(a.dln.data(), G(o.w_fc), G(o.b_fc), a.dfc.data(), L.ln2.data(), P(o.w_fc), N, C, 4 * C);
    be.LayerNormBackward(a.dres.data(), G(o.ln2_g), G(o.ln2_b), a.dln.data(), L.res1.data(), L.ln2_mean.data(),
                         L.ln2_rstd.data(), P(o.ln2_g), N, C);
    // Attention: res1 = x_in + o(attn(qkv(ln1(x_in)))).
    be.MatmulBackward(a.datt.data(), G(o.w_o), G(o.b_o), a.dres.data(), L.att.data(), P(o.w_o), N, C, C);
    be.RowsToHeads(a.dheads.data(), a.datt.data(), C, B, T, H, hd);
    const float* q = model_.qk_norm ? L.qn.data() : L.q.data();
    const float* k = model_.qk_norm ? L.kn.data() : L.k.data();
    be.AttentionBackward(a.dq.data(), a.dk.data(), a.dv.data(), a.dheads.data(), q, k, L.v.data(), L.att_logits.data(),
                         L.att_probs.data(), shape);
    const float* dq = a.dq.data();
    const float* dk = a.dk.data();
    if (model_.qk_norm) {
      be.Zero(a.dq_pre.data(), a.dq_pre.size());
      be.Zero(a.dk_pre.data(), a.dk_pre.size());
      be.LayerNormBackward(a.dq_pre.data(), G(o.q_g), G(o.q_b), a.dq.data(), L.q.data(), L.q_mean.data(),
                           L.q_rstd.data(), P(o.q_g), N * H, hd);
      be.LayerNormBackward(a.dk_pre.data(), G(o.k_g), G(o.k_b), a.dk.data(), L.k.data(), L.k_mean.data(),
                           L.k_rstd.data(), P(o.k_g), N * H, hd);
      dq = a.dq_pre.data();
      dk = a.dk_pre.data();
    }
    be.HeadsToRows(a.dqkv.data(), 3 * C, dq, B, T, H, hd);
    be.HeadsToRows(a.dqkv.data() + C, 3 * C, dk, B, T, H, hd);
    be.HeadsToRows(a.dqkv.data() + 2 * C, 3 * C, a.dv.data(), B, T, H, hd);
    be.MatmulBackward(a.dln.data(), G(o.w_qkv), G(o.b_qkv), a.dqkv.data(), L.ln1.data(), P(o.w_qkv), N, C, 3 * C);
    be.LayerNormBackward(a.dres.data(), G(o.ln1_g), G(o.ln1_b), a.dln.data(), x_in, L.ln1_mean.data(),
                         L.ln1_rstd.data(), P(o.ln1_g), N, C);
  }
  be.EmbeddingBackward(G(wte_), G(wpe_), a.dres.data(), a.inputs.data(), B, T, C);
}

Trainer::Loss Trainer::ComputeLoss(const Batch& batch) { return Forward(batch, /*backward=*/false); }
Trainer::Loss Trainer::ComputeGradients(const Batch& batch) { return Forward(batch, /*backward=*/true); }
double Trainer::Evaluate(const Batch& batch) { return Forward(batch, /*backward=*/false).cross_entropy; }

double Trainer::LearningRate(int64_t step) const {
  double f = 1.0;
  if (step < optim_.warmup_steps) {
    f = static_cast<double>(step + 1) / static_cast<double>(optim_.warmup_steps);
  } else if (optim_.schedule == OptimConfig::Schedule::kCosine) {
    const double span = std::max<int64_t>(1, optim_.total_steps - optim_.warmup_steps);
    const double progress = std::clamp(static_cast<double>(step - optim_.warmup_steps) / span, 0.0, 1.0);
    f = optim_.min_lr_ratio + (1.0 - optim_.min_lr_ratio) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
  const HParamOverrides& o = overrides_;
  if (o.extra_warmup_steps > 0) {
    const int64_t start = o.rewarm_start_step < 0 ? step : o.rewarm_start_step;
    if (step >= start) {
      f *= std::min(1.0, static_cast<double>(step - start + 1) / static_cast<double>(o.extra_warmup_steps));
    }
  }
  return static_cast<double>(optim_.peak_lr) * o.lr_scale * f;
}

void Trainer::SetHParams(const HParamOverrides& overrides) { overrides_ = overrides; }

StepTelemetry Trainer::Step(const Batch& batch, int64_t step, bool telemetry) {
  if (overrides_.extra_warmup_steps > 0 && overrides_.rewarm_start_step < 0) overrides_.rewarm_start_step = step;
  Backend& be = *backend_;
  const Loss loss = Forward(batch, /*backward=*/true);
  Activations& a = *acts_;
  const int N = a.batch * a.seq, T = a.seq;

  StepTelemetry out;
  out.loss = loss.cross_entropy;
  out.loss_hash = LossHash(out.loss);
  out.tokens = N;
  out.lr = LearningRate(step);
  out.domain_loss.assign(batch.num_domains, 0.0);
  out.domain_tokens.assign(batch.num_domains, 0);
  for (int b = 0; b < a.batch; ++b) {
    const int d = batch.domain.empty() ? 0 : batch.domain[b];
    double sum = 0;
    for (int t = 0; t < T; ++t) sum += a.losses[b * T + t];
    out.domain_loss[d] += sum;
    out.domain_tokens[d] += T;
  }
  for (int d = 0; d < batch.num_domains; ++d) {
    if (out.domain_tokens[d] > 0) out.domain_loss[d] /= static_cast<double>(out.domain_tokens[d]);
  }

  if (bitflip_step_ == step) {
    bitflip_step_ = -1;
    size_t best = 0;
    for (size_t i = 1; i < grads_.size(); ++i) {
      if (std::fabs(grads_[i]) > std::fabs(grads_[best])) best = i;
    }
    grads_[best] = std::bit_cast<float>(std::bit_cast<uint32_t>(grads_[best]) ^ (1u << 30));
  }

  // Gradient norms per tensor: clipping, non-finite detection and telemetry.
  std::vector<double> tensor_sq(tensors_.size());
  double grad_sq = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    tensor_sq[i] = be.SumSquares(grads_.data() + tensors_[i].offset, tensors_[i].size);
    grad_sq += tensor_sq[i];
  }
  out.grad_norm = std::sqrt(grad_sq);

  // -Inf logits leave the log-sum-exp finite, so the logits are counted in full.
  int64_t nonfinite = (std::isfinite(loss.objective) ? 0 : 1) + be.CountNonFinite(a.logits.data(), a.logits.size());
  const bool grads_finite = std::isfinite(grad_sq);
  if (!grads_finite) nonfinite += be.CountNonFinite(grads_.data(), grads_.size());
  out.nonfinite_count = nonfinite;

  const double clip = overrides_.clip_norm.value_or(optim_.clip_norm);
  float grad_scale = 1.0f;
  if (clip > 0 && grads_finite && out.grad_norm > clip) {
    grad_scale = static_cast<float>(clip / out.grad_norm);
    out.clipped = true;
  }

  const int layers = model_.layers;
  std::vector<double> layer_grad_sq(layers, 0), layer_param_sq(layers, 0), layer_delta_sq(layers, 0);
  out.update_skipped = !grads_finite || !std::isfinite(loss.objective);
  if (telemetry) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const int l = tensors_[i].layer;
      if (l < 0) continue;
      layer_grad_sq[l] += tensor_sq[i];
      // Otherwise AdamW sums the parameter norms as it goes.
      if (out.update_skipped) layer_param_sq[l] += be.SumSquares(params_.data() + tensors_[i].offset, tensors_[i].size);
    }
  }
  if (!out.update_skipped) {
    ++adam_t_;
    AdamWArgs args{.lr = static_cast<float>(out.lr),
                   .beta1 = optim_.beta1,
                   .beta2 = static_cast<float>(overrides_.beta2.value_or(optim_.beta2)),
                   .eps = static_cast<float>(overrides_.eps.value_or(optim_.eps)),
                   .weight_decay = optim_.weight_decay,
                   .grad_scale = grad_scale,
                   .t = adam_t_};
    for (const TensorInfo& t : tensors_) {
      const bool stats = telemetry && t.layer >= 0;
      be.AdamW(params_.data() + t.offset, m_.data() + t.offset, v_.data() + t.offset, grads_.data() + t.offset, t.size,
               args, t.decay, stats ? &layer_delta_sq[t.layer] : nullptr, stats ? &layer_param_sq[t.layer] : nullptr);
    }
  }

  if (telemetry) {
    double lse_sum = 0, lse_max = -std::numeric_limits<double>::infinity();
    for (int r = 0; r < N; ++r) {
      lse_sum += a.lse[r];
      lse_max = std::isnan(a.lse[r]) || std::isnan(lse_max) ? std::numeric_limits<double>::quiet_NaN()
                                                            : std::max<double>(lse_max, a.lse[r]);
    }
    out.lse_mean = lse_sum / N;
    out.lse_max = lse_max;
    out.layers.resize(layers);
    for (int l = 0; l < layers; ++l) {
      LayerTelemetry& lt = out.layers[l];
      const Activations::Layer& L = a.layers[l];
      double mx = -std::numeric_limits<double>::infinity();
      for (float v : L.row_max) mx = std::isnan(v) || std::isnan(mx) ? v : std::max<double>(mx, v);
      lt.max_attn_logit = mx;
      lt.grad_norm = std::sqrt(layer_grad_sq[l]);
      lt.param_norm = std::sqrt(layer_param_sq[l]);
      lt.update_ratio = lt.param_norm > 0 ? std::sqrt(layer_delta_sq[l]) / lt.param_norm : 0;
      lt.act_rms = std::sqrt(be.SumSquares(L.res2.data(), L.res2.size()) / static_cast<double>(L.res2.size()));
    }
  }
  return out;
}

std::string Trainer::ConfigText() const {
  const ModelConfig& m = model_;
  const OptimConfig& o = optim_;
  auto f = [](double v) { return absl::StrFormat("%.9g", v); };
  return absl::StrCat("model.vocab=", m.vocab, "\nmodel.layers=", m.layers, "\nmodel.heads=", m.heads,
                      "\nmodel.width=", m.width, "\nmodel.context=", m.context, "\nmodel.qk_norm=", m.qk_norm,
                      "\nmodel.bias=", m.bias, "\nmodel.tie_embeddings=", m.tie_embeddings,
                      "\nmodel.fp16_emulation=", m.fp16_emulation, "\nmodel.z_loss=", f(m.z_loss),
                      "\nmodel.attn_softcap=", f(m.attn_softcap), "\nmodel.logit_softcap=", f(m.logit_softcap),
                      "\nmodel.init_std=", f(m.init_std), "\noptim.peak_lr=", f(o.peak_lr),
                      "\noptim.warmup_steps=", o.warmup_steps,
                      "\noptim.schedule=", o.schedule == OptimConfig::Schedule::kCosine ? "cosine" : "constant",
                      "\noptim.total_steps=", o.total_steps, "\noptim.min_lr_ratio=", f(o.min_lr_ratio),
                      "\noptim.beta1=", f(o.beta1), "\noptim.beta2=", f(o.beta2), "\noptim.eps=", f(o.eps),
                      "\noptim.weight_decay=", f(o.weight_decay), "\noptim.clip_norm=", f(o.clip_norm));
}

std::vector<uint8_t> Trainer::SaveState() const {
  Writer w;
  w.Bytes(kStateMagic, sizeof(kStateMagic));
  w.Pod<uint32_t>(kStateVersion);
  w.String(ConfigText());
  w.Pod<int64_t>(adam_t_);
  const HParamOverrides& o = overrides_;
  w.Pod<double>(o.lr_scale);
  w.Pod<int64_t>(o.extra_warmup_steps);
  w.Pod<int64_t>(o.rewarm_start_step);
  for (const std::optional<double>* opt : {&o.clip_norm, &o.beta2, &o.eps}) {
    w.Pod<uint8_t>(opt->has_value());
    w.Pod<double>(opt->value_or(0.0));
  }
  w.Floats(params_);
  w.Floats(m_);
  w.Floats(v_);
  const uint64_t sum = HashBytes(w.out().data(), w.out().size(), 0x5347);
  w.Pod<uint64_t>(sum);
  return std::move(w.out());
}

absl::Status Trainer::LoadState(std::span<const uint8_t> state) {
  if (state.size() < sizeof(kStateMagic) + 4 + 8 || std::memcmp(state.data(), kStateMagic, sizeof(kStateMagic)) != 0) {
    return absl::InvalidArgumentError("not a spikeguard trainer state (bad magic)");
  }
  uint64_t stored_sum;
  std::memcpy(&stored_sum, state.data() + state.size() - 8, 8);
  if (HashBytes(state.data(), state.size() - 8, 0x5347) != stored_sum) {
    return absl::DataLossError("trainer state is truncated or corrupt (checksum mismatch)");
  }
  Reader r(state.subspan(sizeof(kStateMagic), state.size() - sizeof(kStateMagic) - 8));
  uint32_t version = 0;
  std::string config;
  if (!r.Pod(&version) || !r.String(&config)) return absl::DataLossError("trainer state header is truncated");
  if (version != kStateVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer state version ", version, " is not supported (this binary reads ", kStateVersion, ")"));
  }
  const std::string mine = ConfigText();
  if (config != mine) {
    const std::vector<std::string> theirs = absl::StrSplit(config, '\n');
    const std::vector<std::string> ours = absl::StrSplit(mine, '\n');
    for (size_t i = 0; i < std::max(theirs.size(), ours.size()); ++i) {
      const std::string t = i < theirs.size() ? theirs[i] : "<absent>";
      const std::string o = i < ours.size() ? ours[i] : "<absent>";
      if (t == o) continue;
      const std::pair<std::string, std::string> tk = absl::StrSplit(t, absl::MaxSplits('=', 1));
      const std::pair<std::string, std::string> ok = absl::StrSplit(o, absl::MaxSplits('=', 1));
      if (tk.first == ok.first) {
        return absl::FailedPreconditionError(
            absl::StrCat("trainer state does not match this trainer's config: ", tk.first, ": state has ", tk.second,
                         ", this trainer has ", ok.second));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("trainer state does not match this trainer's config: state has ", t, ", this trainer has ", o));
    }
  }
  int64_t adam_t = 0;
  HParamOverrides o;
  bool ok = r.Pod(&adam_t) && r.Pod(&o.lr_scale) && r.Pod(&o.extra_warmup_steps) && r.Pod(&o.rewarm_start_step);
  for (std::optional<double>* opt : {&o.clip_norm, &o.beta2, &o.eps}) {
    uint8_t has = 0;
    double v = 0;
    ok = ok && r.Pod(&has) && r.Pod(&v);
    if (has) *opt = v;
  }
  std::vector<float> params, m, v;
  ok = ok && r.Floats(&params, params_.size()) && r.Floats(&m, m_.size()) && r.Floats(&v, v_.size());
  if (!ok) return absl::DataLossError("trainer state body is truncated or has the wrong parameter count");
  adam_t_ = adam_t;
  overrides_ = o;
  params_ = std::move(params);
  m_ = std::move(m);
  v_ = std::move(v);
  return absl::OkStatus();
}

uint64_t Trainer::ParamHash() const {
  return HashBytes(reinterpret_cast<const uint8_t*>(params_.data()), params_.size() * sizeof(float), 0x5041);
}

}  // namespace spikeguard::kernels
