// The reference worker (a tiny model on a tiny synthetic corpus, in process)
// speaking real gRPC: to a scripted controller, to check what it says and how
// it obeys commands, and to a real spikeguardd, to check what the daemon makes
// of it (the data order it trains with, checkpoints retention deleted).
#include "worker/ref/reference_worker.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "daemon/launch/checkpoint_guard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/corpus/corpus.h"
#include "storage/corpus/corpus_tools.h"
#include "storage/corpus/data_order.h"
#include "tests/daemon/daemon_fixture.h"
#include "tests/worker/scripted_controller.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;
using worker::ReferenceWorker;

constexpr char kRun[] = "ref";

// A small corpus and a model small enough that a step takes a millisecond.
std::string MakeCorpus(const TempDir& dir) {
  storage::SynthOptions synth;
  synth.global_batch_size = 4;
  synth.sequence_length = 16;
  synth.positions = 400;
  auto meta = storage::SynthesizeCorpus(dir.File("corpus"), 7, {}, synth);
  EXPECT_TRUE(meta.ok()) << meta.status();
  return dir.File("corpus");
}

ReferenceWorker::Options WorkerOptions(const TempDir& dir, const std::string& address) {
  ReferenceWorker::Options o;
  for (const char* kv :
       {"layers=1", "heads=2", "width=16", "context=16", "peak_lr=1e-3", "warmup_steps=40",
        "clip_norm=100", "threads=1", "steps=40", "checkpoint_every=5", "keep_checkpoints=50"}) {
    EXPECT_TRUE(worker::ApplyConfigAssignment(kv, &o.config).ok()) << kv;
  }
  o.corpus_dir = MakeCorpus(dir);
  o.checkpoint_dir = dir.File("ckpt");
  o.use_daemon = true;
  o.client.address = address;
  o.client.run = kRun;
  o.client.flush_interval = absl::Milliseconds(5);
  o.client.initial_backoff = absl::Milliseconds(20);
  o.client.max_backoff = absl::Milliseconds(200);
  o.linger = absl::Seconds(60);
  return o;
}

// Runs the worker's training loop on a thread until it returns.
class RunningWorker {
 public:
  explicit RunningWorker(ReferenceWorker::Options options) {
    auto w = ReferenceWorker::Create(std::move(options));
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return;
    worker_ = std::move(*w);
    thread_ = std::thread([this] { result_ = worker_->Run(); });
  }
  ~RunningWorker() { (void)Join(); }
  absl::Status Join() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }
  ReferenceWorker* get() { return worker_.get(); }
  bool ok() const { return worker_ != nullptr; }

 private:
  std::unique_ptr<ReferenceWorker> worker_;
  std::thread thread_;
  absl::Status result_;
};

v1::Command Rewind(const std::string& id, const v1::CheckpointSaved& from, int64_t generation,
                   int64_t stop_after) {
  v1::Command c;
  c.set_id(id);
  c.set_kind(v1::Command::REWIND);
  c.mutable_checkpoint()->set_uri(from.uri());
  c.mutable_checkpoint()->set_step(from.step());
  c.set_new_generation(generation);
  c.set_stop_after_step(stop_after);
  return c;
}

v1::Command Simple(const std::string& id, v1::Command::Kind kind) {
  v1::Command c;
  c.set_id(id);
  c.set_kind(kind);
  return c;
}

// --- Against a scripted controller ----------------------------------------------------

class ReferenceWorkerCommandTest : public ::testing::Test {
 protected:
  TempDir dir_;
  ScriptedController controller_;
};

