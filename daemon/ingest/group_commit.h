// group_commit.h
// -----------------------------------------------------------------------------
// The ingest stage between the worker streams and the catalog. A stream hands
// its validated batch to `Commit`, which blocks that stream's thread (holding
// no lock) until the transaction holding the batch is durable; one thread
// commits the batches of every stream queued meanwhile as one group, in one
// transaction (Catalog::BeginWrite). The group is what was queued while the
// previous commit ran, plus whatever arrives within `window` of the group's
// first batch, plus, while it holds only some ranks of a live step, that
// step's other ranks arriving within `step_window`; at most `max_batches`.
//
// The group's reports are merged (storage/catalog/merge.h) into the records
// of their steps in memory: the committer keeps the open (incomplete) steps
// of each timeline and each rank's high-water mark, so a step is read from
// the catalog at most once, and written once per group. Reports at or below
// a rank's high-water mark are resends: counted as duplicates, not merged.
//
// Records that became complete (every rank reported) are pushed to the
// committer's own queue, `completed()`, as soon as they are merged and
// before the group's writes and COMMIT, so detection (the queue's consumer)
// runs beside the commit's fsync; no batch is answered before its group is
// durable. The push never waits. Backpressure from the consumer is waited
// for before each group, with no lock held (CompletedQueue::WaitForRoom).
// The committer calls nothing of the consumer's: records only flow forward.
//
//   GroupCommitter ingest(catalog, {});
//   Supervisor supervisor(catalog, hub, clock, ingest.completed());
//   BatchOutcome outcome = ingest.Commit(std::move(batch));
//   if (outcome.status.ok()) ack(outcome.result);
//
// A stream that keeps several batches in flight uses CommitAsync: its
// callback runs on the commit thread once the group is durable (or failed),
// in the order the batches were queued, and must only enqueue (an ack).
//
// After each group is answered the committer runs the catalog's write-ahead
// log checkpoint if one is due (Catalog::CheckpointIfDue), so a catalog
// opened with deferred checkpoints copies its log between groups, never
// inside a commit that someone waits on.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/ingest/completed_queue.h"
#include "daemon/metrics/daemon_metrics.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

// One rank's report batch.
struct IngestBatch {
  std::string run;
  int64_t generation = 0;
  uint32_t rank = 0;
  // A step's record is complete once this many ranks reported it; it is
  // then pushed to the completed queue (0: never complete).
  uint32_t world_size = 0;
  // Refuse the batch unless `generation` is the run's current generation
  // (FAILED_PRECONDITION; `BatchOutcome::run_generation` says which it is).
  bool require_current = false;
  std::vector<spikeguard::v1::StepReport> reports;
};

struct BatchOutcome {
  // Not OK: nothing of this batch was stored (unknown run or generation,
  // stale generation, or the group's transaction failed).
  absl::Status status;
  storage::IngestResult result;
  // The run's current generation when the group was committed (-1 unknown).
  int64_t run_generation = -1;
};

class GroupCommitter {
 public:
  struct Options {
    // Extra time a group waits for more batches after its first one; 0: the
    // previous commit's duration is the window (no added latency when idle).
    absl::Duration window = absl::ZeroDuration();
    // Batches per transaction at most.
    int max_batches = 512;
    // How long a group may wait for the rest of a step: when the group holds
    // a live batch (a single report, as a trainer sends each step) whose
    // step some ranks of its run have sent and others not yet, the group
    // waits up to this long for the missing ranks' batches. The ranks of a
    // step report within a fraction of a millisecond of each other; without
    // the wait the first rank's batch is committed alone and the step
    // completes one commit (an fsync) later. 0: never waits. The wait fits
    // each run: counted from a step's first report, half as long again as
    // its ranks' reports of a step lately came apart (first to last, a
    // slowly decaying maximum), at least `step_window`. A run whose ranks
    // came further apart than `max_step_window` allows gets `step_window`
    // only: a wait that cannot catch its last rank only delays the others.
    absl::Duration step_window = absl::Milliseconds(1);
    absl::Duration max_step_window = absl::Milliseconds(5);
    // Completed records pushed and not yet done with, at most, before the
    // next group waits (CompletedQueue's max_outstanding).
    int64_t max_queued_records = CompletedQueue::kDefaultMaxOutstanding;
    // Called on the commit thread once a group is durable and before any of
    // its batches is answered, with the number of groups committed so far.
    // The daemon sets none; crash tests inject one through
    // Daemon::Options::after_group_commit to die at exactly this point.
    std::function<void(int64_t committed_groups)> after_commit = nullptr;
    // Where batches committed and commit latency are recorded (null: not).
    metrics::DaemonMetrics* metrics = nullptr;
  };
  // The most open (incomplete) step records kept per (run, generation); an
  // older one that falls out is read back from the catalog if it is reported
  // again.
  static constexpr size_t kMaxOpenStepsPerGeneration = 4096;

