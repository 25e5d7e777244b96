// stream_hub.h
// -----------------------------------------------------------------------------
// The live WorkerService streams, so that commands can be pushed to the ranks
// of a run from outside the stream's own thread. Each stream registers a
// write function that serializes its writes (gRPC allows one writer at a time
// and a concurrent reader); WorkerService's queues the message for the
// stream's own sender, so a stalled rank does not hold up the caller.
//
//   uint64_t id = hub.Add("gpt", [&](const ControllerMessage& m) {
//     absl::MutexLock l(&write_mu); return stream->Write(m); });
//   hub.SendToRun("gpt", command_message);
//   hub.Remove(id);
//
// The streams are kept in a LiveStreams (live_streams.h), the registry the
// incident watchers share.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "daemon/control/live_streams.h"
#include "spikeguard/v1/worker.pb.h"

namespace spikeguard::daemon {

class StreamHub {
 public:
  using WriteFn = std::function<bool(const spikeguard::v1::ControllerMessage&)>;

  // `run`: the stream's run, after its hello (never "").
  uint64_t Add(const std::string& run, WriteFn write) {
    return streams_.Add(run, std::make_shared<WriteFn>(std::move(write)));
  }
  void Remove(uint64_t id) { streams_.Remove(id); }
  // Hands `message` to every live stream of `run`, outside the hub's lock
  // (each stream serializes its own writes); returns how many took it.
  int SendToRun(const std::string& run, const spikeguard::v1::ControllerMessage& message) {
    int sent = 0;
    for (const auto& write : streams_.For(run)) sent += (*write)(message) ? 1 : 0;
    return sent;
  }

 private:
  LiveStreams<WriteFn> streams_;
};

}  // namespace spikeguard::daemon
