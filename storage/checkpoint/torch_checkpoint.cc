#include "storage/checkpoint/torch_checkpoint.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace spikeguard::storage {
namespace {

constexpr char kMagic[8] = {'S', 'G', 'T', 'O', 'R', 'C', 'H', '1'};

absl::Status Corrupt(absl::string_view source, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", source, " has a bad header: ", what));
}

// A JSON number that is a non-negative integer (JSON numbers arrive as
// doubles; checkpoint counts stay far below 2^53).
bool AsCount(const google::protobuf::Value& v, int64_t* out) {
  if (v.kind_case() != google::protobuf::Value::kNumberValue) return false;
  const double d = v.number_value();
  if (!(d >= 0) || d > 9007199254740992.0 || std::floor(d) != d) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

}  // namespace

bool HasTorchCheckpointMagic(absl::string_view head) {
  return head.size() >= sizeof(kMagic) && std::memcmp(head.data(), kMagic, sizeof(kMagic)) == 0;
}

absl::StatusOr<uint32_t> TorchCheckpointHeaderLength(absl::string_view prefix,
                                                     absl::string_view source) {
  if (prefix.size() < kTorchCheckpointPrefixSize || !HasTorchCheckpointMagic(prefix)) {
    return Corrupt(source, "not a spikeguard PyTorch checkpoint");
  }
  uint32_t n = 0;
  for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(prefix[8 + i]);
  if (n > kTorchCheckpointMaxHeader) return Corrupt(source, absl::StrCat("claims ", n, " bytes"));
  return n;
}

absl::StatusOr<TorchCheckpointHeader> ParseTorchCheckpointHeader(absl::string_view json,
                                                                 absl::string_view source) {
  google::protobuf::Struct obj;
  if (auto st = google::protobuf::util::JsonStringToMessage(std::string(json), &obj); !st.ok()) {
    return Corrupt(source, absl::StrCat("not a JSON object (", st.message().as_string(), ")"));
  }
  const auto& fields = obj.fields();
  auto get = [&](const char* key) -> const google::protobuf::Value* {
    auto it = fields.find(key);
    return it == fields.end() ? nullptr : &it->second;
  };
  int64_t format = 0;
  if (const auto* v = get("format"); v == nullptr || !AsCount(*v, &format) ||
                                     format != kTorchCheckpointFormat) {
    return Corrupt(source, absl::StrCat("unsupported format (this build reads ",
                                        kTorchCheckpointFormat, ")"));
  }
  TorchCheckpointHeader h;
  for (auto [key, out] : {std::pair<const char*, int64_t*>{"step", &h.step},
                          {"data_position", &h.data_position},
                          {"payload_bytes", &h.payload_bytes}}) {
    const auto* v = get(key);
    if (v == nullptr || !AsCount(*v, out)) {
      return Corrupt(source, absl::StrCat("no ", key, " (a non-negative integer)"));
    }
  }
  const auto* sha = get("sha256");
  if (sha == nullptr || sha->kind_case() != google::protobuf::Value::kStringValue ||
      sha->string_value().size() != 64 ||
      sha->string_value().find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return Corrupt(source, "no sha256 (64 hex digits)");
  }
  h.sha256 = absl::AsciiStrToLower(sha->string_value());
  h.payload_offset = static_cast<int64_t>(kTorchCheckpointPrefixSize + json.size());
  return h;
}

}  // namespace spikeguard::storage
