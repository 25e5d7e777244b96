// worker_session_test.cc
// -----------------------------------------------------------------------------
// The domain side of a worker stream, without gRPC: a WorkerSession over a
// real SQLite catalog file, driven the way the Attach reactor drives it.
#include "daemon/ingest/worker_session.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "daemon/launch/checkpoint_guard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/catalog/catalog.h"
#include "tests/daemon/component_fixture.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = spikeguard::v1;
using ::testing::HasSubstr;

constexpr char kRun[] = "run-a";

class WorkerSessionTest : public testing::ComponentFixture {
 protected:
  void SetUp() override {
    ComponentFixture::SetUp();
    if (HasFatalFailure()) return;
    v1::Run run;
    run.set_name(kRun);
    run.set_world_size(2);
    v1::Manifest* manifest = run.mutable_spec()->mutable_manifest();
    manifest->set_dataset_fingerprint("fineweb-v2");
    manifest->set_seed(7);
    manifest->set_global_batch_size(512);
    ASSERT_TRUE(catalog_->CreateRun(run).ok());
  }

  std::unique_ptr<WorkerSession> Session() {
    return std::make_unique<WorkerSession>(Deps());
  }

  // What the daemon builds a session over (no supervisor; `checkpoints_`
  // when a test sets one).
  WorkerSession::Deps Deps() {
    WorkerSession::Deps deps;
    deps.catalog = catalog_.get();
    deps.clock = &clock_;
    deps.limits = limits_;
    deps.registry = &registry_;
    deps.checkpoints = checkpoints_;
    deps.counters = &counters_;
    return deps;
  }

  CheckpointGuard* checkpoints_ = nullptr;

  static v1::Hello Hello(uint32_t rank = 0, int64_t generation = 0,
                         const std::string& run = kRun) {
    v1::Hello hello;
    hello.set_run(run);
    hello.set_rank(rank);
    hello.set_world_size(2);
    hello.set_generation(generation);
    hello.set_host("node-" + std::to_string(rank));
    return hello;
  }

  // The order the manifest fixes, plus a blend it leaves free.
  static v1::DataOrder Order(const std::string& domain = "web") {
    v1::DataOrder order;
    order.set_dataset_fingerprint("fineweb-v2");
    order.set_seed(7);
    order.set_global_batch_size(512);
    order.set_sequence_length(2048);
    (*order.mutable_blend())[domain] = 1.0;
    return order;
  }

  static v1::StepReport Report(int64_t step, double loss = 2.0) {
    v1::StepReport r;
    r.set_step(step);
    r.set_data_position(step);
    r.set_loss(loss);
    r.set_tokens(1024);
    return r;
  }

  static v1::StepReportBatch Batch(uint64_t seq, std::vector<int64_t> steps) {
    v1::StepReportBatch batch;
    batch.set_seq(seq);
    for (int64_t step : steps) *batch.add_reports() = Report(step);
    return batch;
  }

  // The Reject a refusal carries; a failure when there is none.
  static v1::Reject RejectIn(const absl::Status& status) {
    std::optional<v1::Reject> reject = RejectOf(status);
    if (!reject.has_value()) {
      ADD_FAILURE() << "no Reject in " << status;
      return v1::Reject();
    }
    return *reject;
  }

  // Makes generation 1 the run's current one, as a rewind does.
  void Rewind() {
    v1::Generation next;
    next.set_parent(0);
    next.set_reason("rewind");
    ASSERT_TRUE(catalog_->CreateGeneration(kRun, next).ok());
  }

  // A session whose hello was accepted.
  std::unique_ptr<WorkerSession> Attached(uint32_t rank = 0) {
    auto session = Session();
    absl::StatusOr<v1::Welcome> welcome = session->Hello(Hello(rank));
    EXPECT_TRUE(welcome.ok()) << welcome.status();
    return session;
  }

  // Commits an accepted batch through the group committer.
  BatchOutcome Commit(const IngestBatch& batch) {
    GroupCommitter ingest(catalog_.get(), {});
    return ingest.Commit(batch);
  }

  bool Connected(uint32_t rank) const {
    for (const v1::RankState& r : registry_.Ranks(kRun)) {
      if (r.rank() == rank) return r.connected();
    }
    return false;
  }

};

