#include "report/incident_report.h"

#include <string>

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
      for (uint32_t layer = 0; layer < 2; ++layer) {
        v1::LayerStats* l = r.add_layers();
        l->set_layer(layer);
        l->set_max_attn_logit(step < 280 ? 10.0 : 10.0 * (step - 279) * (step - 279));
        l->set_update_ratio(1e-3);
        l->set_act_rms(1.0 + layer);
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
  EXPECT_THAT(html, HasSubstr("0.2500"));  // GPU-hours
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
