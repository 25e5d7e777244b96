// The Slurm launcher (daemon/launch/slurm_launcher.h) against a real
// single-node Slurm (slurm_cluster.h), and the adoption of what a previous
// daemon started (Slurm jobs and local processes) from the catalog.
//
// The tasks run tests/slurm's task.py (written by the test): it writes its
// argv and torch.distributed's variables to OUT/task-JOB-RANK, then waits
// while OUT/mode says "sleep" and exits with the number it says otherwise.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/clock.h"
#include "base/subprocess.h"
#include "daemon/ingest/run_registry.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "daemon/launch/launcher.h"
#include "daemon/launch/local_launcher.h"
#include "daemon/launch/slurm_launcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spikeguard/v1/policy.pb.h"
#include "proto/state_names.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint/checksum.h"
#include "tests/slurm/slurm_cluster.h"

namespace spikeguard::daemon {
namespace {

using ::testing::HasSubstr;
using spikeguard::testing::ReadFile;
using spikeguard::testing::SlurmCluster;
using spikeguard::testing::TempDir;
namespace fs = std::filesystem;
namespace v1 = spikeguard::v1;

constexpr char kTask[] = R"py(import os, sys, time
out = sys.argv[1]
name = "task-%s-%s" % (os.environ.get("SLURM_JOB_ID", "local%d" % os.getpid()), os.environ.get("RANK", "?"))
with open(os.path.join(out, name + ".tmp"), "w") as f:
    f.write("\n".join(sys.argv[2:]) + "\n")
    for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "SPIKEGUARD_RUN", "SPIKEGUARD_GENERATION", "SPIKEGUARD_ADDR", "FROM_PROFILE",
              "SPIKEGUARD_TOKEN", "SPIKEGUARD_TOKEN_FILE"]:
        f.write("%s=%s\n" % (k, os.environ.get(k, "")))
    if os.environ.get("SPIKEGUARD_TOKEN_FILE"):
        f.write("TOKEN_FROM_FILE=%s\n" % open(os.environ["SPIKEGUARD_TOKEN_FILE"]).read().strip())
os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))
while True:
    mode = open(os.path.join(out, "mode")).read().strip()
    if mode != "sleep":
        sys.exit(int(mode))
    time.sleep(0.1)
)py";

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path + ".tmp");
  f << text;
  f.close();
  fs::rename(path + ".tmp", path);
}

// The files tasks wrote for `job` (one per rank), by rank.
std::map<int, std::string> TaskFiles(const std::string& out, int64_t job) {
  std::map<int, std::string> files;
  for (int rank = 0; rank < 8; ++rank) {
    const std::string p = absl::StrCat(out, "/task-", job, "-", rank);
    if (fs::exists(p)) files[rank] = ReadFile(p);
  }
  return files;
}

// A field of `scontrol show job -o ID` ("" when absent).
std::string JobField(const SlurmCluster& cluster, int64_t job, const std::string& key) {
  auto r = cluster.Run({"/usr/bin/scontrol", "show", "job", "-o", absl::StrCat(job)});
  if (!r.ok()) return "";
  std::smatch m;
  const std::regex re("(^| )" + key + "=([^ ]*)");
  return std::regex_search(r->out, m, re) ? m[2].str() : "";
}

class LauncherFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    out_ = dir_.File("out");
    fs::create_directories(out_);
    Write(dir_.File("task.py"), kTask);
    Write(out_ + "/mode", "sleep");
    auto catalog = storage::Catalog::Open({.path = dir_.File("catalog.db")});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    catalog_ = std::move(*catalog);
  }

  std::string Profile(const std::string& name, const std::string& slurm_block, int max_restarts) {
    return absl::StrCat(R"pb(
      profile {
        name: ")pb", name, R"pb("
        argv: "/usr/bin/python3" argv: ")pb", dir_.File("task.py"), R"pb(" argv: ")pb", out_, R"pb("
        argv: "rank={rank}" argv: "local={local_rank}" argv: "world={world_size}"
        argv: "gen={generation}" argv: "plan={plan}" argv: "--resume={resume}"
        argv: "addr={addr}"
        env { key: "FROM_PROFILE" value: "yes" }
        checkpoint_root: ")pb", dir_.File("ckpt"), R"pb(/{run}"
        max_restarts: )pb", max_restarts, "\n", slurm_block, "\n}\n");
  }

  void LoadProfiles(const std::string& text) {
    auto p = LaunchProfiles::FromText(text);
    ASSERT_TRUE(p.ok()) << p.status();
    profiles_ = std::move(*p);
    guard_ = std::make_unique<CheckpointGuard>(catalog_.get(), profiles_.get(), dir_.path());
  }

  void CreateRun(const std::string& name, const std::string& profile, uint32_t world) {
    v1::Run run;
    run.set_name(name);
    run.set_world_size(world);
    run.mutable_spec()->set_profile(profile);
    ASSERT_TRUE(catalog_->CreateRun(run).ok());
  }

  // A checkpoint file in the run's root, registered complete with its checksum.
  std::string AddCheckpoint(const std::string& run, int64_t step) {
    const std::string path = dir_.File(absl::StrCat("ckpt/", run, "/step-", step));
    const std::string content = absl::StrCat("weights of step ", step);
    Write(path, content);
    v1::Checkpoint c;
    c.set_run(run);
    c.set_step(step);
    c.set_data_position(step);
    c.set_generation(0);
    c.set_uri("file://" + path);
    c.set_checksum(storage::ChecksumHex(storage::Xxh64Of(content)));
    c.set_bytes(static_cast<int64_t>(content.size()));
    c.set_complete(true);
    EXPECT_TRUE(catalog_->UpsertCheckpoint(c).ok());
    return path;
  }

  std::string RunState(const std::string& run) {
    auto r = catalog_->GetRun(run);
    return r.ok() ? std::string(RunStateName(r->state())) : "?";
  }

  std::string AuditOf(const std::string& run) {
    storage::Catalog::AuditQuery q;
    q.run = run;
    std::string all;
    if (auto rows = catalog_->QueryAudit(q); rows.ok()) {
      for (const auto& e : *rows) absl::StrAppend(&all, e.rpc(), ": ", e.detail(), "\n");
    }
    return all;
  }

  TempDir dir_;
  std::string out_;
  std::unique_ptr<storage::Catalog> catalog_;
  std::unique_ptr<LaunchProfiles> profiles_;
  std::unique_ptr<CheckpointGuard> guard_;
  RunRegistry registry_{Clock::Real()};
};

// --- The profile's slurm block ------------------------------------------------

