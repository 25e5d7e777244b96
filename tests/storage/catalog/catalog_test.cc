// Catalog: the typed repositories, telemetry merge/dedup and round-trips.
#include "storage/catalog/catalog.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "storage/catalog/merge.h"
#include "tests/storage/catalog/temp_dir.h"

namespace spikeguard::storage {
namespace {

using ::spikeguard::storage::testing::TempDir;

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CatalogOptions options;
    options.path = ":memory:";
    options.clock = &clock_;
    auto opened = Catalog::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    catalog_ = std::move(*opened);
  }

  v1::Run MakeRun(const std::string& name, uint32_t world_size = 8) {
    v1::Run run;
    run.set_name(name);
    run.set_world_size(world_size);
    run.set_mode(v1::MODE_AUTO);
    run.mutable_spec()->add_command("train");
    run.mutable_spec()->add_command("--rank={rank}");
    auto created = catalog_->CreateRun(run);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? *created : v1::Run();
  }

  FakeClock clock_;
  std::unique_ptr<Catalog> catalog_;
};

v1::StepReport Report(int64_t step, uint32_t rank) {
  v1::StepReport r;
  r.set_step(step);
  r.set_data_position(step);
  r.set_loss(2.0 + 0.25 * rank);  // exact in binary: means compare exactly
  r.set_grad_norm(1.0 + rank);
  r.set_step_time_s(0.5 + 0.125 * ((rank * 5 + step) % 8));
  r.set_tokens(1000);
  r.set_lr(1e-3);
  r.set_loss_hash(0x1234u + static_cast<uint64_t>(step));
  return r;
}

std::vector<v1::StepReport> Batch(int64_t from, int64_t to, uint32_t rank) {
  std::vector<v1::StepReport> out;
  for (int64_t s = from; s <= to; ++s) out.push_back(Report(s, rank));
  return out;
}

// --- Runs and generations --------------------------------------------------------

TEST_F(CatalogTest, CreateRunStoresItAndStartsGenerationZero) {
  v1::Run run = MakeRun("gpt-small");
  EXPECT_GT(run.id(), 0);
  EXPECT_EQ(run.state(), v1::RUN_CREATED);
  EXPECT_EQ(run.world_size(), 8u);
  EXPECT_EQ(run.mode(), v1::MODE_AUTO);
  EXPECT_EQ(run.created_unix_ms(), clock_.NowUnixMillis());
  EXPECT_EQ(run.spec().command(1), "--rank={rank}");
  EXPECT_EQ(run.current_generation(), 0);
  ASSERT_EQ(run.generations_size(), 1);
  EXPECT_EQ(run.generations(0).generation(), 0);
  EXPECT_EQ(run.generations(0).parent(), -1);
  EXPECT_EQ(run.generations(0).reason(), "initial");

  auto again = catalog_->GetRun("gpt-small");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->SerializeAsString(), run.SerializeAsString());
}

TEST_F(CatalogTest, DuplicateRunNameIsAlreadyExists) {
  MakeRun("a");
  v1::Run dup;
  dup.set_name("a");
  auto created = catalog_->CreateRun(dup);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(std::string(created.status().message()), "run 'a' already exists");
}

TEST_F(CatalogTest, UnknownRunIsNotFound) {
  auto run = catalog_->GetRun("nope");
  EXPECT_EQ(run.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(run.status().message()), "run 'nope' not found");
  EXPECT_EQ(catalog_->SetRunState("nope", v1::RUN_RUNNING).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog_->UpdateRunProgress("nope", 3).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog_->ListGenerations("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CatalogTest, ListRunsStateAndProgress) {
  MakeRun("b");
  MakeRun("a");
  ASSERT_TRUE(catalog_->SetRunState("a", v1::RUN_RUNNING).ok());
  EXPECT_EQ(catalog_->SetRunState("a", v1::RUN_STATE_UNSPECIFIED).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(catalog_->UpdateRunProgress("a", 1234).ok());
  auto runs = catalog_->ListRuns();
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].name(), "b");  // creation order
  EXPECT_EQ((*runs)[1].name(), "a");
  EXPECT_EQ((*runs)[1].state(), v1::RUN_RUNNING);
  EXPECT_EQ((*runs)[1].last_step(), 1234);
}

// --- Write-ahead log checkpoints ---------------------------------------------------

// A catalog file with one run of one rank; `Write` ingests the next ten steps.
struct LogProbe {
  explicit LogProbe(CatalogOptions options) {
    auto opened = Catalog::Open(options);
    EXPECT_TRUE(opened.ok()) << opened.status();
    catalog = std::move(*opened);
    v1::Run run;
    run.set_name("log");
    run.set_world_size(1);
    EXPECT_TRUE(catalog->CreateRun(run).ok());
  }
  void Write() {
    auto done = catalog->IngestReports("log", 0, 0, Batch(next, next + 9, 0));
    EXPECT_TRUE(done.ok()) << done.status();
    next += 10;
  }
  std::unique_ptr<Catalog> catalog;
  int64_t next = 0;
};

TEST(CatalogLogTest, ByDefaultTheCommitThatFillsTheLogCheckpointsIt) {
  TempDir dir;
  constexpr int64_t kPages = 16;
  LogProbe probe({.path = dir.File("catalog.db"), .checkpoint_pages = kPages});
  int64_t most = 0;
  int restarts = 0;
  for (int i = 0; i < 300; ++i) {
    const int64_t before = probe.catalog->wal_pages();
    probe.Write();
    const int64_t after = probe.catalog->wal_pages();
    most = std::max(most, after);
    if (after < before) ++restarts;
  }
  // SQLite's own rule: never a commit past the limit left unchecked, and
  // nothing left for the owner to do.
  EXPECT_LT(most, kPages);
  EXPECT_GT(restarts, 0) << "the log was never checkpointed";
  auto ran = probe.catalog->CheckpointIfDue();
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_FALSE(*ran);
}

TEST(CatalogLogTest, DeferredCheckpointsWaitForTheOwnerUpToFourTimesTheLimit) {
  TempDir dir;
  constexpr int64_t kPages = 16;
  const std::string path = dir.File("catalog.db");
  LogProbe probe({.path = path, .checkpoint_pages = kPages, .deferred_checkpoints = true});
  // Due, and not done by the commits: the log grows past the limit.
  int writes = 0;
  while (probe.catalog->wal_pages() < 2 * kPages && writes < 1000) {
    const int64_t before = probe.catalog->wal_pages();
    probe.Write();
    ++writes;
    ASSERT_GE(probe.catalog->wal_pages(), before) << "a commit checkpointed a deferred log";
  }
  ASSERT_GE(probe.catalog->wal_pages(), 2 * kPages);
  // The owner's checkpoint copies all of it; the next commit starts over.
  auto ran = probe.catalog->CheckpointIfDue();
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_TRUE(*ran);
  EXPECT_EQ(probe.catalog->wal_pages(), 0);
  probe.Write();
  EXPECT_LT(probe.catalog->wal_pages(), kPages);
  // An owner that never checkpoints: the commit that reaches four times the
  // limit does, so the log stays bounded.
  int64_t most = 0;
  int restarts = 0;
  for (int i = 0; i < 400; ++i) {
    const int64_t before = probe.catalog->wal_pages();
    probe.Write();
    most = std::max(most, probe.catalog->wal_pages());
    if (probe.catalog->wal_pages() < before) ++restarts;
  }
  EXPECT_GT(restarts, 0);
  EXPECT_LT(most, DatabaseOptions::kDeferredLimit * kPages);
  EXPECT_GE(most, kPages) << "the commits checkpointed at the plain limit";
  // Everything written is there, whichever way the log was copied.
  probe.catalog.reset();
  auto reopened = Catalog::Open({.path = path});
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto last = (*reopened)->CommittedStep("log", 0, 0);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, probe.next - 1);
  auto steps = (*reopened)->QueryTelemetry("log", 0, probe.next - 100, std::nullopt, 0);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(steps->size(), 100u);
}

