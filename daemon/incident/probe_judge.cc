#include "daemon/incident/probe_judge.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/incident/incident_state.h"

namespace spikeguard::incident {

bool NonFinite(const StepObservation& o) {
  return o.nonfinite_count > 0 || !std::isfinite(o.loss) || !std::isfinite(o.grad_norm);
}

void ProbeJudge::Finish(ProbeOutcome outcome, const std::string& detail, int64_t spike_step,
                        int layer, int64_t spike_position) {
  lg::ProbeFinished f;
  f.set_outcome(ProbeOutcomeName(outcome));
  f.set_detail(detail);
  f.set_steps_executed(std::max<int64_t>(0, last_fed - checkpoint_step + 1));
  f.set_last_step(last_fed);
  f.set_step_time_sum(time_sum);
  f.set_step_count(count);
  f.set_nonfinite_layer(layer);
  f.set_spike_step(spike_step);
  f.set_spike_position(spike_position);
  f.set_ended_early(ended_at.has_value() && last_fed < to);
  result = f;
}

void ProbeJudge::EndEarly() {
  if (result || !ended_at || last_fed < *ended_at) return;
  const std::string why = absl::StrCat("the workers' schedule ended at step ", *ended_at,
                                       ", before the horizon step ", to,
                                       ended_reason.empty() ? "" : " (", ended_reason,
                                       ended_reason.empty() ? "" : ")");
  if (first_spike) {
    Finish(ProbeOutcome::kSpiked, absl::StrCat(first_spike->detail, "; ", why), first_spike->step,
           -1, first_spike->position);
  } else if (last_fed < from && !verification) {
    Finish(ProbeOutcome::kFailed, absl::StrCat(why, "; no judged step was executed"), -1, -1);
  } else {
    FinishWithoutDetectedSpike(absl::StrCat("no spike through step ", last_fed, "; ", why));
  }
}

void ProbeJudge::FinishWithoutDetectedSpike(const std::string& clean_detail) {
  const int64_t end = std::min(to, last_fed);
  if (const int64_t judged = end - from + 1; judged > 0 && judged_seen < judged) {
    Finish(ProbeOutcome::kFailed,
           absl::StrCat("the reports skip ", judged - judged_seen, " of the ", judged,
                        " judged steps [", from, ", ", end, "] (the first report of generation ",
                        generation, " was step ", first_fed,
                        "): no spike seen is not a clean replay"),
           -1, -1);
    return;
  }
  if (!ReproducedBitExactly()) {
    Finish(ProbeOutcome::kClean, clean_detail, -1, -1);
    return;
  }
  const int64_t onset = event_hash.begin()->first;
  auto pos = positions.find(onset);
  Finish(ProbeOutcome::kSpiked,
         absl::StrCat("the replay repeated the original bit for bit through step ",
                      event_hash.rbegin()->first, " (loss hashes), the event at step ", onset,
                      " included: it recurs (", clean_detail, " by the probe's detector alone)"),
         onset, -1, pos == positions.end() ? -1 : pos->second);
}

void ProbeJudge::Feed(const StepObservation& o, absl::Time now) {
  if (result || o.generation != generation || o.step <= last_fed) return;
  last_fed = o.step;
  if (first_fed < 0) first_fed = o.step;
  if (o.step >= from && o.step <= to) ++judged_seen;
  last_progress = now;
  ++count;
  if (std::isfinite(o.step_time_s)) time_sum += o.step_time_s;
  positions[o.step] = o.data_position;
  while (positions.size() > 1024) positions.erase(positions.begin());
  if (mismatch_step < 0) {
    auto it = original_hash.find(o.step);
    if (it != original_hash.end() && it->second != o.loss_hash) {
      mismatch_step = o.step;
      mismatch_original = it->second;
      mismatch_replayed = o.loss_hash;
    }
  }
  if (auto it = event_hash.find(o.step); it != event_hash.end()) {
    auto value = event_value.find(o.step);
    const double judged = use_grad ? o.grad_norm : o.loss;
    if (it->second == o.loss_hash && (value == event_value.end() || value->second == judged)) {
      ++event_matched;
    } else {
      event_differs = true;
    }
  }
  if (NonFinite(o) && o.step >= from) {
    Finish(ProbeOutcome::kNonFinite,
           absl::StrCat("non-finite values at step ", o.step, " (data position ", o.data_position,
                        ")",
                        o.first_nonfinite_layer >= 0
                            ? absl::StrCat(", first in layer ", o.first_nonfinite_layer)
                            : std::string()),
           o.step, o.first_nonfinite_layer, o.data_position);
    return;
  }
  const double value = use_grad ? o.grad_norm : o.loss;
  if (auto e = NonFinite(o) ? std::nullopt : detector->Observe(o.step, value);
      e && e->state == detect::SpikeEvent::kOnset && e->onset_step >= from &&
      e->onset_step <= to && e->baseline > 0 &&
      std::log(e->peak_value / e->baseline) >= min_log_ratio) {
    auto pos = positions.find(e->onset_step);
    const int64_t position = pos == positions.end() ? -1 : pos->second;
    const std::string detail = absl::StrFormat(
        "%s spike at step %d (data position %d): %.4g against a median of %.4g (z %.1f)",
        use_grad ? "grad-norm" : "loss", e->onset_step, position, e->peak_value, e->baseline,
        e->onset_z);
    if (verification) {
      Finish(ProbeOutcome::kSpiked, detail, e->onset_step, -1, position);
      return;
    }
    // A probe runs on to its horizon after a spike: whether the spike is
    // followed by non-finite values (NUMERICS, not FRAGILITY) is evidence.
    if (!first_spike) first_spike = Spike{e->onset_step, position, detail};
  }
  if (first_spike && o.step >= to) {
    Finish(ProbeOutcome::kSpiked, first_spike->detail, first_spike->step, -1,
           first_spike->position);
    return;
  }
  if (!verification && o.step - checkpoint_step + 1 > budget_left) {
    Finish(ProbeOutcome::kFailed,
           absl::StrCat("budget: the re-executed steps cap was reached at step ", o.step), -1, -1);
    return;
  }
  if (o.step >= to) {
    FinishWithoutDetectedSpike(absl::StrCat("no spike through step ", o.step));
    return;
  }
  EndEarly();
}

}  // namespace spikeguard::incident
