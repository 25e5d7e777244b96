// data_plan.h
// -----------------------------------------------------------------------------
// A DataPlan says which global batch (data position) each training step
// consumes. It is an ordered list of half-open position ranges; step s consumes
// the s-th position of their concatenation. The default plan is [0, ∞): step s
// consumes position s.
//
// The diagnosis protocol edits plans in two ways:
//   - a hole (skip window): positions [600, 610) are never consumed, so step
//     600 consumes position 610 and every later step shifts by 10;
//   - a splice (transplant): a range is consumed at another point of the run,
//     e.g. the culprit batches [600, 610) fed at step 300 from an earlier
//     checkpoint, to test whether they spike from a different model state.
//     WithSplice names that point by step; WithInsertBeforePosition by the
//     data position the plan consumes there.
//
//   DataPlan plan = DataPlan::Default();
//   SG_ASSIGN_OR_RETURN(plan, plan.WithHole(600, 610));   // [0,600) [610,∞)
//   SG_ASSIGN_OR_RETURN(int64_t pos, plan.PositionForStep(600));  // 610
//   std::string text = plan.ToString();                  // "0-600,610-"
//   SG_ASSIGN_OR_RETURN(DataPlan back, DataPlan::Parse(text));
//
// A plan may also drop samples (rows) of single batches: a sample mask
// {position 300, slots 0 1 5} feeds batch 300 without its sample slots 0, 1
// and 5 (document-level bisection inside a culprit batch feeds parts of one
// batch). Text form: the ranges, then ";drop=POSITION:SLOT.SLOT..." per
// masked batch, e.g. "0-600,610-;drop=300:0.1.5". A plan without masks
// prints exactly as before.
//
// Rules (Validate): begin >= 0; a bounded range is non-empty (end > begin);
// only the last range may be unbounded (end = kUnbounded), since nothing after
// it could ever be reached. Overlapping ranges ARE allowed: a transplant from
// an earlier checkpoint re-feeds batches the plan also consumes later, and a
// repeated position is exactly that experiment. Adjacent ranges are merged, so
// equal plans have equal ToString().
//
// A DataPlan is a small value type; PositionForStep is O(#ranges).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace spikeguard::storage {

struct PositionRange {
  static constexpr int64_t kUnbounded = -1;
  int64_t begin = 0;
  int64_t end = kUnbounded;  // exclusive; kUnbounded means ∞

  bool unbounded() const { return end == kUnbounded; }
  bool operator==(const PositionRange&) const = default;
};

// Sample slots a plan leaves out of the batch at `position`.
struct SampleMask {
  int64_t position = 0;
  std::vector<int32_t> slots;  // sorted, distinct, >= 0
  bool operator==(const SampleMask&) const = default;
};

class DataPlan {
 public:
  // [0, ∞).
  static DataPlan Default();
  // Validates and normalizes (merges adjacent ranges).
  static absl::StatusOr<DataPlan> FromRanges(std::vector<PositionRange> ranges);
  // Parses ToString()'s form: "b-e,b-e,b-" ("b-" is unbounded). Whitespace is
  // ignored; an empty string is an empty plan.
  static absl::StatusOr<DataPlan> Parse(absl::string_view text);

  // INVALID_ARGUMENT naming the offending range, per the rules above.
  static absl::Status Validate(const std::vector<PositionRange>& ranges);

  const std::vector<PositionRange>& ranges() const { return ranges_; }
  // By position.
  const std::vector<SampleMask>& masks() const { return masks_; }
  // The mask of batch `position`, or nullptr.
  const SampleMask* MaskAt(int64_t position) const;
  std::string ToString() const;

  // Number of steps the plan feeds; -1 when unbounded.
  int64_t StepCount() const;

  // The position step `step` consumes. OUT_OF_RANGE past a bounded plan's end.
  absl::StatusOr<int64_t> PositionForStep(int64_t step) const;
  // The first step that consumes `position`, or NOT_FOUND if none does.
  absl::StatusOr<int64_t> FirstStepForPosition(int64_t position) const;

  // The plan without positions [begin, end) anywhere (a skip window). Ranges
  // are split as needed; order is kept.
  absl::StatusOr<DataPlan> WithHole(int64_t begin, int64_t end) const;
  // The plan with `inserted` consumed starting at step `at_step`: the steps
  // before keep their positions, then `inserted` (bounded), then the rest of
  // the plan continues where it left off. at_step may equal StepCount().
  absl::StatusOr<DataPlan> WithSplice(int64_t at_step, PositionRange inserted) const;
  // The plan with `inserted` consumed just before `position` is, i.e.
  // WithSplice at FirstStepForPosition(position): the position-keyed form a
  // transplant probe uses ("feed the culprit right where the plan reaches
  // position p"). NOT_FOUND when no step consumes `position`.
  absl::StatusOr<DataPlan> WithInsertBeforePosition(int64_t position, PositionRange inserted) const;
  // The plan with batch `position` fed without sample `slots` (replacing any
  // mask it had there; empty slots removes the mask). INVALID_ARGUMENT for a
  // negative position or slot. Whether a slot exists is the data order's to
  // check (it knows the batch size).
  absl::StatusOr<DataPlan> WithMask(int64_t position, std::vector<int32_t> slots) const;

  bool operator==(const DataPlan& other) const {
    return ranges_ == other.ranges_ && masks_ == other.masks_;
  }

 private:
  explicit DataPlan(std::vector<PositionRange> ranges) : ranges_(std::move(ranges)) {}
  static std::vector<PositionRange> Normalize(std::vector<PositionRange> ranges);
  static absl::StatusOr<DataPlan> ParseRanges(absl::string_view compact);
  // `ranges` with this plan's masks.
  DataPlan WithRangesOf(std::vector<PositionRange> ranges) const;

  std::vector<PositionRange> ranges_;
  std::vector<SampleMask> masks_;
};

}  // namespace spikeguard::storage
