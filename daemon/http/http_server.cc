#include "daemon/http/http_server.h"

#include <httplib.h>

#include <chrono>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "daemon/auth/authorizer.h"
#include "daemon/metrics/registry.h"
#include "proto/state_names.h"
#include "report/html.h"
#include "report/incident_report.h"
#include "report/svg_plot.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = ::spikeguard::v1;
using report::HtmlEscape;

constexpr auto kCallTimeout = std::chrono::seconds(10);
constexpr size_t kMaxRunRecords = 4000;  // per generation on a run's page

void SecurityHeaders(httplib::Response& res) {
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Cache-Control", "no-store");
}

std::string Nav() {
  return "<p class=\"sg-nav\"><a href=\"/\">runs</a> · <a href=\"/metrics\">metrics</a></p>\n";
}

void Page(httplib::Response& res, int status, const std::string& title, const std::string& body) {
  res.status = status;
  SecurityHeaders(res);
  res.set_content(report::HtmlPage(title, Nav() + body), "text/html; charset=utf-8");
}

const char* StatusText(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// Maps a failed SupervisorService call to an HTTP answer.
void Fail(httplib::Response& res, grpc::StatusCode code, const std::string& message) {
  int status = 500;
  switch (code) {
    case grpc::StatusCode::UNAUTHENTICATED: status = 401; break;
    case grpc::StatusCode::PERMISSION_DENIED: status = 403; break;
    case grpc::StatusCode::NOT_FOUND: status = 404; break;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE: status = 400; break;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED: status = 503; break;
    default: break;
  }
  if (status == 401) res.set_header("WWW-Authenticate", "Basic realm=\"spikeguard\", charset=\"UTF-8\"");
  Page(res, status, absl::StrCat(status, " ", StatusText(status)),
       absl::StrCat("<h1>", status, " ", StatusText(status), "</h1>\n<p>",
                    HtmlEscape(message), "</p>\n"));
}

// The caller's credentials as the gRPC "authorization" metadata value
// ("Bearer TOKEN"; "" when none were given); a malformed header is answered
// 401 here, naming what is wrong, and nullopt returned.
std::optional<std::string> BearerOr401(const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<std::string> bearer =
      auth::BearerFromHttpAuthorization(req.get_header_value("Authorization"));
  if (!bearer.ok()) {
    Fail(res, grpc::StatusCode::UNAUTHENTICATED, std::string(bearer.status().message()));
    return std::nullopt;
  }
  return std::move(*bearer);
}

// A path segment for a link (run names may hold anything).
std::string PathEscape(absl::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

// Calls over the in-process channel on behalf of one HTTP request; `bearer`
// comes from BearerOr401 (a value gRPC accepts as metadata).
class Caller {
 public:
  Caller(v1::SupervisorService::Stub* stub, std::string bearer)
      : stub_(stub), bearer_(std::move(bearer)) {}
  v1::SupervisorService::Stub* stub() const { return stub_; }
  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    if (!bearer_.empty()) ctx->AddMetadata("authorization", bearer_);
  }

 private:
  v1::SupervisorService::Stub* stub_;
  std::string bearer_;
};

std::string StateBadge(v1::RunState state) {
  return absl::StrCat("<span class=\"sg-state\">", HtmlEscape(std::string(RunStateName(state))),
                      "</span>");
}

void RunsPage(const Caller& call, httplib::Response& res) {
  v1::ListRunsRequest req;
  std::vector<v1::Run> runs;
  while (true) {
    grpc::ClientContext ctx;
    call.Prepare(&ctx);
    v1::ListRunsResponse page;
    grpc::Status s = call.stub()->ListRuns(&ctx, req, &page);
    if (!s.ok()) return Fail(res, s.error_code(), s.error_message());
    for (v1::Run& r : *page.mutable_runs()) runs.push_back(std::move(r));
    if (page.next_page_token().empty() || runs.size() > 10000) break;
    req.set_page_token(page.next_page_token());
  }
  std::string b = "<h1>spikeguard runs</h1>\n<table id=\"runs\">\n<tr><th>run</th><th>state</th>"
                  "<th>mode</th><th>world size</th><th>connected</th><th>generation</th>"
                  "<th>last step</th></tr>\n";
  for (const v1::Run& r : runs) {
    int connected = 0;
    for (const v1::RankState& rank : r.ranks()) connected += rank.connected();
    absl::StrAppend(&b, "<tr><td><a href=\"/runs/", PathEscape(r.name()), "\">", HtmlEscape(r.name()),
                    "</a></td><td>", StateBadge(r.state()), "</td><td>",
                    HtmlEscape(v1::Mode_Name(r.mode())), "</td><td>", r.world_size(), "</td><td>",
                    connected, "</td><td>", r.current_generation(), "</td><td>", r.last_step(),
                    "</td></tr>\n");
  }
  if (runs.empty()) absl::StrAppend(&b, "<tr><td colspan=\"7\">no runs</td></tr>\n");
  absl::StrAppend(&b, "</table>\n");
  Page(res, 200, "spikeguard runs", b);
}

// The run's precursor warnings (a critical precursor that persisted), apart
// from its incidents: signal, layer, state, onset and lead.
std::string WarningsSection(const Caller& call, const std::string& run) {
  v1::ListWarningsRequest req;
  req.set_run(run);
  grpc::ClientContext ctx;
  call.Prepare(&ctx);
  v1::ListWarningsResponse warnings;
  grpc::Status s = call.stub()->ListWarnings(&ctx, req, &warnings);
  std::string b =
      "<h2>Precursor warnings</h2>\n<table id=\"warnings\">\n<tr><th>id</th><th>state</th>"
      "<th>signal</th><th>layer</th><th>onset</th><th>last step</th><th>peak</th>"
      "<th>threshold</th><th>lead</th><th>incident</th></tr>\n";
  if (!s.ok()) {
    absl::StrAppend(&b, "<tr><td colspan=\"10\" class=\"sg-warn\">", HtmlEscape(s.error_message()),
                    "</td></tr>\n");
  } else if (warnings.warnings().empty()) {
    absl::StrAppend(&b, "<tr><td colspan=\"10\">none</td></tr>\n");
  }
  for (const v1::PrecursorWarning& w : warnings.warnings()) {
    const bool active = w.state() == v1::WARNING_ACTIVE;
    const bool preceded = w.state() == v1::WARNING_PRECEDED_INCIDENT;
    const std::string state = active     ? "<b class=\"sg-warn\">ACTIVE</b>"
                              : preceded ? "preceded an incident"
                                         : "cleared";
    const std::string lead =
        preceded ? absl::StrCat(w.incident_lead_steps(), " steps before the incident")
                 : absl::StrCat(w.lead_steps(), " steps", active ? " so far" : "");
    const std::string incident =
        w.incident_id() > 0
            ? absl::StrCat("<a href=\"/incidents/", w.incident_id(), "\">", w.incident_id(), "</a>")
            : std::string("-");
    absl::StrAppend(&b, "<tr><td>", w.id(), "</td><td>", state, "</td><td>", HtmlEscape(w.signal()),
                    "</td><td>", w.layer() >= 0 ? absl::StrCat(w.layer()) : std::string("-"),
                    "</td><td>step ", w.onset_step(), "</td><td>step ", w.last_step(), "</td><td>",
                    absl::StrFormat("%.4g (step %d)", w.peak_value(), w.peak_step()), "</td><td>",
                    absl::StrFormat("%.4g", w.threshold()), "</td><td>", lead, "</td><td>",
                    incident, "</td></tr>\n");
  }
  absl::StrAppend(&b, "</table>\n");
  return b;
}

void RunPage(const Caller& call, const std::string& name, httplib::Response& res) {
  v1::Run run;
  {
    grpc::ClientContext ctx;
    call.Prepare(&ctx);
    v1::GetRunRequest req;
    req.set_name(name);
    grpc::Status s = call.stub()->GetRun(&ctx, req, &run);
    if (!s.ok()) return Fail(res, s.error_code(), s.error_message());
  }
  std::set<int64_t> gens = {run.current_generation()};
  for (const v1::Generation& g : run.generations()) gens.insert(g.generation());
  std::map<int64_t, std::vector<v1::StepRecord>> telemetry;
  std::vector<std::string> warnings;
  for (int64_t gen : gens) {
    v1::QueryTelemetryRequest req;
    req.set_run(name);
    req.set_generation(gen);
    // The most recent steps: a long run's page shows its last kMaxRunRecords.
    req.set_from_step(std::max<int64_t>(0, run.last_step() - static_cast<int64_t>(kMaxRunRecords) + 1));
    req.add_metrics("loss");
    req.add_metrics("grad_norm");
    req.add_metrics("max_attn_logit");
    auto& records = telemetry[gen];
    while (records.size() < kMaxRunRecords) {
      grpc::ClientContext ctx;
      call.Prepare(&ctx);
      v1::QueryTelemetryResponse page;
      grpc::Status s = call.stub()->QueryTelemetry(&ctx, req, &page);
      if (!s.ok()) {
        if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
            s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
          return Fail(res, s.error_code(), s.error_message());
        }
        warnings.push_back(absl::StrCat("generation ", gen, ": ", s.error_message()));
        break;
      }
      for (v1::StepRecord& r : *page.mutable_records()) records.push_back(std::move(r));
      if (!page.truncated() || page.next_from_step() <= req.from_step()) break;
      req.set_from_step(page.next_from_step());
    }
  }
  std::string b = absl::StrCat("<h1>Run <span class=\"sg-run\">", HtmlEscape(run.name()), "</span></h1>\n",
                               "<p>state ", StateBadge(run.state()), " · mode <b>",
                               HtmlEscape(v1::Mode_Name(run.mode())), "</b> · world size <b>",
                               run.world_size(), "</b> · generation <b>", run.current_generation(),
                               "</b> · last step <b>", run.last_step(), "</b></p>\n");
  for (const std::string& w : warnings) absl::StrAppend(&b, "<p class=\"sg-warn\">", HtmlEscape(w), "</p>\n");
  struct Metric {
    const char* title;
    const char* unit;
    double (*get)(const v1::StepRecord&);
  };
  const Metric metrics[] = {
      {"loss by generation", "loss (nats/token)", [](const v1::StepRecord& r) { return r.loss(); }},
      {"gradient norm (pre-clip) by generation", "L2 norm",
       [](const v1::StepRecord& r) { return r.grad_norm(); }},
      {"max attention logit (max over layers) by generation", "logit (q·k/√d)",
       [](const v1::StepRecord& r) {
         double m = 0;
         for (const v1::LayerStats& l : r.layers()) m = std::max(m, l.max_attn_logit());
         return m;
       }},
  };
  for (const Metric& m : metrics) {
    report::Plot plot;
    plot.title = m.title;
    plot.y_label = m.unit;
    size_t i = 0;
    for (const auto& [gen, records] : telemetry) {
      report::Series s{absl::StrCat("gen ", gen), {}, gen == 0 ? "#222222" : report::PaletteColor(i++),
                       gen != 0, gen == 0 ? 2.0 : 1.5};
      for (const v1::StepRecord& r : records) s.points.emplace_back(static_cast<double>(r.step()), m.get(r));
      if (!s.points.empty()) plot.series.push_back(std::move(s));
    }
    b += report::RenderSvg(plot);
  }
  b += WarningsSection(call, name);
  // Incidents.
  v1::ListIncidentsRequest ireq;
  ireq.set_run(name);
  grpc::ClientContext ctx;
  call.Prepare(&ctx);
  v1::ListIncidentsResponse incidents;
  grpc::Status s = call.stub()->ListIncidents(&ctx, ireq, &incidents);
  absl::StrAppend(&b, "<h2>Incidents</h2>\n<table id=\"incidents\">\n<tr><th>id</th><th>state</th>"
                      "<th>verdict</th><th>confidence</th><th>onset</th><th>trigger</th></tr>\n");
  if (!s.ok()) {
    absl::StrAppend(&b, "<tr><td colspan=\"6\" class=\"sg-warn\">", HtmlEscape(s.error_message()),
                    "</td></tr>\n");
  }
  for (const v1::Incident& inc : incidents.incidents()) {
    absl::StrAppend(&b, "<tr><td><a href=\"/incidents/", inc.id(), "\">", inc.id(), "</a></td><td>",
                    HtmlEscape(v1::IncidentState_Name(inc.state())), "</td><td>",
                    HtmlEscape(v1::Verdict_Name(inc.verdict())), "</td><td>",
                    absl::StrFormat("%.0f%%", inc.confidence() * 100), "</td><td>step ",
                    inc.onset_step(), "</td><td>", HtmlEscape(inc.trigger()), "</td></tr>\n");
  }
  absl::StrAppend(&b, "</table>\n");
  Page(res, 200, absl::StrCat("spikeguard run ", run.name()), b);
}

