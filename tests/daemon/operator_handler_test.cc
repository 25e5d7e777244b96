// operator_handler_test.cc
// -----------------------------------------------------------------------------
// What an operator's calls do, without gRPC: a DaemonOperatorHandler over a
// real SQLite catalog file, real launch profiles (none) and a real
// checkpoint guard in a temp dir, and (where a call needs one) a real
// Supervisor.
#include "daemon/control/operator_handler.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "daemon/control/supervisor.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint/checksum.h"
#include "tests/daemon/component_fixture.h"

namespace spikeguard::daemon {
namespace {

namespace fs = std::filesystem;
namespace v1 = spikeguard::v1;
using ::testing::HasSubstr;

constexpr char kRun[] = "run-a";

class OperatorHandlerTest : public testing::ComponentFixture {
 protected:
  void SetUp() override {
    ComponentFixture::SetUp();
    if (HasFatalFailure()) return;
    guard_ = std::make_unique<CheckpointGuard>(catalog_.get(), &profiles_, dir_.path());
    handler_ = std::make_unique<DaemonOperatorHandler>(Deps());
    ASSERT_TRUE(handler_->CreateRun(NewRunNamed(kRun)).ok());
  }

  void TearDown() override {
    // The supervisor reads the catalog on its threads: it goes first.
    handler_.reset();
    supervisor_.reset();
  }

  // What the daemon builds the handler over (no launcher).
  DaemonOperatorHandler::Deps Deps() {
    DaemonOperatorHandler::Deps deps;
    deps.catalog = catalog_.get();
    deps.catalog_path = catalog_path_;
    deps.clock = &clock_;
    deps.limits = limits_;
    deps.registry = &registry_;
    deps.counters = &counters_;
    deps.supervisor = supervisor_.get();
    deps.profiles = &profiles_;
    deps.checkpoints = guard_.get();
    deps.started = started_;
    return deps;
  }

  // A Supervisor as the daemon has it (not started: no tick thread), and
  // the handler built over it.
  void AddSupervisor() {
    Supervisor::Deps deps;
    deps.catalog = catalog_.get();
    deps.hub = &hub_;
    deps.clock = &clock_;
    supervisor_ = std::make_unique<Supervisor>(std::move(deps));
    handler_ = std::make_unique<DaemonOperatorHandler>(Deps());
  }

  static RewindArgs RewindTo(int64_t step) {
    RewindArgs rewind;
    rewind.run = kRun;
    rewind.to_step = step;
    return rewind;
  }

  static NewRun NewRunNamed(const std::string& name, uint32_t world_size = 2) {
    NewRun run;
    run.name = name;
    run.world_size = world_size;
    return run;
  }

  // A checkpoint file under the run's checkpoint root, registered.
  absl::StatusOr<v1::Checkpoint> Register(int64_t step) {
    const fs::path root = fs::path(dir_.path()) / "runs" / kRun;
    fs::create_directories(root);
    const std::string file = (root / ("ckpt-" + std::to_string(step) + ".pt")).string();
    const std::string content = absl::StrCat("weights at step ", step);
    std::ofstream(file) << content;
    v1::Checkpoint c;
    c.set_run(kRun);
    c.set_step(step);
    c.set_data_position(step * 512);
    c.set_uri(file);
    c.set_bytes(static_cast<int64_t>(fs::file_size(file)));
    // The XXH64 of the whole file: a format the daemon cannot read verifies
    // by its registered checksum.
    c.set_checksum(storage::ChecksumHex(storage::Xxh64Of(content)));
    c.set_complete(true);
    return handler_->RegisterCheckpoint(c);
  }

  LaunchProfiles profiles_;
  std::unique_ptr<CheckpointGuard> guard_;
  std::unique_ptr<Supervisor> supervisor_;
  std::unique_ptr<DaemonOperatorHandler> handler_;
};

TEST_F(OperatorHandlerTest, CreateRunRefusesABadNameNamingTheFieldAndStoresAGoodOne) {
  auto bad = handler_->CreateRun(NewRunNamed("../etc"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("name"));
  EXPECT_EQ(catalog_->GetRun("../etc").status().code(), absl::StatusCode::kNotFound);

  auto created = handler_->CreateRun(NewRunNamed("gpt-7b", 8));
  ASSERT_TRUE(created.ok()) << created.status();
  auto stored = handler_->GetRun("gpt-7b");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->world_size(), 8u);
  EXPECT_EQ(stored->state(), v1::RUN_CREATED);
  // No mode given: the run only observes.
  EXPECT_EQ(stored->mode(), v1::MODE_OBSERVE);
  EXPECT_EQ(stored->created_unix_ms(), clock_.NowUnixMillis());
}

TEST_F(OperatorHandlerTest, CreateRunRefusesAWorldSizeOutOfRangeAndALaunchWithoutAProfile) {
  auto empty = handler_->CreateRun(NewRunNamed("zero", 0));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("world_size"));

