// The one checkpoint rule, as each of its callers queries it.
#include "daemon/incident/checkpoint_choice.h"

#include <vector>

#include "gtest/gtest.h"

namespace spikeguard::incident {
namespace {

CheckpointInfo C(int64_t generation, int64_t step, bool complete = true) {
  return {generation, step, "file:///ckpt/g" + std::to_string(generation) + "-" +
                                std::to_string(step),
          "sum", complete};
}

TEST(CheckpointChoiceTest, NewestCompleteInTheWindow) {
  const std::vector<CheckpointInfo> all = {C(1, 300), C(1, 500), C(1, 900), C(1, 950),
                                           C(1, 980, /*complete=*/false)};
  CheckpointQuery q;
  q.max_step = 999;
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 950);  // 980 is incomplete
  q.min_step = 500;
  q.max_step = 900;
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 900);
  q.pick = CheckpointQuery::Pick::kOldest;
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 500);
}

TEST(CheckpointChoiceTest, NoneIsNotFoundNamingTheWindow) {
  CheckpointQuery q;
  q.min_step = 100;
  q.max_step = 200;
  absl::StatusOr<CheckpointInfo> none = ChooseCheckpoint({C(1, 300), C(1, 150, false)}, q);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("[100, 200]"), std::string::npos) << none.status();
  EXPECT_EQ(ChooseCheckpoint({}, CheckpointQuery()).status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointChoiceTest, GenerationsAndExclusions) {
  const std::vector<CheckpointInfo> all = {C(1, 500), C(2, 600), C(3, 700)};
  CheckpointQuery q;
  q.max_generation = 2;  // a probe never starts from a later timeline
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 600);
  q.excluded_uris = {C(2, 600).uri};  // the workers could not load it
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 500);
  CheckpointQuery own;
  own.generation = 3;  // a relaunch resumes its own generation
  EXPECT_EQ(ChooseCheckpoint(all, own)->step, 700);
  own.generation = 4;
  EXPECT_FALSE(ChooseCheckpoint(all, own).ok());
}

TEST(CheckpointChoiceTest, TiesAtTheSameStep) {
  const std::vector<CheckpointInfo> all = {C(1, 500), C(3, 500), C(2, 500)};
  CheckpointQuery q;
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 1);  // the one listed first
  q.ties_to_highest_generation = true;  // an operator's rewind
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 3);
  q.preferred_generation = 2;  // the engine: the watched generation's own first
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 2);
  q.ties_to_highest_generation = false;
  q.preferred_generation = 7;  // no checkpoint of its own: the one listed first
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 1);
}

TEST(CheckpointChoiceTest, FromTheCatalogRow) {
  spikeguard::v1::Checkpoint row;
  row.set_generation(2);
  row.set_step(800);
  row.set_uri("file:///x");
  row.set_checksum("abc");
  row.set_complete(true);
  const CheckpointInfo c = ToCheckpointInfo(row);
  EXPECT_EQ(c.generation, 2);
  EXPECT_EQ(c.step, 800);
  EXPECT_EQ(c.uri, "file:///x");
  EXPECT_EQ(c.checksum, "abc");
  EXPECT_TRUE(c.complete);
}

}  // namespace
}  // namespace spikeguard::incident
