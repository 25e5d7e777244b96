// detector_bench: spikeguard's detector against the five framework baselines
// (llm.c, OLMo-core, LLM Foundry, Megatron-LM, W&B z-score) on the same
// labeled synthetic traces (issue 5 §1–2).
//
//   detector_bench --out DIR [--seed N] [--scale X] [--lead-window N]
//                  [--post-peak N] [--write-traces DIR]
//
// Prints one table — precision, recall, F1, false alarms per 10,000 steps,
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

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir, traces_dir, extra_dir;
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
                   "[--post-peak N] [--write-traces DIR] [--extra-traces DIR]\n";
      return 2;
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<LabeledTrace> corpus = BenchmarkCorpus(seed, scale);
  // Labeled traces from files (NAME.jsonl + NAME.labels.json), e.g. the
  // reference worker's real spikes written by worker_traces.sh.
  int extra = 0;
  if (!extra_dir.empty()) {
    std::vector<std::string> names;
    if (DIR* d = opendir(extra_dir.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string f = e->d_name;
        if (f.size() > 6 && f.substr(f.size() - 6) == ".jsonl") names.push_back(f.substr(0, f.size() - 6));
      }
      closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
      const std::string prefix = absl::StrCat(extra_dir, "/", n);
      auto steps = ReadTraceJsonl(prefix + ".jsonl");
      auto labels = ReadLabels(prefix + ".labels.json");
      if (!steps.ok() || !labels.ok()) {
        std::cerr << "detector_bench: " << prefix << ": "
                  << (steps.ok() ? labels.status() : steps.status()) << "\n";
        return 1;
      }
      corpus.push_back(LabeledTrace{n, std::move(*steps), std::move(*labels)});
      ++extra;
    }
  }
  int64_t total_steps = 0;
  int total_labels = 0;
  for (const auto& t : corpus) {
    total_steps += static_cast<int64_t>(t.steps.size());
    for (const auto& l : t.labels) total_labels += l.kind != Label::kPrecursor;
    if (!traces_dir.empty()) {
      mkdir(traces_dir.c_str(), 0755);
      const std::string prefix = absl::StrCat(traces_dir, "/", t.name);
      if (auto s = WriteTraceJsonl(prefix + ".jsonl", t.steps); !s.ok()) {
        std::cerr << "detector_bench: " << s << "\n";
        return 1;
      }
      if (auto s = WriteLabels(prefix + ".labels.json", t); !s.ok()) {
        std::cerr << "detector_bench: " << s << "\n";
        return 1;
      }
    }
  }

  const std::vector<std::string> detectors = DetectorNames();
  std::vector<DetectorScore> scores;
  // scenario -> detector -> counts
  std::map<std::string, std::map<std::string, ScoreCounts>> by_scenario;
  std::map<std::string, double> seconds;
  for (const std::string& d : detectors) {
    ScoreCounts total;
    const auto d0 = std::chrono::steady_clock::now();
    for (const LabeledTrace& t : corpus) {
      auto alarms = RunDetector(d, t.steps);
      if (!alarms.ok()) {
        std::cerr << "detector_bench: " << alarms.status() << "\n";
        return 1;
      }
      const ScoreCounts c =
          ScoreTrace(*alarms, t.labels, static_cast<int64_t>(t.steps.size()), rule);
      total.Add(c);
      by_scenario[ScenarioOf(t.name)][d].Add(c);
    }
    seconds[d] = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
    scores.push_back(Summarize(d, total));
  }

  std::string md = absl::StrFormat(
      "## Detector quality (labeled traces)\n\n"
      "%d traces (%d read from files: the reference worker's and spikeguard-tracegen's), %d "
      "steps, %d event labels (spikes, "
      "divergences, non-finite bursts); synthetic seed %d.\n"
      "An alarm is a true positive when it falls in [onset − %d, peak + %d] of a label; later "
      "alarms up to the label's end + %d are duplicates; every other alarm is a false alarm. "
      "Lead = peak − alarm step (positive: before the peak).\n\n"
      "| detector | precision | recall | F1 | false alarms / 10k steps | median lead (steps) | "
      "detected | false alarms | µs/step |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
      static_cast<int>(corpus.size()), extra, total_steps, total_labels, seed, rule.lead_window,
      rule.post_peak, rule.post_peak);
  for (const DetectorScore& s : scores) {
    absl::StrAppend(&md, absl::StrFormat("| %s | %.3f | %.3f | %.3f | %.2f | %s | %d/%d | %d | %.2f |\n",
                                         s.detector, s.precision, s.recall, s.f1,
                                         s.false_alarms_per_10k, Num(s.median_lead, "%.0f"),
                                         s.counts.detected, s.counts.labels,
                                         s.counts.false_alarms,
                                         1e6 * seconds[s.detector] / total_steps));
  }
  absl::StrAppend(&md,
                  "\n### By scenario: detected/labels (false alarms) [median lead]\n\n| scenario |");
  for (const auto& d : detectors) absl::StrAppend(&md, " ", d, " |");
  absl::StrAppend(&md, "\n| --- |");
  for (size_t i = 0; i < detectors.size(); ++i) absl::StrAppend(&md, " ---: |");
  absl::StrAppend(&md, "\n");
  for (const auto& [scenario, per] : by_scenario) {
    absl::StrAppend(&md, "| ", scenario, " |");
    for (const auto& d : detectors) {
      const ScoreCounts& c = per.at(d);
      absl::StrAppend(&md, absl::StrFormat(" %d/%d (%d) [%s] |", c.detected, c.labels,
                                           c.false_alarms, Num(MedianOrNan(c.leads), "%.0f")));
    }
    absl::StrAppend(&md, "\n");
  }
  const DetectorScore& sg = scores.front();
  absl::StrAppend(
      &md, absl::StrFormat(
               "\n### spikeguard precursors\n\n"
               "| precursor labels | detected | median \\|start error\\| (steps) | false "
               "warnings / 10k steps |\n| ---: | ---: | ---: | ---: |\n| %d | %d | %s | %.2f |\n",
               sg.counts.precursor_labels, sg.counts.precursors_detected,
               Num(sg.median_abs_start_error, "%.0f"), sg.false_warnings_per_10k));
  std::cout << md;

  // JSON.
  std::string js = absl::StrFormat(
      "{\n  \"traces\": %d,\n  \"steps\": %d,\n  \"labels\": %d,\n  \"seed\": %d,\n"
      "  \"match_rule\": {\"lead_window\": %d, \"post_peak\": %d},\n  \"detectors\": [\n",
      static_cast<int>(corpus.size()), total_steps, total_labels, seed, rule.lead_window,
      rule.post_peak);
  for (size_t i = 0; i < scores.size(); ++i) {
    const DetectorScore& s = scores[i];
    absl::StrAppend(
        &js,
        absl::StrFormat(
            "    {\"detector\": \"%s\", \"precision\": %s, \"recall\": %s, \"f1\": %s, "
            "\"false_alarms_per_10k\": %s, \"median_lead_steps\": %s, \"detected\": %d, "
            "\"labels\": %d, \"false_alarms\": %d, \"duplicates\": %d, \"us_per_step\": %s",
            s.detector, JsonNum(s.precision), JsonNum(s.recall), JsonNum(s.f1),
            JsonNum(s.false_alarms_per_10k), JsonNum(s.median_lead), s.counts.detected,
            s.counts.labels, s.counts.false_alarms, s.counts.duplicates,
            JsonNum(1e6 * seconds[s.detector] / total_steps)));
    if (s.detector == "spikeguard") {
      absl::StrAppend(&js, absl::StrFormat(
                               ", \"precursor_labels\": %d, \"precursors_detected\": %d, "
                               "\"median_abs_start_error\": %s, \"false_warnings_per_10k\": %s",
                               s.counts.precursor_labels, s.counts.precursors_detected,
                               JsonNum(s.median_abs_start_error),
                               JsonNum(s.false_warnings_per_10k)));
    }
    absl::StrAppend(&js, "}", i + 1 < scores.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&js, "  ],\n  \"by_scenario\": {\n");
  size_t si = 0;
  for (const auto& [scenario, per] : by_scenario) {
    absl::StrAppend(&js, "    \"", scenario, "\": {");
    size_t di = 0;
    for (const auto& d : detectors) {
      const ScoreCounts& c = per.at(d);
      absl::StrAppend(&js, absl::StrFormat("\"%s\": {\"labels\": %d, \"detected\": %d, "
                                           "\"false_alarms\": %d}%s",
                                           d, c.labels, c.detected, c.false_alarms,
                                           ++di < detectors.size() ? ", " : ""));
    }
    absl::StrAppend(&js, "}", ++si < by_scenario.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&js, "  }\n}\n");

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
