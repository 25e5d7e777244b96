// Fuzz target: a policy in protobuf text format, as `spikeguardd --policy FILE`
// and `spikectl policy set` read it (daemon/incident/policy.h).
//
// Parse errors must be INVALID_ARGUMENT with a position; a parsed policy is
// merged over the defaults and validated; a policy that validates must give a
// spike detector that runs (SpikeOptions) without crashing or overflowing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#define SPIKEGUARD_FUZZ_PROTOBUF
#include "tests/fuzz/fuzz_common.h"
#include "daemon/detect/spike_detector.h"
#include "daemon/incident/policy.h"

namespace {

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace incident = spikeguard::incident;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = incident::ParsePolicyText(text, "fuzz");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const spikeguard::v1::Policy merged = incident::MergePolicy(incident::DefaultPolicy(), *parsed);
  // Merging twice changes nothing.
  FUZZ_CHECK(incident::MergePolicy(merged, *parsed).SerializeAsString() == merged.SerializeAsString());
  absl::Status valid = incident::ValidatePolicy(merged);
  if (!valid.ok()) {
    FUZZ_CHECK(valid.code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  // A policy that validates runs: build its detectors and feed them a few
  // values, a spike included.
  for (const auto* section : {&merged.loss_spike(), &merged.grad_norm_spike()}) {
    spikeguard::detect::SpikeDetector detector(incident::SpikeOptions(*section));
    for (int step = 0; step < 200; ++step) {
      (void)detector.Observe(step, step == 150 ? 50.0 : 2.0 + 0.01 * (step % 7));
    }
  }
  return 0;
}
