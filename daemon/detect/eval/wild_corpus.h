// wild_corpus.h
// -----------------------------------------------------------------------------
// A labeled corpus that is not the detector's mirror (the benchmark's held-out
// families, tuned on none of them): trace
// families built the way other people's runs look, each with several seeds,
// every value a pure function of (family, seed, steps, layers).
//
// Every trace draws its own noise model from its seed: loss noise Gaussian or
// Student-t with 3–6 degrees of freedom, at a scale of 1–4 % of the loss
// (heavy tails: single-step excursions of 10–20 % happen in healthy runs),
// a slowly wandering AR(1) component, a log-normal grad norm with benign
// 1.5–3× outliers, per-layer statistics with their own noise and healthy
// drift. Families (what an incident should open on is labeled; the rest is
// healthy and must stay silent):
//   noisy_healthy     nothing else (long)
//   level_shifts      legit level shifts: data-mixture changes (loss steps
//                     ±3–10 %), lr schedule steps (loss falls a few %),
//                     warm restarts (lr re-warms: the loss climbs 4–10 % over
//                     50–200 steps, grad norm ×1.2–1.5, then decays)
//   batch_ramp        the batch size doubles 2–4 times (loss and grad-norm
//                     noise shrink by √2 each time), plus periodic eval /
//                     checkpoint blips: one-step loss bumps of 2–4 noise scales
//                     every 200–1000 steps
//   irregular_spikes  PaLM-like spikes: heights from max(15 %, 6 noise scales)
//                     to 300 %, rise in 0–2 steps, recover in 1–100 steps;
//                     the grad norm jumps 3–30× starting 0–8 steps before the
//                     loss moves (a one-step spike always has its grad jump)
//   grad_divergence   the global grad norm grows 10–40× over 200–800 steps,
//                     then the loss diverges (×1.5–3 over 20–100 steps, stays)
//   ratio_divergence  the update-to-weight ratio of one or two layers grows
//                     5–20× over 200–800 steps, then the loss diverges
//   attn_growth       one to three layers' max attention logit grows 50–400×
//                     over 300–3000 steps, then a sharp spike with a grad jump
//   lse_drift         the output log-sum-exp drifts up by 3–10 over 300–1500
//                     steps, then a sharp spike
//   nan_bursts        1–3 bursts of 1–4 non-finite steps
//   domain_spikes     per-domain losses (3–5 domains, token shares and loss
//                     levels of their own, a little independent noise beside
//                     the run's common noise; the run loss is their
//                     token-weighted mean) with one-step excursions every
//                     300+ steps: bad batches (≈60 %, labeled) lift one
//                     domain's loss so that the run loss rises by
//                     max(20 %, 10 noise scales) … 100 % for one step, the
//                     grad norm at most ×2; the rest (unlabeled) lift every
//                     domain alike by the same amounts — an eval or logging
//                     glitch, a blip. Only the per-domain losses tell them
//                     apart. The other families carry no per-domain losses.
// Precursor labels (signal, layer, onset = where the build starts, peak = the
// event it announces) sit beside the event labels of the slow-build families
// (grad_divergence, ratio_divergence, attn_growth, lse_drift).
//
// Splits. The tuning split uses seeds [1000, 1000 + count); the held-out
// split seeds [900000, 900000 + count): nothing tuned on the tuning split
// has seen a held-out trace (a new noise draw, event placement, heights,
// rates and lead times for every family).
//
//   for (const LabeledTrace& t : WildCorpus(CorpusSplit::kHeldOut)) ...
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/detect/eval/trace_gen.h"

namespace spikeguard::detect {

enum class WildFamily {
  kNoisyHealthy,
  kLevelShifts,
  kBatchRamp,
  kIrregularSpikes,
  kGradDivergence,
  kRatioDivergence,
  kAttnGrowth,
  kLseDrift,
  kNanBursts,
  kDomainSpikes,
};

const char* WildFamilyName(WildFamily f);
absl::StatusOr<WildFamily> ParseWildFamily(std::string_view name);
std::vector<WildFamily> AllWildFamilies();
// Families whose instability builds over hundreds of steps (precursor leads).
bool IsSlowBuild(WildFamily f);

struct WildOptions {
  WildFamily family = WildFamily::kNoisyHealthy;
  uint64_t seed = 1;
  int64_t steps = 6000;
  int layers = 4;
};

// Named "<family>-<seed>".
LabeledTrace GenerateWildTrace(const WildOptions& options);

enum class CorpusSplit { kTuning, kHeldOut };
const char* CorpusSplitName(CorpusSplit s);

// Every family, several seeds each (~350k steps at scale 1).
std::vector<LabeledTrace> WildCorpus(CorpusSplit split, double scale = 1.0);

}  // namespace spikeguard::detect