// --- Hello -------------------------------------------------------------------

TEST_F(WorkerSessionTest, HelloForAnUnknownRunIsRefusedNamingIt) {
  auto session = Session();
  absl::StatusOr<v1::Welcome> welcome = session->Hello(Hello(0, 0, "no-such-run"));
  ASSERT_FALSE(welcome.ok());
  EXPECT_EQ(welcome.status().code(), absl::StatusCode::kNotFound);
  v1::Reject reject = RejectIn(welcome.status());
  EXPECT_EQ(reject.reason(), v1::Reject::UNKNOWN_RUN);
  EXPECT_EQ(reject.message(),
            "unknown run 'no-such-run': create it first (spikectl runs create no-such-run)");
  EXPECT_TRUE(registry_.Ranks("no-such-run").empty());
}

TEST_F(WorkerSessionTest, HelloFromAStaleGenerationIsRefusedWithTheCurrentOne) {
  Rewind();

  auto session = Session();
  absl::StatusOr<v1::Welcome> welcome = session->Hello(Hello(1, /*generation=*/0));
  ASSERT_FALSE(welcome.ok());
  EXPECT_EQ(welcome.status().code(), absl::StatusCode::kFailedPrecondition);
  v1::Reject reject = RejectIn(welcome.status());
  EXPECT_EQ(reject.reason(), v1::Reject::STALE_GENERATION);
  EXPECT_EQ(reject.current_generation(), 1);
  EXPECT_THAT(reject.message(), HasSubstr("rank 1 of run 'run-a' runs generation 0, the run is "
                                           "at generation 1"));
  EXPECT_FALSE(Connected(1));
}

TEST_F(WorkerSessionTest, HelloWithTheWrongWorldSizeIsRefused) {
  v1::Hello hello = Hello(0);
  hello.set_world_size(4);
  absl::StatusOr<v1::Welcome> welcome = Session()->Hello(hello);
  ASSERT_FALSE(welcome.ok());
  v1::Reject reject = RejectIn(welcome.status());
  EXPECT_EQ(reject.reason(), v1::Reject::INVALID_HELLO);
  EXPECT_EQ(reject.message(), "hello.world_size: 4 does not match run 'run-a' (world size 2)");
}

TEST_F(WorkerSessionTest, HelloRefusedByAuthorizationNeverRegisters) {
  std::string asked;
  WorkerSession session(Deps(), [&](const std::string& run) {
    asked = run;
    return absl::PermissionDeniedError("token 'ci' may not attach to run-a");
  });
  absl::StatusOr<v1::Welcome> welcome = session.Hello(Hello(0));
  ASSERT_FALSE(welcome.ok());
  EXPECT_EQ(asked, kRun);
  EXPECT_EQ(welcome.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(RejectIn(welcome.status()).reason(), v1::Reject::BAD_TOKEN);
  EXPECT_FALSE(Connected(0));
}

TEST_F(WorkerSessionTest, GoodHelloRegistersTheRankAndWelcomesIt) {
  auto session = Session();
  v1::Hello hello = Hello(1);
  *hello.mutable_data_order() = Order();
  hello.set_total_steps(10'000);
  absl::StatusOr<v1::Welcome> welcome = session->Hello(hello);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->run(), kRun);
  EXPECT_EQ(welcome->generation(), 0);
  EXPECT_EQ(welcome->committed_step(), -1);  // nothing committed yet
  EXPECT_TRUE(Connected(1));
  // The order is now the run's.
  auto run = catalog_->GetRunWithoutRanks(kRun);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->data_order().sequence_length(), 2048);
  EXPECT_EQ(run->total_steps(), 10'000);

  session->Detach();
  EXPECT_FALSE(Connected(1));
}

TEST_F(WorkerSessionTest, DataOrderContradictingTheManifestNamesTheField) {
  v1::Hello hello = Hello(0);
  *hello.mutable_data_order() = Order();
  hello.mutable_data_order()->set_seed(8);
  absl::StatusOr<v1::Welcome> welcome = Session()->Hello(hello);
  ASSERT_FALSE(welcome.ok());
  v1::Reject reject = RejectIn(welcome.status());
  EXPECT_EQ(reject.reason(), v1::Reject::DATA_ORDER_MISMATCH);
  EXPECT_EQ(reject.message(),
            "hello.data_order.seed: the worker trains with seed 8, the run's manifest says 7");
  EXPECT_FALSE(Connected(0));
}

TEST_F(WorkerSessionTest, DataOrderContradictingAConnectedRankNamesTheField) {
  auto rank0 = Session();
  v1::Hello hello0 = Hello(0);
  *hello0.mutable_data_order() = Order("web");
  ASSERT_TRUE(rank0->Hello(hello0).ok());

  v1::Hello hello1 = Hello(1);
  *hello1.mutable_data_order() = Order("code");
  absl::StatusOr<v1::Welcome> refused = Session()->Hello(hello1);
  ASSERT_FALSE(refused.ok());
  v1::Reject reject = RejectIn(refused.status());
  EXPECT_EQ(reject.reason(), v1::Reject::DATA_ORDER_MISMATCH);
  EXPECT_EQ(reject.message(),
            "hello.data_order.blend: rank 1 trains with {code: 1}, the run's other connected "
            "ranks with {web: 1}");

  // Once rank 0 is gone, a relaunch with the new order replaces the old one.
  rank0->Detach();
  auto relaunched = Session();
  ASSERT_TRUE(relaunched->Hello(hello1).ok());
  auto run = catalog_->GetRunWithoutRanks(kRun);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->data_order().blend().count("code"), 1u);
}

