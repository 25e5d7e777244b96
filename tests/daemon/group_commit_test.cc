#include "daemon/ingest/group_commit.h"

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = spikeguard::v1;

v1::StepReport Report(int64_t step, uint32_t rank) {
  v1::StepReport r;
  r.set_step(step);
  r.set_data_position(step);
  r.set_loss(2.0 + rank);
  r.set_grad_norm(1.0);
  r.set_tokens(100);
  return r;
}

storage::IngestBatch Batch(const std::string& run, uint32_t rank, uint32_t world, int64_t from,
                           int64_t to) {
  storage::IngestBatch b;
  b.run = run;
  b.rank = rank;
  b.world_size = world;
  b.require_current = true;
  for (int64_t s = from; s <= to; ++s) b.reports.push_back(Report(s, rank));
  return b;
}

class GroupCommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::CatalogOptions options;
    options.path = ":memory:";
    auto opened = storage::Catalog::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    catalog_ = std::move(*opened);
    v1::Run run;
    run.set_name("r");
    run.set_world_size(kRanks);
    ASSERT_TRUE(catalog_->CreateRun(run).ok());
  }

  static constexpr uint32_t kRanks = 16;
  std::unique_ptr<storage::Catalog> catalog_;
};

TEST_F(GroupCommitTest, ConcurrentStreamsShareTransactionsAndEachStepCompletesOnce) {
  absl::Mutex mu;
  std::map<int64_t, int> completed;  // step -> times handed over
  std::map<int64_t, uint32_t> ranks_at_completion;
  GroupCommitter ingest(catalog_.get(), {}, [&](std::vector<storage::CompletedStep> done, absl::Time) {
    absl::MutexLock lock(&mu);
    for (const auto& c : done) {
      ++completed[c.record.step()];
      ranks_at_completion[c.record.step()] = c.record.ranks_reported();
    }
  });
  constexpr int64_t kSteps = 200, kPerBatch = 4;
  std::atomic<int> accepted{0}, duplicates{0};
  std::vector<std::thread> streams;
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    streams.emplace_back([&, rank] {
      for (int64_t from = 0; from < kSteps; from += kPerBatch) {
        storage::BatchOutcome o = ingest.Commit(Batch("r", rank, kRanks, from, from + kPerBatch - 1));
        ASSERT_TRUE(o.status.ok()) << o.status;
        accepted += o.result.accepted;
        // A resend of the same batch (a reconnect) is all duplicates.
        if (from % 40 == 0) {
          o = ingest.Commit(Batch("r", rank, kRanks, from, from + kPerBatch - 1));
          ASSERT_TRUE(o.status.ok()) << o.status;
          duplicates += o.result.duplicates;
          EXPECT_EQ(o.result.accepted, 0);
        }
      }
    });
  }
  for (auto& t : streams) t.join();
  EXPECT_EQ(accepted.load(), static_cast<int>(kRanks * kSteps));
  EXPECT_EQ(duplicates.load(), static_cast<int>(kRanks * (kSteps / 40) * kPerBatch));
  // Batches of different streams shared transactions.
  EXPECT_LT(ingest.groups(), ingest.batches());
  {
    // The callback runs with the catalog's lock held: never call the
    // catalog while holding `mu`.
    absl::MutexLock lock(&mu);
    ASSERT_EQ(completed.size(), static_cast<size_t>(kSteps));
    for (const auto& [step, times] : completed) {
      EXPECT_EQ(times, 1) << "step " << step;
      EXPECT_EQ(ranks_at_completion[step], kRanks) << "step " << step;
    }
  }
  auto stored = catalog_->QueryTelemetry("r", 0, 0, std::nullopt, 0);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), static_cast<size_t>(kSteps));
  for (const auto& r : *stored) EXPECT_EQ(r.ranks_reported(), kRanks);
}

TEST_F(GroupCommitTest, StaleGenerationAndUnknownRunAreAnsweredPerBatch) {
  GroupCommitter ingest(catalog_.get(), {.window = absl::Milliseconds(2)}, nullptr);
  v1::Generation next;
  next.set_parent(0);
  next.set_reason("rewind");
  ASSERT_TRUE(catalog_->CreateGeneration("r", next).ok());
  storage::BatchOutcome stale = ingest.Commit(Batch("r", 0, kRanks, 0, 3));
  EXPECT_EQ(stale.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.run_generation, 1);
  storage::BatchOutcome unknown = ingest.Commit(Batch("nope", 0, 1, 0, 0));
  EXPECT_EQ(unknown.status.code(), absl::StatusCode::kNotFound);
  storage::IngestBatch current = Batch("r", 0, kRanks, 0, 3);
  current.generation = 1;
  storage::BatchOutcome ok = ingest.Commit(std::move(current));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.result.accepted, 4);
  EXPECT_TRUE(catalog_->QueryTelemetry("r", 0, 0, std::nullopt, 0)->empty());
}

