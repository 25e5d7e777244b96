// The web view and /metrics under mutual TLS: a daemon given --tls-client-ca
// serves HTTPS only to clients presenting a certificate that CA signed, with
// the same files as its gRPC side. Certificates are made for the test by
// openssl (tests/testdata/make_test_certs.sh, plus a client certificate an
// unrelated CA signed); the client is cpp-httplib's.
#include <httplib.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/secret.h"
#include "daemon/daemon.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage/catalog/temp_dir.h"
#include "tests/testdata/test_certs.h"

namespace spikeguard {
namespace {

using ::spikeguard::testing::GetTestCerts;
using ::spikeguard::testing::TestCerts;
using ::testing::HasSubstr;

const char kViewer[] = "viewer-token-mtls-000000000000000000000000000000000000000000000";

class HttpMtlsTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(/*mutual=*/true); }

  void Start(bool mutual) {
    daemon_.reset();
    ASSERT_FALSE(certs_.dir.empty());
    std::ofstream(dir_.File("tokens")) << "carol viewer * " << HashToken(kViewer) << "\n";
    daemon::Daemon::Options options;
    options.listen = "127.0.0.1:0";
    options.data_dir = dir_.File(mutual ? "data" : "data-tls");
    options.tokens_file = dir_.File("tokens");
    options.tls_cert_file = certs_.Path("server.pem");
    options.tls_key_file = certs_.Path("server.key");
    if (mutual) options.tls_client_ca_file = certs_.Path("ca.pem");
    options.http_listen = "127.0.0.1:0";
    auto d = daemon::Daemon::Start(options);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    port_ = daemon_->http_port();
    ASSERT_GT(port_, 0);
  }

  // A client that verifies the daemon's certificate with the test CA and
  // presents `cert`/`key` when given.
  std::unique_ptr<httplib::SSLClient> Client(const std::string& cert = "", const std::string& key = "") {
    auto client = cert.empty() ? std::make_unique<httplib::SSLClient>("127.0.0.1", port_)
                               : std::make_unique<httplib::SSLClient>("127.0.0.1", port_, cert, key);
    client->set_ca_cert_path(certs_.Path("ca.pem").c_str());
    client->enable_server_certificate_verification(true);
    client->set_connection_timeout(10, 0);
    client->set_read_timeout(10, 0);
    return client;
  }

  // A client certificate (clientAuth, the genuine client's name) that the
  // unrelated CA signed; and one self-signed.
  void MakeRogueCertificates() {
    const std::string d = dir_.File("");
    const std::string script = absl::StrCat(
        "set -e; cd '", d, "'; umask 077;",
        "printf '[client]\\nextendedKeyUsage = clientAuth\\n' > ext.cnf;",
        "openssl req -newkey rsa:2048 -nodes -keyout rogue.key -out rogue.csr "
        "-subj /CN=spikeguard-client 2>/dev/null;",
        "openssl x509 -req -in rogue.csr -CA '", certs_.Path("other-ca.pem"), "' -CAkey '",
        certs_.Path("other-ca.key"), "' -CAcreateserial -out rogue.pem -days 30 -extfile ext.cnf "
        "-extensions client 2>/dev/null;",
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout self.key -out self.pem -days 30 "
        "-subj /CN=spikeguard-client -addext extendedKeyUsage=clientAuth 2>/dev/null");
    ASSERT_EQ(std::system(absl::StrCat("bash -c \"", script, "\"").c_str()), 0) << script;
  }

  const TestCerts& certs_ = GetTestCerts();
  storage::testing::TempDir dir_;
  std::unique_ptr<daemon::Daemon> daemon_;
  int port_ = 0;
};

TEST_F(HttpMtlsTest, AClientWithTheCaSignedCertificateAndATokenGetsEveryPage) {
  auto client = Client(certs_.Path("client.pem"), certs_.Path("client.key"));
  const httplib::Headers as_viewer = {{"Authorization", absl::StrCat("Bearer ", kViewer)}};
  auto health = client->Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");
  auto metrics = client->Get("/metrics", as_viewer);
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("spikeguard_incidents_opened_total 0\n"));
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE spikeguard_commit_latency_seconds histogram\n"));
  auto runs = client->Get("/", as_viewer);
  ASSERT_TRUE(runs) << httplib::to_string(runs.error());
  EXPECT_EQ(runs->status, 200);
  EXPECT_THAT(runs->body, HasSubstr("spikeguard runs"));
  // The certificate is transport security, not a login: the pages still
  // want a token.
  for (const char* path : {"/", "/metrics"}) {
    auto anonymous = client->Get(path);
    ASSERT_TRUE(anonymous) << path;
    EXPECT_EQ(anonymous->status, 401) << path;
  }
}

TEST_F(HttpMtlsTest, AClientWithoutACertificateIsRefused) {
  auto client = Client();
  const httplib::Headers as_viewer = {{"Authorization", absl::StrCat("Bearer ", kViewer)}};
  for (const char* path : {"/healthz", "/metrics", "/"}) {
    auto res = client->Get(path, as_viewer);
    EXPECT_FALSE(res) << path << " answered " << res->status << " without a client certificate";
  }
  // Clear text on the TLS port gets nothing either.
  httplib::Client plain("127.0.0.1", port_);
  plain.set_read_timeout(10, 0);
  auto clear = plain.Get("/healthz");
  EXPECT_TRUE(!clear || clear->status != 200);
  // And the daemon still serves a client that presents one.
  auto ok = Client(certs_.Path("client.pem"), certs_.Path("client.key"))->Get("/healthz");
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200);
}

TEST_F(HttpMtlsTest, ACertificateAnotherCaSignedIsRefused) {
  MakeRogueCertificates();
  const httplib::Headers as_viewer = {{"Authorization", absl::StrCat("Bearer ", kViewer)}};
  for (const std::string name : {"rogue", "self"}) {
    auto client = Client(dir_.File(name + ".pem"), dir_.File(name + ".key"));
    ASSERT_TRUE(client->is_valid()) << name;  // the client could load it: the daemon refuses it
    for (const char* path : {"/healthz", "/metrics", "/"}) {
      auto res = client->Get(path, as_viewer);
      EXPECT_FALSE(res) << name << " " << path << " answered " << res->status;
    }
  }
  auto ok = Client(certs_.Path("client.pem"), certs_.Path("client.key"))->Get("/healthz");
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200);
}

// The control: the same clients against plain TLS (no client CA) get their
// answers, so the refusals above come from mutual TLS, not from the clients.
TEST_F(HttpMtlsTest, WithoutAClientCaTheSameClientsAreServed) {
  MakeRogueCertificates();
  Start(/*mutual=*/false);
  ASSERT_NE(daemon_, nullptr);
  for (const std::string name : {"", "rogue"}) {
    auto client = name.empty() ? Client() : Client(dir_.File(name + ".pem"), dir_.File(name + ".key"));
    auto res = client->Get("/healthz");
    ASSERT_TRUE(res) << name << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
  }
}

}  // namespace
}  // namespace spikeguard
