#include "daemon/detect/run_monitor.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "daemon/detect/eval/trace_gen.h"
#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

std::vector<MonitorEvent> Monitor(const LabeledTrace& t, RunMonitor* m = nullptr) {
  RunMonitor local(RunMonitor::Options{});
  if (m == nullptr) m = &local;
  std::vector<MonitorEvent> out;
  for (const StepSample& s : t.steps) {
    for (auto& e : m->Observe(s)) out.push_back(std::move(e));
  }
  return out;
}

std::vector<MonitorEvent> Opening(const std::vector<MonitorEvent>& events) {
  std::vector<MonitorEvent> out;
  for (const auto& e : events) {
    if (e.opens_incident()) out.push_back(e);
  }
  return out;
}

TEST(RunMonitorTest, SilentDuringWarmup) {
  const LabeledTrace t = GenerateTrace({Scenario::kHealthy, 11, 300, 4});
  // Warm-up is noisy and fast-moving; a 20× loss at step 40 is not judged yet.
  LabeledTrace wild = t;
  wild.steps[40].loss *= 20;
  wild.steps[41].grad_norm *= 50;
  EXPECT_TRUE(Opening(Monitor(wild)).empty());
}

TEST(RunMonitorTest, SilentOnHealthyRuns) {
  for (uint64_t seed : {21, 22, 23}) {
    for (Scenario sc : {Scenario::kHealthy, Scenario::kPlateau, Scenario::kDrift}) {
      const LabeledTrace t = GenerateTrace({sc, seed, 15000, 4});
      const auto events = Monitor(t);
      EXPECT_TRUE(Opening(events).empty()) << t.name << " first at step "
                                           << (Opening(events).empty() ? -1 : Opening(events)[0].step);
    }
  }
}

TEST(RunMonitorTest, FiresOnEverySharpSpikeAtItsOnset) {
  const LabeledTrace t = GenerateTrace({Scenario::kSharpSpikes, 31, 5000, 4});
  ASSERT_FALSE(t.labels.empty());
  const auto open = Opening(Monitor(t));
  for (const Label& l : t.labels) {
    auto hit = std::find_if(open.begin(), open.end(), [&](const MonitorEvent& e) {
      return e.step >= l.onset && e.step <= l.peak;
    });
    EXPECT_NE(hit, open.end()) << "spike peaking at " << l.peak;
  }
  // Nothing outside the spikes.
  for (const auto& e : open) {
    bool in = false;
    for (const Label& l : t.labels) in = in || (e.step >= l.onset - 10 && e.step <= l.end + 5);
    EXPECT_TRUE(in) << "false alarm at " << e.step;
  }
}

TEST(RunMonitorTest, GradNormBlowupAlarmsBeforeTheLossPeaks) {
  const LabeledTrace t = GenerateTrace({Scenario::kGradBlowup, 41, 3000, 4});
  const auto open = Opening(Monitor(t));
  for (const Label& l : t.labels) {
    if (l.kind == Label::kPrecursor) continue;
    auto first = std::find_if(open.begin(), open.end(), [&](const MonitorEvent& e) {
      return e.step >= l.onset - 10 && e.step <= l.peak;
    });
    ASSERT_NE(first, open.end()) << l.peak;
    EXPECT_EQ(first->signal, "grad_norm");
    // The ×10 step is three steps before the loss peak.
    EXPECT_GE(l.peak - first->step, 2) << l.peak;
  }
}

