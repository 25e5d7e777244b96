#include "kernels/thread_pool.h"

#include <algorithm>

namespace spikeguard::kernels {
namespace {
// A step issues a few hundred fork-joins of well under a millisecond each, so
// idle threads spin briefly before they sleep on a condition variable.
constexpr int kSpinIterations = 2000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

struct ThreadPool::Job {
  Job(int64_t n, TaskFn f) : tasks(n), fn(f) {}
  const int64_t tasks;
  TaskFn fn;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

ThreadPool::ThreadPool(int threads) {
  for (int tid = 1; tid < std::max(1, threads); ++tid) {
    workers_.emplace_back([this, tid] { WorkerLoop(tid); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

// A task is claimed before it runs, so fn is only called while the caller of
// ParallelFor is still waiting for that task: a late worker finds no task left
// and never touches a finished job's fn.
void ThreadPool::Work(Job& job, int tid, ThreadPool& pool) {
  for (;;) {
    const int64_t task = job.next.fetch_add(1, std::memory_order_relaxed);
    if (task >= job.tasks) return;
    job.fn(task, tid);
    if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.tasks) {
      std::lock_guard<std::mutex> lock(pool.mu_);
      pool.done_cv_.notify_all();
    }
  }
}

void ThreadPool::ParallelFor(int64_t tasks, TaskFn fn) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
  auto job = std::make_shared<Job>(tasks, fn);
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = job;
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  Work(*job, 0, *this);
  for (int i = 0; job->done.load(std::memory_order_acquire) != tasks; ++i) {
    if (i < kSpinIterations) {
      CpuRelax();
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return job->done.load(std::memory_order_acquire) == tasks; });
    break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ == job) current_.reset();
}

void ThreadPool::WorkerLoop(int tid) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; generation_.load(std::memory_order_acquire) == seen; ++i) {
      if (i < kSpinIterations) {
        CpuRelax();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      break;
    }
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
      job = current_;
    }
    if (job) Work(*job, tid, *this);
  }
}

}  // namespace spikeguard::kernels
