#include "worker/tracegen/trace_model.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace spikeguard::worker {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double Uniform(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

uint64_t LossHash(double loss) {
  uint64_t bits;
  std::memcpy(&bits, &loss, sizeof(bits));
  return SplitMix64(bits);
}

double TraceModel::Noise(uint32_t rank, int64_t step, uint64_t stream) const {
  const uint64_t key = SplitMix64(spec_.seed ^ SplitMix64(static_cast<uint64_t>(step) * 1315423911ULL +
                                                          (static_cast<uint64_t>(rank) << 40) +
                                                          (stream << 56)));
  const double u1 = Uniform(key);
  const double u2 = Uniform(SplitMix64(key));
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

}  // namespace spikeguard::worker
