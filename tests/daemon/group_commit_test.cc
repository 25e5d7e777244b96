#include "daemon/ingest/group_commit.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "tests/storage/catalog/temp_dir.h"

#include <sqlite3.h>

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

IngestBatch Batch(const std::string& run, uint32_t rank, uint32_t world, int64_t from,
                  int64_t to) {
  IngestBatch b;
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

// Stands in for the supervisor: takes the committer's completed records on
// a thread of its own (`on_record` may call the catalog) and says it is done
// with each.
class Consumer {
 public:
  using RecordFn = std::function<void(const CompletedStep&)>;
  Consumer(CompletedQueue* queue, RecordFn on_record = nullptr)
      : queue_(queue), on_record_(std::move(on_record)) {
    queue_->Open();
    thread_ = std::thread([this] {
      while (queue_->WaitForRecords()) {
        for (CompletedSlice& slice : queue_->TakeAll()) {
          for (const CompletedStep& c : slice.records) {
            if (on_record_) on_record_(c);
            absl::MutexLock lock(&mu_);
            taken_.push_back(c);
          }
          queue_->Done(static_cast<int64_t>(slice.records.size()));
        }
      }
    });
  }
  ~Consumer() {
    queue_->Close();
    thread_.join();
  }
  // Waits until `n` records were taken; returns them.
  std::vector<CompletedStep> Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return taken_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
    return taken_;
  }

 private:
  CompletedQueue* const queue_;
  const RecordFn on_record_;
  absl::Mutex mu_;
  std::vector<CompletedStep> taken_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

TEST_F(GroupCommitTest, ConcurrentStreamsShareTransactionsAndEachStepCompletesOnce) {
  GroupCommitter ingest(catalog_.get(), {});
  Consumer consumer(ingest.completed());
  constexpr int64_t kSteps = 200, kPerBatch = 4;
  std::atomic<int> accepted{0}, duplicates{0};
  std::vector<std::thread> streams;
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    streams.emplace_back([&, rank] {
      for (int64_t from = 0; from < kSteps; from += kPerBatch) {
        BatchOutcome o = ingest.Commit(Batch("r", rank, kRanks, from, from + kPerBatch - 1));
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
  std::map<int64_t, int> completed;  // step -> times handed over
  for (const CompletedStep& c : consumer.Await(kSteps)) {
    ++completed[c.record.step()];
    EXPECT_EQ(c.record.ranks_reported(), kRanks) << "step " << c.record.step();
  }
  ASSERT_EQ(completed.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, times] : completed) EXPECT_EQ(times, 1) << "step " << step;
  auto stored = catalog_->QueryTelemetry("r", 0, 0, std::nullopt, 0);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), static_cast<size_t>(kSteps));
  for (const auto& r : *stored) EXPECT_EQ(r.ranks_reported(), kRanks);
}

TEST_F(GroupCommitTest, StaleGenerationAndUnknownRunAreAnsweredPerBatch) {
  GroupCommitter ingest(catalog_.get(), {.window = absl::Milliseconds(2)});
  v1::Generation next;
  next.set_parent(0);
  next.set_reason("rewind");
  ASSERT_TRUE(catalog_->CreateGeneration("r", next).ok());
  BatchOutcome stale = ingest.Commit(Batch("r", 0, kRanks, 0, 3));
  EXPECT_EQ(stale.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.run_generation, 1);
  BatchOutcome unknown = ingest.Commit(Batch("nope", 0, 1, 0, 0));
  EXPECT_EQ(unknown.status.code(), absl::StatusCode::kNotFound);
  IngestBatch current = Batch("r", 0, kRanks, 0, 3);
  current.generation = 1;
  BatchOutcome ok = ingest.Commit(std::move(current));
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
    GroupCommitter ingest(catalog_.get(), {.metrics = &m});
    constexpr int kBatches = 40;
    for (int i = 0; i < kBatches; ++i) {
      // Batch 20 repeats batch 19's steps: a resend while both are in flight.
      const int from = i == 20 ? 19 * 5 : i * 5;
      ingest.CommitAsync(Batch("r", 3, kRanks, from, from + 4), [&, i](BatchOutcome o) {
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
  GroupCommitter ingest(catalog_.get(), options);
  Consumer consumer(ingest.completed());
  std::atomic<int> answered{0};
  auto live = [&](uint32_t rank) {
    ingest.CommitAsync(Batch("r", rank, kRanks, 7, 7), [&](BatchOutcome o) {
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
  const std::vector<CompletedStep> taken = consumer.Await(1);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].record.ranks_reported(), kRanks);
}

TEST_F(GroupCommitTest, BacklogsAndMissingRanksDoNotHoldAGroupForLong) {
  // A batch of several steps (a resend, a backlog) is not a live step: it is
  // committed at once even with a long window (this would block a minute).
  {
    GroupCommitter::Options options;
    options.step_window = absl::Seconds(60);
    GroupCommitter ingest(catalog_.get(), options);
    BatchOutcome o = ingest.Commit(Batch("r", 0, kRanks, 0, 3));
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.result.accepted, 4);
  }
  // A rank that never sends its step costs the group the window, no more:
  // the lone batch is committed and answered.
  GroupCommitter::Options options;
  options.step_window = absl::Milliseconds(20);
  GroupCommitter ingest(catalog_.get(), options);
  BatchOutcome o = ingest.Commit(Batch("r", 1, kRanks, 10, 10));
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.result.accepted, 1);
  EXPECT_EQ(ingest.groups(), 1);
}

TEST_F(GroupCommitTest, AGroupMergesRanksOnceAndQueuesWhatItCompletes) {
  v1::Run other;
  other.set_name("other");
  other.set_world_size(1);
  ASSERT_TRUE(catalog_->CreateRun(other).ok());
  GroupCommitter ingest(catalog_.get(), {});
  CompletedQueue* queue = ingest.completed();
  queue->Open();
  // Rank 0 alone: nothing complete yet.
  ASSERT_TRUE(ingest.Commit(Batch("r", 0, 2, 0, 3)).status.ok());
  EXPECT_TRUE(queue->TakeAll().empty());
  EXPECT_EQ(catalog_->QueryTelemetry("r", 0, 0, std::nullopt, 0)->size(), 4u);
  // Rank 1 completes steps 0..1; rank 0 resends 2..3 (duplicates) and adds
  // 4; another run completes its step; an unknown run is refused alone.
  BatchOutcome r1 = ingest.Commit(Batch("r", 1, 2, 0, 1));
  EXPECT_EQ(r1.result.accepted, 2);
  BatchOutcome r0 = ingest.Commit(Batch("r", 0, 2, 2, 4));
  EXPECT_EQ(r0.result.accepted, 1);
  EXPECT_EQ(r0.result.duplicates, 2);
  EXPECT_EQ(r0.result.committed_step, 4);
  EXPECT_TRUE(ingest.Commit(Batch("other", 0, 1, 0, 0)).status.ok());
  EXPECT_EQ(ingest.Commit(Batch("nope", 0, 1, 0, 0)).status.code(), absl::StatusCode::kNotFound);
  std::vector<CompletedStep> done;
  for (CompletedSlice& s : queue->TakeAll()) {
    for (CompletedStep& c : s.records) done.push_back(std::move(c));
    queue->Done(static_cast<int64_t>(s.records.size()));
  }
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].run, "r");
  EXPECT_EQ(done[0].record.step(), 0);
  EXPECT_EQ(done[0].record.ranks_reported(), 2u);
  EXPECT_EQ(done[1].record.step(), 1);
  EXPECT_EQ(done[2].run, "other");
  // What was queued is what is stored.
  auto stored = catalog_->QueryTelemetry("r", 0, 0, 4, 0);
  ASSERT_EQ(stored->size(), 5u);
  EXPECT_EQ((*stored)[0].SerializeAsString(), done[0].record.SerializeAsString());
  EXPECT_EQ((*stored)[2].ranks_reported(), 1u);
  EXPECT_EQ(*catalog_->CommittedStep("r", 0, 0), 4);
  EXPECT_EQ(*catalog_->CommittedStep("r", 0, 1), 1);
  EXPECT_EQ(queue->outstanding(), 0);
}

// What another connection sees of a step: its ranks_reported, -1 if absent.
int64_t StoredRanks(const std::string& path, int64_t step) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT ranks_reported FROM step_telemetry WHERE step = ?",
                               -1, &st, nullptr),
            SQLITE_OK);
  sqlite3_bind_int64(st, 1, step);
  const int64_t out = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

