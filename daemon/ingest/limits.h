// limits.h
// -----------------------------------------------------------------------------
// Input limits of the daemon. Everything a worker or operator sends is checked
// against these at the adapter, and a violation is answered with an error that
// names the field, before anything reaches the catalog or the engine.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "spikeguard/v1/telemetry.pb.h"
#include "spikeguard/v1/worker.pb.h"

namespace spikeguard::daemon {

struct Limits {
  int64_t max_message_bytes = 16 << 20;
  int max_reports_per_batch = 4096;
  int max_layers_per_report = 1024;
  int max_domains_per_report = 256;
  int max_documents_per_report = 4096;
  int max_name_length = 128;      // run names, domain names, hosts
  int max_string_length = 4096;   // URIs, checksums, messages
  uint32_t max_world_size = 1 << 20;
  uint32_t max_layer_index = 1 << 16;
  // A report's step may lead the run's last known step (or the schedule's
  // total_steps from the hello) by at most this much; a skip window spans at
  // most this many steps.
  int64_t max_step_ahead = 1 << 24;
  // Serialized bytes of a RunSpec the catalog stores.
  int64_t max_spec_bytes = 64 << 10;
  // Byte budget of one list or telemetry response: well under the 4 MB a
  // default gRPC client accepts; the rest comes in further pages.
  int64_t max_response_bytes = 1 << 20;
  // A worker stream must send its hello within this; at most this many
  // streams may be waiting for theirs at once, and (with authentication on)
  // at most max_pending_hellos_per_principal of one principal, so that one
  // token cannot hold every slot and lock the other workers out.
  absl::Duration hello_timeout = absl::Seconds(10);
  int max_pending_hellos = 64;
  int max_pending_hellos_per_principal = 16;
  // Worker- or client-supplied text written to the daemon's log: escaped
  // and cut to this many bytes.
  int max_logged_text = 512;
};

// Text from a worker or client made safe for one log line: control
// characters, backslashes and invalid UTF-8 escaped (\n, \x01, ...), cut to
// `max_len` bytes of the original with a "...(N bytes)" marker.
std::string LogText(absl::string_view text, size_t max_len = 512);

// The first string field of `bytes` (a serialized message of type
// `descriptor`) that is not valid UTF-8, as a path such as
// "reports.reports[2].domain_losses[0].domain"; "" when every string field
// is valid (or the bytes do not parse at all).
std::string FindInvalidUtf8Field(const google::protobuf::Descriptor* descriptor,
                                 absl::string_view bytes);

// Every field of a CreateRunRequest that is not about the launch profile:
// name, world_size, mode, the spec's size, its manifest (blend weights,
// data plan ranges, sizes).
absl::Status ValidateCreateRunRequest(const spikeguard::v1::CreateRunRequest& request,
                                      const Limits& limits);

// A data plan: ranges with 0 <= begin < end (end = -1: unbounded, last
// only), bounded count; masks at non-negative positions.
absl::Status ValidateDataPlan(absl::string_view field, const spikeguard::v1::DataPlan& plan,
                              const Limits& limits);

// A step window from..to (inclusive) named by an operator: from >= 0,
// to >= from, and at most max_step_ahead steps long; the messages name
// `from_field` / `to_field` and the values.
absl::Status ValidateStepWindow(absl::string_view from_field, int64_t from,
                                absl::string_view to_field, int64_t to, const Limits& limits);

// Steps of an already validated batch against the rank's and run's
// progress: no step more than max_step_ahead past `last_step` (the largest
// of the run's last step, the rank's committed step and the hello's
// total_steps; -1 when nothing is known).
absl::Status ValidateStepsAhead(const spikeguard::v1::StepReportBatch& batch, int64_t last_step,
                                const Limits& limits);

// A run name: 1..max_name_length of [A-Za-z0-9._-], not starting with '.'.
absl::Status ValidateRunName(absl::string_view name, const Limits& limits);

// A free-form string: bounded length, valid UTF-8, no control characters
// other than tab.
absl::Status ValidateText(absl::string_view field, absl::string_view value, size_t max_len);

absl::Status ValidateHello(const spikeguard::v1::Hello& hello, const Limits& limits);

// Checks one report; `field` prefixes the messages ("reports[3]").
absl::Status ValidateStepReport(const spikeguard::v1::StepReport& report, absl::string_view field,
                                const Limits& limits);

// Checks a whole batch, including that steps strictly increase within it.
absl::Status ValidateBatch(const spikeguard::v1::StepReportBatch& batch, const Limits& limits);

absl::Status ValidateCheckpointSaved(const spikeguard::v1::CheckpointSaved& ckpt,
                                     const Limits& limits);

// generation >= 0, last_step >= -1, a bounded reason.
absl::Status ValidateGenerationEnded(const spikeguard::v1::GenerationEnded& ended,
                                     const Limits& limits);

// step >= 0 and a non-empty, bounded URI.
absl::Status ValidateCheckpointDeleted(const spikeguard::v1::CheckpointDeleted& deleted,
                                       const Limits& limits);

}  // namespace spikeguard::daemon