TEST_F(ReferenceWorkerCommandTest, RewindHParamsAreAbsolute) {
  ReferenceWorker::Options o = WorkerOptions(dir_, controller_.address());
  o.stop_after_step = 9;
  RunningWorker w(o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(0) >= 9; }));
  auto ckpt5 = controller_.CheckpointAt(5);
  ASSERT_TRUE(ckpt5.has_value());

  // Generation 1: lr × 0.5, run through step 10, which checkpoints (with the
  // 0.5 in the trainer state it saves).
  v1::Command half = Rewind("half", *ckpt5, 1, 10);
  half.mutable_hparams()->set_lr_scale(0.5);
  half.mutable_hparams()->set_clip_norm(0.25);
  ASSERT_TRUE(controller_.Send(half));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(1) >= 10; }));
  ASSERT_TRUE(controller_.ResultOf("half").has_value());
  EXPECT_TRUE(controller_.ResultOf("half")->ok());
  std::optional<v1::CheckpointSaved> ckpt10;
  for (const auto& m : controller_.Of(v1::WorkerMessage::kCheckpoint)) {
    if (m.checkpoint().step() == 10 && absl::StrContains(m.checkpoint().uri(), "g000001")) {
      ckpt10 = m.checkpoint();
    }
  }
  ASSERT_TRUE(ckpt10.has_value()) << "no generation-1 checkpoint at step 10";

  // Generation 2 from that checkpoint, with no hparams: the base config, not
  // the 0.5 the checkpoint carries.
  ASSERT_TRUE(controller_.Send(Rewind("base", *ckpt10, 2, 12)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(2) >= 12; }));
  // Generation 3 from step 5 with only a longer warmup: lr_scale is back to 1.
  v1::Command warm = Rewind("warm", *ckpt5, 3, 6);
  warm.mutable_hparams()->set_extra_warmup_steps(100);
  ASSERT_TRUE(controller_.Send(warm));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(3) >= 6; }));

  const auto g0_5 = controller_.ReportAt(0, 5);
  const auto g1_5 = controller_.ReportAt(1, 5);
  const auto g1_10 = controller_.ReportAt(1, 10);
  const auto g2_10 = controller_.ReportAt(2, 10);
  const auto g3_6 = controller_.ReportAt(3, 6);
  ASSERT_TRUE(g0_5 && g1_5 && g1_10 && g2_10 && g3_6);
  const double base_lr_5 = g0_5->lr();
  // Warmup over 40 steps from peak/40: lr(step) = 1e-3 * (step + 1) / 40.
  EXPECT_NEAR(base_lr_5, 1e-3 * 6 / 40, 1e-9);
  EXPECT_NEAR(g1_5->lr(), 0.5 * base_lr_5, 1e-9);
  EXPECT_NEAR(g1_10->lr(), 0.5 * 1e-3 * 11 / 40, 1e-9);
  EXPECT_NEAR(g2_10->lr(), 1e-3 * 11 / 40, 1e-9);
  // A fresh warmup of 100 steps starting at step 5: 2/100 of the scheduled lr.
  EXPECT_LT(g3_6->lr(), 0.1 * 1e-3 * 7 / 40);
  EXPECT_GT(g3_6->lr(), 0.0);
  // Clipping at 0.25 in generation 1 only (the base clips at 100, far
  // above this model's grad norm).
  EXPECT_TRUE(g1_5->clipped()) << g1_5->grad_norm();
  EXPECT_FALSE(g0_5->clipped()) << g0_5->grad_norm();
  EXPECT_FALSE(g2_10->clipped()) << g2_10->grad_norm();

  ASSERT_TRUE(controller_.Send(Simple("stop", v1::Command::STOP)));
  EXPECT_TRUE(w.Join().ok());
}