TEST_F(CatalogTest, EndRunChangesTheStateAndDropsTheLaunchRecordsTogether) {
  MakeRun("a");
  MakeRun("b");
  ASSERT_TRUE(catalog_->SetRunState("a", v1::RUN_RUNNING).ok());
  ASSERT_TRUE(catalog_->PutLaunch({.run = "a", .slot = "job", .kind = "slurm", .handle = 7}).ok());
  ASSERT_TRUE(catalog_->PutLaunch({.run = "a", .slot = "rank-0", .kind = "local", .handle = 9}).ok());
  ASSERT_TRUE(catalog_->PutLaunch({.run = "b", .slot = "job", .kind = "slurm", .handle = 8}).ok());
  // One slot: the run is failed, its other slot and the other run stay.
  ASSERT_TRUE(catalog_->EndRun("a", v1::RUN_FAILED, "job").ok());
  EXPECT_EQ(catalog_->GetRun("a")->state(), v1::RUN_FAILED);
  auto left = catalog_->ListLaunches();
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 2u);
  EXPECT_EQ((*left)[0].run, "a");
  EXPECT_EQ((*left)[0].slot, "rank-0");
  EXPECT_EQ((*left)[1].run, "b");
  // Every slot.
  ASSERT_TRUE(catalog_->EndRun("a", v1::RUN_FINISHED).ok());
  EXPECT_EQ(catalog_->GetRun("a")->state(), v1::RUN_FINISHED);
  EXPECT_EQ(catalog_->ListLaunches()->size(), 1u);
  // Refused whole: an unknown state or run changes nothing.
  EXPECT_EQ(catalog_->EndRun("b", static_cast<v1::RunState>(99)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->EndRun("nope", v1::RUN_FAILED).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog_->GetRun("b")->state(), v1::RUN_CREATED);
  EXPECT_EQ(catalog_->ListLaunches()->size(), 1u);
}

TEST_F(CatalogTest, GenerationsFormATimeline) {
  MakeRun("r");
  v1::Generation g;
  g.set_parent(0);
  g.set_from_checkpoint_step(500);
  g.set_reason("replay");
  g.mutable_data_plan()->add_ranges()->set_begin(500);
  g.mutable_hparams()->set_lr_scale(0.7);
  auto first = catalog_->CreateGeneration("r", g);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->generation(), 1);  // assigned
  g.set_parent(1);
  g.set_reason("skip");
  auto second = catalog_->CreateGeneration("r", g);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->generation(), 2);
  EXPECT_EQ(catalog_->GetRun("r")->current_generation(), 2);

  g.set_generation(2);
  EXPECT_EQ(catalog_->CreateGeneration("r", g).status().code(), absl::StatusCode::kAlreadyExists);
  g.set_generation(0);
  g.set_parent(9);
  auto orphan = catalog_->CreateGeneration("r", g);
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(orphan.status().message()), "parent generation 9 of run 'r' not found");

  auto all = catalog_->ListGenerations("r");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[1].hparams().lr_scale(), 0.7);
  EXPECT_EQ((*all)[1].data_plan().ranges(0).begin(), 500);
  EXPECT_EQ((*all)[2].parent(), 1);
}

