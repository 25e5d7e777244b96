#include "worker/client/client_security.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"

namespace spikeguard {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

// The whole file; errors name the file and where its path came from.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, " '", path, "': ",
                                                   err != 0 ? std::strerror(err) : "cannot open"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, " '", path, "'"));
  }
  return text.str();
}

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what,
                                    absl::string_view kind) {
  absl::StatusOr<std::string> pem = ReadWholeFile(path, what);
  if (!pem.ok()) return pem.status();
  if (!absl::StrContains(*pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' is not PEM (want a ", kind, ")"));
  }
  return pem;
}

// gRPC refuses metadata values outside printable ASCII; a token is one word.
absl::Status CheckToken(absl::string_view token, absl::string_view what) {
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("the token from ", what, " is empty"));
  for (char c : token) {
    if (c <= 0x20 || c >= 0x7f) {
      // The token itself is never echoed, not even in part.
      return absl::InvalidArgumentError(absl::StrCat(
          "the token from ", what,
          " has a character a bearer token cannot have (want printable ASCII, no spaces)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

ClientSecurity ClientSecurity::FromEnv() {
  ClientSecurity s;
  auto set = [](Setting& setting, const char* name) {
    std::string value = Env(name);
    if (!value.empty()) setting = {std::move(value), name};
  };
  set(s.token_file_, "SPIKEGUARD_TOKEN_FILE");
  set(s.token_, "SPIKEGUARD_TOKEN");
  set(s.tls_ca_, "SPIKEGUARD_TLS_CA");
  set(s.tls_cert_, "SPIKEGUARD_TLS_CERT");
  set(s.tls_key_, "SPIKEGUARD_TLS_KEY");
  set(s.tls_server_name_, "SPIKEGUARD_TLS_SERVER_NAME");
  // SPIKEGUARD_TOKEN wins over SPIKEGUARD_TOKEN_FILE.
  if (!s.token_.value.empty()) s.token_file_ = {};
  return s;
}

void ClientSecurity::SetToken(std::string token, std::string origin) {
  token_ = {std::move(token), std::move(origin)};
  token_file_ = {};
}
void ClientSecurity::SetTokenFile(std::string path, std::string origin) {
  token_file_ = {std::move(path), std::move(origin)};
  token_ = {};
}
void ClientSecurity::SetTlsCa(std::string path, std::string origin) {
  tls_ca_ = {std::move(path), std::move(origin)};
}
void ClientSecurity::SetTlsCert(std::string path, std::string origin) {
  tls_cert_ = {std::move(path), std::move(origin)};
}
void ClientSecurity::SetTlsKey(std::string path, std::string origin) {
  tls_key_ = {std::move(path), std::move(origin)};
}
void ClientSecurity::SetTlsServerName(std::string name, std::string origin) {
  tls_server_name_ = {std::move(name), std::move(origin)};
}

absl::StatusOr<ResolvedSecurity> ClientSecurity::Resolve() const {
  ResolvedSecurity r;
  if (!token_.value.empty()) {
    if (absl::Status s = CheckToken(token_.value, token_.origin); !s.ok()) return s;
    r.token = token_.value;
    r.token_origin = token_.origin;
  } else if (!token_file_.value.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(token_file_.value, token_file_.origin);
    if (!token.ok()) return token.status();
    r.token = *std::move(token);
    r.token_origin = absl::StrCat(token_file_.origin, " '", token_file_.value, "'");
  }

  const bool cert = !tls_cert_.value.empty(), key = !tls_key_.value.empty();
  if (cert != key) {
    const Setting& given = cert ? tls_cert_ : tls_key_;
    return absl::InvalidArgumentError(absl::StrCat(
        given.origin, " needs ", cert ? "a key (--tls-key or SPIKEGUARD_TLS_KEY)"
                                      : "a certificate (--tls-cert or SPIKEGUARD_TLS_CERT)",
        ": mutual TLS takes both"));
  }
  if (tls_ca_.value.empty()) {
    if (cert) {
      return absl::InvalidArgumentError(absl::StrCat(
          tls_cert_.origin,
          " needs --tls-ca or SPIKEGUARD_TLS_CA (the CA that signed spikeguardd's certificate)"));
    }
    if (!tls_server_name_.value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          tls_server_name_.origin, " needs --tls-ca or SPIKEGUARD_TLS_CA (TLS is off without it)"));
    }
    r.credentials = grpc::InsecureChannelCredentials();
    return r;
  }

  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> roots = ReadPem(tls_ca_.value, tls_ca_.origin, "certificate");
  if (!roots.ok()) return roots.status();
  ssl.pem_root_certs = *std::move(roots);
  if (cert) {
    absl::StatusOr<std::string> chain = ReadPem(tls_cert_.value, tls_cert_.origin, "certificate");
    if (!chain.ok()) return chain.status();
    absl::StatusOr<std::string> private_key = ReadPem(tls_key_.value, tls_key_.origin, "private key");
    if (!private_key.ok()) return private_key.status();
    ssl.pem_cert_chain = *std::move(chain);
    ssl.pem_private_key = *std::move(private_key);
    r.mutual_tls = true;
  }
  r.tls = true;
  r.tls_origin = absl::StrCat(tls_ca_.origin, " '", tls_ca_.value, "'");
  r.server_name = tls_server_name_.value;
  r.credentials = grpc::SslCredentials(ssl);
  return r;
}

void ResolvedSecurity::Authorize(grpc::ClientContext* context) const {
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

std::string ResolvedSecurity::Hint(grpc::StatusCode code) const {
  switch (code) {
    case grpc::StatusCode::UNAUTHENTICATED:
      if (token.empty()) {
        return "no token was sent: set SPIKEGUARD_TOKEN or SPIKEGUARD_TOKEN_FILE, or pass "
               "--token-file=FILE";
      }
      return absl::StrCat("the token from ", token_origin,
                          " was not accepted: check that the daemon's tokens file has its hash");
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StrCat(
          "the token", token.empty() ? "" : absl::StrCat(" from ", token_origin),
          " is valid but its role or runs do not allow this: use one that does (an admin "
          "makes one with 'spikectl token new')");
    case grpc::StatusCode::UNAVAILABLE:
      if (tls) {
        return absl::StrCat("TLS with the CA of ", tls_origin,
                            ": check that spikeguardd serves TLS, that this CA signed its "
                            "certificate, and the name checked (--tls-server-name)",
                            mutual_tls ? ", and that it accepts the client certificate" : "");
      }
      return "if spikeguardd serves TLS, pass --tls-ca=FILE or set SPIKEGUARD_TLS_CA";
    default:
      return "";
  }
}

std::shared_ptr<grpc::Channel> CreateClientChannel(const std::string& address,
                                                   const ResolvedSecurity& resolved,
                                                   grpc::ChannelArguments args) {
  if (resolved.tls && !resolved.server_name.empty()) {
    args.SetSslTargetNameOverride(resolved.server_name);
  }
  return grpc::CreateCustomChannel(
      address, resolved.credentials ? resolved.credentials : grpc::InsecureChannelCredentials(),
      args);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view what) {
  absl::StatusOr<std::string> text = ReadWholeFile(path, what);
  if (!text.ok()) return text.status();
  absl::string_view first = *text;
  if (size_t nl = first.find('\n'); nl != absl::string_view::npos) first = first.substr(0, nl);
  first = absl::StripAsciiWhitespace(first);
  const std::string source = absl::StrCat(what, " '", path, "'");
  if (first.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' holds no token (its first line is empty)"));
  }
  if (absl::Status s = CheckToken(first, source); !s.ok()) return s;
  return std::string(first);
}

}  // namespace spikeguard
