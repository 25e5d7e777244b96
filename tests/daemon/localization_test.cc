// The daemon localizes an incident through its real path: a worker streams a
// trace whose per-layer statistics grow for 200 steps before a spike; the
// supervisor opens the incident without waiting for the per-layer fit, then
// records where the instability started in a "localized" event.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/detect/eval/trace_gen.h"
#include "gmock/gmock.h"
#include "tests/daemon/daemon_fixture.h"
#include "worker/client/worker_client.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;

class LocalizationTest : public DaemonFixture {};

TEST_F(LocalizationTest, AnIncidentIsOpenedThenLocalizedToTheSeriesThatMovedFirst) {
  ASSERT_TRUE(CreateRun("loc").ok());
  detect::TraceSpec spec;
  spec.layers = 4;
  spec.seed = 3;
  spec.spikes = {600};
  spec.precursor_steps = 200;
  detect::TraceModel model(spec);

  worker::WorkerClient::Options o;
  o.address = address_;
  o.run = "loc";
  o.rank = 0;
  o.world_size = 1;
  o.host = "test";
  auto client = worker::WorkerClient::Start(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForWelcome(absl::Seconds(30)).ok());
  for (int64_t step = 0; step <= 620; ++step) (*client)->Report(model.Report(0, step));
  ASSERT_TRUE((*client)->Flush(absl::Seconds(60)).ok());

  // The incident and its events are written by the run's pipeline, after
  // the acks: poll until its localization is in.
  v1::Incident incident;
  for (int k = 0; k < 200; ++k) {
    grpc::ClientContext ctx;
    v1::ListIncidentsRequest req;
    req.set_run("loc");
    v1::ListIncidentsResponse out;
    ASSERT_TRUE(supervisor_->ListIncidents(&ctx, req, &out).ok());
    if (out.incidents_size() > 0 && out.incidents(0).localization().layer() >= 0) {
      incident = out.incidents(0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  (*client)->Close();
  ASSERT_GT(incident.id(), 0) << "no localized incident for the spike at step 600";
  EXPECT_NEAR(incident.onset_step(), 600, 5);
  // The trace's growth starts 200 steps before the spike in every layer's
  // update ratio, activations and the last layer's attention logits.
  const v1::Localization& loc = incident.localization();
  ASSERT_FALSE(loc.ordered().empty()) << incident.ShortDebugString();
  EXPECT_EQ(loc.ordered(0), absl::StrCat(loc.signal(), "@", loc.layer()));
  EXPECT_GE(loc.layer(), 0);
  EXPECT_LT(loc.layer(), spec.layers);
  EXPECT_THAT(loc.ordered(), ::testing::Contains(absl::StrCat("max_attn_logit@", spec.layers - 1)));
  EXPECT_GT(loc.start_step(), 600 - 200 - 50);
  EXPECT_LT(loc.start_step(), 600);
  // Opened first (without the fit), localized right after.
  ASSERT_GE(incident.events_size(), 2);
  EXPECT_EQ(incident.events(0).kind(), "opened");
  EXPECT_EQ(incident.events(1).kind(), "localized");
  EXPECT_THAT(incident.events(1).detail(),
              HasSubstr(absl::StrCat(loc.signal(), " in layer ", loc.layer(), " moved first")));
}

}  // namespace
}  // namespace spikeguard::testing