TEST_F(ReferenceWorkerCommandTest, FailedRewindPausesInTheOldGeneration) {
  ReferenceWorker::Options o = WorkerOptions(dir_, controller_.address());
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=1000000", &o.config).ok());
  RunningWorker w(o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(0) >= 20; }));

  v1::CheckpointSaved missing;
  missing.set_uri("file://" + dir_.File("ckpt/no-such-checkpoint.sgck"));
  missing.set_step(5);
  ASSERT_TRUE(controller_.Send(Rewind("bad", missing, 1, 0)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.ResultOf("bad").has_value(); }));
  const v1::CommandResult result = *controller_.ResultOf("bad");
  EXPECT_FALSE(result.ok());
  EXPECT_THAT(result.message(), HasSubstr("no-such-checkpoint"));

  // Paused where it was: nothing past the step it reported with the result.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(controller_.MaxStep(0), result.step() - 1);
  EXPECT_EQ(controller_.MaxStep(1), -1);

  // The next command decides: CONTINUE goes on in generation 0.
  ASSERT_TRUE(controller_.Send(Simple("go", v1::Command::CONTINUE)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(0) >= result.step() + 10; }));
  ASSERT_TRUE(controller_.Send(Simple("stop", v1::Command::STOP)));
  EXPECT_TRUE(w.Join().ok());
}

// file://localhost/P names P for the worker as for the daemon (it used to
// strip "file://" only and open the relative path "localhost/P"), and a
// %-escape is decoded once, as the daemon decodes it.
TEST_F(ReferenceWorkerCommandTest, RewindReadsTheUriAsTheDaemonDoes) {
  ReferenceWorker::Options o = WorkerOptions(dir_, controller_.address());
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=1000000", &o.config).ok());
  RunningWorker w(o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(0) >= 12; }));
  auto ckpt5 = controller_.CheckpointAt(5);
  ASSERT_TRUE(ckpt5.has_value());
  ASSERT_TRUE(absl::StartsWith(ckpt5->uri(), "file:///")) << ckpt5->uri();
  const std::string path = ckpt5->uri().substr(7);

  v1::CheckpointSaved localhost = *ckpt5;
  localhost.set_uri("file://localhost" + path);
  ASSERT_TRUE(controller_.Send(Rewind("localhost", localhost, 1, 0)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.ResultOf("localhost").has_value(); }));
  EXPECT_TRUE(controller_.ResultOf("localhost")->ok()) << controller_.ResultOf("localhost")->message();
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(1) >= 6; }));

  // The same file with its '.' spelled %2E.
  v1::CheckpointSaved encoded = *ckpt5;
  std::string escaped = path;
  escaped.replace(escaped.rfind('.'), 1, "%2E");
  encoded.set_uri("file://" + escaped);
  ASSERT_TRUE(controller_.Send(Rewind("encoded", encoded, 2, 0)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.ResultOf("encoded").has_value(); }));
  EXPECT_TRUE(controller_.ResultOf("encoded")->ok()) << controller_.ResultOf("encoded")->message();

  // A ".." the daemon would refuse is refused here too, naming the URI.
  v1::CheckpointSaved dotdot = *ckpt5;
  dotdot.set_uri("file://" + dir_.File("ckpt/../ckpt") + path.substr(path.rfind('/')));
  ASSERT_TRUE(controller_.Send(Rewind("dotdot", dotdot, 3, 0)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.ResultOf("dotdot").has_value(); }));
  EXPECT_FALSE(controller_.ResultOf("dotdot")->ok());
  EXPECT_THAT(controller_.ResultOf("dotdot")->message(), HasSubstr("'..' segment"));

  ASSERT_TRUE(controller_.Send(Simple("stop", v1::Command::STOP)));
  EXPECT_TRUE(w.Join().ok());
}

