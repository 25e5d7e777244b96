// group_commit.h
// -----------------------------------------------------------------------------
// The ingest stage between the worker streams and the catalog. A stream hands
// its validated batch to `Commit`, which blocks that stream's thread (holding
// no lock) until the transaction holding the batch is durable; one thread
// commits the batches of every stream queued meanwhile as one group
// (Catalog::IngestGroup). The group is what was queued while the previous
// commit ran, plus whatever arrives within `window` of the group's first
// batch, plus, while it holds only some ranks of a live step, that step's
// other ranks arriving within `step_window`; at most `max_batches`. Step
// records that became complete are handed to `on_completed` in memory, on
// the commit thread, once merged and before the group's transaction commits
// (Catalog::IngestGroup's `before_commit`), so detection runs beside the
// commit's fsync; no batch is answered before the group is durable.
// `on_completed` runs with the catalog's lock held: it must only enqueue,
// never call the catalog nor wait. Backpressure from the consumer goes in
// `wait_for_room`, called on the commit thread before each group with no
// lock held.
//
//   GroupCommitter ingest(catalog, {},
//       [&](std::vector<storage::CompletedStep> done, absl::Time arrived) {
//         supervisor->OnCompleted(std::move(done), arrived);
//       },
//       [&] { supervisor->WaitForRoom(); });
//   storage::BatchOutcome outcome = ingest.Commit(std::move(batch));
//   if (outcome.status.ok()) ack(outcome.result);
//
// A stream that keeps several batches in flight uses CommitAsync: its
// callback runs on the commit thread once the group is durable (or failed),
// in the order the batches were queued, and must only enqueue (an ack).
//
// Joining a group: with `join_window` set, a group that handed records over
// holds its COMMIT, once its own writes are done, until the consumer says
// those records were judged (Judged) or the window passes. Writes the
// consumer makes meanwhile through Join (an incident opened from those
// records) run in the group's transaction and are durable with it: one
// fsync for the step that showed the spike and the incident it opened,
// instead of two in a row.
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
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/metrics/daemon_metrics.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

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
    // How long a group's COMMIT may wait for the records it handed over to
    // be judged (see "Joining a group" above). Not waited when records
    // handed over before are still unjudged (a backlog: the consumer is
    // behind, the wait would only add latency). 0: never waits, Join never
    // joins. A consumer that sets it reports every record through Judged.
    absl::Duration join_window = absl::ZeroDuration();
    // Groups that hand over more records than this are not held: judging
    // a backlog takes longer than its commit, and its acks would wait for
    // it. (An incident opened from them commits on its own, after.)
    int64_t join_max_records = 8;
    // Called on the commit thread once a group is durable and before any of
    // its batches is answered, with the number of groups committed so far.
    // The daemon sets none; crash tests inject one through
    // Daemon::Options::after_group_commit to die at exactly this point.
    std::function<void(int64_t committed_groups)> after_commit = nullptr;
    // Where batches committed and commit latency are recorded (null: not).
    metrics::DaemonMetrics* metrics = nullptr;
  };
  // `arrived`: when the report that completed these records was queued
  // (their detection latency counts from there; before it the step could
  // not be judged). One call per run of records sharing that arrival.
  using CompletedFn =
      std::function<void(std::vector<storage::CompletedStep>, absl::Time arrived)>;

  GroupCommitter(storage::Catalog* catalog, Options options, CompletedFn on_completed,
                 std::function<void()> wait_for_room = nullptr);
  // Commits what is queued, then stops.
  ~GroupCommitter();

  // Blocks until the group holding `batch` is committed or failed. A failed
  // transaction answers every batch of its group with its status (nothing of
  // the group is stored).
  storage::BatchOutcome Commit(storage::IngestBatch batch);
  // Queues `batch` and returns at once; `done` gets its outcome on the
  // commit thread (at once, UNAVAILABLE, when the committer is stopping).
  using DoneFn = std::function<void(storage::BatchOutcome)>;
  void CommitAsync(storage::IngestBatch batch, DoneFn done);

  // Groups committed so far, and batches in them (for benchmarks and tests).
  int64_t groups() const;
  int64_t batches() const;

  // Writes run in a group's open transaction, on the commit thread with the
  // catalog's lock held: they must not call the catalog's own methods, nor
  // wait on anything.
  using JoinedWork = std::function<absl::Status(storage::Catalog::OpenGroup&)>;
  // While a group that handed records over has not started its COMMIT:
  // runs `work` in that group's transaction and returns once the group is
  // durable, with the work's status (or, if the work went through, the
  // group's failure). nullopt: no group could take it (none open, its
  // commit under way, or joining off); the caller writes on its own.
  // `durable` (may be empty) runs on the commit thread as soon as the work
  // went through and the group is durable, before Join returns and before
  // the group's batches are answered; it must only enqueue (the caller is
  // not woken before it ran: what it tells is not held up by that wake-up).
  std::optional<absl::Status> Join(const JoinedWork& work,
                                   const std::function<void()>& durable = nullptr);
  // The consumer of `on_completed` judged `records` of the records handed
  // over: their detectors ran, and what they opened has joined or been
  // written. Every record handed over is counted once, stale ones too.
  void Judged(int64_t records);
  // Groups whose COMMIT carried joined writes (for benchmarks and tests).
  int64_t joined_groups() const;

 private:
  struct Pending {
    storage::IngestBatch batch;
    storage::BatchOutcome outcome;
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
  // Hands completed records to on_completed_, each with the arrival of the
  // report that completed it.
  void HandOver(std::vector<storage::CompletedStep> done,
                const std::vector<storage::IngestBatch>& batches,
                const std::vector<absl::Time>& queued);
  // Until when the group may wait for the missing ranks of its live steps
  // (counted from each step's first report); InfinitePast when it misses
  // none.
  absl::Time RankDeadline(const std::vector<Pending*>& group) const;
  // Catalog::IngestGroup's `at_commit`: waits for the group's records to be
  // judged (or a joiner, or the window), then runs the joiners' writes.
  void AtCommit(storage::Catalog::OpenGroup& group);
  // After the group's commit (or failure): answers its joiners; those it
  // never served write on their own.
  void AnswerJoiners(const absl::Status& commit);
  struct Joiner {
    const JoinedWork* work = nullptr;
    const std::function<void()>* durable = nullptr;
    absl::Status status;
    bool served = false;
    bool done = false;
  };

  storage::Catalog* const catalog_;
  const Options options_;
  const CompletedFn on_completed_;
  const std::function<void()> wait_for_room_;

  mutable absl::Mutex mu_;
  std::deque<Pending*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t groups_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<std::string, int64_t>, StepRanks> live_steps_;
  // Records handed over and judged so far; a group may be joined from its
  // handover until its COMMIT starts.
  int64_t handed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t judged_ ABSL_GUARDED_BY(mu_) = 0;
  bool joinable_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Joiner*> joiners_ ABSL_GUARDED_BY(mu_);
  int64_t joined_groups_ ABSL_GUARDED_BY(mu_) = 0;
  // The joiners the current group served (commit thread only).
  std::vector<Joiner*> served_;
  std::thread thread_;
};

}  // namespace spikeguard::daemon
