// PolicyStore: policies by scope.
#include "storage/catalog/policy_store.h"

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using PolicyStoreTest = testing::StoreTest;

TEST_F(PolicyStoreTest, APolicyPerScopeReplacedByTheNextPut) {
  PolicyStore policies(db_.get(), &clock_);
  EXPECT_EQ(policies.Get("").status().code(), absl::StatusCode::kNotFound);
  v1::Policy daemon;
  daemon.set_mode(v1::MODE_OBSERVE);
  v1::Policy run;
  run.set_mode(v1::MODE_AUTO);
  ASSERT_TRUE(policies.Put("", daemon).ok());
  ASSERT_TRUE(policies.Put("gpt", run).ok());
  EXPECT_EQ(policies.Get("")->mode(), v1::MODE_OBSERVE);
  EXPECT_EQ(policies.Get("gpt")->mode(), v1::MODE_AUTO);
  run.set_mode(v1::MODE_PROPOSE);
  ASSERT_TRUE(policies.Put("gpt", run).ok());
  EXPECT_EQ(policies.Get("gpt")->mode(), v1::MODE_PROPOSE);
}

TEST_F(PolicyStoreTest, ACorruptRecordIsDataLoss) {
  PolicyStore policies(db_.get(), &clock_);
  ASSERT_TRUE(db_->Execute("INSERT INTO policies (scope, policy, updated_unix_ms) "
                           "VALUES ('bad', x'FFFFFFFF', 0)")
                  .ok());
  EXPECT_EQ(policies.Get("bad").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace spikeguard::storage
