// Crash behaviour in WAL mode: a writer process dies without closing the
// catalog (SIGKILL at an arbitrary moment, or _exit with a transaction open).
// After reopening, every acknowledged batch is there exactly once and nothing
// uncommitted is.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/database.h"
#include "tests/storage/catalog/temp_dir.h"

namespace spikeguard::storage {
namespace {

using ::spikeguard::storage::testing::TempDir;

constexpr int64_t kBatch = 10;

std::vector<v1::StepReport> Batch(int64_t index) {
  std::vector<v1::StepReport> out;
  for (int64_t s = index * kBatch; s < (index + 1) * kBatch; ++s) {
    v1::StepReport& r = out.emplace_back();
    r.set_step(s);
    r.set_loss(1.0 + s);
    r.set_tokens(100);
  }
  return out;
}

void CreateRun(const std::string& path) {
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  v1::Run run;
  run.set_name("r");
  run.set_world_size(1);
  ASSERT_TRUE((*catalog)->CreateRun(run).ok());
}

// Checks the reopened catalog holds whole batches 0..n-1, each merged once,
// and returns n.
int64_t CheckWholeBatches(Catalog& catalog) {
  auto records = catalog.QueryTelemetry("r", 0, 0, std::nullopt, 0);
  EXPECT_TRUE(records.ok()) << records.status();
  if (!records.ok()) return -1;
  EXPECT_EQ(records->size() % kBatch, 0u) << "a batch was half committed";
  for (size_t i = 0; i < records->size(); ++i) {
    const v1::StepRecord& rec = (*records)[i];
    EXPECT_EQ(rec.step(), static_cast<int64_t>(i));
    EXPECT_EQ(rec.ranks_reported(), 1u) << "step " << i << " merged more than once";
    EXPECT_EQ(rec.tokens(), 100);
    EXPECT_EQ(rec.loss(), 1.0 + static_cast<double>(i));
  }
  const int64_t batches = static_cast<int64_t>(records->size()) / kBatch;
  EXPECT_EQ(*catalog.CommittedStep("r", 0, 0), batches * kBatch - 1);
  return batches;
}

TEST(CatalogCrash, SigkilledWriterLosesNoAcknowledgedBatch) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  CreateRun(path);
  int acks[2];
  ASSERT_EQ(pipe(acks), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(acks[0]);
    auto catalog = Catalog::Open({.path = path});
    if (!catalog.ok()) _exit(2);
    for (int64_t b = 0;; ++b) {
      auto result = (*catalog)->IngestReports("r", 0, 0, Batch(b));
      if (!result.ok() || result->accepted != kBatch) _exit(3);
      // Acknowledge only after the commit returned, as the daemon does.
      if (write(acks[1], &b, sizeof b) != sizeof b) _exit(4);
    }
  }
  close(acks[1]);
  int64_t acked = -1;
  for (int64_t b; acked < 40 && read(acks[0], &b, sizeof b) == sizeof b;) acked = b;
  // The child is somewhere in its next transaction now.
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(acks[0]);
  ASSERT_TRUE(WIFSIGNALED(status)) << "writer exited on its own with " << WEXITSTATUS(status);
  ASSERT_EQ(acked, 40);

  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  const int64_t batches = CheckWholeBatches(**catalog);
  EXPECT_GE(batches, acked + 1);  // every acknowledged batch survived
  // Resending everything after the restart merges nothing twice.
  for (int64_t b = 0; b < batches; ++b) {
    auto result = (*catalog)->IngestReports("r", 0, 0, Batch(b));
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->accepted, 0);
    EXPECT_EQ(result->duplicates, kBatch);
  }
  auto next = (*catalog)->IngestReports("r", 0, 0, Batch(batches));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->accepted, kBatch);
  EXPECT_EQ(CheckWholeBatches(**catalog), batches + 1);
}

TEST(CatalogCrash, OpenTransactionAtExitLeavesNoTrace) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  CreateRun(path);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto catalog = Catalog::Open({.path = path});
    if (!catalog.ok()) _exit(2);
    for (int64_t b = 0; b < 5; ++b) {
      if (!(*catalog)->IngestReports("r", 0, 0, Batch(b)).ok()) _exit(3);
    }
    // A second connection writes far more than its page cache holds, so
    // uncommitted pages spill into the WAL file, then the process dies.
    auto db = Database::Open({.path = path});
    if (!db.ok()) _exit(4);
    auto txn = Transaction::Begin(db->get());
    if (!txn.ok()) _exit(5);
    const std::string blob(4000, 'u');
    for (int64_t step = 1000; step < 6000; ++step) {
      auto insert = (*db)->Prepare(
          "INSERT INTO step_telemetry (run_id, generation, step, ranks_reported, record) "
          "VALUES (1, 0, ?, 1, ?)");
      if (!insert.ok()) _exit(6);
      insert->BindInt64(1, step).BindBlob(2, blob);
      if (!insert->Run().ok()) _exit(7);
    }
    if (!(*db)->Execute("UPDATE rank_progress SET committed_step = 5999").ok()) _exit(8);
    _exit(0);  // no commit, no close, no destructors
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  // The uncommitted pages did reach the disk; recovery must ignore them.
  ASSERT_TRUE(std::filesystem::exists(path + "-wal"));
  EXPECT_GT(std::filesystem::file_size(path + "-wal"), 1u << 20);

  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(CheckWholeBatches(**catalog), 5);
  auto later = (*catalog)->QueryTelemetry("r", 0, 1000, std::nullopt, 0);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->empty());
}

}  // namespace
}  // namespace spikeguard::storage
