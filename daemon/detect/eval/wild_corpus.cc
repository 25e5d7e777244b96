#include "daemon/detect/eval/wild_corpus.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace spikeguard::detect {
namespace {

constexpr double kPi = 3.14159265358979323846;

// mt19937_64 is specified bit for bit; the distributions are written out here.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double U() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }
  double U(double a, double b) { return a + (b - a) * U(); }
  double LogU(double a, double b) { return std::exp(U(std::log(a), std::log(b))); }
  int64_t Int(int64_t a, int64_t b) {
    if (b <= a) return a;
    return a + static_cast<int64_t>(U() * static_cast<double>(b - a + 1)) % (b - a + 1);
  }
  double N() {
    double u1 = U(), u2 = U();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2 * std::log(u1)) * std::cos(2 * kPi * u2);
  }
  // Student-t with integer `dof` degrees of freedom.
  double T(int dof) {
    double chi2 = 0;
    for (int i = 0; i < dof; ++i) {
      const double z = N();
      chi2 += z * z;
    }
    return N() / std::sqrt(std::max(chi2, 1e-12) / dof);
  }

 private:
  std::mt19937_64 g_;
};

std::vector<int64_t> Place(Rng& rng, int k, int64_t lo, int64_t hi, int64_t gap) {
  std::vector<int64_t> out;
  for (int tries = 0; static_cast<int>(out.size()) < k && tries < 2000; ++tries) {
    if (hi < lo) break;
    const int64_t p = rng.Int(lo, hi);
    bool ok = true;
    for (int64_t q : out) ok = ok && std::llabs(p - q) >= gap;
    if (ok) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Multiplicative modifiers of the healthy run, per step.
struct Mods {
  Mods(int64_t n, int layers)
      : loss(n, 1.0),
        loss_add(n, 0.0),
        noise(n, 1.0),
        grad(n, 1.0),
        lse_add(n, 0.0),
        attn(layers, std::vector<double>(n, 1.0)),
        ratio(layers, std::vector<double>(n, 1.0)),
        nan(n, -1) {}
  std::vector<double> loss;      // × loss
  std::vector<double> loss_add;  // + relative (legit shifts, blips)
  std::vector<double> noise;     // × noise scale (batch ramp)
  std::vector<double> grad;
  std::vector<double> lse_add;
  std::vector<std::vector<double>> attn;
  std::vector<std::vector<double>> ratio;
  std::vector<int> nan;  // ≥ 0: non-finite from this layer on
};

// A sharp loss spike peaking at p with its grad-norm jump `lead` steps ahead.
void Spike(Rng& rng, int64_t p, double amp, int64_t recover, int64_t lead, Mods* m,
           std::vector<Label>* labels) {
  const int64_t n = static_cast<int64_t>(m->loss.size());
  const int64_t r = rng.Int(0, 2);
  const double gmult = rng.LogU(3, 30);
  for (int64_t s = std::max<int64_t>(0, p - r); s <= std::min(n - 1, p + recover); ++s) {
    const double f = s < p ? static_cast<double>(s - (p - r) + 1) / (r + 1)
                           : std::exp(-5.0 * static_cast<double>(s - p) / std::max<int64_t>(1, recover));
    m->loss[s] *= 1 + amp * f;
  }
  for (int64_t s = std::max<int64_t>(0, p - r - lead); s <= std::min(n - 1, p + 3); ++s) {
    m->grad[s] *= gmult;
  }
  labels->push_back(Label{Label::kSpike, p - r, p, std::min(n - 1, p + std::max<int64_t>(1, recover)),
                          "loss", -1});
}

// The loss diverges from d: ×level over `rise` steps, and stays.
void Diverge(int64_t d, int64_t rise, double level, double grad_level, Mods* m) {
  const int64_t n = static_cast<int64_t>(m->loss.size());
  for (int64_t s = d; s < n; ++s) {
    const double f = std::min(1.0, static_cast<double>(s - d + 1) / static_cast<double>(rise));
    m->loss[s] *= 1 + (level - 1) * f;
    m->grad[s] *= 1 + (grad_level - 1) * f;
  }
}

}  // namespace

const char* WildFamilyName(WildFamily f) {
  switch (f) {
    case WildFamily::kNoisyHealthy: return "noisy_healthy";
    case WildFamily::kLevelShifts: return "level_shifts";
    case WildFamily::kBatchRamp: return "batch_ramp";
    case WildFamily::kIrregularSpikes: return "irregular_spikes";
    case WildFamily::kGradDivergence: return "grad_divergence";
    case WildFamily::kRatioDivergence: return "ratio_divergence";
    case WildFamily::kAttnGrowth: return "attn_growth";
    case WildFamily::kLseDrift: return "lse_drift";
    case WildFamily::kNanBursts: return "nan_bursts";
    case WildFamily::kDomainSpikes: return "domain_spikes";
  }
  return "?";
}

std::vector<WildFamily> AllWildFamilies() {
  return {WildFamily::kNoisyHealthy,    WildFamily::kLevelShifts,     WildFamily::kBatchRamp,
          WildFamily::kIrregularSpikes, WildFamily::kGradDivergence,  WildFamily::kRatioDivergence,
          WildFamily::kAttnGrowth,      WildFamily::kLseDrift,        WildFamily::kNanBursts,
          WildFamily::kDomainSpikes};
}

absl::StatusOr<WildFamily> ParseWildFamily(std::string_view name) {
  for (WildFamily f : AllWildFamilies()) {
    if (name == WildFamilyName(f)) return f;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown trace family '", std::string(name), "'"));
}

bool IsSlowBuild(WildFamily f) {
  return f == WildFamily::kGradDivergence || f == WildFamily::kRatioDivergence ||
         f == WildFamily::kAttnGrowth || f == WildFamily::kLseDrift;
}

const char* CorpusSplitName(CorpusSplit s) {
  return s == CorpusSplit::kTuning ? "tuning" : "held-out";
}

LabeledTrace GenerateWildTrace(const WildOptions& o) {
  const int64_t n = std::max<int64_t>(o.steps, 1);
  const int layers = std::max(0, o.layers);
  Rng rng(o.seed * 0xD1B54A32D192ED03ULL + static_cast<uint64_t>(o.family) * 104729 + 17);
  LabeledTrace t;
  t.name = absl::StrCat(WildFamilyName(o.family), "-", o.seed);

  // The run's own noise model.
  const int dof = rng.U() < 0.3 ? 0 : static_cast<int>(rng.Int(3, 6));  // 0: Gaussian
  const double sigma = rng.LogU(0.01, 0.04);
  const double l_inf = rng.U(1.6, 3.2);
  const double l0 = rng.U(5.0, 11.0);
  const double tau = rng.U(150, 800);
  const int64_t warm = rng.Int(100, 600);
  const double g_inf = rng.U(0.15, 1.0);
  const double g_sigma = rng.U(0.08, 0.25);
  const double lse0 = rng.U(3, 8);
  std::vector<double> a0(layers), lw(layers), attn_drift(layers);
  for (int l = 0; l < layers; ++l) {
    a0[l] = rng.U(10, 50);
    lw[l] = rng.U(0.3, 0.7);
    attn_drift[l] = rng.U(0.2, 1.0);
  }

  Mods m(n, layers);
  // domain_spikes: one-step excursions, by step: the domain that holds the
  // excess (-1: all alike) and the run loss's relative rise.
  std::vector<int> dom_at(n, -2);
  std::vector<double> dom_rise(n, 0.0);
  const int64_t lo = std::max<int64_t>(1200, warm + 600);
  auto pick_layers = [&](int k) {
    std::vector<int> out;
    for (int tries = 0; static_cast<int>(out.size()) < std::min(k, layers) && tries < 100; ++tries) {
      const int l = static_cast<int>(rng.Int(0, layers - 1));
      if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
    }
    return out;
  };
  switch (o.family) {
    case WildFamily::kNoisyHealthy:
      break;
    case WildFamily::kLevelShifts: {
      for (int64_t p : Place(rng, static_cast<int>(std::max<int64_t>(2, n / 1500)), 800, n - 300, 500)) {
        const int kind = static_cast<int>(rng.Int(0, 2));
        if (kind == 0) {  // data-mixture change: a step, up or down
          const double d = (rng.U() < 0.6 ? 1 : -1) * rng.U(0.03, 0.10);
          for (int64_t s = p; s < n; ++s) m.loss_add[s] += d;
        } else if (kind == 1) {  // lr schedule step: the loss falls over ~20 steps
          const double d = rng.U(0.02, 0.06);
          for (int64_t s = p; s < n; ++s) m.loss_add[s] -= d * std::min(1.0, (s - p + 1) / 20.0);
        } else {  // warm restart: lr re-warms, loss and grad norm climb, then decay
          const int64_t rise = rng.Int(50, 200);
          const double d = rng.U(0.04, 0.10);
          const double g = rng.U(1.2, 1.5);
          for (int64_t s = p; s < n; ++s) {
            const double x = static_cast<double>(s - p);
            const double f = x < rise ? x / rise : std::exp(-(x - rise) / (3.0 * rise));
            m.loss_add[s] += d * f;
            m.grad[s] *= 1 + (g - 1) * f;
          }
        }
      }
      break;
    }
    case WildFamily::kBatchRamp: {
      const int ramps = static_cast<int>(rng.Int(2, 4));
      for (int64_t p : Place(rng, ramps, 500, n - 500, 600)) {
        for (int64_t s = p; s < n; ++s) {
          m.noise[s] /= std::sqrt(2.0);
          m.grad[s] /= std::pow(2.0, 0.25);
        }
      }
      const int64_t period = rng.Int(200, 1000);
      const double size = rng.U(2, 4);
      for (int64_t s = period; s < n; s += period) m.loss_add[s] += size * sigma;
      break;
    }
    case WildFamily::kIrregularSpikes: {
      for (int64_t p : Place(rng, static_cast<int>(std::max<int64_t>(2, n / 1000)), lo, n - 150, 300)) {
        const double amp = rng.LogU(std::max(0.15, 6 * sigma), 3.0);
        const int64_t recover = static_cast<int64_t>(std::lround(rng.LogU(1, 100)));
        Spike(rng, p, amp, recover, rng.Int(0, 8), &m, &t.labels);
      }
      break;
    }
    case WildFamily::kGradDivergence:
    case WildFamily::kRatioDivergence: {
      const int64_t build = rng.Int(200, 800);
      const int64_t d = n - rng.Int(400, 900);
      const int64_t s0 = d - build;
      const int64_t rise = rng.Int(20, 100);
      const double level = rng.U(1.5, 3.0);
      if (o.family == WildFamily::kGradDivergence) {
        const double total = rng.U(10, 40);
        for (int64_t s = s0; s < n; ++s) {
          const double f = std::min(1.0, static_cast<double>(s - s0) / build);
          m.grad[s] *= std::pow(total, f);
        }
        Diverge(d, rise, level, 1.0, &m);
        t.labels.push_back(Label{Label::kPrecursor, s0, d + rise, d + rise, "grad_norm", -1});
      } else {
        for (int l : pick_layers(static_cast<int>(rng.Int(1, 2)))) {
          const double total = rng.U(5, 20);
          for (int64_t s = s0; s < n; ++s) {
            m.ratio[l][s] *= std::pow(total, std::min(1.0, static_cast<double>(s - s0) / build));
          }
          t.labels.push_back(Label{Label::kPrecursor, s0, d + rise, d + rise, "update_ratio", l});
        }
        Diverge(d, rise, level, 3.0, &m);
      }
      t.labels.push_back(Label{Label::kDivergence, d, d + rise, n - 1, "loss", -1});
      break;
    }
    case WildFamily::kAttnGrowth:
    case WildFamily::kLseDrift: {
      const int64_t build = o.family == WildFamily::kAttnGrowth ? rng.Int(300, 3000) : rng.Int(300, 1500);
      const int64_t p = n - rng.Int(300, 600);
      const int64_t s0 = std::max<int64_t>(lo / 2, p - build);
      const double amp = rng.LogU(std::max(0.3, 6 * sigma), 3.0);
      if (o.family == WildFamily::kAttnGrowth) {
        for (int l : pick_layers(static_cast<int>(rng.Int(1, 3)))) {
          const double total = rng.LogU(50, 400);
          for (int64_t s = s0; s < n; ++s) {
            const double f = std::min(1.0, static_cast<double>(s - s0) / static_cast<double>(p - s0));
            m.attn[l][s] *= std::pow(total, s <= p ? f : std::exp(-(s - p) / 20.0));
          }
          t.labels.push_back(Label{Label::kPrecursor, s0, p, p, "max_attn_logit", l});
        }
      } else {
        const double total = rng.U(3, 10);
        for (int64_t s = s0; s < n; ++s) {
          const double f = std::min(1.0, static_cast<double>(s - s0) / static_cast<double>(p - s0));
          m.lse_add[s] = total * (s <= p ? f * f : std::exp(-(s - p) / 20.0));
        }
        t.labels.push_back(Label{Label::kPrecursor, s0, p, p, "lse_mean", -1});
      }
      Spike(rng, p, amp, rng.Int(5, 40), rng.Int(0, 8), &m, &t.labels);
      break;
    }
    case WildFamily::kDomainSpikes: {
      for (int64_t p : Place(rng, static_cast<int>(std::max<int64_t>(3, n / 800)), lo, n - 150, 300)) {
        const bool data = rng.U() < 0.6;
        dom_at[p] = data ? 0 : -1;  // the domain is drawn with the domains below
        dom_rise[p] = rng.LogU(std::max(0.2, 10 * sigma), 1.0);
        if (data) {
          m.grad[p] *= rng.U(1.0, 2.0);
          t.labels.push_back(Label{Label::kSpike, p, p, std::min(n - 1, p + 1), "loss", -1});
        } else {
          m.loss_add[p] += dom_rise[p];
        }
      }
      break;
    }
    case WildFamily::kNanBursts: {
      for (int64_t p : Place(rng, static_cast<int>(rng.Int(1, 3)), lo, n - 100, 800)) {
        const int64_t len = rng.Int(1, 4);
        const int from = layers > 0 ? static_cast<int>(rng.Int(0, layers - 1)) : 0;
        for (int64_t s = p; s < std::min(n, p + len); ++s) m.nan[s] = from;
        t.labels.push_back(Label{Label::kNonFinite, p, p, std::min(n - 1, p + len - 1), "loss", -1});
      }
      break;
    }
  }

  t.steps.resize(n);
  double ar = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double s = static_cast<double>(i);
    StepSample& x = t.steps[i];
    x.step = i;
    const double ns = (1 + 2 * std::exp(-s / warm)) * m.noise[i];
    ar = 0.995 * ar + 0.05 * sigma * rng.N();
    const double eps = dof == 0 ? rng.N() : rng.T(dof);
    const double base = l_inf + (l0 - l_inf) * std::exp(-s / tau) - 0.04 * l_inf * std::log1p(s / 5000.0);
    x.loss = base * (1 + m.loss_add[i] + ns * sigma * eps + ar) * m.loss[i];
    const double benign = rng.U() < 0.003 ? rng.U(1.5, 3.0) : 1.0;
    const double g = g_inf * (1 + 4 * std::exp(-s / warm)) * std::exp(g_sigma * rng.N() * m.noise[i]);
    x.grad_norm = g * benign * m.grad[i];
    x.clipped = x.grad_norm > 1.0;
    const double lr = std::min(1.0, (s + 1.0) / warm);
    x.lse_mean = (lse0 + 0.5 * (1 - std::exp(-s / 2000.0))) * (1 + 0.01 * rng.N()) + m.lse_add[i];
    x.lse_max = (x.lse_mean + 3) * (1 + 0.02 * rng.N());
    x.layers.resize(layers);
    for (int l = 0; l < layers; ++l) {
      LayerSample& y = x.layers[l];
      y.max_attn_logit = a0[l] * (1 + attn_drift[l] * (1 - std::exp(-s / 1500.0))) *
                         std::exp(0.05 * rng.N()) * m.attn[l][i];
      y.grad_norm = g * benign * lw[l] * std::exp(0.1 * rng.N()) * m.grad[i];
      y.update_ratio = 1e-3 * lr * std::exp(0.1 * rng.N()) * std::sqrt(std::min(m.grad[i], 9.0)) *
                       m.ratio[l][i];
      y.act_rms = (1 + 0.1 * l) * (1 + 0.2 * s / n) * std::exp(0.02 * rng.N()) *
                  std::pow(m.attn[l][i], 0.1);
      y.param_norm = 50 * (1 + 0.3 * s / n) * (1 + 0.001 * rng.N());
    }
    if (m.nan[i] >= 0) {
      x.loss = NAN;
      x.grad_norm = INFINITY;
      x.clipped = true;
      x.nonfinite = rng.Int(10, 1000);
      for (int l = m.nan[i]; l < layers; ++l) {
        x.layers[l].act_rms = NAN;
        x.layers[l].max_attn_logit = NAN;
      }
      for (int l = 0; l < layers; ++l) x.layers[l].grad_norm = NAN;
    }
  }
  if (o.family == WildFamily::kDomainSpikes) {
    // Per-domain losses from a stream of their own (the run's draws above
    // are those of every family).
    Rng drng(o.seed * 0x9E3779B97F4A7C15ULL + 0xD0);
    static constexpr const char* kNames[] = {"web", "code", "books", "math", "wiki"};
    const int nd = static_cast<int>(drng.Int(3, 5));
    std::vector<double> share(nd), level(nd);
    double ssum = 0, lsum = 0;
    for (int d = 0; d < nd; ++d) ssum += share[d] = drng.U(0.5, 2.0);
    for (int d = 0; d < nd; ++d) {
      share[d] /= ssum;
      lsum += share[d] * (level[d] = drng.U(0.7, 1.3));
    }
    for (int d = 0; d < nd; ++d) level[d] /= lsum;  // Σ share·level = 1
    const double own = drng.U(0.2, 0.5) * sigma;    // each domain's own noise
    for (int64_t i = 0; i < n; ++i) {
      StepSample& x = t.steps[i];
      if (!std::isfinite(x.loss)) continue;
      const int hit = dom_at[i] == 0 ? static_cast<int>(drng.Int(0, nd - 1)) : -1;
      x.domains.resize(nd);
      double total = 0;
      for (int d = 0; d < nd; ++d) {
        double v = x.loss * level[d] * (1 + own * drng.N());
        // The whole rise in one domain's share of the batch.
        if (d == hit) v *= 1 + dom_rise[i] / (share[d] * level[d]);
        x.domains[d] = DomainSample{kNames[d], v, static_cast<int64_t>(std::lround(4096 * share[d]))};
        total += share[d] * v;
      }
      x.loss = total;
    }
  }
  std::sort(t.labels.begin(), t.labels.end(),
            [](const Label& a, const Label& b) { return a.onset < b.onset; });
  return t;
}

std::vector<LabeledTrace> WildCorpus(CorpusSplit split, double scale) {
  struct Entry {
    WildFamily family;
    int count;
    int64_t steps;
  };
  static constexpr Entry kEntries[] = {
      {WildFamily::kNoisyHealthy, 5, 20000},   {WildFamily::kLevelShifts, 5, 10000},
      {WildFamily::kBatchRamp, 4, 10000},      {WildFamily::kIrregularSpikes, 8, 6000},
      {WildFamily::kGradDivergence, 6, 4000},  {WildFamily::kRatioDivergence, 6, 4000},
      {WildFamily::kAttnGrowth, 6, 6000},      {WildFamily::kLseDrift, 6, 5000},
      {WildFamily::kNanBursts, 5, 5000},       {WildFamily::kDomainSpikes, 6, 6000},
  };
  const uint64_t base = split == CorpusSplit::kTuning ? 1000 : 900000;
  std::vector<LabeledTrace> out;
  for (const Entry& e : kEntries) {
    const int count = std::max(1, static_cast<int>(std::lround(e.count * scale)));
    for (int i = 0; i < count; ++i) {
      out.push_back(GenerateWildTrace({e.family, base + static_cast<uint64_t>(i), e.steps, 4}));
    }
  }
  return out;
}

}  // namespace spikeguard::detect
