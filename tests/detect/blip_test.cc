// What is worth an incident. A run's loss with its own noise
// (Gaussian or heavy-tailed), and on top of it the excursions a user sees:
// single-step blips, blips that repeat, a legit level shift, a corroborated
// one-step spike, a slow grad-norm build. Each test also runs the rule
// switched off, so it shows what the rule changes.
#include <cmath>
#include <random>
#include <vector>

#include "daemon/detect/eval/detectors.h"
#include "daemon/detect/eval/scoring.h"
#include "daemon/detect/eval/wild_corpus.h"
#include "daemon/detect/precursor_detector.h"
#include "daemon/detect/run_monitor.h"
#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

// A healthy run: loss 2.5 with relative noise `sigma` (Student-t with `dof`
// degrees of freedom, 0 = Gaussian), grad norm 0.3 with log-normal noise.
std::vector<StepSample> NoisyRun(int64_t n, double sigma, int dof, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> z(0, 1);
  std::vector<StepSample> out(n);
  for (int64_t s = 0; s < n; ++s) {
    double eps = z(rng);
    if (dof > 0) {
      double chi2 = 0;
      for (int i = 0; i < dof; ++i) {
        const double u = z(rng);
        chi2 += u * u;
      }
      eps /= std::sqrt(chi2 / dof);
    }
    out[s].step = s;
    out[s].loss = 2.5 * (1 + sigma * eps);
    out[s].grad_norm = 0.3 * std::exp(0.1 * z(rng));
  }
  return out;
}

struct Seen {
  std::vector<MonitorEvent> incidents, blips, shifts;
};

Seen Watch(const std::vector<StepSample>& steps, RunMonitor::Options o = {}) {
  RunMonitor m(o);
  Seen seen;
  for (const StepSample& s : steps) {
    for (MonitorEvent& e : m.Observe(s)) {
      if (e.opens_incident()) seen.incidents.push_back(e);
      if (e.kind == MonitorEvent::kBlip) seen.blips.push_back(e);
      if (e.kind == MonitorEvent::kLevelShift) seen.shifts.push_back(e);
    }
  }
  return seen;
}

RunMonitor::Options Off() {
  RunMonitor::Options o;
  o.loss.blip_steps = 0;
  o.loss.tail_factor = 0;
  o.loss.shift_tolerance = 0;
  return o;
}

TEST(BlipTest, HeavyTailedNoiseRecordsBlipsButOpensNoIncident) {
  // Student-t with 3 degrees of freedom at 2 %: single-step excursions of
  // 10-20 % every few thousand steps, in a healthy run.
  for (uint64_t seed : {1, 2, 3}) {
    const auto steps = NoisyRun(30000, 0.02, 3, seed);
    const Seen on = Watch(steps);
    for (const MonitorEvent& e : on.incidents) {
      ADD_FAILURE() << seed << ": incident at " << e.onset_step << " (step " << e.step
                    << ", escalated " << e.escalated << ", value " << e.value << ", baseline "
                    << e.baseline << ")";
    }
    // Without the tail calibration and the blip rule the same run pages.
    EXPECT_GE(Watch(steps, Off()).incidents.size(), 5u) << seed;
  }
}

TEST(BlipTest, GaussianNoiseKeepsTheDesignThreshold) {
  SpikeDetector::Options o = RunMonitor::Options::LossDefaults();
  SpikeDetector gauss(o), heavy(o);
  const auto g = NoisyRun(4000, 0.01, 0, 7), h = NoisyRun(4000, 0.01, 3, 7);
  for (size_t i = 0; i < g.size(); ++i) {
    gauss.Observe(g[i].step, g[i].loss);
    heavy.Observe(h[i].step, h[i].loss);
  }
  EXPECT_DOUBLE_EQ(gauss.threshold(), o.z_threshold);
  EXPECT_GT(heavy.threshold(), 1.3 * o.z_threshold);
}

TEST(BlipTest, OneStepExcursionIsABlipUnlessTheGradNormCorroboratesIt) {
  auto steps = NoisyRun(4000, 0.01, 0, 11);
  steps[3000].loss *= 1.4;
  Seen seen = Watch(steps);
  EXPECT_TRUE(seen.incidents.empty());
  ASSERT_EQ(seen.blips.size(), 1u);
  EXPECT_EQ(seen.blips[0].onset_step, 3000);
  EXPECT_EQ(Watch(steps, Off()).incidents.size(), 1u);

  // The same excursion with a grad-norm blow-up 4 steps ahead: an incident,
  // opened at once.
  for (int64_t s = 2996; s <= 3000; ++s) steps[s].grad_norm *= 6;
  // (×6 is under the grad-norm rule's own 8× floor: only the loss opens.)
  seen = Watch(steps);
  ASSERT_EQ(seen.incidents.size(), 1u);
  EXPECT_EQ(seen.incidents[0].signal, "loss");
  EXPECT_EQ(seen.incidents[0].onset_step, 3000);
  EXPECT_EQ(seen.incidents[0].step, 3000);
  EXPECT_TRUE(seen.blips.empty());
}