TEST(SlurmProfile, BadFieldsAreRefusedNamingTheField) {
  auto check = [](const std::string& slurm, const std::string& want) {
    auto p = LaunchProfiles::FromText(absl::StrCat(
        R"pb(profile { name: "p" argv: "/bin/true" checkpoint_root: "/ckpt/{run}" )pb", slurm, "}"));
    ASSERT_FALSE(p.ok()) << slurm;
    EXPECT_THAT(p.status().message(), HasSubstr(want)) << slurm;
  };
  check(R"pb(slurm { partition: "gpu;rm" })pb", "slurm.partition 'gpu;rm'");
  check(R"pb(slurm { account: "-x" })pb", "slurm.account");
  check(R"pb(slurm { time_limit: "1 hour" })pb", "slurm.time_limit '1 hour' is not one of Slurm's forms");
  check(R"pb(slurm { time_limit: "1:2:3:4" })pb", "slurm.time_limit");
  check(R"pb(slurm { extra_sbatch_options: "--export=ALL" })pb",
        "slurm.extra_sbatch_options '--export=ALL' is not allowed (allowed: --comment");
  check(R"pb(slurm { extra_sbatch_options: "--output=/etc/passwd" })pb", "is not allowed");
  check(R"pb(slurm { extra_sbatch_options: "--wrap" })pb", "is not allowed");
  check(R"pb(slurm { extra_sbatch_options: "--gres=gpu:8 --uid=0" })pb", "no spaces");
  check(R"pb(slurm { extra_sbatch_options: "--comment=../../x/y" })pb", "no spaces, no '/'");
  check(R"pb(slurm { exec_path: "bin/spikeguard-slurm-exec" })pb", "slurm.exec_path");
  check(R"pb(slurm { nodes: 5000 })pb", "over the limit");
  auto no_argv = LaunchProfiles::FromText(
      R"pb(profile { name: "p" checkpoint_root: "/ckpt/{run}" slurm {} })pb");
  ASSERT_FALSE(no_argv.ok());
  EXPECT_THAT(no_argv.status().message(), HasSubstr("a Slurm profile needs an argv"));

  auto ok = LaunchProfiles::FromText(R"pb(profile { name: "p" argv: "/bin/true"
      checkpoint_root: "/ckpt/{run}" slurm { partition: "gpu" nodes: 2 tasks_per_node: 4
      time_limit: "2-00:00:00" account: "llm" extra_sbatch_options: "--gres=gpu:8"
      extra_sbatch_options: "--exclusive" } })pb");
  ASSERT_TRUE(ok.ok()) << ok.status();
  v1::RunSpec spec;
  spec.set_profile("p");
  EXPECT_TRUE((*ok)->ValidateSpec(spec, 8, "spec").ok());
  absl::Status wrong = (*ok)->ValidateSpec(spec, 6, "spec");
  EXPECT_THAT(wrong.message(), HasSubstr("world_size: 6 is not the 8 tasks of Slurm profile 'p' "
                                         "(nodes 2 x tasks_per_node 4)"));
}

TEST(SlurmProfile, TheDeployExampleLoadsAndAsksForSixteenTasks) {
  auto p = LaunchProfiles::Load(SPIKEGUARD_SOURCE_DIR "/deploy/slurm/launch-profiles.textproto.example");
  ASSERT_TRUE(p.ok()) << p.status();
  auto profile = (*p)->Find("gpt-slurm");
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_TRUE(profile->has_slurm());
  EXPECT_EQ(SlurmWorldSize(profile->slurm()), 16u);
}

TEST(SlurmCliErrors, AMissingScontrolIsUnreachableNotAForgottenJob) {
  SlurmCli::Options options;
  options.bin_dir = "/nonexistent/slurm/bin";
  SlurmCli slurm(options);
  absl::StatusOr<SlurmJob> job = slurm.Query(42);
  EXPECT_TRUE(absl::IsUnavailable(job.status())) << job.status();
  EXPECT_THAT(job.status().message(), HasSubstr("cannot ask Slurm about job 42"));
}

// --- spikeguardd --advertise-address --------------------------------------------

TEST(AdvertiseAddress, HostAndPortAreResolvedAndTheDefaultStaysLoopback) {
  EXPECT_EQ(*ResolveAdvertiseAddress("", "0.0.0.0:7070"), "") << "default: 127.0.0.1:PORT";
  EXPECT_EQ(*ResolveAdvertiseAddress("node07.cluster:7443", "0.0.0.0:7070"), "node07.cluster:7443");
  EXPECT_EQ(*ResolveAdvertiseAddress("10.1.2.3", "0.0.0.0:7070"), "10.1.2.3:7070")
      << "no port: --listen's";
  EXPECT_EQ(*ResolveAdvertiseAddress("[fd00::1]", "[::]:7071"), "[fd00::1]:7071");
  EXPECT_EQ(*ResolveAdvertiseAddress("[fd00::1]:9000", "[::]:7071"), "[fd00::1]:9000");
}