// --- Reports -----------------------------------------------------------------

TEST_F(WorkerSessionTest, AcceptedBatchIsTheRanksAndIsAcknowledgedOnceCommitted) {
  auto session = Attached(1);
  absl::StatusOr<WorkerSession::AcceptedBatch> accepted =
      session->Reports(Batch(/*seq=*/3, {0, 1, 2}));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->batch.run, kRun);
  EXPECT_EQ(accepted->batch.rank, 1u);
  EXPECT_EQ(accepted->batch.world_size, 2u);
  EXPECT_EQ(accepted->batch.generation, 0);
  EXPECT_TRUE(accepted->batch.require_current);
  ASSERT_EQ(accepted->batch.reports.size(), 3u);
  EXPECT_EQ(accepted->ticket.furthest.step(), 2);

  absl::StatusOr<v1::Ack> ack = session->Committed(Commit(accepted->batch), accepted->ticket);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->seq(), 3u);
  EXPECT_EQ(ack->accepted(), 3);
  EXPECT_EQ(ack->rejected(), 0);
  EXPECT_EQ(registry_.LastStep(kRun), 2);

  // A resend after a reconnect is answered as duplicates, and the next
  // hello of the rank learns what needs no resend.
  accepted = session->Reports(Batch(/*seq=*/4, {1, 2}));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ack = session->Committed(Commit(accepted->batch), accepted->ticket);
  ASSERT_TRUE(ack.ok());
  EXPECT_EQ(ack->duplicates(), 2);
  EXPECT_EQ(ack->message(),
            "2 duplicate or out-of-order reports ignored: rank 1 already committed step 2");
  session->Detach();
  absl::StatusOr<v1::Welcome> again = Session()->Hello(Hello(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->committed_step(), 2);
}

TEST_F(WorkerSessionTest, NonFiniteLossIsKeptForTheDetectors) {
  // A NaN or infinite loss is the signal a spike detector is for: the batch
  // is valid and its loss arrives as sent.
  auto session = Attached();
  v1::StepReportBatch batch = Batch(1, {0, 1});
  batch.mutable_reports(0)->set_loss(std::nan(""));
  batch.mutable_reports(1)->set_loss(std::numeric_limits<double>::infinity());
  absl::StatusOr<WorkerSession::AcceptedBatch> accepted = session->Reports(std::move(batch));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(std::isnan(accepted->batch.reports[0].loss()));
  EXPECT_TRUE(std::isinf(accepted->batch.reports[1].loss()));
}

