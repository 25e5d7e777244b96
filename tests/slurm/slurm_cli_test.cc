#include "daemon/launch/slurm_cli.h"

#include <sys/stat.h>

#include <fstream>

#include "gtest/gtest.h"
#include "tests/slurm/slurm_cluster.h"

namespace spikeguard::daemon {
namespace {

using spikeguard::testing::SlurmCluster;
using spikeguard::testing::TempDir;

// What scontrol 22.05 printed here for a failed two-task job, with a job
// name and a command holding spaces.
constexpr char kFailedLine[] =
    "JobId=2 JobName=a b UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 "
    "Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 "
    "RunTime=00:00:02 TimeLimit=UNLIMITED Partition=debug AllocNode:Sid=localhost:16629 "
    "NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=1,billing=2 Command=/tmp/a dir/job.sh "
    "WorkDir=/tmp/sl StdOut=/tmp/sl/out-2.txt Power= \n";

TEST(SlurmParse, ReadsStateExitCodeReasonAndNodesFromScontrolLines) {
  auto job = ParseScontrolJobLine(kFailedLine);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id, 2);
  EXPECT_EQ(job->name, "a b");
  EXPECT_EQ(job->state, SlurmJobState::kFailed);
  EXPECT_TRUE(SlurmJobEnded(job->state));
  EXPECT_EQ(job->reason, "NonZeroExitCode");
  EXPECT_EQ(job->exit_code, 3);
  EXPECT_EQ(job->exit_signal, 0);
  EXPECT_EQ(job->node_list, "vm");
  EXPECT_EQ(job->batch_host, "vm");
  EXPECT_EQ(job->num_tasks, 2);

  auto pending = ParseScontrolJobLine(
      "JobId=7 JobName=g1 JobState=PENDING Reason=Resources ExitCode=0:0 NodeList=(null)");
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_EQ(pending->state, SlurmJobState::kPending);
  EXPECT_FALSE(SlurmJobEnded(pending->state));
  EXPECT_EQ(pending->reason, "Resources");
  EXPECT_EQ(pending->node_list, "");

  auto node_fail = ParseScontrolJobLine(
      "JobId=8 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:9 NodeList=node[01-04]");
  ASSERT_TRUE(node_fail.ok());
  EXPECT_EQ(node_fail->state, SlurmJobState::kNodeFail);
  EXPECT_EQ(node_fail->exit_signal, 9);
  EXPECT_EQ(node_fail->node_list, "node[01-04]");
}

TEST(SlurmParse, UnknownStatesAreKeptAndBrokenLinesAreErrorsNamingTheField) {
  auto odd = ParseScontrolJobLine("JobId=9 JobState=RESV_DEL_HOLD ExitCode=0:0");
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->state, SlurmJobState::kOther);
  EXPECT_EQ(odd->state_text, "RESV_DEL_HOLD");
  EXPECT_FALSE(SlurmJobEnded(odd->state));  // never guessed as ended

  auto no_state = ParseScontrolJobLine("JobId=9 ExitCode=0:0");
  EXPECT_TRUE(absl::IsInvalidArgument(no_state.status()));
  EXPECT_NE(no_state.status().message().find("JobState"), std::string::npos);
  auto bad_exit = ParseScontrolJobLine("JobId=9 JobState=FAILED ExitCode=three");
  EXPECT_NE(bad_exit.status().message().find("ExitCode 'three'"), std::string::npos)
      << bad_exit.status();
  EXPECT_FALSE(ParseScontrolJobLine("JobId=x JobState=FAILED ExitCode=0:0").ok());
  EXPECT_FALSE(ParseScontrolJobLine("slurm_load_jobs error: Invalid job id specified").ok());
  EXPECT_FALSE(ParseScontrolJobLine("").ok());
}

TEST(SlurmParse, SbatchParsableIsAJobIdOrAnError) {
  EXPECT_EQ(*ParseSbatchParsable("123\n"), 123);
  EXPECT_EQ(*ParseSbatchParsable("124;cluster-a\n"), 124);
  EXPECT_FALSE(ParseSbatchParsable("Submitted batch job 5").ok());
  EXPECT_FALSE(ParseSbatchParsable("").ok());
  EXPECT_FALSE(ParseSbatchParsable("-4").ok());
}