// A run's incarnation tells it from another run of the same name: each
// CreateRun makes a random one, here and in a catalog made afresh.
TEST_F(CatalogTest, EachRunIsItsOwnIncarnation) {
  MakeRun("r");
  MakeRun("s");
  auto r = catalog_->GetRunIncarnation("r");
  auto s = catalog_->GetRunIncarnation("s");
  ASSERT_TRUE(r.ok() && s.ok());
  EXPECT_EQ(r->incarnation.size(), 32u);
  EXPECT_NE(r->incarnation, s->incarnation);
  EXPECT_EQ(r->state, v1::RUN_CREATED);
  ASSERT_TRUE(catalog_->SetRunState("r", v1::RUN_FINISHED).ok());
  EXPECT_EQ(catalog_->GetRunIncarnation("r")->state, v1::RUN_FINISHED);
  EXPECT_EQ(catalog_->GetRunIncarnation("r")->incarnation, r->incarnation);
  CatalogOptions options;
  options.path = ":memory:";
  auto fresh = Catalog::Open(options);
  ASSERT_TRUE(fresh.ok());
  v1::Run again;
  again.set_name("r");
  ASSERT_TRUE((*fresh)->CreateRun(again).ok());
  EXPECT_NE((*fresh)->GetRunIncarnation("r")->incarnation, r->incarnation);
  EXPECT_EQ(catalog_->GetRunIncarnation("t").status().code(), absl::StatusCode::kNotFound);
}

// --- Checkpoints and manifests -------------------------------------------------------

TEST_F(CatalogTest, CheckpointUpsertCompletesAndKeepsThePin) {
  MakeRun("r");
  v1::Checkpoint c;
  c.set_run("r");
  c.set_step(1000);
  c.set_uri("file:///ckpt/1000");
  c.set_bytes(0);
  ASSERT_TRUE(catalog_->UpsertCheckpoint(c).ok());
  ASSERT_TRUE(catalog_->PinCheckpoint("r", 1000, true).ok());
  c.set_complete(true);
  c.set_bytes(4096);
  c.set_checksum("sha256:abc");
  auto done = catalog_->UpsertCheckpoint(c);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->complete());
  EXPECT_TRUE(done->pinned());
  EXPECT_EQ(done->bytes(), 4096);
  // A late "incomplete" report does not undo completion or erase the checksum.
  c.set_complete(false);
  c.set_checksum("");
  auto late = catalog_->UpsertCheckpoint(c);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->complete());
  EXPECT_EQ(late->checksum(), "sha256:abc");

  c.set_step(500);
  c.set_uri("file:///ckpt/500");
  ASSERT_TRUE(catalog_->UpsertCheckpoint(c).ok());
  auto list = catalog_->ListCheckpoints("r");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step(), 500);
  EXPECT_EQ((*list)[1].step(), 1000);
  EXPECT_EQ(catalog_->PinCheckpoint("r", 77, true).status().code(), absl::StatusCode::kNotFound);
}

// The file identity the daemon records at registration: replaced by the
// next registration that brings one, kept by one that does not, cleared by
// one with another checksum (another file) and none.
TEST_F(CatalogTest, CheckpointFileIdentityFollowsTheRegistrations) {
  MakeRun("r");
  v1::Checkpoint c;
  c.set_run("r");
  c.set_step(10);
  c.set_uri("file:///ckpt/10");
  c.set_checksum("0123456789abcdef");
  ASSERT_TRUE(catalog_->UpsertCheckpoint(c).ok());
  EXPECT_EQ(*catalog_->CheckpointFileIdentity("r", 10, "file:///ckpt/10"), "");
  ASSERT_TRUE(catalog_->UpsertCheckpoint(c, "ino=1").ok());
  EXPECT_EQ(*catalog_->CheckpointFileIdentity("r", 10, "file:///ckpt/10"), "ino=1");
  ASSERT_TRUE(catalog_->UpsertCheckpoint(c).ok());  // resent, nothing seen
  EXPECT_EQ(*catalog_->CheckpointFileIdentity("r", 10, "file:///ckpt/10"), "ino=1");
  ASSERT_TRUE(catalog_->UpsertCheckpoint(c, "ino=2").ok());
  EXPECT_EQ(*catalog_->CheckpointFileIdentity("r", 10, "file:///ckpt/10"), "ino=2");
  c.set_checksum("fedcba9876543210");
  ASSERT_TRUE(catalog_->UpsertCheckpoint(c).ok());
  EXPECT_EQ(*catalog_->CheckpointFileIdentity("r", 10, "file:///ckpt/10"), "");
  ASSERT_TRUE(catalog_->SetCheckpointFileIdentity("r", 10, "file:///ckpt/10", "ino=3").ok());
  EXPECT_EQ(*catalog_->CheckpointFileIdentity("r", 10, "file:///ckpt/10"), "ino=3");
  EXPECT_EQ(catalog_->CheckpointFileIdentity("r", 11, "file:///ckpt/10").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog_->SetCheckpointFileIdentity("r", 11, "file:///ckpt/10", "x").code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CatalogTest, DeletedCheckpointIsNoLongerListedEvenWhenPinned) {
  MakeRun("r");
  for (int64_t step : {100, 200, 300}) {
    v1::Checkpoint c;
    c.set_run("r");
    c.set_step(step);
    c.set_uri("file:///ckpt/" + std::to_string(step));
    c.set_complete(true);
    ASSERT_TRUE(catalog_->UpsertCheckpoint(c).ok());
  }
  ASSERT_TRUE(catalog_->PinCheckpoint("r", 100, true).ok());
  // The file is gone whatever the pin said: the catalog must not offer it.
  auto deleted = catalog_->DeleteCheckpoint("r", 100, "file:///ckpt/100");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(*deleted);
  ASSERT_TRUE(catalog_->DeleteCheckpoint("r", 200, "file:///ckpt/200").ok());
  // A resent notice, or one for a checkpoint never registered, is harmless.
  auto again = catalog_->DeleteCheckpoint("r", 100, "file:///ckpt/100");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  // Only the exact (step, uri) goes.
  ASSERT_TRUE(catalog_->DeleteCheckpoint("r", 300, "file:///elsewhere/300").ok());
  auto list = catalog_->ListCheckpoints("r");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step(), 300);
  EXPECT_EQ(catalog_->DeleteCheckpoint("ghost", 1, "file:///x").status().code(),
            absl::StatusCode::kNotFound);

  // Written again later (same key), it is registered afresh, unpinned.
  v1::Checkpoint again_written;
  again_written.set_run("r");
  again_written.set_step(100);
  again_written.set_uri("file:///ckpt/100");
  auto back = catalog_->UpsertCheckpoint(again_written);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->pinned());
  EXPECT_EQ(catalog_->ListCheckpoints("r")->size(), 2u);
}

