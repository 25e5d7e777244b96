// limits.h
// -----------------------------------------------------------------------------
// Input limits of the daemon. Everything a worker or operator sends is checked
// against these at the adapter, and a violation is answered with an error that
// names the field, before anything reaches the catalog or the engine.
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
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
};

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