TEST(AdvertiseAddress, WhatAWorkerCannotDialIsRefusedNamingTheFlag) {
  auto refused = [](const std::string& flag, const std::string& listen, const std::string& why) {
    auto r = ResolveAdvertiseAddress(flag, listen);
    ASSERT_FALSE(r.ok()) << flag << " -> " << *r;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
    EXPECT_THAT(r.status().message(), HasSubstr("--advertise-address '" + flag + "'"));
    EXPECT_THAT(r.status().message(), HasSubstr(why)) << flag;
  };
  refused("node1:0", "0.0.0.0:7070", "port '0' is not 1-65535");
  refused("node1:70000", "0.0.0.0:7070", "is not 1-65535");
  refused("node1:http", "0.0.0.0:7070", "port 'http'");
  refused("node1:", "0.0.0.0:7070", "is not 1-65535");
  refused(":7070", "0.0.0.0:7070", "must be a host name");
  refused("no de", "0.0.0.0:7070", "must be a host name");
  refused("node;rm", "0.0.0.0:7070", "must be a host name");
  refused("fd00::1", "0.0.0.0:7070", "in brackets");
  refused("[fd00::1", "0.0.0.0:7070", "in brackets");
  refused("[zz::1]:7070", "0.0.0.0:7070", "bracketed IPv6");
  refused("0.0.0.0:7070", "0.0.0.0:7070", "unspecified address");
  refused("[::]", "[::]:7070", "unspecified address");
  refused("node1", "0.0.0.0:0", "picks one at startup: give the port");
}

TEST(AdvertiseAddress, SpikeguarddRefusesABadFlagAtStartup) {
  TempDir dir;
  SubprocessOptions o;
  o.timeout = absl::Seconds(20);
  auto r = RunSubprocess({SPIKEGUARDD, "--listen=127.0.0.1:0", "--data-dir=" + dir.File("d"),
                          "--advertise-address=node1"},
                         o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 2) << r->err;
  EXPECT_THAT(r->err, HasSubstr("spikeguardd: --advertise-address 'node1': no port given"));
  EXPECT_FALSE(fs::exists(dir.File("d/catalog.db"))) << "refused before anything starts";
}

// --- Against a real Slurm -----------------------------------------------------

