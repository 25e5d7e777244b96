// trace_gen.h
// -----------------------------------------------------------------------------
// Labeled synthetic traces for the detector benchmark and tests (issue 5 §1).
// A trace is a run's steps (StepSample) plus labels saying where the real
// events are: spike onsets, peaks and ends, and precursor starts. Every
// trace is a pure function of its options (scenario, seed, length, layers):
// the benchmark regenerates the corpus at run time instead of storing it.
//
// The healthy part of every trace is a decaying loss curve with Gaussian
// noise plus a slowly wandering AR(1) component, noisier during the lr
// warmup; a grad norm that falls from its warmup level with log-normal noise
// and occasional benign 1.5–3× outliers (healthy runs have them); per-layer
// statistics with their own noise and slow healthy drift. On top of it, by
// scenario:
//   kHealthy         nothing else (long, several seeds)
//   kSharpSpikes     spikes of +15 % … +300 % that rise in 0–2 steps and
//                    recover in 5–30 steps, with a grad-norm jump
//   kGradBlowup      grad norm 0.24 → 0.95 → 2.4 → 16 → 145 → 960 (×1, ×4,
//                    ×10, ×67, ×600, ×4000 of its level) over the five steps
//                    before the loss peak; then recovery or divergence
//   kSlowDivergence  the loss doubles over 200–600 steps and stays up, after
//                    an attention-logit ramp in one layer
//   kPlateau         long flat stretches with tiny noise, benign +2–4 % bumps,
//                    then a second descent (no labels)
//   kDrift           the loss creeps up ~15 % over a long run (no labels)
//   kNanBurst        1–4 consecutive non-finite steps, starting in one layer
//   kFragility       one layer's max attention logit grows exponentially for
//                    150–500 steps to 3e3–2e4, then one or two sharp spikes
//
// Labels: kSpike / kDivergence / kNonFinite are what a spike detector should
// alarm on; kPrecursor (signal, layer, start) is what a precursor detector
// should date. A label's `end` is the last step still elevated.
//
//   LabeledTrace t = GenerateTrace({.scenario = Scenario::kSharpSpikes, .seed = 3});
//   for (const StepSample& s : t.steps) monitor.Observe(s);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/detect/step_sample.h"

namespace spikeguard::detect {

struct Label {
  enum Kind { kSpike, kDivergence, kNonFinite, kPrecursor };
  Kind kind = kSpike;
  int64_t onset = 0;
  int64_t peak = 0;
  int64_t end = 0;
  // Precursor labels: the series and layer (-1: run level) that leads.
  std::string signal;
  int layer = -1;
};

const char* LabelKindName(Label::Kind kind);
absl::StatusOr<Label::Kind> ParseLabelKind(std::string_view name);

struct LabeledTrace {
  std::string name;
  std::vector<StepSample> steps;
  std::vector<Label> labels;
};

enum class Scenario {
  kHealthy,
  kSharpSpikes,
  kGradBlowup,
  kSlowDivergence,
  kPlateau,
  kDrift,
  kNanBurst,
  kFragility,
};

const char* ScenarioName(Scenario s);
absl::StatusOr<Scenario> ParseScenario(std::string_view name);

struct TraceGenOptions {
  Scenario scenario = Scenario::kHealthy;
  uint64_t seed = 1;
  int64_t steps = 4000;
  int layers = 4;
};

LabeledTrace GenerateTrace(const TraceGenOptions& options);

// The benchmark corpus: every scenario, several seeds, ~260k steps at
// scale 1 (lengths scale linearly; scale 0.1 makes a quick smoke corpus).
std::vector<LabeledTrace> BenchmarkCorpus(uint64_t seed = 1, double scale = 1.0);

}  // namespace spikeguard::detect
