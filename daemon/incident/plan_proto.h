// plan_proto.h
// -----------------------------------------------------------------------------
// The engine's data plans are v1::DataPlan messages (they are logged and sent
// to the workers); every edit and lookup on them is storage::DataPlan's
// (storage/corpus/data_plan.h, the one owner of plan arithmetic). These are
// the conversions, and the -1 forms of the lookups the engine uses.
//
//   SG_ASSIGN_OR_RETURN(v1::DataPlan skip, PlanWithHoles(plan, {{600, 610}}));
//   const int64_t step = StepOfPosition(skip, 700);   // 690; -1: never fed
//   const std::string text = PlanText(skip);          // "[0,600) [610,∞)"
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/corpus/data_plan.h"

namespace spikeguard::incident {

// An empty v1 plan is the whole stream, [0, ∞). INVALID_ARGUMENT for a plan
// storage::DataPlan refuses.
absl::StatusOr<storage::DataPlan> PlanFromProto(const spikeguard::v1::DataPlan& plan);
spikeguard::v1::DataPlan PlanToProto(const storage::DataPlan& plan);

// The first step at which `plan` feeds `position`; -1 never (or an invalid plan).
int64_t StepOfPosition(const spikeguard::v1::DataPlan& plan, int64_t position);
// The position `plan` feeds at `step`; -1 past its end (or an invalid plan).
int64_t PositionOfStep(const spikeguard::v1::DataPlan& plan, int64_t step);
// `plan` without the positions of every [begin, end) of `holes`.
absl::StatusOr<spikeguard::v1::DataPlan> PlanWithHoles(
    const spikeguard::v1::DataPlan& plan, const std::vector<std::pair<int64_t, int64_t>>& holes);

// The form incident notes and requests show: "[0,600) [610,∞)", then
// "(batch P without sample(s) S,S)" per sample mask.
std::string PlanText(const spikeguard::v1::DataPlan& plan);

}  // namespace spikeguard::incident