class SlurmLauncherTest : public LauncherFixture {
 protected:
  void SetUp() override {
    if (std::string why = SlurmCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    LauncherFixture::SetUp();
    cluster_ = std::make_unique<SlurmCluster>(dir_);
    ASSERT_TRUE(cluster_->Start()) << cluster_->error();
  }
  void TearDown() override {
    launcher_.reset();
    if (cluster_) cluster_->Stop();
  }

  std::unique_ptr<SlurmLauncher> NewLauncher(const std::string& address = "127.0.0.1:1",
                                            const std::string& token = "") {
    SlurmLauncher::Options o;
    o.data_dir = dir_.path();
    o.daemon_address = address;
    if (!token.empty()) {
      o.worker_token = [token](const std::string&) { return token; };
    }
    o.poll = absl::Milliseconds(200);
    o.profiles = profiles_.get();
    o.checkpoints = guard_.get();
    o.slurm.env = cluster_->env();
    o.exec_path = SLURM_EXEC;
    return std::make_unique<SlurmLauncher>(o, catalog_.get(), &registry_, Clock::Real());
  }

  int64_t JobOf(const std::string& run) {
    auto v = launcher_->View(run);
    return v ? v->job_id : 0;
  }

  // Waits until `job`'s tasks have all written their file.
  bool TasksStarted(int64_t job, size_t ranks, absl::Duration timeout = absl::Seconds(60)) {
    return SlurmCluster::WaitFor([&] { return TaskFiles(out_, job).size() == ranks; }, timeout);
  }

  std::unique_ptr<SlurmCluster> cluster_;
  std::unique_ptr<SlurmLauncher> launcher_;
};

TEST_F(SlurmLauncherTest, AJobRunsEveryTaskWithItsRankAndTheRunsPlaceholdersAndFinishesTheRun) {
  LoadProfiles(Profile("slurm2", R"pb(slurm { partition: "debug" nodes: 1 tasks_per_node: 2
      time_limit: "10:00" extra_sbatch_options: "--comment=spikeguard" })pb", 2) +
               Profile("nowhere", R"pb(slurm { partition: "nosuch" })pb", 2));
  CreateRun("r1", "slurm2", 2);
  CreateRun("lost", "nowhere", 1);
  launcher_ = NewLauncher();
  // Slurm's refusal comes back whole, and nothing is recorded or running.
  absl::Status refused = launcher_->Launch("lost");
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("run 'lost': sbatch failed (exit 1)"));
  EXPECT_THAT(refused.message(), HasSubstr("invalid partition"));
  EXPECT_EQ(RunState("lost"), "created");
  EXPECT_TRUE(catalog_->ListLaunches()->empty());
  EXPECT_FALSE(launcher_->View("lost").has_value());
  ASSERT_TRUE(launcher_->Launch("r1").ok());
  EXPECT_TRUE(absl::IsAlreadyExists(launcher_->Launch("r1")));
  const int64_t job = JobOf("r1");
  ASSERT_GT(job, 0);
  // Recorded before anything else happens to it.
  auto recorded = catalog_->ListLaunches();
  ASSERT_TRUE(recorded.ok());
  ASSERT_EQ(recorded->size(), 1u);
  EXPECT_EQ((*recorded)[0].handle, job);
  EXPECT_EQ((*recorded)[0].kind, "slurm");
  EXPECT_EQ(RunState("r1"), "running");
  ASSERT_TRUE(TasksStarted(job, 2)) << ReadFile(dir_.File(absl::StrCat("runs/r1/slurm-", job, ".out")));
  EXPECT_EQ(JobField(*cluster_, job, "JobName"), "sg-r1-g0");
  EXPECT_EQ(JobField(*cluster_, job, "Partition"), "debug");
  EXPECT_EQ(JobField(*cluster_, job, "TimeLimit"), "00:10:00");
  EXPECT_EQ(JobField(*cluster_, job, "Comment"), "spikeguard");
  const auto files = TaskFiles(out_, job);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string& f = files.at(rank);
    EXPECT_THAT(f, HasSubstr(absl::StrCat("rank=", rank, "\nlocal=", rank, "\nworld=2\ngen=0\nplan=0-\n")));
    EXPECT_THAT(f, ::testing::Not(HasSubstr("--resume"))) << "a fresh start names no checkpoint";
    EXPECT_THAT(f, HasSubstr(absl::StrCat("RANK=", rank, "\nWORLD_SIZE=2\nLOCAL_RANK=", rank,
                                          "\nMASTER_ADDR=", cluster_->host(), "\n")));
    EXPECT_THAT(f, HasSubstr("SPIKEGUARD_RUN=r1\nSPIKEGUARD_GENERATION=0\nSPIKEGUARD_ADDR=127.0.0.1:1\n"
                             "FROM_PROFILE=yes\n"));
  }
  Write(out_ + "/mode", "0");
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return RunState("r1") == "finished"; }, absl::Seconds(60)))
      << RunState("r1");
  EXPECT_EQ(launcher_->View("r1")->state, "COMPLETED");
  EXPECT_TRUE(catalog_->ListLaunches()->empty()) << "a finished run leaves nothing to adopt";
}

// Every regular file under `root` whose bytes contain `needle`.
std::vector<std::string> FilesHolding(const std::string& root, const std::string& needle) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    if (ReadFile(it->path().string()).find(needle) != std::string::npos) {
      found.push_back(it->path().string());
    }
  }
  return found;
}