TEST(SlurmCliArgv, ExportsVariableNamesNeverTheirValues) {
  SlurmCli slurm({});
  SlurmSubmission s;
  s.job_name = "run-a.g2";
  s.partition = "gpu";
  s.nodes = 2;
  s.ntasks_per_node = 8;
  s.time_limit = "1:00:00";
  s.env = {{"SPIKEGUARD_TOKEN", "sgw1:secret"}, {"PATH", "/usr/bin"}};
  s.extra_options = {"--exclusive"};
  s.script_path = "/x/job";
  const auto argv = slurm.SbatchArgv(s);
  const std::string shown = ArgvForDisplay(argv);
  EXPECT_EQ(shown,
            "sbatch --parsable --job-name=run-a.g2 --partition=gpu --nodes=2 --ntasks-per-node=8 "
            "--time=1:00:00 --export=PATH,SPIKEGUARD_TOKEN --exclusive /x/job");
  EXPECT_EQ(shown.find("secret"), std::string::npos);
  s.env.clear();
  EXPECT_NE(ArgvForDisplay(slurm.SbatchArgv(s)).find("--export=NIL"), std::string::npos);
}

class SlurmClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = SlurmCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    cluster_ = std::make_unique<SlurmCluster>(dir_);
    ASSERT_TRUE(cluster_->Start()) << cluster_->error();
    SlurmCli::Options o;
    o.env = cluster_->env();
    slurm_ = std::make_unique<SlurmCli>(o);
  }
  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = dir_.File(name);
    std::ofstream(path) << "#!/bin/sh\n" << body;
    chmod(path.c_str(), 0755);
    return path;
  }
  SlurmJob WaitEnded(int64_t id) {
    SlurmJob last;
    SlurmCluster::WaitFor([&] {
      auto j = slurm_->Query(id);
      if (j.ok()) last = *j;
      return j.ok() && SlurmJobEnded(j->state);
    }, absl::Seconds(60));
    return last;
  }

  TempDir dir_;
  std::unique_ptr<SlurmCluster> cluster_;
  std::unique_ptr<SlurmCli> slurm_;
};

TEST_F(SlurmClusterTest, SubmitsAJobWhoseTasksSeeTheirRankAndTheExportedEnvironment) {
  SlurmSubmission s;
  s.job_name = "sg-test";
  s.ntasks_per_node = 2;
  s.output_path = dir_.File("job-%j.out");
  s.env = {{"SG_TEST_TOKEN", "not-on-any-command-line"}};
  s.script_path = Script("ok.sh",
                         "srun /bin/sh -c 'echo rank=$SLURM_PROCID of=$SLURM_NTASKS "
                         "token=$SG_TEST_TOKEN'\n");
  auto id = slurm_->Submit(s);
  ASSERT_TRUE(id.ok()) << id.status();
  const SlurmJob job = WaitEnded(*id);
  EXPECT_EQ(job.state, SlurmJobState::kCompleted) << job.state_text << " " << job.reason;
  EXPECT_EQ(job.exit_code, 0);
  EXPECT_EQ(job.name, "sg-test");
  EXPECT_EQ(job.node_list, cluster_->host());
  const std::string out = spikeguard::testing::ReadFile(dir_.File(absl::StrCat("job-", *id, ".out")));
  EXPECT_NE(out.find("rank=0 of=2 token=not-on-any-command-line"), std::string::npos) << out;
  EXPECT_NE(out.find("rank=1 of=2 token=not-on-any-command-line"), std::string::npos) << out;
}

TEST_F(SlurmClusterTest, AFailedJobReportsItsExitCodeAndACancelledOneItsState) {
  SlurmSubmission fail;
  fail.script_path = Script("fail.sh", "exit 3\n");
  fail.output_path = dir_.File("fail-%j.out");
  auto failed = slurm_->Submit(fail);
  ASSERT_TRUE(failed.ok()) << failed.status();

  SlurmSubmission sleeper;
  sleeper.script_path = Script("sleep.sh", "srun /bin/sleep 300\n");
  sleeper.output_path = dir_.File("sleep-%j.out");
  auto running = slurm_->Submit(sleeper);
  ASSERT_TRUE(running.ok()) << running.status();

  const SlurmJob f = WaitEnded(*failed);
  EXPECT_EQ(f.state, SlurmJobState::kFailed) << f.state_text;
  EXPECT_EQ(f.exit_code, 3);
  EXPECT_EQ(f.reason, "NonZeroExitCode");

  ASSERT_TRUE(SlurmCluster::WaitFor([&] {
    auto j = slurm_->Query(*running);
    return j.ok() && j->state == SlurmJobState::kRunning;
  }, absl::Seconds(60)));
  ASSERT_TRUE(slurm_->Cancel(*running).ok());
  const SlurmJob c = WaitEnded(*running);
  EXPECT_EQ(c.state, SlurmJobState::kCancelled) << c.state_text;
}

TEST_F(SlurmClusterTest, UnknownJobsAreNotFoundAndRefusedSubmissionsSayWhy) {
  auto unknown = slurm_->Query(987654);
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  SlurmSubmission s;
  s.partition = "no-such-partition";
  s.script_path = Script("x.sh", "true\n");
  auto refused = slurm_->Submit(s);
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("partition"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace spikeguard::daemon
