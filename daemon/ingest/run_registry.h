// run_registry.h
// -----------------------------------------------------------------------------
// Live state of every rank the daemon has heard from: whether its stream is
// connected, when it was last seen and its last step. Raw reports are not
// kept: the catalog holds the merged run-level record, and a window of raw
// reports per rank (~50 MB at 1,024 layers, never read) is gone.
//
//   RunRegistry registry(Clock::Real());
//   uint64_t stream = registry.Connect("run-a", 3, /*generation=*/0, "host-7");
//   registry.AddReports("run-a", 3, reports);
//   registry.Disconnect("run-a", 3, stream);
//
// Thread-safe. Nothing in it grows with run length.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "spikeguard/v1/telemetry.pb.h"

namespace spikeguard::daemon {

class RunRegistry {
 public:
  explicit RunRegistry(Clock* clock) : clock_(clock) {}

  // Registers a stream for (run, rank); a newer stream supersedes an older
  // one for the same rank. Returns the stream's id.
  uint64_t Connect(const std::string& run, uint32_t rank, int64_t generation,
                   const std::string& host);
  // Marks the rank disconnected unless a newer stream took over.
  void Disconnect(const std::string& run, uint32_t rank, uint64_t stream_id);
  // Heartbeat: last seen = now, and the step the worker is at.
  void Touch(const std::string& run, uint32_t rank, int64_t step);
  // Committed reports: last seen = now, and the rank's last step. The
  // reports themselves are not kept.
  void AddReports(const std::string& run, uint32_t rank,
                  std::span<const spikeguard::v1::StepReport> reports);

  std::vector<spikeguard::v1::RankState> Ranks(const std::string& run) const;
  int ConnectedRanks() const;
  // The furthest step any rank of `run` reached (reports and heartbeats);
  // -1 when none did. O(1): asked for every report batch.
  int64_t LastStep(const std::string& run) const;
  // Whether a rank of `run` other than `rank` is connected (no copies).
  bool OtherRankConnected(const std::string& run, uint32_t rank) const;

  // Runs whose workers were started outside the daemon (they attached to a
  // run still "created"): the daemon ends them when their workers are done.
  void MarkSelfStarted(const std::string& run);
  bool SelfStarted(const std::string& run) const;
  // A rank said its generation ended (end of the training schedule).
  void GenerationEnded(const std::string& run, uint32_t rank, int64_t generation);
  // Whether ranks 0..world_size-1 of `run` all ended `generation` and none
  // is connected any more.
  bool AllRanksDone(const std::string& run, int64_t generation, uint32_t world_size) const;

 private:
  struct Rank {
    bool connected = false;
    uint64_t stream_id = 0;
    int64_t generation = 0;
    int64_t last_step = -1;
    int64_t last_seen_ms = 0;
    std::string host;
  };

  Clock* const clock_;
  mutable absl::Mutex mu_;
  uint64_t next_stream_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, std::map<uint32_t, Rank>> runs_ ABSL_GUARDED_BY(mu_);
  // Max of the ranks' last_step by run (each rank's only grows).
  std::map<std::string, int64_t> last_step_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> self_started_ ABSL_GUARDED_BY(mu_);
  // The generation each rank last said ended, by run.
  std::map<std::string, std::map<uint32_t, int64_t>> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spikeguard::daemon