// The daemon no longer hashes a checkpoint before a rewind (it checks that
// the file is the one registered by its identity); the worker checks the
// checksum the command carries as it reads the file.
TEST_F(ReferenceWorkerCommandTest, RewindChecksTheCommandsChecksumAsItLoads) {
  ReferenceWorker::Options o = WorkerOptions(dir_, controller_.address());
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=1000000", &o.config).ok());
  RunningWorker w(o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(0) >= 12; }));
  auto ckpt5 = controller_.CheckpointAt(5);
  ASSERT_TRUE(ckpt5.has_value());
  ASSERT_EQ(ckpt5->checksum().size(), 16u);

  v1::Command wrong = Rewind("wrong", *ckpt5, 1, 0);
  wrong.mutable_checkpoint()->set_checksum("0123456789abcdef");
  ASSERT_TRUE(controller_.Send(wrong));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.ResultOf("wrong").has_value(); }));
  EXPECT_FALSE(controller_.ResultOf("wrong")->ok());
  EXPECT_THAT(controller_.ResultOf("wrong")->message(),
              HasSubstr("has XXH64 " + ckpt5->checksum() +
                        "; the daemon registered it with 0123456789abcdef"));

  v1::Command right = Rewind("right", *ckpt5, 2, 0);
  right.mutable_checkpoint()->set_checksum(absl::AsciiStrToUpper(ckpt5->checksum()));
  ASSERT_TRUE(controller_.Send(right));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.ResultOf("right").has_value(); }));
  EXPECT_TRUE(controller_.ResultOf("right")->ok()) << controller_.ResultOf("right")->message();
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(2) >= 6; }));

  ASSERT_TRUE(controller_.Send(Simple("stop", v1::Command::STOP)));
  EXPECT_TRUE(w.Join().ok());
}

TEST_F(ReferenceWorkerCommandTest, ScheduleEndingBeforeTheHorizonIsReported) {
  ReferenceWorker::Options o = WorkerOptions(dir_, controller_.address());
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=12", &o.config).ok());
  RunningWorker w(o);
  ASSERT_TRUE(w.ok());
  // Generation 0 runs its whole schedule.
  auto ended = [&](int64_t generation) {
    std::vector<v1::GenerationEnded> out;
    for (const auto& m : controller_.Of(v1::WorkerMessage::kGenerationEnded)) {
      if (m.generation_ended().generation() == generation) out.push_back(m.generation_ended());
    }
    return out;
  };
  ASSERT_TRUE(controller_.WaitFor([&] { return !ended(0).empty(); }));
  EXPECT_EQ(ended(0)[0].last_step(), 11);
  EXPECT_EQ(ended(0)[0].reason(), "end of training schedule (steps=12)");

  // A probe from step 5 with a horizon at step 50: the schedule ends at 11.
  auto ckpt5 = controller_.CheckpointAt(5);
  ASSERT_TRUE(ckpt5.has_value());
  ASSERT_TRUE(controller_.Send(Rewind("probe", *ckpt5, 1, 50)));
  ASSERT_TRUE(controller_.WaitFor([&] { return !ended(1).empty(); }));
  const v1::GenerationEnded e = ended(1)[0];
  EXPECT_EQ(e.generation(), 1);
  EXPECT_EQ(e.last_step(), 11);
  EXPECT_THAT(e.reason(), HasSubstr("end of training schedule (steps=12)"));
  EXPECT_THAT(e.reason(), HasSubstr("horizon at step 50"));
  // It comes after every report of the generation.
  const auto all = controller_.messages();
  size_t end_index = 0, last_report_index = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].has_generation_ended() && all[i].generation_ended().generation() == 1) end_index = i;
    if (all[i].has_reports() && all[i].reports().generation() == 1) last_report_index = i;
  }
  EXPECT_GT(end_index, last_report_index);
  EXPECT_EQ(controller_.MaxStep(1), 11);

  // Once per generation, even when a command comes while it lingers.
  ASSERT_TRUE(controller_.Send(Simple("pause", v1::Command::PAUSE)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.ResultOf("pause").has_value(); }));
  ASSERT_TRUE(controller_.Send(Simple("go", v1::Command::CONTINUE)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.ResultOf("go").has_value(); }));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(ended(1).size(), 1u);
  ASSERT_TRUE(controller_.Send(Simple("stop", v1::Command::STOP)));
  EXPECT_TRUE(w.Join().ok());
}

