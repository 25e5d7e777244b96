// fix_ladder.h
// -----------------------------------------------------------------------------
// The fixes after a verdict (engine.h): TRANSIENT continues from the replay;
// DATA keeps the holes (continuing the skip generation, or rewinding with the
// culprit holes after bisect/transplant), then quarantines the documents;
// FRAGILITY climbs three rungs, each rewound from the probe checkpoint with
// the original plan and verified: lr × lr_factor; + extra warmup and clip
// tight_clip_norm; + β2 and ε. NUMERICS and INCONCLUSIVE pause the run.
//
// The pure parts are here; the step that drives them (IncidentEngine's
// FixStep, in fix_ladder.cc) acts through the engine's requests.
//
//   v1::HParams h = RungHParams(policy.fix(), 2);  // lr × f, + warmup, clip
//   std::string s = HParamsString(h);              // "lr×0.5, +200 warmup, clip 0.5"
#pragma once

#include <string>
#include <vector>

#include "spikeguard/v1/policy.pb.h"
#include "spikeguard/v1/worker.pb.h"

namespace spikeguard::incident {

// The cumulative hparams of FRAGILITY fix rung 1..3.
spikeguard::v1::HParams RungHParams(const spikeguard::v1::FixPolicy& fix, int rung);

// "lr×0.5, +200 warmup, clip 0.5, β2 0.95, ε 1e-08" (the fields set).
std::string HParamsString(const spikeguard::v1::HParams& h);

// Advice for the next run of a fragile model, led by what the precursor or
// the localized signal names (attention logits: qk-norm; log-sum-exp: z-loss).
std::vector<std::string> FragilityRecommendations(const std::string& precursor,
                                                  const std::string& localized_signal);

// The fix a FRAGILITY verdict announces.
inline constexpr char kFragilityFix[] =
    "fix ladder: lr × factor, then longer warmup and tighter clipping, then β2/ε";

}  // namespace spikeguard::incident
