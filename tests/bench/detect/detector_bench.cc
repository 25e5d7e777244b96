// detector_bench: spikeguard's detector against the five framework baselines
// (llm.c, OLMo-core, LLM Foundry, Megatron-LM, W&B z-score) on the same
// labeled synthetic traces.
//
//   detector_bench --out DIR [--seed N] [--scale X] [--lead-window N]
//                  [--post-peak N] [--write-traces DIR]
//                  [--split all|both|tuning|held-out|workers]
//                  [--worker-traces DIR | --no-worker-traces] [--extra-traces DIR]
//                  [--ablate]   (spikeguard again with its tail, blip,
//                                level-shift and slow-build rules switched off)
//
// Three splits: "tuning" (the original families and the wild
// families' tuning seeds, wild_corpus.h), "held-out" (seeds nothing was
// tuned on) and "workers": real trainers' telemetry with real spikes — the
// C++ reference worker and the PyTorch trainer (worker/examples/torch_gpt)
// — read from labeled trace files (NAME.jsonl + NAME.labels.json). By
// default those are the fixtures committed in tests/testdata/detect_traces
// (make_traces.sh there regenerates them); --extra-traces DIR adds more (a
// file named like a fixture replaces it), --no-worker-traces leaves the
// split out. "both" is tuning and held-out; "all" (the default) adds
// workers. For each split it prints one table — precision, recall, F1, false alarms per 10,000 steps,
// median lead time before the loss peak — plus a per-scenario breakdown and
// the precursor figures, and writes them to DIR/detector_bench.json and
// DIR/detector_bench.md. The matching rule is in daemon/detect/eval/scoring.h.
// A benchmark prints figures; it fails only when it cannot run.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/detect/eval/detectors.h"
#include "daemon/detect/eval/scoring.h"
#include "daemon/detect/eval/trace_gen.h"
#include "daemon/detect/eval/trace_io.h"
#include "daemon/detect/eval/wild_corpus.h"

