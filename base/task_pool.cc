#include "base/task_pool.h"

#include <algorithm>
#include <utility>

namespace spikeguard {

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

TaskPool::~TaskPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (auto& t : threads_) t.join();
}

void TaskPool::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void TaskPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace spikeguard
