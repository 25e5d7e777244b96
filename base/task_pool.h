// task_pool.h
// -----------------------------------------------------------------------------
// A fixed set of threads that run posted tasks, first posted first started:
// the daemon's pool for work taken off gRPC's threads (WorkerService's
// message handling) and the threads under the Supervisor's per-run
// pipelines (docs/ARCHITECTURE.md, "Threads and locks"). Tasks posted from one thread
// start in the order posted; with more than one thread they may overlap, so
// a caller that needs one task at a time per key (a stream, a run) posts the
// next only when the last is done.
//
//   TaskPool pool(4);
//   pool.Post([&] { Handle(message); });
//   // ~TaskPool: runs every task still queued, then joins the threads.
//
// The CPU kernels have their own fork-join pool (kernels/thread_pool.h):
// they split one computation across threads and wait for it, spinning
// between sub-millisecond jobs, and build without Abseil.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace spikeguard {

class TaskPool {
 public:
  // `threads` >= 1 (fewer is taken as 1).
  explicit TaskPool(int threads);
  // Runs what is queued, then joins.
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace spikeguard
