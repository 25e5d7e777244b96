#include "daemon/detect/eval/trace_gen.h"

#include <cmath>

#include "gtest/gtest.h"

namespace spikeguard::worker {
namespace {

TEST(TraceModelTest, IsDeterministic) {
  TraceSpec spec;
  spec.seed = 42;
  TraceModel a(spec), b(spec);
  for (int s = 0; s < 50; ++s) {
    EXPECT_EQ(a.Report(3, s).SerializeAsString(), b.Report(3, s).SerializeAsString());
  }
  spec.seed = 43;
  TraceModel c(spec);
  EXPECT_NE(a.Report(0, 10).loss(), c.Report(0, 10).loss());
}

TEST(TraceModelTest, SpikeHasPrecursorsAndRecovers) {
  TraceSpec spec;
  spec.spikes = {1000};
  spec.layers = 4;
  TraceModel m(spec);
  const double base = m.BaselineLoss(1000);
  EXPECT_GT(m.Report(0, 1000).loss(), 2.0 * base);
  EXPECT_LT(m.Report(0, 1040).loss(), 1.1 * m.BaselineLoss(1040));
  EXPECT_LT(m.Report(0, 700).loss(), 1.1 * m.BaselineLoss(700));
  // The grad norm leads the loss peak.
  EXPECT_GT(m.Report(0, 997).grad_norm(), 10.0 * m.Report(0, 700).grad_norm());
  // The last layer's attention logit climbs for hundreds of steps before.
  const double far = m.Report(0, 700).layers(3).max_attn_logit();
  const double near = m.Report(0, 990).layers(3).max_attn_logit();
  EXPECT_GT(near, 10.0 * far);
  EXPECT_LT(m.Report(0, 990).layers(0).max_attn_logit(), 2.0 * far);
}

TEST(TraceModelTest, NanStepIsNonFinite) {
  TraceSpec spec;
  spec.nan_steps = {5};
  TraceModel m(spec);
  auto r = m.Report(0, 5);
  EXPECT_TRUE(std::isnan(r.loss()));
  EXPECT_TRUE(std::isinf(r.grad_norm()));
  EXPECT_EQ(r.nonfinite_count(), 1);
  EXPECT_FALSE(std::isnan(m.Report(0, 6).loss()));
}

}  // namespace
}  // namespace spikeguard::worker
