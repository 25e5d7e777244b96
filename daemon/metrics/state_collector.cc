#include "daemon/metrics/state_collector.h"

#include <sys/stat.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/control/supervisor.h"
#include "daemon/metrics/registry.h"

namespace spikeguard::metrics {
namespace {

namespace v1 = ::spikeguard::v1;

double FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<double>(st.st_size) : 0;
}

std::string VerdictLabel(v1::Verdict v) {
  std::string name = v1::Verdict_Name(v);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == v1::VERDICT_UNSPECIFIED ? "none" : name;
}

// What the catalog said at one scrape, kept for the refresh interval.
struct CatalogSnapshot {
  bool runs_ok = false;
  struct RunRow {
    std::string name;
    int64_t last_step = 0;
    int64_t generation = 0;
    // The newest committed record of the current generation, if any.
    bool has_record = false;
    double loss = 0, grad_norm = 0, max_logit = 0;
  };
  std::vector<RunRow> runs;
  double rewinds = 0, commands_pending = 0;
  bool incidents_ok = false;
  double opened = 0, open = 0, steps = 0;
  std::map<std::string, double> closed, probes;
  // Precursor warnings: the latest of each (run, signal, layer), and how
  // many each run opened.
  bool warnings_ok = false;
  std::map<std::tuple<std::string, std::string, int>, v1::PrecursorWarning> latest_warning;
  std::map<std::string, double> warnings_opened;
};

// Every catalog read of the collector is here.
std::shared_ptr<const CatalogSnapshot> ReadCatalog(const StateSources& sources) {
  auto snap = std::make_shared<CatalogSnapshot>();
  absl::StatusOr<std::vector<v1::Run>> runs = sources.catalog->ListRuns();
  snap->runs_ok = runs.ok();
  if (!runs.ok()) return snap;
  for (const v1::Run& run : *runs) {
    CatalogSnapshot::RunRow row;
    row.name = run.name();
    row.generation = run.current_generation();
    row.last_step = run.last_step();
    if (auto ranks = sources.catalog->ListRankProgress(run.name()); ranks.ok()) {
      for (const v1::RankState& r : *ranks) {
        if (r.generation() == run.current_generation()) row.last_step = std::max(row.last_step, r.last_step());
      }
    }
    if (auto gens = sources.catalog->ListGenerations(run.name()); gens.ok() && !gens->empty()) {
      snap->rewinds += static_cast<double>(gens->size() - 1);
    }
    for (v1::CommandState st : {v1::COMMAND_PENDING, v1::COMMAND_SENT}) {
      if (auto cmds = sources.catalog->ListCommands(run.name(), st); cmds.ok()) {
        snap->commands_pending += static_cast<double>(cmds->size());
      }
    }
    auto records = sources.catalog->QueryTelemetry(run.name(), run.current_generation(),
                                                  std::max<int64_t>(0, row.last_step), row.last_step, 1);
    if (records.ok() && !records->empty()) {
      const v1::StepRecord& r = records->back();
      row.has_record = true;
      row.loss = r.loss();
      row.grad_norm = r.grad_norm();
      for (const v1::LayerStats& l : r.layers()) row.max_logit = std::max(row.max_logit, l.max_attn_logit());
    }
    snap->runs.push_back(std::move(row));
  }

  if (absl::StatusOr<std::vector<v1::PrecursorWarning>> warnings = sources.catalog->ListWarnings({});
      warnings.ok()) {
    snap->warnings_ok = true;
    std::map<int64_t, v1::PrecursorWarning> live;  // fresher than the stored records
    if (sources.supervisor != nullptr) {
      for (v1::PrecursorWarning& w : sources.supervisor->ActiveWarnings()) live[w.id()] = std::move(w);
    }
    for (v1::PrecursorWarning& w : *warnings) {  // by id: the latest last
      if (auto it = live.find(w.id()); it != live.end() && w.state() == v1::WARNING_ACTIVE) {
        w = it->second;
      }
      snap->warnings_opened[w.run()] += 1;
      snap->latest_warning[{w.run(), w.signal(), w.layer()}] = std::move(w);
    }
  }

  absl::StatusOr<std::vector<v1::Incident>> incidents =
      sources.catalog->ListIncidents(storage::IncidentFilter{});
  snap->incidents_ok = incidents.ok();
  if (!incidents.ok()) return snap;
  for (const char* v : {"transient", "data", "fragility", "numerics", "inconclusive"}) {
    snap->closed[v] = 0;
  }
  for (const v1::Incident& inc : *incidents) {
    if (inc.state() == v1::CLOSED || inc.state() == v1::ABORTED) {
      snap->closed[inc.state() == v1::ABORTED ? "aborted" : VerdictLabel(inc.verdict())] += 1;
    } else {
      snap->open += 1;
    }
    for (const v1::Probe& p : inc.probes()) snap->probes[p.kind().empty() ? "unknown" : p.kind()] += 1;
    snap->steps += static_cast<double>(inc.cost().steps_reexecuted());
  }
  snap->opened = static_cast<double>(incidents->size());
  for (const char* kind : {"replay", "skip", "bisect", "transplant", "fix"}) {
    snap->probes.try_emplace(kind, 0);
  }
  return snap;
}

class StateCollector {
 public:
  StateCollector(Registry* registry, StateSources sources, const StateCollectorOptions& options)
      : sources_(std::move(sources)),
        options_(options),
        reads_(registry->GetCounter(
            "spikeguard_metrics_catalog_reads_total",
            "Catalog snapshots read to answer /metrics scrapes (at most one per refresh interval).")) {}

