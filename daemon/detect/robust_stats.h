// robust_stats.h
// -----------------------------------------------------------------------------
// Median, MAD and the robust z-score every spikeguard detector is built on.
// The median and MAD ignore a few outliers in the window, where a mean and a
// standard deviation would be dragged along by them (the weakness of the
// framework baselines in baselines.h).
//
//   std::vector<double> scratch;
//   RobustStats s = ComputeRobustStats(window.begin(), window.end(), &scratch);
//   double z = (x - s.median) / s.sigma;
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace spikeguard::detect {

// Median of `v`; reorders it. 0 for an empty vector.
double MedianInPlace(std::vector<double>& v);

struct RobustStats {
  double median = 0;
  // 1.4826 · MAD: estimates σ for normal noise.
  double sigma = 0;
};

// Median and 1.4826·MAD of [first, last). `scratch` is reused between calls so
// a detector allocates once.
template <typename It>
RobustStats ComputeRobustStats(It first, It last, std::vector<double>* scratch) {
  scratch->assign(first, last);
  RobustStats s;
  s.median = MedianInPlace(*scratch);
  for (double& x : *scratch) x = std::abs(x - s.median);
  s.sigma = 1.4826 * MedianInPlace(*scratch);
  return s;
}

}  // namespace spikeguard::detect
