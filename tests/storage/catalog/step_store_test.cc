// StepStore: merged step records, high-water marks and rank progress.
#include "storage/catalog/step_store.h"

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using StepStoreTest = testing::StoreTest;

v1::StepReport Report(int64_t step, double loss) {
  v1::StepReport r;
  r.set_step(step);
  r.set_loss(loss);
  r.set_grad_norm(1.0);
  r.set_tokens(100);
  return r;
}

TEST_F(StepStoreTest, IngestMergesTheRanksOfAStepIntoOneRecord) {
  const int64_t run = AddRun("r");
  StepStore steps(db_.get(), &clock_);
  std::vector<v1::StepReport> rank0 = {Report(0, 2.0), Report(1, 2.0)};
  std::vector<v1::StepReport> rank1 = {Report(0, 4.0)};
  ASSERT_TRUE(steps.Ingest(run, 0, 0, rank0).ok());
  auto r1 = steps.Ingest(run, 0, 1, rank1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->accepted, 1);
  EXPECT_EQ(r1->committed_step, 0);
  auto record = steps.Read(run, 0, 0);
  ASSERT_TRUE(record.ok());
  ASSERT_TRUE(record->has_value());
  EXPECT_EQ((*record)->ranks_reported(), 2);
  EXPECT_EQ((*record)->loss(), 3.0);
  EXPECT_EQ((*record)->tokens(), 200);
  EXPECT_EQ((*record)->generation(), 0);
  EXPECT_FALSE(steps.Read(run, 0, 5)->has_value());
}

TEST_F(StepStoreTest, ReportsAtOrBelowTheHighWaterMarkAreDuplicates) {
  const int64_t run = AddRun("r");
  StepStore steps(db_.get(), &clock_);
  std::vector<v1::StepReport> first = {Report(2, 1.0), Report(0, 1.0), Report(1, 1.0)};
  auto a = steps.Ingest(run, 0, 0, first);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->accepted, 3) << "a reordered batch loses nothing";
  EXPECT_EQ(a->committed_step, 2);
  std::vector<v1::StepReport> resent = {Report(1, 9.0), Report(2, 9.0), Report(3, 1.0)};
  auto b = steps.Ingest(run, 0, 0, resent);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->duplicates, 2);
  EXPECT_EQ(b->accepted, 1);
  EXPECT_EQ(steps.Read(run, 0, 2)->value().loss(), 1.0) << "a duplicate is not merged again";
  EXPECT_EQ(*steps.CommittedStep(run, 0, 0), 3);
  EXPECT_EQ(*steps.CommittedStep(run, 0, 1), -1);
}

TEST_F(StepStoreTest, TheHighWaterMarkNeverGoesBack) {
  const int64_t run = AddRun("r");
  StepStore steps(db_.get(), &clock_);
  ASSERT_TRUE(steps.SetCommittedStep(run, 0, 3, 10).ok());
  ASSERT_TRUE(steps.SetCommittedStep(run, 0, 3, 4).ok());
  EXPECT_EQ(*steps.CommittedStep(run, 0, 3), 10);
}

TEST_F(StepStoreTest, NonFiniteValuesComeBackBitExact) {
  const int64_t run = AddRun("r");
  StepStore steps(db_.get(), &clock_);
  v1::StepRecord record;
  record.set_step(7);
  record.set_loss(std::numeric_limits<double>::quiet_NaN());
  record.set_grad_norm(std::numeric_limits<double>::infinity());
  ASSERT_TRUE(steps.Write(run, 0, record).ok());
  auto back = steps.Read(run, 0, 7);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ(std::bit_cast<uint64_t>((*back)->loss()), std::bit_cast<uint64_t>(record.loss()));
  EXPECT_TRUE(std::isinf((*back)->grad_norm()));
}

TEST_F(StepStoreTest, QueryReturnsARangeInStepOrderWithinItsLimit) {
  const int64_t run = AddRun("r");
  StepStore steps(db_.get(), &clock_);
  for (int64_t s = 9; s >= 0; --s) {
    v1::StepRecord record;
    record.set_step(s);
    ASSERT_TRUE(steps.Write(run, 0, record).ok());
  }
  auto range = steps.Query(run, 0, 3, 6, 0);
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range->size(), 4u);
  EXPECT_EQ(range->front().step(), 3);
  EXPECT_EQ(range->back().step(), 6);
  EXPECT_EQ(steps.Query(run, 0, 0, std::nullopt, 2)->size(), 2u);
  EXPECT_TRUE(steps.Query(run, 1, 0, std::nullopt, 0)->empty());
}

TEST_F(StepStoreTest, RankProgressIsEachRanksNewestGeneration) {
  const int64_t run = AddRun("r");
  v1::Generation next;
  next.set_parent(0);
  ASSERT_TRUE(RunStore(db_.get(), &clock_).CreateGeneration("r", next).ok());
  StepStore steps(db_.get(), &clock_);
  ASSERT_TRUE(steps.SetCommittedStep(run, 0, 0, 50).ok());
  ASSERT_TRUE(steps.SetCommittedStep(run, 0, 1, 49).ok());
  ASSERT_TRUE(steps.SetCommittedStep(run, 1, 0, 12).ok());
  auto ranks = steps.RankProgress(run);
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].rank(), 0u);
  EXPECT_EQ((*ranks)[0].generation(), 1);
  EXPECT_EQ((*ranks)[0].last_step(), 12);
  EXPECT_EQ((*ranks)[1].generation(), 0);
  EXPECT_EQ((*ranks)[1].last_step(), 49);
  EXPECT_EQ((*ranks)[1].last_seen_unix_ms(), clock_.NowUnixMillis());
}

}  // namespace
}  // namespace spikeguard::storage
