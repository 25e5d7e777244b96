// --http-listen on an in-process daemon: off by default, loopback by default,
// refused in clear text off loopback, and serving /healthz, /metrics and the
// pages (authentication off: loopback, --allow-anonymous).
#include <httplib.h>

#include <string>

#include "daemon/daemon.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage/catalog/temp_dir.h"

namespace spikeguard {
namespace {

using ::testing::HasSubstr;

daemon::Daemon::Options Base(const std::string& data_dir) {
  daemon::Daemon::Options options;
  options.listen = "127.0.0.1:0";
  options.data_dir = data_dir;
  options.allow_anonymous = true;
  return options;
}

TEST(HttpFlagsTest, OffByDefault) {
  storage::testing::TempDir dir;
  auto d = daemon::Daemon::Start(Base(dir.File("data")));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->http_port(), 0);
}

TEST(HttpFlagsTest, BadAddressesAreRefusedNamingTheFlag) {
  storage::testing::TempDir dir;
  for (const std::string listen : {"nonsense", "127.0.0.1:99999", "0.0.0.0:0"}) {
    daemon::Daemon::Options options = Base(dir.File("data"));
    options.http_listen = listen;
    auto d = daemon::Daemon::Start(options);
    ASSERT_FALSE(d.ok()) << listen;
    EXPECT_THAT(d.status().message(), HasSubstr("--http-listen")) << listen;
  }
}

TEST(HttpFlagsTest, PortOnlyServesOnLoopback) {
  storage::testing::TempDir dir;
  daemon::Daemon::Options options = Base(dir.File("data"));
  options.http_listen = ":0";
  auto d = daemon::Daemon::Start(options);
  ASSERT_TRUE(d.ok()) << d.status();
  const int port = (*d)->http_port();
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE spikeguard_commit_latency_seconds histogram\n"));
  EXPECT_THAT(metrics->body, HasSubstr("spikeguard_incidents_opened_total 0\n"));
  auto runs = client.Get("/");
  ASSERT_TRUE(runs);
  EXPECT_EQ(runs->status, 200);
  EXPECT_THAT(runs->body, HasSubstr("no runs"));
  EXPECT_THAT(runs->get_header_value("Content-Security-Policy"), HasSubstr("default-src 'none'"));
  auto missing = client.Get("/runs/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto unknown = client.Get("/nowhere");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
}

}  // namespace
}  // namespace spikeguard
