// spikeguard-detect: runs spikeguard's detector and the framework baselines
// over a trace file and prints every alarm; with labels, scores them.
//
//   spikeguard-detect --trace FILE [--labels FILE]
//       [--detector spikeguard|llmc|olmo|foundry|megatron|wandb|all]
//       [--lead-window N] [--post-peak N] [--quiet]
//   spikeguard-detect --generate SCENARIO --out PREFIX [--seed N] [--steps N]
//       [--layers N]      writes PREFIX.jsonl and PREFIX.labels.json
//
// A trace is the JSONL the reference worker writes with --telemetry-out (one
// StepReport per line, proto JSON; bare NaN/Infinity tokens as Python writes
// them are accepted) or a CSV export (W&B, TensorBoard: a step column and
// metric columns); an unknown field or a per-layer metric without a layer
// index is an error naming the line and the field. Labels are the sidecar JSON of
// daemon/detect/eval/trace_io.h. Exit codes: 0 ok, 1 failure, 2 usage.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/args.h"
#include "daemon/detect/eval/detectors.h"
#include "daemon/detect/eval/scoring.h"
#include "daemon/detect/eval/trace_gen.h"
#include "daemon/detect/eval/trace_io.h"
#include "daemon/detect/eval/wild_corpus.h"

namespace {

using namespace spikeguard::detect;

constexpr char kUsage[] =
    "usage: spikeguard-detect --trace FILE [--labels FILE]\n"
    "           [--detector spikeguard|llmc|olmo|foundry|megatron|wandb|all]\n"
    "           [--lead-window N] [--post-peak N] [--quiet]\n"
    "       spikeguard-detect --generate SCENARIO --out PREFIX [--seed N] [--steps N] "
    "[--layers N]\n"
    "scenarios: healthy sharp_spikes grad_blowup slow_divergence plateau drift nan_burst "
    "fragility\n"
    "           noisy_healthy level_shifts batch_ramp irregular_spikes grad_divergence\n"
    "           ratio_divergence attn_growth lse_drift nan_bursts domain_spikes (the wild\n"
    "           families of wild_corpus.h)\n";

int Usage(const std::string& why) {
  std::cerr << "spikeguard-detect: " << why << "\n" << kUsage;
  return 2;
}

std::string Num(double v) {
  if (std::isnan(v)) return "-";
  return absl::StrFormat("%.4g", v);
}

int Generate(const std::map<std::string, std::string>& f) {
  auto scenario = ParseScenario(f.at("generate"));
  auto family = ParseWildFamily(f.at("generate"));
  if (!scenario.ok() && !family.ok()) {
    return Usage("unknown scenario '" + f.at("generate") + "'");
  }
  if (!f.count("out")) return Usage("--generate needs --out PREFIX");
  TraceGenOptions o;
  uint64_t seed = 1;
  int64_t steps = 4000;
  int layers = 4;
  if (f.count("seed") && !absl::SimpleAtoi(f.at("seed"), &seed)) return Usage("bad --seed");
  if (f.count("steps") && (!absl::SimpleAtoi(f.at("steps"), &steps) || steps <= 0)) {
    return Usage("bad --steps");
  }
  if (f.count("layers") && (!absl::SimpleAtoi(f.at("layers"), &layers) || layers < 0)) {
    return Usage("bad --layers");
  }
  LabeledTrace t;
  if (scenario.ok()) {
    o.scenario = *scenario;
    o.seed = seed;
    o.steps = steps;
    o.layers = layers;
    t = GenerateTrace(o);
  } else {
    t = GenerateWildTrace({*family, seed, steps, layers});
  }
  const std::string prefix = f.at("out");
  if (auto s = WriteTraceJsonl(prefix + ".jsonl", t.steps); !s.ok()) {
    std::cerr << "spikeguard-detect: " << s << "\n";
    return 1;
  }
  if (auto s = WriteLabels(prefix + ".labels.json", t); !s.ok()) {
    std::cerr << "spikeguard-detect: " << s << "\n";
    return 1;
  }
  std::cout << "wrote " << prefix << ".jsonl (" << t.steps.size() << " steps) and " << prefix
            << ".labels.json (" << t.labels.size() << " labels)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  static const std::vector<spikeguard::FlagSpec> kFlags = {
      {"trace"}, {"labels"}, {"detector"}, {"lead-window"}, {"post-peak"},
      {"quiet", spikeguard::FlagSpec::kBool}, {"generate"}, {"out"}, {"seed"}, {"steps"},
      {"layers"}};
  const std::vector<std::string> words(argv + 1, argv + argc);
  absl::StatusOr<spikeguard::ParsedArgs> args = spikeguard::ParseArgs(words, kFlags, {}, 0);
  if (!args.ok()) return Usage(std::string(args.status().message()));
  if (args->help) {
    std::cout << kUsage;
    return 0;
  }
  std::map<std::string, std::string> f;
  for (const auto& [name, values] : args->flags) {
    if (name == "quiet" && values.back() != "true") continue;
    f[name] = values.back();
  }
  if (f.count("generate")) return Generate(f);
  if (!f.count("trace")) return Usage("--trace is required");

