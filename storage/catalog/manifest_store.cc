#include "storage/catalog/manifest_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/catalog/store_util.h"

namespace spikeguard::storage {
namespace {

using internal::Sv;

constexpr char kInsertManifestSql[] =
    "INSERT INTO manifests (run_id, version, dataset_fingerprint, seed, global_batch_size, "
    "sequence_length, record) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (run_id, version) DO NOTHING";
constexpr char kSelectManifestSql[] =
    "SELECT record FROM manifests WHERE run_id = ? AND version = ?";

}  // namespace

absl::Status ManifestStore::Put(std::string_view run, const v1::Manifest& m) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  const std::string record = internal::Serialize(m);
  {
    SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertManifestSql));
    insert.BindInt64(1, run_id)
        .BindInt64(2, m.version())
        .BindText(3, m.dataset_fingerprint())
        .BindInt64(4, static_cast<int64_t>(m.seed()))  // bit pattern of the uint64
        .BindInt64(5, m.global_batch_size())
        .BindInt64(6, m.sequence_length())
        .BindBlob(7, record);
    SG_RETURN_IF_ERROR(insert.Run());
  }
  if (db_->Changes() == 0) {
    // Only an identical resend is fine.
    SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectManifestSql));
    select.BindInt64(1, run_id).BindInt64(2, m.version());
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (row && select.ColumnBlob(0) != record) {
      return absl::AlreadyExistsError(absl::StrCat("manifest version ", m.version(), " of run '",
                                                   Sv(run), "' already exists with other content"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Manifest> ManifestStore::Get(std::string_view run, int64_t version) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectManifestSql));
  select.BindInt64(1, run_id).BindInt64(2, version);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) {
    return absl::NotFoundError(
        absl::StrCat("manifest version ", version, " of run '", Sv(run), "' not found"));
  }
  return internal::Parse<v1::Manifest>(select.ColumnBlob(0), "manifest");
}

}  // namespace spikeguard::storage
