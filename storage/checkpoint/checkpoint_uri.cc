#include "storage/checkpoint/checkpoint_uri.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/escaping.h"

namespace spikeguard::storage {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The text between quotes, non-printable bytes escaped, at most 256 bytes.
std::string Quoted(absl::string_view text) {
  const absl::string_view head = text.substr(0, 256);
  return absl::StrCat("'", absl::CHexEscape(head), text.size() > head.size() ? "...'" : "'");
}

absl::Status Bad(absl::string_view uri, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("uri ", Quoted(uri), ": ", why));
}

}  // namespace

absl::StatusOr<std::string> CheckpointPathOfUri(absl::string_view uri) {
  if (uri.empty()) return absl::InvalidArgumentError("uri: empty");
  if (uri.size() > kMaxCheckpointUri) {
    return absl::InvalidArgumentError(absl::StrCat("uri: longer than ", kMaxCheckpointUri, " bytes"));
  }
  if (uri.find('\0') != absl::string_view::npos) return Bad(uri, "contains NUL");
  std::string path;
  if (absl::StartsWith(uri, "file://")) {
    absl::string_view rest = uri.substr(7);
    const size_t slash = rest.find('/');
    const absl::string_view host = rest.substr(0, slash);
    if (!host.empty() && !absl::EqualsIgnoreCase(host, "localhost")) {
      return Bad(uri, absl::StrCat("host ", Quoted(host),
                                   " is not this machine: a file:// URI names a local path "
                                   "(file:///PATH or file://localhost/PATH)"));
    }
    if (slash == absl::string_view::npos) {
      return Bad(uri, "a file:// URI must name a local absolute path (file:///PATH)");
    }
    rest = rest.substr(slash);
    if (rest.find_first_of("?#;") != absl::string_view::npos) {
      return Bad(uri, "'?', '#' and ';' (a query, fragment or parameters) are not part of a "
                      "checkpoint URI; encode them in a file name as %3F, %23 and %3B");
    }
    for (size_t i = 0; i < rest.size(); ++i) {
      if (rest[i] != '%') {
        path.push_back(rest[i]);
        continue;
      }
      if (i + 2 >= rest.size() || HexValue(rest[i + 1]) < 0 || HexValue(rest[i + 2]) < 0) {
        return Bad(uri, absl::StrCat("bad %-escape at byte ", 7 + slash + i));
      }
      const char c = static_cast<char>(HexValue(rest[i + 1]) * 16 + HexValue(rest[i + 2]));
      if (c == '\0') return Bad(uri, "contains NUL (%00)");
      if (c == '/') return Bad(uri, "an encoded '/' (%2F) is not a file name's byte");
      path.push_back(c);
      i += 2;
    }
  } else if (uri.find("://") != absl::string_view::npos ||
             (uri[0] != '/' && uri.find(':') != absl::string_view::npos)) {
    return Bad(uri, "only a local path or a file:// URI names a checkpoint");
  } else {
    path = std::string(uri);
  }
  if (path.empty() || path[0] != '/') {
    return Bad(uri, "a relative path; give an absolute path in the run's checkpoint root");
  }
  for (absl::string_view segment : absl::StrSplit(path, '/')) {
    if (segment == "." || segment == "..") {
      return Bad(uri, absl::StrCat("a '", segment,
                                   "' segment: name the checkpoint by its path without '.' or '..'"));
    }
  }
  return path;
}

std::string CheckpointUriOfPath(absl::string_view absolute_path) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string uri = "file://";
  for (char c : absolute_path) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
      uri.push_back(c);
    } else {
      uri.push_back('%');
      uri.push_back(kDigits[u >> 4]);
      uri.push_back(kDigits[u & 15]);
    }
  }
  return uri;
}

}  // namespace spikeguard::storage