TEST_F(CatalogTest, RunRecordsTheWorkersDataOrder) {
  MakeRun("r");
  auto fresh = catalog_->GetRun("r");
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(fresh->has_data_order());
  EXPECT_EQ(fresh->total_steps(), 0);

  v1::DataOrder order;
  order.set_dataset_fingerprint("xxh64:0123");
  order.set_seed(99);
  order.set_global_batch_size(8);
  order.set_sequence_length(32);
  (*order.mutable_blend())["web"] = 0.75;
  (*order.mutable_blend())["code"] = 0.25;
  ASSERT_TRUE(catalog_->SetRunDataOrder("r", order, 500).ok());
  auto run = catalog_->GetRun("r");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(run->data_order(), order))
      << run->data_order().DebugString();
  EXPECT_EQ(run->data_order().blend().at("web"), 0.75);
  EXPECT_EQ(run->total_steps(), 500);
  auto runs = catalog_->ListRuns();
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].data_order().seed(), 99u);

  order.set_seed(7);
  ASSERT_TRUE(catalog_->SetRunDataOrder("r", order, 0).ok());
  EXPECT_EQ(catalog_->GetRun("r")->data_order().seed(), 7u);
  EXPECT_EQ(catalog_->GetRun("r")->total_steps(), 0);
  EXPECT_EQ(catalog_->SetRunDataOrder("ghost", order, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog_->SetRunDataOrder("r", order, -1).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CatalogTest, CheckpointOfUnknownRunIsRefused) {
  v1::Checkpoint c;
  c.set_run("ghost");
  c.set_step(1);
  c.set_uri("file:///x");
  EXPECT_EQ(catalog_->UpsertCheckpoint(c).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(catalog_->ListRuns()->empty());
}

TEST_F(CatalogTest, ManifestsAreImmutable) {
  MakeRun("r");
  v1::Manifest m;
  m.set_version(1);
  m.set_dataset_fingerprint("sha256:corpus");
  m.set_seed(0xffffffffffffffffULL);
  m.set_global_batch_size(16);
  m.set_sequence_length(64);
  (*m.mutable_blend())["web"] = 0.7;
  (*m.mutable_blend())["code"] = 0.3;
  m.mutable_data_plan()->add_ranges()->set_end(-1);
  ASSERT_TRUE(catalog_->PutManifest("r", m).ok());
  EXPECT_TRUE(catalog_->PutManifest("r", m).ok());  // same content again
  auto got = catalog_->GetManifest("r", 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->seed(), 0xffffffffffffffffULL);
  EXPECT_EQ(got->blend().at("code"), 0.3);
  m.set_seed(7);
  EXPECT_EQ(catalog_->PutManifest("r", m).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(catalog_->GetManifest("r", 2).status().code(), absl::StatusCode::kNotFound);
}

// --- Telemetry ---------------------------------------------------------------------------

TEST_F(CatalogTest, EightRanksMergeWithResentAndOutOfOrderBatches) {
  MakeRun("r");
  constexpr uint32_t kRanks = 8;
  constexpr int64_t kSteps = 20;
  int accepted = 0, duplicates = 0;
  auto ingest = [&](uint32_t rank, std::vector<v1::StepReport> batch) {
    auto result = catalog_->IngestReports("r", 0, rank, batch);
    ASSERT_TRUE(result.ok()) << result.status();
    accepted += result->accepted;
    duplicates += result->duplicates;
  };
  // Ranks interleave; every rank sends batches of 5 steps.
  for (int64_t from = 0; from < kSteps; from += 5) {
    for (uint32_t i = 0; i < kRanks; ++i) {
      const uint32_t rank = (i * 3 + from) % kRanks;
      std::vector<v1::StepReport> batch = Batch(from, from + 4, rank);
      if (rank == 2) std::reverse(batch.begin(), batch.end());  // order inside a batch
      ingest(rank, batch);
    }
    // Rank 5 resends its whole batch (lost ack); rank 1 resends overlapping
    // steps together with nothing new.
    ingest(5, Batch(from, from + 4, 5));
    ingest(1, Batch(std::max<int64_t>(0, from - 2), from + 4, 1));
  }
  // A stale batch arriving after a newer one is a duplicate, never merged.
  ingest(3, Batch(10, 12, 3));

  EXPECT_EQ(accepted, kRanks * kSteps);
  EXPECT_EQ(duplicates, 4 * 5 + (5 + 7 + 7 + 7) + 3);

  auto records = catalog_->QueryTelemetry("r", 0, 0, std::nullopt, 0);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), static_cast<size_t>(kSteps));
  for (int64_t s = 0; s < kSteps; ++s) {
    const v1::StepRecord& rec = (*records)[s];
    SCOPED_TRACE(s);
    EXPECT_EQ(rec.step(), s);
    EXPECT_EQ(rec.generation(), 0);
    EXPECT_EQ(rec.ranks_reported(), kRanks);
    EXPECT_EQ(rec.loss(), 2.875);  // mean of 2 + 0.25 * rank over 0..7
    EXPECT_EQ(rec.grad_norm(), 8.0);
    EXPECT_EQ(rec.tokens(), 8000);
    EXPECT_EQ(rec.max_loss().rank(), 7u);
    EXPECT_EQ(rec.max_loss().value(), 3.75);
    // The slowest rank has (rank*5 + s) % 8 == 7, i.e. rank = 3 * (7 - s) mod 8.
    const uint32_t slowest = static_cast<uint32_t>(((7 - s) % 8 + 8) % 8 * 5 % 8);
    EXPECT_EQ((slowest * 5 + s) % 8, 7);
    EXPECT_EQ(rec.slowest_step().rank(), slowest);
    EXPECT_EQ(rec.slowest_step().value(), 0.5 + 0.125 * 7);
    EXPECT_FALSE(rec.has_first_nonfinite_rank());
    uint64_t hash = 0;
    for (uint32_t rank = 0; rank < kRanks; ++rank) {
      hash += LossHashContribution(rank, 0x1234u + static_cast<uint64_t>(s));
    }
    EXPECT_EQ(rec.loss_hash(), hash);
  }
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(*catalog_->CommittedStep("r", 0, rank), kSteps - 1);
  }
  EXPECT_EQ(*catalog_->CommittedStep("r", 0, 99), -1);
}

