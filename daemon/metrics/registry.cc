#include "daemon/metrics/registry.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace spikeguard::metrics {
namespace {

void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::abs(v) < 1e15) return absl::StrFormat("%.0f", v);
  // The shortest text that reads back as the same double.
  for (int precision = 6; precision < 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(text.c_str(), nullptr) == v) return text;
  }
  return absl::StrFormat("%.17g", v);
}

std::string LabelText(const Labels& labels, const std::string& extra_key = "",
                      const std::string& extra_value = "") {
  if (labels.empty() && extra_key.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    absl::StrAppend(&out, first ? "" : ",", k, "=\"", EscapeLabelValue(v), "\"");
    first = false;
  }
  if (!extra_key.empty()) {
    absl::StrAppend(&out, first ? "" : ",", extra_key, "=\"", extra_value, "\"");
  }
  return out + "}";
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

bool ValidLabelName(const std::string& name) {
  if (name.empty() || absl::StartsWith(name, "__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool ValidLabels(const Labels& labels) {
  for (const auto& [k, v] : labels) {
    if (!ValidLabelName(k) || k == "le") return false;
  }
  return true;
}

}  // namespace

void Counter::Inc(double v) {
  if (!(v > 0)) return;
  AtomicAdd(value_, v);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_([&] {
        std::sort(bounds.begin(), bounds.end());
        bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
        bounds.erase(std::remove_if(bounds.begin(), bounds.end(),
                                    [](double b) { return !std::isfinite(b); }),
                     bounds.end());
        return bounds;
      }()),
      buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

std::vector<double> Histogram::LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,     10};
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

void Sink::Gauge(const std::string& name, const std::string& help, const Labels& labels,
                 double value) {
  samples_.emplace(name, Sample{"gauge", help, labels, value});
}

void Sink::Counter(const std::string& name, const std::string& help, const Labels& labels,
                   double value) {
  samples_.emplace(name, Sample{"counter", help, labels, value});
}

bool Registry::ValidName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

Registry::Family* Registry::FamilyFor(const std::string& name, const std::string& type,
                                      const std::string& help) {
  if (!ValidName(name)) {
    assert(false && "invalid metric name");
    return nullptr;
  }
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  } else if (it->second.type != type) {
    assert(false && "metric registered with another type");
    return nullptr;
  }
  return &it->second;
}

Counter* Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family* f = ValidLabels(labels) ? FamilyFor(name, "counter", help) : nullptr;
  if (f == nullptr) return detached_counters_.emplace_back(std::make_unique<Counter>()).get();
  auto& slot = f->counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family* f = ValidLabels(labels) ? FamilyFor(name, "gauge", help) : nullptr;
  if (f == nullptr) return detached_gauges_.emplace_back(std::make_unique<Gauge>()).get();
  auto& slot = f->gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family* f = ValidLabels(labels) ? FamilyFor(name, "histogram", help) : nullptr;
  if (f == nullptr) {
    return detached_histograms_.emplace_back(std::make_unique<Histogram>(bounds)).get();
  }
  auto& slot = f->histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return slot.get();
}

void Registry::AddCollector(std::function<void(Sink&)> collector) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::string Registry::Render(const SeriesFilter& show) const {
  std::vector<std::function<void(Sink&)>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  Sink sink;
  for (const auto& c : collectors) c(sink);

  // name -> (type, help, lines)
  std::map<std::string, std::tuple<std::string, std::string, std::vector<std::string>>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, f] : families_) {
      auto& [type, help, lines] = out[name];
      type = f.type;
      help = f.help;
      for (const auto& [labels, c] : f.counters) {
        if (show && !show(labels)) continue;
        lines.push_back(absl::StrCat(name, LabelText(labels), " ", FormatValue(c->Value())));
      }
      for (const auto& [labels, g] : f.gauges) {
        if (show && !show(labels)) continue;
        lines.push_back(absl::StrCat(name, LabelText(labels), " ", FormatValue(g->Value())));
      }
      for (const auto& [labels, h] : f.histograms) {
        if (show && !show(labels)) continue;
        const Histogram::Snapshot s = h->Take();
        for (size_t i = 0; i < s.bounds.size(); ++i) {
          lines.push_back(absl::StrCat(name, "_bucket", LabelText(labels, "le", FormatValue(s.bounds[i])),
                                       " ", s.cumulative[i]));
        }
        lines.push_back(absl::StrCat(name, "_bucket", LabelText(labels, "le", "+Inf"), " ", s.count));
        lines.push_back(absl::StrCat(name, "_sum", LabelText(labels), " ", FormatValue(s.sum)));
        lines.push_back(absl::StrCat(name, "_count", LabelText(labels), " ", s.count));
      }
    }
  }
  for (const auto& [name, sample] : sink.samples_) {
    if (!ValidName(name) || !ValidLabels(sample.labels)) continue;
    if (show && !show(sample.labels)) continue;
    auto it = out.find(name);
    if (it == out.end()) {
      it = out.emplace(name, std::make_tuple(sample.type, sample.help, std::vector<std::string>{})).first;
    } else if (std::get<0>(it->second) != sample.type) {
      continue;  // the registered family's type wins
    }
    std::get<2>(it->second)
        .push_back(absl::StrCat(name, LabelText(sample.labels), " ", FormatValue(sample.value)));
  }
  std::string text;
  for (const auto& [name, family] : out) {
    const auto& [type, help, lines] = family;
    absl::StrAppend(&text, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type, "\n");
    for (const std::string& l : lines) absl::StrAppend(&text, l, "\n");
  }
  return text;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace spikeguard::metrics
