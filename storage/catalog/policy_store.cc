#include "storage/catalog/policy_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/catalog/store_util.h"

namespace spikeguard::storage {
namespace {

constexpr char kPutPolicySql[] =
    "INSERT INTO policies (scope, policy, updated_unix_ms) VALUES (?, ?, ?) "
    "ON CONFLICT (scope) DO UPDATE SET policy = excluded.policy, "
    "updated_unix_ms = excluded.updated_unix_ms";
constexpr char kGetPolicySql[] = "SELECT policy FROM policies WHERE scope = ?";

}  // namespace

absl::Status PolicyStore::Put(std::string_view scope, const v1::Policy& policy) {
  SG_ASSIGN_OR_RETURN(Statement put, db_->Prepare(kPutPolicySql));
  const std::string blob = policy.SerializeAsString();
  put.BindText(1, scope).BindBlob(2, blob).BindInt64(3, clock_->NowUnixMillis());
  return put.Run();
}

absl::StatusOr<v1::Policy> PolicyStore::Get(std::string_view scope) {
  SG_ASSIGN_OR_RETURN(Statement get, db_->Prepare(kGetPolicySql));
  get.BindText(1, scope);
  SG_ASSIGN_OR_RETURN(bool row, get.Step());
  if (!row) {
    return absl::NotFoundError(absl::StrCat("no policy set for '", std::string(scope), "'"));
  }
  return internal::Parse<v1::Policy>(get.ColumnBlob(0),
                                     absl::StrCat("policy of '", std::string(scope), "'"));
}

}  // namespace spikeguard::storage
