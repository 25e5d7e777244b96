// The catalog's disk fills while ranks stream: a real daemon in-process, real
// gRPC streams, and the file-size limit of this process (RLIMIT_FSIZE) as the
// full disk, so SQLite's writes fail as they would on a full file system
// (no mount, no root needed). The streams end UNAVAILABLE naming the failed
// write, the daemon serves on, and nothing acknowledged before is lost.
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "tests/daemon/daemon_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 32;
constexpr int kReportsPerBatch = 4;
constexpr int kRanks = 4;

// The largest file in `dir` (the catalog, its write-ahead log).
uintmax_t LargestFile(const std::string& dir) {
  uintmax_t largest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) largest = std::max(largest, entry.file_size());
  }
  return largest;
}

// While alive, no file of this process grows past `bytes` (writes past it
// fail with EFBIG instead of raising SIGXFSZ).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uintmax_t bytes) {
    old_signal_ = signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit limit = old_;
    limit.rlim_cur = static_cast<rlim_t>(bytes);
    ok_ = setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_signal_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  sighandler_t old_signal_ = SIG_DFL;
  bool ok_ = false;
};

// The batches every rank had acknowledged: the steps all of them stored.
int MinAcked(const std::vector<std::atomic<int>>& acked) {
  int least = acked.front().load();
  for (const auto& n : acked) least = std::min(least, n.load());
  return least;
}

class DiskFullTest : public DaemonFixture {
 protected:
  static std::vector<v1::StepReport> Batch(int64_t first) {
    std::vector<v1::StepReport> batch;
    for (int64_t s = first; s < first + kReportsPerBatch; ++s) batch.push_back(Report(s, 2.0, kLayers));
    return batch;
  }
  static v1::WorkerMessage Message(uint64_t seq, const std::vector<v1::StepReport>& reports) {
    v1::WorkerMessage msg;
    msg.mutable_reports()->set_seq(seq);
    for (const auto& r : reports) *msg.mutable_reports()->add_reports() = r;
    return msg;
  }
  void FillTheDiskWhileStreaming(const std::string& run);
};

// Ranks stream batches without waiting for their acks while the disk
// fills: a commit that failed ended the stream while batches the rank had
// already sent were still arriving, and a batch read after the end went on
// to the committer with a callback into the stream's freed reactor (a
// use-after-free, a segfault in 3 of 3 runs with two tracegen ranks).
TEST_F(DiskFullTest, StreamsEndUnavailableTheDaemonServesOnAndNothingAcknowledgedIsLost) {
  // A race: a few rounds, each a run of its own, make it likely.
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    FillTheDiskWhileStreaming("full" + std::to_string(round));
    if (HasFatalFailure()) return;
  }
}

void DiskFullTest::FillTheDiskWhileStreaming(const std::string& run) {
  ASSERT_TRUE(CreateRun(run, kRanks).ok());
  std::vector<Attached> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.push_back(Attach(run, r, kRanks));
  for (auto& a : ranks) ASSERT_TRUE(a.first.has_welcome()) << a.first.DebugString();
  // Acknowledged before the disk fills: these must survive.
  for (int r = 0; r < kRanks; ++r) {
    v1::Ack ack = SendBatch(ranks[r].stream.get(), 1, Batch(0));
    ASSERT_EQ(ack.accepted(), kReportsPerBatch) << ack.message();
  }
  std::vector<std::atomic<int>> acked_batches(kRanks);
  for (auto& n : acked_batches) n = 1;
  std::vector<std::string> ends(kRanks);
  {
    FileSizeLimit full(LargestFile(dir_.path()) + (256 << 10));
    ASSERT_TRUE(full.ok());
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      Stream* stream = ranks[r].stream.get();
      threads.emplace_back([stream] {
        // Far more than the room left: the writes stop when the stream ends.
        for (uint64_t seq = 2; seq < 20000; ++seq) {
          if (!stream->Write(Message(seq, Batch(static_cast<int64_t>(seq - 1) * kReportsPerBatch)))) {
            return;
          }
        }
        stream->WritesDone();
      });
      threads.emplace_back([stream, r, &acked_batches, &ends] {
        v1::ControllerMessage in;
        while (stream->Read(&in)) {
          if (in.has_ack() && in.ack().accepted() > 0) acked_batches[r].fetch_add(1);
        }
        ends[r] = "ended";
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < kRanks; ++r) {
    grpc::Status status = ranks[r].stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("catalog write failed"));
  }
  // The daemon serves on, and with room again a rank attaches and commits.
  ASSERT_TRUE(Serving());
  // Every acknowledged step is stored (a step is complete once every rank
  // sent it: the first batch of each at least).
  const std::vector<v1::StepRecord> stored = Query(run);
  EXPECT_GE(stored.size(), static_cast<size_t>(kReportsPerBatch));
  EXPECT_GE(static_cast<int>(stored.size()),
            MinAcked(acked_batches) * kReportsPerBatch);
  Attached again = Attach(run, 0, kRanks);
  ASSERT_TRUE(again.first.has_welcome()) << again.first.DebugString();
  const int64_t next = again.first.welcome().committed_step() + 1;
  v1::Ack ack = SendBatch(again.stream.get(), 1, Batch(next));
  EXPECT_EQ(ack.accepted(), kReportsPerBatch) << ack.message();
  again.stream->WritesDone();
  EXPECT_TRUE(again.stream->Finish().ok());
}

}  // namespace
}  // namespace spikeguard::testing