  GroupCommitter(storage::Catalog* catalog, Options options);
  // Commits what is queued, then stops.
  ~GroupCommitter();

  // Where completed records go (owned here; the detection pipeline takes
  // from it).
  CompletedQueue* completed() { return &completed_; }

  // Blocks until the group holding `batch` is committed or failed. A failed
  // transaction answers every batch of its group with its status (nothing of
  // the group is stored).
  BatchOutcome Commit(IngestBatch batch);
  // Queues `batch` and returns at once; `done` gets its outcome on the
  // commit thread (at once, UNAVAILABLE, when the committer is stopping).
  using DoneFn = std::function<void(BatchOutcome)>;
  void CommitAsync(IngestBatch batch, DoneFn done);

  // Groups committed so far, and batches in them (for benchmarks and tests).
  int64_t groups() const;
  int64_t batches() const;

 private:
  struct Pending {
    IngestBatch batch;
    BatchOutcome outcome;
    bool done = false;
    absl::Time queued;
    // Set for CommitAsync: the committer owns the Pending and calls this.
    DoneFn callback;
  };
  void Loop();
  // Which ranks sent the newest live step of each run and generation
  // (commit thread only): `Note` records a group's batches, `RankDeadline`
  // says how long one of them, leaving its step partly reported, may wait.
  struct StepRanks {
    int64_t step = -1;
    std::vector<uint32_t> ranks;
    // When the step's first report was queued; how far apart the run's
    // ranks reported their recent steps (decaying maximum).
    absl::Time first;
    absl::Duration spread = absl::ZeroDuration();
  };
  void Note(const Pending& pending);
  // Until when the group may wait for the missing ranks of its live steps
  // (counted from each step's first report); InfinitePast when it misses
  // none.
  absl::Time RankDeadline(const std::vector<Pending*>& group) const;
  // The group's transaction: merge, push what completed, write, commit.
  // One outcome per batch; an error status when the transaction failed.
  absl::StatusOr<std::vector<BatchOutcome>> CommitGroup(const std::vector<IngestBatch>& batches,
                                                        const std::vector<absl::Time>& queued);
  // Drops the open steps and high-water marks of a run's generations older
  // than `generation` (they receive no more reports).
  void ForgetOlderTimelines(int64_t run_id, int64_t generation);

  storage::Catalog* const catalog_;
  const Options options_;
  CompletedQueue completed_;

  mutable absl::Mutex mu_;
  std::deque<Pending*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t groups_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  // Commit thread only.
  std::map<std::pair<std::string, int64_t>, StepRanks> live_steps_;
  // Commit thread only: what is merged and committed. Open steps by (run
  // id, generation) then step; high-water marks by (run id, generation,
  // rank). Both mirror the catalog: cleared when a transaction fails.
  std::map<std::pair<int64_t, int64_t>, std::map<int64_t, spikeguard::v1::StepRecord>> open_steps_;
  std::map<std::tuple<int64_t, int64_t, uint32_t>, int64_t> committed_;
  std::thread thread_;
};

}  // namespace spikeguard::daemon