TEST(RunMonitorTest, FragilityPrecursorDatesTheOnsetAndLocalizesTheLayer) {
  for (uint64_t seed : {51, 52, 53}) {
    const LabeledTrace t = GenerateTrace({Scenario::kFragility, seed, 4000, 4});
    const Label* pre = nullptr;
    for (const Label& l : t.labels) {
      if (l.kind == Label::kPrecursor) pre = &l;
    }
    ASSERT_NE(pre, nullptr);
    const auto events = Monitor(t);
    // A precursor warning on the right series, dated within a few steps.
    auto w = std::find_if(events.begin(), events.end(), [](const MonitorEvent& e) {
      return e.kind == MonitorEvent::kPrecursor;
    });
    ASSERT_NE(w, events.end()) << t.name;
    EXPECT_EQ(w->signal, "max_attn_logit");
    EXPECT_EQ(w->layer, pre->layer);
    EXPECT_NEAR(static_cast<double>(w->onset_step), pre->onset, 5) << t.name;
    EXPECT_LT(w->step, pre->peak);
    // The spike's incident carries the earlier onset and names the layer.
    const auto open = Opening(events);
    ASSERT_FALSE(open.empty());
    const MonitorEvent& first = open[0];
    ASSERT_TRUE(first.precursor_start.has_value());
    EXPECT_NEAR(static_cast<double>(*first.precursor_start), pre->onset, 5);
    EXPECT_LT(*first.precursor_start, first.onset_step - 100);
    // The culprit layer comes first (its activations move with its logits,
    // so either may lead by a step or two), and its logits are dated right.
    ASSERT_FALSE(first.localization.order.empty());
    EXPECT_EQ(first.localization.order[0].layer, pre->layer) << t.name;
    bool dated = false;
    for (const auto& o : first.localization.order) {
      if (o.signal == "max_attn_logit" && o.layer == pre->layer) {
        dated = std::abs(static_cast<double>(o.departure.step - pre->onset)) <= 5;
      }
    }
    EXPECT_TRUE(dated) << t.name;
  }
}

// Logits that climb from init through the warm-up (the reference worker's
// fragility run) and a loss spike later: the incident's precursor onset is
// the logits' level alarm near step 500, not the first steps of the run (it
// used to be step 2, before any checkpoint, so the rewind checkpoint could
// never be chosen by the precursor).
TEST(RunMonitorTest, PrecursorOnsetOfAnIncidentIsNotInTheWarmup) {
  for (uint64_t seed : {61, 62, 63}) {
    LabeledTrace t = GenerateTrace({Scenario::kHealthy, seed, 1000, 4});
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> n(0, 1);
    for (StepSample& s : t.steps) {
      s.layers[2].max_attn_logit =
          0.2 * std::pow(5000.0, std::pow(s.step / 500.0, 0.4)) * std::exp(0.05 * n(rng));
      if (s.step == 900) s.loss *= 3;
    }
    const auto open = Opening(Monitor(t));
    ASSERT_FALSE(open.empty()) << seed;
    EXPECT_EQ(open[0].onset_step, 900) << seed;
    ASSERT_TRUE(open[0].precursor_start.has_value()) << seed;
    EXPECT_EQ(open[0].precursor_signal, "max_attn_logit");
    EXPECT_EQ(open[0].precursor_layer, 2);
    EXPECT_GE(*open[0].precursor_start, 400) << seed;
    EXPECT_LE(*open[0].precursor_start, 520) << seed;
    for (const auto& o : open[0].localization.order) {
      EXPECT_GE(o.departure.step, 100) << o.signal << "@" << o.layer;
    }
  }
}

TEST(RunMonitorTest, SlowDivergenceIsDetected) {
  for (uint64_t seed : {61, 62, 63}) {
    const LabeledTrace t = GenerateTrace({Scenario::kSlowDivergence, seed, 3000, 4});
    const Label* div = nullptr;
    for (const Label& l : t.labels) {
      if (l.kind == Label::kDivergence) div = &l;
    }
    ASSERT_NE(div, nullptr);
    const auto open = Opening(Monitor(t));
    ASSERT_FALSE(open.empty()) << t.name;
    EXPECT_GE(open[0].step, div->onset) << t.name;
  }
}

