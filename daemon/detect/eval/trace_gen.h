// trace_gen.h
// -----------------------------------------------------------------------------
// spikeguard's one synthetic trace generator: labeled traces for the detector
// benchmark and tests, and the run `spikeguard-tracegen` streams to the daemon
// in e2e, scenario and ingest tests. Every value is a pure function of the
// options, so traces are regenerated instead of stored. Two models share the
// label, scenario and trace-file vocabulary of this library (Label,
// LabeledTrace, eval/trace_io.h); each keeps the exact numbers its consumers'
// tests and benchmark figures are built on:
//
//  * GenerateTrace — a whole run of one scenario, drawn in order from one
//    seeded stream (events placed at random, labels derived from them). The
//    detector benchmark corpus (BenchmarkCorpus), tests/detect and
//    `spikeguard-detect --generate` use it.
//  * TraceModel — a scripted run (spikes and NaN steps at given steps) whose
//    every value is a hash of (seed, rank, step, series), so any rank's step
//    can be produced alone, in any order, as a full StepReport (domain losses,
//    lr, tokens, loss hash): what `spikeguard-tracegen` streams for any number
//    of ranks. Labels() gives its labels in the same Label form.
//
// GenerateTrace's scenarios. The healthy part of every trace is a decaying
// loss curve with Gaussian noise plus a slowly wandering AR(1) component,
// noisier during the lr warmup; a grad norm that falls from its warmup level
// with log-normal noise and occasional benign 1.5–3× outliers (healthy runs
// have them); per-layer statistics with their own noise and slow healthy
// drift. On top of it, by scenario:
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
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/detect/step_sample.h"
#include "spikeguard/v1/telemetry.pb.h"

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

// The scripted run. The baseline is a decaying loss curve with noise; each
// spike has precursors: the last layer's max attention logit climbs for
// `precursor_steps` before the spike, and the grad norm blows up over the
// five steps before the loss peaks (0.24 → 0.95 → 2.4 → 16 → 145 → 960
// style). A NaN step reports a NaN loss, an Inf grad norm and a non-finite
// count.
//
//   TraceSpec spec;
//   spec.layers = 4; spec.seed = 7; spec.spikes = {1200};
//   TraceModel model(spec);
//   spikeguard::v1::StepReport r = model.Report(/*rank=*/0, /*step=*/1200);
struct TraceSpec {
  int layers = 4;
  uint64_t seed = 1;
  // Steps at which the loss peaks.
  std::vector<int64_t> spikes;
  // Loss multiplier at the peak.
  double spike_factor = 2.5;
  // Steps the attention-logit precursor builds before a spike.
  int64_t precursor_steps = 200;
  // Steps at which the loss is NaN.
  std::vector<int64_t> nan_steps;
  int64_t warmup_steps = 100;
  double peak_lr = 1e-3;
  int64_t tokens_per_rank = 1024;
  std::vector<std::string> domains = {"prose", "code", "numeric"};
};

class TraceModel {
 public:
  explicit TraceModel(TraceSpec spec) : spec_(std::move(spec)) {}

  spikeguard::v1::StepReport Report(uint32_t rank, int64_t step) const;
  // The healthy loss at `step` without noise or spikes.
  double BaselineLoss(int64_t step) const;
  // What a detector should alarm on: each spike (the loss rises one step
  // before its peak and is back within 20 steps) and each NaN step, in the
  // order of spec().spikes then spec().nan_steps.
  std::vector<Label> Labels() const;
  const TraceSpec& spec() const { return spec_; }

 private:
  // Deterministic standard normal for (rank, step, stream).
  double Noise(uint32_t rank, int64_t step, uint64_t stream) const;
  // Multiplier >= 1 the spikes apply at `step` (1 far from any spike).
  double SpikeFactor(int64_t step) const;
  // Growth of the precursor at `step`: 0 far from a spike, up to 1 at it.
  double Precursor(int64_t step) const;
  // Grad-norm multiplier of the blow-up that leads the loss peak.
  double GradBlowup(int64_t step) const;

  TraceSpec spec_;
};

// splitmix64 of the float's bits: the loss hash of a StepReport.
uint64_t LossHash(double loss);

}  // namespace spikeguard::detect

// The scripted model under the names it had in worker/tracegen, for the
// worker-side code that streams it (spikeguard-tracegen, ingest_bench and
// tests/worker).
namespace spikeguard::worker {
using detect::LossHash;
using detect::TraceModel;
using detect::TraceSpec;
}  // namespace spikeguard::worker