TEST_F(SlurmLauncherTest, TasksDialTheAdvertisedAddressAndReadTheTokenFromAFileNotTheJobEnv) {
  LoadProfiles(Profile("slurm2", R"pb(slurm { tasks_per_node: 2 })pb", 2));
  CreateRun("r5", "slurm2", 2);
  const std::string token = "sgw1:r5:0123456789abcdef-not-for-slurm";
  launcher_ = NewLauncher("head-node.example:7443", token);
  ASSERT_TRUE(launcher_->Launch("r5").ok());
  const int64_t job = JobOf("r5");
  ASSERT_TRUE(TasksStarted(job, 2)) << ReadFile(dir_.File(absl::StrCat("runs/r5/slurm-", job, ".out")));
  const std::string token_file = launcher_->TokenFile("r5");
  EXPECT_EQ(token_file, dir_.File("runs/r5/worker.token"));
  for (const auto& [rank, f] : TaskFiles(out_, job)) {
    // {addr} and SPIKEGUARD_ADDR are the advertised address, not loopback.
    EXPECT_THAT(f, HasSubstr("\naddr=head-node.example:7443\n")) << "rank " << rank;
    EXPECT_THAT(f, HasSubstr("SPIKEGUARD_ADDR=head-node.example:7443\n")) << "rank " << rank;
    // The token reaches the task through the file only.
    EXPECT_THAT(f, HasSubstr("\nSPIKEGUARD_TOKEN=\n")) << "rank " << rank;
    EXPECT_THAT(f, HasSubstr("SPIKEGUARD_TOKEN_FILE=" + token_file + "\n")) << "rank " << rank;
    EXPECT_THAT(f, HasSubstr("TOKEN_FROM_FILE=" + token + "\n")) << "rank " << rank;
  }
  struct stat st {};
  ASSERT_EQ(stat(token_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(ReadFile(token_file), token + "\n");
  // Nowhere in what the daemon wrote for Slurm, nor in Slurm's own state
  // (the job record keeps the job's environment: SPIKEGUARD_TOKEN_FILE is
  // there, the token is not).
  EXPECT_THAT(ReadFile(dir_.File("runs/r5/slurm-0.sbatch")), ::testing::Not(HasSubstr(token)));
  EXPECT_THAT(FilesHolding(cluster_->root(), "SPIKEGUARD_TOKEN_FILE=" + token_file),
              ::testing::Not(::testing::IsEmpty()))
      << "Slurm's state holds the job's environment (else this test proves nothing)";
  EXPECT_THAT(FilesHolding(cluster_->root(), token), ::testing::IsEmpty());
  EXPECT_THAT(FilesHolding(cluster_->root(), "SPIKEGUARD_TOKEN="), ::testing::IsEmpty());
  // The run ends: its token file goes.
  Write(out_ + "/mode", "0");
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return RunState("r5") == "finished"; }, absl::Seconds(60)))
      << RunState("r5");
  EXPECT_FALSE(fs::exists(token_file));
}

TEST_F(SlurmLauncherTest, ScancelRestartsFromTheNewestCheckpointThenTheBudgetEndsTheRun) {
  LoadProfiles(Profile("slurm1", R"pb(slurm { tasks_per_node: 2 })pb", /*max_restarts=*/1));
  CreateRun("r2", "slurm1", 2);
  launcher_ = NewLauncher();
  ASSERT_TRUE(launcher_->Launch("r2").ok());
  const int64_t job1 = JobOf("r2");
  ASSERT_TRUE(TasksStarted(job1, 2));
  AddCheckpoint("r2", 10);
  const std::string newest = AddCheckpoint("r2", 20);
  // An operator (or a preemption) cancels the job outside any incident.
  const absl::Time cancelled = absl::Now();
  ASSERT_EQ(cluster_->Run({"/usr/bin/scancel", absl::StrCat(job1)})->exit_code, 0);
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return JobOf("r2") != job1; }, absl::Seconds(60)));
  const int64_t job2 = JobOf("r2");
  ASSERT_TRUE(TasksStarted(job2, 2));
  std::printf("[measure] scancel -> restarted job's tasks running: %.2f s\n",
              absl::ToDoubleSeconds(absl::Now() - cancelled));
  for (const auto& [rank, f] : TaskFiles(out_, job2)) {
    EXPECT_THAT(f, HasSubstr("--resume=" + newest)) << "rank " << rank;
  }
  EXPECT_EQ(launcher_->View("r2")->restarts, 1);
  EXPECT_EQ(catalog_->ListLaunches()->at(0).handle, job2);
  EXPECT_EQ(catalog_->ListLaunches()->at(0).restarts, 1);
  // Never two starts at once: the second started once the first had ended.
  EXPECT_EQ(JobField(*cluster_, job1, "JobState"), "CANCELLED");
  EXPECT_LE(JobField(*cluster_, job1, "EndTime"), JobField(*cluster_, job2, "StartTime"));

  // The tasks fail (exit 7): the budget (1 restart) is spent, the run fails
  // with the reason.
  Write(out_ + "/mode", "7");
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return RunState("r2") == "failed"; }, absl::Seconds(60)))
      << RunState("r2");
  const std::string audit = AuditOf("r2");
  EXPECT_THAT(audit, HasSubstr(absl::StrCat("run-failed: Slurm job ", job2, " ended FAILED (exit code 7")));
  EXPECT_THAT(audit, HasSubstr("out of restarts (1 of 1 spent)"));
  EXPECT_EQ(JobOf("r2"), job2) << "no job after the budget";
  EXPECT_TRUE(catalog_->ListLaunches()->empty());
}

