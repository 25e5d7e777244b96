// Helpers for the reference worker's scenario tests: run the worker from a
// scenario file, read back its own JSONL telemetry, and judge it with the
// daemon's spike rule (daemon/detect/spike_detector.h).
#pragma once

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/detect/spike_detector.h"
#include "daemon/incident/policy.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "spikeguard/v1/telemetry.pb.h"
#include "worker/ref/reference_worker.h"

namespace spikeguard::testing {

inline std::string ScenarioFile(const std::string& name) {
  return std::string(SCENARIO_DIR) + "/" + name + ".conf";
}

inline std::vector<spikeguard::v1::StepReport> ReadTelemetry(const std::string& path) {
  std::vector<spikeguard::v1::StepReport> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    spikeguard::v1::StepReport r;
    auto s = google::protobuf::util::JsonStringToMessage(line, &r);
    EXPECT_TRUE(s.ok()) << s.ToString() << ": " << line.substr(0, 200);
    out.push_back(r);
  }
  return out;
}

// Every member has a default, so designated initializers may leave any out
// (-Wmissing-field-initializers).
struct RunSpec {
  std::string scenario{};
  std::string corpus{};
  std::string checkpoint_dir{};
  std::string telemetry{};
  int64_t generation = 0;
  std::string plan{};
  std::string resume_from{};
  int64_t bitflip_step = -1;
  int64_t steps = -1;  // -1: the scenario's
  std::vector<std::string> set{};
  // Applied after the checkpoint is loaded (SET_HPARAMS), e.g. 0.7.
  double lr_scale = 1.0;
};

// Runs the worker to completion; returns its telemetry.
inline std::vector<spikeguard::v1::StepReport> RunWorker(const RunSpec& spec,
                                                         uint64_t* param_hash = nullptr) {
  worker::ReferenceWorker::Options o;
  auto s = worker::ApplyConfigFile(ScenarioFile(spec.scenario), &o.config);
  EXPECT_TRUE(s.ok()) << s;
  for (const auto& kv : spec.set) EXPECT_TRUE(worker::ApplyConfigAssignment(kv, &o.config).ok()) << kv;
  if (spec.steps >= 0) o.config.steps = spec.steps;
  o.corpus_dir = spec.corpus;
  o.checkpoint_dir = spec.checkpoint_dir;
  o.telemetry_jsonl = spec.telemetry;
  o.generation = spec.generation;
  o.plan = spec.plan;
  o.resume_from = spec.resume_from;
  o.bitflip_step = spec.bitflip_step;
  std::remove(spec.telemetry.c_str());
  auto w = worker::ReferenceWorker::Create(o);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return {};
  if (spec.lr_scale != 1.0) {
    kernels::HParamOverrides hp = (*w)->trainer().hparams();
    hp.lr_scale = spec.lr_scale;
    (*w)->trainer().SetHParams(hp);
  }
  auto run = (*w)->Run();
  EXPECT_TRUE(run.ok()) << run;
  if (param_hash) *param_hash = (*w)->ParamHash();
  return ReadTelemetry(spec.telemetry);
}

struct Judgement {
  std::vector<detect::SpikeEvent> loss_onsets;
  std::vector<detect::SpikeEvent> grad_onsets;
  int64_t first_nonfinite_step = -1;
};

// The daemon's spike rule over loss and pre-clip grad norm, as the
// daemon's default policy sets it, with a fixed z threshold: these tests
// check the reference worker's mechanisms against one yardstick, and the
// live detector's calibration to a run's own tails (tail_factor)
// is judged by detector_bench and blip_test, not here.
inline Judgement Judge(const std::vector<spikeguard::v1::StepReport>& reports) {
  Judgement j;
  const spikeguard::v1::Policy policy = incident::DefaultPolicy();
  detect::SpikeDetector::Options loss_options = incident::SpikeOptions(policy.loss_spike());
  detect::SpikeDetector::Options grad_options = incident::SpikeOptions(policy.grad_norm_spike());
  loss_options.tail_factor = 0;
  grad_options.tail_factor = 0;
  detect::SpikeDetector loss(loss_options);
  detect::SpikeDetector grad(grad_options);
  for (const auto& r : reports) {
    if (j.first_nonfinite_step < 0 && (r.nonfinite_count() > 0 || !std::isfinite(r.loss()))) {
      j.first_nonfinite_step = r.step();
    }
    if (auto e = loss.Observe(r.step(), r.loss()); e && e->state == detect::SpikeEvent::kOnset) {
      j.loss_onsets.push_back(*e);
    }
    if (auto e = grad.Observe(r.step(), r.grad_norm()); e && e->state == detect::SpikeEvent::kOnset) {
      j.grad_onsets.push_back(*e);
    }
  }
  return j;
}

// The loss over its trailing 64-step median at `step`.
inline double PeakOverBaseline(const std::vector<spikeguard::v1::StepReport>& reports, int64_t step) {
  std::deque<double> before;
  double value = 0;
  for (const auto& r : reports) {
    if (r.step() < step && r.step() >= step - 64) before.push_back(r.loss());
    if (r.step() == step) value = r.loss();
  }
  return value / detect::Median(before);
}

}  // namespace spikeguard::testing
