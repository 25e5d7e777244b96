// CommandStore: idempotent commands and their delivery states.
#include "storage/catalog/command_store.h"

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using CommandStoreTest = testing::StoreTest;

TEST_F(CommandStoreTest, AResendOfTheSameCommandIsANoOpAndOtherContentIsRefused) {
  AddRun("r");
  CommandStore commands(db_.get(), &clock_);
  ASSERT_TRUE(commands.Put("c1", "r", 0, "REWIND", "bytes", "pending").ok());
  ASSERT_TRUE(commands.SetState("c1", "sent", "").ok());
  ASSERT_TRUE(commands.Put("c1", "r", 0, "REWIND", "bytes", "pending").ok());
  EXPECT_EQ(commands.Get("c1")->state, "sent") << "a resend leaves the state alone";
  EXPECT_EQ(commands.Put("c1", "r", 0, "REWIND", "other", "pending").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(commands.Put("", "r", 0, "REWIND", "x", "pending").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(commands.Put("c2", "r", 0, "REWIND", "x", "lost").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(commands.Put("c2", "nope", 0, "REWIND", "x", "pending").code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CommandStoreTest, FinalStatesAreFinal) {
  AddRun("r");
  CommandStore commands(db_.get(), &clock_);
  ASSERT_TRUE(commands.Put("c1", "r", 0, "PAUSE", "", "pending").ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(commands.SetState("c1", "failed", "cannot open checkpoint").ok());
  auto c = commands.Get("c1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->message, "cannot open checkpoint");
  EXPECT_EQ(c->updated_unix_ms, clock_.NowUnixMillis());
  EXPECT_LT(c->created_unix_ms, c->updated_unix_ms);
  EXPECT_TRUE(commands.SetState("c1", "failed", "").ok()) << "the same final state again";
  EXPECT_EQ(commands.SetState("c1", "acked", "").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(commands.SetState("c9", "sent", "").code(), absl::StatusCode::kNotFound);
}

TEST_F(CommandStoreTest, ListIsInCreationOrderAndFiltersByState) {
  AddRun("r");
  CommandStore commands(db_.get(), &clock_);
  for (const char* id : {"b", "a", "c"}) {
    ASSERT_TRUE(commands.Put(id, "r", 1, "CONTINUE", id, "pending").ok());
  }
  ASSERT_TRUE(commands.SetState("a", "acked", "").ok());
  auto all = commands.List("r", "");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id, "b");
  EXPECT_EQ((*all)[2].id, "c");
  EXPECT_EQ((*all)[0].run, "r");
  EXPECT_EQ((*all)[0].generation, 1);
  EXPECT_EQ(commands.List("r", "pending")->size(), 2u);
  EXPECT_EQ(commands.List("r", "bogus").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace spikeguard::storage
