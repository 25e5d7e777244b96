// registry.h
// -----------------------------------------------------------------------------
// A small metrics registry for the daemon's /metrics endpoint: counters,
// gauges and histograms, thread-safe, rendered in the Prometheus text
// exposition format (version 0.0.4).
//
//   metrics::Registry registry;
//   metrics::Counter* batches = registry.GetCounter(
//       "spikeguard_batches_committed_total", "Telemetry batches committed");
//   batches->Inc();                                  // lock-free
//   metrics::Histogram* lat = registry.GetHistogram(
//       "spikeguard_commit_latency_seconds", "Group commit latency",
//       metrics::Histogram::LatencyBuckets());
//   lat->Observe(0.004);                             // seconds
//   registry.AddCollector([&](metrics::Sink& sink) { // computed at scrape time
//     sink.Gauge("spikeguard_run_last_step", "Last step", {{"run", "demo"}}, 812);
//   });
//   std::string text = registry.Render();
//
// Get* returns the same object for the same name and labels (cache the
// pointer on hot paths: the lookup takes a mutex; Inc/Set/Observe do not).
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; a name registered with another
// type, or an invalid name, aborts in debug builds and returns a detached
// metric (counted nowhere) otherwise. Label values are escaped on output.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace spikeguard::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(double v = 1);  // v < 0 is ignored: counters only go up
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: increasing upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // 100 µs .. 10 s, for latencies in seconds.
  static std::vector<double> LatencyBuckets();

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Take() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// What a collector writes at scrape time.
class Sink {
 public:
  void Gauge(const std::string& name, const std::string& help, const Labels& labels, double value);
  void Counter(const std::string& name, const std::string& help, const Labels& labels, double value);

 private:
  friend class Registry;
  struct Sample {
    std::string type, help;
    Labels labels;
    double value;
  };
  std::multimap<std::string, Sample> samples_;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // Runs at every Render(), outside the registry's lock.
  void AddCollector(std::function<void(Sink&)> collector);

  // The text exposition: # HELP and # TYPE once per family, families sorted
  // by name. `show`, when given, picks the series included (by their
  // labels): what a scrape of a principal scoped to some runs may read.
  using SeriesFilter = std::function<bool(const Labels&)>;
  std::string Render(const SeriesFilter& show = nullptr) const;

  static bool ValidName(const std::string& name);

 private:
  struct Family {
    std::string type, help;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };
  Family* FamilyFor(const std::string& name, const std::string& type, const std::string& help)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(Sink&)>> collectors_ ABSL_GUARDED_BY(mu_);
  // Handed out when a name is invalid or taken by another type.
  std::vector<std::unique_ptr<Counter>> detached_counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Gauge>> detached_gauges_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Histogram>> detached_histograms_ ABSL_GUARDED_BY(mu_);
};

// Escapes a label value: backslash, double quote and newline.
std::string EscapeLabelValue(const std::string& value);

}  // namespace spikeguard::metrics
