#include "report/incident_report.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spikeguard::report {
namespace {

namespace v1 = ::spikeguard::v1;
using ::testing::HasSubstr;
using ::testing::Not;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

double AttnBase(int64_t step) { return step < 280 ? 10.0 : 10.0 * (step - 279) * (step - 279); }

// A DATA incident on a hostile run name: spike at 300, replay and skip
// probes from checkpoint 200, culprit position 300.
ReportData DataIncident(const std::string& run_name) {
  ReportData data;
  v1::Incident& inc = data.incident;
  inc.set_id(1);
  inc.set_run(run_name);
  inc.set_state(v1::CLOSED);
  inc.set_verdict(v1::DATA);
  inc.set_confidence(0.9);
  inc.set_trigger("loss_spike");
  inc.set_onset_step(300);
  inc.set_peak_step(301);
  inc.set_peak_value(9.5);
  inc.set_generation(0);
  inc.set_precursor("max_attn_logit");
  inc.set_precursor_onset_step(280);
  inc.set_fix("keep the hole; quarantine <script>x</script>");
  inc.add_culprit_positions(300);
  v1::Probe* replay = inc.add_probes();
  replay->set_kind("replay");
  replay->set_generation(1);
  replay->set_checkpoint_step(200);
  replay->set_horizon_step(305);
  replay->set_outcome("spiked");
  replay->set_detail("worker said: \"<img src=x onerror=alert(1)>\"");
  v1::Probe* skip = inc.add_probes();
  skip->set_kind("skip");
  skip->set_generation(2);
  skip->set_checkpoint_step(200);
  skip->set_horizon_step(400);
  skip->set_outcome("clean");
  skip->mutable_data_plan()->add_ranges()->set_end(298);
  v1::DataRange* rest = skip->mutable_data_plan()->add_ranges();
  rest->set_begin(303);
  rest->set_end(-1);
  v1::DocumentRef* doc = inc.add_documents();
  doc->set_domain(std::string("web\0<script>", 12));
  doc->set_document_id(42);
  doc->set_data_position(300);
  doc->set_step(300);
  doc->set_preview(std::string("\xff\xfe<script>alert(3)</script>\0ok\n", 31));
  v1::NearDuplicate* dup = inc.add_near_duplicates();
  dup->set_domain("web");
  dup->set_document_id(77);
  dup->set_similarity(0.93);
  dup->set_similar_to_domain("web");
  dup->set_similar_to_document_id(42);
  v1::IncidentEvent* ev = inc.add_events();
  ev->set_kind("probe_failed");
  ev->set_detail("rank 0: '\xff\xfe</td></table><script>alert(2)</script>");
  inc.mutable_cost()->set_probes(2);
  inc.mutable_cost()->set_steps_reexecuted(305);
  inc.mutable_cost()->set_gpu_hours(0.25);
  ChooseWindow(inc, &data.window_from, &data.window_to);
  for (int64_t gen : {0, 1, 2}) {
    for (int64_t step = 200; step <= (gen == 1 ? 305 : 400); ++step) {
      if (gen == 2 && step >= 298) continue;  // the skip generation's steps are shifted; keep simple
      v1::StepRecord r;
      r.set_generation(gen);
      r.set_step(step);
      r.set_data_position(step);
      r.set_loss(step == 301 && gen != 2 ? 9.5 : 2.0);
      r.set_grad_norm(1.0);
      r.set_clipped(step % 3 == 0);
      r.set_lse_max(5);
      // Three layers. The original's largest attention logits and update
      // ratios are in layer 2, its largest activation RMS in layer 0; in the
      // probes layer 0 is the largest everywhere (a max over layers would
      // show layer 0); layer 1 moved first (see WithLocalization).
      for (uint32_t layer = 0; layer < 3; ++layer) {
        v1::LayerStats* l = r.add_layers();
        l->set_layer(layer);
        const double factor = gen == 0 ? (layer == 2 ? 3.0 : 1.0) : (layer == 0 ? 5.0 : 1.0 + layer);
        l->set_max_attn_logit(factor * AttnBase(step));
        l->set_update_ratio(factor * 1e-3);
        l->set_act_rms(gen == 0 ? 3.0 - layer : factor);
      }
      data.telemetry[gen].push_back(r);
    }
  }
  return data;
}

TEST(IncidentReportTest, WindowRunsFromTheRewindCheckpointPastTheHorizon) {
  const ReportData data = DataIncident("r");
  EXPECT_EQ(data.window_from, 200);
  EXPECT_GT(data.window_to, 400);
}

TEST(IncidentReportTest, PlotsOverlayOriginalAndEveryProbeWithMarks) {
  const std::string html = RenderIncidentReport(DataIncident("demo"));
  EXPECT_EQ(Count(html, "<svg "), 8);  // loss zoom, loss, grad, clip, lse, attn, update, act rms
  EXPECT_THAT(html, HasSubstr("data-name=\"original (gen 0)\""));
  EXPECT_THAT(html, HasSubstr("data-name=\"replay (gen 1)\""));
  EXPECT_THAT(html, HasSubstr("data-name=\"skip (gen 2)\""));
  EXPECT_THAT(html, HasSubstr("culprit batch (step 300, position 300)"));
  EXPECT_THAT(html, HasSubstr("skip hole (steps 298–302)"));
  EXPECT_THAT(html, HasSubstr("spike onset (step 300)"));
  EXPECT_THAT(html, HasSubstr("precursor onset (step 280)"));
  EXPECT_THAT(html, HasSubstr("peak (step 301)"));
  EXPECT_THAT(html, HasSubstr("rewind checkpoint (step 200)"));
  // Attention logits span decades: a log axis.
  EXPECT_THAT(html, HasSubstr("data-scale=\"log\""));
  EXPECT_THAT(html, HasSubstr(">DATA</span>"));
  EXPECT_THAT(html, HasSubstr("90%"));
  EXPECT_THAT(html, HasSubstr("0.2500"));  // rank-hours
  EXPECT_THAT(html, Not(HasSubstr("GPU-hours")));
  EXPECT_THAT(html, HasSubstr("web:42"));  // near-duplicate's culprit
  // The document's bytes, readable and inert.
  EXPECT_THAT(html, HasSubstr("\\xff\\xfe&lt;script&gt;alert(3)&lt;/script&gt;\\x00ok\\n"));
}

TEST(IncidentReportTest, SelfContainedAndNoScriptFromHostileStrings) {
  const std::string html =
      RenderIncidentReport(DataIncident("run<script>alert('r')</script>\"'&\xc0"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("<img")));
  EXPECT_THAT(html, Not(HasSubstr("</table><")));
  EXPECT_THAT(html, Not(HasSubstr(std::string(1, '\0'))));
  EXPECT_THAT(html, Not(HasSubstr("\xff")));
  EXPECT_THAT(html, Not(HasSubstr("\xc0")));
  EXPECT_THAT(html, HasSubstr("run&lt;script&gt;alert(&#39;r&#39;)&lt;/script&gt;&quot;&#39;&amp;"));
  // No fetches: nothing refers outside the page.
  EXPECT_THAT(html, Not(HasSubstr("http://")));
  EXPECT_THAT(html, Not(HasSubstr("https://")));
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  // The only namespace URI is the SVG one (an identifier, never fetched).
  EXPECT_THAT(html, HasSubstr("default-src 'none'"));
}

ReportData WithLocalization(ReportData data, int layer) {
  v1::Localization* loc = data.incident.mutable_localization();
  loc->set_signal(layer >= 0 ? "max_attn_logit" : "loss");
  loc->set_layer(layer);
  loc->set_start_step(280);
  return data;
}

const Series* Find(const Plot& plot, const std::string& name) {
  for (const Series& s : plot.series) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// The value a series has at a step (NaN if none).
double At(const Series& s, int64_t step) {
  for (const auto& [x, y] : s.points) {
    if (x == static_cast<double>(step)) return y;
  }
  return std::nan("");
}

// The per-layer plots (after the zoom, loss, grad norm, clip rate and lse):
// attention logits, update ratios, activation RMS.
std::vector<Plot> LayerPlots(const ReportData& data) {
  std::vector<Plot> plots = IncidentPlots(data);
  EXPECT_EQ(plots.size(), 8u);
  if (plots.size() != 8) return {};
  return {plots.begin() + 5, plots.end()};
}

TEST(IncidentReportTest, PerLayerPlotsShowEveryProbeOnTheLayerThatMovedFirst) {
  const ReportData data = WithLocalization(DataIncident("r"), 1);
  const std::vector<Plot> plots = LayerPlots(data);
  ASSERT_EQ(plots.size(), 3u);
  for (const Plot& plot : plots) {
    SCOPED_TRACE(plot.title);
    EXPECT_THAT(plot.title, HasSubstr("probes on layer 1 (moved first)"));
    // The original: layer 1 in black on top, the other layers grey context
    // (one legend entry for both), drawn first.
    ASSERT_EQ(plot.series.size(), 5u);  // 3 original layers + replay + skip
    const Series* focus = Find(plot, "layer 1, original (moved first)");
    ASSERT_NE(focus, nullptr);
    EXPECT_EQ(focus->color, "#222222");
    EXPECT_FALSE(focus->dashed);
    EXPECT_EQ(&plot.series.back(), focus);
    EXPECT_EQ(plot.series[0].color, plot.series[1].color);
    EXPECT_NE(plot.series[0].color, "#222222");
    EXPECT_EQ(plot.series[0].name, "other layers (2), original");
    EXPECT_TRUE(plot.series[0].in_legend);
    EXPECT_FALSE(plot.series[1].in_legend);
    EXPECT_EQ(plot.series[1].name, "layer 2, original");
    // Every probe on layer 1, dashed, in its own color; no max over layers.
    const Series* replay = Find(plot, "replay (gen 1), layer 1");
    const Series* skip = Find(plot, "skip (gen 2), layer 1");
    ASSERT_NE(replay, nullptr);
    ASSERT_NE(skip, nullptr);
    EXPECT_TRUE(replay->dashed);
    EXPECT_NE(replay->color, skip->color);
    for (const Series& s : plot.series) EXPECT_THAT(s.name, Not(HasSubstr("max over layers")));
    EXPECT_EQ(replay->points.size(), data.telemetry.at(1).size());
  }
  // The values are layer 1's: in the probes 2x the base, where layer 0 (the
  // max over layers) is 5x; in the original 1x.
  EXPECT_DOUBLE_EQ(At(*Find(plots[0], "replay (gen 1), layer 1"), 290), 2 * AttnBase(290));
  EXPECT_DOUBLE_EQ(At(*Find(plots[0], "skip (gen 2), layer 1"), 250), 2 * AttnBase(250));
  EXPECT_DOUBLE_EQ(At(*Find(plots[0], "layer 1, original (moved first)"), 290), AttnBase(290));
  EXPECT_DOUBLE_EQ(At(*Find(plots[1], "replay (gen 1), layer 1"), 290), 2e-3);
  EXPECT_DOUBLE_EQ(At(*Find(plots[2], "replay (gen 1), layer 1"), 290), 2.0);
  EXPECT_DOUBLE_EQ(At(*Find(plots[2], "layer 1, original (moved first)"), 290), 2.0);

  // Rendered: the legend has the focus line, one grey entry and the probes.
  const std::string svg = RenderSvg(plots[0]);
  EXPECT_THAT(svg, HasSubstr("data-name=\"replay (gen 1), layer 1\""));
  EXPECT_THAT(svg, HasSubstr("data-name=\"layer 2, original\""));  // drawn, in its tooltip
  EXPECT_EQ(Count(svg, "<g class=\"sg-legend-entry\" data-kind=\"series\">"), 4);
  const std::string html = RenderIncidentReport(data);
  EXPECT_THAT(html, HasSubstr("First to move: <b>layer 1</b>"));
  EXPECT_THAT(html, Not(HasSubstr("max over layers")));
}

TEST(IncidentReportTest, WithoutAPerLayerLocalizationProbesFollowTheOriginalsLargestLayer) {
  // Layer -1: the first mover was the loss, not a layer.
  for (const ReportData& data : {WithLocalization(DataIncident("r"), -1), DataIncident("r")}) {
    const std::vector<Plot> plots = LayerPlots(data);
    ASSERT_EQ(plots.size(), 3u);
    // Attention logits and update ratios: the original's largest is layer 2;
    // activation RMS: layer 0. Each probe is drawn on that same layer.
    EXPECT_THAT(plots[0].title, HasSubstr("probes on layer 2 (largest)"));
    EXPECT_THAT(plots[1].title, HasSubstr("probes on layer 2 (largest)"));
    EXPECT_THAT(plots[2].title, HasSubstr("probes on layer 0 (largest)"));
    ASSERT_NE(Find(plots[0], "layer 2, original (largest)"), nullptr);
    ASSERT_NE(Find(plots[0], "replay (gen 1), layer 2"), nullptr);
    EXPECT_DOUBLE_EQ(At(*Find(plots[0], "replay (gen 1), layer 2"), 290), 3 * AttnBase(290));
    EXPECT_DOUBLE_EQ(At(*Find(plots[0], "layer 2, original (largest)"), 290), 3 * AttnBase(290));
    ASSERT_NE(Find(plots[2], "skip (gen 2), layer 0"), nullptr);
    EXPECT_DOUBLE_EQ(At(*Find(plots[2], "skip (gen 2), layer 0"), 250), 5.0);
  }
  EXPECT_THAT(RenderIncidentReport(WithLocalization(DataIncident("r"), -1)),
              HasSubstr("First to move: <b>no single layer</b>, signal <b>loss</b>"));
}

TEST(IncidentReportTest, WithoutTelemetryOrProbesStillRenders) {
  ReportData data;
  data.incident.set_id(3);
  data.incident.set_run("r");
  data.incident.set_onset_step(50);
  data.incident.set_peak_step(52);
  data.warnings.push_back("telemetry of generation 0 not read: <denied>");
  ChooseWindow(data.incident, &data.window_from, &data.window_to);
  EXPECT_EQ(data.window_from, 0);
  const std::string html = RenderIncidentReport(data);
  EXPECT_THAT(html, HasSubstr("no data"));
  EXPECT_THAT(html, HasSubstr("none yet"));
  EXPECT_THAT(html, HasSubstr("&lt;denied&gt;"));
}

}  // namespace
}  // namespace spikeguard::report
