// spikectl's side of security against a real gRPC server on a loopback port:
// the bearer token from --token-file, --token or the environment reaches the
// server as `authorization: Bearer <token>` and is never printed; TLS with
// --tls-ca (and mutual TLS with --tls-cert/--tls-key) works against a server
// whose certificate that CA signed and fails clearly against another; the
// daemon's refusals come with a hint; `audit` follows pages; `token new`
// prints a token and the tokens-file line with its SHA-256.
#include <openssl/sha.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "cli/spikectl.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/cli/test_supervisor.h"
#include "tests/storage/corpus/test_dir.h"
#include "tests/testdata/test_certs.h"

namespace spikeguard::cli {
namespace {

namespace v1 = ::spikeguard::v1;
using ::spikeguard::cli::testing::RecordingSupervisor;
using ::spikeguard::cli::testing::TestServer;
using ::spikeguard::testing::GetTestCerts;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kToken[] = "c0ffee5ecret0123456789abcdef";

const char* const kSecurityEnv[] = {"SPIKEGUARD_TOKEN",   "SPIKEGUARD_TOKEN_FILE",
                                    "SPIKEGUARD_TLS_CA",  "SPIKEGUARD_TLS_CERT",
                                    "SPIKEGUARD_TLS_KEY", "SPIKEGUARD_TLS_SERVER_NAME"};

template <typename T>
T ParseText(const std::string& text) {
  T message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

using storage::testing_util::WriteTestFile;

std::string Sha256Hex(const std::string& text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  std::string hex;
  char buf[3];
  for (unsigned char b : digest) {
    std::snprintf(buf, sizeof(buf), "%02x", b);
    hex += buf;
  }
  return hex;
}

struct Result {
  int code;
  std::string out;
  std::string err;
};

// Clears the SPIKEGUARD_* security variables for the test and restores them.
class SecurityEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kSecurityEnv) {
      if (const char* value = std::getenv(name)) saved_[name] = value;
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kSecurityEnv) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }

  static Result Run(const std::string& address, std::vector<std::string> args) {
    args.insert(args.begin(), "--addr=" + address);
    std::ostringstream out, err;
    const int code = RunSpikectl(args, out, err);
    return {code, out.str(), err.str()};
  }

  std::map<std::string, std::string> saved_;
};

class SpikectlTokenTest : public SecurityEnvTest {
 protected:
  Result Spikectl(std::vector<std::string> args) { return Run(server_.address(), std::move(args)); }

  RecordingSupervisor supervisor_;
  TestServer server_{&supervisor_};
};

