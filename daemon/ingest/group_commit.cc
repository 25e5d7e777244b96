#include "daemon/ingest/group_commit.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "storage/catalog/merge.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;

GroupCommitter::GroupCommitter(storage::Catalog* catalog, Options options)
    : catalog_(catalog), options_(options), completed_(options.max_queued_records) {
  thread_ = std::thread([this] { Loop(); });
}

GroupCommitter::~GroupCommitter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

BatchOutcome GroupCommitter::Commit(IngestBatch batch) {
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

void GroupCommitter::CommitAsync(IngestBatch batch, DoneFn done) {
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

namespace {

// One step of a run with several ranks, sent as it ended (a backlog or a
// resend has several reports; a lone rank has no one to wait for).
bool IsLiveStep(const IngestBatch& b) { return b.reports.size() == 1 && b.world_size > 1; }

// When the report that completed `c` was queued: the last batch of the group
// (they are in queue order) that holds its step.
absl::Time CompletedAt(const CompletedStep& c, const std::vector<IngestBatch>& batches,
                       const std::vector<absl::Time>& queued) {
  const int64_t step = c.record.step();
  for (size_t i = batches.size(); i-- > 0;) {
    const IngestBatch& b = batches[i];
    if (b.reports.empty() || b.run != c.run || b.generation != c.record.generation()) continue;
    if (b.reports.front().step() <= step && step <= b.reports.back().step()) return queued[i];
  }
  return queued.front();
}

}  // namespace

void GroupCommitter::Note(const Pending& pending) {
  const IngestBatch& batch = pending.batch;
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
    const IngestBatch& b = p->batch;
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

void GroupCommitter::ForgetOlderTimelines(int64_t run_id, int64_t generation) {
  for (auto it = open_steps_.lower_bound({run_id, INT64_MIN});
       it != open_steps_.end() && it->first.first == run_id && it->first.second < generation;) {
    it = open_steps_.erase(it);
  }
  for (auto it = committed_.lower_bound({run_id, INT64_MIN, 0});
       it != committed_.end() && std::get<0>(it->first) == run_id &&
       std::get<1>(it->first) < generation;) {
    it = committed_.erase(it);
  }
}

absl::StatusOr<std::vector<BatchOutcome>> GroupCommitter::CommitGroup(
    const std::vector<IngestBatch>& batches, const std::vector<absl::Time>& queued) {
  std::vector<BatchOutcome> out(batches.size());
  SG_ASSIGN_OR_RETURN(std::unique_ptr<storage::Catalog::Writer> write, catalog_->BeginWrite());
  struct RunInfo {
    absl::Status status;
    int64_t id = 0;
    int64_t current = -1;
    std::set<int64_t> generations_checked;
  };
  std::map<std::string, RunInfo, std::less<>> runs;
  // Records touched by this group, and the world size that completes each.
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<std::string, uint32_t>> touched;
  std::map<std::tuple<int64_t, int64_t, uint32_t>, int64_t> progress;
  for (size_t i = 0; i < batches.size(); ++i) {
    const IngestBatch& batch = batches[i];
    BatchOutcome& outcome = out[i];
    auto [it, fresh] = runs.try_emplace(batch.run);
    RunInfo& info = it->second;
    if (fresh) {
      absl::StatusOr<storage::RunStore::Key> key = write->runs().Lookup(batch.run);
      if (key.ok()) {
        info.id = key->id;
        info.current = key->current_generation;
      } else if (absl::IsNotFound(key.status())) {
        info.status = key.status();
      } else {
        return key.status();
      }
    }
    outcome.run_generation = info.current;
    if (!info.status.ok()) {
      outcome.status = info.status;
      continue;
    }
    if (batch.require_current && batch.generation != info.current) {
      outcome.status = absl::FailedPreconditionError(
          absl::StrCat("stale generation: reports of generation ", batch.generation,
                       " refused; the run is at generation ", info.current));
      continue;
    }
    if (batch.generation != info.current &&
        !info.generations_checked.contains(batch.generation)) {
      if (absl::Status s = write->runs().RequireGeneration(info.id, batch.run, batch.generation);
          !s.ok()) {
        if (!absl::IsNotFound(s)) return s;
        outcome.status = s;
        continue;
      }
      info.generations_checked.insert(batch.generation);
    }
    const auto rank_key = std::make_tuple(info.id, batch.generation, batch.rank);
    auto committed = committed_.find(rank_key);
    if (committed == committed_.end()) {
      SG_ASSIGN_OR_RETURN(int64_t step,
                          write->steps().CommittedStep(info.id, batch.generation, batch.rank));
      committed = committed_.emplace(rank_key, step).first;
    }
    // Within a batch, take reports in step order so a reordered batch loses nothing.
    std::vector<const v1::StepReport*> ordered;
    ordered.reserve(batch.reports.size());
    for (const v1::StepReport& r : batch.reports) ordered.push_back(&r);
    std::stable_sort(ordered.begin(), ordered.end(),
                     [](const v1::StepReport* a, const v1::StepReport* b) {
                       return a->step() < b->step();
                     });
    storage::IngestResult& r = outcome.result;
    r.committed_step = committed->second;
    auto& open = open_steps_[{info.id, batch.generation}];
    for (const v1::StepReport* report : ordered) {
      if (report->step() <= r.committed_step) {
        ++r.duplicates;
        continue;
      }
      auto record = open.find(report->step());
      if (record == open.end()) {
        SG_ASSIGN_OR_RETURN(std::optional<v1::StepRecord> stored,
                            write->steps().Read(info.id, batch.generation, report->step()));
        record = open.emplace(report->step(), stored.value_or(v1::StepRecord())).first;
      }
      record->second.set_generation(batch.generation);
      storage::MergeReport(&record->second, batch.rank, *report);
      auto& t = touched[{info.id, batch.generation, report->step()}];
      t.first = batch.run;
      t.second = std::max(t.second, batch.world_size);
      r.committed_step = report->step();
      ++r.accepted;
    }
    committed->second = r.committed_step;
    if (!batch.reports.empty()) progress[rank_key] = r.committed_step;
  }
  // Records the group completes go to the queue before anything is written:
  // detection runs beside the writes and the commit's fsync. If the commit
  // fails they were handed over but not stored; the ranks resend them (their
  // batches were not acknowledged), and the consumer skips steps it has seen.
  std::set<std::pair<int64_t, int64_t>> timelines;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> complete;
  std::vector<CompletedStep> done;
  for (const auto& [key, who] : touched) {
    const auto& [run_id, generation, step] = key;
    timelines.insert({run_id, generation});
    const v1::StepRecord& record = open_steps_[{run_id, generation}][step];
    if (who.second > 0 && record.ranks_reported() >= static_cast<int64_t>(who.second)) {
      complete.push_back(key);
      done.push_back(CompletedStep{who.first, who.second, record});
    }
  }
  // In order, in slices that share their completing report's arrival.
  for (size_t begin = 0; begin < done.size();) {
    const absl::Time at = CompletedAt(done[begin], batches, queued);
    size_t end = begin + 1;
    while (end < done.size() && CompletedAt(done[end], batches, queued) == at) ++end;
    completed_.Push(CompletedSlice{
        std::vector<CompletedStep>(std::make_move_iterator(done.begin() + begin),
                                   std::make_move_iterator(done.begin() + end)),
        at});
    begin = end;
  }
  // Each touched record and each rank's high-water mark is written once.
  for (const auto& [key, who] : touched) {
    const auto& [run_id, generation, step] = key;
    SG_RETURN_IF_ERROR(
        write->steps().Write(run_id, generation, open_steps_[{run_id, generation}][step]));
  }
  for (const auto& [key, step] : progress) {
    SG_RETURN_IF_ERROR(write->steps().SetCommittedStep(std::get<0>(key), std::get<1>(key),
                                                       std::get<2>(key), step));
  }
  SG_RETURN_IF_ERROR(write->Commit());
  write.reset();
  // Durable: complete records leave the cache; it keeps at most
  // kMaxOpenStepsPerGeneration steps per timeline.
  for (const auto& [run_id, generation, step] : complete) {
    open_steps_[{run_id, generation}].erase(step);
  }
  for (const auto& key : timelines) {
    auto& open = open_steps_[key];
    while (open.size() > kMaxOpenStepsPerGeneration) open.erase(open.begin());
  }
  // Older generations of a run stop receiving reports once it moved on.
  for (const auto& [name, info] : runs) {
    if (info.status.ok()) ForgetOlderTimelines(info.id, info.current);
  }
  return out;
}

void GroupCommitter::Loop() {
  const size_t max_batches = static_cast<size_t>(std::max(1, options_.max_batches));
  while (true) {
    // The consumer of completed records is full: slow the ingest down
    // rather than growing its queue without bound.
    completed_.WaitForRoom();
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
    std::vector<IngestBatch> batches;
    batches.reserve(group.size());
    for (Pending* p : group) batches.push_back(std::move(p->batch));
    std::vector<absl::Time> queued;
    queued.reserve(group.size());
    for (Pending* p : group) queued.push_back(p->queued);
    absl::StatusOr<std::vector<BatchOutcome>> result = CommitGroup(batches, queued);
    if (!result.ok()) {
      // Rolled back: the in-memory merges may hold uncommitted reports.
      open_steps_.clear();
      committed_.clear();
      SG_LOG(ERROR) << "ingest: group of " << group.size() << " batch(es) not committed: "
                    << result.status();
    }
    int64_t committed_groups = 0;
    {
      absl::MutexLock lock(&mu_);
      committed_groups = result.ok() ? ++groups_ : groups_;
      batches_ += result.ok() ? static_cast<int64_t>(group.size()) : 0;
    }
    if (result.ok() && options_.after_commit) options_.after_commit(committed_groups);
    if (result.ok() && options_.metrics != nullptr) {
      options_.metrics->batches_committed->Inc(static_cast<double>(group.size()));
      options_.metrics->commit_latency_seconds->Observe(
          absl::ToDoubleSeconds(absl::Now() - group.front()->queued));
    }
    for (size_t i = 0; i < group.size(); ++i) {
      if (result.ok()) {
        group[i]->outcome = std::move((*result)[i]);
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
    // holds up no acknowledgement (inside a commit, as SQLite does it, it
    // held up the group that took the log past its limit). Batches queued
    // meanwhile wait for it, as they would for that commit.
    if (absl::StatusOr<bool> ran = catalog_->CheckpointIfDue(); !ran.ok()) {
      SG_LOG(WARNING) << "ingest: write-ahead log checkpoint failed: " << ran.status();
    }
  }
}

}  // namespace spikeguard::daemon