TEST_F(CatalogTest, DuplicateStepsInsideOneBatchCountOnce) {
  MakeRun("r");
  std::vector<v1::StepReport> batch = {Report(3, 0), Report(1, 0), Report(3, 0), Report(2, 0)};
  auto result = catalog_->IngestReports("r", 0, 0, batch);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->accepted, 3);
  EXPECT_EQ(result->duplicates, 1);
  EXPECT_EQ(result->committed_step, 3);
  EXPECT_EQ(catalog_->QueryTelemetry("r", 0, 3, 3, 0)->at(0).ranks_reported(), 1u);
}

TEST_F(CatalogTest, NaNAndInfRoundTripBitExact) {
  MakeRun("r");
  const double kPayloadNaN = std::bit_cast<double>(uint64_t{0x7ff8dead0000beefULL});
  const double kNegativeNaN = std::bit_cast<double>(uint64_t{0xfff0000000000001ULL});  // sNaN
  v1::StepReport r = Report(0, 0);
  r.set_loss(kPayloadNaN);
  r.set_grad_norm(std::numeric_limits<double>::infinity());
  r.set_lse_max(-std::numeric_limits<double>::infinity());
  r.set_step_time_s(kNegativeNaN);
  v1::LayerStats* layer = r.add_layers();
  layer->set_layer(3);
  layer->set_max_attn_logit(kPayloadNaN);
  layer->set_act_rms(std::numeric_limits<double>::infinity());
  layer->set_update_ratio(std::numeric_limits<double>::denorm_min());
  layer->set_param_norm(-0.0);
  auto ingest = catalog_->IngestReports("r", 0, 4, std::span(&r, 1));
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  auto records = catalog_->QueryTelemetry("r", 0, 0, 0, 1);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  const v1::StepRecord& rec = records->front();
  auto bits = [](double d) { return std::bit_cast<uint64_t>(d); };
  EXPECT_EQ(bits(rec.loss()), bits(kPayloadNaN));
  EXPECT_EQ(bits(rec.grad_norm()), bits(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(bits(rec.lse_max()), bits(-std::numeric_limits<double>::infinity()));
  EXPECT_EQ(bits(rec.step_time_s()), bits(kNegativeNaN));
  ASSERT_EQ(rec.layers_size(), 1);
  EXPECT_EQ(bits(rec.layers(0).max_attn_logit()), bits(kPayloadNaN));
  EXPECT_EQ(bits(rec.layers(0).act_rms()), bits(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(bits(rec.layers(0).update_ratio()),
            bits(std::numeric_limits<double>::denorm_min()));
  EXPECT_EQ(bits(rec.layers(0).param_norm()), bits(-0.0));
  EXPECT_EQ(rec.first_nonfinite_rank(), 4u);
  EXPECT_EQ(bits(rec.max_loss().value()), bits(kPayloadNaN));
}

TEST_F(CatalogTest, TelemetryIsKeyedByGeneration) {
  MakeRun("r");
  ASSERT_TRUE(catalog_->IngestReports("r", 0, 0, Batch(0, 9, 0)).ok());
  v1::Generation replay;
  replay.set_parent(0);
  replay.set_from_checkpoint_step(5);
  replay.set_reason("replay");
  ASSERT_TRUE(catalog_->CreateGeneration("r", replay).ok());
  // The replay re-reports steps 5..7: new in generation 1, not duplicates.
  auto result = catalog_->IngestReports("r", 1, 0, Batch(5, 7, 0));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->accepted, 3);
  EXPECT_EQ(catalog_->QueryTelemetry("r", 0, 0, std::nullopt, 0)->size(), 10u);
  auto gen1 = catalog_->QueryTelemetry("r", 1, 0, std::nullopt, 0);
  ASSERT_EQ(gen1->size(), 3u);
  EXPECT_EQ(gen1->front().generation(), 1);
  EXPECT_EQ(gen1->front().step(), 5);
  // Range and limit.
  auto range = catalog_->QueryTelemetry("r", 0, 2, 6, 3);
  ASSERT_EQ(range->size(), 3u);
  EXPECT_EQ(range->back().step(), 4);
  // Unknown generation.
  auto unknown = catalog_->IngestReports("r", 7, 0, Batch(0, 0, 0));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(unknown.status().message()), "generation 7 of run 'r' not found");

  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(catalog_->IngestReports("r", 0, 1, Batch(0, 2, 1)).ok());
  auto ranks = catalog_->ListRankProgress("r");
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].rank(), 0u);
  EXPECT_EQ((*ranks)[0].generation(), 1);  // its newest generation
  EXPECT_EQ((*ranks)[0].last_step(), 7);
  EXPECT_EQ((*ranks)[1].generation(), 0);
  EXPECT_EQ((*ranks)[1].last_step(), 2);
  EXPECT_EQ((*ranks)[1].last_seen_unix_ms(), clock_.NowUnixMillis());
  EXPECT_EQ(catalog_->GetRun("r")->ranks_size(), 2);
}