// A spike that stays up for tens of steps before it recovers lifts the
// divergence rule's trailing median too: that is the spike seen again, not
// a second alarm. A climb that starts after it clears is still reported,
// once.
TEST(RunMonitorTest, ALongSpikeThatRecoversIsOneEventNotADivergenceToo) {
  for (uint64_t seed : {71, 72, 73}) {
    for (int64_t length : {30, 45, 60}) {
      LabeledTrace t = GenerateTrace({Scenario::kHealthy, seed, 3000, 4});
      for (int64_t k = 0; k < length; ++k) {
        // Up ×2.5 at once, then down linearly over the last third.
        const double over = k < 2 * length / 3 ? 1.5 : 1.5 * (length - k) / (length / 3.0);
        t.steps[1500 + k].loss *= 1 + over;
        t.steps[1500 + k].grad_norm *= k == 0 ? 20 : 1;
      }
      auto divergences = [](const std::vector<MonitorEvent>& events) {
        std::vector<int64_t> onsets;
        for (const MonitorEvent& e : events) {
          if (e.kind == MonitorEvent::kDivergence) onsets.push_back(e.onset_step);
        }
        return onsets;
      };
      const auto open = Opening(Monitor(t));
      ASSERT_FALSE(open.empty()) << "seed " << seed << " length " << length;
      // Every event opens at the spike's onset (loss and grad norm together).
      for (const MonitorEvent& e : open) {
        EXPECT_EQ(e.kind, MonitorEvent::kSpikeOnset) << "seed " << seed << " length " << length
                                                     << ": " << e.signal << " at step " << e.step;
        EXPECT_NEAR(e.onset_step, 1500, 2);
      }
      EXPECT_TRUE(divergences(open).empty());

      // The same spike, then the loss climbing for good from step 2200.
      for (int64_t s = 2200; s < 3000; ++s) {
        t.steps[s].loss *= 1 + std::min(1.0, (s - 2200) / 400.0);
      }
      // Reported once, as a divergence or (a fast enough climb) a spike.
      int climbs = 0;
      for (const MonitorEvent& e : Opening(Monitor(t))) {
        if (e.onset_step < 2100 || e.signal != "loss") continue;
        ++climbs;
        EXPECT_LE(e.onset_step, 2400);
      }
      EXPECT_EQ(climbs, 1) << "seed " << seed << " length " << length;
    }
  }
}

TEST(RunMonitorTest, NonFiniteStepNamesTheFirstLayer) {
  const LabeledTrace t = GenerateTrace({Scenario::kNanBurst, 71, 4000, 4});
  const auto open = Opening(Monitor(t));
  std::vector<MonitorEvent> nf;
  for (const auto& e : open) {
    if (e.kind == MonitorEvent::kNonFinite) nf.push_back(e);
  }
  std::vector<Label> labels;
  for (const Label& l : t.labels) labels.push_back(l);
  ASSERT_EQ(nf.size(), labels.size());
  for (size_t i = 0; i < nf.size(); ++i) {
    EXPECT_EQ(nf[i].step, labels[i].onset);
    EXPECT_EQ(nf[i].layer, labels[i].layer);
  }
}

TEST(RunMonitorTest, MemoryStaysBoundedOver100kSteps) {
  RunMonitor m(RunMonitor::Options{});
  size_t at_20k = 0, max_seen = 0;
  // Five healthy stretches back to back, renumbered: 100,000 steps.
  int64_t step = 0;
  for (uint64_t seed = 81; seed <= 85; ++seed) {
    const LabeledTrace t = GenerateTrace({Scenario::kHealthy, seed, 20000, 4});
    for (StepSample s : t.steps) {
      s.step = step++;
      m.Observe(s);
      max_seen = std::max(max_seen, m.footprint());
    }
    if (step == 20000) at_20k = m.footprint();
  }
  EXPECT_EQ(step, 100000);
  const auto& o = m.options();
  EXPECT_EQ(m.loss_detector().window_size(), static_cast<size_t>(o.loss.window));
  EXPECT_LE(m.grad_norm_detector().window_size(), static_cast<size_t>(o.grad_norm.window));
  // Slack: the recent precursor warnings (at most max_recent_precursors),
  // the grad-norm corroboration steps (at most lookback + blip_steps + 2)
  // and the blips of the escalation window (fewer than the escalate count).
  EXPECT_LE(max_seen, at_20k + o.max_recent_precursors + o.corroborate_lookback +
                          o.loss.blip_steps + 2 + o.loss.blip_escalate_count);
  // Per series: lookback (steps and values), change baseline, smoothing and
  // scratch; plus the spike windows, the divergence medians and the clip
  // window.
  const auto& p = o.precursor;
  const size_t per_series = 2 * p.lookback + 2 * p.baseline_window + p.smooth;
  const size_t bound = m.precursors().series_count() * per_series + o.loss.window +
                       o.grad_norm.window + o.divergence.median_window +
                       o.divergence.horizon / o.divergence.stride + 1 + p.clip_window +
                       o.max_recent_precursors;
  EXPECT_LE(max_seen, bound);
}

TEST(RunMonitorTest, StaleStepsAreIgnored) {
  RunMonitor m(RunMonitor::Options{});
  const LabeledTrace t = GenerateTrace({Scenario::kHealthy, 91, 500, 2});
  for (const auto& s : t.steps) m.Observe(s);
  StepSample stale = t.steps[100];
  stale.loss = 1e6;
  EXPECT_TRUE(m.Observe(stale).empty());
}

}  // namespace
}  // namespace spikeguard::detect
