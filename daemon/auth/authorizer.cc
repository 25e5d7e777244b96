#include "daemon/auth/authorizer.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/secret.h"

namespace spikeguard::auth {
namespace {

constexpr char kHint[] =
    "send 'authorization: Bearer <token>' (spikectl --token-file / SPIKEGUARD_TOKEN)";

std::string NeedName(Need need) {
  switch (need) {
    case Need::kRead:
      return "viewer";
    case Need::kWorker:
      return "worker";
    case Need::kOperate:
      return "operator";
    case Need::kAdmin:
      return "admin";
  }
  return "admin";
}

bool RoleSatisfies(Role role, Need need) {
  switch (need) {
    case Need::kRead:
      return true;
    case Need::kWorker:
      return role == Role::kWorker || role == Role::kOperator || role == Role::kAdmin;
    case Need::kOperate:
      return role == Role::kOperator || role == Role::kAdmin;
    case Need::kAdmin:
      return role == Role::kAdmin;
  }
  return false;
}

std::string RunsOf(const Principal& p) {
  if (p.all_runs) return "*";
  std::string runs = absl::StrJoin(p.runs, ",");
  return runs.size() > 200 ? runs.substr(0, 200) + "..." : runs;
}

}  // namespace

std::unique_ptr<Authorizer> Authorizer::Disabled() {
  return std::unique_ptr<Authorizer>(new Authorizer());
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::FromFile(const std::string& tokens_file) {
  auto entries = LoadTokensFile(tokens_file);
  if (!entries.ok()) return entries.status();
  std::unique_ptr<Authorizer> a(new Authorizer());
  a->enabled_ = true;
  a->tokens_file_ = tokens_file;
  absl::MutexLock lock(&a->mu_);
  a->entries_ = std::move(*entries);
  return a;
}

std::unique_ptr<Authorizer> Authorizer::FromEntries(std::vector<TokenEntry> entries) {
  std::unique_ptr<Authorizer> a(new Authorizer());
  a->enabled_ = true;
  absl::MutexLock lock(&a->mu_);
  a->entries_ = std::move(entries);
  return a;
}

absl::Status Authorizer::Reload() {
  if (tokens_file_.empty()) return absl::OkStatus();
  auto entries = LoadTokensFile(tokens_file_);
  if (!entries.ok()) return entries.status();
  {
    absl::MutexLock lock(&mu_);
    entries_ = std::move(*entries);
  }
  epoch_.fetch_add(1);
  return absl::OkStatus();
}

namespace {

constexpr absl::string_view kWorkerTokenPrefix = "sgw2:";

// What a launched worker's token authenticates: the run and its
// incarnation (a later run of the same name is another).
std::string WorkerTokenMac(const std::string& key, const std::string& run,
                           const std::string& incarnation) {
  return HmacSha256Hex(key, absl::StrCat("sgw2\n", run, "\n", incarnation));
}

}  // namespace

void Authorizer::SetWorkerTokenKey(std::string key) {
  absl::MutexLock lock(&mu_);
  worker_token_key_ = std::move(key);
}

void Authorizer::SetWorkerRunLookup(WorkerRunLookup lookup) {
  absl::MutexLock lock(&mu_);
  worker_run_lookup_ = std::move(lookup);
}

std::string Authorizer::WorkerTokenFor(const std::string& run) const {
  if (!enabled_) return "";
  std::string key;
  WorkerRunLookup lookup;
  {
    absl::MutexLock lock(&mu_);
    key = worker_token_key_;
    lookup = worker_run_lookup_;
  }
  if (key.empty() || !lookup) return "";
  absl::StatusOr<WorkerRun> found = lookup(run);
  if (!found.ok() || found->ended || found->incarnation.empty()) return "";
  return absl::StrCat(kWorkerTokenPrefix, run, ":", WorkerTokenMac(key, run, found->incarnation));
}

absl::StatusOr<Principal> Authorizer::Authenticate(const std::string* authorization) const {
  if (!enabled_) {
    Principal anonymous;
    anonymous.name = "anonymous";
    anonymous.role = Role::kAdmin;
    anonymous.all_runs = true;
    return anonymous;
  }
  if (authorization == nullptr || authorization->empty()) {
    return absl::UnauthenticatedError(absl::StrCat("missing bearer token: ", kHint));
  }
  absl::string_view value = *authorization;
  if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError(
        absl::StrCat("the authorization metadata is not 'Bearer <token>': ", kHint));
  }
  absl::string_view token = absl::StripAsciiWhitespace(value.substr(7));
  if (absl::Status s = CheckTokenText(token); !s.ok()) return s;
  std::string key;
  WorkerRunLookup lookup;
  {
    absl::MutexLock lock(&mu_);
    if (const TokenEntry* e = FindToken(entries_, token); e != nullptr) return e->principal;
    key = worker_token_key_;
    lookup = worker_run_lookup_;
  }
  // A launched worker's token: "sgw2:RUN:MAC", the MAC recomputed over the
  // run's incarnation now and compared in constant time; the run must not
  // have ended. The lookup runs without the lock (it reads the catalog).
  if (absl::StartsWith(token, kWorkerTokenPrefix) && !key.empty() && lookup) {
    absl::string_view rest = token.substr(kWorkerTokenPrefix.size());
    const size_t colon = rest.rfind(':');
    if (colon != absl::string_view::npos && colon > 0) {
      const std::string run(rest.substr(0, colon));
      absl::StatusOr<WorkerRun> found = lookup(run);
      if (found.ok() && !found->incarnation.empty() &&
          ConstantTimeEquals(rest.substr(colon + 1), WorkerTokenMac(key, run, found->incarnation))) {
        if (found->ended) {
          return absl::UnauthenticatedError(absl::StrCat(
              "the bearer token is that of the workers the daemon launched for run '",
              run.substr(0, 128), "', which has ended (", found->state,
              "): a launched worker's token opens nothing once its run is over"));
        }
        Principal worker;
        worker.name = "launcher:" + run;
        worker.role = Role::kWorker;
        worker.runs.insert(run);
        return worker;
      }
    }
  }
  return absl::UnauthenticatedError(
      "the bearer token matches no principal in the daemon's tokens file (revoked, mistyped, or "
      "meant for another daemon)");
}

absl::StatusOr<Principal> Authorizer::Authenticate(const grpc::ServerContextBase& ctx) const {
  std::optional<std::string> header = BearerHeader(ctx);
  return Authenticate(header ? &*header : nullptr);
}

absl::Status Authorizer::AuthorizeRole(const Principal& who, Need need,
                                       const std::string& rpc) const {
  if (!enabled_ || RoleSatisfies(who.role, need)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("principal '", who.name, "' (role ",
                                                  RoleName(who.role), ") may not call ", rpc,
                                                  ": it needs the role ", NeedName(need),
                                                  need == Need::kAdmin ? "" : " or above"));
}

absl::Status Authorizer::Authorize(const Principal& who, Need need, const std::string& rpc,
                                   const std::string& run) const {
  if (!enabled_) return absl::OkStatus();
  if (!RoleSatisfies(who.role, need)) {
    return absl::PermissionDeniedError(absl::StrCat("principal '", who.name, "' (role ",
                                                    RoleName(who.role), ") may not call ", rpc,
                                                    ": it needs the role ", NeedName(need),
                                                    need == Need::kAdmin ? "" : " or above"));
  }
  if (run.empty()) {
    // A call over every run (or the daemon-wide default): only principals
    // that may use every run.
    if (!who.all_runs && who.role != Role::kAdmin && need != Need::kRead) {
      return absl::PermissionDeniedError(absl::StrCat(
          "principal '", who.name, "' may use only the runs ", RunsOf(who), ": ", rpc,
          " without a run acts on every run"));
    }
    return absl::OkStatus();
  }
  if (!who.MayUseRun(run)) {
    return absl::PermissionDeniedError(
        absl::StrCat("principal '", who.name, "' (role ", RoleName(who.role),
                     ") may not use run '", run.substr(0, 128), "' (its runs: ", RunsOf(who), ")"));
  }
  return absl::OkStatus();
}

grpc::Status Authorizer::Check(const grpc::ServerContextBase& ctx, Need need,
                               const std::string& rpc, const std::string& run,
                               Principal* who) const {
  auto principal = Authenticate(ctx);
  if (!principal.ok()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        std::string(principal.status().message()));
  }
  if (absl::Status s = Authorize(*principal, need, rpc, run); !s.ok()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::string(s.message()));
  }
  if (who != nullptr) *who = std::move(*principal);
  return grpc::Status::OK;
}

