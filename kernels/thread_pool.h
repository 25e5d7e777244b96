// thread_pool.h
// -----------------------------------------------------------------------------
// A tiny fork-join pool for the CPU kernels. `ParallelFor(n, fn)` runs
// fn(task, tid) for every task in [0, n) and returns when all are done; tid
// (0 = the caller) only selects per-thread scratch memory.
//
// Determinism: a kernel splits its work into tasks by a rule that depends only
// on the problem size, and each task computes its outputs the same way
// whichever thread runs it. Threads take tasks first-come first-served, so a
// thread that the OS has descheduled (the machine is shared) delays nothing:
// the others take its tasks, and results are bit-identical for any thread
// count and any timing.
//
//   ThreadPool pool(2);
//   pool.ParallelFor(NumBlocks(rows, 64), [&](int64_t task, int tid) {
//     for (int64_t r = task * 64; r < std::min(rows, task * 64 + 64); ++r) Process(r);
//   });
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace spikeguard::kernels {

// A non-owning reference to a callable `void(int64_t, int)`, like
// absl::FunctionRef, kept here so the kernels build without Abseil (the GPU
// machines have no Abseil). The callable must outlive the call it is passed to.
class TaskFn {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, TaskFn>>>
  TaskFn(F&& f)  // NOLINT(google-explicit-constructor): passed like a lambda
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* obj, int64_t task, int tid) { (*static_cast<std::remove_reference_t<F>*>(obj))(task, tid); }) {}
  void operator()(int64_t task, int tid) const { call_(obj_, task, tid); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int);
};

class ThreadPool {
 public:
  // `threads` >= 1; threads - 1 workers are started, the caller is the last.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task, tid) for task in [0, tasks). Not reentrant.
  void ParallelFor(int64_t tasks, TaskFn fn);

 private:
  struct Job;
  static void Work(Job& job, int tid, ThreadPool& pool);
  void WorkerLoop(int tid);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::shared_ptr<Job> current_;  // guarded by mu_
  bool stop_ = false;             // guarded by mu_
};

inline int64_t NumBlocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

}  // namespace spikeguard::kernels
