#include "daemon/ingest/group_commit.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "base/logging.h"

namespace spikeguard::daemon {

GroupCommitter::GroupCommitter(storage::Catalog* catalog, Options options,
                               CompletedFn on_completed, std::function<void()> wait_for_room)
    : catalog_(catalog),
      options_(options),
      on_completed_(std::move(on_completed)),
      wait_for_room_(std::move(wait_for_room)) {
  if (options_.join_window > absl::ZeroDuration()) {
    // A held group lets in whoever waits for the catalog (see AtCommit): the
    // empty critical section has the held group's condition looked at again.
    catalog_->SetContentionObserver([this] { absl::MutexLock lock(&mu_); });
  }
  thread_ = std::thread([this] { Loop(); });
}

GroupCommitter::~GroupCommitter() {
  if (options_.join_window > absl::ZeroDuration()) catalog_->SetContentionObserver(nullptr);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

storage::BatchOutcome GroupCommitter::Commit(storage::IngestBatch batch) {
  Pending pending;
  pending.batch = std::move(batch);
  pending.queued = absl::Now();
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    pending.outcome.status = absl::UnavailableError("the daemon is stopping");
    return pending.outcome;
  }
  queue_.push_back(&pending);
  mu_.Await(absl::Condition(&pending.done));
  return std::move(pending.outcome);
}

void GroupCommitter::CommitAsync(storage::IngestBatch batch, DoneFn done) {
  auto pending = std::make_unique<Pending>();
  pending->batch = std::move(batch);
  pending->callback = std::move(done);
  pending->queued = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(pending.release());
      return;
    }
  }
  pending->outcome.status = absl::UnavailableError("the daemon is stopping");
  pending->callback(std::move(pending->outcome));
}

int64_t GroupCommitter::groups() const {
  absl::MutexLock lock(&mu_);
  return groups_;
}

int64_t GroupCommitter::batches() const {
  absl::MutexLock lock(&mu_);
  return batches_;
}

int64_t GroupCommitter::joined_groups() const {
  absl::MutexLock lock(&mu_);
  return joined_groups_;
}

std::optional<absl::Status> GroupCommitter::Join(const JoinedWork& work,
                                                 const std::function<void()>& durable) {
  Joiner joiner;
  joiner.work = &work;
  joiner.durable = &durable;
  absl::MutexLock lock(&mu_);
  if (!joinable_ || stopping_) return std::nullopt;
  joiners_.push_back(&joiner);
  mu_.Await(absl::Condition(&joiner.done));
  if (!joiner.served) return std::nullopt;
  return joiner.status;
}

void GroupCommitter::Judged(int64_t records) {
  absl::MutexLock lock(&mu_);
  judged_ += records;
}

void GroupCommitter::AtCommit(storage::Catalog::OpenGroup& group) {
  std::vector<Joiner*> take;
  {
    absl::MutexLock lock(&mu_);
    if (!joinable_) return;
    // Held no longer than needed: until the records are judged or a joiner
    // came, and not while anyone waits for the catalog. The consumer itself
    // may be that one (a first read of something it needs to judge): it
    // would otherwise wait out the whole window.
    auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !joiners_.empty() || judged_ >= handed_ ||
             catalog_->lock_waiters() > 0;
    };
    mu_.AwaitWithTimeout(absl::Condition(&go), options_.join_window);
    // From here on a joiner writes on its own: this group's COMMIT starts.
    joinable_ = false;
    take.swap(joiners_);
    if (!take.empty()) ++joined_groups_;
  }
  for (Joiner* j : take) {
    j->status = (*j->work)(group);
    j->served = true;
  }
  served_ = std::move(take);
}

void GroupCommitter::AnswerJoiners(const absl::Status& commit) {
  // The joiners wait in Join until `done`: their work, status and
  // `durable` are the commit thread's until then.
  for (Joiner* j : served_) {
    if (j->status.ok() && !commit.ok()) j->status = commit;
    if (j->status.ok() && *j->durable) (*j->durable)();
  }
  absl::MutexLock lock(&mu_);
  joinable_ = false;
  for (Joiner* j : served_) j->done = true;
  served_.clear();
  // Queued but never served (the group failed before its COMMIT): they
  // write on their own.
  for (Joiner* j : joiners_) j->done = true;
  joiners_.clear();
}