absl::Status CheckTokenText(absl::string_view token) {
  if (token.empty() || token.size() > 4096) {
    return absl::UnauthenticatedError(absl::StrCat("empty or oversized bearer token: ", kHint));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::UnauthenticatedError(absl::StrFormat(
          "the bearer token holds byte 0x%02x at offset %d: a token is printable ASCII "
          "(0x21-0x7e), no spaces, control characters or UTF-8",
          c, i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> BearerFromHttpAuthorization(absl::string_view header) {
  absl::string_view h = absl::StripAsciiWhitespace(header);
  if (h.empty()) return std::string();
  absl::string_view token;
  std::string decoded;
  if (h.size() > 7 && absl::EqualsIgnoreCase(h.substr(0, 7), "bearer ")) {
    token = absl::StripAsciiWhitespace(h.substr(7));
  } else if (h.size() > 6 && absl::EqualsIgnoreCase(h.substr(0, 6), "basic ")) {
    if (!absl::Base64Unescape(absl::StripAsciiWhitespace(h.substr(6)), &decoded)) {
      return absl::UnauthenticatedError(
          "the Authorization header's Basic credentials are not base64");
    }
    const size_t colon = decoded.find(':');
    if (colon == std::string::npos) {
      return absl::UnauthenticatedError(
          "the Authorization header's Basic credentials are not 'user:token'");
    }
    token = absl::string_view(decoded).substr(colon + 1);
  } else {
    return absl::UnauthenticatedError(
        "the Authorization header is neither 'Bearer <token>' nor 'Basic <base64 of "
        "user:token>'");
  }
  if (absl::Status s = CheckTokenText(token); !s.ok()) return s;
  return absl::StrCat("Bearer ", token);
}

grpc::Status Authorizer::Recheck(const grpc::ServerContextBase& ctx, Need need,
                                 const std::string& rpc, const std::string& run,
                                 std::atomic<uint64_t>* seen) const {
  const uint64_t now = epoch_.load();
  if (seen->load() == now) return grpc::Status::OK;
  // A reload while this check runs leaves `seen` behind: checked again.
  grpc::Status s = Check(ctx, need, rpc, run);
  if (s.ok()) seen->store(now);
  return s;
}

std::optional<std::string> BearerHeader(const grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

bool IsLoopbackAddress(const std::string& host_port) {
  std::string host = host_port;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == std::string::npos ? 0 : host.find(']') - 1);
  } else if (auto colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  if (absl::StartsWith(host, "ipv4:")) host = host.substr(5);
  if (host == "localhost" || host == "::1") return true;
  return absl::StartsWith(host, "127.");
}

}  // namespace spikeguard::auth
