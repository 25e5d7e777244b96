#include "daemon/detect/nonfinite_detector.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace spikeguard::detect {
namespace {

StepSample Finite(int64_t step, int layers = 4) {
  StepSample s;
  s.step = step;
  s.loss = 2.0;
  s.grad_norm = 0.3;
  s.layers.resize(layers);
  for (auto& l : s.layers) {
    l.max_attn_logit = 20;
    l.grad_norm = 0.1;
    l.update_ratio = 1e-3;
    l.act_rms = 1;
    l.param_norm = 50;
  }
  return s;
}

TEST(NonFiniteDetectorTest, FiniteStepsAreSilent) {
  NonFiniteDetector d(NonFiniteDetector::Options{});
  for (int s = 0; s < 1000; ++s) EXPECT_FALSE(d.Observe(Finite(s)).has_value());
}

TEST(NonFiniteDetectorTest, NanLossFiresImmediatelyWithTheFirstForwardLayer) {
  NonFiniteDetector d(NonFiniteDetector::Options{});
  StepSample s = Finite(7);
  s.loss = std::numeric_limits<double>::quiet_NaN();
  s.nonfinite = 12;
  // Layer 2 went non-finite in the forward pass; layer 3 inherits it.
  s.layers[2].act_rms = NAN;
  s.layers[3].act_rms = NAN;
  s.layers[3].max_attn_logit = NAN;
  for (auto& l : s.layers) l.grad_norm = NAN;
  auto e = d.Observe(s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->step, 7);
  EXPECT_EQ(e->signal, "loss");
  EXPECT_EQ(e->nonfinite_count, 12);
  EXPECT_EQ(e->first_layer, 2);
  EXPECT_EQ(e->layer_signal, "act_rms");
}

TEST(NonFiniteDetectorTest, GradientOnlyNonFinitePointsAtTheHighestLayer) {
  NonFiniteDetector d(NonFiniteDetector::Options{});
  StepSample s = Finite(3);
  s.grad_norm = std::numeric_limits<double>::infinity();
  // Backward runs from the last layer down: layer 2 is where it started.
  s.layers[0].grad_norm = NAN;
  s.layers[1].grad_norm = NAN;
  s.layers[2].grad_norm = NAN;
  auto e = d.Observe(s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->signal, "grad_norm");
  EXPECT_EQ(e->first_layer, 2);
  EXPECT_EQ(e->layer_signal, "grad_norm");
}

TEST(NonFiniteDetectorTest, ReportedCountAloneFiresWithoutALayer) {
  NonFiniteDetector d(NonFiniteDetector::Options{});
  StepSample s = Finite(9, 0);
  s.nonfinite = 3;
  auto e = d.Observe(s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->signal, "nonfinite_count");
  EXPECT_EQ(e->first_layer, -1);
}

TEST(NonFiniteDetectorTest, ABurstIsOneEventAndTheDetectorRearms) {
  NonFiniteDetector::Options o;
  o.rearm_steps = 10;
  NonFiniteDetector d(o);
  int events = 0;
  for (int s = 0; s < 100; ++s) {
    StepSample x = Finite(s);
    // Bursts at 10–13, 16 (same episode: fewer than 10 finite steps between)
    // and 60–61 (a new episode).
    if ((s >= 10 && s <= 13) || s == 16 || s == 60 || s == 61) x.loss = NAN;
    if (d.Observe(x)) ++events;
  }
  EXPECT_EQ(events, 2);
}

}  // namespace
}  // namespace spikeguard::detect
