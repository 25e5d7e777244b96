#include "daemon/metrics/state_collector.h"

#include <sys/stat.h>

#include <map>
#include <string>

#include "daemon/metrics/registry.h"
#include "daemon/server/daemon_state.h"

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

void Collect(daemon::DaemonState* state, Sink& sink) {
  const daemon::Counters& c = state->counters;
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
             absl::ToDoubleSeconds(state->clock->Now() - state->started));
  double catalog_bytes = 0;
  for (const char* suffix : {"", "-wal", "-shm"}) {
    catalog_bytes += FileBytes(state->catalog_path + suffix);
  }
  sink.Gauge("spikeguard_catalog_size_bytes", "Size of the SQLite catalog with its WAL, in bytes.",
             {}, catalog_bytes);

  absl::StatusOr<std::vector<v1::Run>> runs = state->catalog->ListRuns();
  sink.Gauge("spikeguard_catalog_up", "1 when the catalog answered this scrape, else 0.", {},
             runs.ok() ? 1 : 0);
  if (!runs.ok()) return;
  double rewinds = 0, commands_pending = 0;
  for (const v1::Run& run : *runs) {
    const Labels labels = {{"run", run.name()}};
    int connected = 0;
    for (const v1::RankState& r : state->registry.Ranks(run.name())) connected += r.connected();
    sink.Gauge("spikeguard_connected_ranks", "Ranks with an open stream, by run.", labels, connected);
    int64_t last_step = run.last_step();
    if (auto ranks = state->catalog->ListRankProgress(run.name()); ranks.ok()) {
      for (const v1::RankState& r : *ranks) {
        if (r.generation() == run.current_generation()) last_step = std::max(last_step, r.last_step());
      }
    }
    sink.Gauge("spikeguard_run_last_step", "Last step the run reported.", labels,
               static_cast<double>(last_step));
    sink.Gauge("spikeguard_run_generation", "The run's current generation.", labels,
               static_cast<double>(run.current_generation()));
    if (auto gens = state->catalog->ListGenerations(run.name()); gens.ok() && !gens->empty()) {
      rewinds += static_cast<double>(gens->size() - 1);
    }
    for (const char* st : {"pending", "sent"}) {
      if (auto cmds = state->catalog->ListCommands(run.name(), st); cmds.ok()) {
        commands_pending += static_cast<double>(cmds->size());
      }
    }
    // The newest committed record of the current generation.
    auto records = state->catalog->QueryTelemetry(run.name(), run.current_generation(),
                                                  std::max<int64_t>(0, last_step), last_step, 1);
    if (records.ok() && !records->empty()) {
      const v1::StepRecord& r = records->back();
      double max_logit = 0;
      for (const v1::LayerStats& l : r.layers()) max_logit = std::max(max_logit, l.max_attn_logit());
      sink.Gauge("spikeguard_run_loss", "The run's loss at its last committed step.", labels, r.loss());
      sink.Gauge("spikeguard_run_grad_norm", "The run's global gradient norm (pre-clip) at its last "
                 "committed step.", labels, r.grad_norm());
      sink.Gauge("spikeguard_run_max_attention_logit",
                 "The largest max attention logit over layers at the run's last committed step.",
                 labels, max_logit);
    }
  }
  sink.Counter("spikeguard_rewinds_total", "Rewinds: generations started after the first.", {},
               rewinds);
  sink.Gauge("spikeguard_commands_pending", "Commands not yet acknowledged by a worker.", {},
             commands_pending);

  absl::StatusOr<std::vector<v1::Incident>> incidents =
      state->catalog->ListIncidents(storage::IncidentFilter{});
  if (!incidents.ok()) return;
  double open = 0, steps = 0;
  std::map<std::string, double> closed, probes;
  for (const std::string& v : {"transient", "data", "fragility", "numerics", "inconclusive"}) {
    closed[v] = 0;
  }
  for (const v1::Incident& inc : *incidents) {
    if (inc.state() == v1::CLOSED || inc.state() == v1::ABORTED) {
      closed[inc.state() == v1::ABORTED ? "aborted" : VerdictLabel(inc.verdict())] += 1;
    } else {
      open += 1;
    }
    for (const v1::Probe& p : inc.probes()) probes[p.kind().empty() ? "unknown" : p.kind()] += 1;
    steps += static_cast<double>(inc.cost().steps_reexecuted());
  }
  sink.Counter("spikeguard_incidents_opened_total", "Incidents opened.", {},
               static_cast<double>(incidents->size()));
  for (const auto& [verdict, n] : closed) {
    sink.Counter("spikeguard_incidents_closed_total",
                 "Incidents closed, by verdict (\"aborted\": aborted by an operator).",
                 {{"verdict", verdict}}, n);
  }
  sink.Gauge("spikeguard_incidents_open", "Incidents not closed or aborted.", {}, open);
  for (const std::string& kind : {"replay", "skip", "bisect", "transplant", "fix"}) probes.try_emplace(kind, 0);
  for (const auto& [kind, n] : probes) {
    sink.Counter("spikeguard_probes_total", "Probes run by incidents, by kind.", {{"kind", kind}}, n);
  }
  sink.Counter("spikeguard_steps_reexecuted_total", "Training steps re-executed by probes.", {}, steps);
}

}  // namespace

void RegisterStateCollector(daemon::DaemonState* state) {
  state->metrics_registry.AddCollector([state](Sink& sink) { Collect(state, sink); });
}

}  // namespace spikeguard::metrics