  NewRun launched = NewRunNamed("launched");
  launched.launch = true;
  auto refused = handler_->CreateRun(launched);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "spec.profile: launching a run needs a launch profile of the daemon's");
  EXPECT_FALSE(catalog_->GetRun("launched").ok());
}

TEST_F(OperatorHandlerTest, RegisteredCheckpointsAreListedAndPinned) {
  ASSERT_TRUE(Register(100).ok());
  auto registered = Register(200);
  ASSERT_TRUE(registered.ok()) << registered.status();
  // No time given: the daemon's clock stamps it.
  EXPECT_EQ(registered->created_unix_ms(), clock_.NowUnixMillis());

  auto page = handler_->ListCheckpoints(kRun, "");
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->items.size(), 2u);
  EXPECT_EQ(page->items[0].step(), 100);
  EXPECT_EQ(page->items[1].step(), 200);
  EXPECT_EQ(page->items[1].data_position(), 200 * 512);
  EXPECT_EQ(page->next_page_token, "");

  auto pinned = handler_->PinCheckpoint(kRun, 100, true);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_TRUE(pinned->pinned());
  EXPECT_TRUE(handler_->ListCheckpoints(kRun, "")->items[0].pinned());
}

TEST_F(OperatorHandlerTest, ACheckpointOutsideTheRunsRootIsRefusedAndNotStored) {
  v1::Checkpoint c;
  c.set_run(kRun);
  c.set_step(10);
  c.set_uri("/etc/passwd");
  c.set_complete(true);
  auto refused = handler_->RegisterCheckpoint(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("checkpoint."));
  EXPECT_TRUE(handler_->ListCheckpoints(kRun, "")->items.empty());

  // Lists of a run that does not exist are NOT_FOUND, not empty.
  EXPECT_EQ(handler_->ListCheckpoints("ghost", "").status().code(), absl::StatusCode::kNotFound);
  auto bad_token = handler_->ListCheckpoints(kRun, "x17");
  EXPECT_EQ(bad_token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_token.status().message(), HasSubstr("page_token: 'x17'"));
}

TEST_F(OperatorHandlerTest, QueryTelemetryRejectsUnknownMetricsAndBadRanges) {
  TelemetryQuery query;
  query.run = kRun;
  query.metrics.Add("loss");
  query.metrics.Add("los");
  auto unknown = handler_->QueryTelemetry(query);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("metrics: unknown metric 'los'; known: "));
  EXPECT_THAT(unknown.status().message(), HasSubstr("max_attn_logit"));

  query.metrics.Clear();
  query.from_step = 50;
  query.to_step = 10;
  EXPECT_EQ(handler_->QueryTelemetry(query).status().message(),
            "to_step: 10 is before from_step 50");

  // A valid query of a run with no telemetry yet is an empty answer.
  query.to_step.reset();
  query.metrics.Add("loss");
  auto empty = handler_->QueryTelemetry(query);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->records.empty());
  EXPECT_FALSE(empty->truncated);
}

TEST_F(OperatorHandlerTest, ManualActionsWithoutASupervisorAreUnavailable) {
  RewindArgs rewind = RewindTo(100);
  auto r = handler_->Rewind(rewind);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "daemon is starting");
  EXPECT_EQ(handler_->Pause(kRun).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(handler_->WatchIncidents(auth::Principal(), kRun).status().code(),
            absl::StatusCode::kUnavailable);
  // Invalid values are still named first: retrying would not help them.
  EXPECT_EQ(handler_->Replay(kRun, -3, 0, "").status().message(), "from_step: -3 is negative");
}

