#include "daemon/detect/spike_detector.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "daemon/detect/robust_stats.h"

namespace spikeguard::detect {

double Median(std::deque<double> values) {
  std::vector<double> v(values.begin(), values.end());
  return MedianInPlace(v);
}

bool SpikeDetector::OverThreshold(double value, double* z, double* median,
                                  double fraction) const {
  if (window_.size() < static_cast<size_t>(std::max(1, options_.min_samples))) return false;
  const RobustStats s = ComputeRobustStats(window_.begin(), window_.end(), &scratch_);
  // A floor keeps a perfectly flat window from dividing by zero; the relative
  // floor below decides such cases.
  const double sigma = std::max(s.sigma, 1e-12 * std::max(1.0, std::abs(s.median)));
  *median = s.median;
  *z = (value - s.median) / sigma;
  last_sigma_ = s.sigma;
  return *z >= fraction * threshold_ &&
         value - s.median >= std::abs(s.median) * options_.relative_floor * fraction &&
         value > s.median;
}

std::optional<double> SpikeDetector::Score(double value) const {
  double z = 0, med = 0;
  if (window_.size() < static_cast<size_t>(std::max(1, options_.min_samples))) {
    return std::nullopt;
  }
  OverThreshold(value, &z, &med);
  return z;
}

double SpikeDetector::baseline() const {
  std::vector<double> v(window_.begin(), window_.end());
  return MedianInPlace(v);
}

void SpikeDetector::Reset() {
  window_.clear();
  open_.reset();
  last_step_.reset();
  tail_.clear();
  threshold_ = options_.z_threshold;
  since_tail_update_ = 0;
  last_z_ = 0;
  last_sigma_ = 0;
}

void SpikeDetector::PushTail(double abs_z) {
  if (!(options_.tail_factor > 0) || !std::isfinite(abs_z)) return;
  tail_.push_back(abs_z);
  while (tail_.size() > static_cast<size_t>(std::max(1, options_.tail_window))) tail_.pop_front();
  if (tail_.size() < static_cast<size_t>(std::max(1, options_.tail_min_samples))) return;
  // The 99th percentile moves slowly: recompute it every 16 values.
  if (++since_tail_update_ < 16 &&
      tail_.size() != static_cast<size_t>(std::max(1, options_.tail_min_samples))) {
    return;
  }
  since_tail_update_ = 0;
  scratch_.assign(tail_.begin(), tail_.end());
  const size_t k = std::min(scratch_.size() - 1,
                            static_cast<size_t>(std::floor(0.995 * static_cast<double>(scratch_.size()))));
  std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k), scratch_.end());
  threshold_ = std::max(options_.z_threshold, options_.tail_factor * scratch_[k]);
}

void SpikeDetector::Push(double value) {
  window_.push_back(value);
  while (window_.size() > static_cast<size_t>(std::max(1, options_.window))) window_.pop_front();
}

std::optional<SpikeEvent> SpikeDetector::Observe(int64_t step, double value) {
  if (last_step_ && step <= *last_step_) return std::nullopt;
  last_step_ = step;
  if (!std::isfinite(value)) return std::nullopt;
  double z = 0, med = 0;
  const bool warm = window_.size() >= static_cast<size_t>(std::max(1, options_.min_samples));
  const bool over = OverThreshold(value, &z, &med, open_ ? options_.hold_fraction : 1.0);
  last_z_ = warm ? z : 0;
  if (open_) {
    if (over) {
      if (value > open_->peak_value) {
        open_->peak_value = value;
        open_->peak_step = step;
      }
      open_->end_step = step;
      if (step - open_->onset_step > options_.recovery_steps) {
        SpikeEvent e = *open_;
        e.state = SpikeEvent::kDiverged;
        open_.reset();
        // The new level becomes the baseline from here on.
        window_.clear();
        Push(value);
        return e;
      }
      return std::nullopt;
    }
    SpikeEvent e = *open_;
    e.state = SpikeEvent::kRecovered;
    open_.reset();
    Push(value);
    return e;
  }
  if (over) {
    SpikeEvent e;
    e.state = SpikeEvent::kOnset;
    e.onset_step = e.peak_step = e.end_step = step;
    e.peak_value = value;
    e.baseline = med;
    e.onset_z = z;
    open_ = e;
    return e;
  }
  // The upper tail only: a falling loss sits below its lagging median with
  // large negative z, which says nothing about how far noise reaches up.
  if (warm) PushTail(std::max(z, 0.0));
  Push(value);
  return std::nullopt;
}

}  // namespace spikeguard::detect