// One stream with many batches in flight (CommitAsync): answered in the
// order queued, each batch once, the rank's steps stored once in order, and
// the commits counted in the daemon's metrics.
TEST_F(GroupCommitTest, AsyncBatchesOfOneRankAreAnsweredInOrderAndCounted) {
  metrics::Registry registry;
  metrics::DaemonMetrics m(&registry);
  absl::Mutex mu;
  std::vector<int> answered;
  int64_t accepted = 0, duplicates = 0;
  {
    GroupCommitter ingest(catalog_.get(), {.metrics = &m}, nullptr);
    constexpr int kBatches = 40;
    for (int i = 0; i < kBatches; ++i) {
      // Batch 20 repeats batch 19's steps: a resend while both are in flight.
      const int from = i == 20 ? 19 * 5 : i * 5;
      ingest.CommitAsync(Batch("r", 3, kRanks, from, from + 4), [&, i](storage::BatchOutcome o) {
        absl::MutexLock lock(&mu);
        EXPECT_TRUE(o.status.ok()) << o.status;
        answered.push_back(i);
        accepted += o.result.accepted;
        duplicates += o.result.duplicates;
      });
    }
    absl::MutexLock lock(&mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return answered.size() == kBatches; };
    mu.Await(absl::Condition(&all));
  }
  for (size_t i = 0; i < answered.size(); ++i) EXPECT_EQ(answered[i], static_cast<int>(i));
  EXPECT_EQ(duplicates, 5);
  EXPECT_EQ(accepted, 39 * 5);  // batch 20 resent 19: its own steps 100-104 never came
  EXPECT_EQ(m.batches_committed->Value(), 40);
  EXPECT_GE(m.commit_latency_seconds->Take().count, 1u);
  auto committed = catalog_->CommittedStep("r", 0, 3);
  ASSERT_TRUE(committed.ok());
  EXPECT_EQ(*committed, 39 * 5 + 4);
}

TEST_F(GroupCommitTest, ALiveStepWaitsForItsOtherRanksAndCompletesInOneGroup) {
  // A trainer's ranks send each step as it ends, within a fraction of a
  // millisecond of each other: the first rank's batch waits for the rest
  // rather than being committed alone (the step would then complete one
  // fsync later). The window here is long so the test does not race it.
  GroupCommitter::Options options;
  options.step_window = absl::Seconds(60);
  absl::Mutex mu;
  int handed_over = 0;
  uint32_t ranks_reported = 0;
  GroupCommitter ingest(catalog_.get(), options,
                        [&](std::vector<storage::CompletedStep> done, absl::Time) {
                          absl::MutexLock lock(&mu);
                          for (const auto& c : done) {
                            ++handed_over;
                            ranks_reported = c.record.ranks_reported();
                          }
                        });
  std::atomic<int> answered{0};
  auto live = [&](uint32_t rank) {
    ingest.CommitAsync(Batch("r", rank, kRanks, 7, 7), [&](storage::BatchOutcome o) {
      EXPECT_TRUE(o.status.ok()) << o.status;
      ++answered;
    });
  };
  live(0);
  // Give the commit thread time to pick rank 0 up: it must hold it.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(ingest.groups(), 0) << "rank 0's batch was committed without waiting for its step";
  for (uint32_t rank = 1; rank < kRanks; ++rank) live(rank);
  while (answered.load() < static_cast<int>(kRanks)) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(ingest.groups(), 1);
  EXPECT_EQ(ingest.batches(), kRanks);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(handed_over, 1);
  EXPECT_EQ(ranks_reported, kRanks);
}

TEST_F(GroupCommitTest, BacklogsAndMissingRanksDoNotHoldAGroupForLong) {
  // A batch of several steps (a resend, a backlog) is not a live step: it is
  // committed at once even with a long window (this would block a minute).
  {
    GroupCommitter::Options options;
    options.step_window = absl::Seconds(60);
    GroupCommitter ingest(catalog_.get(), options, nullptr);
    storage::BatchOutcome o = ingest.Commit(Batch("r", 0, kRanks, 0, 3));
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.result.accepted, 4);
  }
  // A rank that never sends its step costs the group the window, no more:
  // the lone batch is committed and answered.
  GroupCommitter::Options options;
  options.step_window = absl::Milliseconds(20);
  GroupCommitter ingest(catalog_.get(), options, nullptr);
  storage::BatchOutcome o = ingest.Commit(Batch("r", 1, kRanks, 10, 10));
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.result.accepted, 1);
  EXPECT_EQ(ingest.groups(), 1);
}

}  // namespace
}  // namespace spikeguard::daemon
