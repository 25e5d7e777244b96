// The worker client library against a real daemon over loopback: batches are
// acknowledged only once committed, survive a daemon restart, and are stored
// exactly once.
#include "worker/client/worker_client.h"

#include "gmock/gmock.h"
#include "tests/daemon/daemon_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;
using worker::WorkerClient;

class WorkerClientTest : public DaemonFixture {
 protected:
  WorkerClient::Options ClientOptions(const std::string& run, uint32_t rank = 0,
                                      uint32_t world = 1) {
    WorkerClient::Options o;
    o.address = address_;
    o.run = run;
    o.rank = rank;
    o.world_size = world;
    o.max_batch_reports = 16;
    o.flush_interval = absl::Milliseconds(10);
    o.initial_backoff = absl::Milliseconds(20);
    o.max_backoff = absl::Milliseconds(200);
    return o;
  }

  // A checkpoint URI inside run "run"'s checkpoint root (no launch profile:
  // DATA_DIR/runs/run); the daemon refuses one outside.
  std::string Uri(const std::string& name) const { return "file://" + dir_.File("runs/run/" + name); }
};

TEST_F(WorkerClientTest, ReportsAreAcknowledgedAndStored) {
  ASSERT_TRUE(CreateRun("run", 2).ok());
  auto c0 = WorkerClient::Start(ClientOptions("run", 0, 2));
  auto c1 = WorkerClient::Start(ClientOptions("run", 1, 2));
  ASSERT_TRUE(c0.ok() && c1.ok());
  ASSERT_TRUE((*c0)->WaitForWelcome(absl::Seconds(10)).ok());
  ASSERT_TRUE((*c1)->WaitForWelcome(absl::Seconds(10)).ok());
  for (int s = 0; s < 300; ++s) {
    (*c0)->Report(Report(s, 2.0));
    (*c1)->Report(Report(s, 4.0));
  }
  ASSERT_TRUE((*c0)->Flush(absl::Seconds(30)).ok());
  ASSERT_TRUE((*c1)->Flush(absl::Seconds(30)).ok());
  EXPECT_EQ((*c0)->stats().reports_acked, 300);
  auto records = Query("run");
  ASSERT_EQ(records.size(), 300u);
  for (const auto& r : records) {
    EXPECT_EQ(r.ranks_reported(), 2u);
    EXPECT_DOUBLE_EQ(r.loss(), 3.0);  // mean of the two ranks
    EXPECT_EQ(r.max_loss().rank(), 1u);
  }
}

