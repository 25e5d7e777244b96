#include "daemon/incident/bisection.h"

#include <algorithm>
#include <map>

namespace spikeguard::incident {

Bisection NextBisect(const std::vector<int64_t>& window, int64_t onset_position,
                     const std::vector<std::pair<std::vector<int64_t>, bool>>& tests) {
  Bisection b;
  std::map<std::vector<int64_t>, bool> known;
  for (const auto& [set, spiked] : tests) {
    std::vector<int64_t> key = set;
    std::sort(key.begin(), key.end());
    known[key] = spiked;
  }
  std::vector<int64_t> w = window;
  std::sort(w.begin(), w.end());
  w.erase(std::unique(w.begin(), w.end()), w.end());
  std::vector<int64_t> found;
  std::vector<int64_t> round = w;  // known to spike
  for (size_t guard = 0; guard <= w.size() && !round.empty(); ++guard) {
    std::vector<int64_t> node = round;
    bool tested = true;
    while (node.size() > 1) {
      std::vector<int64_t> a, rest;
      if (std::find(node.begin(), node.end(), onset_position) != node.end()) {
        a = {onset_position};
        for (int64_t x : node) {
          if (x != onset_position) rest.push_back(x);
        }
      } else {
        const size_t half = (node.size() + 1) / 2;
        a.assign(node.begin(), node.begin() + half);
        rest.assign(node.begin() + half, node.end());
      }
      auto ra = known.find(a);
      if (ra == known.end()) {
        b.need = a;
        b.culprits = found;
        return b;
      }
      node = ra->second ? a : rest;
      tested = ra->second;
    }
    if (!tested) {
      auto r = known.find(node);
      if (r == known.end()) {
        b.need = node;
        b.culprits = found;
        return b;
      }
      if (!r->second) {
        // The set spikes, yet no single batch of it does.
        if (found.empty() && round == w) {
          b.none_reproduced = true;
        } else {
          b.group = round;
        }
        break;
      }
    }
    found.push_back(node.front());
    std::vector<int64_t> left;
    for (int64_t x : w) {
      if (std::find(found.begin(), found.end(), x) == found.end()) left.push_back(x);
    }
    if (left.empty()) break;
    auto r = known.find(left);
    if (r == known.end()) {
      b.need = left;
      b.culprits = found;
      return b;
    }
    if (!r->second) break;
    round = left;
  }
  std::sort(found.begin(), found.end());
  b.culprits = found;
  return b;
}

std::vector<std::pair<int64_t, int64_t>> PositionRuns(std::vector<int64_t> positions) {
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t x : positions) {
    if (!out.empty() && out.back().second == x) {
      out.back().second = x + 1;
    } else {
      out.emplace_back(x, x + 1);
    }
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> MergeRanges(std::vector<std::pair<int64_t, int64_t>> r) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

}  // namespace spikeguard::incident
