// incident_report.h
// -----------------------------------------------------------------------------
// The incident report: one self-contained HTML page (inline SVG, inline CSS,
// no scripts, no network fetches) with the verdict, the evidence, plots of
// the original generation and every probe's generation overlaid around the
// spike, the localization, the culprit documents, the fix and the cost.
//
//   absl::StatusOr<report::ReportData> data =
//       report::FetchReportData(stub, prepare_context, incident_id);
//   std::string html = report::RenderIncidentReport(*data);
//
// Fetching uses only the public SupervisorService API (GetIncident, GetRun,
// QueryTelemetry), so spikectl and the daemon's web view build the same page.
// Everything user-supplied is HTML-escaped (report/html.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/client_context.h"
#include "report/svg_plot.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"

namespace spikeguard::report {

struct ReportData {
  spikeguard::v1::Incident incident;
  // Empty when the run could not be read (the report says so).
  spikeguard::v1::Run run;
  // Telemetry of the window, by generation: the incident's generation and
  // every probe's.
  std::map<int64_t, std::vector<spikeguard::v1::StepRecord>> telemetry;
  int64_t window_from = 0;
  int64_t window_to = 0;
  // What could not be fetched (shown in the report, not fatal).
  std::vector<std::string> warnings;
};

// The step window a report plots: from the earliest probe's checkpoint (the
// rewind checkpoint) to past the furthest horizon; without probes, 100 steps
// before the (precursor) onset to 50 past the peak.
void ChooseWindow(const spikeguard::v1::Incident& incident, int64_t* from, int64_t* to);

// Called on every ClientContext before its RPC: deadline, credentials.
using PrepareContext = std::function<void(grpc::ClientContext*)>;

// GetIncident is required (its error is returned with the gRPC code mapped
// to absl); the run and the telemetry are best effort (warnings).
absl::StatusOr<ReportData> FetchReportData(spikeguard::v1::SupervisorService::StubInterface* stub,
                                           const PrepareContext& prepare, int64_t incident_id);

// The report's plots, in page order: the loss zoomed on the spike, then loss,
// grad norm, clip rate, lse, and the per-layer max attention logit, update
// ratio and activation RMS (the original's layers, with every probe on the
// layer the localization says moved first), each with the incident's marks.
std::vector<Plot> IncidentPlots(const ReportData& data);

// The page. `self_contained` pages carry their own CSS and no links out.
std::string RenderIncidentReport(const ReportData& data);

// The report body alone (the web view wraps it in its own page).
std::string RenderIncidentBody(const ReportData& data);

// Shared by the web view: the page skeleton with the report's CSS.
std::string HtmlPage(const std::string& title, const std::string& body);

}  // namespace spikeguard::report
