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

// Stands in for the supervisor's pipeline: records handed over are queued
// (the hand-over runs under the catalog's lock) and judged on a thread of
// their own, by `judge`, which may join the group.
class Pipeline {
 public:
  using JudgeFn = std::function<void(const storage::CompletedStep&)>;
  explicit Pipeline(JudgeFn judge) : judge_(std::move(judge)), thread_([this] { Loop(); }) {}
  ~Pipeline() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  void HandOver(std::vector<storage::CompletedStep> done) {
    absl::MutexLock lock(&mu_);
    for (auto& c : done) queue_.push_back(std::move(c));
  }

 private:
  void Loop() {
    while (true) {
      storage::CompletedStep c;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        c = std::move(queue_.front());
        queue_.pop_front();
      }
      judge_(c);
    }
  }
  JudgeFn judge_;
  absl::Mutex mu_;
  std::deque<storage::CompletedStep> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

v1::Incident Opening(int64_t onset) {
  v1::Incident inc;
  inc.set_run("r");
  inc.set_state(v1::DETECTED);
  inc.set_trigger("loss_spike");
  inc.set_onset_step(onset);
  return inc;
}

TEST_F(GroupCommitTest, AnIncidentOpenedFromAGroupsRecordsIsDurableWithThatGroup) {
  // One rank: each step is its own group. Only Judged or a joiner can
  // release a group's COMMIT before this window ends.
  constexpr int64_t kSpike = 5, kSteps = 10;
  GroupCommitter::Options options;
  options.join_window = absl::Seconds(30);
  std::unique_ptr<GroupCommitter> ingest;
  v1::Incident stored;
  absl::StatusOr<int64_t> opened = absl::UnknownError("never opened");
  std::optional<absl::Status> joined;
  int64_t groups_when_answered = -1;
  // Told the incident is durable: on the commit thread, before the joiner
  // is woken and before the spike's batch is acknowledged.
  std::atomic<bool> spike_acked{false};
  int durable_calls = 0;
  bool durable_before_join_returned = false, durable_before_ack = false;
  int64_t durable_saw_id = -1;
  std::thread::id pipeline_thread, durable_thread;
  auto pipeline = std::make_unique<Pipeline>([&](const storage::CompletedStep& c) {
    if (c.record.step() != kSpike) {
      ingest->Judged(1);  // calm: the group commits without waiting
      return;
    }
    pipeline_thread = std::this_thread::get_id();
    joined = ingest->Join(
        [&](storage::Catalog::OpenGroup& group) {
          opened = group.CreateIncidentWithEvent(
              "r", Opening(kSpike), "opened", "payload",
              [&](int64_t id, int64_t) -> const v1::Incident& {
                stored = Opening(kSpike);
                stored.set_id(id);
                return stored;
              });
          return opened.status();
        },
        [&] {
          ++durable_calls;
          durable_thread = std::this_thread::get_id();
          durable_before_join_returned = !joined.has_value();
          durable_before_ack = !spike_acked.load();
          durable_saw_id = stored.id();
        });
    groups_when_answered = ingest->groups();
    ingest->Judged(1);
  });
  ingest = std::make_unique<GroupCommitter>(
      catalog_.get(), options,
      [&](std::vector<storage::CompletedStep> done, absl::Time) { pipeline->HandOver(std::move(done)); });
  const absl::Time start = absl::Now();
  for (int64_t step = 0; step < kSteps; ++step) {
    storage::BatchOutcome o = ingest->Commit(Batch("r", 0, 1, step, step));
    ASSERT_TRUE(o.status.ok()) << o.status;
    if (step == kSpike) spike_acked = true;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(20))
      << "a group waited out its join window: Judged did not release it";
  pipeline.reset();  // judges what it was handed, then stops
  ingest.reset();
  ASSERT_TRUE(joined.has_value()) << "the spike's group could not be joined";
  ASSERT_TRUE(joined->ok()) << *joined;
  ASSERT_TRUE(opened.ok()) << opened.status();
  // Answered once the spike's group (the sixth) had committed, with it.
  EXPECT_GE(groups_when_answered, kSpike + 1);
  auto inc = catalog_->GetIncident(*opened);
  ASSERT_TRUE(inc.ok()) << inc.status();
  EXPECT_EQ(inc->onset_step(), kSpike);
  auto events = catalog_->ListIncidentEvents(*opened);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].kind, "opened");
  EXPECT_EQ(durable_calls, 1);
  EXPECT_NE(durable_thread, pipeline_thread) << "told on the joiner's thread, after its wake-up";
  EXPECT_TRUE(durable_before_join_returned);
  EXPECT_TRUE(durable_before_ack) << "told after the spike's batch was acknowledged";
  EXPECT_EQ(durable_saw_id, *opened) << "told before the write it reports was applied";
}

