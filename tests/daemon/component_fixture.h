// A real catalog file in a temp dir, a fake clock, and the shared pieces the
// daemon builds its components over (live rank registry, stream hub, ingest
// counters, metrics registry): what the daemon's handlers, sessions and
// collectors are tested on without a server. Fixtures derive and call
// ComponentFixture::SetUp(); each builds its component's dependencies from
// these members.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/control/stream_hub.h"
#include "daemon/ingest/counters.h"
#include "daemon/ingest/limits.h"
#include "daemon/ingest/run_registry.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/metrics/registry.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "tests/e2e/process.h"

namespace spikeguard::daemon::testing {

class ComponentFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::CatalogOptions options;
    options.path = dir_.File("catalog.db");
    options.clock = &clock_;
    auto opened = storage::Catalog::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    catalog_ = std::move(*opened);
    catalog_path_ = options.path;
    started_ = clock_.Now();
  }

  spikeguard::testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<storage::Catalog> catalog_;
  std::string catalog_path_;
  absl::Time started_;
  Limits limits_;
  RunRegistry registry_{&clock_};
  StreamHub hub_;
  Counters counters_;
  metrics::Registry metrics_registry_;
  metrics::DaemonMetrics metrics_{&metrics_registry_};
};

}  // namespace spikeguard::daemon::testing
