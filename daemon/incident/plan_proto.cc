#include "daemon/incident/plan_proto.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

absl::StatusOr<storage::DataPlan> PlanFromProto(const v1::DataPlan& plan) {
  storage::DataPlan out = storage::DataPlan::Default();
  if (plan.ranges_size() > 0) {
    std::vector<storage::PositionRange> ranges;
    for (const v1::DataRange& r : plan.ranges()) ranges.push_back({r.begin(), r.end()});
    SG_ASSIGN_OR_RETURN(out, storage::DataPlan::FromRanges(std::move(ranges)));
  }
  for (const v1::SampleMask& m : plan.masks()) {
    SG_ASSIGN_OR_RETURN(
        out, out.WithMask(m.position(), std::vector<int32_t>(m.slots().begin(), m.slots().end())));
  }
  return out;
}

v1::DataPlan PlanToProto(const storage::DataPlan& plan) {
  v1::DataPlan out;
  for (const storage::PositionRange& r : plan.ranges()) {
    v1::DataRange* pr = out.add_ranges();
    pr->set_begin(r.begin);
    pr->set_end(r.end);
  }
  for (const storage::SampleMask& m : plan.masks()) {
    v1::SampleMask* pm = out.add_masks();
    pm->set_position(m.position);
    for (int32_t slot : m.slots) pm->add_slots(slot);
  }
  return out;
}

int64_t StepOfPosition(const v1::DataPlan& plan, int64_t position) {
  absl::StatusOr<storage::DataPlan> p = PlanFromProto(plan);
  if (!p.ok()) return -1;
  absl::StatusOr<int64_t> step = p->FirstStepForPosition(position);
  return step.ok() ? *step : -1;
}

int64_t PositionOfStep(const v1::DataPlan& plan, int64_t step) {
  absl::StatusOr<storage::DataPlan> p = PlanFromProto(plan);
  if (!p.ok()) return -1;
  absl::StatusOr<int64_t> position = p->PositionForStep(step);
  return position.ok() ? *position : -1;
}

absl::StatusOr<v1::DataPlan> PlanWithHoles(const v1::DataPlan& plan,
                                           const std::vector<std::pair<int64_t, int64_t>>& holes) {
  SG_ASSIGN_OR_RETURN(storage::DataPlan p, PlanFromProto(plan));
  for (const auto& [begin, end] : holes) {
    SG_ASSIGN_OR_RETURN(p, p.WithHole(begin, end));
  }
  return PlanToProto(p);
}

std::string PlanText(const v1::DataPlan& plan) {
  std::vector<std::string> parts;
  if (plan.ranges_size() == 0) parts.push_back("[0,∞)");
  for (const v1::DataRange& r : plan.ranges()) {
    parts.push_back(r.end() < 0 ? absl::StrCat("[", r.begin(), ",∞)")
                                : absl::StrCat("[", r.begin(), ",", r.end(), ")"));
  }
  for (const v1::SampleMask& m : plan.masks()) {
    parts.push_back(absl::StrCat("(batch ", m.position(), " without sample(s) ",
                                 absl::StrJoin(m.slots(), ","), ")"));
  }
  return absl::StrJoin(parts, " ");
}

}  // namespace spikeguard::incident