TEST_F(GroupCommitTest, AJoinedWriteThatFailsIsUndoneAloneAndTheGroupCommits) {
  GroupCommitter::Options options;
  options.join_window = absl::Seconds(30);
  std::unique_ptr<GroupCommitter> ingest;
  std::optional<absl::Status> joined;
  v1::Incident wrong;
  bool told = false;
  auto pipeline = std::make_unique<Pipeline>([&](const storage::CompletedStep&) {
    joined = ingest->Join(
        [&](storage::Catalog::OpenGroup& group) {
          // The record it would store names another incident: refused
          // after the incident row and its event were inserted.
          return group
              .CreateIncidentWithEvent("r", Opening(3), "opened", "payload",
                                       [&](int64_t id, int64_t) -> const v1::Incident& {
                                         wrong = Opening(3);
                                         wrong.set_id(id + 1000);
                                         return wrong;
                                       })
              .status();
        },
        [&] { told = true; });
    ingest->Judged(1);
  });
  ingest = std::make_unique<GroupCommitter>(
      catalog_.get(), options,
      [&](std::vector<storage::CompletedStep> done, absl::Time) { pipeline->HandOver(std::move(done)); });
  storage::BatchOutcome o = ingest->Commit(Batch("r", 0, 1, 3, 3));
  ASSERT_TRUE(o.status.ok()) << o.status;
  pipeline.reset();
  ingest.reset();
  ASSERT_TRUE(joined.has_value());
  EXPECT_TRUE(absl::IsInvalidArgument(*joined)) << *joined;
  EXPECT_FALSE(told) << "a write that failed was reported durable";
  // Nothing of the failed write is left; the group's step is stored.
  EXPECT_TRUE(catalog_->ListIncidents({})->empty());
  auto stored = catalog_->QueryTelemetry("r", 0, 3, 3, 0);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ(stored->front().step(), 3);
}

TEST_F(GroupCommitTest, WithNoGroupOpenAJoinerWritesOnItsOwn) {
  GroupCommitter::Options options;
  options.join_window = absl::Seconds(30);
  GroupCommitter ingest(catalog_.get(), options, nullptr);
  bool ran = false;
  std::optional<absl::Status> joined = ingest.Join([&](storage::Catalog::OpenGroup&) {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_FALSE(joined.has_value());
  EXPECT_FALSE(ran);
  // Joining off (the default window): never joined, even mid-group.
  GroupCommitter plain(catalog_.get(), {}, nullptr);
  ASSERT_TRUE(plain.Commit(Batch("r", 0, 1, 0, 0)).status.ok());
  EXPECT_FALSE(plain.Join([](storage::Catalog::OpenGroup&) { return absl::OkStatus(); })
                   .has_value());
  EXPECT_EQ(plain.joined_groups(), 0);
}

TEST_F(GroupCommitTest, AConsumerThatFallsBehindCostsOneJoinWindowNotOnePerGroup) {
  // The consumer never judges: the first group waits out the window, the
  // next see a backlog and commit at once (20 windows would be 10 s).
  GroupCommitter::Options options;
  options.join_window = absl::Milliseconds(500);
  std::atomic<int> handed{0};
  GroupCommitter ingest(catalog_.get(), options,
                        [&](std::vector<storage::CompletedStep> done, absl::Time) {
                          handed += static_cast<int>(done.size());
                        });
  const absl::Time start = absl::Now();
  for (int64_t step = 0; step < 20; ++step) {
    ASSERT_TRUE(ingest.Commit(Batch("r", 0, 1, step, step)).status.ok());
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(handed.load(), 20);
  EXPECT_EQ(ingest.joined_groups(), 0);
}

TEST_F(GroupCommitTest, AHeldGroupLetsInWhoeverWaitsForTheCatalog) {
  // The consumer must read the catalog before it can judge the spike (a
  // first read of the run's history, say). The group holds the catalog
  // until its records are judged: it must let that read in rather than
  // keep it waiting for the whole join window.
  constexpr int64_t kSpike = 3, kSteps = 6;
  GroupCommitter::Options options;
  options.join_window = absl::Seconds(60);
  std::unique_ptr<GroupCommitter> ingest;
  absl::StatusOr<v1::Run> read = absl::UnknownError("never read");
  std::optional<absl::Status> joined = absl::UnknownError("never tried");
  auto pipeline = std::make_unique<Pipeline>([&](const storage::CompletedStep& c) {
    if (c.record.step() == kSpike) {
      read = catalog_->GetRun("r");
      // Its group committed to let the read in: nothing is left to join.
      joined = ingest->Join([](storage::Catalog::OpenGroup&) { return absl::OkStatus(); });
    }
    ingest->Judged(1);
  });
  ingest = std::make_unique<GroupCommitter>(
      catalog_.get(), options,
      [&](std::vector<storage::CompletedStep> done, absl::Time) { pipeline->HandOver(std::move(done)); });
  const absl::Time start = absl::Now();
  for (int64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(ingest->Commit(Batch("r", 0, 1, step, step)).status.ok());
  }
  pipeline.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30))
      << "the consumer's read waited out the join window";
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->name(), "r");
  EXPECT_FALSE(joined.has_value()) << "a group was still open to join after the read";
  EXPECT_EQ(catalog_->lock_waiters(), 0);
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
    GroupCommitter ingest(catalog_.get(), options, nullptr);
    std::vector<int64_t> per_step;
    for (int64_t step = first_step; step < first_step + 11; ++step) {
      const int64_t before = ingest.groups();
      std::atomic<int> answered{0};
      auto send = [&](uint32_t rank) {
        ingest.CommitAsync(Batch("wide", rank, 2, step, step), [&](storage::BatchOutcome o) {
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
    GroupCommitter ingest(catalog->get(), {}, nullptr);
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
