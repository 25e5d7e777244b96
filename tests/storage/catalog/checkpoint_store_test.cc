// CheckpointStore: registration, pins, the rolling pin, file identities.
#include "storage/catalog/checkpoint_store.h"

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using CheckpointStoreTest = testing::StoreTest;

v1::Checkpoint Saved(int64_t step, const std::string& uri, const std::string& checksum = "") {
  v1::Checkpoint c;
  c.set_run("r");
  c.set_step(step);
  c.set_uri(uri);
  c.set_bytes(1000);
  c.set_checksum(checksum);
  return c;
}

TEST_F(CheckpointStoreTest, ALaterReportUpdatesButNeverForgetsWhatWasKnown) {
  AddRun("r");
  CheckpointStore checkpoints(db_.get(), &clock_);
  v1::Checkpoint first = Saved(100, "/c/100", "xxh64:1");
  first.set_complete(true);
  ASSERT_TRUE(checkpoints.Upsert(first, std::nullopt).ok());
  v1::Checkpoint later = Saved(100, "/c/100");
  later.set_bytes(0);
  later.set_complete(false);
  auto stored = checkpoints.Upsert(later, std::nullopt);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->complete()) << "complete only goes from false to true";
  EXPECT_EQ(stored->checksum(), "xxh64:1");
  EXPECT_EQ(stored->bytes(), 1000);
  EXPECT_EQ(stored->created_unix_ms(), clock_.NowUnixMillis());
  EXPECT_EQ(checkpoints.Upsert(Saved(1, ""), std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::Checkpoint stray = Saved(1, "/x");
  stray.set_run("nope");
  EXPECT_EQ(checkpoints.Upsert(stray, std::nullopt).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointStoreTest, AnotherChecksumClearsTheFileIdentity) {
  AddRun("r");
  CheckpointStore checkpoints(db_.get(), &clock_);
  ASSERT_TRUE(checkpoints.Upsert(Saved(100, "/c/100", "a"), "dev:1 ino:2").ok());
  EXPECT_EQ(*checkpoints.FileIdentity("r", 100, "/c/100"), "dev:1 ino:2");
  ASSERT_TRUE(checkpoints.Upsert(Saved(100, "/c/100", "a"), std::nullopt).ok());
  EXPECT_EQ(*checkpoints.FileIdentity("r", 100, "/c/100"), "dev:1 ino:2") << "same file: kept";
  ASSERT_TRUE(checkpoints.Upsert(Saved(100, "/c/100", "b"), std::nullopt).ok());
  EXPECT_EQ(*checkpoints.FileIdentity("r", 100, "/c/100"), "") << "another file";
  ASSERT_TRUE(checkpoints.SetFileIdentity("r", 100, "/c/100", "dev:1 ino:3").ok());
  EXPECT_EQ(*checkpoints.FileIdentity("r", 100, "/c/100"), "dev:1 ino:3");
  EXPECT_EQ(checkpoints.SetFileIdentity("r", 200, "/c/200", "x").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(checkpoints.FileIdentity("r", 200, "/c/200").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointStoreTest, PinsAndTheOneRollingPin) {
  AddRun("r");
  CheckpointStore checkpoints(db_.get(), &clock_);
  for (int64_t step : {100, 200, 300}) {
    ASSERT_TRUE(checkpoints.Upsert(Saved(step, "/c/" + std::to_string(step)), std::nullopt).ok());
  }
  auto pinned = checkpoints.Pin("r", 200, true);
  ASSERT_TRUE(pinned.ok());
  EXPECT_TRUE(pinned->pinned());
  EXPECT_EQ(checkpoints.Pin("r", 250, true).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(checkpoints.SetRollingPin("r", 100, "/c/100").ok());
  ASSERT_TRUE(checkpoints.SetRollingPin("r", 300, "/c/300").ok());
  auto all = checkpoints.List("r");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_FALSE((*all)[0].rolling_pin());
  EXPECT_TRUE((*all)[1].pinned());
  EXPECT_FALSE((*all)[1].rolling_pin());
  EXPECT_TRUE((*all)[2].rolling_pin());
  EXPECT_FALSE((*all)[2].pinned()) << "the rolling pin is independent of pins";
}

TEST_F(CheckpointStoreTest, DeleteForgetsAndSaysWhetherItKnewIt) {
  AddRun("r");
  CheckpointStore checkpoints(db_.get(), &clock_);
  ASSERT_TRUE(checkpoints.Upsert(Saved(100, "/c/100"), std::nullopt).ok());
  ASSERT_TRUE(checkpoints.Pin("r", 100, true).ok());
  EXPECT_TRUE(*checkpoints.Delete("r", 100, "/c/100")) << "pinned or not";
  EXPECT_FALSE(*checkpoints.Delete("r", 100, "/c/100")) << "a resent notice is harmless";
  EXPECT_TRUE(checkpoints.List("r")->empty());
}

}  // namespace
}  // namespace spikeguard::storage