TEST_F(SlurmLauncherTest, ARestartedDaemonAdoptsTheJobAndKeepsSupervisingIt) {
  LoadProfiles(Profile("slurm1", R"pb(slurm { tasks_per_node: 1 })pb", /*max_restarts=*/2));
  CreateRun("r3", "slurm1", 1);
  launcher_ = NewLauncher();
  ASSERT_TRUE(launcher_->Launch("r3").ok());
  const int64_t job = JobOf("r3");
  ASSERT_TRUE(TasksStarted(job, 1));
  // The daemon goes away (its launcher stops polling; the job stays).
  launcher_->StopAll(absl::Seconds(1));
  launcher_.reset();
  EXPECT_EQ(JobField(*cluster_, job, "JobState"), "RUNNING");

  launcher_ = NewLauncher();
  auto adopted = launcher_->AdoptRecorded();
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(*adopted, 1);
  EXPECT_EQ(JobOf("r3"), job);
  EXPECT_TRUE(absl::IsAlreadyExists(launcher_->Launch("r3"))) << "adopted, not launched twice";
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return launcher_->View("r3")->state == "RUNNING"; },
                                    absl::Seconds(10)));
  const std::string ckpt = AddCheckpoint("r3", 30);
  ASSERT_EQ(cluster_->Run({"/usr/bin/scancel", absl::StrCat(job)})->exit_code, 0);
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return JobOf("r3") != job; }, absl::Seconds(60)));
  ASSERT_TRUE(TasksStarted(JobOf("r3"), 1));
  EXPECT_THAT(TaskFiles(out_, JobOf("r3")).at(0), HasSubstr("--resume=" + ckpt));
  EXPECT_EQ(launcher_->View("r3")->restarts, 1);
  // Exit code 3 (a rank the daemon rejected) is final, whatever the budget
  // left (1 of 2).
  const int64_t last = JobOf("r3");
  Write(out_ + "/mode", "3");
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return RunState("r3") == "failed"; }, absl::Seconds(60)))
      << RunState("r3");
  EXPECT_THAT(AuditOf("r3"), HasSubstr("a rank was rejected by the daemon"));
  EXPECT_EQ(JobOf("r3"), last) << "no restart after a rejection";
}