// NoisyRun with three domains ("web", "code", "math"): each domain's loss
// is the run's (common noise) at its own level with a little noise of its
// own, and the run loss is their token-weighted mean.
std::vector<StepSample> DomainRun(int64_t n, uint64_t seed) {
  auto steps = NoisyRun(n, 0.01, 0, seed);
  std::mt19937_64 rng(seed + 100);
  std::normal_distribution<double> z(0, 1);
  const char* names[] = {"web", "code", "math"};
  const double level[] = {0.9, 1.0, 1.1};
  for (StepSample& s : steps) {
    for (int d = 0; d < 3; ++d) {
      s.domains.push_back(DomainSample{names[d], s.loss * level[d] * (1 + 0.004 * z(rng)), 1000});
    }
  }
  return steps;
}

// Sets the run loss to the token-weighted mean of the domain losses.
void Remix(StepSample* s) {
  double sum = 0;
  int64_t tokens = 0;
  for (const DomainSample& d : s->domains) {
    sum += d.loss * static_cast<double>(d.tokens);
    tokens += d.tokens;
  }
  s->loss = sum / static_cast<double>(tokens);
}

TEST(BlipTest, OneStepExcursionConcentratedInOneDomainOpensAnIncident) {
  // A bad batch: the "code" domain's loss more than doubles for one step,
  // the other domains and the grad norm stay calm. The run loss rises
  // ~40 %, exactly as much as in the blip test above.
  auto steps = DomainRun(4000, 21);
  steps[3000].domains[1].loss *= 2.2;
  Remix(&steps[3000]);
  Seen seen = Watch(steps);
  ASSERT_EQ(seen.incidents.size(), 1u);
  EXPECT_EQ(seen.incidents[0].kind, MonitorEvent::kSpikeOnset);
  EXPECT_EQ(seen.incidents[0].signal, "loss");
  EXPECT_EQ(seen.incidents[0].onset_step, 3000);
  EXPECT_EQ(seen.incidents[0].step, 3000);  // at once, not held
  EXPECT_EQ(seen.incidents[0].corroborated_by, "domain_loss");
  EXPECT_EQ(seen.incidents[0].domain, "code");
  EXPECT_TRUE(seen.blips.empty());

  // The per-domain rule is what opens it: switched off, it is a blip.
  RunMonitor::Options no_domains;
  no_domains.domain_z = 0;
  const Seen off = Watch(steps, no_domains);
  EXPECT_TRUE(off.incidents.empty());
  ASSERT_EQ(off.blips.size(), 1u);
  EXPECT_EQ(off.blips[0].onset_step, 3000);

  // The same run rise spread evenly over the domains (every domain +40 %),
  // nothing else corroborating: a blip, no incident.
  auto spread = DomainRun(4000, 21);
  for (DomainSample& d : spread[3000].domains) d.loss *= 1.4;
  Remix(&spread[3000]);
  EXPECT_NEAR(spread[3000].loss, steps[3000].loss, 0.01 * steps[3000].loss);
  seen = Watch(spread);
  EXPECT_TRUE(seen.incidents.empty()) << seen.incidents[0].corroborated_by;
  ASSERT_EQ(seen.blips.size(), 1u);
  EXPECT_EQ(seen.blips[0].onset_step, 3000);

  // Two domains out of three carrying it is not one domain: a blip too.
  auto two = DomainRun(4000, 21);
  two[3000].domains[0].loss *= 1.6;
  two[3000].domains[1].loss *= 1.6;
  Remix(&two[3000]);
  seen = Watch(two);
  EXPECT_TRUE(seen.incidents.empty());
  EXPECT_EQ(seen.blips.size(), 1u);
}

