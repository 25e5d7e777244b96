// RunStore: runs, their states and specs, and the generation tree.
#include "storage/catalog/run_store.h"

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using RunStoreTest = testing::StoreTest;

TEST_F(RunStoreTest, CreateStoresTheRunWithGenerationZero) {
  RunStore runs(db_.get(), &clock_);
  v1::Run run;
  run.set_name("gpt");
  run.set_world_size(8);
  run.set_mode(v1::MODE_AUTO);
  run.mutable_spec()->add_command("train");
  auto id = runs.Create(run);
  ASSERT_TRUE(id.ok()) << id.status();
  auto stored = runs.Get("gpt");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->id(), *id);
  EXPECT_EQ(stored->state(), v1::RUN_CREATED);
  EXPECT_EQ(stored->world_size(), 8u);
  EXPECT_EQ(stored->mode(), v1::MODE_AUTO);
  EXPECT_EQ(stored->spec().command(0), "train");
  EXPECT_EQ(stored->created_unix_ms(), clock_.NowUnixMillis());
  ASSERT_EQ(stored->generations_size(), 1);
  EXPECT_EQ(stored->generations(0).generation(), 0);
  EXPECT_EQ(stored->generations(0).parent(), -1);
  EXPECT_EQ(stored->generations(0).reason(), "initial");
  EXPECT_EQ(stored->ranks_size(), 0) << "rank progress is the step store's";
}

TEST_F(RunStoreTest, RefusesADuplicateNameAnEmptyNameAndAnUnknownState) {
  RunStore runs(db_.get(), &clock_);
  AddRun("gpt");
  v1::Run again;
  again.set_name("gpt");
  EXPECT_EQ(runs.Create(again).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(runs.Create(v1::Run()).status().code(), absl::StatusCode::kInvalidArgument);
  v1::Run odd;
  odd.set_name("odd");
  odd.set_state(static_cast<v1::RunState>(42));
  EXPECT_EQ(runs.Create(odd).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runs.Get("odd").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RunStoreTest, LookupGivesTheIdAndTheCurrentGeneration) {
  RunStore runs(db_.get(), &clock_);
  const int64_t id = AddRun("gpt");
  auto key = runs.Lookup("gpt");
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->id, id);
  EXPECT_EQ(key->current_generation, 0);
  v1::Generation g;
  g.set_parent(0);
  g.set_from_checkpoint_step(100);
  auto made = runs.CreateGeneration("gpt", g);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->generation(), 1);
  EXPECT_EQ(runs.Lookup("gpt")->current_generation, 1);
  EXPECT_EQ(runs.Lookup("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RunStoreTest, AGenerationNeedsItsParentAndANewNumber) {
  RunStore runs(db_.get(), &clock_);
  const int64_t id = AddRun("gpt");
  v1::Generation orphan;
  orphan.set_parent(7);
  EXPECT_EQ(runs.CreateGeneration("gpt", orphan).status().code(), absl::StatusCode::kNotFound);
  v1::Generation zero_again;
  zero_again.set_generation(0);
  zero_again.set_parent(0);
  ASSERT_TRUE(runs.CreateGeneration("gpt", zero_again).ok()) << "0 means: the next number";
  v1::Generation one_again;
  one_again.set_generation(1);
  one_again.set_parent(0);
  EXPECT_EQ(runs.CreateGeneration("gpt", one_again).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto all = runs.Generations(id);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].parent(), 0);
  EXPECT_TRUE(runs.RequireGeneration(id, "gpt", 1).ok());
  EXPECT_EQ(runs.RequireGeneration(id, "gpt", 2).code(), absl::StatusCode::kNotFound);
}

TEST_F(RunStoreTest, StateSpecProgressAndDataOrderAreUpdatedInPlace) {
  RunStore runs(db_.get(), &clock_);
  AddRun("gpt");
  ASSERT_TRUE(runs.SetState("gpt", v1::RUN_RUNNING).ok());
  EXPECT_EQ(runs.SetState("gpt", static_cast<v1::RunState>(42)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runs.SetState("gpt", v1::RUN_STATE_UNSPECIFIED).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runs.SetState("nope", v1::RUN_RUNNING).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(runs.SetLastStep("gpt", 42).ok());
  v1::RunSpec spec;
  spec.set_profile("big");
  ASSERT_TRUE(runs.SetSpec("gpt", spec).ok());
  v1::DataOrder order;
  order.set_seed(7);
  ASSERT_TRUE(runs.SetDataOrder("gpt", order, 1000).ok());
  EXPECT_EQ(runs.SetDataOrder("gpt", order, -1).code(), absl::StatusCode::kInvalidArgument);
  auto stored = runs.Get("gpt");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state(), v1::RUN_RUNNING);
  EXPECT_EQ(stored->last_step(), 42);
  EXPECT_EQ(stored->spec().profile(), "big");
  EXPECT_EQ(stored->data_order().seed(), 7u);
  EXPECT_EQ(stored->total_steps(), 1000);
  auto listed = runs.List();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().generations_size(), 0) << "a listing carries no generations";
}

TEST_F(RunStoreTest, EachRunOfANameHasItsOwnIncarnation) {
  RunStore runs(db_.get(), &clock_);
  AddRun("a");
  AddRun("b");
  auto a = runs.Incarnation("a");
  auto b = runs.Incarnation("b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->incarnation.size(), 32u);
  EXPECT_NE(a->incarnation, b->incarnation);
  EXPECT_EQ(a->state, v1::RUN_CREATED);
  EXPECT_EQ(runs.Incarnation("c").status().code(), absl::StatusCode::kNotFound);
}

// The column holds the state's name, so the rows of an earlier binary read
// back and no enum reordering can change what is stored; a row holding
// anything else is an error naming the run and the value.
TEST_F(RunStoreTest, TheStateColumnHoldsTheNameAndAnUnknownOneIsAnError) {
  RunStore runs(db_.get(), &clock_);
  AddRun("gpt");
  ASSERT_TRUE(runs.SetState("gpt", v1::RUN_PAUSED).ok());
  auto stored = db_->Prepare("SELECT state FROM runs WHERE name = 'gpt'");
  ASSERT_TRUE(stored.ok());
  ASSERT_TRUE(*stored->Step());
  EXPECT_EQ(stored->ColumnText(0), "paused");

  ASSERT_TRUE(db_->Execute("DROP TRIGGER runs_state_is_known_on_update").ok());
  ASSERT_TRUE(db_->Execute("UPDATE runs SET state = 'Running' WHERE name = 'gpt'").ok());
  const std::string want =
      "run 'gpt' has state 'Running' in the catalog, which is not a run state";
  absl::StatusOr<v1::Run> got = runs.Get("gpt");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(got.status().message(), want);
  EXPECT_EQ(runs.List().status().message(), want);
  EXPECT_EQ(runs.Incarnation("gpt").status().message(), want);
}

}  // namespace
}  // namespace spikeguard::storage
