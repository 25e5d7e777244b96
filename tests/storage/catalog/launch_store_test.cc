// LaunchStore: what launchers started, by run and slot.
#include "storage/catalog/launch_store.h"

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using LaunchStoreTest = testing::StoreTest;

LaunchRecord Rank(const std::string& run, int rank, int64_t pid) {
  LaunchRecord r;
  r.run = run;
  r.slot = "rank-" + std::to_string(rank);
  r.kind = "local";
  r.handle = pid;
  r.start_ticks = 1000 + pid;
  return r;
}

TEST_F(LaunchStoreTest, PutReplacesTheSlotAndListIsByRunAndSlot) {
  LaunchStore launches(db_.get(), &clock_);
  ASSERT_TRUE(launches.Put(Rank("b", 0, 10)).ok());
  ASSERT_TRUE(launches.Put(Rank("a", 1, 11)).ok());
  ASSERT_TRUE(launches.Put(Rank("a", 0, 12)).ok());
  LaunchRecord restarted = Rank("a", 0, 13);
  restarted.restarts = 1;
  restarted.generation = 2;
  ASSERT_TRUE(launches.Put(restarted).ok());
  auto all = launches.List();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].run, "a");
  EXPECT_EQ((*all)[0].slot, "rank-0");
  EXPECT_EQ((*all)[0].handle, 13);
  EXPECT_EQ((*all)[0].restarts, 1);
  EXPECT_EQ((*all)[0].generation, 2);
  EXPECT_EQ((*all)[0].updated_unix_ms, clock_.NowUnixMillis());
  EXPECT_EQ((*all)[2].run, "b");
}

TEST_F(LaunchStoreTest, DeleteOneSlotOrEveryOneOfARun) {
  LaunchStore launches(db_.get(), &clock_);
  for (int rank = 0; rank < 3; ++rank) ASSERT_TRUE(launches.Put(Rank("a", rank, rank)).ok());
  ASSERT_TRUE(launches.Put(Rank("b", 0, 9)).ok());
  ASSERT_TRUE(launches.Delete("a", "rank-1").ok());
  EXPECT_EQ(launches.List()->size(), 3u);
  ASSERT_TRUE(launches.Delete("a", "").ok());
  auto left = launches.List();
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ(left->front().run, "b");
}

}  // namespace
}  // namespace spikeguard::storage
