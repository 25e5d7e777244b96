// manifest_store.h
// -----------------------------------------------------------------------------
// Data-order manifests (table `manifests`), keyed by (run, version): the
// dataset fingerprint, seed, batch size and sequence length as columns, the
// whole manifest (blend, plan, corpus dir) as its record. Immutable once
// written: the same content again is OK, other content under the same
// version is ALREADY_EXISTS (the data order must never change under it).
//
//   ManifestStore manifests(db);
//   SG_RETURN_IF_ERROR(manifests.Put("gpt-7b", manifest));
//
// Not thread-safe; opens no transaction (see run_store.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

class ManifestStore {
 public:
  explicit ManifestStore(Database* db) : db_(db) {}

  absl::Status Put(std::string_view run, const v1::Manifest& m);
  // NOT_FOUND for an unknown run or version.
  absl::StatusOr<v1::Manifest> Get(std::string_view run, int64_t version);

 private:
  Database* const db_;
};

}  // namespace spikeguard::storage
