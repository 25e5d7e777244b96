// The /metrics state collector's catalog snapshot: a scrape storm reads the
// catalog once per refresh interval (spikeguard_metrics_catalog_reads_total
// counts every read), the catalog-derived gauges refresh after the interval,
// and the live values (report counters, the daemon's counters and
// histograms) never wait for it. A fake clock steps the interval.
#include "daemon/metrics/state_collector.h"

#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "tests/daemon/component_fixture.h"

namespace spikeguard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

namespace v1 = ::spikeguard::v1;

// The value of one sample line ("NAME{labels} VALUE"), or -1 when absent.
double Sample(const std::string& text, const std::string& series) {
  const std::string line_start = series + " ";
  for (size_t p = text.find(line_start); p != std::string::npos; p = text.find(line_start, p + 1)) {
    if (p == 0 || text[p - 1] == '\n') return std::stod(text.substr(p + line_start.size()));
  }
  return -1;
}

class StateCollectorTest : public daemon::testing::ComponentFixture {
 protected:

  void CreateRun(const std::string& name, int64_t last_step) {
    v1::Run run;
    run.set_name(name);
    run.set_world_size(1);
    auto created = catalog_->CreateRun(run);
    ASSERT_TRUE(created.ok()) << created.status();
    if (last_step > 0) {
      ASSERT_TRUE(catalog_->UpdateRunProgress(name, last_step).ok());
    }
  }

  // What the daemon gives the collector (no supervisor).
  metrics::StateSources Sources() {
    metrics::StateSources sources;
    sources.catalog = catalog_.get();
    sources.catalog_path = catalog_path_;
    sources.clock = &clock_;
    sources.started = started_;
    sources.registry = &registry_;
    sources.counters = &counters_;
    return sources;
  }

  double Reads(const std::string& text) { return Sample(text, "spikeguard_metrics_catalog_reads_total"); }

};

TEST_F(StateCollectorTest, ScrapesWithinTheWindowShareOneCatalogReadAndRefreshAfterIt) {
  metrics::RegisterStateCollector(&metrics_registry_, Sources(), {.catalog_refresh = absl::Seconds(1)});
  CreateRun("a", 10);
  const std::string first = metrics_registry_.Render();
  EXPECT_EQ(Reads(first), 1);
  EXPECT_EQ(Sample(first, "spikeguard_run_last_step{run=\"a\"}"), 10);
  EXPECT_EQ(Sample(first, "spikeguard_catalog_up"), 1);

  // Within the window: the catalog changes, the live values move, the
  // catalog-derived ones are the snapshot's and nothing is read again.
  ASSERT_TRUE(catalog_->UpdateRunProgress("a", 20).ok());
  CreateRun("b", 5);
  counters_.reports_accepted += 7;
  metrics_.batches_committed->Inc(3);
  metrics_.commit_latency_seconds->Observe(0.004);
  clock_.Advance(absl::Milliseconds(999));
  const std::string second = metrics_registry_.Render();
  EXPECT_EQ(Reads(second), 1) << "a second scrape within the window read the catalog";
  EXPECT_EQ(Sample(second, "spikeguard_run_last_step{run=\"a\"}"), 10);
  EXPECT_THAT(second, Not(HasSubstr("run=\"b\"")));
  EXPECT_EQ(Sample(second, "spikeguard_reports_ingested_total"), 7);
  EXPECT_EQ(Sample(second, "spikeguard_batches_committed_total"), 3);
  EXPECT_EQ(Sample(second, "spikeguard_commit_latency_seconds_count"), 1);
  EXPECT_NEAR(Sample(second, "spikeguard_uptime_seconds"), 0.999, 1e-9);

  // Past the window: one more read, fresh values.
  clock_.Advance(absl::Milliseconds(1));
  const std::string third = metrics_registry_.Render();
  EXPECT_EQ(Reads(third), 2);
  EXPECT_EQ(Sample(third, "spikeguard_run_last_step{run=\"a\"}"), 20);
  EXPECT_EQ(Sample(third, "spikeguard_run_last_step{run=\"b\"}"), 5);
  EXPECT_EQ(Sample(third, "spikeguard_connected_ranks{run=\"b\"}"), 0);
  const std::string fourth = metrics_registry_.Render();
  EXPECT_EQ(Reads(fourth), 2);
}

TEST_F(StateCollectorTest, ConcurrentScrapesInOneWindowReadOnce) {
  metrics::RegisterStateCollector(&metrics_registry_, Sources());  // the daemon's default: 1 s
  CreateRun("a", 3);
  std::vector<std::thread> scrapers;
  std::vector<std::string> texts(16);
  for (size_t i = 0; i < texts.size(); ++i) {
    scrapers.emplace_back([&, i] { texts[i] = metrics_registry_.Render(); });
  }
  for (std::thread& t : scrapers) t.join();
  for (const std::string& text : texts) {
    EXPECT_EQ(Sample(text, "spikeguard_run_last_step{run=\"a\"}"), 3);
    EXPECT_EQ(Sample(text, "spikeguard_incidents_opened_total"), 0);
  }
  EXPECT_EQ(Reads(metrics_registry_.Render()), 1);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Reads(metrics_registry_.Render()), 2);
}

TEST_F(StateCollectorTest, ZeroRefreshReadsOnEveryScrape) {
  metrics::RegisterStateCollector(&metrics_registry_, Sources(), {.catalog_refresh = absl::ZeroDuration()});
  CreateRun("a", 1);
  EXPECT_EQ(Reads(metrics_registry_.Render()), 1);
  ASSERT_TRUE(catalog_->UpdateRunProgress("a", 2).ok());
  const std::string text = metrics_registry_.Render();
  EXPECT_EQ(Reads(text), 2);
  EXPECT_EQ(Sample(text, "spikeguard_run_last_step{run=\"a\"}"), 2);
}

}  // namespace
}  // namespace spikeguard
