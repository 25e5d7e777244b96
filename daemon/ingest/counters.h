// counters.h
// -----------------------------------------------------------------------------
// What ingest did with the reports it was sent, since the daemon started:
// counted by the worker sessions, exported at scrape time
// (daemon/metrics/state_collector.h) and in the operator's status.
#pragma once

#include <atomic>
#include <cstdint>

namespace spikeguard::daemon {

struct Counters {
  std::atomic<int64_t> reports_accepted{0};
  std::atomic<int64_t> reports_duplicate{0};
  std::atomic<int64_t> reports_rejected{0};
  std::atomic<int64_t> reports_dropped{0};
};

}  // namespace spikeguard::daemon
