#include "daemon/incident/checkpoint_choice.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace spikeguard::incident {

CheckpointInfo ToCheckpointInfo(const spikeguard::v1::Checkpoint& c) {
  return CheckpointInfo{c.generation(), c.step(), c.uri(), c.checksum(), c.complete()};
}

namespace {

bool Qualifies(const CheckpointInfo& c, const CheckpointQuery& q) {
  if (!c.complete || c.step < q.min_step || c.step > q.max_step) return false;
  if (q.max_generation && c.generation > *q.max_generation) return false;
  if (q.generation && c.generation != *q.generation) return false;
  return std::find(q.excluded_uris.begin(), q.excluded_uris.end(), c.uri) ==
         q.excluded_uris.end();
}

// Whether `c` beats the current choice `cur`.
bool Better(const CheckpointInfo& c, const CheckpointInfo& cur, const CheckpointQuery& q) {
  if (c.step != cur.step) {
    return q.pick == CheckpointQuery::Pick::kNewest ? c.step > cur.step : c.step < cur.step;
  }
  if (q.preferred_generation) {
    const bool c_own = c.generation == *q.preferred_generation;
    const bool cur_own = cur.generation == *q.preferred_generation;
    if (c_own != cur_own) return c_own;
  }
  return q.ties_to_highest_generation && c.generation > cur.generation;
}

std::string Bound(int64_t v, int64_t unbounded, const char* infinity) {
  return v == unbounded ? std::string(infinity) : absl::StrCat(v);
}

}  // namespace

absl::StatusOr<CheckpointInfo> ChooseCheckpoint(const std::vector<CheckpointInfo>& checkpoints,
                                                const CheckpointQuery& query) {
  const CheckpointInfo* best = nullptr;
  for (const CheckpointInfo& c : checkpoints) {
    if (!Qualifies(c, query)) continue;
    if (best == nullptr || Better(c, *best, query)) best = &c;
  }
  if (best != nullptr) return *best;
  return absl::NotFoundError(absl::StrCat(
      "no complete checkpoint at steps [",
      Bound(query.min_step, std::numeric_limits<int64_t>::min(), "-inf"), ", ",
      Bound(query.max_step, std::numeric_limits<int64_t>::max(), "inf"), "]",
      query.generation ? absl::StrCat(" of generation ", *query.generation) : std::string(),
      query.max_generation ? absl::StrCat(" of generation <= ", *query.max_generation)
                           : std::string(),
      query.excluded_uris.empty()
          ? std::string()
          : absl::StrCat(" (", query.excluded_uris.size(), " excluded)")));
}

}  // namespace spikeguard::incident
