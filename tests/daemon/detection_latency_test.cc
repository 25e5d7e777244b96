// Detection latency through the daemon's real path: a worker streams a trace
// with one spike; every step record's latency reaches the daemon's observer
// and /metrics, and the record that opened the incident has two ends, the
// engine's decision and the "opened" event durable, in that order.
#include <mutex>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/detect/eval/trace_gen.h"
#include "gmock/gmock.h"
#include "tests/daemon/daemon_fixture.h"
#include "worker/client/worker_client.h"

namespace spikeguard::testing {
namespace {

class DetectionLatencyTest : public DaemonFixture {
 protected:
  void ConfigureDaemon(daemon::Daemon::Options& options) override {
    options.detection_latency_observer = [this](const metrics::DetectionLatency& latency) {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(latency);
    };
  }

  std::vector<metrics::DetectionLatency> Seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

  std::mutex mu_;
  std::vector<metrics::DetectionLatency> seen_;
};

TEST_F(DetectionLatencyTest, TheOpeningRecordIsTimedToTheDecisionAndToTheDurableOpening) {
  {
    // Observe mode: the incident opens and closes; the run goes on, so
    // every record after the spike is judged too.
    grpc::ClientContext ctx;
    v1::CreateRunRequest req;
    req.set_name("lat");
    req.set_world_size(1);
    req.set_mode(v1::MODE_OBSERVE);
    v1::Run out;
    ASSERT_TRUE(supervisor_->CreateRun(&ctx, req, &out).ok());
  }
  detect::TraceSpec spec;
  spec.layers = 2;
  spec.seed = 7;
  spec.spikes = {300};
  detect::TraceModel model(spec);

  worker::WorkerClient::Options o;
  o.address = address_;
  o.run = "lat";
  o.world_size = 1;
  o.host = "test";
  auto client = worker::WorkerClient::Start(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForWelcome(absl::Seconds(30)).ok());
  constexpr int64_t kLast = 310;
  for (int64_t step = 0; step <= kLast; ++step) (*client)->Report(model.Report(0, step));
  ASSERT_TRUE((*client)->Flush(absl::Seconds(60)).ok());

  // The pipeline judges after the acks: wait until every record is in.
  std::vector<metrics::DetectionLatency> seen;
  for (int k = 0; k < 400 && static_cast<int64_t>(seen.size()) < kLast + 1; ++k) {
    absl::SleepFor(absl::Milliseconds(25));
    seen = Seen();
  }
  (*client)->Close();
  ASSERT_EQ(static_cast<int64_t>(seen.size()), kLast + 1) << "one latency per step record";

  int openings = 0;
  for (const metrics::DetectionLatency& l : seen) {
    EXPECT_GE(l.decision, absl::ZeroDuration());
    if (!l.opened) continue;
    ++openings;
    // The decision comes first; the opening is durable and published after.
    EXPECT_GT(*l.opened, l.decision);
  }
  EXPECT_EQ(openings, 1) << "the spike opens one incident";

  const auto detection = daemon_->metrics().detection_latency_seconds->Take();
  const auto opened = daemon_->metrics().incident_open_latency_seconds->Take();
  EXPECT_EQ(detection.count, static_cast<uint64_t>(kLast + 1));
  EXPECT_EQ(opened.count, 1u);
}

}  // namespace
}  // namespace spikeguard::testing