TEST(GroupCommitFileTest, CompletedStepsAreQueuedByTheTimeTheirGroupIsDurable) {
  // Detection runs beside the commit: the records a group completes are in
  // the queue when the group is durable, before any of its batches is
  // answered; equal to what is stored; and each once.
  storage::testing::TempDir dir;
  const std::string path = dir.File("catalog.db");
  auto catalog = storage::Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  v1::Run run;
  run.set_name("r");
  run.set_world_size(2);
  ASSERT_TRUE((*catalog)->CreateRun(run).ok());
  std::vector<int64_t> queued_when_durable;
  GroupCommitter* committer = nullptr;
  GroupCommitter::Options options;
  options.after_commit = [&](int64_t) {
    queued_when_durable.push_back(committer->completed()->outstanding());
  };
  GroupCommitter ingest(catalog->get(), options);
  committer = &ingest;
  ingest.completed()->Open();
  ASSERT_TRUE(ingest.Commit(Batch("r", 0, 2, 0, 2)).status.ok());
  EXPECT_EQ(StoredRanks(path, 1), 1);
  ASSERT_TRUE(ingest.Commit(Batch("r", 1, 2, 0, 1)).status.ok());
  EXPECT_EQ(queued_when_durable, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(StoredRanks(path, 1), 2);
  std::vector<CompletedSlice> slices = ingest.completed()->TakeAll();
  ASSERT_EQ(slices.size(), 1u) << "one report completed both steps";
  ASSERT_EQ(slices[0].records.size(), 2u);
  auto stored = (*catalog)->QueryTelemetry("r", 0, 0, 1, 0);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ((*stored)[1].SerializeAsString(), slices[0].records[1].record.SerializeAsString());
  ASSERT_TRUE(ingest.Commit(Batch("r", 1, 2, 2, 2)).status.ok());
  slices = ingest.completed()->TakeAll();
  ASSERT_EQ(slices.size(), 1u);
  ASSERT_EQ(slices[0].records.size(), 1u);
  EXPECT_EQ(slices[0].records[0].record.step(), 2);
}

TEST(GroupCommitFileTest, MergesWithRecordsStoredBeforeAReopen) {
  storage::testing::TempDir dir;
  storage::CatalogOptions options;
  options.path = dir.File("catalog.db");
  v1::Run run;
  run.set_name("r");
  run.set_world_size(2);
  {
    auto catalog = storage::Catalog::Open(options);
    ASSERT_TRUE(catalog.ok());
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
    GroupCommitter ingest(catalog->get(), {});
    ASSERT_TRUE(ingest.Commit(Batch("r", 0, 2, 0, 4)).status.ok());
  }
  auto catalog = storage::Catalog::Open(options);
  ASSERT_TRUE(catalog.ok());
  GroupCommitter ingest(catalog->get(), {});
  Consumer consumer(ingest.completed());
  ASSERT_TRUE(ingest.Commit(Batch("r", 1, 2, 0, 4)).status.ok());
  for (const CompletedStep& c : consumer.Await(5)) EXPECT_EQ(c.record.ranks_reported(), 2u);
  // Rank 0's resend after the reopen is all duplicates.
  BatchOutcome again = ingest.Commit(Batch("r", 0, 2, 0, 4));
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.result.duplicates, 5);
  EXPECT_EQ((*catalog)->QueryTelemetry("r", 0, 0, std::nullopt, 0)->at(4).ranks_reported(), 2u);
}