  std::vector<std::string> detectors;
  const std::string which = f.count("detector") ? f["detector"] : "all";
  if (which == "all") {
    detectors = DetectorNames();
  } else {
    detectors = {which};
  }
  MatchRule rule;
  if (f.count("lead-window") && !absl::SimpleAtoi(f["lead-window"], &rule.lead_window)) {
    return Usage("bad --lead-window");
  }
  if (f.count("post-peak") && !absl::SimpleAtoi(f["post-peak"], &rule.post_peak)) {
    return Usage("bad --post-peak");
  }

  auto steps = ReadTrace(f["trace"]);
  if (!steps.ok()) {
    std::cerr << "spikeguard-detect: " << steps.status() << "\n";
    return 1;
  }
  std::vector<Label> labels;
  const bool have_labels = f.count("labels") > 0;
  if (have_labels) {
    auto l = ReadLabels(f["labels"]);
    if (!l.ok()) {
      std::cerr << "spikeguard-detect: " << l.status() << "\n";
      return 1;
    }
    labels = *std::move(l);
  }
  std::cout << "trace " << f["trace"] << ": " << steps->size() << " steps";
  if (!steps->empty()) {
    std::cout << " (" << steps->front().step << ".." << steps->back().step << ")";
  }
  std::cout << "\n";

  std::vector<DetectorScore> scores;
  for (const std::string& d : detectors) {
    auto alarms = RunDetector(d, *steps);
    if (!alarms.ok()) return Usage(std::string(alarms.status().message()));
    if (!f.count("quiet")) {
      std::cout << absl::StrFormat("%-8s %-10s %-16s %-15s %5s %11s %11s %8s\n", "step",
                                   "detector", "kind", "signal", "layer", "value", "score",
                                   "start");
      for (const Alarm& a : *alarms) {
        std::cout << absl::StrFormat("%-8d %-10s %-16s %-15s %5s %11s %11s %8d\n", a.step,
                                     a.detector, a.kind, a.signal,
                                     a.layer >= 0 ? std::to_string(a.layer) : "-", Num(a.value),
                                     Num(a.score), a.start_step);
      }
    }
    if (have_labels) {
      scores.push_back(Summarize(d, ScoreTrace(*alarms, labels,
                                               static_cast<int64_t>(steps->size()), rule)));
    }
  }
  if (have_labels) {
    std::cout << "\nscores (alarm matches a label within [onset-" << rule.lead_window << ", peak+"
              << rule.post_peak << "]):\n";
    std::cout << absl::StrFormat("%-10s %6s %6s %8s %6s %9s %6s %6s %9s %10s\n", "detector",
                                 "labels", "hits", "false", "prec", "recall", "f1", "FA/10k",
                                 "lead_med", "precursor");
    for (const DetectorScore& s : scores) {
      std::cout << absl::StrFormat(
          "%-10s %6d %6d %8d %6.3f %9.3f %6.3f %6.2f %9s %10s\n", s.detector, s.counts.labels,
          s.counts.detected, s.counts.false_alarms, s.precision, s.recall, s.f1,
          s.false_alarms_per_10k, Num(s.median_lead),
          s.counts.precursor_labels > 0
              ? absl::StrCat(s.counts.precursors_detected, "/", s.counts.precursor_labels)
              : std::string("-"));
    }
  }
  return 0;
}
