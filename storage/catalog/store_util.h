// store_util.h
// -----------------------------------------------------------------------------
// What the catalog's stores share: records stored as serialized protos
// (deterministic bytes, so equal records compare equal), their parsing with
// a DATA_LOSS error naming the record, and the lookups of a run's or an
// incident's row id that most tables key by. Internal to storage/catalog.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage::internal {

// Debian's Abseil is built with its own string_view type, which does not
// convert from std::string_view.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Map fields (Manifest.blend) serialize in hash order unless asked not to;
// byte-comparable records need the deterministic form.
std::string Serialize(const google::protobuf::MessageLite& message);

template <typename Message>
absl::StatusOr<Message> Parse(const std::string& blob, std::string_view what) {
  Message message;
  if (!message.ParseFromString(blob)) {
    return absl::DataLossError(absl::StrCat("corrupt ", Sv(what), " record in catalog"));
  }
  return message;
}

std::string RunNotFound(std::string_view run);

// The row id of run `name`; NOT_FOUND when there is none.
absl::StatusOr<int64_t> RunId(Database& db, std::string_view name);
// OK when incident `id` exists, else NOT_FOUND.
absl::Status RequireIncident(Database& db, int64_t id);

}  // namespace spikeguard::storage::internal
