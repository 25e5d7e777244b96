// A migrated in-memory catalog database, a fake clock and a run, for the
// tests of one store at a time (the stores open no transaction: each
// statement commits on its own here).
#pragma once

#include <memory>
#include <string>

#include "base/clock.h"
#include "gtest/gtest.h"
#include "storage/catalog/database.h"
#include "storage/catalog/run_store.h"
#include "storage/catalog/schema.h"

namespace spikeguard::storage::testing {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = Database::Open({.path = ":memory:"});
    ASSERT_TRUE(opened.ok()) << opened.status();
    db_ = std::move(*opened);
    ASSERT_TRUE(OpenSchema(*db_).ok());
  }

  // A run named `name` (generation 0); returns its id.
  int64_t AddRun(const std::string& name, uint32_t world_size = 2) {
    RunStore runs(db_.get(), &clock_);
    v1::Run run;
    run.set_name(name);
    run.set_world_size(world_size);
    auto id = runs.Create(run);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }

  FakeClock clock_;
  std::unique_ptr<Database> db_;
};

}  // namespace spikeguard::storage::testing