TEST_F(CatalogTest, AnIncidentEventAndTheRecordItLeavesAreOneTransaction) {
  MakeRun("r");
  v1::Incident initial;
  initial.set_state(v1::DETECTED);
  initial.set_onset_step(40);
  v1::Incident held;
  const auto id = catalog_->CreateIncidentWithEvent(
      "r", initial, "opened", "payload-1", [&](int64_t new_id, int64_t seq) -> const v1::Incident& {
        held = initial;
        held.set_id(new_id);
        held.set_trigger(absl::StrCat("seq ", seq));
        return held;
      });
  ASSERT_TRUE(id.ok()) << id.status();
  auto stored = catalog_->GetIncident(*id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->run(), "r");
  EXPECT_EQ(stored->onset_step(), 40);
  auto events = catalog_->ListIncidentEvents(*id);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].kind, "opened");
  // The record saved is the one built from the event's seq.
  EXPECT_EQ(stored->trigger(), absl::StrCat("seq ", (*events)[0].seq));

  // A later event and the record it leaves.
  const auto seq = catalog_->AppendIncidentEventAndUpdate(
      *id, "verdict", "payload-2", [&](int64_t s) -> const v1::Incident& {
        held.set_state(v1::CLOSED);
        held.set_trigger(absl::StrCat("seq ", s));
        return held;
      });
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(catalog_->GetIncident(*id)->state(), v1::CLOSED);
  EXPECT_EQ(catalog_->ListIncidentEvents(*id)->size(), 2u);

  // When the record cannot be saved, the event is not stored either.
  const auto bad = catalog_->AppendIncidentEventAndUpdate(
      *id, "note", "never", [&](int64_t) -> const v1::Incident& {
        held.set_id(*id + 100);  // another incident: refused
        return held;
      });
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->ListIncidentEvents(*id)->size(), 2u);
  EXPECT_EQ(catalog_->GetIncident(*id)->state(), v1::CLOSED);
  // An unknown incident: NOT_FOUND, nothing stored.
  EXPECT_EQ(catalog_
                ->AppendIncidentEventAndUpdate(12345, "x", "",
                                               [&](int64_t) -> const v1::Incident& { return held; })
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  // A new incident whose record cannot be saved leaves no incident behind.
  const size_t before = catalog_->ListIncidents({})->size();
  const auto none = catalog_->CreateIncidentWithEvent(
      "r", initial, "opened", "p", [&](int64_t new_id, int64_t) -> const v1::Incident& {
        held.set_id(new_id + 7);
        return held;
      });
  EXPECT_FALSE(none.ok());
  EXPECT_EQ(catalog_->ListIncidents({})->size(), before);
}

