#include "daemon/detect/eval/trace_gen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"

namespace spikeguard::detect {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Deterministic everywhere: mt19937_64 is specified bit for bit, and the
// distributions are written out here (the standard library's are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double U() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }
  double U(double a, double b) { return a + (b - a) * U(); }
  double LogU(double a, double b) { return std::exp(U(std::log(a), std::log(b))); }
  int64_t Int(int64_t a, int64_t b) {  // inclusive
    return a + static_cast<int64_t>(U() * static_cast<double>(b - a + 1)) % (b - a + 1);
  }
  double N() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = U(), u2 = U();
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2 * std::log(u1));
    spare_ = r * std::sin(2 * kPi * u2);
    has_spare_ = true;
    return r * std::cos(2 * kPi * u2);
  }

 private:
  std::mt19937_64 g_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// `k` event positions in [lo, hi], at least `gap` apart (fewer if they do
// not fit).
std::vector<int64_t> Place(Rng& rng, int k, int64_t lo, int64_t hi, int64_t gap) {
  std::vector<int64_t> out;
  for (int tries = 0; static_cast<int>(out.size()) < k && tries < 1000; ++tries) {
    if (hi < lo) break;
    const int64_t p = rng.Int(lo, hi);
    bool ok = true;
    for (int64_t q : out) ok = ok && std::llabs(p - q) >= gap;
    if (ok) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Mods {
  explicit Mods(int64_t n, int layers)
      : loss(n, 1.0),
        grad(n, 1.0),
        attn(layers, std::vector<double>(n, 1.0)),
        lgrad_lead(-1),
        nan_from_layer(n, -1),
        bump(n, 1.0) {}
  std::vector<double> loss;
  std::vector<double> grad;
  std::vector<std::vector<double>> attn;
  // A layer whose grad norm leads the global one by a step (blow-ups).
  int lgrad_lead;
  // ≥ 0: the step is non-finite from this layer on.
  std::vector<int> nan_from_layer;
  // Benign single-step loss bumps (plateau scenario).
  std::vector<double> bump;
};

void SharpSpike(Rng& rng, int64_t p, double amp, Mods* m, std::vector<Label>* labels) {
  const int64_t n = static_cast<int64_t>(m->loss.size());
  const int64_t r = rng.Int(0, 2);
  const int64_t recover = rng.Int(5, 30);
  const double g = amp * rng.U(2, 6);
  for (int64_t s = std::max<int64_t>(0, p - r); s <= std::min(n - 1, p + recover); ++s) {
    const double f = s < p ? static_cast<double>(s - (p - r) + 1) / (r + 1)
                           : std::exp(-5.0 * static_cast<double>(s - p) / recover);
    m->loss[s] *= 1 + amp * f;
    m->grad[s] *= 1 + g * f;
  }
  labels->push_back(Label{Label::kSpike, p - r, p, std::min(n - 1, p + recover), "loss", -1});
}

double Uniform(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

const char* LabelKindName(Label::Kind kind) {
  switch (kind) {
    case Label::kSpike:
      return "spike";
    case Label::kDivergence:
      return "divergence";
    case Label::kNonFinite:
      return "nonfinite";
    case Label::kPrecursor:
      return "precursor";
  }
  return "?";
}

absl::StatusOr<Label::Kind> ParseLabelKind(std::string_view name) {
  for (Label::Kind k : {Label::kSpike, Label::kDivergence, Label::kNonFinite, Label::kPrecursor}) {
    if (name == LabelKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown label kind '", std::string(name), "'"));
}

const char* ScenarioName(Scenario s) {
  switch (s) {
    case Scenario::kHealthy:
      return "healthy";
    case Scenario::kSharpSpikes:
      return "sharp_spikes";
    case Scenario::kGradBlowup:
      return "grad_blowup";
    case Scenario::kSlowDivergence:
      return "slow_divergence";
    case Scenario::kPlateau:
      return "plateau";
    case Scenario::kDrift:
      return "drift";
    case Scenario::kNanBurst:
      return "nan_burst";
    case Scenario::kFragility:
      return "fragility";
  }
  return "?";
}

absl::StatusOr<Scenario> ParseScenario(std::string_view name) {
  for (Scenario s : {Scenario::kHealthy, Scenario::kSharpSpikes, Scenario::kGradBlowup,
                     Scenario::kSlowDivergence, Scenario::kPlateau, Scenario::kDrift,
                     Scenario::kNanBurst, Scenario::kFragility}) {
    if (name == ScenarioName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown scenario '", std::string(name), "'"));
}

LabeledTrace GenerateTrace(const TraceGenOptions& o) {
  const int64_t n = std::max<int64_t>(o.steps, 1);
  const int layers = std::max(0, o.layers);
  Rng rng(o.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(o.scenario) * 7919 + 1);
  LabeledTrace t;
  t.name = absl::StrCat(ScenarioName(o.scenario), "-", o.seed);

  // The healthy run.
  const double l_inf = rng.U(1.6, 2.6);
  const double l0 = 5.5;
  const double tau = rng.U(150, 600);
  const int64_t warm = rng.Int(100, 400);
  double sigma = rng.LogU(0.005, 0.02);
  const double g_inf = rng.U(0.2, 0.5);
  const double g_sigma = rng.U(0.08, 0.2);
  std::vector<double> a0(layers), lw(layers);
  for (int l = 0; l < layers; ++l) {
    a0[l] = rng.U(15, 40);
    lw[l] = rng.U(0.3, 0.7);
  }
  const double plateau_drop = rng.U(0.3, 0.7) * n;
  if (o.scenario == Scenario::kPlateau) sigma = rng.U(0.002, 0.004);

  Mods m(n, layers);
  const int64_t lo = std::max<int64_t>(800, warm + 400);
  switch (o.scenario) {
    case Scenario::kHealthy:
    case Scenario::kDrift:
      break;
    case Scenario::kPlateau:
      for (int64_t s = 0; s < n; ++s) {
        if (rng.U() < 0.002) m.bump[s] = rng.U(1.02, 1.04);
      }
      break;
    case Scenario::kSharpSpikes:
      for (int64_t p : Place(rng, static_cast<int>(std::max<int64_t>(1, n / 1250)), lo, n - 100, 400)) {
        SharpSpike(rng, p, rng.LogU(0.15, 3.0), &m, &t.labels);
      }
      break;
    case Scenario::kGradBlowup: {
      const auto peaks = Place(rng, static_cast<int>(std::max<int64_t>(1, n / 1500)), lo, n - 200, 600);
      m.lgrad_lead = layers > 0 ? static_cast<int>(rng.Int(0, layers - 1)) : -1;
      static constexpr double kMult[] = {1, 4, 10, 67, 600, 4000};
      for (size_t i = 0; i < peaks.size(); ++i) {
        const int64_t p = peaks[i];
        const double amp = rng.U(0.5, 3.0);
        for (int j = 1; j < 6; ++j) m.grad[p - 5 + j] *= kMult[j];
        for (int64_t j = 1; p + j < n && j < 12; ++j) m.grad[p + j] *= 1 + 4000 * std::exp(-1.5 * j);
        m.loss[p - 1] *= 1 + amp / 3;
        m.loss[p] *= 1 + amp;
        const bool diverge = i + 1 == peaks.size() && rng.U() < 0.3;
        if (diverge) {
          const double level = 1 + amp * rng.U(0.5, 0.9);
          for (int64_t s = p + 1; s < n; ++s) {
            m.loss[s] *= level;
            m.grad[s] *= 20;
          }
          t.labels.push_back(Label{Label::kDivergence, p - 1, p, n - 1, "loss", -1});
        } else {
          const int64_t recover = rng.Int(10, 30);
          for (int64_t j = 1; j <= recover && p + j < n; ++j) {
            m.loss[p + j] *= 1 + amp * std::exp(-5.0 * j / recover);
          }
          t.labels.push_back(Label{Label::kSpike, p - 1, p, std::min(n - 1, p + recover), "loss", -1});
        }
        t.labels.push_back(Label{Label::kPrecursor, p - 4, p, p, "grad_norm", -1});
      }
      break;
    }
    case Scenario::kSlowDivergence: {
      const int64_t d = n - rng.Int(700, 1000);
      const double dur = rng.U(200, 600);
      const int64_t lead = rng.Int(50, 200);
      const int culprit = layers > 0 ? static_cast<int>(rng.Int(0, layers - 1)) : -1;
      for (int64_t s = d; s < n; ++s) {
        const double x = (s - d) / dur;
        m.loss[s] *= std::min(4.0, 1 + x * x);
        m.grad[s] *= std::exp(std::min(5.0, 3 * x));
      }
      if (culprit >= 0) {
        const double rho = std::log(50.0) / (lead + dur);
        for (int64_t s = d - lead; s < n; ++s) m.attn[culprit][s] *= std::exp(rho * (s - (d - lead)));
        t.labels.push_back(Label{Label::kPrecursor, d - lead, n - 1, n - 1, "max_attn_logit", culprit});
      }
      t.labels.push_back(Label{Label::kDivergence, d, n - 1, n - 1, "loss", -1});
      break;
    }
    case Scenario::kNanBurst:
      for (int64_t p : Place(rng, static_cast<int>(std::max<int64_t>(1, n / 2000)), lo, n - 100, 500)) {
        const int64_t k = rng.Int(1, 4);
        const int from = layers > 0 ? static_cast<int>(rng.Int(0, layers - 1)) : 0;
        for (int64_t s = p; s < p + k && s < n; ++s) m.nan_from_layer[s] = from;
        t.labels.push_back(Label{Label::kNonFinite, p, p, std::min(n - 1, p + k - 1), "loss", from});
      }
      break;
    case Scenario::kFragility: {
      const int64_t lead = rng.Int(150, 500);
      const int64_t q = rng.Int(lo, std::max(lo, n - lead - 600));
      const int culprit = layers > 0 ? static_cast<int>(rng.Int(0, layers - 1)) : -1;
      const double target = rng.LogU(3e3, 2e4);
      if (culprit >= 0) {
        const double rho = std::log(target / a0[culprit]) / lead;
        for (int64_t s = q; s < n; ++s) {
          m.attn[culprit][s] *= std::exp(rho * std::min<int64_t>(s - q, lead)) *
                                (1 + 0.2 * std::max<int64_t>(0, s - q - lead) / 1000.0);
        }
        t.labels.push_back(Label{Label::kPrecursor, q, q + lead, q + lead, "max_attn_logit", culprit});
      }
      const int64_t p1 = std::min(n - 50, q + lead + rng.Int(0, 50));
      SharpSpike(rng, p1, rng.LogU(0.3, 1.5), &m, &t.labels);
      if (rng.U() < 0.5 && p1 + 450 < n - 50) {
        SharpSpike(rng, p1 + rng.Int(150, 400), rng.LogU(0.3, 1.5), &m, &t.labels);
      }
      // The precursor label points at the first spike's peak.
      if (culprit >= 0) {
        for (Label& l : t.labels) {
          if (l.kind == Label::kPrecursor) l.peak = l.end = p1;
        }
      }
      break;
    }
  }

  // Render.
  const double phi = 0.98;
  double ar = 0;
  t.steps.resize(n);
  for (int64_t s = 0; s < n; ++s) {
    StepSample& x = t.steps[s];
    x.step = s;
    const double ns = s < warm ? 2.0 : 1.0;
    ar = phi * ar + 0.5 * sigma * std::sqrt(1 - phi * phi) * rng.N();
    double base = l_inf + (l0 - l_inf) * std::exp(-s / tau) - 0.05 * l_inf * std::log1p(s / 5000.0);
    if (o.scenario == Scenario::kDrift) base *= 1 + 0.15 * s / n;
    if (o.scenario == Scenario::kPlateau) {
      base = l_inf + (l0 - l_inf) * std::exp(-s / tau) +
             0.6 / (1 + std::exp((s - plateau_drop) / 20.0));
    }
    x.loss = base * (1 + ns * (sigma * rng.N() + ar)) * m.loss[s] * m.bump[s];
    const double benign = rng.U() < 0.003 ? rng.U(1.5, 3.0) : 1.0;
    const double g = g_inf * (1 + 4 * std::exp(-static_cast<double>(s) / warm)) *
                     std::exp(g_sigma * rng.N());
    x.grad_norm = g * benign * m.grad[s];
    x.clipped = x.grad_norm > 1.0;
    const double lr = std::min(1.0, (s + 1.0) / warm);
    x.lse_mean = 5.0 * (1 + 0.01 * rng.N());
    x.lse_max = (x.lse_mean + 3) * (1 + 0.02 * rng.N());
    x.layers.resize(layers);
    for (int l = 0; l < layers; ++l) {
      LayerSample& y = x.layers[l];
      y.max_attn_logit = a0[l] * (1 + 0.5 * (1 - std::exp(-s / 1000.0))) *
                         std::exp(0.05 * rng.N()) * m.attn[l][s];
      const double lead = (l == m.lgrad_lead && s + 1 < n) ? m.grad[s + 1] : m.grad[s];
      y.grad_norm = g * benign * lw[l] * std::exp(0.1 * rng.N()) * lead;
      y.update_ratio = 1e-3 * lr * std::exp(0.1 * rng.N()) * std::sqrt(std::min(lead, 9.0));
      y.act_rms = (1 + 0.1 * l) * (1 + 0.2 * s / n) * std::exp(0.02 * rng.N()) *
                  std::pow(m.attn[l][s], 0.1);
      y.param_norm = 50 * (1 + 0.3 * s / n) * (1 + 0.001 * rng.N());
    }
    if (m.nan_from_layer[s] >= 0) {
      x.loss = NAN;
      x.grad_norm = INFINITY;
      x.clipped = true;
      x.nonfinite = rng.Int(10, 1000);
      for (int l = m.nan_from_layer[s]; l < layers; ++l) {
        x.layers[l].act_rms = NAN;
        x.layers[l].max_attn_logit = NAN;
      }
      for (int l = 0; l < layers; ++l) x.layers[l].grad_norm = NAN;
    }
  }
  std::sort(t.labels.begin(), t.labels.end(),
            [](const Label& a, const Label& b) { return a.onset < b.onset; });
  return t;
}

std::vector<LabeledTrace> BenchmarkCorpus(uint64_t seed, double scale) {
  struct Entry {
    Scenario scenario;
    int count;
    int64_t steps;
  };
  static constexpr Entry kEntries[] = {
      {Scenario::kHealthy, 4, 20000},       {Scenario::kSharpSpikes, 6, 5000},
      {Scenario::kGradBlowup, 6, 3000},     {Scenario::kSlowDivergence, 4, 3000},
      {Scenario::kPlateau, 3, 10000},       {Scenario::kDrift, 3, 20000},
      {Scenario::kNanBurst, 4, 4000},       {Scenario::kFragility, 4, 4000},
  };
  std::vector<LabeledTrace> out;
  for (const Entry& e : kEntries) {
    const int count = std::max(1, static_cast<int>(std::lround(e.count * scale)));
    for (int i = 0; i < count; ++i) {
      out.push_back(GenerateTrace({e.scenario, seed * 1000 + static_cast<uint64_t>(i), e.steps, 4}));
    }
  }
  return out;
}

// ---- TraceModel: the scripted, counter-based run --------------------------

uint64_t LossHash(double loss) {
  uint64_t bits;
  std::memcpy(&bits, &loss, sizeof(bits));
  return SplitMix64Hash(bits);
}

double TraceModel::Noise(uint32_t rank, int64_t step, uint64_t stream) const {
  const uint64_t key =
      SplitMix64Hash(spec_.seed ^ SplitMix64Hash(static_cast<uint64_t>(step) * 1315423911ULL +
                                                 (static_cast<uint64_t>(rank) << 40) + (stream << 56)));
  const double u1 = Uniform(key);
  const double u2 = Uniform(SplitMix64Hash(key));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double TraceModel::BaselineLoss(int64_t step) const {
  return 1.8 + 3.7 * std::exp(-static_cast<double>(step) / 400.0);
}

double TraceModel::SpikeFactor(int64_t step) const {
  double f = 1.0;
  for (int64_t peak : spec_.spikes) {
    const int64_t d = step - peak;
    if (d == -1) f = std::max(f, 1.0 + 0.3 * (spec_.spike_factor - 1.0));
    if (d >= 0 && d < 40) {
      // Sharp rise, recovery over ~10-20 steps.
      f = std::max(f, 1.0 + (spec_.spike_factor - 1.0) * std::exp(-static_cast<double>(d) / 4.0));
    }
  }
  return f;
}

double TraceModel::Precursor(int64_t step) const {
  double p = 0.0;
  for (int64_t peak : spec_.spikes) {
    const int64_t d = peak - step;
    if (d >= 0 && d < spec_.precursor_steps) {
      p = std::max(p, 1.0 - static_cast<double>(d) / static_cast<double>(spec_.precursor_steps));
    } else if (d < 0 && d > -40) {
      p = std::max(p, std::exp(static_cast<double>(d) / 8.0));
    }
  }
  return p;
}

double TraceModel::GradBlowup(int64_t step) const {
  // Multipliers for the 5 steps before the peak and the peak itself.
  static constexpr double kRamp[] = {4.0, 10.0, 67.0, 600.0, 4000.0, 3000.0};
  double f = 1.0;
  for (int64_t peak : spec_.spikes) {
    const int64_t d = step - (peak - 5);
    if (d >= 0 && d < 6) f = std::max(f, kRamp[d]);
    if (d >= 6 && d < 30) f = std::max(f, 1.0 + 8.0 * std::exp(-static_cast<double>(d - 6) / 3.0));
  }
  return f;
}

spikeguard::v1::StepReport TraceModel::Report(uint32_t rank, int64_t step) const {
  spikeguard::v1::StepReport r;
  r.set_step(step);
  r.set_data_position(step);
  const double base = BaselineLoss(step);
  double loss = base * (1.0 + 0.012 * Noise(rank, step, 1)) * SpikeFactor(step);
  bool nan_step = false;
  for (int64_t s : spec_.nan_steps) nan_step |= (s == step);
  if (nan_step) loss = std::numeric_limits<double>::quiet_NaN();
  r.set_loss(loss);
  for (size_t d = 0; d < spec_.domains.size(); ++d) {
    auto* dl = r.add_domain_losses();
    dl->set_domain(spec_.domains[d]);
    dl->set_loss(nan_step ? loss
                          : base * (0.85 + 0.15 * static_cast<double>(d)) *
                                (1.0 + 0.02 * Noise(rank, step, 10 + d)) * SpikeFactor(step));
    dl->set_tokens(spec_.tokens_per_rank / static_cast<int64_t>(spec_.domains.size()));
  }
  const double grad = 0.24 * (1.0 + 0.1 * Noise(rank, step, 2)) * GradBlowup(step);
  r.set_grad_norm(nan_step ? std::numeric_limits<double>::infinity() : grad);
  r.set_clipped(nan_step || grad > 1.0);
  const double warm = std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(spec_.warmup_steps));
  r.set_lr(spec_.peak_lr * warm);
  r.set_loss_scale(1.0);
  r.set_tokens(spec_.tokens_per_rank);
  r.set_step_time_s(0.1 * (1.0 + 0.02 * Noise(rank, step, 3)));
  const double pre = Precursor(step);
  r.set_lse_mean(5.5 + 0.2 * Noise(rank, step, 4) + 20.0 * pre * pre);
  r.set_lse_max(r.lse_mean() + 2.0 + 0.3 * std::abs(Noise(rank, step, 5)));
  r.set_nonfinite_count(nan_step ? 1 : 0);
  r.set_loss_hash(LossHash(loss));
  r.set_unix_ms(1'700'000'000'000LL + step * 100);
  for (int l = 0; l < spec_.layers; ++l) {
    auto* ls = r.add_layers();
    ls->set_layer(static_cast<uint32_t>(l));
    const double growth = 5.0 * std::log1p(static_cast<double>(step) / 100.0);
    // The precursor grows in the last layer first, exponentially.
    const double ramp = (l == spec_.layers - 1) ? std::expm1(6.0 * pre) * 10.0 : 0.0;
    ls->set_max_attn_logit(20.0 + growth + 0.5 * Noise(rank, step, 20 + l) + ramp);
    ls->set_grad_norm(grad / std::sqrt(static_cast<double>(spec_.layers)) *
                      (1.0 + 0.05 * Noise(rank, step, 40 + l)));
    ls->set_update_ratio(1e-3 * (1.0 + 0.1 * Noise(rank, step, 60 + l)) * (1.0 + 3.0 * pre));
    ls->set_act_rms(1.0 + 0.1 * l + 0.01 * Noise(rank, step, 80 + l) + 2.0 * pre);
    ls->set_param_norm(30.0 + 0.002 * static_cast<double>(step) + 0.01 * l);
  }
  return r;
}

std::vector<Label> TraceModel::Labels() const {
  std::vector<Label> out;
  for (int64_t peak : spec_.spikes) {
    out.push_back(Label{Label::kSpike, peak - 1, peak, peak + 20, "loss", -1});
  }
  for (int64_t nan : spec_.nan_steps) {
    out.push_back(Label{Label::kNonFinite, nan, nan, nan, "loss", -1});
  }
  return out;
}

}  // namespace spikeguard::detect