TEST_F(ReferenceWorkerCommandTest, RetentionKeepsPinnedCheckpointsAndReportsDeletions) {
  ReferenceWorker::Options o = WorkerOptions(dir_, controller_.address());
  ASSERT_TRUE(worker::ApplyConfigAssignment("keep_checkpoints=1", &o.config).ok());
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=30", &o.config).ok());
  o.stop_after_step = 9;
  RunningWorker w(o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.CheckpointAt(10).has_value(); }));
  auto deleted = [&] {
    std::vector<v1::CheckpointDeleted> out;
    for (const auto& m : controller_.Of(v1::WorkerMessage::kCheckpointDeleted)) {
      out.push_back(m.checkpoint_deleted());
    }
    return out;
  };
  ASSERT_TRUE(controller_.WaitFor([&] { return deleted().size() == 1; }));
  EXPECT_EQ(deleted()[0].step(), 5);
  EXPECT_EQ(deleted()[0].uri(), controller_.CheckpointAt(5)->uri());

  // The daemon pins step 10 (an incident will rewind there) and lets it go on.
  const v1::CheckpointSaved ckpt10 = *controller_.CheckpointAt(10);
  v1::Command go = Simple("go", v1::Command::CONTINUE);
  go.add_pinned_uris(ckpt10.uri());
  ASSERT_TRUE(controller_.Send(go));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.CheckpointAt(30).has_value(); }));
  ASSERT_TRUE(controller_.WaitFor([&] { return deleted().size() == 4; }));
  std::vector<int64_t> steps;
  for (const auto& d : deleted()) steps.push_back(d.step());
  EXPECT_EQ(steps, (std::vector<int64_t>{5, 15, 20, 25}));
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir_.File("ckpt"))) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"ckpt-g000000-s000000000010.sgck",
                                            "ckpt-g000000-s000000000030.sgck"}));

  // The pinned checkpoint is there to rewind to.
  ASSERT_TRUE(controller_.Send(Rewind("probe", ckpt10, 1, 12)));
  ASSERT_TRUE(controller_.WaitFor([&] { return controller_.MaxStep(1) >= 12; }));
  EXPECT_TRUE(controller_.ResultOf("probe")->ok());
  ASSERT_TRUE(controller_.Send(Simple("stop", v1::Command::STOP)));
  EXPECT_TRUE(w.Join().ok());
}

// --- Against a real spikeguardd --------------------------------------------------------

// Workers started by hand, as under torchrun or a scheduler: their runs
// name an external launch profile (no argv) whose roots hold the tests'
// temp dirs, where the workers keep their checkpoints and corpora.
class ReferenceWorkerDaemonTest : public DaemonFixture {
 protected:
  void ConfigureDaemon(daemon::Daemon::Options& options) override {
    const std::string tmp = std::filesystem::canonical(std::filesystem::temp_directory_path());
    std::ofstream(dir_.File("profiles.textproto"))
        << "profile { name: \"hand\" checkpoint_root: \"" << tmp << "\" corpus_root: \"" << tmp
        << "\" }\n";
    options.launch_profiles_file = dir_.File("profiles.textproto");
  }

  grpc::Status CreateRun(const std::string& name, uint32_t world_size = 1) {
    return CreateRunWithManifest(name, v1::Manifest(), world_size);
  }

  grpc::Status CreateRunWithManifest(const std::string& name, const v1::Manifest& manifest,
                                     uint32_t world_size = 1) {
    grpc::ClientContext ctx;
    v1::CreateRunRequest req;
    req.set_name(name);
    req.set_world_size(world_size);
    req.mutable_spec()->set_profile("hand");
    *req.mutable_spec()->mutable_manifest() = manifest;
    v1::Run out;
    return supervisor_->CreateRun(&ctx, req, &out);
  }

