// policy.h
// -----------------------------------------------------------------------------
// The policy of a run (policy.proto): the built-in defaults, layering of
// overrides (daemon default, then the run's own), loading from a textproto
// file (`spikeguardd --policy FILE`, `spikectl policy set`) and validation.
//
// Layering uses field presence: every knob of policy.proto is a proto3
// `optional`, so a knob that an override sets replaces the base's, 0 and
// false included, and a knob it leaves out keeps the base's. A file that
// names only `probe { skip_horizon: 400 skip_before: 0 }` changes those two
// knobs (and skips no batch before the onset):
//
//   SG_ASSIGN_OR_RETURN(v1::Policy file, LoadPolicyFile("/etc/spikeguard/policy.txtpb"));
//   v1::Policy policy = MergePolicy(DefaultPolicy(), file);
//   SG_RETURN_IF_ERROR(ValidatePolicy(policy));
//
// The mode has no presence: MODE_UNSPECIFIED in an override means "not set".
// An explicit value that cannot run (`loss_spike { window: 0 }`) is not
// dropped by the merge; ValidatePolicy rejects it, naming the field.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/detect/spike_detector.h"
#include "spikeguard/v1/policy.pb.h"

namespace spikeguard::incident {

// The built-in defaults. The mode is OBSERVE: a supervisor that starts
// rewinding a 1,000-GPU run must be asked to; tests and the demo set AUTO.
spikeguard::v1::Policy DefaultPolicy();

// `base` with every knob that `override_policy` sets (has_x(), whatever the
// value) replaced, and its mode unless MODE_UNSPECIFIED.
spikeguard::v1::Policy MergePolicy(const spikeguard::v1::Policy& base,
                                   const spikeguard::v1::Policy& override_policy);

// Parses a protobuf text-format Policy. NOT_FOUND when the file is missing,
// INVALID_ARGUMENT with the file, line and column on a parse error. The
// result is not merged or validated.
absl::StatusOr<spikeguard::v1::Policy> LoadPolicyFile(const std::string& path);

// Parses text-format policy from memory (same errors as LoadPolicyFile;
// `origin` names the source in messages).
absl::StatusOr<spikeguard::v1::Policy> ParsePolicyText(const std::string& text,
                                                       const std::string& origin = "policy");

// INVALID_ARGUMENT naming the first offending field (e.g.
// "loss_spike.window must be positive (got -3)") when the policy cannot be
// run: non-positive windows and thresholds, min_samples > window, min steps
// before onset > max, negative horizons or budgets, factors outside (0, 1],
// β2 outside (0, 1). Validate the merged policy, not an override.
absl::Status ValidatePolicy(const spikeguard::v1::Policy& policy);

// The spike rule's options as a policy section sets them; fields not set
// (and values ValidatePolicy would reject) keep `base`'s values.
detect::SpikeDetector::Options SpikeOptions(const spikeguard::v1::SpikeDetectorPolicy& p,
                                            detect::SpikeDetector::Options base = {});

}  // namespace spikeguard::incident
