#include "report/incident_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "report/html.h"
#include "report/svg_plot.h"
#include "proto/state_names.h"

namespace spikeguard::report {
namespace {

namespace v1 = ::spikeguard::v1;

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

std::string E(absl::string_view s) { return HtmlEscape(s); }

std::string TimeText(int64_t unix_ms) {
  if (unix_ms <= 0) return "—";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

std::string PlanText(const v1::DataPlan& plan) {
  if (plan.ranges_size() == 0) return "[0, ∞)";
  std::vector<std::string> parts;
  for (const v1::DataRange& r : plan.ranges()) {
    parts.push_back(absl::StrCat("[", r.begin(), ", ", r.end() < 0 ? "∞" : absl::StrCat(r.end()), ")"));
  }
  std::string text = absl::StrJoin(parts, " ");
  if (plan.masks_size() > 0) absl::StrAppend(&text, " + ", plan.masks_size(), " masked position(s)");
  return text;
}

// The holes of a plan: position ranges [a, b) it leaves out between its ranges.
std::vector<std::pair<int64_t, int64_t>> PlanHoles(const v1::DataPlan& plan) {
  std::vector<std::pair<int64_t, int64_t>> holes;
  for (int i = 0; i + 1 < plan.ranges_size(); ++i) {
    const int64_t end = plan.ranges(i).end();
    const int64_t next = plan.ranges(i + 1).begin();
    if (end >= 0 && next > end) holes.emplace_back(end, next);
  }
  return holes;
}

struct GenerationLabel {
  std::string label;
  std::string color;
  bool original = false;
};

// One label and color per plotted generation: the original first.
std::map<int64_t, GenerationLabel> LabelGenerations(const ReportData& data) {
  std::map<int64_t, GenerationLabel> labels;
  const v1::Incident& inc = data.incident;
  labels[inc.generation()] = {absl::StrCat("original (gen ", inc.generation(), ")"), "#222222", true};
  std::map<std::string, int> seen;
  size_t color = 0;
  for (const v1::Probe& p : inc.probes()) {
    if (labels.count(p.generation())) continue;
    const int n = ++seen[p.kind()];
    int total = 0;
    for (const v1::Probe& q : inc.probes()) total += q.kind() == p.kind();
    const std::string kind = p.kind().empty() ? "probe" : p.kind();
    labels[p.generation()] = {
        total > 1 ? absl::StrCat(kind, " #", n, " (gen ", p.generation(), ")")
                  : absl::StrCat(kind, " (gen ", p.generation(), ")"),
        PaletteColor(color++), false};
  }
  return labels;
}

// data_position -> step in the original generation's records.
int64_t PositionToStep(const ReportData& data, int64_t position, bool* exact) {
  auto it = data.telemetry.find(data.incident.generation());
  if (it != data.telemetry.end()) {
    for (const v1::StepRecord& r : it->second) {
      if (r.data_position() == position) {
        *exact = true;
        return r.step();
      }
    }
  }
  *exact = false;
  return position;  // the default plan: step s consumes position s
}

using Extract = double (*)(const v1::StepRecord&);

Plot ScalarPlot(const ReportData& data, const std::map<int64_t, GenerationLabel>& labels,
                const std::string& title, const std::string& y_label, Extract extract) {
  Plot plot;
  plot.title = title;
  plot.y_label = y_label;
  for (const auto& [gen, label] : labels) {
    auto it = data.telemetry.find(gen);
    if (it == data.telemetry.end()) continue;
    Series s{label.label, {}, label.color, !label.original, label.original ? 2.2 : 1.6};
    for (const v1::StepRecord& r : it->second) {
      s.points.emplace_back(static_cast<double>(r.step()), extract(r));
    }
    plot.series.push_back(std::move(s));
  }
  return plot;
}

Plot ClipRatePlot(const ReportData& data, const std::map<int64_t, GenerationLabel>& labels) {
  constexpr int kWindow = 10;
  Plot plot;
  plot.title = "clip rate (trailing 10 steps)";
  plot.y_label = "fraction of steps clipped";
  plot.scale = YScale::kLinear;
  plot.y_min = 0;
  plot.y_max = 1;
  for (const auto& [gen, label] : labels) {
    auto it = data.telemetry.find(gen);
    if (it == data.telemetry.end()) continue;
    Series s{label.label, {}, label.color, !label.original, label.original ? 2.2 : 1.6};
    const auto& rs = it->second;
    int clipped = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      clipped += rs[i].clipped();
      if (i >= kWindow) clipped -= rs[i - kWindow].clipped();
      const int n = static_cast<int>(std::min<size_t>(i + 1, kWindow));
      s.points.emplace_back(static_cast<double>(rs[i].step()), static_cast<double>(clipped) / n);
    }
    plot.series.push_back(std::move(s));
  }
  return plot;
}

using LayerExtract = double (*)(const v1::LayerStats&);

// The original's other layers in a per-layer plot: drawn first, under the rest.
constexpr char kContextColor[] = "#b8b8b8";

// The layer every generation is compared on in a per-layer plot.
//
// Choice: each probe is drawn on the SAME layer as the original's
// highlighted line, not as a max over layers (a max can switch layers from
// step to step and then compares a probe with no line of the original), and
// not every layer of every probe (4 layers x 7 probes is unreadable). The
// layer is the one the localization says moved first: that is the layer an
// operator reads the incident by ("layer 2 moved first"), so the plot
// answers "did the probe's layer 2 climb like the original's?". Without a
// per-layer localization (layer -1: the first mover was a global signal, or
// none), it is the layer where the original reached its largest value of
// this plot's metric in the window, the hottest one. The original keeps
// every layer: the focus layer solid black and thick like the original in
// the other plots, the rest thin grey context lines under one legend entry.
struct FocusLayer {
  uint32_t layer = 0;
  bool localized = false;  // from the localization, else the hottest layer
  bool found = false;      // the original has records of that layer
};

FocusLayer ChooseFocusLayer(const ReportData& data, LayerExtract extract) {
  FocusLayer focus;
  auto it = data.telemetry.find(data.incident.generation());
  if (it == data.telemetry.end()) return focus;
  const v1::Localization& loc = data.incident.localization();
  if (!loc.signal().empty() && loc.layer() >= 0) {
    for (const v1::StepRecord& r : it->second) {
      for (const v1::LayerStats& l : r.layers()) {
        if (l.layer() == static_cast<uint32_t>(loc.layer())) {
          focus.layer = l.layer();
          focus.localized = focus.found = true;
          return focus;
        }
      }
    }
  }
  double best = -std::numeric_limits<double>::infinity();
  for (const v1::StepRecord& r : it->second) {
    for (const v1::LayerStats& l : r.layers()) {
      const double v = extract(l);
      if (std::isfinite(v) && (!focus.found || v > best)) {
        best = v;
        focus.layer = l.layer();
        focus.found = true;
      }
    }
  }
  return focus;
}

Plot LayerPlot(const ReportData& data, const std::map<int64_t, GenerationLabel>& labels,
               const std::string& title, const std::string& y_label, LayerExtract extract) {
  Plot plot;
  plot.title = title;
  plot.y_label = y_label;
  const FocusLayer focus = ChooseFocusLayer(data, extract);
  if (!focus.found) return plot;  // no per-layer telemetry: the plot says "no data"
  const std::string why = focus.localized ? "moved first" : "largest";
  plot.title = absl::StrCat(title, " — probes on layer ", focus.layer, " (", why, ")");
  const auto layer_series = [&](const std::vector<v1::StepRecord>& records, uint32_t layer) {
    std::vector<std::pair<double, double>> points;
    for (const v1::StepRecord& r : records) {
      for (const v1::LayerStats& l : r.layers()) {
        if (l.layer() == layer) points.emplace_back(static_cast<double>(r.step()), extract(l));
      }
    }
    return points;
  };
  const std::vector<v1::StepRecord>& original = data.telemetry.at(data.incident.generation());
  std::set<uint32_t> others;
  for (const v1::StepRecord& r : original) {
    for (const v1::LayerStats& l : r.layers()) {
      if (l.layer() != focus.layer) others.insert(l.layer());
    }
  }
  bool first_other = true;
  for (uint32_t layer : others) {
    Series s{absl::StrCat("layer ", layer, ", original"), layer_series(original, layer), kContextColor,
             false, 1.0};
    // One legend entry for all the context lines (a 32-layer model would
    // fill the legend otherwise); each line keeps its name in its tooltip.
    if (first_other) {
      s.name = others.size() == 1 ? absl::StrCat("layer ", layer, ", original")
                                  : absl::StrCat("other layers (", others.size(), "), original");
    }
    s.in_legend = first_other;
    first_other = false;
    plot.series.push_back(std::move(s));
  }
  plot.series.push_back(Series{absl::StrCat("layer ", focus.layer, ", original (", why, ")"),
                               layer_series(original, focus.layer), "#222222", false, 2.2});
  for (const auto& [gen, label] : labels) {
    if (label.original) continue;
    auto it = data.telemetry.find(gen);
    if (it == data.telemetry.end()) continue;
    plot.series.push_back(Series{absl::StrCat(label.label, ", layer ", focus.layer),
                                 layer_series(it->second, focus.layer), label.color, true, 1.8});
  }
  return plot;
}

// The original generation's line goes on top of the probes' (a bit-exact
// replay would hide it otherwise), the grey context layers under both; the
// legend keeps the original first.
void OriginalOnTop(Plot* plot) {
  const auto rank = [](const Series& s) { return s.color == kContextColor ? 0 : s.dashed ? 1 : 2; };
  std::stable_sort(plot->series.begin(), plot->series.end(),
                   [&](const Series& a, const Series& b) { return rank(a) < rank(b); });
}

void AddMarkers(const ReportData& data, Plot* plot, int64_t from, int64_t to) {
  const v1::Incident& inc = data.incident;
  plot->x_min = static_cast<double>(from);
  plot->x_max = static_cast<double>(to);
  std::set<int64_t> checkpoints;
  for (const v1::Probe& p : inc.probes()) checkpoints.insert(p.checkpoint_step());
  for (int64_t c : checkpoints) {
    plot->markers.push_back({static_cast<double>(c), absl::StrCat("rewind checkpoint (step ", c, ")"),
                             "#7f7f7f", true});
  }
  if (inc.precursor_onset_step() > 0 || !inc.precursor().empty()) {
    plot->markers.push_back({static_cast<double>(inc.precursor_onset_step()),
                             absl::StrCat("precursor onset (step ", inc.precursor_onset_step(), ")"),
                             "#ff7f0e", true});
  }
  plot->markers.push_back({static_cast<double>(inc.onset_step()),
                           absl::StrCat("spike onset (step ", inc.onset_step(), ")"), "#d62728", true});
  plot->markers.push_back({static_cast<double>(inc.peak_step()),
                           absl::StrCat("peak (step ", inc.peak_step(), ")"), "#8b0000", false});
  for (const v1::Probe& p : inc.probes()) {
    if (p.kind() != "skip") continue;
    for (const auto& [a, b] : PlanHoles(p.data_plan())) {
      bool exact_a = false, exact_b = false;
      const int64_t sa = PositionToStep(data, a, &exact_a);
      const int64_t sb = PositionToStep(data, b - 1, &exact_b);
      plot->spans.push_back({static_cast<double>(sa) - 0.5, static_cast<double>(sb) + 0.5,
                             absl::StrCat("skip hole (steps ", sa, "–", sb, ")"), "#ffbf00"});
    }
  }
  for (int64_t pos : inc.culprit_positions()) {
    bool exact = false;
    const int64_t step = PositionToStep(data, pos, &exact);
    plot->spans.push_back({static_cast<double>(step) - 0.5, static_cast<double>(step) + 0.5,
                           absl::StrCat("culprit batch (step ", step, ", position ", pos, ")"),
                           "#d62728"});
  }
}

std::string Row(std::initializer_list<std::string> cells, bool header = false) {
  std::string row = "<tr>";
  for (const std::string& c : cells) absl::StrAppend(&row, header ? "<th>" : "<td>", c, header ? "</th>" : "</td>");
  return row + "</tr>\n";
}

std::string VerdictName(v1::Verdict v) {
  const std::string name = v1::Verdict_Name(v);
  return v == v1::VERDICT_UNSPECIFIED ? "none yet" : name;
}

constexpr absl::string_view kCss = R"css(
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 17px; border-bottom: 1px solid #ddd; padding-bottom: 3px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.sg-verdict { display: inline-block; padding: 4px 10px; border-radius: 4px; color: #fff; font-weight: bold; }
.v-DATA { background: #d62728; } .v-FRAGILITY { background: #9467bd; } .v-NUMERICS { background: #8c564b; }
.v-TRANSIENT { background: #2ca02c; } .v-INCONCLUSIVE, .v-none { background: #7f7f7f; }
.sg-plot { display: block; margin: 10px 0; border: 1px solid #eee; }
pre.sg-bytes { white-space: pre-wrap; word-break: break-all; background: #f7f7f7; padding: 4px; margin: 0; font-size: 12px; max-width: 640px; }
.sg-warn { color: #a15c00; }
)css";

}  // namespace

void ChooseWindow(const v1::Incident& incident, int64_t* from, int64_t* to) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::max(incident.peak_step(), incident.onset_step());
  for (const v1::Probe& p : incident.probes()) {
    lo = std::min(lo, p.checkpoint_step());
    hi = std::max(hi, p.horizon_step());
  }
  if (lo == std::numeric_limits<int64_t>::max()) {
    int64_t onset = incident.onset_step();
    if (incident.precursor_onset_step() > 0) onset = std::min(onset, incident.precursor_onset_step());
    lo = std::max<int64_t>(0, onset - 100);
    hi = std::max(hi, incident.peak_step() + 50);
  }
  hi += std::max<int64_t>(5, (hi - lo) / 20);
  *from = std::max<int64_t>(0, lo);
  *to = hi;
}

absl::StatusOr<ReportData> FetchReportData(v1::SupervisorService::StubInterface* stub,
                                           const PrepareContext& prepare, int64_t incident_id) {
  ReportData data;
  {
    grpc::ClientContext ctx;
    prepare(&ctx);
    v1::GetIncidentRequest req;
    req.set_id(incident_id);
    grpc::Status s = stub->GetIncident(&ctx, req, &data.incident);
    if (!s.ok()) return FromGrpc(s);
  }
  {
    grpc::ClientContext ctx;
    prepare(&ctx);
    v1::GetRunRequest req;
    req.set_name(data.incident.run());
    grpc::Status s = stub->GetRun(&ctx, req, &data.run);
    if (!s.ok()) data.warnings.push_back(absl::StrCat("run not read: ", s.error_message()));
  }
  ChooseWindow(data.incident, &data.window_from, &data.window_to);
  std::set<int64_t> gens = {data.incident.generation()};
  for (const v1::Probe& p : data.incident.probes()) gens.insert(p.generation());
  constexpr size_t kMaxRecords = 20000;  // per generation
  for (int64_t gen : gens) {
    std::vector<v1::StepRecord>& records = data.telemetry[gen];
    v1::QueryTelemetryRequest req;
    req.set_run(data.incident.run());
    req.set_generation(gen);
    req.set_from_step(data.window_from);
    req.set_to_step(data.window_to);
    while (records.size() < kMaxRecords) {
      grpc::ClientContext ctx;
      prepare(&ctx);
      v1::QueryTelemetryResponse page;
      grpc::Status s = stub->QueryTelemetry(&ctx, req, &page);
      if (!s.ok()) {
        data.warnings.push_back(
            absl::StrCat("telemetry of generation ", gen, " not read: ", s.error_message()));
        break;
      }
      for (v1::StepRecord& r : *page.mutable_records()) records.push_back(std::move(r));
      if (!page.truncated() || page.next_from_step() <= req.from_step()) break;
      req.set_from_step(page.next_from_step());
    }
  }
  return data;
}

std::vector<Plot> IncidentPlots(const ReportData& data) {
  const v1::Incident& inc = data.incident;
  const auto labels = LabelGenerations(data);
  std::vector<Plot> plots;
  plots.push_back(ScalarPlot(data, labels, "loss", "loss (nats/token)",
                             [](const v1::StepRecord& r) { return r.loss(); }));
  plots.push_back(ScalarPlot(data, labels, "gradient norm (pre-clip)", "L2 norm",
                             [](const v1::StepRecord& r) { return r.grad_norm(); }));
  plots.push_back(ClipRatePlot(data, labels));
  plots.push_back(ScalarPlot(data, labels, "output log-sum-exp (max)", "lse (nats)",
                             [](const v1::StepRecord& r) { return r.lse_max(); }));
  plots.push_back(LayerPlot(data, labels, "max attention logit per layer", "logit (q·k/√d)",
                            [](const v1::LayerStats& l) { return l.max_attn_logit(); }));
  plots.push_back(LayerPlot(data, labels, "update-to-weight ratio per layer", "‖Δw‖ / ‖w‖",
                            [](const v1::LayerStats& l) { return l.update_ratio(); }));
  plots.push_back(LayerPlot(data, labels, "activation RMS per layer", "RMS (residual stream)",
                            [](const v1::LayerStats& l) { return l.act_rms(); }));
  // The loss again, zoomed on the spike: where the probes part ways.
  Plot zoom = ScalarPlot(data, labels, "loss around the spike (zoom)", "loss (nats/token)",
                         [](const v1::StepRecord& r) { return r.loss(); });
  const int64_t zoom_from = std::max(data.window_from, inc.onset_step() - 15);
  const int64_t zoom_to = std::min(data.window_to, std::max(inc.peak_step(), inc.onset_step()) + 15);
  for (Series& s : zoom.series) {
    std::erase_if(s.points, [&](const std::pair<double, double>& p) {
      return p.first < zoom_from || p.first > zoom_to;
    });
  }
  zoom.css_class = "sg-plot sg-zoom";
  AddMarkers(data, &zoom, zoom_from, zoom_to);
  OriginalOnTop(&zoom);
  for (Plot& p : plots) {
    AddMarkers(data, &p, data.window_from, data.window_to);
    OriginalOnTop(&p);
  }
  plots.insert(plots.begin(), std::move(zoom));
  return plots;
}

std::string RenderIncidentBody(const ReportData& data) {
  const v1::Incident& inc = data.incident;
  std::string b;
  const std::string verdict = VerdictName(inc.verdict());
  absl::StrAppend(&b, "<h1>Incident ", inc.id(), " — run <span class=\"sg-run\">", E(inc.run()),
                  "</span></h1>\n");
  absl::StrAppend(&b, "<p><span class=\"sg-verdict v-",
                  inc.verdict() == v1::VERDICT_UNSPECIFIED ? "none" : verdict, "\" id=\"verdict\">",
                  E(verdict), "</span> confidence <b id=\"confidence\">",
                  absl::StrFormat("%.0f%%", inc.confidence() * 100), "</b> · state <b>",
                  E(v1::IncidentState_Name(inc.state())), "</b> · trigger <b>", E(inc.trigger()),
                  "</b></p>\n");
  if (!inc.note().empty()) absl::StrAppend(&b, "<p>Note: ", E(inc.note()), "</p>\n");
  for (const std::string& w : data.warnings) {
    absl::StrAppend(&b, "<p class=\"sg-warn\">", E(w), "</p>\n");
  }

  absl::StrAppend(&b, "<h2>Summary</h2>\n<table>\n");
  b += Row({"spike onset", absl::StrCat("step ", inc.onset_step())});
  b += Row({"peak", absl::StrFormat("step %d, value %.6g (baseline %.6g)", inc.peak_step(),
                                    inc.peak_value(), inc.baseline_value())});
  b += Row({"precursor", inc.precursor().empty()
                             ? "none"
                             : absl::StrCat(E(inc.precursor()), ", from step ", inc.precursor_onset_step())});
  b += Row({"generation", absl::StrCat(inc.generation(), inc.has_continued_generation()
                                                          ? absl::StrCat("; continued on generation ",
                                                                         inc.continued_generation())
                                                          : "")});
  if (!data.run.name().empty()) {
    b += Row({"run", absl::StrCat(E(data.run.name()), ": ", E(std::string(RunStateName(data.run.state()))), ", world size ",
                                  data.run.world_size(), ", mode ", E(v1::Mode_Name(data.run.mode())))});
  }
  b += Row({"opened", E(TimeText(inc.opened_unix_ms()))});
  b += Row({"closed", E(TimeText(inc.closed_unix_ms()))});
  b += Row({"plotted window", absl::StrCat("steps ", data.window_from, "–", data.window_to)});
  absl::StrAppend(&b, "</table>\n");

  // Plots.
  absl::StrAppend(&b, "<h2>Telemetry: original and probes overlaid</h2>\n");
  absl::StrAppend(&b, "<p>Solid black: the original generation; dashed: each probe's generation. "
                      "Vertical lines: rewind checkpoint, precursor onset, spike onset, peak; shaded: "
                      "the skip hole (amber) and the culprit batch (red). Per-layer plots: the original's "
                      "layer that moved first (or, without a localization, its largest) in black, its "
                      "other layers in grey, and every probe on that same layer.</p>\n");
  for (const Plot& p : IncidentPlots(data)) b += RenderSvg(p);

  // Evidence.
  absl::StrAppend(&b, "<h2>Evidence: probes</h2>\n<table id=\"evidence\">\n");
  b += Row({"#", "kind", "generation", "checkpoint", "data plan", "horizon", "outcome", "steps run",
            "wall time", "detail"},
           true);
  int n = 0;
  for (const v1::Probe& p : inc.probes()) {
    const double secs = p.finished_unix_ms() > p.started_unix_ms()
                            ? (p.finished_unix_ms() - p.started_unix_ms()) / 1000.0
                            : 0;
    b += Row({absl::StrCat(++n), E(p.kind()), absl::StrCat(p.generation()),
              absl::StrCat("step ", p.checkpoint_step()), E(PlanText(p.data_plan())),
              absl::StrCat(p.horizon_step()), absl::StrCat("<b>", E(p.outcome()), "</b>"),
              absl::StrCat(p.steps_executed()), secs > 0 ? absl::StrFormat("%.1f s", secs) : "—",
              E(p.detail())});
  }
  if (inc.probes_size() == 0) b += Row({"—", "no probes run", "", "", "", "", "", "", "", ""});
  absl::StrAppend(&b, "</table>\n");

  // Localization.
  absl::StrAppend(&b, "<h2>Localization</h2>\n");
  if (inc.localization().signal().empty()) {
    absl::StrAppend(&b, "<p>No layer left its baseline before the spike.</p>\n");
  } else {
    // Layer -1: the first mover was a global signal (loss, lse, ...).
    absl::StrAppend(&b, "<p id=\"localization\">First to move: <b>",
                    inc.localization().layer() >= 0
                        ? absl::StrCat("layer ", inc.localization().layer())
                        : std::string("no single layer"),
                    "</b>, signal <b>", E(inc.localization().signal()), "</b>, from step ",
                    inc.localization().start_step(), ".</p>\n");
    if (inc.localization().ordered_size() > 0) {
      absl::StrAppend(&b, "<ol>");
      for (const std::string& o : inc.localization().ordered()) absl::StrAppend(&b, "<li>", E(o), "</li>");
      absl::StrAppend(&b, "</ol>\n");
    }
  }

  // Documents.
  absl::StrAppend(&b, "<h2>Culprit documents</h2>\n");
  if (inc.culprit_positions_size() > 0) {
    std::vector<std::string> pos;
    for (int64_t p : inc.culprit_positions()) pos.push_back(absl::StrCat(p));
    absl::StrAppend(&b, "<p>Culprit batch data position(s): <b id=\"culprit-positions\">",
                    absl::StrJoin(pos, ", "), "</b></p>\n");
  }
  absl::StrAppend(&b, "<table id=\"culprits\">\n");
  b += Row({"domain", "document", "data position", "step", "bytes (escaped preview)"}, true);
  for (const v1::DocumentRef& d : inc.documents()) {
    // The daemon sends the first bytes of spikeguard-corpus documents; a
    // trainer's own documents come without.
    b += Row({E(d.domain()), absl::StrCat(d.document_id()), absl::StrCat(d.data_position()),
              absl::StrCat(d.step()),
              absl::StrCat("<pre class=\"sg-bytes\">",
                           d.preview().empty() ? "—" : E(BytePreview(d.preview(), 256)), "</pre>")});
  }
  if (inc.documents_size() == 0) b += Row({"—", "none named", "", "", ""});
  absl::StrAppend(&b, "</table>\n");
  if (inc.near_duplicates_size() > 0) {
    absl::StrAppend(&b, "<h3>Near-duplicates elsewhere in the corpus</h3>\n<table id=\"near-duplicates\">\n");
    b += Row({"domain", "document", "similarity", "similar to"}, true);
    for (const v1::NearDuplicate& d : inc.near_duplicates()) {
      b += Row({E(d.domain()), absl::StrCat(d.document_id()), absl::StrFormat("%.2f", d.similarity()),
                absl::StrCat(E(d.similar_to_domain()), ":", d.similar_to_document_id())});
    }
    absl::StrAppend(&b, "</table>\n");
  }
  if (inc.suspects_size() > 0) {
    absl::StrAppend(&b, "<p>Rest of the skip window (fed without a spike; listed, not quarantined): ");
    std::vector<std::string> s;
    for (const v1::DocumentRef& d : inc.suspects()) s.push_back(absl::StrCat(E(d.domain()), ":", d.document_id()));
    absl::StrAppend(&b, absl::StrJoin(s, ", "), "</p>\n");
  }

  // Fix and verification.
  absl::StrAppend(&b, "<h2>Fix and verification</h2>\n<p id=\"fix\">Fix applied: <b>",
                  inc.fix().empty() ? "none" : E(inc.fix()), "</b></p>\n");
  bool verified = false;
  for (const v1::Probe& p : inc.probes()) {
    if (p.kind() != "fix") continue;
    verified = true;
    absl::StrAppend(&b, "<p>Verification over generation ", p.generation(), " to step ", p.horizon_step(),
                    ": <b>", E(p.outcome()), "</b>", p.detail().empty() ? "" : " — ",
                    E(p.detail()), "</p>\n");
  }
  if (!verified && inc.has_continued_generation()) {
    absl::StrAppend(&b, "<p>The run went on from generation ", inc.continued_generation(),
                    " (its probe ran clean past the spike).</p>\n");
  }
  if (inc.recommendations_size() > 0) {
    absl::StrAppend(&b, "<ul>");
    for (const std::string& r : inc.recommendations()) absl::StrAppend(&b, "<li>", E(r), "</li>");
    absl::StrAppend(&b, "</ul>\n");
  }

  // Cost.
  absl::StrAppend(&b, "<h2>Cost</h2>\n<table id=\"cost\">\n");
  b += Row({"probes", absl::StrCat(inc.cost().probes())});
  b += Row({"steps re-executed", absl::StrCat(inc.cost().steps_reexecuted())});
  b += Row({"wall time", absl::StrFormat("%.1f s", inc.cost().wall_time_s())});
  // Re-executed steps × step time × ranks: device-hours on GPUs, core time on CPUs.
  b += Row({"rank-hours", absl::StrFormat("%.4f", inc.cost().gpu_hours())});
  absl::StrAppend(&b, "</table>\n");

  // Timeline.
  absl::StrAppend(&b, "<h2>Timeline</h2>\n<table id=\"timeline\">\n");
  b += Row({"#", "time", "event", "detail"}, true);
  for (const v1::IncidentEvent& e : inc.events()) {
    b += Row({absl::StrCat(e.seq()), E(TimeText(e.unix_ms())), E(e.kind()), E(e.detail())});
  }
  absl::StrAppend(&b, "</table>\n");
  return b;
}

std::string HtmlPage(const std::string& title, const std::string& body) {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src "
      "'unsafe-inline'; img-src data:\">\n<title>",
      E(title), "</title>\n<style>", kCss, "</style></head>\n<body>\n", body,
      "<p style=\"color:#999;font-size:11px\">spikeguard</p>\n</body></html>\n");
}

std::string RenderIncidentReport(const ReportData& data) {
  return HtmlPage(absl::StrCat("spikeguard incident ", data.incident.id(), " — ", data.incident.run()),
                  RenderIncidentBody(data));
}

}  // namespace spikeguard::report