void IncidentPage(const Caller& call, const std::string& id_text, httplib::Response& res) {
  int64_t id = 0;
  if (!absl::SimpleAtoi(id_text, &id) || id <= 0) {
    return Fail(res, grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("bad incident id '", id_text, "' (want a positive number)"));
  }
  absl::StatusOr<report::ReportData> data = report::FetchReportData(
      call.stub(), [&](grpc::ClientContext* ctx) { call.Prepare(ctx); }, id);
  if (!data.ok()) {
    return Fail(res, static_cast<grpc::StatusCode>(data.status().code()),
                std::string(data.status().message()));
  }
  const std::string run_link = absl::StrCat("<p><a href=\"/runs/", PathEscape(data->incident.run()),
                                            "\">run ", HtmlEscape(data->incident.run()), "</a></p>\n");
  Page(res, 200, absl::StrCat("spikeguard incident ", id), run_link + report::RenderIncidentBody(*data));
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1";
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpOptions& options, const auth::Authorizer* authorizer, metrics::Registry* metrics,
    std::shared_ptr<grpc::Channel> channel) {
  std::string host = "127.0.0.1";
  std::string port_text = options.listen;
  if (const size_t colon = options.listen.rfind(':'); colon != std::string::npos) {
    host = options.listen.substr(0, colon);
    port_text = options.listen.substr(colon + 1);
    if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
    if (host.empty()) host = "127.0.0.1";
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad --http-listen '", options.listen, "' (want HOST:PORT, :PORT or PORT)"));
  }
  const bool want_tls = !options.tls_cert_file.empty();
  if (!want_tls && !IsLoopbackHost(host) && !options.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http-listen ", options.listen,
        " is not a loopback address: give --tls-cert and --tls-key, or --insecure to serve the web "
        "view in clear text"));
  }
  std::unique_ptr<HttpServer> http(new HttpServer());
  http->authorizer_ = authorizer;
  http->metrics_ = metrics;
  http->channel_ = std::move(channel);
  if (want_tls) {
    auto ssl = std::make_unique<StreamServer<httplib::SSLServer>>(
        options.tls_cert_file.c_str(), options.tls_key_file.c_str(),
        options.tls_client_ca_file.empty() ? nullptr : options.tls_client_ca_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the web view cannot use --tls-cert '", options.tls_cert_file, "' / --tls-key '",
          options.tls_key_file, "'", options.tls_client_ca_file.empty() ? "" : " / --tls-client-ca"));
    }
    http->ssl_ctx_ = ssl->ssl_context();
    http->requests_ = ssl.get();
    http->server_ = std::move(ssl);
    http->tls_ = true;
  } else {
    auto plain = std::make_unique<StreamServer<httplib::Server>>();
    http->requests_ = plain.get();
    http->server_ = std::move(plain);
  }
  http->server_->set_payload_max_length(64 << 10);
  http->Install();
  if (port == 0) {
    http->port_ = http->server_->bind_to_any_port(host);
    if (http->port_ <= 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  } else {
    if (!http->server_->bind_to_port(host, port)) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen, " (web view)"));
    }
    http->port_ = port;
  }
  // Connections are accepted and read by the connection loop (deadlines and
  // a cap); cpp-httplib parses and routes each request.
  auto loop = ConnectionLoop::Start(http->requests_, http->ssl_ctx_, options.limits);
  if (!loop.ok()) return loop.status();
  http->connections_ = std::move(*loop);
  SG_LOG(INFO) << "web view on " << (http->tls_ ? "https://" : "http://") << host << ":" << http->port_;
  return http;
}