namespace {

// One step of a run with several ranks, sent as it ended (a backlog or a
// resend has several reports; a lone rank has no one to wait for).
bool IsLiveStep(const storage::IngestBatch& b) {
  return b.reports.size() == 1 && b.world_size > 1;
}

}  // namespace

void GroupCommitter::Note(const Pending& pending) {
  const storage::IngestBatch& batch = pending.batch;
  if (!IsLiveStep(batch)) return;
  // Bounded: a run that stopped mid-step leaves its entry behind.
  if (live_steps_.size() > 4096) live_steps_.clear();
  StepRanks& s = live_steps_[{batch.run, batch.generation}];
  const int64_t step = batch.reports.front().step();
  if (step < s.step) return;
  if (step > s.step) {
    s.step = step;
    s.ranks.clear();
    s.first = pending.queued;
  }
  if (std::find(s.ranks.begin(), s.ranks.end(), batch.rank) != s.ranks.end()) return;
  s.ranks.push_back(batch.rank);
  if (s.ranks.size() == batch.world_size) {
    // A step complete: how far apart its ranks reported. The estimate
    // follows a wider spread at once and forgets it slowly.
    s.spread = std::max(pending.queued - s.first, s.spread * 0.98);
  }
}

absl::Time GroupCommitter::RankDeadline(const std::vector<Pending*>& group) const {
  absl::Time until = absl::InfinitePast();
  if (options_.step_window <= absl::ZeroDuration()) return until;
  for (const Pending* p : group) {
    const storage::IngestBatch& b = p->batch;
    if (!IsLiveStep(b)) continue;
    auto it = live_steps_.find({b.run, b.generation});
    if (it == live_steps_.end() || it->second.step != b.reports.front().step() ||
        it->second.ranks.size() >= b.world_size) {
      continue;
    }
    // Ranks further apart than the longest wait would not be caught by
    // it: waiting would only delay the acks of those already in.
    const absl::Duration want = it->second.spread * 1.5;
    const absl::Duration fit = want <= options_.max_step_window
                                   ? std::max(want, options_.step_window)
                                   : options_.step_window;
    until = std::max(until, it->second.first + fit);
  }
  return until;
}

namespace {

// When the report that completed `c` was queued: the last batch of the group
// (they are in queue order) that holds its step.
absl::Time CompletedAt(const storage::CompletedStep& c,
                       const std::vector<storage::IngestBatch>& batches,
                       const std::vector<absl::Time>& queued) {
  const int64_t step = c.record.step();
  for (size_t i = batches.size(); i-- > 0;) {
    const storage::IngestBatch& b = batches[i];
    if (b.reports.empty() || b.run != c.run || b.generation != c.record.generation()) continue;
    if (b.reports.front().step() <= step && step <= b.reports.back().step()) return queued[i];
  }
  return queued.front();
}

}  // namespace

void GroupCommitter::HandOver(std::vector<storage::CompletedStep> done,
                              const std::vector<storage::IngestBatch>& batches,
                              const std::vector<absl::Time>& queued) {
  if (options_.join_window > absl::ZeroDuration() && !done.empty()) {
    absl::MutexLock lock(&mu_);
    // Joinable when the consumer had judged everything handed over before
    // (else it is behind and would not judge these within the window), and
    // these are few enough to judge within it.
    joinable_ = judged_ >= handed_ &&
                static_cast<int64_t>(done.size()) <= options_.join_max_records;
    handed_ += static_cast<int64_t>(done.size());
  }
  std::vector<absl::Time> at;
  at.reserve(done.size());
  for (const storage::CompletedStep& c : done) at.push_back(CompletedAt(c, batches, queued));
  // In order, in slices that share their completing report's arrival.
  size_t begin = 0;
  while (begin < done.size()) {
    size_t end = begin + 1;
    while (end < done.size() && at[end] == at[begin]) ++end;
    if (begin == 0 && end == done.size()) {
      on_completed_(std::move(done), at[begin]);
      return;
    }
    on_completed_(std::vector<storage::CompletedStep>(std::make_move_iterator(done.begin() + begin),
                                                      std::make_move_iterator(done.begin() + end)),
                  at[begin]);
    begin = end;
  }
}