TEST(BlipTest, DomainSpikeFamilyIsCaughtOnlyWithPerDomainLosses) {
  // The wild corpus's domain_spikes family (held-out seeds): its labeled
  // bad batches are one-step excursions that only the per-domain losses
  // corroborate; the same-sized even ones are unlabeled blips.
  ScoreCounts on, off;
  RunMonitor::Options no_domains;
  no_domains.domain_z = 0;
  for (uint64_t seed = 900000; seed < 900006; ++seed) {
    const LabeledTrace t = GenerateWildTrace({WildFamily::kDomainSpikes, seed, 6000, 4});
    ASSERT_FALSE(t.steps.empty());
    ASSERT_GE(t.steps[100].domains.size(), 3u);
    for (const auto& [o, c] : {std::pair{RunMonitor::Options{}, &on}, std::pair{no_domains, &off}}) {
      auto alarms = RunDetector("spikeguard", t.steps, o);
      ASSERT_TRUE(alarms.ok());
      c->Add(ScoreTrace(*alarms, t.labels, static_cast<int64_t>(t.steps.size())));
    }
  }
  ASSERT_GT(on.labels, 10);
  EXPECT_GE(on.detected, on.labels * 9 / 10) << on.detected << "/" << on.labels;
  EXPECT_LE(on.false_alarms, 1);
  EXPECT_LE(off.detected, off.labels / 4) << off.detected << "/" << off.labels;
}

TEST(BlipTest, RepeatedBlipsEscalateToAnIncidentDatedAtTheFirst) {
  auto steps = NoisyRun(4000, 0.01, 0, 12);
  for (int64_t s : {3000, 3020, 3040}) steps[s].loss *= 1.4;
  const Seen seen = Watch(steps);
  ASSERT_EQ(seen.incidents.size(), 1u);
  EXPECT_TRUE(seen.incidents[0].escalated);
  EXPECT_EQ(seen.incidents[0].onset_step, 3000);
  EXPECT_EQ(seen.incidents[0].step, 3041);
  EXPECT_EQ(seen.blips.size(), 3u);
  // Spread wider than the window they stay blips.
  auto spread = NoisyRun(4000, 0.01, 0, 12);
  for (int64_t s : {2000, 2500, 3000}) spread[s].loss *= 1.4;
  EXPECT_TRUE(Watch(spread).incidents.empty());
}

TEST(BlipTest, LegitLevelShiftIsNotAnIncidentButALargeSustainedJumpIs) {
  // A data-mixture change: +8 % from step 3000 on, grad norm unchanged.
  auto steps = NoisyRun(5000, 0.01, 0, 13);
  for (int64_t s = 3000; s < 5000; ++s) steps[s].loss *= 1.08;
  const Seen seen = Watch(steps);
  EXPECT_TRUE(seen.incidents.empty()) << seen.incidents[0].onset_step;
  ASSERT_EQ(seen.shifts.size(), 1u);
  EXPECT_EQ(seen.shifts[0].onset_step, 3000);
  EXPECT_EQ(Watch(steps, Off()).incidents.size(), 1u);

  // +60 % that decays over 20 steps, nothing else moving: a spike.
  auto spike = NoisyRun(5000, 0.01, 0, 13);
  for (int64_t s = 3000; s < 3020; ++s) spike[s].loss *= 1 + 0.6 * std::exp(-(s - 3000) / 6.0);
  const Seen big = Watch(spike);
  ASSERT_EQ(big.incidents.size(), 1u);
  EXPECT_EQ(big.incidents[0].onset_step, 3000);
  EXPECT_LE(big.incidents[0].step, 3002);
}

TEST(BlipTest, SmallSpikeWithARiseAndADecayOpensWhenItComesBack) {
  // +12 % decaying over a dozen steps, at 1 % noise: more than one step over
  // the threshold, too small to open at once, not a level shift.
  auto steps = NoisyRun(5000, 0.01, 0, 16);
  for (int64_t s = 3000; s < 3015; ++s) steps[s].loss *= 1 + 0.12 * std::exp(-(s - 3000) / 4.0);
  const Seen seen = Watch(steps);
  ASSERT_EQ(seen.incidents.size(), 1u);
  EXPECT_EQ(seen.incidents[0].onset_step, 3000);
  EXPECT_GT(seen.incidents[0].step, 3001);
  EXPECT_LE(seen.incidents[0].step, 3015);
  EXPECT_TRUE(seen.blips.empty());
  EXPECT_TRUE(seen.shifts.empty());
}