TEST_F(WorkerSessionTest, MalformedBatchesAreRejectedNamingWhatWasWrong) {
  auto session = Attached();
  auto rejected = [&](v1::StepReportBatch batch) {
    absl::StatusOr<WorkerSession::AcceptedBatch> r = session->Reports(std::move(batch));
    EXPECT_FALSE(r.ok());
    // Answered by a rejecting ack: the stream stays open.
    EXPECT_FALSE(RejectOf(r.status()).has_value());
    return std::string(r.status().message());
  };
  EXPECT_EQ(rejected(Batch(1, {5, 4})),
            "reports[1].step: 4 is out of order (after step 5 in the same batch)");
  v1::StepReportBatch negative = Batch(2, {0});
  negative.mutable_reports(0)->set_tokens(-1);
  EXPECT_EQ(rejected(std::move(negative)), "reports[0].tokens: -1 is negative");
  std::vector<int64_t> many(Limits{}.max_reports_per_batch + 1);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i);
  EXPECT_THAT(rejected(Batch(3, many)), HasSubstr("reports: 4097 reports in one batch, more than "
                                                  "the limit 4096"));
  const int64_t far = Limits{}.max_step_ahead + 10;
  EXPECT_THAT(rejected(Batch(4, {far})),
              HasSubstr("(limits.max_step_ahead) past the run's last step"));
  EXPECT_EQ(counters_.reports_rejected.load(), 2 + 1 + 4097 + 1);
  EXPECT_EQ(counters_.reports_accepted.load(), 0);
}

TEST_F(WorkerSessionTest, BatchOfAnotherGenerationEndsTheStream) {
  auto session = Attached();
  v1::StepReportBatch batch = Batch(1, {0});
  batch.set_generation(3);
  absl::StatusOr<WorkerSession::AcceptedBatch> accepted = session->Reports(std::move(batch));
  ASSERT_FALSE(accepted.ok());
  v1::Reject reject = RejectIn(accepted.status());
  EXPECT_EQ(reject.reason(), v1::Reject::STALE_GENERATION);
  EXPECT_EQ(reject.message(),
            "stale generation: reports of generation 3 on a stream of generation 0");
}

TEST_F(WorkerSessionTest, RewindDuringTheCommitIsAnsweredAsStale) {
  auto session = Attached();
  absl::StatusOr<WorkerSession::AcceptedBatch> accepted = session->Reports(Batch(7, {0, 1}));
  ASSERT_TRUE(accepted.ok());
  Rewind();
  absl::StatusOr<v1::Ack> ack = session->Committed(Commit(accepted->batch), accepted->ticket);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->seq(), 7u);
  EXPECT_EQ(ack->rejected(), 2);
  EXPECT_EQ(ack->message(),
            "stale generation: reports of generation 0 refused; the run is at generation 1");

  // A failed write is not acknowledged: the stream ends, the worker resends.
  BatchOutcome failed;
  failed.status = absl::InternalError("disk I/O error");
  ack = session->Committed(failed, accepted->ticket);
  EXPECT_EQ(ack.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ack.status().message(), "catalog write failed: disk I/O error");
}

// --- Notices -----------------------------------------------------------------

TEST_F(WorkerSessionTest, CheckpointNoticesAreStoredOrRefusedWithAReason) {
  auto session = Attached();
  v1::CheckpointSaved saved;
  saved.set_step(100);
  saved.set_data_position(100);
  saved.set_uri("/ckpt/run-a/step-100");
  saved.set_complete(true);
  ASSERT_TRUE(session->CheckpointSaved(saved).ok());
  auto listed = catalog_->ListCheckpoints(kRun);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->at(0).uri(), "/ckpt/run-a/step-100");
  EXPECT_TRUE(listed->at(0).complete());

  v1::CheckpointSaved bad = saved;
  bad.set_uri("");
  EXPECT_EQ(session->CheckpointSaved(bad).message(), "checkpoint refused: checkpoint.uri: empty");

  v1::CheckpointDeleted deleted;
  deleted.set_step(-1);
  deleted.set_uri(saved.uri());
  EXPECT_THAT(std::string(session->CheckpointDeleted(deleted).message()),
              HasSubstr("checkpoint deletion notice refused: "));
  deleted.set_step(100);
  ASSERT_TRUE(session->CheckpointDeleted(deleted).ok());
  listed = catalog_->ListCheckpoints(kRun);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
}

