// The worker client's side of security, against a scripted WorkerService on
// a loopback port: the token and TLS settings come from the environment the
// daemon's launcher sets (SPIKEGUARD_TOKEN[_FILE], SPIKEGUARD_TLS_*), the
// token travels as `authorization: Bearer <token>` on the Attach stream, a
// refused token stops the client at once (no retry loop), and a TLS mismatch
// says what to check.
#include <stdlib.h>

#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage/corpus/test_dir.h"
#include "tests/testdata/test_certs.h"
#include "tests/worker/scripted_controller.h"
#include "worker/client/worker_client.h"

namespace spikeguard::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using worker::WorkerClient;

constexpr char kToken[] = "w0rker-t0ken-0123456789abcdef";

const char* const kSecurityEnv[] = {"SPIKEGUARD_TOKEN",   "SPIKEGUARD_TOKEN_FILE",
                                    "SPIKEGUARD_TLS_CA",  "SPIKEGUARD_TLS_CERT",
                                    "SPIKEGUARD_TLS_KEY", "SPIKEGUARD_TLS_SERVER_NAME"};

v1::StepReport Report(int64_t step) {
  v1::StepReport r;
  r.set_step(step);
  r.set_loss(2.0);
  return r;
}

class WorkerClientSecurityTest : public ::testing::Test {
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

  // Options made after the environment is set: they pick it up.
  static WorkerClient::Options Options(const std::string& address) {
    WorkerClient::Options o;
    o.address = address;
    o.run = "run";
    o.flush_interval = absl::Milliseconds(10);
    o.initial_backoff = absl::Milliseconds(20);
    o.max_backoff = absl::Milliseconds(100);
    o.close_grace = absl::Milliseconds(200);
    return o;
  }

  static std::string WriteTempFile(const std::string& name, const std::string& contents) {
    return storage::testing_util::WriteTestFile(name, contents);
  }

  // Made on first use (a few seconds of RSA key generation).
  static const TestCerts& certs() { return GetTestCerts(); }
  std::map<std::string, std::string> saved_;
};

TEST_F(WorkerClientSecurityTest, TokenAndTlsComeFromTheEnvironment) {
  ScriptedController::Config config;
  config.credentials = certs().ServerCredentials();
  config.expected_token = kToken;
  ScriptedController controller(config);
  setenv("SPIKEGUARD_TOKEN_FILE", WriteTempFile("worker-token", std::string(kToken) + "\n").c_str(), 1);
  setenv("SPIKEGUARD_TLS_CA", certs().Path("ca.pem").c_str(), 1);

  auto client = WorkerClient::Start(Options(controller.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForWelcome(absl::Seconds(20)).ok());
  for (int s = 0; s < 10; ++s) (*client)->Report(Report(s));
  ASSERT_TRUE((*client)->Flush(absl::Seconds(20)).ok());
  EXPECT_EQ((*client)->stats().reports_acked, 10);
  (*client)->Close();
  EXPECT_THAT(controller.authorizations(), ElementsAre(std::string("Bearer ") + kToken));
}

TEST_F(WorkerClientSecurityTest, MutualTlsFromTheEnvironment) {
  ScriptedController::Config config;
  config.credentials = certs().ServerCredentials(/*require_client_cert=*/true);
  ScriptedController controller(config);
  setenv("SPIKEGUARD_TOKEN", kToken, 1);
  setenv("SPIKEGUARD_TLS_CA", certs().Path("ca.pem").c_str(), 1);
  setenv("SPIKEGUARD_TLS_CERT", certs().Path("client.pem").c_str(), 1);
  setenv("SPIKEGUARD_TLS_KEY", certs().Path("client.key").c_str(), 1);
  setenv("SPIKEGUARD_TLS_SERVER_NAME", "localhost", 1);

  auto client = WorkerClient::Start(Options(controller.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForWelcome(absl::Seconds(20)).ok());
  (*client)->Close();
  EXPECT_THAT(controller.authorizations(), ElementsAre(std::string("Bearer ") + kToken));

  // Without the client certificate the daemon is never reached.
  unsetenv("SPIKEGUARD_TLS_CERT");
  unsetenv("SPIKEGUARD_TLS_KEY");
  auto anonymous = WorkerClient::Start(Options(controller.address()));
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  absl::Status s = (*anonymous)->WaitForWelcome(absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(controller.authorizations().size(), 1u);
}

TEST_F(WorkerClientSecurityTest, BadTokenRejectStopsTheClient) {
  ScriptedController::Config config;
  config.expected_token = "the-right-one";
  ScriptedController controller(config);
  WorkerClient::Options options = Options(controller.address());
  options.security.SetToken(kToken, "test");
  auto client = WorkerClient::Start(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->WaitForWelcome(absl::Seconds(20));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("BAD_TOKEN"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown bearer token"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("check the token from test: the daemon's tokens file"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr(kToken)));
  ASSERT_TRUE((*client)->rejection().has_value());
  EXPECT_EQ((*client)->rejection()->reason(), v1::Reject::BAD_TOKEN);
  // Final: no reconnect with the same token (backoff is 20 ms).
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(controller.authorizations().size(), 1u);
  EXPECT_TRUE(absl::IsFailedPrecondition((*client)->Flush(absl::Seconds(1))));
}

TEST_F(WorkerClientSecurityTest, UnauthenticatedStreamIsFinalToo) {
  ScriptedController::Config config;
  config.expected_token = "the-right-one";
  config.refusal = grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing bearer token");
  ScriptedController controller(config);
  auto client = WorkerClient::Start(Options(controller.address()));  // no token anywhere
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->WaitForWelcome(absl::Seconds(20));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("UNAUTHENTICATED: missing bearer token"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("SPIKEGUARD_TOKEN"));
  ASSERT_TRUE((*client)->rejection().has_value());
  EXPECT_EQ((*client)->rejection()->reason(), v1::Reject::BAD_TOKEN);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_THAT(controller.authorizations(), ElementsAre(""));
}

TEST_F(WorkerClientSecurityTest, AnotherCaIsRetriedAndExplained) {
  ScriptedController::Config config;
  config.credentials = certs().ServerCredentials();
  ScriptedController controller(config);
  setenv("SPIKEGUARD_TLS_CA", certs().Path("other-ca.pem").c_str(), 1);
  auto client = WorkerClient::Start(Options(controller.address()));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->WaitForWelcome(absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("last error UNAVAILABLE"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("TLS with the CA of SPIKEGUARD_TLS_CA '" + certs().Path("other-ca.pem")));
  EXPECT_FALSE((*client)->rejection().has_value());  // a network error is not final
  EXPECT_TRUE(controller.authorizations().empty());
}

TEST_F(WorkerClientSecurityTest, UnreadableFilesFailStartNamingThem) {
  setenv("SPIKEGUARD_TOKEN_FILE", "/nonexistent/worker-token", 1);
  auto client = WorkerClient::Start(Options("127.0.0.1:1"));
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(client.status())) << client.status();
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("SPIKEGUARD_TOKEN_FILE '/nonexistent/worker-token'"));

  unsetenv("SPIKEGUARD_TOKEN_FILE");
  setenv("SPIKEGUARD_TLS_CA", "/nonexistent/ca.pem", 1);
  client = WorkerClient::Start(Options("127.0.0.1:1"));
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("cannot read SPIKEGUARD_TLS_CA '/nonexistent/ca.pem'"));
}

}  // namespace
}  // namespace spikeguard::testing
