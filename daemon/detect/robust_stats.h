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
//
// A sliding window whose statistics are asked for again and again keeps a
// SortedWindow beside it instead (the precursor detector's windows): values
// are inserted and erased as they enter and leave, and Median() / Stats()
// read the sorted order without a copy or a selection, returning bit for bit
// what MedianInPlace / ComputeRobustStats return over the same values.
//
//   SortedWindow w;
//   w.Insert(x);                // x entered the window
//   w.Erase(oldest);            // oldest left it
//   RobustStats s = w.Stats();
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace spikeguard::detect {

// Median of `v`; reorders it. 0 for an empty vector.
double MedianInPlace(std::vector<double>& v);
// The same over [first, last) (a buffer on the stack, say).
double MedianInPlace(double* first, double* last);

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

// The values of a window in sorted order. Insert and Erase cost a binary
// search and a move of the larger values (n ≤ a few hundred doubles);
// Median() is O(1) and Stats() O(n/2) (the MAD by merging the deviations
// below and above the median outwards from it). Values must not be NaN.
class SortedWindow {
 public:
  void Insert(double x);
  // Removes one value equal to x; x must have been inserted.
  void Erase(double x);
  void Clear() { v_.clear(); }
  size_t size() const { return v_.size(); }
  bool empty() const { return v_.empty(); }

  // Equal to MedianInPlace over the same values (0 when empty).
  double Median() const;
  // Equal to ComputeRobustStats over the same values.
  RobustStats Stats() const;

 private:
  std::vector<double> v_;
};

}  // namespace spikeguard::detect
