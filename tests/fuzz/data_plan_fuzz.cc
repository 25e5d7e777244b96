// Fuzz target: the data-plan text form (storage/corpus/data_plan.h,
// DataPlan::Parse), which arrives in run specs, checkpoints and commands.
//
// A plan that parses must print and parse back to itself, and the step <->
// position arithmetic (PositionForStep, FirstStepForPosition, StepCount,
// WithHole, WithSplice, WithMask) must not overflow or crash on it, for
// steps and positions taken from the plan's own boundaries.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "storage/corpus/data_plan.h"

namespace {

namespace storage = spikeguard::storage;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto plan = storage::DataPlan::Parse(text);
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const std::string printed = plan->ToString();
  auto back = storage::DataPlan::Parse(printed);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(*back == *plan);
  FUZZ_CHECK(back->ToString() == printed);

  const int64_t count = plan->StepCount();
  FUZZ_CHECK(count >= -1);
  std::vector<int64_t> probes = {0, 1, std::numeric_limits<int64_t>::max(), -1};
  for (const storage::PositionRange& r : plan->ranges()) {
    probes.push_back(r.begin);
    if (!r.unbounded()) probes.push_back(r.end);
  }
  for (const storage::SampleMask& m : plan->masks()) probes.push_back(m.position);
  if (probes.size() > 64) probes.resize(64);
  for (int64_t v : probes) {
    auto pos = plan->PositionForStep(v);
    if (pos.ok()) {
      FUZZ_CHECK(*pos >= 0);
      auto first = plan->FirstStepForPosition(*pos);
      FUZZ_CHECK(first.ok() && *first <= v);
    }
    (void)plan->FirstStepForPosition(v);
    if (v >= 0 && v < std::numeric_limits<int64_t>::max()) {
      (void)plan->WithHole(v, v + 1);
      (void)plan->WithSplice(v, {0, 10});
      (void)plan->WithSplice(0, {v, v + 1});
      (void)plan->WithMask(v, {0, 3});
    }
  }
  return 0;
}
