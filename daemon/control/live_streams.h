// live_streams.h
// -----------------------------------------------------------------------------
// The daemon's one registry of live streams by run: the WorkerService
// streams that commands are pushed to (StreamHub) and the WatchIncidents
// watchers that incident updates are queued for (Supervisor::Watch). A
// stream is registered for one run, or for every run (""), with whatever its
// owner keeps for it (a write function, a queue). For(run) hands out the
// streams of a run under the registry's lock and nothing more: delivery
// happens outside it, so a slow stream never holds the registry.
//
//   LiveStreams<Watcher> watchers;
//   uint64_t id = watchers.Add("gpt", watcher);
//   for (auto& w : watchers.For("gpt")) w->Queue(update);
//   watchers.Remove(id);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace spikeguard::daemon {

template <typename Stream>
class LiveStreams {
 public:
  // `run` "": the stream takes every run's messages. Returns its id.
  uint64_t Add(std::string run, std::shared_ptr<Stream> stream) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    streams_.emplace(id, Entry{std::move(run), std::move(stream)});
    return id;
  }

  void Remove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    streams_.erase(id);
  }

  // The streams registered for `run` or for every run, oldest first.
  std::vector<std::shared_ptr<Stream>> For(const std::string& run) const ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::shared_ptr<Stream>> out;
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : streams_) {
      if (e.run.empty() || e.run == run) out.push_back(e.stream);
    }
    return out;
  }

  // Every stream, oldest first.
  std::vector<std::shared_ptr<Stream>> All() const ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::shared_ptr<Stream>> out;
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : streams_) out.push_back(e.stream);
    return out;
  }

 private:
  struct Entry {
    std::string run;
    std::shared_ptr<Stream> stream;
  };
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spikeguard::daemon
