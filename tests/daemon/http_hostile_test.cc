// The web view (--http-listen) of a real in-process daemon with a tokens
// file, spoken to over loopback by cpp-httplib's client and by raw sockets:
// hostile Authorization headers, slow clients, and what a token scoped to
// some runs may read from /metrics.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/secret.h"
#include "gmock/gmock.h"
#include "tests/daemon/daemon_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char kAdmin[] = "admin-token-http-00000000000000000000000000000000000000000000000";
const char kViewer[] = "viewer-token-http-0000000000000000000000000000000000000000000000";
const char kViewerA[] = "viewer-a-token-http-00000000000000000000000000000000000000000000";

class HttpHostileTest : public DaemonFixture {
 protected:
  void ConfigureDaemon(daemon::Daemon::Options& options) override {
    std::ofstream(dir_.File("tokens")) << "root admin * " << HashToken(kAdmin) << "\n"
                                       << "carol viewer * " << HashToken(kViewer) << "\n"
                                       << "dave viewer run-a " << HashToken(kViewerA) << "\n";
    options.allow_anonymous = false;
    options.tokens_file = dir_.File("tokens");
    options.http_listen = "127.0.0.1:0";
  }

  std::unique_ptr<httplib::Client> Client() {
    auto client = std::make_unique<httplib::Client>("127.0.0.1", daemon_->http_port());
    client->set_connection_timeout(10, 0);
    client->set_read_timeout(30, 0);
    return client;
  }

  // GET `path` with `authorization` as the header's value.
  httplib::Result GetWith(const std::string& path, const std::string& authorization) {
    return Client()->Get(path.c_str(), {{"Authorization", authorization}});
  }

  // The gRPC side answers the admin.
  bool GrpcServing() {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAdmin));
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ServerStatus status;
    return supervisor_->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok();
  }

  bool Healthy() {
    auto res = Client()->Get("/healthz");
    return res && res->status == 200;
  }

  grpc::Status CreateRunAsAdmin(const std::string& name) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAdmin));
    v1::CreateRunRequest req;
    req.set_name(name);
    req.set_world_size(1);
    v1::Run out;
    return supervisor_->CreateRun(&ctx, req, &out);
  }
};

// A Basic password or a Bearer token holding a byte a gRPC metadata value
// may not hold took the daemon down (an assertion in gRPC's client) before
// any token was checked: each is now a 401 naming what is wrong, and the
// daemon serves on.
TEST_F(HttpHostileTest, AuthorizationHeadersWithNonPrintableBytesAre401AndTheDaemonStaysUp) {
  std::vector<std::string> headers;
  for (const std::string& password : {std::string("\x01" "abc"), std::string("a\nb"),
                                     std::string("a\x7f" "b"), std::string("a\xff" "b"),
                                     std::string("caf\xc3\xa9"), std::string("a\tb")}) {
    headers.push_back("Basic " + absl::Base64Escape("u:" + password));
  }
  // httplib's client refuses to send CR/LF in a header; these are bytes a
  // raw client can send (TAB, DEL, 0xff, UTF-8).
  for (const std::string& token : {std::string("a\tb"), std::string("a\xff"),
                                  std::string("caf\xc3\xa9"), std::string("x\x7fy")}) {
    headers.push_back("Bearer " + token);
  }
  for (const std::string& header : headers) {
    for (const char* path : {"/", "/runs/run-a", "/incidents/1", "/metrics"}) {
      auto res = GetWith(path, header);
      ASSERT_TRUE(res) << absl::CEscape(header) << " " << path << ": "
                       << httplib::to_string(res.error());
      EXPECT_EQ(res->status, 401) << absl::CEscape(header) << " " << path;
      EXPECT_THAT(res->body, HasSubstr("printable ASCII")) << absl::CEscape(header);
    }
  }
  EXPECT_TRUE(Healthy());
  EXPECT_TRUE(GrpcServing());
  // A well-formed token still works, as Bearer and as Basic's password.
  auto bearer = GetWith("/", absl::StrCat("Bearer ", kViewer));
  ASSERT_TRUE(bearer);
  EXPECT_EQ(bearer->status, 200);
  auto basic = GetWith("/", "Basic " + absl::Base64Escape(absl::StrCat("viewer:", kViewer)));
  ASSERT_TRUE(basic);
  EXPECT_EQ(basic->status, 200);
}

}  // namespace
}  // namespace spikeguard::testing