TEST_F(SpikectlTokenTest, NoTokenSendsNoAuthorization) {
  Result r = Spikectl({"status"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastAuthorization("GetStatus"), "");
}

TEST_F(SpikectlTokenTest, TokenFileIsSentAsBearerOnEveryCall) {
  // The first line, trimmed; the rest of the file is ignored.
  const std::string file =
      WriteTestFile("token", std::string("  ") + kToken + "  \nnot the token\n");
  Result status = Spikectl({"--token-file", file, "status"});
  EXPECT_EQ(status.code, 0) << status.err;
  Result list = Spikectl({"runs", "list", "--token-file=" + file});  // after the command too
  EXPECT_EQ(list.code, 0) << list.err;
  supervisor_.SetUpdates({});
  Result watch = Spikectl({"--token-file=" + file, "incidents", "watch"});
  EXPECT_EQ(watch.code, 0) << watch.err;
  EXPECT_THAT(supervisor_.authorizations(),
              ElementsAre(std::string("Bearer ") + kToken, std::string("Bearer ") + kToken,
                          std::string("Bearer ") + kToken));
  for (const Result& r : {status, list, watch}) {
    EXPECT_THAT(r.out + r.err, Not(HasSubstr(kToken)));
  }
}

TEST_F(SpikectlTokenTest, TokenFromTheEnvironment) {
  setenv("SPIKEGUARD_TOKEN", kToken, 1);
  Result r = Spikectl({"runs", "list"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastAuthorization("ListRuns"), std::string("Bearer ") + kToken);

  // SPIKEGUARD_TOKEN_FILE when SPIKEGUARD_TOKEN is not set.
  unsetenv("SPIKEGUARD_TOKEN");
  setenv("SPIKEGUARD_TOKEN_FILE", WriteTestFile("env-token", "from-file-token\n").c_str(), 1);
  r = Spikectl({"runs", "list"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastAuthorization("ListRuns"), "Bearer from-file-token");

  // A flag wins over the environment.
  setenv("SPIKEGUARD_TOKEN", kToken, 1);
  r = Spikectl({"--token=flag-token", "runs", "list"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastAuthorization("ListRuns"), "Bearer flag-token");
  r = Spikectl({"--token-file", WriteTestFile("flag-token", "file-flag-token"), "runs", "list"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastAuthorization("ListRuns"), "Bearer file-flag-token");
}

TEST_F(SpikectlTokenTest, ATokenInClearToAnotherHostIsWarnedAbout) {
  // Loopback: no warning.
  Result local = Spikectl({"--token", kToken, "status"});
  EXPECT_EQ(local.code, 0) << local.err;
  EXPECT_THAT(local.err, IsEmpty());
  // 192.0.2.1 (TEST-NET-1) is never reached; the warning comes first.
  Result remote = Run("192.0.2.1:7070", {"--token", kToken, "--timeout=0.2", "status"});
  EXPECT_EQ(remote.code, 1);
  EXPECT_THAT(remote.err, HasSubstr("spikectl: warning: the token from --token goes in clear text "
                                    "to 192.0.2.1:7070"));
  EXPECT_THAT(remote.err, Not(HasSubstr(kToken)));
}

TEST_F(SpikectlTokenTest, MissingOrBadTokenFileNamesThePathNotTheToken) {
  Result missing = Spikectl({"--token-file=/nonexistent/sg-token", "status"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, HasSubstr("cannot read --token-file '/nonexistent/sg-token'"));
  EXPECT_THAT(missing.err, HasSubstr("No such file"));

  setenv("SPIKEGUARD_TOKEN_FILE", "/nonexistent/env-token", 1);
  Result env = Spikectl({"status"});
  EXPECT_EQ(env.code, 2);
  EXPECT_THAT(env.err, HasSubstr("SPIKEGUARD_TOKEN_FILE '/nonexistent/env-token'"));
  unsetenv("SPIKEGUARD_TOKEN_FILE");

  Result empty = Spikectl({"--token-file", WriteTestFile("empty-token", "\n" + std::string(kToken)), "status"});
  EXPECT_EQ(empty.code, 2);
  EXPECT_THAT(empty.err, HasSubstr("holds no token"));

  const std::string spaced = WriteTestFile("spaced-token", std::string(kToken) + " tail\n");
  Result bad = Spikectl({"--token-file", spaced, "status"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("cannot have"));
  EXPECT_THAT(bad.err, HasSubstr(spaced));
  for (const Result& r : {missing, env, empty, bad}) EXPECT_THAT(r.out + r.err, Not(HasSubstr(kToken)));
  EXPECT_THAT(supervisor_.methods(), IsEmpty());  // nothing was sent

  Result both = Spikectl({"--token=x", "--token-file=y", "status"});
  EXPECT_EQ(both.code, 2);
  EXPECT_THAT(both.err, HasSubstr("not both"));
}

TEST_F(SpikectlTokenTest, UnauthenticatedShowsTheDaemonsMessageAndAHint) {
  supervisor_.SetError("Rewind", grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                              "missing bearer token"));
  Result none = Spikectl({"rewind", "--run=r", "--to-step=10"});
  EXPECT_EQ(none.code, 1);
  EXPECT_THAT(none.err, HasSubstr("spikectl: UNAUTHENTICATED: missing bearer token"));
  EXPECT_THAT(none.err, HasSubstr("hint: no token was sent: set SPIKEGUARD_TOKEN"));
  EXPECT_THAT(none.err, HasSubstr("--token-file"));

  const std::string file = WriteTestFile("wrong-token", kToken);
  supervisor_.SetError("Rewind", grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown token"));
  Result wrong = Spikectl({"--token-file", file, "rewind", "--run=r", "--to-step=10"});
  EXPECT_EQ(wrong.code, 1);
  EXPECT_THAT(wrong.err, HasSubstr("spikectl: UNAUTHENTICATED: unknown token"));
  EXPECT_THAT(wrong.err, HasSubstr("the token from --token-file '" + file + "' was not accepted"));
  EXPECT_THAT(wrong.out + wrong.err, Not(HasSubstr(kToken)));

  supervisor_.SetError("Rewind", grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                              "principal 'ci' (viewer) may not Rewind run 'r'"));
  setenv("SPIKEGUARD_TOKEN", kToken, 1);
  Result denied = Spikectl({"rewind", "--run=r", "--to-step=10"});
  EXPECT_EQ(denied.code, 1);
  EXPECT_THAT(denied.err, HasSubstr("spikectl: PERMISSION_DENIED: principal 'ci' (viewer) may not "
                                    "Rewind run 'r'"));
  EXPECT_THAT(denied.err, HasSubstr("hint: the token from SPIKEGUARD_TOKEN is valid but its role"));
  EXPECT_THAT(denied.out + denied.err, Not(HasSubstr(kToken)));
}

TEST_F(SpikectlTokenTest, StatusShowsWhoTheDaemonTookTheCallerFor) {
  supervisor_.SetResponse("GetStatus", ParseText<v1::ServerStatus>(R"pb(
    version: "0.2.0" principal: "alice" role: "operator" authentication: true tls: true
  )pb"));
  Result r = Spikectl({"status"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("principal: +alice"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("role: +operator"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("authentication: +on"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("tls: +on"));

  supervisor_.SetResponse("GetStatus", ParseText<v1::ServerStatus>(R"pb(version: "0.2.0")pb"));
  r = Spikectl({"status"});
  EXPECT_THAT(r.out, ::testing::ContainsRegex("authentication: +off"));
  EXPECT_THAT(r.out, Not(HasSubstr("principal")));
}

TEST_F(SpikectlTokenTest, AuditFollowsPagesAndRendersEntries) {
  supervisor_.SetAuditPages({
      {"", ParseText<v1::ListAuditResponse>(R"pb(
         entries { id: 9 unix_ms: 1700000000000 principal: "alice" role: "operator"
                   rpc: "SupervisorService/Rewind" run: "gpt" outcome: "OK"
                   detail: "to_step=100" peer: "ipv4:10.0.0.7:5555" }
         entries { id: 8 unix_ms: 1699999999000 principal: "bob" role: "viewer"
                   rpc: "SupervisorService/Pause" run: "gpt" outcome: "PERMISSION_DENIED" }
         next_page_token: "p2")pb")},
      {"p2", ParseText<v1::ListAuditResponse>(R"pb(
         entries { id: 7 unix_ms: 1699999998000 principal: "anonymous" rpc: "WorkerService/Attach"
                   outcome: "UNAUTHENTICATED" detail: "bad token" })pb")},
  });
  Result r = Spikectl({"audit", "--run=gpt", "--principal", "alice", "--since=1699999990000"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("9 +[^ ].* +alice +operator +Rewind +gpt +OK +"
                                              "ipv4:10.0.0.7:5555 +to_step=100"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("bob +viewer +Pause +gpt +PERMISSION_DENIED"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "anonymous +- +WorkerService/Attach +- +UNAUTHENTICATED +- +bad token"));
  EXPECT_THAT(supervisor_.methods(), ElementsAre("ListAudit", "ListAudit"));
  const auto second = supervisor_.LastRequest<v1::ListAuditRequest>("ListAudit");
  EXPECT_EQ(second.page_token(), "p2");
  EXPECT_EQ(second.run(), "gpt");
  EXPECT_EQ(second.principal(), "alice");
  EXPECT_EQ(second.since_unix_ms(), 1699999990000);

  // JSON: one object with every page's entries.
  Result json = Spikectl({"audit", "--output=json"});
  EXPECT_EQ(json.code, 0) << json.err;
  v1::ListAuditResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &parsed).ok()) << json.out;
  ASSERT_EQ(parsed.entries_size(), 3);
  EXPECT_EQ(parsed.entries(2).id(), 7);
  EXPECT_TRUE(parsed.next_page_token().empty());

  // --limit counts over pages and stops asking once reached.
  Result limited = Spikectl({"audit", "--limit=2"});
  EXPECT_EQ(limited.code, 0) << limited.err;
  EXPECT_EQ(supervisor_.LastRequest<v1::ListAuditRequest>("ListAudit").limit(), 2);
  EXPECT_EQ(supervisor_.methods().size(), 5u);  // one call: the first page had 2
  EXPECT_THAT(limited.out, Not(HasSubstr("anonymous")));

  Result bad = Spikectl({"audit", "--limit=0"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("bad value for --limit"));
}

TEST_F(SpikectlTokenTest, AuditStopsOnARepeatedPageToken) {
  supervisor_.SetAuditPages({
      {"", ParseText<v1::ListAuditResponse>(R"pb(entries { id: 1 } next_page_token: "again")pb")},
      {"again", ParseText<v1::ListAuditResponse>(R"pb(entries { id: 2 } next_page_token: "again")pb")},
  });
  Result r = Spikectl({"audit"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("repeated the page token"));
}

TEST_F(SpikectlTokenTest, AuditRefusedShowsTheHint) {
  supervisor_.SetError("ListAudit", grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                                 "ListAudit needs role admin"));
  Result r = Spikectl({"--token=abc", "audit"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED: ListAudit needs role admin"));
  EXPECT_THAT(r.err, HasSubstr("hint: the token from --token is valid"));
}

TEST_F(SpikectlTokenTest, TokenNewPrintsATokenAndTheLineWithItsHash) {
  Result r = Spikectl({"token", "new", "--principal=ci-bot", "--role=operator", "--runs=gpt,llama"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(supervisor_.methods(), IsEmpty());  // nothing goes to the daemon
  ASSERT_THAT(r.out, ::testing::MatchesRegex("[0-9a-f]{64}\n"));
  const std::string token = r.out.substr(0, 64);
  const std::string line = "ci-bot operator gpt,llama sha256:" + Sha256Hex(token);
  EXPECT_THAT(r.err, HasSubstr("tokens-file line"));
  EXPECT_THAT(r.err, HasSubstr(line + "\n"));
  EXPECT_THAT(r.err, Not(HasSubstr(token)));

  Result again = Spikectl({"token", "new", "--principal=ci-bot", "--role=viewer"});
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out, r.out);  // fresh every time
  EXPECT_THAT(again.err, HasSubstr("ci-bot viewer * sha256:" + Sha256Hex(again.out.substr(0, 64))));

  Result json = Spikectl({"--output=json", "token", "new", "--principal=w0", "--role=worker",
                          "--runs=gpt"});
  EXPECT_EQ(json.code, 0) << json.err;
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &parsed).ok()) << json.out;
  const std::string json_token = parsed.fields().at("token").string_value();
  EXPECT_EQ(parsed.fields().at("tokens_file_line").string_value(),
            "w0 worker gpt sha256:" + Sha256Hex(json_token));

  Result bad_role = Spikectl({"token", "new", "--principal=x", "--role=root"});
  EXPECT_EQ(bad_role.code, 2);
  EXPECT_THAT(bad_role.err, HasSubstr("want worker, viewer, operator or admin"));
  Result bad_name = Spikectl({"token", "new", "--principal=a b", "--role=admin"});
  EXPECT_EQ(bad_name.code, 2);
  EXPECT_THAT(bad_name.err, HasSubstr("bad value for --principal"));
  Result bad_runs = Spikectl({"token", "new", "--principal=a", "--role=worker", "--runs=a,,b"});
  EXPECT_EQ(bad_runs.code, 2);
  // An admin covers every run: a run list on one is refused, not ignored.
  Result scoped_admin = Spikectl({"token", "new", "--principal=a", "--role=admin", "--runs=runA"});
  EXPECT_EQ(scoped_admin.code, 2);
  EXPECT_THAT(scoped_admin.err, HasSubstr("--role=admin acts on every run"));
  EXPECT_TRUE(scoped_admin.out.empty()) << "no token printed";
  Result missing = Spikectl({"token", "new", "--role=admin"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, HasSubstr("missing required flag --principal"));
}

// --- TLS -------------------------------------------------------------------------

class SpikectlTlsTest : public SecurityEnvTest {
 protected:
  const spikeguard::testing::TestCerts& certs_ = GetTestCerts();
  RecordingSupervisor supervisor_;
};

TEST_F(SpikectlTlsTest, TlsCaVerifiesTheDaemonAndCarriesTheToken) {
  TestServer server(&supervisor_, certs_.ServerCredentials());
  Result r = Run(server.address(), {"--tls-ca", certs_.Path("ca.pem"), "--token", kToken, "status"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(supervisor_.LastAuthorization("GetStatus"), std::string("Bearer ") + kToken);

  // The name checked can be set (the certificate is for localhost and 127.0.0.1).
  r = Run(server.address(), {"--tls-ca=" + certs_.Path("ca.pem"), "--tls-server-name=localhost",
                             "runs", "list"});
  EXPECT_EQ(r.code, 0) << r.err;

  // From the environment.
  setenv("SPIKEGUARD_TLS_CA", certs_.Path("ca.pem").c_str(), 1);
  r = Run(server.address(), {"runs", "list"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(supervisor_.methods(), ElementsAre("GetStatus", "ListRuns", "ListRuns"));
}

TEST_F(SpikectlTlsTest, AnotherCasCertificateFailsClearly) {
  TestServer server(&supervisor_, certs_.ServerCredentials());
  Result r = Run(server.address(), {"--tls-ca", certs_.Path("other-ca.pem"), "--token", kToken,
                                    "status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE: cannot reach spikeguardd at " + server.address()));
  EXPECT_THAT(r.err, HasSubstr("hint: TLS with the CA of --tls-ca '" + certs_.Path("other-ca.pem") +
                               "'"));
  EXPECT_THAT(r.err, HasSubstr("signed its certificate"));
  EXPECT_THAT(r.out + r.err, Not(HasSubstr(kToken)));
  EXPECT_THAT(supervisor_.methods(), IsEmpty());

  // A name the certificate does not have fails too.
  r = Run(server.address(), {"--tls-ca", certs_.Path("ca.pem"), "--tls-server-name=evil.example",
                             "status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach"));

  // A client in clear against a TLS daemon says TLS may be the cause.
  r = Run(server.address(), {"status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("pass --tls-ca=FILE or set SPIKEGUARD_TLS_CA"));
  EXPECT_THAT(supervisor_.methods(), IsEmpty());
}

TEST_F(SpikectlTlsTest, MutualTlsNeedsTheClientCertificate) {
  TestServer server(&supervisor_, certs_.ServerCredentials(/*require_client_cert=*/true));
  Result without = Run(server.address(), {"--tls-ca", certs_.Path("ca.pem"), "status"});
  EXPECT_EQ(without.code, 1);
  EXPECT_THAT(without.err, HasSubstr("cannot reach"));
  EXPECT_THAT(supervisor_.methods(), IsEmpty());

  Result with = Run(server.address(), {"--tls-ca", certs_.Path("ca.pem"), "--tls-cert",
                                       certs_.Path("client.pem"), "--tls-key",
                                       certs_.Path("client.key"), "status"});
  EXPECT_EQ(with.code, 0) << with.err;

  setenv("SPIKEGUARD_TLS_CA", certs_.Path("ca.pem").c_str(), 1);
  setenv("SPIKEGUARD_TLS_CERT", certs_.Path("client.pem").c_str(), 1);
  setenv("SPIKEGUARD_TLS_KEY", certs_.Path("client.key").c_str(), 1);
  Result env = Run(server.address(), {"status"});
  EXPECT_EQ(env.code, 0) << env.err;
  EXPECT_THAT(supervisor_.methods(), ElementsAre("GetStatus", "GetStatus"));
}

TEST_F(SpikectlTlsTest, BadTlsSettingsNameTheFileAndTheFlag) {
  Result missing = Run("127.0.0.1:1", {"--tls-ca=/nonexistent/ca.pem", "status"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, HasSubstr("cannot read --tls-ca '/nonexistent/ca.pem'"));

  Result not_pem = Run("127.0.0.1:1", {"--tls-ca", WriteTestFile("not.pem", "hello\n"), "status"});
  EXPECT_EQ(not_pem.code, 2);
  EXPECT_THAT(not_pem.err, HasSubstr("is not PEM"));

  Result half = Run("127.0.0.1:1", {"--tls-ca", certs_.Path("ca.pem"), "--tls-cert",
                                    certs_.Path("client.pem"), "status"});
  EXPECT_EQ(half.code, 2);
  EXPECT_THAT(half.err, HasSubstr("--tls-cert needs a key"));

  Result no_ca = Run("127.0.0.1:1", {"--tls-cert", certs_.Path("client.pem"), "--tls-key",
                                     certs_.Path("client.key"), "status"});
  EXPECT_EQ(no_ca.code, 2);
  EXPECT_THAT(no_ca.err, HasSubstr("needs --tls-ca"));

  setenv("SPIKEGUARD_TLS_KEY", "/nonexistent/client.key", 1);
  setenv("SPIKEGUARD_TLS_CERT", certs_.Path("client.pem").c_str(), 1);
  setenv("SPIKEGUARD_TLS_CA", certs_.Path("ca.pem").c_str(), 1);
  Result env = Run("127.0.0.1:1", {"status"});
  EXPECT_EQ(env.code, 2);
  EXPECT_THAT(env.err, HasSubstr("cannot read SPIKEGUARD_TLS_KEY '/nonexistent/client.key'"));
}

}  // namespace
}  // namespace spikeguard::cli
