#include "daemon/detect/eval/detectors.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "daemon/detect/eval/baselines.h"

namespace spikeguard::detect {

std::vector<std::string> DetectorNames() {
  std::vector<std::string> out = {"spikeguard"};
  for (std::string_view b : kBaselineNames) out.emplace_back(b);
  return out;
}

absl::StatusOr<std::vector<Alarm>> RunDetector(std::string_view name,
                                               const std::vector<StepSample>& steps,
                                               const RunMonitor::Options& options) {
  std::vector<Alarm> out;
  if (name == "spikeguard") {
    RunMonitor monitor(options);
    for (const StepSample& s : steps) {
      for (const MonitorEvent& e : monitor.Observe(s)) {
        Alarm a;
        a.step = e.step;
        a.detector = "spikeguard";
        a.signal = e.signal;
        a.layer = e.layer;
        a.value = e.value;
        a.score = e.score;
        a.start_step = e.onset_step;
        switch (e.kind) {
          case MonitorEvent::kSpikeOnset:
            a.kind = absl::StrCat(e.signal, "_spike");
            break;
          case MonitorEvent::kDivergence:
            a.kind = "loss_divergence";
            break;
          case MonitorEvent::kNonFinite:
            a.kind = "nonfinite";
            break;
          case MonitorEvent::kPrecursor:
            a.kind = "precursor";
            a.scored = false;
            break;
          case MonitorEvent::kBlip:
          case MonitorEvent::kLevelShift:
            a.kind = e.kind == MonitorEvent::kBlip ? "loss_blip" : "level_shift";
            a.scored = false;
            break;
          case MonitorEvent::kSpikeRecovered:
          case MonitorEvent::kSpikeDiverged:
            a.kind = MonitorEventKindName(e.kind);
            a.scored = false;
            break;
        }
        out.push_back(std::move(a));
      }
    }
    return out;
  }
  auto baseline = MakeBaseline(name);
  if (!baseline.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown detector '", std::string(name), "' (spikeguard, llmc, olmo, foundry, megatron, wandb)"));
  }
  NonFiniteDetector nonfinite(NonFiniteDetector::Options{});
  for (const StepSample& s : steps) {
    // The frameworks check the loss and the grad norm, not per-layer values.
    StepSample top;
    top.step = s.step;
    top.loss = s.loss;
    top.grad_norm = s.grad_norm;
    if (auto e = nonfinite.Observe(top)) {
      Alarm a;
      a.step = a.start_step = s.step;
      a.detector = std::string(name);
      a.kind = "nonfinite";
      a.signal = e->signal;
      a.value = e->value;
      out.push_back(std::move(a));
    }
    if (auto b = (*baseline)->Observe(s.step, s.loss)) {
      Alarm a;
      a.step = a.start_step = b->step;
      a.detector = std::string(name);
      a.kind = b->kind == "spike" ? "loss_spike" : b->kind;
      a.signal = "loss";
      a.value = b->value;
      a.score = b->score;
      out.push_back(std::move(a));
    }
  }
  return out;
}

}  // namespace spikeguard::detect
