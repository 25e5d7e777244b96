#include "daemon/detect/robust_stats.h"

namespace spikeguard::detect {

double MedianInPlace(double* first, double* last) {
  if (first == last) return 0;
  const size_t size = static_cast<size_t>(last - first);
  const size_t mid = size / 2;
  std::nth_element(first, first + mid, last);
  double m = first[mid];
  if (size % 2 == 0) {
    // nth_element leaves the lower half before `mid`: its max is the other
    // middle value.
    m = 0.5 * (m + *std::max_element(first, first + mid));
  }
  return m;
}

double MedianInPlace(std::vector<double>& v) { return MedianInPlace(v.data(), v.data() + v.size()); }

void SortedWindow::Insert(double x) {
  v_.insert(std::upper_bound(v_.begin(), v_.end(), x), x);
}

void SortedWindow::Erase(double x) {
  const auto it = std::lower_bound(v_.begin(), v_.end(), x);
  if (it != v_.end() && *it == x) v_.erase(it);
}

double SortedWindow::Median() const {
  if (v_.empty()) return 0;
  const size_t mid = v_.size() / 2;
  double m = v_[mid];
  // The same operands in the same order as MedianInPlace: the upper middle
  // value plus the largest of the lower half.
  if (v_.size() % 2 == 0) m = 0.5 * (m + v_[mid - 1]);
  return m;
}

RobustStats SortedWindow::Stats() const {
  RobustStats s;
  if (v_.empty()) return s;
  s.median = Median();
  const double med = s.median;
  // |x − median| ascends walking down from the median on the left and up
  // from it on the right: merge the two runs until the middle deviation(s).
  const size_t n = v_.size();
  const size_t mid = n / 2;
  size_t right = static_cast<size_t>(std::lower_bound(v_.begin(), v_.end(), med) - v_.begin());
  size_t left = right;  // next on the left is v_[left - 1]
  double prev = 0, cur = 0;
  for (size_t k = 0; k <= mid; ++k) {
    prev = cur;
    const bool take_left =
        right == n || (left > 0 && std::abs(v_[left - 1] - med) <= std::abs(v_[right] - med));
    if (take_left) {
      cur = std::abs(v_[--left] - med);
    } else {
      cur = std::abs(v_[right++] - med);
    }
  }
  // cur is the (mid+1)-th smallest deviation, prev the mid-th.
  const double mad = n % 2 == 0 ? 0.5 * (cur + prev) : cur;
  s.sigma = 1.4826 * mad;
  return s;
}

}  // namespace spikeguard::detect
