// baselines.h
// -----------------------------------------------------------------------------
// The loss-spike rules of the training frameworks people use today, kept as
// pure classes over the same series spikeguard sees, so the detector benchmark
// compares them side by side on the same traces. Each mirrors its upstream
// rule; what upstream does after firing (skip the update, stop the run, rerun
// the step) is not modelled.
//
//   llmc      llm.c `OutlierDetector` (llmc/outlier_detector.h): z-score of
//             the new value against the last 128 values (mean and population
//             variance of the ring buffer, the new value excluded); no score
//             until the buffer is full; every value then enters the buffer,
//             outliers included. train_gpt2.cu acts on z above a threshold
//             (flags -sl / -sn); the baseline uses 7.
//   olmo      OLMo-core style spike rule as commonly stated: the value is
//             above mean + 6σ of the trailing 128 values, with at least 64
//             samples; every value enters the window. (The upstream source
//             was not in our reference corpus; this follows the design.)
//   foundry   LLM Foundry `KillLossSpike` callback (callbacks/
//             kill_loss_spike_callback.py): once the 100-value window is
//             full, a loss ≥ 2 × the window mean is an outlier; more than
//             `patience` = 4 consecutive outliers (i.e. 5) is a loss spike.
//             Every loss enters the window. Also its "high loss" rule: after
//             2 × window steps, at least half the window above the loss cap
//             (max of the first full window, at most 10).
//   megatron  Megatron-LM `RerunStateMachine.is_unexpectedly_large`
//             (threshold 10, context "loss"): the max |loss| over the first
//             100 samples is frozen; afterwards |loss| ≥ 10 × that max is
//             spiky. Non-finite values are ignored (checked elsewhere).
//   wandb     the z-score alert people configure on a W&B panel: z of the
//             value against the trailing 30 values (sample std), z > 3.
//
// Conventions shared by all five, so the table compares the rules and not
// the plumbing: non-finite values never enter a window (llm.c's running sums
// would otherwise stay NaN forever); the harness (detectors.h) grants every
// baseline the immediate non-finite alarm every framework has in some form;
// and an alarm is a rising edge: a rule that holds for k consecutive steps
// is one alarm, at its first step.
//
//   auto b = MakeBaseline("llmc");
//   for (auto& [step, loss] : series) if (auto a = (*b)->Observe(step, loss)) ...
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace spikeguard::detect {

struct BaselineAlarm {
  int64_t step = 0;
  // "spike" or (foundry) "high_loss".
  std::string kind = "spike";
  double value = 0;
  // The rule's own score: z, ratio to the mean, or ratio to the max.
  double score = 0;
};

class LossBaseline {
 public:
  virtual ~LossBaseline() = default;
  // Feeds one loss; returns an alarm on the first step a rule holds.
  virtual std::optional<BaselineAlarm> Observe(int64_t step, double loss) = 0;
  virtual std::string_view name() const = 0;
  // Values held (bounded by the rule's window).
  virtual size_t footprint() const = 0;
};

// llm.c OutlierDetector with a z threshold.
class LlmcOutlierDetector : public LossBaseline {
 public:
  explicit LlmcOutlierDetector(int window = 128, double threshold = 7.0)
      : window_(window), threshold_(threshold) {}
  std::optional<BaselineAlarm> Observe(int64_t step, double loss) override;
  std::string_view name() const override { return "llmc"; }
  size_t footprint() const override { return buf_.size(); }
  // The z-score the new value would get, NaN until the buffer is full (as
  // upstream returns).
  double ZScore(double x) const;

 private:
  int window_;
  double threshold_;
  std::deque<double> buf_;
  bool prev_ = false;
};

class OlmoSpikeRule : public LossBaseline {
 public:
  explicit OlmoSpikeRule(int window = 128, int min_samples = 64, double sigmas = 6.0)
      : window_(window), min_samples_(min_samples), sigmas_(sigmas) {}
  std::optional<BaselineAlarm> Observe(int64_t step, double loss) override;
  std::string_view name() const override { return "olmo"; }
  size_t footprint() const override { return buf_.size(); }

 private:
  int window_;
  int min_samples_;
  double sigmas_;
  std::deque<double> buf_;
  bool prev_ = false;
};

class FoundryKillLossSpike : public LossBaseline {
 public:
  explicit FoundryKillLossSpike(int window = 100, double outlier_multiplier = 2.0,
                                int patience = 4, double max_loss_cap = 10.0)
      : window_(window),
        multiplier_(outlier_multiplier),
        patience_(patience),
        loss_cap_(max_loss_cap) {}
  std::optional<BaselineAlarm> Observe(int64_t step, double loss) override;
  std::string_view name() const override { return "foundry"; }
  size_t footprint() const override { return buf_.size(); }

 private:
  int window_;
  double multiplier_;
  int patience_;
  double loss_cap_;
  bool cap_set_ = false;
  int64_t seen_ = 0;
  int outliers_ = 0;
  bool high_prev_ = false;
  std::deque<double> buf_;
};

class MegatronSpikyLoss : public LossBaseline {
 public:
  explicit MegatronSpikyLoss(int num_samples = 100, double threshold = 10.0)
      : num_samples_(num_samples), threshold_(threshold) {}
  std::optional<BaselineAlarm> Observe(int64_t step, double loss) override;
  std::string_view name() const override { return "megatron"; }
  size_t footprint() const override { return 2; }

 private:
  int num_samples_;
  double threshold_;
  int count_ = 0;
  double max_ = 0;
  bool prev_ = false;
};

class WandbZScore : public LossBaseline {
 public:
  explicit WandbZScore(int window = 30, double threshold = 3.0)
      : window_(window), threshold_(threshold) {}
  std::optional<BaselineAlarm> Observe(int64_t step, double loss) override;
  std::string_view name() const override { return "wandb"; }
  size_t footprint() const override { return buf_.size(); }

 private:
  int window_;
  double threshold_;
  std::deque<double> buf_;
  bool prev_ = false;
};

// The five baselines by name, with the parameters listed above.
inline constexpr std::string_view kBaselineNames[] = {"llmc", "olmo", "foundry", "megatron",
                                                      "wandb"};
absl::StatusOr<std::unique_ptr<LossBaseline>> MakeBaseline(std::string_view name);

}  // namespace spikeguard::detect