TEST(BlipTest, SlowGradNormGrowthWarnsHundredsOfStepsBeforeTheLossMoves) {
  // The issue's case: the global grad norm grows 20× over 600 steps, then
  // the loss diverges at 3000. The warning comes early, dated near 2400.
  auto steps = NoisyRun(3600, 0.01, 0, 14);
  for (int64_t s = 2400; s < 3600; ++s) {
    steps[s].grad_norm *= std::pow(20.0, std::min(1.0, (s - 2400) / 600.0));
  }
  for (int64_t s = 3000; s < 3600; ++s) steps[s].loss *= 1 + std::min(1.0, (s - 3000) / 50.0);
  RunMonitor m{RunMonitor::Options{}};
  std::optional<PrecursorWarning> warn;
  PrecursorDetector p{PrecursorDetector::Options{}};
  for (const StepSample& s : steps) {
    for (const PrecursorWarning& w : p.Observe(s)) {
      if (!warn && w.signal == "grad_norm" && w.layer < 0) warn = w;
    }
  }
  ASSERT_TRUE(warn.has_value());
  EXPECT_LE(warn->step, 2900);
  EXPECT_GE(warn->start_step, 2300);
  EXPECT_LE(warn->start_step, 2600);
  // Without the slow rule nothing warns before the loss moves.
  PrecursorDetector::Options no_slow;
  no_slow.slow_window = 0;
  PrecursorDetector q(no_slow);
  int64_t first = -1;
  for (const StepSample& s : steps) {
    for (const PrecursorWarning& w : q.Observe(s)) {
      if (first < 0 && w.signal == "grad_norm" && w.layer < 0) first = w.step;
    }
  }
  EXPECT_TRUE(first < 0 || first > 2900) << first;
}

TEST(BlipTest, AttentionLogitGrowthWarnsLongBeforeAHundredfoldRise) {
  // One layer's max attention logit grows 400× over 1,600 steps.
  auto steps = NoisyRun(5000, 0.01, 0, 15);
  std::mt19937_64 rng(15);
  std::normal_distribution<double> z(0, 1);
  for (StepSample& s : steps) {
    s.layers.resize(4);
    for (int l = 0; l < 4; ++l) {
      double a = 30 * std::exp(0.05 * z(rng));
      if (l == 2 && s.step >= 2000) a *= std::pow(400.0, std::min(1.0, (s.step - 2000) / 1600.0));
      s.layers[l].max_attn_logit = a;
      s.layers[l].grad_norm = 0.1 * std::exp(0.1 * z(rng));
      s.layers[l].update_ratio = 1e-3 * std::exp(0.1 * z(rng));
      s.layers[l].act_rms = 1 + 0.01 * z(rng);
    }
  }
  PrecursorDetector p{PrecursorDetector::Options{}};
  std::optional<PrecursorWarning> warn;
  int other = 0;
  for (const StepSample& s : steps) {
    for (const PrecursorWarning& w : p.Observe(s)) {
      if (w.signal == "max_attn_logit" && w.layer == 2) {
        if (!warn) warn = w;
      } else {
        ++other;
      }
    }
  }
  ASSERT_TRUE(warn.has_value());
  // ×100 is reached at step 3230; the warning comes before ×10 (step 2615).
  EXPECT_LE(warn->step, 2615);
  EXPECT_GE(warn->start_step, 1900);
  EXPECT_LE(warn->start_step, 2300);
  EXPECT_EQ(other, 0);
}

TEST(BlipTest, HeldOutSplitMeetsTheIssueTargets) {
  // The held-out split (seeds nothing was tuned on), spikeguard only: F1 >= 0.95, at most 0.5 false alarms per 10,000 steps, and its
  // precursors warn >= 100 steps ahead on the slow-build families.
  ScoreCounts all, slow;
  // The split as detector_bench defines it: the wild families' held-out
  // seeds and the original families at seed 901.
  std::vector<LabeledTrace> corpus = WildCorpus(CorpusSplit::kHeldOut);
  for (LabeledTrace& t : BenchmarkCorpus(901)) corpus.push_back(std::move(t));
  for (const LabeledTrace& t : corpus) {
    auto alarms = RunDetector("spikeguard", t.steps);
    ASSERT_TRUE(alarms.ok());
    const ScoreCounts c = ScoreTrace(*alarms, t.labels, static_cast<int64_t>(t.steps.size()));
    all.Add(c);
    const std::string family = t.name.substr(0, t.name.rfind('-'));
    if (auto f = ParseWildFamily(family); f.ok() && IsSlowBuild(*f)) slow.Add(c);
  }
  const DetectorScore s = Summarize("spikeguard", all);
  EXPECT_GE(s.f1, 0.95) << s.counts.detected << "/" << s.counts.labels << ", "
                        << s.counts.false_alarms << " false";
  EXPECT_LE(s.false_alarms_per_10k, 0.5);
  EXPECT_GE(MedianOrNan(slow.precursor_leads), 100);
  EXPECT_GE(slow.precursors_detected, slow.precursor_labels * 3 / 4);
}

}  // namespace
}  // namespace spikeguard::detect