TEST_F(OperatorHandlerTest, ARewindToAStepWithNoCheckpointIsRefusedSayingSo) {
  AddSupervisor();
  ASSERT_TRUE(Register(100).ok());
  RewindArgs rewind = RewindTo(50);
  auto r = handler_->Rewind(rewind);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "run 'run-a' has no complete checkpoint at or before step 50 on the line of its "
            "current generation 0");

  // A replay or a skip comes down to the same rewind.
  EXPECT_EQ(handler_->Replay(kRun, 50, 0, "r1").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(handler_->Skip(kRun, {40, 60}, "s1").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // An unknown run is NOT_FOUND, not a missing checkpoint.
  rewind.run = "ghost";
  EXPECT_EQ(handler_->Rewind(rewind).status().code(), absl::StatusCode::kNotFound);
}

// After a rewind, the checkpoints the old line saved past the branch point
// are another timeline: the listing says so, and a later rewind never
// starts from them.
TEST_F(OperatorHandlerTest, RewindTargetsAreTheCurrentGenerationsLineAndTheListingSaysWhy) {
  AddSupervisor();
  for (int64_t step : {100, 200, 300}) ASSERT_TRUE(Register(step).ok());
  auto first = handler_->Rewind(RewindTo(150));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->generation, 1);
  auto tree = catalog_->ListGenerations(kRun);
  ASSERT_TRUE(tree.ok()) << tree.status();
  ASSERT_EQ(tree->size(), 2u);
  EXPECT_EQ((*tree)[1].parent(), 0);
  EXPECT_EQ((*tree)[1].from_checkpoint_step(), 100);

  auto page = handler_->ListCheckpoints(kRun, "");
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->items.size(), 3u);
  EXPECT_TRUE(page->items[0].rewind_target());
  EXPECT_EQ(page->items[0].rewind_note(), "");
  for (int k : {1, 2}) {
    EXPECT_FALSE(page->items[k].rewind_target());
    EXPECT_EQ(page->items[k].rewind_note(),
              absl::StrCat("saved at step ", page->items[k].step(),
                           ", after generation 1's line left generation 0 at step 100"));
  }
  // Generation 0's step 300 is not where generation 1 was at step 300.
  clock_.Advance(absl::Seconds(1));  // another request id
  auto second = handler_->Rewind(RewindTo(300));
  ASSERT_TRUE(second.ok()) << second.status();
  tree = catalog_->ListGenerations(kRun);
  ASSERT_TRUE(tree.ok()) << tree.status();
  ASSERT_EQ(tree->size(), 3u);
  EXPECT_EQ((*tree)[2].from_checkpoint_step(), 100);
  EXPECT_EQ((*tree)[2].parent(), 0);
}

TEST_F(OperatorHandlerTest, ARewindNeverSilentlyGoesPastACheckpointThatNoLongerVerifies) {
  AddSupervisor();
  ASSERT_TRUE(Register(100).ok());
  auto newer = Register(200);
  ASSERT_TRUE(newer.ok()) << newer.status();
  fs::remove(newer->uri());
  RewindArgs rewind = RewindTo(250);
  auto r = handler_->Rewind(rewind);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("run 'run-a': cannot rewind to step 250: the "));
}

TEST_F(OperatorHandlerTest, RewindAndSkipNameTheOffendingWindowField) {
  RewindArgs rewind = RewindTo(100);
  rewind.skip = {{10, 20}, {30, 25}};
  auto r = handler_->Rewind(rewind);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("skip[1]."));
  EXPECT_THAT(r.status().message(), ::testing::Not(HasSubstr("skip[0]")));

  auto s = handler_->Skip(kRun, {-1, 5}, "");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("from_step"));
  EXPECT_THAT(s.status().message(), ::testing::Not(HasSubstr("skip[")));

  rewind.skip.clear();
  rewind.stop_after_step = 40;
  EXPECT_EQ(handler_->Rewind(rewind).status().message(),
            "stop_after_step: 40 is before the rewind step 100");
}

