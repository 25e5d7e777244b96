// format.h
// -----------------------------------------------------------------------------
// How spikectl prints the daemon's answers: tables for people, JSON for
// scripts.
//
// JSON is protobuf's canonical mapping with proto field names and every
// primitive field present (zeros included), on one line, so
// `spikectl --output=json runs list | jq .runs[0].name` works and each watch
// update is one line. NaN and infinities appear as "NaN", "Infinity",
// "-Infinity" (the proto3 JSON spelling) and parse back to the same values.
//
//   std::string json = ToJson(response);   // no trailing newline
//   out << FormatRunList(response);        // aligned table, '\n'-terminated
//
// Every Format* function returns complete lines. Enum values print in lower
// case without their prefix ("observe", "awaiting_approval", "data").
#pragma once

#include <string>

#include "absl/types/span.h"
#include "cli/telemetry_metrics.h"
#include "google/protobuf/message.h"
#include "spikeguard/v1/supervisor.pb.h"

namespace spikeguard::cli {

std::string ToJson(const google::protobuf::Message& message);

std::string ModeName(spikeguard::v1::Mode mode);
std::string IncidentStateName(spikeguard::v1::IncidentState state);
std::string VerdictName(spikeguard::v1::Verdict verdict);
// "[0,100) [120,inf)"; an empty plan is the default "[0,inf)".
std::string FormatDataPlan(const spikeguard::v1::DataPlan& plan);

std::string FormatStatus(const spikeguard::v1::ServerStatus& status);
std::string FormatRunList(const spikeguard::v1::ListRunsResponse& runs);
// The run, then its ranks (last step, last seen) and its generations.
std::string FormatRun(const spikeguard::v1::Run& run);
std::string FormatCheckpoints(const spikeguard::v1::ListCheckpointsResponse& checkpoints);
// Columns step, gen, ranks, then one per metric.
std::string FormatTelemetry(const spikeguard::v1::QueryTelemetryResponse& response,
                            absl::Span<const TelemetryMetric> metrics);
std::string FormatIncidentList(const spikeguard::v1::ListIncidentsResponse& incidents);
// Every field: summary, localization, evidence (probes), documents, fix,
// recommendations, cost, events.
std::string FormatIncident(const spikeguard::v1::Incident& incident);
// One line per update, for `incidents watch`.
std::string FormatIncidentUpdate(const spikeguard::v1::IncidentUpdate& update);
// Precursor warnings: a table (spikectl warnings list), the active ones under
// `spikectl status` ("" when none), and the line under `spikectl incidents
// list` that counts them by state ("" when none).
std::string FormatWarningList(const spikeguard::v1::ListWarningsResponse& warnings);
std::string FormatActiveWarnings(const spikeguard::v1::ListWarningsResponse& warnings);
std::string FormatWarningSummary(const spikeguard::v1::ListWarningsResponse& warnings);
std::string FormatAction(const spikeguard::v1::ActionResponse& response);
// Text format, so `policy get > p.txt` can be edited and fed to `policy set`.
std::string FormatPolicy(const spikeguard::v1::Policy& policy);
std::string FormatManifest(const spikeguard::v1::ResolveManifestResponse& response);
std::string FormatQuarantine(const spikeguard::v1::ListQuarantineResponse& response);
// Newest first as the daemon sends them; the "SupervisorService/" prefix of
// the RPC is left out.
std::string FormatAudit(const spikeguard::v1::ListAuditResponse& response);

}  // namespace spikeguard::cli
