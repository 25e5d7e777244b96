// The web view (--http-listen) of a real in-process daemon with a tokens
// file, spoken to over loopback by cpp-httplib's client and by raw sockets:
// hostile Authorization headers, slow clients, and what a token scoped to
// some runs may read from /metrics.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

// A raw loopback connection to the web view; -1 when none.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{0, 200'000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// True when the server closed `fd` (EOF or reset after any answer it sent);
// `answer` gets what it sent.
bool ClosedByServer(int fd, std::string* answer) {
  char buf[512];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      answer->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return true;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

// Ten clients sending one header line every second held cpp-httplib's 8
// pool threads: /healthz timed out, and they were never closed. Each
// connection has a thread of its own now, and a request that has not
// arrived within the request deadline (10 s) is closed, however it trickles.
TEST_F(HttpHostileTest, SlowClientsDoNotStarveHealthzAndAreClosedAtTheDeadline) {
  const int port = daemon_->http_port();
  std::vector<int> slow;
  for (int i = 0; i < 10; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    ASSERT_GT(send(fd, "GET /healthz HTTP/1.1\r\n", 23, MSG_NOSIGNAL), 0);
    slow.push_back(fd);
  }
  const absl::Time start = absl::Now();
  std::vector<bool> closed(slow.size(), false);
  std::vector<std::string> answers(slow.size());
  int healthy = 0, asked = 0;
  while (absl::Now() - start < absl::Seconds(25)) {
    bool all_closed = true;
    for (size_t i = 0; i < slow.size(); ++i) {
      if (closed[i]) continue;
      (void)send(slow[i], "X-Slow: 1\r\n", 11, MSG_NOSIGNAL);
      closed[i] = ClosedByServer(slow[i], &answers[i]);
      all_closed = all_closed && closed[i];
    }
    if (absl::Now() - start < absl::Seconds(8)) {
      httplib::Client client("127.0.0.1", port);
      client.set_connection_timeout(5, 0);
      client.set_read_timeout(5, 0);
      auto res = client.Get("/healthz");
      ++asked;
      healthy += res && res->status == 200 ? 1 : 0;
    }
    if (all_closed) break;
    absl::SleepFor(absl::Seconds(1));
  }
  const absl::Duration took = absl::Now() - start;
  std::printf("slow clients: /healthz answered %d of %d while they were open; all closed after %s\n",
              healthy, asked, absl::FormatDuration(took).c_str());
  EXPECT_EQ(healthy, asked);
  for (size_t i = 0; i < slow.size(); ++i) {
    EXPECT_TRUE(closed[i]) << "slow connection " << i << " still open after " << took;
    close(slow[i]);
  }
  EXPECT_TRUE(Healthy());
  EXPECT_TRUE(GrpcServing());
}

// Past 64 open connections one more is answered 503 at once, not queued;
// once the others close, requests are served again.
TEST_F(HttpHostileTest, ConnectionsPastTheCapAreRefusedAtOnce) {
  const int port = daemon_->http_port();
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(300));
  const int extra = Connect(port);
  ASSERT_GE(extra, 0);
  std::string answer;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  bool closed = false;
  while (!closed && absl::Now() < deadline) closed = ClosedByServer(extra, &answer);
  EXPECT_TRUE(closed);
  EXPECT_THAT(answer, HasSubstr("503"));
  EXPECT_THAT(answer, HasSubstr("too many connections"));
  close(extra);
  for (int fd : idle) close(fd);
  bool served = false;
  for (int i = 0; i < 50 && !served; ++i) {
    served = Healthy();
    if (!served) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(served);
  EXPECT_TRUE(GrpcServing());
}

// /metrics showed a token scoped to one run every run's loss, last step and
// generation series, and GetStatus showed it daemon-wide counts: a scoped
// principal now reads the series of its runs and nothing daemon-wide.
TEST_F(HttpHostileTest, AScopedTokenReadsOnlyItsRunsSeriesAndNoDaemonWideFigures) {
  for (const char* run : {"run-a", "run-b"}) {
    ASSERT_TRUE(CreateRunAsAdmin(run).ok());
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAdmin));
    auto stream = worker_->Attach(&ctx);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_run(run);
    hello.mutable_hello()->set_world_size(1);
    ASSERT_TRUE(stream->Write(hello));
    v1::ControllerMessage in;
    ASSERT_TRUE(stream->Read(&in));
    ASSERT_TRUE(in.has_welcome()) << in.DebugString();
    EXPECT_EQ(SendBatch(stream.get(), 1, {Report(1), Report(2)}).accepted(), 2);
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());
  }
  // The per-run series come from a catalog snapshot taken at most once a
  // second: wait until the unscoped viewer sees both runs.
  std::string everything;
  for (int i = 0; i < 200; ++i) {
    auto res = GetWith("/metrics", absl::StrCat("Bearer ", kViewer));
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200);
    everything = res->body;
    if (everything.find("spikeguard_run_last_step{run=\"run-a\"}") != std::string::npos &&
        everything.find("spikeguard_run_last_step{run=\"run-b\"}") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_THAT(everything, HasSubstr("spikeguard_run_last_step{run=\"run-b\"}"));
  EXPECT_THAT(everything, HasSubstr("spikeguard_incidents_opened_total 0\n"));

  auto scoped = GetWith("/metrics", absl::StrCat("Bearer ", kViewerA));
  ASSERT_TRUE(scoped);
  ASSERT_EQ(scoped->status, 200);
  EXPECT_THAT(scoped->body, HasSubstr("spikeguard_run_last_step{run=\"run-a\"}"));
  EXPECT_THAT(scoped->body, HasSubstr("spikeguard_run_loss{run=\"run-a\"}"));
  EXPECT_THAT(scoped->body, Not(HasSubstr("run=\"run-b\"")));
  EXPECT_THAT(scoped->body, Not(HasSubstr("spikeguard_incidents_opened_total 0\n")));
  EXPECT_THAT(scoped->body, Not(HasSubstr("spikeguard_reports_ingested_total ")));

  auto status_as = [this](const char* token) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::ServerStatus status;
    EXPECT_TRUE(supervisor_->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok());
    return status;
  };
  const v1::ServerStatus wide = status_as(kViewer);
  EXPECT_EQ(wide.runs(), 2);
  EXPECT_EQ(wide.reports_accepted(), 4);
  EXPECT_FALSE(wide.catalog_path().empty());
  const v1::ServerStatus narrow = status_as(kViewerA);
  EXPECT_EQ(narrow.principal(), "dave");
  EXPECT_EQ(narrow.role(), "viewer");
  EXPECT_EQ(narrow.runs(), 0);
  EXPECT_EQ(narrow.reports_accepted(), 0);
  EXPECT_TRUE(narrow.catalog_path().empty());
}

}  // namespace
}  // namespace spikeguard::testing
