#include "daemon/auth/tokens.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/secret.h"

namespace spikeguard::auth {

std::string RoleName(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kViewer:
      return "viewer";
    case Role::kOperator:
      return "operator";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  if (name == "worker") return Role::kWorker;
  if (name == "viewer") return Role::kViewer;
  if (name == "operator") return Role::kOperator;
  if (name == "admin") return Role::kAdmin;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role '", name.substr(0, 32), "' (known: worker, viewer, operator, admin)"));
}

namespace {

bool IsHashField(absl::string_view s) {
  if (!absl::StartsWith(s, "sha256:") || s.size() != 7 + 64) return false;
  for (char c : s.substr(7)) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
  }
  return true;
}

bool IsNameField(absl::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.' && c != '@') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<TokenEntry>> ParseTokens(absl::string_view text) {
  std::vector<TokenEntry> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"),
                                                           absl::SkipEmpty());
    const std::string where = absl::StrCat("line ", line_no, ": ");
    if (fields.size() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected 4 fields (principal role runs sha256:HASH), found ", fields.size()));
    }
    TokenEntry e;
    if (!IsNameField(fields[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "principal: letters, digits and -_.@ only, 1 to 128 characters"));
    }
    e.principal.name = std::string(fields[0]);
    auto role = ParseRole(fields[1]);
    if (!role.ok()) return absl::InvalidArgumentError(absl::StrCat(where, role.status().message()));
    e.principal.role = *role;
    if (fields[2] == "*") {
      e.principal.all_runs = true;
    } else {
      for (absl::string_view run : absl::StrSplit(fields[2], ',', absl::SkipEmpty())) {
        if (!IsNameField(run)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "runs: '*' or run names separated by commas"));
        }
        e.principal.runs.insert(std::string(run));
      }
      if (e.principal.runs.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "runs: '*' or at least one run"));
      }
      // A run list on an admin would read as a scope the role ignores.
      if (e.principal.role == Role::kAdmin) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "runs: an admin acts on every run, so its runs must be '*' (give a run-scoped "
                   "principal the operator role)"));
      }
    }
    if (!IsHashField(fields[3])) {
      // Most likely a token pasted where its hash belongs: say so without
      // echoing it.
      return absl::InvalidArgumentError(absl::StrCat(
          where, "the last field must be a token hash, sha256: and 64 lowercase hex digits "
                 "(`spikectl token new` prints the line); tokens themselves are never stored"));
    }
    e.hash = std::string(fields[3]);
    for (const TokenEntry& other : out) {
      if (other.principal.name == e.principal.name) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "principal '", e.principal.name, "' appears twice"));
      }
      if (other.hash == e.hash) {
        return absl::InvalidArgumentError(absl::StrCat(where, "principal '", e.principal.name,
                                                       "' has the same token as '",
                                                       other.principal.name, "'"));
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::vector<TokenEntry>> LoadTokensFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    return absl::NotFoundError(absl::StrCat("tokens file '", path, "': cannot be read"));
  }
  std::stringstream buffer;
  buffer << f.rdbuf();
  auto parsed = ParseTokens(buffer.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens file '", path, "': ", parsed.status().message()));
  }
  return parsed;
}

const TokenEntry* FindToken(const std::vector<TokenEntry>& entries, absl::string_view token) {
  const std::string hash = HashToken(token);
  const TokenEntry* found = nullptr;
  for (const TokenEntry& e : entries) {
    // Every entry is compared; the result is only picked up at the end.
    const bool match = ConstantTimeEquals(hash, e.hash);
    if (match && found == nullptr) found = &e;
  }
  return found;
}

}  // namespace spikeguard::auth
