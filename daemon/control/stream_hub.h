// stream_hub.h
// -----------------------------------------------------------------------------
// The live WorkerService streams, so that commands can be pushed to the ranks
// of a run from outside the stream's own thread. Each stream registers a
// write function that serializes its writes (gRPC allows one writer at a time
// and a concurrent reader); WorkerService's queues the message for the
// stream's own sender, so a stalled rank does not hold up the caller.
//
//   uint64_t id = hub.Add("gpt", rank, generation, [&](const ControllerMessage& m) {
//     absl::MutexLock l(&write_mu); return stream->Write(m); });
//   hub.SendToRun("gpt", command_message);
//   hub.Remove(id);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "spikeguard/v1/worker.pb.h"

namespace spikeguard::daemon {

class StreamHub {
 public:
  using WriteFn = std::function<bool(const spikeguard::v1::ControllerMessage&)>;

  uint64_t Add(const std::string& run, uint32_t rank, int64_t generation, WriteFn write);
  void Remove(uint64_t id);
  // Hands `message` to every live stream of `run`, outside the hub's lock;
  // returns how many took it.
  int SendToRun(const std::string& run, const spikeguard::v1::ControllerMessage& message);

 private:
  struct Entry {
    std::string run;
    uint32_t rank = 0;
    int64_t generation = 0;
    WriteFn write;
  };
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spikeguard::daemon
