// A real catalog file in a temp dir, a fake clock and the DaemonState over
// them: what the daemon's handlers, sessions and collectors are built on,
// tested without a server. Fixtures derive and call DaemonStateTest::SetUp().
#pragma once

#include <memory>

#include "base/clock.h"
#include "daemon/ingest/limits.h"
#include "daemon/server/daemon_state.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "tests/e2e/process.h"

namespace spikeguard::daemon::testing {

class DaemonStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::CatalogOptions options;
    options.path = dir_.File("catalog.db");
    options.clock = &clock_;
    auto opened = storage::Catalog::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    catalog_ = std::move(*opened);
    state_ = std::make_unique<DaemonState>(catalog_.get(), &clock_, Limits{}, options.path);
  }

  spikeguard::testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<storage::Catalog> catalog_;
  std::unique_ptr<DaemonState> state_;
};

}  // namespace spikeguard::daemon::testing
