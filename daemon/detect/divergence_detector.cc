#include "daemon/detect/divergence_detector.h"

#include <algorithm>
#include <cmath>

#include "daemon/detect/localize.h"
#include "daemon/detect/robust_stats.h"

namespace spikeguard::detect {

void DivergenceDetector::Reset() {
  recent_.clear();
  medians_.clear();
  since_ = 0;
  in_episode_ = false;
}

std::optional<DivergenceEvent> DivergenceDetector::Observe(int64_t step, double loss) {
  if (!std::isfinite(loss)) return std::nullopt;
  recent_.push_back(loss);
  const size_t w = static_cast<size_t>(std::max(1, options_.median_window));
  while (recent_.size() > w) recent_.pop_front();
  if (recent_.size() < w || ++since_ < std::max(1, options_.stride)) return std::nullopt;
  since_ = 0;
  scratch_.assign(recent_.begin(), recent_.end());
  const double med = MedianInPlace(scratch_);
  // The median describes the middle of its window.
  medians_.emplace_back(step - static_cast<int64_t>(w / 2), med);
  while (!medians_.empty() && medians_.front().first < step - options_.horizon) {
    medians_.pop_front();
  }
  double ref = med;
  for (const auto& m : medians_) ref = std::min(ref, m.second);
  if (ref <= 0) return std::nullopt;
  const double rise = med / ref - 1;
  if (in_episode_) {
    if (rise < 0.5 * options_.rise) in_episode_ = false;
    return std::nullopt;
  }
  if (rise < options_.rise) return std::nullopt;
  in_episode_ = true;
  DivergenceEvent e;
  e.step = step;
  e.median = med;
  e.reference = ref;
  e.rise = rise;
  e.onset_step = step;
  std::vector<int64_t> steps;
  std::vector<double> logs;
  for (const auto& m : medians_) {
    steps.push_back(m.first);
    logs.push_back(std::log(m.second));
  }
  DepartureOptions d;
  d.min_rise = std::log1p(0.5 * options_.rise);
  d.min_segment = 3;
  if (auto dep = FindDeparture(steps, logs, d)) e.onset_step = std::min(dep->step, step);
  return e;
}

}  // namespace spikeguard::detect
