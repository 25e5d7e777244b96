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
  ASSERT_TRUE(commands.Put("c1", "r", 0, "REWIND", "bytes", v1::COMMAND_PENDING).ok());
  ASSERT_TRUE(commands.SetState("c1", v1::COMMAND_SENT, "").ok());
  ASSERT_TRUE(commands.Put("c1", "r", 0, "REWIND", "bytes", v1::COMMAND_PENDING).ok());
  EXPECT_EQ(commands.Get("c1")->state, v1::COMMAND_SENT) << "a resend leaves the state alone";
  EXPECT_EQ(commands.Put("c1", "r", 0, "REWIND", "other", v1::COMMAND_PENDING).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(commands.Put("", "r", 0, "REWIND", "x", v1::COMMAND_PENDING).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(commands.Put("c2", "r", 0, "REWIND", "x", v1::COMMAND_STATE_UNSPECIFIED).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(commands.Put("c2", "r", 0, "REWIND", "x", static_cast<v1::CommandState>(9)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(commands.Put("c2", "nope", 0, "REWIND", "x", v1::COMMAND_PENDING).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CommandStoreTest, FinalStatesAreFinal) {
  AddRun("r");
  CommandStore commands(db_.get(), &clock_);
  ASSERT_TRUE(commands.Put("c1", "r", 0, "PAUSE", "", v1::COMMAND_PENDING).ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(commands.SetState("c1", v1::COMMAND_FAILED, "cannot open checkpoint").ok());
  auto c = commands.Get("c1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->message, "cannot open checkpoint");
  EXPECT_EQ(c->updated_unix_ms, clock_.NowUnixMillis());
  EXPECT_LT(c->created_unix_ms, c->updated_unix_ms);
  EXPECT_TRUE(commands.SetState("c1", v1::COMMAND_FAILED, "").ok()) << "the same final state again";
  absl::Status leave = commands.SetState("c1", v1::COMMAND_ACKED, "");
  EXPECT_EQ(leave.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(leave.message(), "command 'c1' is already failed; cannot become acked");
  EXPECT_EQ(commands.SetState("c9", v1::COMMAND_SENT, "").code(), absl::StatusCode::kNotFound);
}

TEST_F(CommandStoreTest, ListIsInCreationOrderAndFiltersByState) {
  AddRun("r");
  CommandStore commands(db_.get(), &clock_);
  for (const char* id : {"b", "a", "c"}) {
    ASSERT_TRUE(commands.Put(id, "r", 1, "CONTINUE", id, v1::COMMAND_PENDING).ok());
  }
  ASSERT_TRUE(commands.SetState("a", v1::COMMAND_ACKED, "").ok());
  auto all = commands.List("r", v1::COMMAND_STATE_UNSPECIFIED);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id, "b");
  EXPECT_EQ((*all)[2].id, "c");
  EXPECT_EQ((*all)[0].run, "r");
  EXPECT_EQ((*all)[0].generation, 1);
  EXPECT_EQ(commands.List("r", v1::COMMAND_PENDING)->size(), 2u);
  EXPECT_EQ(commands.List("r", static_cast<v1::CommandState>(9)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace spikeguard::storage

namespace spikeguard::storage {
namespace {

// The column holds the state's name, so a command written by an earlier
// binary reads back, and a row holding something else is an error that names
// the command and the value rather than a state picked by position.
TEST_F(CommandStoreTest, TheStateColumnHoldsTheNameAndAnUnknownOneIsAnError) {
  AddRun("r");
  CommandStore commands(db_.get(), &clock_);
  ASSERT_TRUE(commands.Put("c1", "r", 0, "PAUSE", "", v1::COMMAND_PENDING).ok());
  ASSERT_TRUE(commands.SetState("c1", v1::COMMAND_ACKED, "").ok());
  auto stored = db_->Prepare("SELECT state FROM commands WHERE id = 'c1'");
  ASSERT_TRUE(stored.ok());
  ASSERT_TRUE(*stored->Step());
  EXPECT_EQ(stored->ColumnText(0), "acked");

  ASSERT_TRUE(db_->Execute("PRAGMA ignore_check_constraints = ON").ok());
  ASSERT_TRUE(db_->Execute("UPDATE commands SET state = 'delivered' WHERE id = 'c1'").ok());
  absl::StatusOr<StoredCommand> bad = commands.Get("c1");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(bad.status().message(),
            "command 'c1' of run 'r' has state 'delivered' in the catalog, which is not a command "
            "state");
  EXPECT_EQ(commands.List("r", v1::COMMAND_STATE_UNSPECIFIED).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace spikeguard::storage
