// The web view, /metrics and `spikectl report` on a daemon that ran a real
// incident (reference worker, poisoned batch at data position 300, bisect on),
// with TLS and tokens on as deployed. Pages are loaded in headless Chromium
// (Debian's package) and checked in its DOM; screenshots are saved under the
// build tree (tests/http/screenshots/).
#include <sys/stat.h>
#include <unistd.h>

#include <httplib.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/secret.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/incident_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kBisectPolicy[] = R"pb(
  probe { min_steps_before_onset: 50 max_steps_before_onset: 500 replay_steps_past_onset: 5
          skip_before: 2 skip_after: 2 skip_horizon: 100 bisect: true }
  fix { verify_steps: 100 }
)pb";

std::string Chromium() {
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

class WebViewE2E : public IncidentE2E {
 protected:
  // Headless Chromium: --dump-dom (the DOM after load) or --screenshot=FILE.
  RunResult Browser(const std::string& url, const std::string& mode, const std::string& tag) {
    return RunCommand({chromium_, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                       "--no-first-run", "--user-data-dir=" + dir_.File("chromium-profile"),
                       // The test CA is not in Chromium's store: the pages'
                       // TLS itself is checked by the httplib client below.
                       "--ignore-certificate-errors", "--window-size=1100,1600", mode, url},
                      dir_.File("chromium-" + tag), std::chrono::seconds(60));
  }
  std::string Url(const std::string& token, const std::string& path) {
    // Basic authentication with the token as the password: what a browser sends.
    return absl::StrCat("https://viewer:", token, "@127.0.0.1:", http_port_, path);
  }
  std::string Screenshot(const std::string& url, const std::string& name) {
    mkdir(SCREENSHOT_DIR, 0755);
    const std::string png = absl::StrCat(SCREENSHOT_DIR, "/", name);
    std::remove(png.c_str());
    RunResult r = Browser(url, "--screenshot=" + png, name);
    EXPECT_EQ(r.code, 0) << r.err;
    const std::string bytes = ReadFile(png);
    EXPECT_GT(bytes.size(), 20000u) << png;  // a page of plots, not a blank one
    EXPECT_EQ(bytes.substr(0, 8), "\x89PNG\r\n\x1a\n") << png;
    std::cout << "[screenshot] " << png << std::endl;
    return png;
  }

  std::string chromium_ = Chromium();
  int http_port_ = FreePort();
};

TEST_F(WebViewE2E, IncidentPagesInABrowserAndMetricsWithTlsAndTokens) {
  if (chromium_.empty()) {
    GTEST_SKIP() << "chromium is not installed (deploy/install-deps.sh installs it): the web view "
                    "is not tested in a browser";
  }
  // A viewer token besides the fixture's admin token.
  const std::string viewer = NewToken();
  std::ofstream(dir_.File("tokens"), std::ios::app) << "e2e-viewer viewer * " << HashToken(viewer) << "\n";
  daemon_args_ = {absl::StrCat("--http-listen=127.0.0.1:", http_port_)};
  MakeCorpus({"highbytes@300"});
  Launch("web", "data", {"--steps", "600"}, kBisectPolicy);
  v1::ListIncidentsResponse list = WaitIncidents("web", AllClosed, absl::Minutes(4));
  ASSERT_EQ(list.incidents_size(), 1);
  const v1::Incident incident = Show(list.incidents(0).id());
  ASSERT_EQ(incident.verdict(), v1::DATA);
  ASSERT_GT(incident.culprit_positions_size(), 0);
  const std::string id = absl::StrCat(incident.id());

  // TLS and tokens: the CA verifies the daemon's certificate; no token, a
  // wrong one: 401 with a Basic challenge; /healthz needs none.
  httplib::SSLClient client("127.0.0.1", http_port_);
  client.set_ca_cert_path(TestSecurity::Tls("ca.pem").c_str());
  client.enable_server_certificate_verification(true);
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(30, 0);
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  for (const std::string& path : std::vector<std::string>{"/", "/metrics", "/incidents/" + id}) {
    auto anonymous = client.Get(path.c_str());
    ASSERT_TRUE(anonymous);
    EXPECT_EQ(anonymous->status, 401) << path;
    EXPECT_THAT(anonymous->get_header_value("WWW-Authenticate"), HasSubstr("Basic"));
    auto wrong = client.Get(path.c_str(), {{"Authorization", "Bearer not-a-token"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401) << path;
  }
  const httplib::Headers as_viewer = {{"Authorization", "Bearer " + viewer}};
  // Hostile paths: clear errors, the daemon stays up.
  auto bad_id = client.Get("/incidents/1%3Cscript%3E", as_viewer);
  ASSERT_TRUE(bad_id);
  EXPECT_EQ(bad_id->status, 400);
  EXPECT_THAT(bad_id->body, Not(HasSubstr("<script")));
  auto missing = client.Get("/incidents/999", as_viewer);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto bad_run = client.Get("/runs/%00nope", as_viewer);  // a NUL in the name
  ASSERT_TRUE(bad_run);
  EXPECT_EQ(bad_run->status, 400);
  auto no_run = client.Get("/runs/nope", as_viewer);
  ASSERT_TRUE(no_run);
  EXPECT_EQ(no_run->status, 404);
  auto post = client.Post("/metrics", as_viewer, "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_NE(post->status, 200);

  // /metrics with the viewer token.
  auto metrics = client.Get("/metrics", as_viewer);
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  const std::string& text = metrics->body;
  EXPECT_THAT(text, HasSubstr("spikeguard_incidents_opened_total 1\n"));
  EXPECT_THAT(text, HasSubstr("spikeguard_incidents_closed_total{verdict=\"data\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("spikeguard_incidents_open 0\n"));
  EXPECT_THAT(text, HasSubstr("spikeguard_run_last_step{run=\"web\"}"));
  EXPECT_THAT(text, HasSubstr("spikeguard_run_loss{run=\"web\"}"));
  EXPECT_THAT(text, HasSubstr("spikeguard_probes_total{kind=\"bisect\"}"));
  EXPECT_THAT(text, Not(HasSubstr("spikeguard_rewinds_total 0\n")));
  EXPECT_THAT(text, Not(HasSubstr("spikeguard_reports_ingested_total 0\n")));
  EXPECT_THAT(text, Not(HasSubstr("step=")));
  // The catalog-derived values come from a snapshot read once a second.
  EXPECT_THAT(text, ::testing::ContainsRegex("\nspikeguard_metrics_catalog_reads_total [1-9]"));
  // Every metric the Grafana dashboard queries is exposed.
  std::set<std::string> exposed;
  const std::regex type_line("# TYPE (spikeguard_[a-z_]+) (counter|gauge|histogram)");
  for (std::sregex_iterator it(text.begin(), text.end(), type_line), end; it != end; ++it) {
    exposed.insert((*it)[1]);
  }
  const std::string dashboard = ReadFile(GRAFANA_DASHBOARD);
  ASSERT_FALSE(dashboard.empty());
  const std::regex queried("spikeguard_[a-z_]+");
  std::set<std::string> names;
  for (std::sregex_iterator it(dashboard.begin(), dashboard.end(), queried), end; it != end; ++it) {
    std::string name = (*it)[0];
    if (name == "spikeguard_") continue;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          exposed.count(name.substr(0, name.size() - s.size()))) {
        name = name.substr(0, name.size() - s.size());
      }
    }
    names.insert(name);
  }
  EXPECT_GE(names.size(), 15u);
  for (const std::string& name : names) {
    EXPECT_TRUE(exposed.count(name)) << "the dashboard queries " << name << ", /metrics has no such metric";
  }

  // The incident page in the browser: plots, the verdict, the culprit.
  RunResult dom = Browser(Url(viewer, "/incidents/" + id), "--dump-dom", "incident");
  ASSERT_EQ(dom.code, 0) << dom.err;
  const std::string& page = dom.out;
  EXPECT_THAT(page, HasSubstr("id=\"verdict\">DATA</span>"));
  EXPECT_GE(Count(page, "<svg class=\"sg-plot"), 8);
  EXPECT_THAT(page, HasSubstr("data-name=\"original (gen "));
  EXPECT_THAT(page, HasSubstr("data-name=\"skip (gen "));
  EXPECT_THAT(page, HasSubstr("data-name=\"replay (gen "));
  EXPECT_THAT(page, HasSubstr(absl::StrCat("culprit batch (step ")));
  // Per-layer plots: every probe on one layer (the one that moved first, or
  // the original's largest), not a max over layers.
  EXPECT_EQ(Count(page, "<title>max attention logit per layer — probes on layer "), 1);
  EXPECT_THAT(page, ::testing::ContainsRegex("data-name=\"skip \\(gen [0-9]+\\), layer [0-9]+\""));
  EXPECT_THAT(page, Not(HasSubstr("max over layers")));
  EXPECT_THAT(page, HasSubstr(absl::StrCat("position ", incident.culprit_positions(0), ")")));
  EXPECT_THAT(page, HasSubstr("id=\"culprit-positions\">" + absl::StrCat(incident.culprit_positions(0))));
  ASSERT_GT(incident.documents_size(), 0);
  EXPECT_THAT(page, HasSubstr(absl::StrCat("<td>", incident.documents(0).document_id(), "</td>")));
  // The poison's bytes (high bytes the model never saw), previewed escaped.
  EXPECT_THAT(page, ::testing::ContainsRegex("<pre class=\"sg-bytes\">[^<]*\\\\x[89a-f][0-9a-f]"));
  EXPECT_THAT(page, HasSubstr("<span class=\"sg-run\">web</span>"));
  Screenshot(Url(viewer, "/incidents/" + id), "web-incident.png");

  // The runs page and the run's page.
  RunResult runs = Browser(Url(viewer, "/"), "--dump-dom", "runs");
  ASSERT_EQ(runs.code, 0) << runs.err;
  EXPECT_THAT(runs.out, HasSubstr("href=\"/runs/web\""));
  // A run's state by its name, as spikectl shows it ("paused"), not the enumerator.
  const std::string state_badge =
      "<span class=\"sg-state\">(created|running|paused|stopped|finished|failed)</span>";
  EXPECT_THAT(runs.out, ::testing::ContainsRegex(state_badge));
  RunResult run = Browser(Url(viewer, "/runs/web"), "--dump-dom", "run");
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_THAT(run.out, ::testing::ContainsRegex(state_badge));
  EXPECT_EQ(Count(run.out, "<svg class=\"sg-plot"), 3);
  EXPECT_THAT(run.out, HasSubstr("data-name=\"gen 0\""));
  EXPECT_THAT(run.out, HasSubstr("href=\"/incidents/" + id + "\""));
  Screenshot(Url(viewer, "/runs/web"), "web-run.png");

  // spikectl report: the same incident as one file; its screenshot shows the
  // original and probe curves overlaid with the culprit batch marked.
  const std::string report = absl::StrCat(SCREENSHOT_DIR, "/incident-", id, ".html");
  RunResult written = cluster_.Spikectl({"report", id, "--out=" + report}, "report");
  ASSERT_EQ(written.code, 0) << written.err;
  const std::string html = ReadFile(report);
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("https://")));
  RunResult file_dom = Browser("file://" + report, "--dump-dom", "report-file");
  ASSERT_EQ(file_dom.code, 0) << file_dom.err;
  EXPECT_THAT(file_dom.out, HasSubstr("culprit batch (step "));
  EXPECT_THAT(file_dom.out, HasSubstr("data-name=\"original (gen "));
  Screenshot("file://" + report, absl::StrCat("report-incident-", id, ".png"));

  // Still up after all that.
  auto again = client.Get("/healthz");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200);
}

}  // namespace
}  // namespace spikeguard::testing
