// bisection.h
// -----------------------------------------------------------------------------
// Group testing over a window W of data positions (engine.h: "Bisect"). The
// replay fed all of W and spiked, the skip fed none and was clean. A bisect
// probe feeds one part of W and skips the rest of it. Each round descends
// from a set known to spike to one position: a part that spikes is kept;
// when it does not, the other part must hold the culprit (implied). A
// position is named only after a probe that fed it alone spiked, so an
// implied position is confirmed with one more probe; when it does not spike
// alone, the spike needs several batches together (or is no data trigger at
// all, when nothing was found). Then the window without the culprits found is
// fed: clean, every culprit is known; spiked, another round looks for the
// next one. The onset's own position is tried alone first, so a single
// culprit there costs two probes.
//
// NextBisect is pure: given the tests so far, it names the next set to feed
// or the result. The same search runs over a batch's documents (sample
// bisect), with indices for positions and no onset.
//
//   Bisection b = NextBisect({600, 601, 602, 603}, 601, tests);
//   if (b.need) { /* feed *b.need alone, record (set, spiked) in tests */ }
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace spikeguard::incident {

struct Bisection {
  std::optional<std::vector<int64_t>> need;  // the next part to feed
  std::vector<int64_t> culprits;             // spike alone
  std::vector<int64_t> group;                // spike only together
  bool none_reproduced = false;              // no part of W spiked
  bool partial = false;                      // stopped by the budget
  bool untested = false;                     // no bisect: the whole window
};

// `tests`: each fed set and whether it spiked. `onset_position` -1: none.
Bisection NextBisect(const std::vector<int64_t>& window, int64_t onset_position,
                     const std::vector<std::pair<std::vector<int64_t>, bool>>& tests);

// Positions as sorted half-open runs of consecutive positions (duplicates
// dropped): {3, 1, 2, 7} -> [1, 4) [7, 8).
std::vector<std::pair<int64_t, int64_t>> PositionRuns(std::vector<int64_t> positions);
// Merges overlapping or touching ranges.
std::vector<std::pair<int64_t, int64_t>> MergeRanges(std::vector<std::pair<int64_t, int64_t>> r);

}  // namespace spikeguard::incident
