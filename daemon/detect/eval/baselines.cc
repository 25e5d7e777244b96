#include "daemon/detect/eval/baselines.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace spikeguard::detect {
namespace {

// Mean and variance of a window; `sample` selects n − 1 in the denominator.
void MeanVar(const std::deque<double>& v, bool sample, double* mean, double* var) {
  const double n = static_cast<double>(v.size());
  *mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
  double ss = 0;
  for (double x : v) ss += (x - *mean) * (x - *mean);
  *var = ss / (sample ? std::max(1.0, n - 1) : n);
}

// Rising edge of a condition: an alarm only on its first step.
std::optional<BaselineAlarm> Edge(bool now, bool* prev, int64_t step, double value,
                                  double score, const char* kind = "spike") {
  const bool fire = now && !*prev;
  *prev = now;
  if (!fire) return std::nullopt;
  return BaselineAlarm{step, kind, value, score};
}

}  // namespace

double LlmcOutlierDetector::ZScore(double x) const {
  if (static_cast<int>(buf_.size()) < window_) return NAN;
  double mean, var;
  MeanVar(buf_, /*sample=*/false, &mean, &var);
  const double sd = std::sqrt(var);
  // Upstream divides unguarded; a flat window gives ±inf or NaN there too.
  return (x - mean) / sd;
}

std::optional<BaselineAlarm> LlmcOutlierDetector::Observe(int64_t step, double loss) {
  if (!std::isfinite(loss)) return std::nullopt;
  const double z = ZScore(loss);
  buf_.push_back(loss);
  while (static_cast<int>(buf_.size()) > window_) buf_.pop_front();
  return Edge(std::isfinite(z) && z > threshold_, &prev_, step, loss, z);
}

std::optional<BaselineAlarm> OlmoSpikeRule::Observe(int64_t step, double loss) {
  if (!std::isfinite(loss)) return std::nullopt;
  bool over = false;
  double z = 0;
  if (static_cast<int>(buf_.size()) >= min_samples_) {
    double mean, var;
    MeanVar(buf_, /*sample=*/false, &mean, &var);
    const double sd = std::sqrt(var);
    over = loss > mean + sigmas_ * sd;
    z = sd > 0 ? (loss - mean) / sd : 0;
  }
  buf_.push_back(loss);
  while (static_cast<int>(buf_.size()) > window_) buf_.pop_front();
  return Edge(over, &prev_, step, loss, z);
}

std::optional<BaselineAlarm> FoundryKillLossSpike::Observe(int64_t step, double loss) {
  if (!std::isfinite(loss)) return std::nullopt;
  ++seen_;
  std::optional<BaselineAlarm> alarm;
  if (static_cast<int>(buf_.size()) == window_) {
    // Upstream: with no loss cap given, the cap becomes the max of the first
    // full window, at most 10.
    if (!cap_set_) {
      loss_cap_ = std::min(*std::max_element(buf_.begin(), buf_.end()), loss_cap_);
      cap_set_ = true;
    }
    const double avg = std::accumulate(buf_.begin(), buf_.end(), 0.0) / buf_.size();
    bool spike = false;
    if (loss >= avg * multiplier_) {
      ++outliers_;
      // Fires once, on the step the counter passes the patience.
      spike = outliers_ == patience_ + 1;
    } else {
      outliers_ = 0;
    }
    if (spike) {
      alarm = BaselineAlarm{step, "spike", loss, loss / avg};
    } else if (outliers_ == 0 && seen_ >= 2 * window_) {
      const auto high = std::count_if(buf_.begin(), buf_.end(),
                                      [&](double x) { return x > loss_cap_; });
      alarm = Edge(high >= window_ / 2.0, &high_prev_, step, loss,
                   static_cast<double>(high) / window_, "high_loss");
    }
  }
  buf_.push_back(loss);
  while (static_cast<int>(buf_.size()) > window_) buf_.pop_front();
  return alarm;
}

std::optional<BaselineAlarm> MegatronSpikyLoss::Observe(int64_t step, double loss) {
  const double v = std::abs(loss);
  if (!std::isfinite(v)) return std::nullopt;
  if (count_ < num_samples_) {
    ++count_;
    max_ = std::max(max_, v);
    return std::nullopt;
  }
  return Edge(v >= max_ * threshold_, &prev_, step, loss, max_ > 0 ? v / max_ : 0);
}

std::optional<BaselineAlarm> WandbZScore::Observe(int64_t step, double loss) {
  if (!std::isfinite(loss)) return std::nullopt;
  bool over = false;
  double z = 0;
  if (static_cast<int>(buf_.size()) >= window_) {
    double mean, var;
    MeanVar(buf_, /*sample=*/true, &mean, &var);
    const double sd = std::sqrt(var);
    z = sd > 0 ? (loss - mean) / sd : 0;
    over = z > threshold_;
  }
  buf_.push_back(loss);
  while (static_cast<int>(buf_.size()) > window_) buf_.pop_front();
  return Edge(over, &prev_, step, loss, z);
}

absl::StatusOr<std::unique_ptr<LossBaseline>> MakeBaseline(std::string_view name) {
  if (name == "llmc") return std::make_unique<LlmcOutlierDetector>();
  if (name == "olmo") return std::make_unique<OlmoSpikeRule>();
  if (name == "foundry") return std::make_unique<FoundryKillLossSpike>();
  if (name == "megatron") return std::make_unique<MegatronSpikyLoss>();
  if (name == "wandb") return std::make_unique<WandbZScore>();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown baseline '", std::string(name), "' (llmc, olmo, foundry, megatron, wandb)"));
}

}  // namespace spikeguard::detect
