#include "daemon/ingest/run_registry.h"

#include <algorithm>

namespace spikeguard::daemon {

uint64_t RunRegistry::Connect(const std::string& run, uint32_t rank, int64_t generation,
                              const std::string& host) {
  absl::MutexLock lock(&mu_);
  Rank& r = runs_[run][rank];
  r.connected = true;
  r.stream_id = next_stream_id_++;
  r.generation = generation;
  r.host = host;
  r.last_seen_ms = clock_->NowUnixMillis();
  return r.stream_id;
}

void RunRegistry::Disconnect(const std::string& run, uint32_t rank, uint64_t stream_id) {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it == runs_.end()) return;
  auto rit = it->second.find(rank);
  if (rit == it->second.end() || rit->second.stream_id != stream_id) return;
  rit->second.connected = false;
}

void RunRegistry::Touch(const std::string& run, uint32_t rank, int64_t step) {
  absl::MutexLock lock(&mu_);
  Rank& r = runs_[run][rank];
  r.last_seen_ms = clock_->NowUnixMillis();
  if (step > r.last_step) r.last_step = step;
  int64_t& run_last = last_step_.try_emplace(run, -1).first->second;
  run_last = std::max(run_last, r.last_step);
}

void RunRegistry::AddReports(const std::string& run, uint32_t rank,
                             std::span<const spikeguard::v1::StepReport> reports) {
  absl::MutexLock lock(&mu_);
  Rank& r = runs_[run][rank];
  r.last_seen_ms = clock_->NowUnixMillis();
  for (const auto& report : reports) {
    if (report.step() > r.last_step) r.last_step = report.step();
  }
  int64_t& run_last = last_step_.try_emplace(run, -1).first->second;
  run_last = std::max(run_last, r.last_step);
}

int64_t RunRegistry::LastStep(const std::string& run) const {
  absl::MutexLock lock(&mu_);
  auto it = last_step_.find(run);
  return it == last_step_.end() ? -1 : it->second;
}

bool RunRegistry::OtherRankConnected(const std::string& run, uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it == runs_.end()) return false;
  for (const auto& [other, r] : it->second) {
    if (r.connected && other != rank) return true;
  }
  return false;
}

void RunRegistry::MarkSelfStarted(const std::string& run) {
  absl::MutexLock lock(&mu_);
  self_started_.insert(run);
}

bool RunRegistry::SelfStarted(const std::string& run) const {
  absl::MutexLock lock(&mu_);
  return self_started_.count(run) > 0;
}

void RunRegistry::GenerationEnded(const std::string& run, uint32_t rank, int64_t generation) {
  absl::MutexLock lock(&mu_);
  ended_[run][rank] = generation;
}

bool RunRegistry::AllRanksDone(const std::string& run, int64_t generation,
                               uint32_t world_size) const {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it != runs_.end()) {
    for (const auto& [rank, r] : it->second) {
      if (r.connected) return false;
    }
  }
  auto ended = ended_.find(run);
  if (ended == ended_.end()) return false;
  for (uint32_t rank = 0; rank < std::max<uint32_t>(1, world_size); ++rank) {
    auto e = ended->second.find(rank);
    if (e == ended->second.end() || e->second != generation) return false;
  }
  return true;
}

std::vector<spikeguard::v1::RankState> RunRegistry::Ranks(const std::string& run) const {
  absl::MutexLock lock(&mu_);
  std::vector<spikeguard::v1::RankState> out;
  auto it = runs_.find(run);
  if (it == runs_.end()) return out;
  for (const auto& [rank, r] : it->second) {
    spikeguard::v1::RankState s;
    s.set_rank(rank);
    s.set_connected(r.connected);
    s.set_last_step(r.last_step);
    s.set_last_seen_unix_ms(r.last_seen_ms);
    s.set_host(r.host);
    s.set_generation(r.generation);
    out.push_back(std::move(s));
  }
  return out;
}

int RunRegistry::ConnectedRanks() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [run, ranks] : runs_) {
    for (const auto& [rank, r] : ranks) n += r.connected ? 1 : 0;
  }
  return n;
}

}  // namespace spikeguard::daemon