namespace {

using namespace spikeguard::detect;

std::string Num(double v, const char* fmt = "%.3f") {
  if (std::isnan(v)) return "-";
  return absl::StrFormat(fmt, v);
}

std::string JsonNum(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

std::string ScenarioOf(const std::string& trace_name) {
  return trace_name.substr(0, trace_name.rfind('-'));
}


// Families whose instability builds over hundreds of steps; their precursor
// leads are the "slow-build" figure.
bool SlowBuild(const std::string& family) {
  if (auto f = ParseWildFamily(family); f.ok()) return IsSlowBuild(*f);
  return family == "slow_divergence" || family == "fragility";
}

struct SplitResult {
  std::string name;
  std::string md;
  std::string json;
};

absl::StatusOr<SplitResult> EvaluateSplit(const std::string& name,
                                          const std::vector<LabeledTrace>& corpus,
                                          const MatchRule& rule, int from_files) {
  int64_t total_steps = 0;
  int total_labels = 0;
  for (const auto& t : corpus) {
    total_steps += static_cast<int64_t>(t.steps.size());
    for (const auto& l : t.labels) total_labels += l.kind != Label::kPrecursor;
  }
  const std::vector<std::string> detectors = DetectorNames();
  std::vector<DetectorScore> scores;
  // family -> detector -> counts
  std::map<std::string, std::map<std::string, ScoreCounts>> by_family;
  std::map<std::string, double> seconds;
  for (const std::string& d : detectors) {
    ScoreCounts total;
    const auto d0 = std::chrono::steady_clock::now();
    for (const LabeledTrace& t : corpus) {
      auto alarms = RunDetector(d, t.steps);
      if (!alarms.ok()) return alarms.status();
      const ScoreCounts c =
          ScoreTrace(*alarms, t.labels, static_cast<int64_t>(t.steps.size()), rule);
      total.Add(c);
      by_family[ScenarioOf(t.name)][d].Add(c);
    }
    seconds[d] = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
    scores.push_back(Summarize(d, total));
  }
  // spikeguard's precursor figures: leads on the slow-build families, false
  // warnings on the families with no labels at all (healthy runs).
  ScoreCounts slow, healthy;
  for (const auto& [family, per] : by_family) {
    const ScoreCounts& c = per.at("spikeguard");
    if (SlowBuild(family)) slow.Add(c);
    if (c.labels == 0 && c.precursor_labels == 0) healthy.Add(c);
  }
  const DetectorScore slow_s = Summarize("spikeguard", slow);
  const DetectorScore healthy_s = Summarize("spikeguard", healthy);

  SplitResult r;
  r.name = name;
  r.md = absl::StrFormat(
      "### Split: %s\n\n%d traces (%d read from files), %d steps, %d event labels (spikes, "
      "divergences, non-finite bursts).\n\n"
      "| detector | precision | recall | F1 | false alarms / 10k steps | median lead (steps) | "
      "detected | false alarms | µs/step |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
      name, static_cast<int>(corpus.size()), from_files, total_steps, total_labels);
  for (const DetectorScore& s : scores) {
    absl::StrAppend(&r.md, absl::StrFormat("| %s | %.3f | %.3f | %.3f | %.2f | %s | %d/%d | %d | %.2f |\n",
                                           s.detector, s.precision, s.recall, s.f1,
                                           s.false_alarms_per_10k, Num(s.median_lead, "%.0f"),
                                           s.counts.detected, s.counts.labels,
                                           s.counts.false_alarms,
                                           1e6 * seconds[s.detector] / total_steps));
  }
  absl::StrAppend(&r.md,
                  "\n#### By family (", name, "): detected/labels (false alarms) [median lead]\n\n| family |");
  for (const auto& d : detectors) absl::StrAppend(&r.md, " ", d, " |");
  absl::StrAppend(&r.md, "\n| --- |");
  for (size_t i = 0; i < detectors.size(); ++i) absl::StrAppend(&r.md, " ---: |");
  absl::StrAppend(&r.md, "\n");
  for (const auto& [family, per] : by_family) {
    absl::StrAppend(&r.md, "| ", family, " |");
    for (const auto& d : detectors) {
      const ScoreCounts& c = per.at(d);
      absl::StrAppend(&r.md, absl::StrFormat(" %d/%d (%d) [%s] |", c.detected, c.labels,
                                             c.false_alarms, Num(MedianOrNan(c.leads), "%.0f")));
    }
    absl::StrAppend(&r.md, "\n");
  }
  const DetectorScore& sg = scores.front();
  absl::StrAppend(
      &r.md,
      absl::StrFormat(
          "\n#### spikeguard precursors (%s)\n\n"
          "| precursor labels | detected | median \\|start error\\| (steps) | median precursor lead, "
          "slow-build families (steps) | false warnings / 10k steps, all | false warnings / 10k "
          "steps, healthy families |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n"
          "| %d | %d | %s | %s (%d/%d detected) | %.2f | %.2f |\n",
          name, sg.counts.precursor_labels, sg.counts.precursors_detected,
          Num(sg.median_abs_start_error, "%.0f"), Num(slow_s.median_precursor_lead, "%.0f"),
          slow.precursors_detected, slow.precursor_labels, sg.false_warnings_per_10k,
          healthy_s.false_warnings_per_10k));

  r.json = absl::StrFormat("{\"traces\": %d, \"steps\": %d, \"labels\": %d, \"detectors\": [\n",
                           static_cast<int>(corpus.size()), total_steps, total_labels);
  for (size_t i = 0; i < scores.size(); ++i) {
    const DetectorScore& s = scores[i];
    absl::StrAppend(
        &r.json,
        absl::StrFormat(
            "      {\"detector\": \"%s\", \"precision\": %s, \"recall\": %s, \"f1\": %s, "
            "\"false_alarms_per_10k\": %s, \"median_lead_steps\": %s, \"detected\": %d, "
            "\"labels\": %d, \"false_alarms\": %d, \"duplicates\": %d, \"us_per_step\": %s",
            s.detector, JsonNum(s.precision), JsonNum(s.recall), JsonNum(s.f1),
            JsonNum(s.false_alarms_per_10k), JsonNum(s.median_lead), s.counts.detected,
            s.counts.labels, s.counts.false_alarms, s.counts.duplicates,
            JsonNum(1e6 * seconds[s.detector] / total_steps)));
    if (s.detector == "spikeguard") {
      absl::StrAppend(
          &r.json,
          absl::StrFormat(", \"precursor_labels\": %d, \"precursors_detected\": %d, "
                          "\"median_abs_start_error\": %s, \"false_warnings_per_10k\": %s, "
                          "\"slow_build_median_precursor_lead\": %s, "
                          "\"healthy_false_warnings_per_10k\": %s",
                          s.counts.precursor_labels, s.counts.precursors_detected,
                          JsonNum(s.median_abs_start_error), JsonNum(s.false_warnings_per_10k),
                          JsonNum(slow_s.median_precursor_lead),
                          JsonNum(healthy_s.false_warnings_per_10k)));
    }
    absl::StrAppend(&r.json, "}", i + 1 < scores.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&r.json, "    ], \"by_family\": {\n");
  size_t si = 0;
  for (const auto& [family, per] : by_family) {
    absl::StrAppend(&r.json, "      \"", family, "\": {");
    size_t di = 0;
    for (const auto& d : detectors) {
      const ScoreCounts& c = per.at(d);
      absl::StrAppend(&r.json, absl::StrFormat("\"%s\": {\"labels\": %d, \"detected\": %d, "
                                               "\"false_alarms\": %d}%s",
                                               d, c.labels, c.detected, c.false_alarms,
                                               ++di < detectors.size() ? ", " : ""));
    }
    absl::StrAppend(&r.json, "}", ++si < by_family.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&r.json, "    }}");
  return r;
}


// spikeguard with parts of its tail, blip, level-shift and slow-build rules
// switched off, on one split:
// which rule moves which figure.
std::string Ablation(const std::string& name, const std::vector<LabeledTrace>& corpus,
                     const MatchRule& rule) {
  struct Variant {
    const char* label;
    RunMonitor::Options o;
  };
  auto off = [] {
    RunMonitor::Options o;
    o.loss.tail_factor = 0;
    o.grad_norm.tail_factor = 0;
    o.loss.hold_fraction = 1.0;
    o.loss.blip_steps = 0;
    o.loss.shift_tolerance = 0;
    o.precursor.slow_window = 0;
    return o;
  };
  std::vector<Variant> variants;
  variants.push_back(
      {"all rules off (the detector without tails, blips, level shifts, slow builds)", off()});
  {
    RunMonitor::Options o = off();
    o.loss.tail_factor = o.grad_norm.tail_factor = 2.0;
    variants.push_back({"+ tail-calibrated thresholds only", o});
  }
  {
    RunMonitor::Options o = off();
    o.loss.hold_fraction = 0.5;
    o.loss.blip_steps = 1;
    o.loss.shift_tolerance = 0.12;
    variants.push_back({"+ blips, corroboration, level shifts only", o});
  }
  {
    RunMonitor::Options o;
    o.precursor.slow_window = 0;
    variants.push_back({"all but the slow-build precursor rule", o});
  }
  {
    RunMonitor::Options o;
    o.domain_z = 0;
    variants.push_back({"all but per-domain corroboration", o});
  }
  variants.push_back({"all (default)", RunMonitor::Options{}});
  std::string md = absl::StrFormat(
      "\n#### Ablation (%s): spikeguard with rules switched off\n\n| variant | F1 | false alarms / "
      "10k | precursors detected | median precursor lead, slow-build (steps) |\n| --- | ---: | "
      "---: | ---: | ---: |\n",
      name);
  for (const Variant& v : variants) {
    ScoreCounts total, slow;
    for (const LabeledTrace& t : corpus) {
      auto alarms = RunDetector("spikeguard", t.steps, v.o);
      if (!alarms.ok()) continue;
      const ScoreCounts c =
          ScoreTrace(*alarms, t.labels, static_cast<int64_t>(t.steps.size()), rule);
      total.Add(c);
      if (SlowBuild(ScenarioOf(t.name))) slow.Add(c);
    }
    const DetectorScore s = Summarize("spikeguard", total);
    absl::StrAppend(&md, absl::StrFormat("| %s | %.3f | %.2f | %d/%d | %s |\n", v.label, s.f1,
                                         s.false_alarms_per_10k, total.precursors_detected,
                                         total.precursor_labels,
                                         Num(MedianOrNan(slow.precursor_leads), "%.0f")));
  }
  return md;
}

}  // namespace

#ifndef SPIKEGUARD_WORKER_TRACES_DIR
#define SPIKEGUARD_WORKER_TRACES_DIR ""
#endif

// Labeled trace files (NAME.jsonl + NAME.labels.json) in `dir`, by name.
absl::Status ReadLabeledDir(const std::string& dir, std::map<std::string, LabeledTrace>* out) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat(dir, ": cannot open the directory"));
  while (dirent* e = readdir(d)) {
    const std::string f = e->d_name;
    if (f.size() > 6 && f.substr(f.size() - 6) == ".jsonl") names.push_back(f.substr(0, f.size() - 6));
  }
  closedir(d);
  for (const std::string& n : names) {
    const std::string prefix = absl::StrCat(dir, "/", n);
    auto steps = ReadTrace(prefix + ".jsonl");
    if (!steps.ok()) return absl::Status(steps.status().code(), absl::StrCat(prefix, ": ", steps.status().message()));
    auto labels = ReadLabels(prefix + ".labels.json");
    if (!labels.ok()) return absl::Status(labels.status().code(), absl::StrCat(prefix, ": ", labels.status().message()));
    (*out)[n] = LabeledTrace{n, std::move(*steps), std::move(*labels)};
  }
  return absl::OkStatus();
}

int main(int argc, char** argv) {
  std::string out_dir, traces_dir, extra_dir, split = "all";
  std::string worker_dir = SPIKEGUARD_WORKER_TRACES_DIR;
  bool ablate = false;
  uint64_t seed = 1;
  double scale = 1.0;
  MatchRule rule;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::cerr << "detector_bench: " << flag << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    bool ok = true;
    if (a == "--out") {
      out_dir = value("--out");
    } else if (a == "--ablate") {
      ablate = true;
    } else if (a == "--split") {
      split = value("--split");
      ok = split == "all" || split == "both" || split == "tuning" || split == "held-out" ||
           split == "workers";
    } else if (a == "--worker-traces") {
      worker_dir = value("--worker-traces");
    } else if (a == "--no-worker-traces") {
      worker_dir.clear();
    } else if (a == "--extra-traces") {
      extra_dir = value("--extra-traces");
    } else if (a == "--write-traces") {
      traces_dir = value("--write-traces");
    } else if (a == "--seed") {
      ok = absl::SimpleAtoi(value("--seed"), &seed);
    } else if (a == "--scale") {
      ok = absl::SimpleAtod(value("--scale"), &scale) && scale > 0;
    } else if (a == "--lead-window") {
      ok = absl::SimpleAtoi(value("--lead-window"), &rule.lead_window);
    } else if (a == "--post-peak") {
      ok = absl::SimpleAtoi(value("--post-peak"), &rule.post_peak);
    } else {
      ok = false;
    }
    if (!ok) {
      std::cerr << "usage: detector_bench --out DIR [--seed N] [--scale X] [--lead-window N] "
                   "[--post-peak N] [--write-traces DIR] [--worker-traces DIR | "
                   "--no-worker-traces] [--extra-traces DIR] "
                   "[--split all|both|tuning|held-out|workers] [--ablate]\n";
      return 2;
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  // The workers split: labeled traces from files — the committed fixtures,
  // then --extra-traces (e.g. run_all.sh's fresh worker_traces.sh output;
  // a trace of the same name replaces the fixture).
  std::map<std::string, LabeledTrace> from_files;
  for (const std::string& dir : {worker_dir, extra_dir}) {
    if (dir.empty()) continue;
    if (dir == SPIKEGUARD_WORKER_TRACES_DIR && opendir(dir.c_str()) == nullptr) {
      std::cerr << "detector_bench: no worker traces at " << dir << " (the source tree); "
                << "the workers split is left out\n";
      continue;
    }
    if (absl::Status st = ReadLabeledDir(dir, &from_files); !st.ok()) {
      std::cerr << "detector_bench: " << st << "\n";
      return 1;
    }
  }
  std::vector<LabeledTrace> extra_traces;
  for (auto& [n, t] : from_files) extra_traces.push_back(std::move(t));

  // The tuning split: the original families (seed N) and the wild families'
  // tuning seeds. The held-out split: the wild families' held-out seeds and
  // the original families at seed N + 900 — never looked at while tuning.
  std::vector<SplitResult> results;
  for (const std::string& which :
       {std::string("tuning"), std::string("held-out"), std::string("workers")}) {
    const bool wanted = split == which || split == "all" || (split == "both" && which != "workers");
    if (!wanted) continue;
    if (which == "workers" && extra_traces.empty()) continue;
    std::vector<LabeledTrace> corpus;
    if (which == "tuning") {
      corpus = BenchmarkCorpus(seed, scale);
      for (auto& t : WildCorpus(CorpusSplit::kTuning, scale)) corpus.push_back(std::move(t));
    } else if (which == "workers") {
      corpus = extra_traces;
    } else {
      corpus = WildCorpus(CorpusSplit::kHeldOut, scale);
      for (auto& t : BenchmarkCorpus(seed + 900, scale)) corpus.push_back(std::move(t));
    }
    if (!traces_dir.empty()) {
      mkdir(traces_dir.c_str(), 0755);
      for (const auto& t : corpus) {
        const std::string prefix = absl::StrCat(traces_dir, "/", t.name);
        if (auto st = WriteTraceJsonl(prefix + ".jsonl", t.steps); !st.ok()) {
          std::cerr << "detector_bench: " << st << "\n";
          return 1;
        }
        if (auto st = WriteLabels(prefix + ".labels.json", t); !st.ok()) {
          std::cerr << "detector_bench: " << st << "\n";
          return 1;
        }
      }
    }
    auto r = EvaluateSplit(which, corpus, rule, static_cast<int>(which == "workers" ? extra_traces.size() : 0));
    if (!r.ok()) {
      std::cerr << "detector_bench: " << r.status() << "\n";
      return 1;
    }
    if (ablate) r->md += Ablation(which, corpus, rule);
    results.push_back(*std::move(r));
  }

  std::string md = absl::StrFormat(
      "## Detector quality (labeled traces)\n\n"
      "Synthetic seed %d. An alarm is a true positive when it falls in [onset − %d, peak + %d] "
      "of a label; later alarms up to the label's end + %d are duplicates; every other alarm is "
      "a false alarm. Lead = peak − alarm step (positive: before the peak). Precursor lead = "
      "the announced event's peak − the warning step.\n\n",
      seed, rule.lead_window, rule.post_peak, rule.post_peak);
  std::string js = absl::StrFormat(
      "{\n  \"seed\": %d,\n  \"match_rule\": {\"lead_window\": %d, \"post_peak\": %d},\n  "
      "\"splits\": {\n",
      seed, rule.lead_window, rule.post_peak);
  for (size_t i = 0; i < results.size(); ++i) {
    absl::StrAppend(&md, results[i].md, "\n");
    absl::StrAppend(&js, "    \"", results[i].name, "\": ", results[i].json,
                    i + 1 < results.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&js, "  }\n}\n");
  std::cout << md;

  if (!out_dir.empty()) {
    mkdir(out_dir.c_str(), 0755);
    std::ofstream(out_dir + "/detector_bench.md") << md;
    std::ofstream(out_dir + "/detector_bench.json") << js;
    std::cout << "\nwrote " << out_dir << "/detector_bench.md and " << out_dir
              << "/detector_bench.json\n";
  }
  std::cout << absl::StrFormat("elapsed %.1f s\n",
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                                   .count());
  return 0;
}