// Retention must not remove every rewind target: each checkpoint notice
// moves the run's rolling pin to the newest checkpoint at least
// min_steps_before_onset (100) behind, releases the older one, and answers
// the worker with the pins its retention keeps.
TEST_F(WorkerSessionTest, CheckpointNoticesMoveTheRollingPinAndAnswerWithThePins) {
  auto session = Attached();
  auto save = [&](int64_t step) {
    v1::CheckpointSaved saved;
    saved.set_step(step);
    saved.set_data_position(step);
    saved.set_uri(absl::StrCat("/ckpt/run-a/g0-step-", step));
    saved.set_complete(true);
    v1::Ack pins;
    EXPECT_TRUE(session->CheckpointSaved(saved, &pins).ok());
    EXPECT_TRUE(pins.has_pins());
    return std::vector<std::string>(pins.pinned_uris().begin(), pins.pinned_uris().end());
  };
  auto rolling = [&]() {
    std::vector<int64_t> out;
    auto listed = catalog_->ListCheckpoints(kRun);
    EXPECT_TRUE(listed.ok());
    if (!listed.ok()) return out;
    for (const auto& c : *listed) {
      if (c.rolling_pin()) out.push_back(c.step());
    }
    return out;
  };
  auto uri = [](int64_t step) { return absl::StrCat("/ckpt/run-a/g0-step-", step); };
  // Nothing 100 steps old yet; the oldest checkpoint is kept as the next
  // target, so a worker keeping only its newest one does not delete it.
  EXPECT_THAT(save(50), ::testing::ElementsAre(uri(50)));
  EXPECT_TRUE(rolling().empty());
  EXPECT_THAT(save(150), ::testing::ElementsAre(uri(150), uri(50)));
  EXPECT_THAT(rolling(), ::testing::ElementsAre(50));
  // 150 is too new, and stays the next target (not 200).
  EXPECT_THAT(save(200), ::testing::ElementsAre(uri(150), uri(50)));
  EXPECT_THAT(save(250), ::testing::ElementsAre(uri(150), uri(200)));
  EXPECT_THAT(rolling(), ::testing::ElementsAre(150));  // 50 released
  // An incident's pin is kept beside it, and an incident's unpin leaves the
  // rolling pin alone.
  ASSERT_TRUE(catalog_->PinCheckpoint(kRun, 50, true).ok());
  EXPECT_THAT(save(300), ::testing::ElementsAre(uri(200), uri(250), uri(50)));
  ASSERT_TRUE(catalog_->PinCheckpoint(kRun, 200, false).ok());
  EXPECT_THAT(rolling(), ::testing::ElementsAre(200));
  // Retention deleted the pinned one anyway (an older worker): the pin
  // moves on to the newest that is left.
  v1::CheckpointDeleted gone;
  gone.set_step(200);
  gone.set_uri(uri(200));
  ASSERT_TRUE(session->CheckpointDeleted(gone).ok());
  EXPECT_THAT(save(350), ::testing::ElementsAre(uri(250), uri(300), uri(50)));
}

// A worker resends its recent checkpoint notices on each new stream, a
// later generation's too: the checkpoint stays its saver's, or a later
// incident would take another line's checkpoint for its own.
TEST_F(WorkerSessionTest, ANoticeResentOnALaterGenerationsStreamKeepsItsSaver) {
  v1::CheckpointSaved saved;
  saved.set_step(100);
  saved.set_data_position(100);
  saved.set_uri("/ckpt/run-a/g0-step-100");
  saved.set_checksum("sha256:aa");
  saved.set_complete(true);
  {
    auto first = Attached();
    ASSERT_TRUE(first->CheckpointSaved(saved).ok());
  }
  Rewind();
  auto later = Session();
  ASSERT_TRUE(later->Hello(Hello(0, /*generation=*/1)).ok());
  auto generation_of = [&]() {
    auto listed = catalog_->ListCheckpoints(kRun);
    EXPECT_TRUE(listed.ok());
    return listed.ok() && listed->size() == 1 ? listed->at(0).generation() : int64_t{-1};
  };
  // Resent with its saver (today's workers).
  v1::CheckpointSaved resent = saved;
  resent.set_generation(0);
  ASSERT_TRUE(later->CheckpointSaved(resent).ok());
  EXPECT_EQ(generation_of(), 0);
  // Resent without (an older worker): the same file keeps its saver.
  ASSERT_TRUE(later->CheckpointSaved(saved).ok());
  EXPECT_EQ(generation_of(), 0);
  // A saver after the stream's generation is refused, naming both.
  resent.set_generation(2);
  EXPECT_THAT(std::string(later->CheckpointSaved(resent).message()),
              HasSubstr("checkpoint.generation 2: not in [0, 1] (the stream's generation)"));
  EXPECT_EQ(generation_of(), 0);
}