TEST_F(CatalogTest, ConcurrentRanksFromManyThreads) {
  MakeRun("r");
  constexpr int kRanks = 8;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([this, rank] {
      for (int64_t from = 0; from < 50; from += 10) {
        auto result =
            catalog_->IngestReports("r", 0, rank, Batch(from, from + 9, static_cast<uint32_t>(rank)));
        EXPECT_TRUE(result.ok()) << result.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  auto records = catalog_->QueryTelemetry("r", 0, 0, std::nullopt, 0);
  ASSERT_EQ(records->size(), 50u);
  for (const auto& rec : *records) EXPECT_EQ(rec.ranks_reported(), static_cast<uint32_t>(kRanks));
}

// --- Incidents, commands, quarantine, audit ---------------------------------------------------

TEST_F(CatalogTest, IncidentsRoundTripAndFilter) {
  MakeRun("a");
  MakeRun("b");
  v1::Incident inc;
  inc.set_state(v1::DETECTED);
  inc.set_trigger("loss_spike");
  inc.set_onset_step(600);
  inc.set_peak_value(std::numeric_limits<double>::quiet_NaN());
  auto id_a = catalog_->CreateIncident("a", inc);
  ASSERT_TRUE(id_a.ok()) << id_a.status();
  clock_.Advance(absl::Minutes(1));
  const int64_t later = clock_.NowUnixMillis();
  auto id_b = catalog_->CreateIncident("b", inc);
  ASSERT_TRUE(id_b.ok());
  EXPECT_NE(*id_a, *id_b);

  auto got = catalog_->GetIncident(*id_a);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->id(), *id_a);
  EXPECT_EQ(got->run(), "a");
  EXPECT_TRUE(std::isnan(got->peak_value()));

  got->set_state(v1::CLOSED);
  got->set_verdict(v1::DATA);
  got->set_confidence(0.9);
  ASSERT_TRUE(catalog_->UpdateIncident(*got).ok());
  EXPECT_EQ(catalog_->GetIncident(*id_a)->verdict(), v1::DATA);
  got->set_run("b");
  EXPECT_EQ(catalog_->UpdateIncident(*got).code(), absl::StatusCode::kInvalidArgument);
  v1::Incident missing;
  missing.set_id(999);
  EXPECT_EQ(catalog_->UpdateIncident(missing).code(), absl::StatusCode::kNotFound);

  IncidentFilter filter;
  EXPECT_EQ(catalog_->ListIncidents(filter)->size(), 2u);
  filter.run = "b";
  EXPECT_EQ(catalog_->ListIncidents(filter)->front().id(), *id_b);
  filter = IncidentFilter();
  filter.verdict = v1::DATA;
  EXPECT_EQ(catalog_->ListIncidents(filter)->front().id(), *id_a);
  filter = IncidentFilter();
  filter.state = v1::DETECTED;
  EXPECT_EQ(catalog_->ListIncidents(filter)->front().id(), *id_b);
  filter = IncidentFilter();
  filter.since_unix_ms = later;
  EXPECT_EQ(catalog_->ListIncidents(filter)->size(), 1u);
  filter = IncidentFilter();
  filter.run = "zzz";
  EXPECT_EQ(catalog_->ListIncidents(filter).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CatalogTest, IncidentEventsKeepAppendOrder) {
  MakeRun("r");
  const int64_t one = *catalog_->CreateIncident("r", v1::Incident());
  const int64_t two = *catalog_->CreateIncident("r", v1::Incident());
  const std::string binary("\x00\xff\x01", 3);
  std::vector<std::string> kinds = {"opened", "probe_started", "probe_finished", "verdict",
                                    "closed"};
  for (const std::string& kind : kinds) {
    ASSERT_TRUE(catalog_->AppendIncidentEvent(one, kind, binary + kind).ok());
    ASSERT_TRUE(catalog_->AppendIncidentEvent(two, "noise", "").ok());  // interleaved
    clock_.Advance(absl::Milliseconds(3));
  }
  auto events = catalog_->ListIncidentEvents(one);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) {
    EXPECT_EQ((*events)[i].kind, kinds[i]);
    EXPECT_EQ((*events)[i].payload, binary + kinds[i]);
    EXPECT_EQ((*events)[i].incident_id, one);
    if (i > 0) {
      EXPECT_GT((*events)[i].seq, (*events)[i - 1].seq);
    }
  }
  EXPECT_EQ(catalog_->AppendIncidentEvent(12345, "x", "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CatalogTest, CommandsAreIdempotentAndFinalStatesStick) {
  MakeRun("r");
  ASSERT_TRUE(catalog_->PutCommand("cmd-1", "r", 1, "REWIND", "payload").ok());
  ASSERT_TRUE(catalog_->PutCommand("cmd-2", "r", 1, "PAUSE", "").ok());
  ASSERT_TRUE(catalog_->UpdateCommandState("cmd-1", v1::COMMAND_SENT).ok());
  // Re-put after a restart: same content is fine and does not reset the state.
  ASSERT_TRUE(catalog_->PutCommand("cmd-1", "r", 1, "REWIND", "payload").ok());
  EXPECT_EQ(catalog_->GetCommand("cmd-1")->state, v1::COMMAND_SENT);
  EXPECT_EQ(catalog_->PutCommand("cmd-1", "r", 1, "STOP", "payload").code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(catalog_->UpdateCommandState("cmd-1", v1::COMMAND_ACKED, "rank 0 ok").ok());
  EXPECT_TRUE(catalog_->UpdateCommandState("cmd-1", v1::COMMAND_ACKED).ok());
  EXPECT_EQ(catalog_->UpdateCommandState("cmd-1", v1::COMMAND_SENT).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(catalog_->UpdateCommandState("cmd-1", static_cast<v1::CommandState>(9)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->UpdateCommandState("nope", v1::COMMAND_SENT).code(), absl::StatusCode::kNotFound);

  auto pending = catalog_->ListCommands("r", v1::COMMAND_PENDING);
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->size(), 1u);
  EXPECT_EQ(pending->front().id, "cmd-2");
  auto all = catalog_->ListCommands("r");
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ(all->front().id, "cmd-1");
  EXPECT_EQ(all->front().message, "rank 0 ok");
  EXPECT_EQ(all->front().payload, "payload");
}

TEST_F(CatalogTest, QuarantineIsIdempotent) {
  MakeRun("r");
  const int64_t incident = *catalog_->CreateIncident("r", v1::Incident());
  v1::QuarantineEntry e;
  e.set_run("r");
  e.set_domain("web");
  e.set_document_id(42);
  e.set_reason("binary junk");
  e.set_incident_id(incident);
  ASSERT_TRUE(catalog_->AddQuarantine(e).ok());
  e.set_reason("again");
  auto second = catalog_->AddQuarantine(e);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->reason(), "binary junk");  // the first one stays
  e.set_document_id(7);
  e.set_incident_id(0);
  ASSERT_TRUE(catalog_->AddQuarantine(e).ok());
  auto list = catalog_->ListQuarantine("r");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].document_id(), 7);
  EXPECT_EQ((*list)[0].incident_id(), 0);
  EXPECT_EQ((*list)[1].incident_id(), incident);
  e.set_incident_id(999);
  EXPECT_EQ(catalog_->AddQuarantine(e).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CatalogTest, AuditListsNewestFirst) {
  ASSERT_TRUE(catalog_->AppendAudit("alice", "rewind", "run/a", "to 500").ok());
  ASSERT_TRUE(catalog_->AppendAudit("bob", "approve", "incident/1", "").ok());
  ASSERT_TRUE(catalog_->AppendAudit("carol", "set_policy", "run/a", "{}").ok());
  auto latest = catalog_->ListAudit(2);
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(latest->size(), 2u);
  EXPECT_EQ((*latest)[0].actor, "carol");
  EXPECT_EQ((*latest)[1].actor, "bob");
  EXPECT_EQ(catalog_->ListAudit(0)->size(), 3u);
}

// --- On a real file ----------------------------------------------------------------------------

TEST(CatalogFile, ReopenKeepsEverything) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("r");
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
    v1::StepReport r = Report(0, 0);
    r.set_loss(std::numeric_limits<double>::quiet_NaN());
    ASSERT_TRUE((*catalog)->IngestReports("r", 0, 0, std::span(&r, 1)).ok());
  }
  EXPECT_TRUE(std::filesystem::exists(path));
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ((*catalog)->GetRun("r")->generations_size(), 1);
  auto records = (*catalog)->QueryTelemetry("r", 0, 0, std::nullopt, 0);
  ASSERT_EQ(records->size(), 1u);
  EXPECT_TRUE(std::isnan(records->front().loss()));
  EXPECT_EQ(*(*catalog)->CommittedStep("r", 0, 0), 0);
}

TEST(CatalogFile, PrecursorWarningsAreStoredUpdatedListedByStateAndKeptAcrossAReopen) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  int64_t id = 0;
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    for (const char* name : {"r", "other"}) {
      v1::Run run;
      run.set_name(name);
      ASSERT_TRUE((*catalog)->CreateRun(run).ok());
    }
    v1::PrecursorWarning w;
    w.set_run("r");
    w.set_signal("max_attn_logit");
    w.set_layer(2);
    w.set_state(v1::WARNING_ACTIVE);
    w.set_onset_step(300);
    w.set_raised_step(465);
    w.set_last_step(465);
    w.set_peak_value(1.2e4);
    w.set_threshold(1e4);
    auto created = (*catalog)->CreateWarning(w);
    ASSERT_TRUE(created.ok()) << created.status();
    id = *created;
    w.set_run("other");
    ASSERT_TRUE((*catalog)->CreateWarning(w).ok());
    w.set_run("ghost");
    EXPECT_EQ((*catalog)->CreateWarning(w).status().code(), absl::StatusCode::kNotFound);

    // An incident the warning preceded must exist.
    v1::PrecursorWarning linked = *(*catalog)->GetWarning(id);
    linked.set_state(v1::WARNING_PRECEDED_INCIDENT);
    linked.set_incident_id(99);
    EXPECT_EQ((*catalog)->UpdateWarning(linked).code(), absl::StatusCode::kNotFound);
    linked.set_state(v1::WARNING_STATE_UNSPECIFIED);
    linked.set_incident_id(0);
    EXPECT_EQ((*catalog)->UpdateWarning(linked).code(), absl::StatusCode::kInvalidArgument);
    v1::Incident inc;
    inc.set_onset_step(600);
    auto incident = (*catalog)->CreateIncident("r", inc);
    ASSERT_TRUE(incident.ok());
    linked.set_state(v1::WARNING_PRECEDED_INCIDENT);
    linked.set_incident_id(*incident);
    linked.set_incident_lead_steps(300);
    linked.set_last_step(600);
    ASSERT_TRUE((*catalog)->UpdateWarning(linked).ok());
  }
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto all = (*catalog)->ListWarnings({});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  auto mine = (*catalog)->ListWarnings({.run = "r"});
  ASSERT_EQ(mine->size(), 1u);
  const v1::PrecursorWarning& w = mine->front();
  EXPECT_EQ(w.id(), id);
  EXPECT_EQ(w.run(), "r");
  EXPECT_EQ(w.state(), v1::WARNING_PRECEDED_INCIDENT);
  EXPECT_EQ(w.onset_step(), 300);
  EXPECT_EQ(w.last_step(), 600);
  EXPECT_EQ(w.incident_lead_steps(), 300);
  EXPECT_EQ(w.peak_value(), 1.2e4);
  EXPECT_GT(w.opened_unix_ms(), 0);
  EXPECT_EQ((*catalog)->ListWarnings({.run = "", .state = v1::WARNING_ACTIVE})->size(), 1u);
  EXPECT_EQ((*catalog)->ListWarnings({.run = "", .state = v1::WARNING_ACTIVE})->front().run(), "other");
  EXPECT_EQ((*catalog)->ListWarnings({.run = "ghost"}).status().code(), absl::StatusCode::kNotFound);
}