void GroupCommitter::Loop() {
  const size_t max_batches = static_cast<size_t>(std::max(1, options_.max_batches));
  while (true) {
    // The consumer of completed records is full: slow the ingest down
    // rather than growing its queue without bound.
    if (wait_for_room_) wait_for_room_();
    std::vector<Pending*> group;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      if (options_.window > absl::ZeroDuration() && !stopping_) {
        auto full = [this, max_batches]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || queue_.size() >= max_batches;
        };
        mu_.AwaitWithTimeout(absl::Condition(&full), options_.window);
      }
      auto take = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        while (!queue_.empty() && group.size() < max_batches) {
          Note(*queue_.front());
          group.push_back(queue_.front());
          queue_.pop_front();
        }
      };
      take();
      // The rest of a step the group has only part of: wait for its other
      // ranks (briefly; a rank that lags or died only costs the window).
      while (!stopping_ && group.size() < max_batches) {
        const absl::Time until = RankDeadline(group);
        if (until <= absl::Now()) break;
        auto more = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !queue_.empty();
        };
        if (!mu_.AwaitWithDeadline(absl::Condition(&more), until)) break;
        take();
      }
    }
    // The pending batches belong to threads blocked in Commit until `done`.
    std::vector<storage::IngestBatch> batches;
    batches.reserve(group.size());
    for (Pending* p : group) batches.push_back(std::move(p->batch));
    std::vector<absl::Time> queued;
    queued.reserve(group.size());
    for (Pending* p : group) queued.push_back(p->queued);
    storage::Catalog::CompletedSink sink;
    if (on_completed_) {
      sink = [this, &batches, &queued](std::vector<storage::CompletedStep> done) {
        HandOver(std::move(done), batches, queued);
      };
    }
    storage::Catalog::AtCommit at_commit;
    if (options_.join_window > absl::ZeroDuration()) {
      at_commit = [this](storage::Catalog::OpenGroup& open) { AtCommit(open); };
    }
    absl::StatusOr<storage::IngestGroupResult> result =
        catalog_->IngestGroup(batches, sink, at_commit);
    int64_t committed_groups = 0;
    {
      absl::MutexLock lock(&mu_);
      committed_groups = result.ok() ? ++groups_ : groups_;
      batches_ += result.ok() ? static_cast<int64_t>(group.size()) : 0;
    }
    if (at_commit) AnswerJoiners(result.status());
    if (!result.ok()) {
      SG_LOG(ERROR) << "ingest: group of " << group.size() << " batch(es) not committed: "
                    << result.status();
    }
    if (result.ok() && options_.after_commit) options_.after_commit(committed_groups);
    if (result.ok() && options_.metrics != nullptr) {
      options_.metrics->batches_committed->Inc(static_cast<double>(group.size()));
      options_.metrics->commit_latency_seconds->Observe(
          absl::ToDoubleSeconds(absl::Now() - group.front()->queued));
    }
    for (size_t i = 0; i < group.size(); ++i) {
      if (result.ok()) {
        group[i]->outcome = std::move(result->batches[i]);
      } else {
        group[i]->outcome.status = result.status();
      }
    }
    // Answered in queue order: asynchronous callers first get their
    // callbacks (outside the lock), then the blocked callers wake.
    std::vector<Pending*> blocked;
    for (Pending* p : group) {
      if (p->callback) {
        std::unique_ptr<Pending> owned(p);
        owned->callback(std::move(owned->outcome));
      } else {
        blocked.push_back(p);
      }
    }
    {
      absl::MutexLock lock(&mu_);
      for (Pending* p : blocked) p->done = true;
    }
    // The write-ahead log's checkpoint, when one is due, runs here: every
    // batch of the group is answered and no later one has started, so it
    // holds up no acknowledgement and no incident that joined the group
    // (inside a commit, as SQLite does it, it held up the group that took
    // the log past its limit; an opening group, writing more, did so
    // most often). Batches queued meanwhile wait for it, as they would
    // for that commit.
    if (absl::StatusOr<bool> ran = catalog_->CheckpointIfDue(); !ran.ok()) {
      SG_LOG(WARNING) << "ingest: write-ahead log checkpoint failed: " << ran.status();
    }
  }
}

}  // namespace spikeguard::daemon
