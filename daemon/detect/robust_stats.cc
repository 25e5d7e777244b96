#include "daemon/detect/robust_stats.h"

namespace spikeguard::detect {

double MedianInPlace(std::vector<double>& v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) {
    // nth_element leaves the lower half before `mid`: its max is the other
    // middle value.
    m = 0.5 * (m + *std::max_element(v.begin(), v.begin() + mid));
  }
  return m;
}

}  // namespace spikeguard::detect
