// completed_queue.h
// -----------------------------------------------------------------------------
// The ingest stage's hand-over to detection: the run-level step records that
// became complete (every rank reported) in a group commit, in commit order,
// each slice with the arrival of the report that completed it. The ingest
// stage owns the queue and only pushes to it, never waiting while it pushes;
// the detection pipeline takes from it on its own thread. Nothing flows back:
// the consumer only says how many records it is done with (Done), which is
// what frees room.
//
//   CompletedQueue queue;                       // owned by GroupCommitter
//   queue.Open();                               // the consumer starts taking
//   // ingest, before a group, holding no lock:
//   queue.WaitForRoom();
//   queue.Push({std::move(records), arrived});  // never blocks
//   // detection, on its own thread:
//   while (queue.WaitForRecords()) {
//     for (CompletedSlice& s : queue.TakeAll()) { ...; queue.Done(s.records.size()); }
//   }
//
// Backpressure: records count as outstanding from Push until Done; the
// producer's WaitForRoom waits while `max_outstanding` or more are. Close
// (the consumer stopping) wakes every waiter; slices pushed while the queue
// is not open (before the consumer's Open, after its Close) are dropped, so
// a stage without a consumer never fills it. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "spikeguard/v1/telemetry.pb.h"

namespace spikeguard::daemon {

// A run-level record that became complete in a group commit.
struct CompletedStep {
  std::string run;
  uint32_t world_size = 0;
  spikeguard::v1::StepRecord record;
};

// Records that share the arrival of the report that completed them (their
// detection latency counts from there), in (run, generation, step) order.
struct CompletedSlice {
  std::vector<CompletedStep> records;
  absl::Time arrived;
};

class CompletedQueue {
 public:
  static constexpr int64_t kDefaultMaxOutstanding = 65536;
  explicit CompletedQueue(int64_t max_outstanding = kDefaultMaxOutstanding)
      : max_outstanding_(max_outstanding) {}

  // Producer. Never blocks.
  void Push(CompletedSlice slice);
  // Producer: waits while max_outstanding or more records are outstanding
  // (returns at once once closed).
  void WaitForRoom();

  // Consumer: waits until a slice is queued (true) or the queue is closed
  // and empty (false).
  bool WaitForRecords();
  // Consumer: every queued slice, oldest first; empty when none.
  std::vector<CompletedSlice> TakeAll();
  // Consumer: `records` taken are processed (or dropped).
  void Done(int64_t records);
  // Consumer: starts taking (until then pushes are dropped).
  void Open();
  // Consumer: stops taking. Wakes the waiters; later pushes are dropped.
  void Close();

  // Records pushed and not yet Done.
  int64_t outstanding() const;

 private:
  const int64_t max_outstanding_;
  mutable absl::Mutex mu_;
  std::deque<CompletedSlice> slices_ ABSL_GUARDED_BY(mu_);
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace spikeguard::daemon
