// AuditStore: the append-only audit trail and its queries.
#include "storage/catalog/audit_store.h"

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using AuditStoreTest = testing::StoreTest;

v1::AuditEntry Call(const std::string& principal, const std::string& run,
                    const std::string& outcome) {
  v1::AuditEntry e;
  e.set_principal(principal);
  e.set_role("operator");
  e.set_rpc("SupervisorService/Rewind");
  e.set_run(run);
  e.set_outcome(outcome);
  e.set_detail("step 10");
  e.set_peer("ipv4:127.0.0.1:5000");
  return e;
}

TEST_F(AuditStoreTest, QueryIsNewestFirstAndFilters) {
  AuditStore audit(db_.get(), &clock_);
  const int64_t a = *audit.Append(Call("alice", "r", "OK"));
  clock_.Advance(absl::Seconds(10));
  const int64_t b = *audit.Append(Call("bob", "s", "PERMISSION_DENIED"));
  const int64_t c = *audit.Append(Call("alice", "s", "OK"));
  auto all = audit.Query({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id(), c);
  EXPECT_EQ((*all)[2].id(), a);
  EXPECT_EQ((*all)[1].outcome(), "PERMISSION_DENIED");
  EXPECT_EQ((*all)[1].peer(), "ipv4:127.0.0.1:5000");
  AuditQuery of_s;
  of_s.run = "s";
  EXPECT_EQ(audit.Query(of_s)->size(), 2u);
  AuditQuery by_alice;
  by_alice.principal = "alice";
  EXPECT_EQ(audit.Query(by_alice)->size(), 2u);
  AuditQuery recent;
  recent.since_unix_ms = clock_.NowUnixMillis();
  EXPECT_EQ(audit.Query(recent)->size(), 2u);
  AuditQuery before_c;
  before_c.before_id = c;
  before_c.limit = 1;
  auto page = audit.Query(before_c);
  ASSERT_EQ(page->size(), 1u);
  EXPECT_EQ(page->front().id(), b);
}

TEST_F(AuditStoreTest, TheFirstSchemasRowsAndTheTrailIsAppendOnly) {
  AuditStore audit(db_.get(), &clock_);
  ASSERT_TRUE(audit.Append("admin", "CreateRun", "r", "world 8").ok());
  ASSERT_TRUE(audit.Append("admin", "SetPolicy", "", "").ok());
  auto newest = audit.List(1);
  ASSERT_TRUE(newest.ok());
  ASSERT_EQ(newest->size(), 1u);
  EXPECT_EQ(newest->front().action, "SetPolicy");
  EXPECT_EQ(audit.List(0)->size(), 2u);
  EXPECT_EQ(audit.List(0)->back().detail, "world 8");
  EXPECT_EQ(audit.List(0)->back().unix_ms, clock_.NowUnixMillis());
  EXPECT_FALSE(db_->Execute("DELETE FROM audit").ok());
  EXPECT_FALSE(db_->Execute("UPDATE audit SET actor = 'mallory'").ok());
}

}  // namespace
}  // namespace spikeguard::storage