TEST_F(SlurmLauncherTest, ASilentRankGetsItsJobCancelledAndTheNextSubmittedOnlyAfterItEnded) {
  LoadProfiles(Profile("slurm1", R"pb(slurm { tasks_per_node: 1 })pb", /*max_restarts=*/2));
  CreateRun("r4", "slurm1", 1);
  v1::Policy policy;
  policy.mutable_launch()->set_heartbeat_timeout_ms(1500);
  ASSERT_TRUE(catalog_->PutPolicy("r4", policy).ok());
  launcher_ = NewLauncher();
  ASSERT_TRUE(launcher_->Launch("r4").ok());
  const int64_t job1 = JobOf("r4");
  ASSERT_TRUE(TasksStarted(job1, 1));
  // The rank attached once and then says nothing (a hung collective).
  registry_.Connect("r4", 0, 0, "node");
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return JobOf("r4") != job1; }, absl::Seconds(60)));
  const int64_t job2 = JobOf("r4");
  launcher_.reset();  // the stale rank would make the next job look hung too
  EXPECT_EQ(JobField(*cluster_, job1, "JobState"), "CANCELLED");
  EXPECT_LE(JobField(*cluster_, job1, "EndTime"), JobField(*cluster_, job2, "StartTime"));
  ASSERT_TRUE(TasksStarted(job2, 1));
  EXPECT_EQ(catalog_->ListLaunches()->at(0).restarts, 1);
}

// --- Local processes: pids with their start times ------------------------------

class LocalAdoptionTest : public LauncherFixture {
 protected:
  std::unique_ptr<LocalLauncher> NewLauncher() {
    LocalLauncher::Options o;
    o.data_dir = dir_.path();
    o.daemon_address = "127.0.0.1:1";
    o.poll = absl::Milliseconds(100);
    o.profiles = profiles_.get();
    o.checkpoints = guard_.get();
    return std::make_unique<LocalLauncher>(o, catalog_.get(), &registry_, Clock::Real());
  }
};

TEST_F(LocalAdoptionTest, ALiveRankIsAdoptedAndAReusedPidIsNot) {
  LoadProfiles(Profile("local", "", 3));
  CreateRun("l1", "local", 2);
  auto first = NewLauncher();
  ASSERT_TRUE(first->Launch("l1").ok());
  const pid_t rank0 = first->PidOf("l1", 0);
  ASSERT_GT(rank0, 0);
  ASSERT_TRUE(SlurmCluster::WaitFor(
      [&] { return fs::exists(absl::StrCat(out_, "/task-local", rank0, "-0")); }, absl::Seconds(20)));
  // The daemon dies (kill -9: nothing stopped, the records stay).
  first.reset();
  auto records = catalog_->ListLaunches();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0].handle, rank0);
  EXPECT_GT((*records)[0].start_ticks, 0);
  // Rank 1's pid now belongs to someone else (this test): same pid, another
  // start time.
  storage::LaunchRecord reused = (*records)[1];
  const pid_t old_rank1 = static_cast<pid_t>(reused.handle);
  kill(old_rank1, SIGKILL);
  waitpid(old_rank1, nullptr, 0);
  reused.handle = getpid();
  ASSERT_TRUE(catalog_->PutLaunch(reused).ok());

  auto second = NewLauncher();
  auto adopted = second->AdoptRecorded();
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(*adopted, 1) << "only rank 0, whose pid and start time match";
  EXPECT_EQ(second->PidOf("l1", 0), rank0);
  // Rank 1 was lost while the daemon was down: started again (not this
  // process, which is not signalled).
  ASSERT_TRUE(SlurmCluster::WaitFor(
      [&] { return second->PidOf("l1", 1) > 0 && second->PidOf("l1", 1) != getpid(); },
      absl::Seconds(10)));
  EXPECT_EQ(second->PidOf("l1", 0), rank0) << "the adopted rank is left running";
  // The adopted rank ends before the run's end: a crash, restarted.
  kill(rank0, SIGKILL);
  waitpid(rank0, nullptr, 0);
  ASSERT_TRUE(SlurmCluster::WaitFor(
      [&] { return second->PidOf("l1", 0) > 0 && second->PidOf("l1", 0) != rank0; },
      absl::Seconds(10)));
  Write(out_ + "/mode", "0");
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return RunState("l1") == "finished"; }, absl::Seconds(20)))
      << RunState("l1");
  EXPECT_TRUE(catalog_->ListLaunches()->empty());
}

}  // namespace
}  // namespace spikeguard::daemon