TEST_F(GroupCommitTest, AConsumerThatReadsTheCatalogNeverStallsTheCommitter) {
  // The consumer reads the catalog for each record, as detection does when
  // it warms a run's detectors: the committer holds no lock while the
  // consumer works, and calls nothing of it.
  GroupCommitter ingest(catalog_.get(), {});
  std::atomic<int> reads{0};
  Consumer consumer(ingest.completed(), [&](const CompletedStep& c) {
    auto stored = catalog_->QueryTelemetry(c.run, 0, 0, c.record.step(), 0);
    EXPECT_TRUE(stored.ok()) << stored.status();
    ++reads;
  });
  for (int64_t step = 0; step < 50; ++step) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(ingest.Commit(Batch("r", rank, 2, step, step)).status.ok());
    }
  }
  consumer.Await(50);
  EXPECT_EQ(reads.load(), 50);
}

TEST_F(GroupCommitTest, AConsumerThatFallsBehindSlowsTheIngestDown) {
  // At most `max_queued_records` outstanding: the next group waits for the
  // consumer rather than growing the queue without bound.
  GroupCommitter::Options options;
  options.max_queued_records = 4;
  GroupCommitter ingest(catalog_.get(), options);
  CompletedQueue* queue = ingest.completed();
  queue->Open();
  ASSERT_TRUE(ingest.Commit(Batch("r", 0, 1, 0, 3)).status.ok());  // 4 complete: full
  std::atomic<bool> answered{false};
  ingest.CommitAsync(Batch("r", 0, 1, 4, 4), [&](BatchOutcome o) {
    EXPECT_TRUE(o.status.ok()) << o.status;
    answered = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(answered.load()) << "a group committed while the consumer was full";
  for (CompletedSlice& s : queue->TakeAll()) queue->Done(static_cast<int64_t>(s.records.size()));
  while (!answered.load()) absl::SleepFor(absl::Milliseconds(1));
  // A consumer that stops (Close) releases the ingest for good.
  queue->Close();
  ASSERT_TRUE(ingest.Commit(Batch("r", 0, 1, 5, 20)).status.ok());
  ASSERT_TRUE(ingest.Commit(Batch("r", 0, 1, 21, 30)).status.ok());
  EXPECT_EQ(queue->outstanding(), 0) << "closing frees what was queued; later pushes are dropped";
}

TEST_F(GroupCommitTest, WithoutAConsumerNothingIsQueued) {
  GroupCommitter ingest(catalog_.get(), {.max_queued_records = 1});
  for (int64_t from = 0; from < 100; from += 10) {
    ASSERT_TRUE(ingest.Commit(Batch("r", 0, 1, from, from + 9)).status.ok());
  }
  EXPECT_EQ(ingest.completed()->outstanding(), 0);
}

TEST_F(GroupCommitTest, ARunWhoseRanksReportFurtherApartThanTheWindowIsWaitedFor) {
  // Two ranks 40 ms apart, far over the 1 ms window: the first step is two
  // groups; once the committer has seen how far apart the run's ranks
  // report, each step is one. A committer held to the 1 ms window, or one
  // whose longest wait is shorter than the spread, keeps committing each
  // rank alone.
  v1::Run wide;
  wide.set_name("wide");
  wide.set_world_size(2);
  ASSERT_TRUE(catalog_->CreateRun(wide).ok());
  auto groups_per_step = [&](absl::Duration max_window, int64_t first_step) {
    GroupCommitter::Options options;
    options.step_window = absl::Milliseconds(1);
    options.max_step_window = max_window;
    GroupCommitter ingest(catalog_.get(), options);
    std::vector<int64_t> per_step;
    for (int64_t step = first_step; step < first_step + 11; ++step) {
      const int64_t before = ingest.groups();
      std::atomic<int> answered{0};
      auto send = [&](uint32_t rank) {
        ingest.CommitAsync(Batch("wide", rank, 2, step, step), [&](BatchOutcome o) {
          EXPECT_TRUE(o.status.ok()) << o.status;
          ++answered;
        });
      };
      send(0);
      absl::SleepFor(absl::Milliseconds(40));
      send(1);
      while (answered.load() < 2) absl::SleepFor(absl::Milliseconds(1));
      per_step.push_back(ingest.groups() - before);
    }
    return per_step;
  };
  const std::vector<int64_t> fitted = groups_per_step(absl::Seconds(2), 0);
  const std::vector<int64_t> fixed = groups_per_step(absl::Milliseconds(1), 100);
  // A longest wait of 20 ms cannot catch a rank 40 ms behind: not waited for.
  const std::vector<int64_t> beyond = groups_per_step(absl::Milliseconds(20), 200);
  EXPECT_EQ(fitted[0], 2) << "the first step was waited for before any spread was seen";
  const auto ones = [](const std::vector<int64_t>& v) {
    return std::count(v.begin() + 1, v.end(), int64_t{1});
  };
  EXPECT_GE(ones(fitted), 8) << "steps after the first were not committed as one group";
  EXPECT_LE(ones(fixed), 2) << "a 1 ms window held a rank 40 ms";
  EXPECT_LE(ones(beyond), 2) << "a 20 ms limit held a rank 40 ms";
}

TEST(GroupCommitLogTest, TheCommitterCheckpointsTheLogBetweenGroups) {
  // A catalog that leaves checkpoints to its owner: the committer runs one
  // after answering a group, so the log never grows to the limit at which
  // a commit would have to.
  storage::testing::TempDir dir;
  constexpr int64_t kPages = 8;
  storage::CatalogOptions catalog_options;
  catalog_options.path = dir.File("catalog.db");
  catalog_options.checkpoint_pages = kPages;
  catalog_options.deferred_checkpoints = true;
  auto catalog = storage::Catalog::Open(catalog_options);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  v1::Run run;
  run.set_name("r");
  run.set_world_size(1);
  ASSERT_TRUE((*catalog)->CreateRun(run).ok());
  int64_t most = 0;
  {
    GroupCommitter ingest(catalog->get(), {});
    for (int64_t from = 0; from < 3000; from += 10) {
      ASSERT_TRUE(ingest.Commit(Batch("r", 0, 1, from, from + 9)).status.ok());
      most = std::max(most, (*catalog)->wal_pages());
    }
  }  // the last group's checkpoint, if due, is done once the committer stops
  EXPECT_LT(most, storage::DatabaseOptions::kDeferredLimit * kPages);
  EXPECT_LT((*catalog)->wal_pages(), kPages);
  auto last = (*catalog)->CommittedStep("r", 0, 0);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, 2999);
}

}  // namespace
}  // namespace spikeguard::daemon
