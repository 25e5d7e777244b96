#include "daemon/incident/checkpoint_choice.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace spikeguard::incident {

CheckpointInfo ToCheckpointInfo(const spikeguard::v1::Checkpoint& c) {
  return CheckpointInfo{c.generation(), c.step(), c.uri(), c.checksum(), c.complete()};
}

Lineage Lineage::Of(const std::vector<spikeguard::v1::Generation>& tree, int64_t generation) {
  Lineage l;
  l.generation_ = generation;
  std::map<int64_t, const spikeguard::v1::Generation*> by_number;
  for (const auto& g : tree) by_number[g.generation()] = &g;
  // A generation without a record (a root) ran with no overrides.
  const auto hparams_of = [&](int64_t g) {
    const auto it = by_number.find(g);
    return it == by_number.end() ? std::string() : it->second->hparams().SerializeAsString();
  };
  int64_t limit = std::numeric_limits<int64_t>::max();
  bool hparams_changed = false;
  int64_t g = generation;
  // Up the tree; a parent is always an older generation, and a malformed
  // tree (a cycle) stops at the first generation seen twice. Branch steps
  // only decrease going up, so the first hparams change met is the newest.
  while (l.last_step_.emplace(g, limit).second) {
    const auto it = by_number.find(g);
    if (it == by_number.end() || it->second->parent() < 0 || it->second->parent() == g) break;
    limit = std::min(limit, it->second->from_checkpoint_step());
    if (!hparams_changed && hparams_of(g) != hparams_of(it->second->parent())) {
      hparams_changed = true;
      l.hparams_since_ = it->second->from_checkpoint_step();
    }
    g = it->second->parent();
  }
  return l;
}

std::string Lineage::WhyNot(int64_t generation, int64_t step) const {
  const auto it = last_step_.find(generation);
  if (it == last_step_.end()) {
    return absl::StrCat("saved by generation ", generation, ", not on generation ", generation_,
                        "'s line");
  }
  if (step > it->second) {
    return absl::StrCat("saved at step ", step, ", after generation ", generation_,
                        "'s line left generation ", generation, " at step ", it->second);
  }
  if (step < hparams_since_) {
    return absl::StrCat("saved at step ", step, ", before generation ", generation_,
                        "'s line took its hparams at step ", hparams_since_,
                        ": a replay from it would differ");
  }
  return std::string();
}

bool Lineage::Holds(int64_t generation, int64_t step) const {
  const auto it = last_step_.find(generation);
  return it != last_step_.end() && step <= it->second && step >= hparams_since_;
}

namespace {

bool Qualifies(const CheckpointInfo& c, const CheckpointQuery& q) {
  if (!c.complete || c.step < q.min_step || c.step > q.max_step) return false;
  if (q.max_generation && c.generation > *q.max_generation) return false;
  if (q.generation && c.generation != *q.generation) return false;
  if (q.lineage && !q.lineage->Holds(c.generation, c.step)) return false;
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
      query.lineage ? absl::StrCat(" on generation ", query.lineage->generation(), "'s line")
                    : std::string(),
      query.excluded_uris.empty()
          ? std::string()
          : absl::StrCat(" (", query.excluded_uris.size(), " excluded)")));
}

}  // namespace spikeguard::incident