  v1::Run GetRun(const std::string& name) {
    grpc::ClientContext ctx;
    v1::GetRunRequest req;
    req.set_name(name);
    v1::Run out;
    grpc::Status s = supervisor_->GetRun(&ctx, req, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  std::vector<v1::Checkpoint> Checkpoints(const std::string& run) {
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_run(run);
    v1::ListCheckpointsResponse out;
    grpc::Status s = supervisor_->ListCheckpoints(&ctx, req, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {out.checkpoints().begin(), out.checkpoints().end()};
  }

  static v1::WorkerMessage HelloWithOrder(const std::string& run, uint32_t rank, uint32_t world,
                                          uint64_t seed) {
    v1::WorkerMessage m;
    v1::Hello* h = m.mutable_hello();
    h->set_run(run);
    h->set_rank(rank);
    h->set_world_size(world);
    h->mutable_data_order()->set_dataset_fingerprint("xxh64:feed");
    h->mutable_data_order()->set_seed(seed);
    h->mutable_data_order()->set_global_batch_size(4);
    h->mutable_data_order()->set_sequence_length(16);
    (*h->mutable_data_order()->mutable_blend())["prose"] = 1.0;
    h->set_total_steps(500);
    return m;
  }
};

TEST_F(ReferenceWorkerDaemonTest, HelloDataOrderIsRecordedAndContradictionsAreRefused) {
  ASSERT_TRUE(CreateRun("free", 2).ok());
  Attached rank0 = AttachWith(HelloWithOrder("free", 0, 2, 99));
  ASSERT_TRUE(rank0.first.has_welcome()) << rank0.first.DebugString();
  const v1::Run run = GetRun("free");
  EXPECT_EQ(run.data_order().seed(), 99u);
  EXPECT_EQ(run.data_order().global_batch_size(), 4);
  EXPECT_EQ(run.data_order().sequence_length(), 16);
  EXPECT_EQ(run.data_order().dataset_fingerprint(), "xxh64:feed");
  EXPECT_EQ(run.total_steps(), 500);

  // Rank 1 reads its batches in another order than rank 0, which is live.
  Attached rank1 = AttachWith(HelloWithOrder("free", 1, 2, 98));
  ASSERT_TRUE(rank1.first.has_reject()) << rank1.first.DebugString();
  EXPECT_EQ(rank1.first.reject().reason(), v1::Reject::DATA_ORDER_MISMATCH);
  EXPECT_THAT(rank1.first.reject().message(), HasSubstr("seed"));
  EXPECT_THAT(rank1.first.reject().message(), HasSubstr("98"));
  EXPECT_THAT(rank1.first.reject().message(), HasSubstr("99"));
  Attached rank1_ok = AttachWith(HelloWithOrder("free", 1, 2, 99));
  EXPECT_TRUE(rank1_ok.first.has_welcome()) << rank1_ok.first.DebugString();

  // A manifest that fixes the seed refuses a worker with another one.
  v1::Manifest manifest;
  manifest.set_seed(7);
  manifest.set_sequence_length(16);
  ASSERT_TRUE(CreateRunWithManifest("fixed", manifest).ok());
  Attached wrong = AttachWith(HelloWithOrder("fixed", 0, 1, 99));
  ASSERT_TRUE(wrong.first.has_reject()) << wrong.first.DebugString();
  EXPECT_EQ(wrong.first.reject().reason(), v1::Reject::DATA_ORDER_MISMATCH);
  EXPECT_THAT(wrong.first.reject().message(), HasSubstr("hello.data_order.seed"));
  EXPECT_THAT(wrong.first.reject().message(), HasSubstr("99"));
  EXPECT_THAT(wrong.first.reject().message(), HasSubstr("7"));
  EXPECT_FALSE(GetRun("fixed").has_data_order());
  Attached right = AttachWith(HelloWithOrder("fixed", 0, 1, 7));
  EXPECT_TRUE(right.first.has_welcome()) << right.first.DebugString();
  EXPECT_EQ(GetRun("fixed").data_order().seed(), 7u);

  // A sequence length the manifest contradicts is named too.
  v1::WorkerMessage longer = HelloWithOrder("fixed", 0, 1, 7);
  longer.mutable_hello()->mutable_data_order()->set_sequence_length(32);
  Attached refused = AttachWith(longer);
  ASSERT_TRUE(refused.first.has_reject());
  EXPECT_THAT(refused.first.reject().message(), HasSubstr("sequence_length"));
}

TEST_F(ReferenceWorkerDaemonTest, DaemonNamesTheDocumentsTheWorkerRead) {
  // The corpus's default seed is 7; the worker overrides it, and the run's
  // manifest leaves the seed to the worker.
  TempDir work;
  ReferenceWorker::Options o = WorkerOptions(work, address_);
  ASSERT_TRUE(worker::ApplyConfigAssignment("data_seed=99", &o.config).ok());
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=8", &o.config).ok());
  o.linger = absl::ZeroDuration();
  v1::Manifest manifest;
  manifest.set_corpus_dir(o.corpus_dir);
  ASSERT_TRUE(CreateRunWithManifest(kRun, manifest).ok());
  {
    RunningWorker w(o);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w.Join().ok());
    EXPECT_EQ(w.get()->manifest().seed, 99u);
  }
  const v1::Run run = GetRun(kRun);
  EXPECT_EQ(run.data_order().seed(), 99u);
  EXPECT_EQ(run.total_steps(), 8);

  grpc::ClientContext ctx;
  v1::ResolveManifestRequest req;
  req.set_run(kRun);
  req.set_from_step(0);
  req.set_to_step(7);
  v1::ResolveManifestResponse resolved;
  grpc::Status s = supervisor_->ResolveManifest(&ctx, req, &resolved);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resolved.steps_size(), 8);

  // What the worker's own data order materializes at each position.
  auto corpus = storage::Corpus::Open(o.corpus_dir);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  auto meta = storage::ReadCorpusMetadata(o.corpus_dir);
  ASSERT_TRUE(meta.ok());
  storage::Manifest worker_manifest = meta->default_manifest;
  worker_manifest.dataset_fingerprint = (*corpus)->fingerprint();
  worker_manifest.seed = 99;
  auto worker_order = storage::DataOrder::Create(**corpus, worker_manifest);
  auto default_order = storage::DataOrder::Create(**corpus, meta->default_manifest);
  ASSERT_TRUE(worker_order.ok() && default_order.ok());
  ASSERT_NE(meta->default_manifest.seed, 99u);
  int differs_from_default = 0;
  for (const v1::ResolvedStep& step : resolved.steps()) {
    auto docs = (*worker_order)->DocumentsAt(step.data_position());
    ASSERT_TRUE(docs.ok()) << docs.status();
    std::vector<storage::DocumentId> named;
    for (const auto& d : step.documents()) named.push_back({d.domain(), d.document_id()});
    EXPECT_EQ(named, *docs) << "step " << step.step();
    if (*(*default_order)->DocumentsAt(step.data_position()) != *docs) ++differs_from_default;
  }
  EXPECT_GT(differs_from_default, 0);
}

TEST_F(ReferenceWorkerDaemonTest, CheckpointsRetentionDeletedLeaveTheCatalog) {
  TempDir work;
  ReferenceWorker::Options o = WorkerOptions(work, address_);
  ASSERT_TRUE(worker::ApplyConfigAssignment("keep_checkpoints=1", &o.config).ok());
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=20", &o.config).ok());
  o.linger = absl::ZeroDuration();
  ASSERT_TRUE(CreateRun(kRun).ok());
  {
    RunningWorker w(o);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w.Join().ok());
  }
  // Every notice is read before the worker's stream closes: the catalog
  // lists exactly the files retention left. Those are the newest, and the
  // oldest, which the daemon keeps pinned as the next rolling rewind target
  // (its answer to each checkpoint notice) until one is old enough.
  const auto list = Checkpoints(kRun);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].step(), 5);
  EXPECT_EQ(list[1].step(), 20);
  std::set<std::string> listed, on_disk;
  for (const auto& c : list) listed.insert(c.uri().substr(7));
  for (const auto& f : std::filesystem::directory_iterator(work.File("ckpt"))) {
    if (f.path().extension() == ".sgck") on_disk.insert(f.path().string());
  }
  EXPECT_EQ(listed, on_disk);
}