TEST_F(WorkerClientTest, UnknownRunIsAFinalRejection) {
  auto c = WorkerClient::Start(ClientOptions("missing"));
  ASSERT_TRUE(c.ok());
  absl::Status s = (*c)->WaitForWelcome(absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("UNKNOWN_RUN"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing"));
  ASSERT_TRUE((*c)->rejection().has_value());
}

TEST_F(WorkerClientTest, SurvivesDaemonRestartWithoutLossOrDuplicates) {
  ASSERT_TRUE(CreateRun("run").ok());
  auto c = WorkerClient::Start(ClientOptions("run"));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->WaitForWelcome(absl::Seconds(10)).ok());
  for (int s = 0; s < 200; ++s) (*c)->Report(Report(s, 1.0 + s));
  ASSERT_TRUE((*c)->Flush(absl::Seconds(30)).ok());

  // The daemon goes away; reports keep coming and wait unacknowledged.
  const int port = daemon_->port();
  daemon_->Shutdown(absl::Milliseconds(100));
  daemon_.reset();
  for (int s = 200; s < 400; ++s) (*c)->Report(Report(s, 1.0 + s));
  absl::Status early = (*c)->Flush(absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(early)) << early;
  EXPECT_THAT(std::string(early.message()), HasSubstr("unacknowledged"));

  StartDaemon(port);
  ASSERT_TRUE((*c)->Flush(absl::Seconds(30)).ok());
  EXPECT_GE((*c)->stats().connects, 2);
  auto records = Query("run");
  ASSERT_EQ(records.size(), 400u);
  for (int s = 0; s < 400; ++s) {
    EXPECT_EQ(records[s].step(), s);
    EXPECT_EQ(records[s].ranks_reported(), 1u) << "step " << s;
    EXPECT_DOUBLE_EQ(records[s].loss(), 1.0 + s);
  }
}

TEST_F(WorkerClientTest, CheckpointNoticesAreRegistered) {
  ASSERT_TRUE(CreateRun("run").ok());
  auto c = WorkerClient::Start(ClientOptions("run"));
  ASSERT_TRUE((*c)->WaitForWelcome(absl::Seconds(10)).ok());
  for (int s = 0; s <= 100; ++s) (*c)->Report(Report(s));
  v1::CheckpointSaved saved;
  saved.set_step(100);
  saved.set_data_position(100);
  saved.set_uri(Uri("step-100"));
  saved.set_bytes(4096);
  saved.set_checksum("abc123");
  saved.set_complete(true);
  (*c)->ReportCheckpoint(saved);
  ASSERT_TRUE((*c)->Flush(absl::Seconds(30)).ok());
  // The notice travels after the reports; wait for it to land.
  v1::ListCheckpointsResponse out;
  for (int i = 0; i < 100 && out.checkpoints_size() == 0; ++i) {
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_run("run");
    out.Clear();
    ASSERT_TRUE(supervisor_->ListCheckpoints(&ctx, req, &out).ok());
    if (out.checkpoints_size() == 0) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(out.checkpoints_size(), 1);
  EXPECT_EQ(out.checkpoints(0).step(), 100);
  EXPECT_EQ(out.checkpoints(0).uri(), Uri("step-100"));
  EXPECT_TRUE(out.checkpoints(0).complete());
}

TEST_F(WorkerClientTest, DeletedCheckpointIsNotResurrectedAfterADaemonRestart) {
  ASSERT_TRUE(CreateRun("run").ok());
  auto c = WorkerClient::Start(ClientOptions("run"));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->WaitForWelcome(absl::Seconds(10)).ok());
  for (int64_t step : {100, 200}) {
    v1::CheckpointSaved saved;
    saved.set_step(step);
    saved.set_uri(Uri("step-" + std::to_string(step)));
    saved.set_complete(true);
    (*c)->ReportCheckpoint(saved);
  }
  v1::CheckpointDeleted deleted;
  deleted.set_step(100);
  deleted.set_uri(Uri("step-100"));
  (*c)->ReportCheckpointDeleted(deleted);
  ASSERT_TRUE((*c)->Flush(absl::Seconds(30)).ok());
  auto steps = [&] {
    std::vector<int64_t> out;
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_run("run");
    v1::ListCheckpointsResponse list;
    if (!supervisor_->ListCheckpoints(&ctx, req, &list).ok()) return out;
    for (const auto& ck : list.checkpoints()) out.push_back(ck.step());
    return out;
  };
  auto wait_for = [&](const std::vector<int64_t>& want) {
    for (int i = 0; i < 200 && steps() != want; ++i) absl::SleepFor(absl::Milliseconds(25));
    return steps();
  };
  EXPECT_EQ(wait_for({200}), (std::vector<int64_t>{200}));

  // After a restart the client resends its recent notices: the deleted
  // checkpoint's CheckpointSaved is not among them.
  RestartDaemon();
  (*c)->Report(Report(0));
  ASSERT_TRUE((*c)->Flush(absl::Seconds(30)).ok());
  EXPECT_GE((*c)->stats().connects, 2);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(steps(), (std::vector<int64_t>{200}));
}

TEST_F(WorkerClientTest, HelloCarriesTheDataOrderAndCloseDeliversWhatWasSent) {
  ASSERT_TRUE(CreateRun("run").ok());
  WorkerClient::Options o = ClientOptions("run");
  v1::DataOrder order;
  order.set_seed(99);
  order.set_global_batch_size(16);
  o.data_order = order;
  o.total_steps = 300;
  auto c = WorkerClient::Start(o);
  ASSERT_TRUE((*c)->WaitForWelcome(absl::Seconds(10)).ok());
  grpc::ClientContext ctx;
  v1::GetRunRequest req;
  req.set_name("run");
  v1::Run run;
  ASSERT_TRUE(supervisor_->GetRun(&ctx, req, &run).ok());
  EXPECT_EQ(run.data_order().seed(), 99u);
  EXPECT_EQ(run.total_steps(), 300);

  // A notice queued right before Close still reaches the daemon.
  v1::CheckpointSaved saved;
  saved.set_step(50);
  saved.set_uri(Uri("step-50"));
  (*c)->ReportCheckpoint(saved);
  (*c)->Close();
  grpc::ClientContext list_ctx;
  v1::ListCheckpointsRequest list_req;
  list_req.set_run("run");
  v1::ListCheckpointsResponse list;
  ASSERT_TRUE(supervisor_->ListCheckpoints(&list_ctx, list_req, &list).ok());
  ASSERT_EQ(list.checkpoints_size(), 1);
  EXPECT_EQ(list.checkpoints(0).step(), 50);
}

}  // namespace
}  // namespace spikeguard::testing
