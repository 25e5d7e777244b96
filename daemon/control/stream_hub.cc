#include "daemon/control/stream_hub.h"

namespace spikeguard::daemon {

uint64_t StreamHub::Add(const std::string& run, uint32_t rank, int64_t generation, WriteFn write) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  streams_[id] = Entry{run, rank, generation, std::move(write)};
  return id;
}

void StreamHub::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  streams_.erase(id);
}

int StreamHub::SendToRun(const std::string& run, const spikeguard::v1::ControllerMessage& message) {
  std::vector<WriteFn> targets;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : streams_) {
      if (e.run == run) targets.push_back(e.write);
    }
  }
  // Writes happen outside the hub's lock; each stream serializes its own.
  int sent = 0;
  for (auto& write : targets) sent += write(message) ? 1 : 0;
  return sent;
}

}  // namespace spikeguard::daemon