// A checkpoint dir whose name holds '%', a space and '#': the worker %-encodes
// what it reports and the daemon decodes it to the file on disk (a worker that
// sent "file://" + path had "%41" read as "A" and "#" cut nothing off).
TEST_F(ReferenceWorkerDaemonTest, CheckpointUrisNameTheFilesOnDisk) {
  TempDir work;
  ReferenceWorker::Options o = WorkerOptions(work, address_);
  o.checkpoint_dir = work.File("ck %41 #1");
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=10", &o.config).ok());
  o.linger = absl::ZeroDuration();
  ASSERT_TRUE(CreateRun(kRun).ok());
  {
    RunningWorker w(o);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w.Join().ok());
  }
  const auto list = Checkpoints(kRun);
  ASSERT_EQ(list.size(), 2u);
  for (const auto& c : list) {
    auto path = daemon::CheckpointGuard::PathOfUri(c.uri());
    ASSERT_TRUE(path.ok()) << c.uri() << ": " << path.status();
    EXPECT_TRUE(std::filesystem::is_regular_file(*path)) << c.uri() << " -> " << *path;
    EXPECT_TRUE(absl::StartsWith(*path, o.checkpoint_dir + "/")) << *path;
  }
}

TEST_F(ReferenceWorkerDaemonTest, CheckpointsPinnedInTheCatalogSurviveRetention) {
  TempDir work;
  ReferenceWorker::Options o = WorkerOptions(work, address_);
  ASSERT_TRUE(worker::ApplyConfigAssignment("keep_checkpoints=1", &o.config).ok());
  ASSERT_TRUE(worker::ApplyConfigAssignment("steps=25", &o.config).ok());
  o.stop_after_step = 9;
  o.linger = absl::ZeroDuration();
  ASSERT_TRUE(CreateRun(kRun).ok());
  auto w = std::make_unique<RunningWorker>(o);
  ASSERT_TRUE(w->ok());
  // At its horizon: the checkpoint at step 10 is the newest.
  auto only_step_10 = [&] {
    const auto list = Checkpoints(kRun);
    return !list.empty() && list.back().step() == 10;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!only_step_10() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(only_step_10());
  const std::string pinned_uri = Checkpoints(kRun).back().uri();

  // An operator pins it, and lets the run go on: every later command tells
  // the worker to keep it.
  {
    grpc::ClientContext ctx;
    v1::PinCheckpointRequest req;
    req.set_run(kRun);
    req.set_step(10);
    req.set_pinned(true);
    v1::Checkpoint out;
    grpc::Status s = supervisor_->PinCheckpoint(&ctx, req, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::ResumeRequest req;
    req.set_run(kRun);
    v1::ActionResponse out;
    grpc::Status s = supervisor_->Resume(&ctx, req, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(w->Join().ok());
  // Closing its stream, the worker lets the daemon read every notice first.
  w.reset();
  // The pinned one, the newest, and the oldest (the next rolling rewind
  // target the daemon keeps).
  const auto list = Checkpoints(kRun);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].step(), 5);
  EXPECT_EQ(list[1].step(), 10);
  EXPECT_TRUE(list[1].pinned());
  EXPECT_EQ(list[1].uri(), pinned_uri);
  EXPECT_EQ(list[2].step(), 25);
  EXPECT_TRUE(std::filesystem::exists(pinned_uri.substr(7)));
  EXPECT_FALSE(std::filesystem::exists(work.File("ckpt/ckpt-g000000-s000000000015.sgck")));
}

}  // namespace
}  // namespace spikeguard::testing