TEST_F(OperatorHandlerTest, SetPolicyRefusesAPolicyThatCannotRunAndStoresAGoodOne) {
  v1::Policy bad;
  bad.mutable_loss_spike()->set_window(-3);
  auto refused = handler_->SetPolicy(kRun, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("loss_spike.window"));
  const v1::Policy before = *handler_->GetPolicy(kRun);
  EXPECT_NE(before.loss_spike().window(), -3);

  v1::Policy good;
  good.mutable_loss_spike()->set_z_threshold(9.5);
  auto set = handler_->SetPolicy(kRun, good);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->loss_spike().z_threshold(), 9.5);
  // Merged over the effective policy: what was not named is kept.
  EXPECT_EQ(set->loss_spike().window(), before.loss_spike().window());
  EXPECT_EQ(handler_->GetPolicy(kRun)->loss_spike().z_threshold(), 9.5);
  // The daemon's default is untouched, and an unknown run has no policy.
  EXPECT_NE(handler_->GetPolicy("")->loss_spike().z_threshold(), 9.5);
  EXPECT_EQ(handler_->SetPolicy("ghost", good).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(OperatorHandlerTest, ListAuditFiltersByRunNewestFirstAndHonoursTheLimit) {
  for (const char* rpc : {"SupervisorService/Rewind", "SupervisorService/Pause",
                          "SupervisorService/Resume"}) {
    v1::AuditEntry e;
    e.set_unix_ms(clock_.NowUnixMillis());
    e.set_principal("alice");
    e.set_rpc(rpc);
    e.set_run(kRun);
    e.set_outcome("OK");
    ASSERT_TRUE(catalog_->AppendAudit(e).ok());
  }
  v1::AuditEntry other;
  other.set_principal("bob");
  other.set_rpc("SupervisorService/Pause");
  other.set_run("run-b");
  ASSERT_TRUE(catalog_->AppendAudit(other).ok());

  AuditQuery query;
  query.run = kRun;
  auto all = handler_->ListAudit(query);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->items.size(), 3u);
  EXPECT_EQ(all->items[0].rpc(), "SupervisorService/Resume");
  EXPECT_EQ(all->items[2].rpc(), "SupervisorService/Rewind");
  EXPECT_EQ(all->next_page_token, "");

  query.limit = 2;
  auto two = handler_->ListAudit(query);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->items.size(), 2u);
  EXPECT_EQ(two->items[1].rpc(), "SupervisorService/Pause");

  query.limit = -1;
  EXPECT_EQ(handler_->ListAudit(query).status().message(), "limit: -1 is negative");
  query.limit = 0;
  query.page_token = "soon";
  EXPECT_EQ(handler_->ListAudit(query).status().message(),
            "page_token: not a token this daemon gave out");
}

TEST_F(OperatorHandlerTest, APrincipalScopedToSomeRunsListsOnlyThose) {
  ASSERT_TRUE(handler_->CreateRun(NewRunNamed("run-b")).ok());
  auth::Principal alice;
  alice.name = "alice";
  alice.role = auth::Role::kOperator;
  alice.runs = {"run-b"};
  auto page = handler_->ListRuns(alice, "");
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->items.size(), 1u);
  EXPECT_EQ(page->items[0].name(), "run-b");

  auth::Principal admin;
  admin.role = auth::Role::kAdmin;
  EXPECT_EQ(handler_->ListRuns(admin, "")->items.size(), 2u);
}

TEST_F(OperatorHandlerTest, RunsListShowsTheLastStepRunsShowShows) {
  // Both ranks committed steps 0..599 and left: the stored row still says 0.
  for (uint32_t rank : {0u, 1u}) {
    std::vector<v1::StepReport> reports;
    for (int64_t step : {598, 599}) {
      v1::StepReport r;
      r.set_step(step);
      r.set_data_position(step);
      r.set_loss(2.0);
      reports.push_back(r);
    }
    ASSERT_TRUE(catalog_->IngestReports(kRun, 0, rank, reports).ok());
  }
  auth::Principal admin;
  admin.role = auth::Role::kAdmin;
  auto page = handler_->ListRuns(admin, "");
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->items.size(), 1u);
  EXPECT_EQ(page->items[0].last_step(), 599);
  EXPECT_EQ(page->items[0].last_step(), handler_->GetRun(kRun)->last_step());
  EXPECT_TRUE(page->items[0].ranks().empty());
}

TEST_F(OperatorHandlerTest, CommandsAndWatchesNameTheirRunBeforeAnythingIsSent) {
  AddSupervisor();
  auto bad = handler_->Pause("no spaces");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(handler_->Resume("ghost").status().code(), absl::StatusCode::kNotFound);
  // As ListIncidents: an unknown run is NOT_FOUND, not a watch that never ends.
  EXPECT_EQ(handler_->WatchIncidents(auth::Principal(), "ghost").status().code(),
            absl::StatusCode::kNotFound);

  auto watch = handler_->WatchIncidents(auth::Principal(), kRun);
  ASSERT_TRUE(watch.ok()) << watch.status();
  // Nothing has happened: the wait times out with an empty batch, the feed open.
  auto batch = (*watch)->Next(absl::Milliseconds(10));
  ASSERT_TRUE(batch.has_value());
  EXPECT_TRUE(batch->empty());
}

}  // namespace
}  // namespace spikeguard::daemon
