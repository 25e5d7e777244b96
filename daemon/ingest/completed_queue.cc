#include "daemon/ingest/completed_queue.h"

#include <utility>

namespace spikeguard::daemon {

void CompletedQueue::Push(CompletedSlice slice) {
  if (slice.records.empty()) return;
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  outstanding_ += static_cast<int64_t>(slice.records.size());
  slices_.push_back(std::move(slice));
}

void CompletedQueue::WaitForRoom() {
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || outstanding_ < max_outstanding_;
  };
  mu_.Await(absl::Condition(&room));
}

bool CompletedQueue::WaitForRecords() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !slices_.empty();
  };
  mu_.Await(absl::Condition(&ready));
  return !slices_.empty();
}

std::vector<CompletedSlice> CompletedQueue::TakeAll() {
  absl::MutexLock lock(&mu_);
  std::vector<CompletedSlice> out(std::make_move_iterator(slices_.begin()),
                                  std::make_move_iterator(slices_.end()));
  slices_.clear();
  return out;
}

void CompletedQueue::Done(int64_t records) {
  absl::MutexLock lock(&mu_);
  outstanding_ -= records;
}

void CompletedQueue::Open() {
  absl::MutexLock lock(&mu_);
  closed_ = false;
}

void CompletedQueue::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  // What was queued will not be taken: its room is free again.
  for (const CompletedSlice& s : slices_) outstanding_ -= static_cast<int64_t>(s.records.size());
  slices_.clear();
}

int64_t CompletedQueue::outstanding() const {
  absl::MutexLock lock(&mu_);
  return outstanding_;
}

}  // namespace spikeguard::daemon