  void Collect(Sink& sink) {
    const daemon::Counters& c = *sources_.counters;
    sink.Counter("spikeguard_reports_ingested_total", "Step reports accepted and committed.", {},
                 static_cast<double>(c.reports_accepted.load()));
    sink.Counter("spikeguard_reports_duplicate_total",
                 "Step reports at a step the rank had already delivered (ignored).", {},
                 static_cast<double>(c.reports_duplicate.load()));
    sink.Counter("spikeguard_reports_rejected_total", "Step reports refused as invalid.", {},
                 static_cast<double>(c.reports_rejected.load()));
    sink.Counter("spikeguard_reports_dropped_total", "Step reports dropped under overload.", {},
                 static_cast<double>(c.reports_dropped.load()));
    sink.Gauge("spikeguard_uptime_seconds", "Seconds since the daemon started.", {},
               absl::ToDoubleSeconds(sources_.clock->Now() - sources_.started));
    double catalog_bytes = 0;  // a stat, not a query: live
    for (const char* suffix : {"", "-wal", "-shm"}) {
      catalog_bytes += FileBytes(sources_.catalog_path + suffix);
    }
    sink.Gauge("spikeguard_catalog_size_bytes", "Size of the SQLite catalog with its WAL, in bytes.",
               {}, catalog_bytes);

    const std::shared_ptr<const CatalogSnapshot> snap = Snapshot();
    sink.Gauge("spikeguard_catalog_up", "1 when the catalog answered the last read, else 0.", {},
               snap->runs_ok ? 1 : 0);
    if (!snap->runs_ok) return;
    for (const CatalogSnapshot::RunRow& run : snap->runs) {
      const Labels labels = {{"run", run.name}};
      int connected = 0;  // the live rank registry, not the catalog
      for (const v1::RankState& r : sources_.registry->Ranks(run.name)) connected += r.connected();
      sink.Gauge("spikeguard_connected_ranks", "Ranks with an open stream, by run.", labels, connected);
      sink.Gauge("spikeguard_run_last_step", "Last step the run reported.", labels,
                 static_cast<double>(run.last_step));
      sink.Gauge("spikeguard_run_generation", "The run's current generation.", labels,
                 static_cast<double>(run.generation));
      if (run.has_record) {
        sink.Gauge("spikeguard_run_loss", "The run's loss at its last committed step.", labels, run.loss);
        sink.Gauge("spikeguard_run_grad_norm", "The run's global gradient norm (pre-clip) at its last "
                   "committed step.", labels, run.grad_norm);
        sink.Gauge("spikeguard_run_max_attention_logit",
                   "The largest max attention logit over layers at the run's last committed step.",
                   labels, run.max_logit);
      }
    }
    if (snap->warnings_ok) {
      for (const auto& [run, n] : snap->warnings_opened) {
        sink.Counter("spikeguard_precursor_warnings_opened_total",
                     "Precursor warnings opened (a critical precursor that persisted), by run.",
                     {{"run", run}}, n);
      }
      for (const auto& [key, w] : snap->latest_warning) {
        const Labels labels = {{"run", w.run()},
                               {"signal", w.signal()},
                               {"layer", w.layer() >= 0 ? std::to_string(w.layer()) : "run"}};
        sink.Gauge("spikeguard_precursor_warning_active",
                   "1 while the latest precursor warning of the series is active, else 0.", labels,
                   w.state() == v1::WARNING_ACTIVE ? 1 : 0);
        sink.Gauge("spikeguard_precursor_warning_lead_steps",
                   "Steps from the latest precursor warning's onset to its last step seen, or to "
                   "the onset of the incident it preceded.",
                   labels,
                   static_cast<double>(w.state() == v1::WARNING_PRECEDED_INCIDENT
                                           ? w.incident_lead_steps()
                                           : w.lead_steps()));
      }
    }
    sink.Counter("spikeguard_rewinds_total", "Rewinds: generations started after the first.", {},
                 snap->rewinds);
    sink.Gauge("spikeguard_commands_pending", "Commands not yet acknowledged by a worker.", {},
               snap->commands_pending);
    if (!snap->incidents_ok) return;
    sink.Counter("spikeguard_incidents_opened_total", "Incidents opened.", {}, snap->opened);
    for (const auto& [verdict, n] : snap->closed) {
      sink.Counter("spikeguard_incidents_closed_total",
                   "Incidents closed, by verdict (\"aborted\": aborted by an operator).",
                   {{"verdict", verdict}}, n);
    }
    sink.Gauge("spikeguard_incidents_open", "Incidents not closed or aborted.", {}, snap->open);
    for (const auto& [kind, n] : snap->probes) {
      sink.Counter("spikeguard_probes_total", "Probes run by incidents, by kind.", {{"kind", kind}}, n);
    }
    sink.Counter("spikeguard_steps_reexecuted_total", "Training steps re-executed by probes.", {},
                 snap->steps);
  }

 private:
  // The current snapshot, read again once it is older than the refresh
  // interval. Scrapes that arrive while one reads wait for it and share it.
  std::shared_ptr<const CatalogSnapshot> Snapshot() {
    absl::MutexLock lock(&mu_);
    const absl::Time now = sources_.clock->Now();
    // A clock that went back (a test's, or a stepped wall clock) also reads.
    if (snapshot_ == nullptr || now - read_at_ >= options_.catalog_refresh || now < read_at_) {
      snapshot_ = ReadCatalog(sources_);
      read_at_ = now;
      reads_->Inc();
    }
    return snapshot_;
  }

  const StateSources sources_;
  const StateCollectorOptions options_;
  Counter* const reads_;
  absl::Mutex mu_;
  std::shared_ptr<const CatalogSnapshot> snapshot_ ABSL_GUARDED_BY(mu_);
  absl::Time read_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void RegisterStateCollector(Registry* registry, StateSources sources,
                            const StateCollectorOptions& options) {
  // Lives as long as the registry, which holds the collector.
  auto collector = std::make_shared<StateCollector>(registry, std::move(sources), options);
  registry->AddCollector([collector](Sink& sink) { collector->Collect(sink); });
}

}  // namespace spikeguard::metrics
