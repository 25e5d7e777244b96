// worker_config.h
// -----------------------------------------------------------------------------
// Configuration of the reference worker: the model, the optimizer and the
// training run, read from a scenario file of `key value` lines (# comments)
// and overridden by `--set key=value` flags. Scenario files live in
// tests/e2e/scenarios/.
//
//   # fragility: attention-logit growth, then spikes
//   layers 4
//   width 128
//   peak_lr 1.5e-2
//   warmup_steps 100
//   beta2 0.999
//   steps 2000
//
//   WorkerConfig config;
//   SG_RETURN_IF_ERROR(ApplyConfigFile("fragility.conf", &config));
//   SG_RETURN_IF_ERROR(ApplyConfigLine("peak_lr", "1.05e-2", &config));
//
// Unknown keys and bad values are INVALID_ARGUMENT naming the key (and file
// and line).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/config.h"

namespace spikeguard::worker {

struct WorkerConfig {
  kernels::ModelConfig model;
  kernels::OptimConfig optim;
  // Train until this many steps are done (step indices [0, steps)).
  int64_t steps = 2000;
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 50;
  int threads = 2;
  // Manifest overrides (0 / empty: the corpus's default manifest).
  int32_t batch_size = 0;
  int32_t seq_len = 0;
  uint64_t data_seed = 0;
  bool data_seed_set = false;
};

absl::Status ApplyConfigLine(absl::string_view key, absl::string_view value, WorkerConfig* config);
// "key=value".
absl::Status ApplyConfigAssignment(absl::string_view assignment, WorkerConfig* config);
absl::Status ApplyConfigFile(const std::string& path, WorkerConfig* config);
// Every key with its current value, one per line (for logs and --help).
std::string DescribeConfig(const WorkerConfig& config);

}  // namespace spikeguard::worker
