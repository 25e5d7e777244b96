#include "daemon/control/rolling_pin.h"

#include <algorithm>
#include <set>

#include "base/status_macros.h"
#include "daemon/control/catalog_adapters.h"
#include "daemon/incident/checkpoint_choice.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;

namespace {

struct RunCheckpoints {
  std::vector<v1::Checkpoint> rows;
  std::vector<incident::CheckpointInfo> all;
  incident::CheckpointQuery on_line;
};

absl::StatusOr<RunCheckpoints> Load(storage::Catalog* catalog, const std::string& run) {
  RunCheckpoints out;
  SG_ASSIGN_OR_RETURN(v1::Run row, catalog->GetRunWithoutRanks(run));
  SG_ASSIGN_OR_RETURN(std::vector<v1::Generation> tree, catalog->ListGenerations(run));
  SG_ASSIGN_OR_RETURN(out.rows, catalog->ListCheckpoints(run));
  out.all.reserve(out.rows.size());
  for (const auto& c : out.rows) out.all.push_back(incident::ToCheckpointInfo(c));
  out.on_line.lineage = incident::Lineage::Of(tree, row.current_generation());
  out.on_line.preferred_generation = row.current_generation();
  return out;
}

std::vector<std::string> Pins(const RunCheckpoints& run) {
  std::set<std::string> keep;
  int64_t rolling_step = -1;
  for (const auto& c : run.rows) {
    if (c.pinned() || c.rolling_pin()) keep.insert(c.uri());
    if (c.rolling_pin()) rolling_step = c.step();
  }
  // The next target: the oldest checkpoint of the line after the rolling one.
  incident::CheckpointQuery next = run.on_line;
  next.pick = incident::CheckpointQuery::Pick::kOldest;
  next.min_step = rolling_step + 1;
  if (absl::StatusOr<incident::CheckpointInfo> c = incident::ChooseCheckpoint(run.all, next);
      c.ok()) {
    keep.insert(c->uri);
  }
  return std::vector<std::string>(keep.begin(), keep.end());
}

}  // namespace

absl::StatusOr<std::vector<std::string>> RetainedPins(storage::Catalog* catalog,
                                                      const std::string& run) {
  SG_ASSIGN_OR_RETURN(RunCheckpoints loaded, Load(catalog, run));
  return Pins(loaded);
}

absl::StatusOr<std::vector<std::string>> UpdateRollingPin(storage::Catalog* catalog,
                                                          const std::string& run,
                                                          int64_t now_step) {
  SG_ASSIGN_OR_RETURN(RunCheckpoints loaded, Load(catalog, run));
  const v1::Policy policy = EffectivePolicy(catalog, run);
  incident::CheckpointQuery q = loaded.on_line;
  q.max_step = now_step - std::max<int64_t>(0, policy.probe().min_steps_before_onset());
  absl::StatusOr<incident::CheckpointInfo> target = incident::ChooseCheckpoint(loaded.all, q);
  // None qualifies yet: whatever held the pin keeps it.
  if (target.ok()) {
    bool already = false;
    for (const auto& c : loaded.rows) {
      already = already || (c.rolling_pin() && c.uri() == target->uri && c.step() == target->step);
    }
    if (!already) {
      SG_RETURN_IF_ERROR(catalog->SetRollingPin(run, target->step, target->uri));
      for (auto& c : loaded.rows) {
        c.set_rolling_pin(c.uri() == target->uri && c.step() == target->step);
      }
    }
  }
  return Pins(loaded);
}

}  // namespace spikeguard::daemon
