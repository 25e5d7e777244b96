// schema.h
// -----------------------------------------------------------------------------
// The catalog's schema and its forward-only migrations, keyed by
// `PRAGMA user_version`. A file written by a newer spikeguard (user_version
// greater than `kSchemaVersion`) is refused with FAILED_PRECONDITION before
// anything is written to it, so an older binary never damages a newer catalog.
//
//   SG_ASSIGN_OR_RETURN(auto db, Database::Open(options));
//   SG_RETURN_IF_ERROR(OpenSchema(*db));   // check, enable WAL, migrate
//
// Adding a table or column: bump `kSchemaVersion`, add a `case` to the switch
// in schema.cc that upgrades from the previous version. Each step runs in its
// own transaction, so a crash mid-migration leaves the last completed version.
#pragma once

#include <array>
#include <string_view>

#include "absl/status/status.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

// The schema version this binary writes.
inline constexpr int kSchemaVersion = 10;

// Every table of the current schema (for tests and `spikectl` diagnostics).
inline constexpr std::array<std::string_view, 14> kCatalogTables = {
    "runs",          "generations", "checkpoints",     "manifests",
    "step_telemetry", "rank_progress", "incidents",     "incident_events",
    "commands",      "quarantine",  "audit",           "policies",
    "launches",      "precursor_warnings"};

// Refuses a newer file, enables WAL and migrates `db` to `kSchemaVersion`.
absl::Status OpenSchema(Database& db);

// Only the migrations (the file is known to be ours and in the right mode).
absl::Status MigrateSchema(Database& db);

}  // namespace spikeguard::storage