TEST_F(WorkerSessionTest, CheckpointOutsideTheRunsRootIsRefusedBeforeItIsStored) {
  // Without a launch profile the run's root is DATA_DIR/runs/RUN.
  const std::string root = dir_.File("runs/run-a");
  std::filesystem::create_directories(root);
  CheckpointGuard guard(catalog_.get(), nullptr, dir_.path());
  checkpoints_ = &guard;
  auto session = Attached();
  v1::CheckpointSaved saved;
  saved.set_step(10);
  saved.set_uri("/etc/passwd");
  absl::Status refused = session->CheckpointSaved(saved);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("checkpoint refused: "));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("/etc/passwd"));
  saved.set_uri(root + "/step-10.ckpt");
  EXPECT_TRUE(session->CheckpointSaved(saved).ok());
  auto listed = catalog_->ListCheckpoints(kRun);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->at(0).uri(), root + "/step-10.ckpt");
  checkpoints_ = nullptr;
}

TEST_F(WorkerSessionTest, ImplausibleHeartbeatDoesNotMoveTheRank) {
  auto session = Attached();
  v1::Heartbeat beat;
  beat.set_step(Limits{}.max_step_ahead + 5);
  session->Heartbeat(beat);
  EXPECT_EQ(registry_.LastStep(kRun), -1);
  beat.set_step(40);
  session->Heartbeat(beat);
  EXPECT_EQ(registry_.LastStep(kRun), 40);
}

// --- the state of a run whose workers the user starts ---------------------------

v1::GenerationEnded Ended(int64_t generation, int64_t last_step) {
  v1::GenerationEnded e;
  e.set_generation(generation);
  e.set_last_step(last_step);
  e.set_reason("end of training schedule");
  return e;
}

TEST_F(WorkerSessionTest, SelfStartedRunGoesRunningThenFinishedWhenEveryRankEndedAndLeft) {
  v1::Run own;
  own.set_name("own");
  own.set_world_size(2);
  own.set_state(v1::RUN_CREATED);
  ASSERT_TRUE(catalog_->CreateRun(own).ok());
  auto state = [&] {
    auto row = catalog_->GetRunWithoutRanks("own");
    EXPECT_TRUE(row.ok()) << row.status();
    return row.ok() ? row->state() : v1::RUN_STATE_UNSPECIFIED;
  };
  auto rank0 = Session();
  ASSERT_TRUE(rank0->Hello(Hello(0, 0, "own")).ok());
  EXPECT_EQ(state(), v1::RUN_RUNNING);
  auto rank1 = Session();
  ASSERT_TRUE(rank1->Hello(Hello(1, 0, "own")).ok());
  rank0->GenerationEnded(Ended(0, 599));
  rank0->Detach();
  EXPECT_EQ(state(), v1::RUN_RUNNING);  // rank 1 still trains
  rank1->Detach();                // gone without ending its generation: a crash
  EXPECT_EQ(state(), v1::RUN_RUNNING);
  auto again = Session();
  ASSERT_TRUE(again->Hello(Hello(1, 0, "own")).ok());
  again->GenerationEnded(Ended(0, 599));
  again->Detach();
  EXPECT_EQ(state(), v1::RUN_FINISHED);
}

TEST_F(WorkerSessionTest, ALaunchedRunsStateIsLeftToItsLauncher) {
  v1::Run launched;
  launched.set_name("launched");
  launched.set_world_size(1);
  launched.set_state(v1::RUN_RUNNING);
  ASSERT_TRUE(catalog_->CreateRun(launched).ok());
  v1::Hello hello = Hello(0, 0, "launched");
  hello.set_world_size(1);
  auto rank0 = Session();
  ASSERT_TRUE(rank0->Hello(hello).ok());
  rank0->GenerationEnded(Ended(0, 99));
  rank0->Detach();
  auto row = catalog_->GetRunWithoutRanks("launched");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state(), v1::RUN_RUNNING);
}

}  // namespace
}  // namespace spikeguard::daemon
