// divergence_detector.h
// -----------------------------------------------------------------------------
// Slow divergence: a loss that climbs for hundreds of steps instead of
// jumping. The spike rule cannot see it — its trailing window climbs along,
// and the trend inflates the window's MAD — so this rule compares levels
// over a longer horizon: the loss's trailing median (`median_window` steps)
// at least `rise` above the lowest trailing median of the last `horizon`
// steps. Pre-training loss does not climb 25 % in a thousand steps in a
// healthy run (a slow drift of a few percent over tens of thousands of steps
// is far below that), and a sharp spike that recovers within the median
// window barely moves a median.
//
// The onset is dated by looking back: FindDeparture (localize.h) over the
// stored medians gives the step where the climb began. One event per
// episode; it re-arms when the median is back within half the rise.
//
//   DivergenceDetector d(DivergenceDetector::Options{});
//   if (auto e = d.Observe(step, loss)) Open(e->onset_step);
//
// Memory: median_window values + horizon / stride medians.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace spikeguard::detect {

struct DivergenceEvent {
  // Step at which the rule fired.
  int64_t step = 0;
  // Where the climb began (≤ step).
  int64_t onset_step = 0;
  double median = 0;
  // The lowest trailing median of the horizon.
  double reference = 0;
  // median / reference − 1.
  double rise = 0;
};

class DivergenceDetector {
 public:
  struct Options {
    int median_window = 64;
    int horizon = 1024;
    // Medians are taken every `stride` steps (the rule is slow by design).
    int stride = 8;
    double rise = 0.25;
  };

  explicit DivergenceDetector(Options options) : options_(options) {}

  std::optional<DivergenceEvent> Observe(int64_t step, double loss);
  bool in_episode() const { return in_episode_; }
  size_t footprint() const { return recent_.size() + medians_.size(); }
  void Reset();

 private:
  Options options_;
  std::deque<double> recent_;
  // (step, trailing median), one every `stride` steps, over the horizon.
  std::deque<std::pair<int64_t, double>> medians_;
  int64_t since_ = 0;
  bool in_episode_ = false;
  std::vector<double> scratch_;
};

}  // namespace spikeguard::detect
