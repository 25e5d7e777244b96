#include "storage/catalog/store_util.h"

#include "base/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace spikeguard::storage::internal {
namespace {

constexpr char kSelectRunIdSql[] = "SELECT id FROM runs WHERE name = ?";
constexpr char kIncidentExistsSql[] = "SELECT 1 FROM incidents WHERE id = ?";

}  // namespace

std::string Serialize(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

std::string RunNotFound(std::string_view run) {
  return absl::StrCat("run '", Sv(run), "' not found");
}

absl::StatusOr<int64_t> RunId(Database& db, std::string_view name) {
  SG_ASSIGN_OR_RETURN(Statement select, db.Prepare(kSelectRunIdSql));
  select.BindText(1, name);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(RunNotFound(name));
  return select.ColumnInt64(0);
}

absl::Status RequireIncident(Database& db, int64_t id) {
  SG_ASSIGN_OR_RETURN(Statement exists, db.Prepare(kIncidentExistsSql));
  exists.BindInt64(1, id);
  SG_ASSIGN_OR_RETURN(bool row, exists.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("incident ", id, " not found"));
  return absl::OkStatus();
}

}  // namespace spikeguard::storage::internal
