#include "daemon/metrics/registry.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spikeguard::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsRegistryTest, CountersGaugesAndTheirExposition) {
  Registry r;
  Counter* c = r.GetCounter("spikeguard_things_total", "Things done.");
  c->Inc();
  c->Inc(2);
  c->Inc(-5);  // ignored: a counter never goes down
  EXPECT_EQ(r.GetCounter("spikeguard_things_total", "Things done."), c);  // same object
  r.GetGauge("spikeguard_level", "A level.", {{"run", "a"}})->Set(1.5);
  r.GetGauge("spikeguard_level", "A level.", {{"run", "b"}})->Set(-2);
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# HELP spikeguard_things_total Things done.\n"
                              "# TYPE spikeguard_things_total counter\n"
                              "spikeguard_things_total 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE spikeguard_level gauge\nspikeguard_level{run=\"a\"} 1.5\n"
                              "spikeguard_level{run=\"b\"} -2\n"));
  // HELP and TYPE once per family.
  EXPECT_EQ(text.find("# TYPE spikeguard_level"), text.rfind("# TYPE spikeguard_level"));
}

TEST(MetricsRegistryTest, HistogramBucketsAreCumulativeWithSumAndCount) {
  Registry r;
  Histogram* h = r.GetHistogram("spikeguard_latency_seconds", "Latency.", {0.01, 0.1, 1});
  for (double v : {0.005, 0.05, 0.05, 0.5, 7.0}) h->Observe(v);
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE spikeguard_latency_seconds histogram\n"
                              "spikeguard_latency_seconds_bucket{le=\"0.01\"} 1\n"
                              "spikeguard_latency_seconds_bucket{le=\"0.1\"} 3\n"
                              "spikeguard_latency_seconds_bucket{le=\"1\"} 4\n"
                              "spikeguard_latency_seconds_bucket{le=\"+Inf\"} 5\n"
                              "spikeguard_latency_seconds_sum 7.605\n"
                              "spikeguard_latency_seconds_count 5\n"));
}

TEST(MetricsRegistryTest, HostileLabelValuesAreEscapedAndBadNamesRefused) {
  Registry r;
  r.GetGauge("spikeguard_run_loss", "Loss.", {{"run", "a\"b\\c\nd"}})->Set(1);
  EXPECT_FALSE(Registry::ValidName("spikeguard-bad"));
  EXPECT_FALSE(Registry::ValidName("1abc"));
  EXPECT_TRUE(Registry::ValidName("spikeguard_ok:rate"));
  r.AddCollector([](Sink& sink) {
    sink.Gauge("bad name", "x", {}, 1);                   // dropped
    sink.Gauge("spikeguard_ok", "x", {{"bad-label", "v"}}, 1);  // dropped
    sink.Gauge("spikeguard_fine", "Fine.", {{"run", "x"}}, 0.25);
  });
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("spikeguard_run_loss{run=\"a\\\"b\\\\c\\nd\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("bad name")));
  EXPECT_THAT(text, Not(HasSubstr("bad-label")));
  EXPECT_THAT(text, HasSubstr("spikeguard_fine{run=\"x\"} 0.25\n"));
}

TEST(MetricsRegistryTest, CollectorSamplesJoinTheirFamily) {
  Registry r;
  r.AddCollector([](Sink& sink) {
    sink.Counter("spikeguard_probes_total", "Probes.", {{"kind", "skip"}}, 2);
    sink.Counter("spikeguard_probes_total", "Probes.", {{"kind", "replay"}}, 1);
  });
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE spikeguard_probes_total counter\n"));
  EXPECT_EQ(text.find("# HELP spikeguard_probes_total"), text.rfind("# HELP spikeguard_probes_total"));
  EXPECT_THAT(text, HasSubstr("spikeguard_probes_total{kind=\"skip\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("spikeguard_probes_total{kind=\"replay\"} 1\n"));
}

TEST(MetricsRegistryTest, ConcurrentUpdatesAreAllCounted) {
  Registry r;
  Counter* c = r.GetCounter("spikeguard_n_total", "N.");
  Histogram* h = r.GetHistogram("spikeguard_h_seconds", "H.", Histogram::LatencyBuckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Inc();
        h->Observe(0.001);
        if (i % 1000 == 0) r.Render();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->Value(), 40000);
  EXPECT_EQ(h->Take().count, 40000u);
}

}  // namespace
}  // namespace spikeguard::metrics