// Catalog growth per step for a 64-layer model must not depend on world size.
// A size check, not a timing: prints bytes/step and bounds it generously.
double BytesPerStep(const std::string& path, uint32_t ranks) {
  constexpr int kSteps = 1000;
  constexpr uint32_t kLayers = 64;
  std::error_code ignored;
  {
    auto catalog = Catalog::Open({.path = path, .synchronous_full = false});
    EXPECT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("size");
    run.set_world_size(ranks);
    EXPECT_TRUE((*catalog)->CreateRun(run).ok());
  }
  const auto before = std::filesystem::file_size(path);
  {
    auto catalog = Catalog::Open({.path = path, .synchronous_full = false});
    EXPECT_TRUE(catalog.ok());
    const uint32_t per_rank = kLayers / ranks;  // pipeline stages own layer ranges
    for (uint32_t rank = 0; rank < ranks; ++rank) {
      for (int from = 0; from < kSteps; from += 100) {
        std::vector<v1::StepReport> batch;
        for (int s = from; s < from + 100; ++s) {
          v1::StepReport r = Report(s, rank);
          auto* domain = r.add_domain_losses();
          domain->set_domain("web");
          domain->set_loss(2.0 + 1e-3 * s);
          domain->set_tokens(1000);
          for (uint32_t l = rank * per_rank; l < (rank + 1) * per_rank; ++l) {
            v1::LayerStats* layer = r.add_layers();
            layer->set_layer(l);
            // Full-precision values: nothing compresses to a short varint.
            layer->set_max_attn_logit(17.0 + 1e-7 * s + l / 3.0);
            layer->set_grad_norm(0.1 / (1 + l) + 1e-9 * s);
            layer->set_update_ratio(1e-3 / 7.0 * (1 + l));
            layer->set_act_rms(1.0 + l / 11.0 + 1e-8 * s);
            layer->set_param_norm(30.0 + l / 13.0 + 1e-6 * s);
          }
          batch.push_back(std::move(r));
        }
        auto result = (*catalog)->IngestReports("size", 0, rank, batch);
        EXPECT_TRUE(result.ok()) << result.status();
      }
    }
  }  // closing checkpoints the WAL into the main file
  const auto after = std::filesystem::file_size(path);
  return static_cast<double>(after - before) / kSteps;
}

TEST(CatalogFile, ThousandStepsOf64LayersStayWithinAFewKBPerStep) {
  TempDir dir;
  const double one_rank = BytesPerStep(dir.File("one.db"), 1);
  const double eight_ranks = BytesPerStep(dir.File("eight.db"), 8);
  std::printf("catalog growth, 64 layers: %.0f bytes/step (1 rank), %.0f bytes/step (8 ranks)\n",
              one_rank, eight_ranks);
  EXPECT_LT(one_rank, 8192);
  EXPECT_LT(eight_ranks, 8192);
  // The merged record does not grow with the number of ranks.
  EXPECT_LT(eight_ranks, one_rank * 1.1);
}

}  // namespace
}  // namespace spikeguard::storage