void HttpServer::Install() {
  auto stub = std::shared_ptr<v1::SupervisorService::Stub>(v1::SupervisorService::NewStub(channel_));
  const auth::Authorizer* authorizer = authorizer_;
  metrics::Registry* registry = metrics_;
  httplib::Server& s = *server_;
  s.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content("ok\n", "text/plain; charset=utf-8");
  });
  s.Get("/metrics", [authorizer, registry](const httplib::Request& req, httplib::Response& res) {
    const std::optional<std::string> bearer = BearerOr401(req, res);
    if (!bearer.has_value()) return;
    absl::StatusOr<auth::Principal> who =
        authorizer->Authenticate(bearer->empty() ? nullptr : &*bearer);
    absl::Status allowed = who.ok() ? authorizer->Authorize(*who, auth::Need::kRead, "Metrics", "")
                                    : who.status();
    if (!allowed.ok()) {
      return Fail(res, static_cast<grpc::StatusCode>(allowed.code()), std::string(allowed.message()));
    }
    // A principal scoped to some runs reads the series of those runs only,
    // none of another run's and no daemon-wide total (it covers them all).
    metrics::Registry::SeriesFilter show;
    if (!who->SeesEveryRun()) {
      show = [who = *who](const metrics::Labels& labels) {
        for (const auto& [name, value] : labels) {
          if (name == "run") return who.MayUseRun(value);
        }
        return false;
      };
    }
    res.set_header("Cache-Control", "no-store");
    res.set_content(registry->Render(show), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/", [stub](const httplib::Request& req, httplib::Response& res) {
    if (std::optional<std::string> bearer = BearerOr401(req, res)) {
      RunsPage(Caller(stub.get(), std::move(*bearer)), res);
    }
  });
  s.Get(R"(/runs/(.+))", [stub](const httplib::Request& req, httplib::Response& res) {
    if (std::optional<std::string> bearer = BearerOr401(req, res)) {
      RunPage(Caller(stub.get(), std::move(*bearer)), req.matches[1].str(), res);
    }
  });
  s.Get(R"(/incidents/([^/]+))", [stub](const httplib::Request& req, httplib::Response& res) {
    if (std::optional<std::string> bearer = BearerOr401(req, res)) {
      IncidentPage(Caller(stub.get(), std::move(*bearer)), req.matches[1].str(), res);
    }
  });
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    Page(res, res.status, absl::StrCat(res.status), absl::StrCat("<h1>", res.status, " ",
                                                                 StatusText(res.status),
                                                                 "</h1>\n"));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    Page(res, 500, "500", "<h1>500 Internal Server Error</h1>\n");
  });
}

void HttpServer::Stop() {
  if (connections_ != nullptr) connections_->Stop();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace spikeguard::daemon
