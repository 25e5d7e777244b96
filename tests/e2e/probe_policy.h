// The probe policy of the end-to-end tests, the diagnosis benchmark and the
// demo: scenario runs checkpoint every 50-100 steps, so probes start 50-500
// steps before the onset; short skip and verification horizons keep the runs
// small.
#pragma once

namespace spikeguard::testing {

inline constexpr char kE2EProbePolicy[] = R"pb(
  probe {
    min_steps_before_onset: 50
    max_steps_before_onset: 500
    replay_steps_past_onset: 5
    skip_before: 2
    skip_after: 2
    skip_horizon: 100
  }
  fix { verify_steps: 100 }
)pb";

}  // namespace spikeguard::testing
