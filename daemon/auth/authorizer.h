// authorizer.h
// -----------------------------------------------------------------------------
// Authentication and authorization of every call the daemon serves. The
// bearer token travels as metadata ("authorization: Bearer <token>"); the
// table of principals comes from the tokens file (tokens.h) plus the
// run-scoped worker tokens the daemon mints for the workers it launches
// itself (handed over in their environment, never written anywhere), which
// open only their run, and only while it lives.
//
//   Principal who;
//   if (grpc::Status s = auth->Check(ctx, Need::kOperate, "Rewind", run, &who);
//       !s.ok()) return s;
//
// Missing or unknown token: UNAUTHENTICATED. Known token, wrong role or run:
// PERMISSION_DENIED. Both messages say what was missing; none repeats a
// token. With authentication off (loopback only, --allow-anonymous) every
// caller is the principal "anonymous" with the admin role.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/auth/tokens.h"
#include "grpcpp/server_context.h"

namespace spikeguard::auth {

// What a call needs.
enum class Need {
  kRead,      // any role (a worker or scoped principal: its runs only)
  kWorker,    // attach and register checkpoints: worker, operator, admin
  kOperate,   // actions, approvals, run policy, quarantine: operator, admin
  kAdmin,     // create runs, profiles, the default policy: admin
};

class Authorizer {
 public:
  // Authentication off: everyone is "anonymous" (admin).
  static std::unique_ptr<Authorizer> Disabled();
  // Loads `tokens_file`; the error names the file and line.
  static absl::StatusOr<std::unique_ptr<Authorizer>> FromFile(const std::string& tokens_file);
  // From parsed entries (tests, generated defaults).
  static std::unique_ptr<Authorizer> FromEntries(std::vector<TokenEntry> entries);

  bool enabled() const { return enabled_; }

  // Re-reads the tokens file (SIGHUP). On error the previous table stays in
  // force and the error is returned. Minted worker tokens survive. Calls
  // already open are checked again by Recheck.
  absl::Status Reload();

  // The token of the workers of `run` that this daemon launches: role
  // worker, scoped to `run`, bound to the run's incarnation:
  // "sgw2:RUN:HMAC-SHA256(key, "sgw2\nRUN\nINCARNATION")". The key is the
  // daemon's (DATA_DIR/worker-token.key), so a daemon restarted after a
  // crash still knows the tokens of the workers it had launched, and the
  // tokens are never stored. The incarnation is the run's (the catalog's,
  // random per run created), so a token minted for one run is refused by a
  // later run of the same name; and a token is refused once its run has
  // ended (finished, failed, stopped). "" when authentication is off, no key
  // or lookup is set, or the run is unknown or has ended.
  std::string WorkerTokenFor(const std::string& run) const;
  void SetWorkerTokenKey(std::string key);

  // What a launched worker's token is checked against: the run's
  // incarnation and whether it has ended. Set by the daemon once its
  // catalog is open; without it no launched worker's token is minted or
  // accepted.
  struct WorkerRun {
    std::string incarnation;
    std::string state;  // the state's name ("finished"), for messages
    bool ended = false;
  };
  using WorkerRunLookup = std::function<absl::StatusOr<WorkerRun>(const std::string& run)>;
  void SetWorkerRunLookup(WorkerRunLookup lookup);

  // The principal presenting `authorization` (the metadata value, or null
  // when absent).
  absl::StatusOr<Principal> Authenticate(const std::string* authorization) const;
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& ctx) const;

  // Whether `who` may call `rpc` needing `need` on `run` ("" = no run).
  absl::Status Authorize(const Principal& who, Need need, const std::string& rpc,
                         const std::string& run) const;

  // Whether `who`'s role may call `rpc` at all, on some run (the run is
  // checked once it is known, e.g. from a stream's first message).
  absl::Status AuthorizeRole(const Principal& who, Need need, const std::string& rpc) const;

  // Both, as a gRPC status; `who` (optional) receives the principal.
  grpc::Status Check(const grpc::ServerContextBase& ctx, Need need, const std::string& rpc,
                     const std::string& run, Principal* who = nullptr) const;

  // For a call that stays open (a worker stream, a watch): Check again when
  // the table changed since `*seen` (a Reload), so a revoked token stops
  // being served by the calls it opened before. Start `*seen` at epoch()
  // before the call's first Check.
  //
  //   std::atomic<uint64_t> seen = auth->epoch();
  //   ... Check(...) ...
  //   while (open) { if (!auth->Recheck(ctx, need, rpc, run, &seen).ok()) end; }
  grpc::Status Recheck(const grpc::ServerContextBase& ctx, Need need, const std::string& rpc,
                       const std::string& run, std::atomic<uint64_t>* seen) const;
  // Counts the tables loaded (Reload).
  uint64_t epoch() const { return epoch_.load(); }

 private:
  Authorizer() = default;

  bool enabled_ = false;
  std::string tokens_file_;
  mutable absl::Mutex mu_;
  std::vector<TokenEntry> entries_ ABSL_GUARDED_BY(mu_);
  std::string worker_token_key_ ABSL_GUARDED_BY(mu_);
  WorkerRunLookup worker_run_lookup_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> epoch_{0};
};

// What a token may look like: 1 to 4096 bytes of visible ASCII (0x21-0x7E),
// the bytes a gRPC metadata value may carry after "Bearer ". The error says
// what is wrong, never repeating the token.
absl::Status CheckTokenText(absl::string_view token);

// An HTTP request's Authorization header as the "authorization" metadata of
// a gRPC call ("Bearer TOKEN"): from "Bearer TOKEN", or from the password of
// "Basic base64(user:password)" (any user name, so a browser can log in).
// "" when the header is absent or blank. A header of another scheme, bad
// base64, or a token that fails CheckTokenText is UNAUTHENTICATED, naming
// what is wrong; nothing else ever reaches a gRPC call.
absl::StatusOr<std::string> BearerFromHttpAuthorization(absl::string_view header);

// The "authorization" metadata of a call, if present.
std::optional<std::string> BearerHeader(const grpc::ServerContextBase& ctx);

// Whether HOST:PORT names a loopback address (127.0.0.0/8, ::1, localhost).
bool IsLoopbackAddress(const std::string& host_port);

}  // namespace spikeguard::auth
