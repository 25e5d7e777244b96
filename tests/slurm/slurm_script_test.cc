#include "daemon/launch/slurm_script.h"

#include <sys/stat.h>

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "daemon/launch/slurm_cli.h"
#include "gtest/gtest.h"
#include "tests/slurm/slurm_cluster.h"

namespace spikeguard::daemon {
namespace {

using spikeguard::testing::ReadFile;
using spikeguard::testing::SlurmCluster;
using spikeguard::testing::TempDir;

TEST(SlurmScript, AnyArgumentSurvivesTheRoundTripAsData) {
  SlurmScript s;
  s.exec_path = "/usr/local/bin/spikeguard-slurm-exec";
  s.srun_options = {"--kill-on-bad-exit=1", "--output=/tmp/x/task-%t.out"};
  s.master_port = 29517;
  // What a hostile parameter value could hold: newlines (a second "line"),
  // shell syntax, quotes, backslashes, non-ASCII and NUL bytes.
  s.argv = {"/opt/train/worker", "--rank={rank}", "a b\narg /bin/evil", "$(rm -rf /); `x` 'q' \"d\"",
            "back\\slash", "caf\xc3\xa9", std::string("nul\0byte", 8), ""};
  auto text = RenderSlurmScript(s);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->rfind("#!/usr/local/bin/spikeguard-slurm-exec\n", 0), 0u);
  EXPECT_EQ(text->find("\narg /bin/evil"), std::string::npos) << "a newline made a line: " << *text;
  auto back = ParseSlurmScript(*text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->exec_path, s.exec_path);
  EXPECT_EQ(back->srun, "/usr/bin/srun");
  EXPECT_EQ(back->srun_options, s.srun_options);
  EXPECT_EQ(back->master_port, 29517);
  EXPECT_EQ(back->argv, s.argv);
}

TEST(SlurmScript, RefusesRelativePathsAndLinesItDoesNotKnow) {
  SlurmScript s;
  s.exec_path = "/x/exec";
  s.argv = {"worker"};
  EXPECT_TRUE(absl::IsInvalidArgument(RenderSlurmScript(s).status()));
  s.argv = {"/x/worker"};
  s.exec_path = "exec";
  EXPECT_TRUE(absl::IsInvalidArgument(RenderSlurmScript(s).status()));

  auto shell = ParseSlurmScript("#!/x/exec\nsrun /usr/bin/srun\nrm -rf /\narg /x/w\n");
  ASSERT_FALSE(shell.ok());
  EXPECT_NE(shell.status().message().find("line 3"), std::string::npos) << shell.status();
  EXPECT_FALSE(ParseSlurmScript("srun /usr/bin/srun\narg /x/w\n").ok());  // no #!
  EXPECT_FALSE(ParseSlurmScript("#!/x/exec\narg /x/w\n").ok());           // no srun
  EXPECT_FALSE(ParseSlurmScript("#!/x/exec\nsrun /usr/bin/srun\n").ok());  // no argv
  EXPECT_FALSE(ParseSlurmScript("#!/x/exec\nsrun /usr/bin/srun\nmaster_port 70000\narg /x\n").ok());
  EXPECT_FALSE(ParseSlurmScript("#!/x/exec\nsrun /usr/bin/srun\narg /x\\q\n").ok());  // bad escape
}

TEST(SlurmScript, FirstHostOfSlurmHostLists) {
  EXPECT_EQ(*FirstSlurmHost("vm"), "vm");
  EXPECT_EQ(*FirstSlurmHost("node[07-09,12],gpu1"), "node07");
  EXPECT_EQ(*FirstSlurmHost("a[001-004]"), "a001");
  EXPECT_EQ(*FirstSlurmHost("gpu1,node[07-09]"), "gpu1");
  EXPECT_EQ(*FirstSlurmHost("rack[3]-n[1-2]"), "rack3-n[1-2]");
  EXPECT_FALSE(FirstSlurmHost("").ok());
  EXPECT_FALSE(FirstSlurmHost("node[01-").ok());
}

TEST(SlurmScript, TaskIdentityComesFromSlurmsEnvironment) {
  std::map<std::string, std::string> env = {{"SLURM_PROCID", "5"},
                                            {"SLURM_NTASKS", "8"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                            {"SLURM_JOB_NODELIST", "gpu[03-04]"}};
  auto get = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto t = SlurmTaskFromEnv(get);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rank, 5);
  EXPECT_EQ(t->world_size, 8);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->local_world_size, 4);
  EXPECT_EQ(t->master_addr, "gpu03");
  EXPECT_EQ(ExpandTaskArgv({"/w", "--rank={rank}", "--of={world_size}", "--gpu={local_rank}"}, *t),
            (std::vector<std::string>{"/w", "--rank=5", "--of=8", "--gpu=1"}));

  env["SLURM_PROCID"] = "8";
  EXPECT_NE(SlurmTaskFromEnv(get).status().message().find("not below SLURM_NTASKS"),
            std::string::npos);
  env.erase("SLURM_PROCID");
  EXPECT_NE(SlurmTaskFromEnv(get).status().message().find("SLURM_PROCID is not set"),
            std::string::npos);
}

// The whole path on a real Slurm: sbatch of a rendered script, the
// interpreter running srun, each task getting its identity, and arguments
// that a shell would have mangled arriving intact.
TEST(SlurmScriptCluster, TasksRunTheArgvWithTheirRankAndTorchDistributedsVariables) {
  if (std::string why = SlurmCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  SlurmCluster cluster(dir);
  ASSERT_TRUE(cluster.Start()) << cluster.error();
  SlurmCli::Options o;
  o.env = cluster.env();
  SlurmCli slurm(o);

  SlurmScript s;
  s.exec_path = SLURM_EXEC;
  s.srun_options = {"--kill-on-bad-exit=1", "--output=" + dir.File("task-%t.out")};
  s.master_port = 29517;
  s.argv = {"/usr/bin/env", "ARG=r{rank} of {world_size} l{local_rank} $(x) 'q'", "/usr/bin/printenv",
            "ARG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "SG_TEST_TOKEN"};
  auto text = RenderSlurmScript(s);
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string script = dir.File("gen1.sbatch");
  std::ofstream(script) << *text;
  chmod(script.c_str(), 0700);

  SlurmSubmission sub;
  sub.job_name = "run.g1";
  sub.ntasks_per_node = 2;
  sub.output_path = dir.File("batch-%j.out");
  sub.env = {{"SG_TEST_TOKEN", "tok"}};
  sub.script_path = script;
  auto id = slurm.Submit(sub);
  ASSERT_TRUE(id.ok()) << id.status();
  SlurmJob job;
  ASSERT_TRUE(SlurmCluster::WaitFor([&] {
    auto j = slurm.Query(*id);
    if (j.ok()) job = *j;
    return j.ok() && SlurmJobEnded(j->state);
  }, absl::Seconds(60)));
  EXPECT_EQ(job.state, SlurmJobState::kCompleted)
      << job.state_text << " " << job.reason << " "
      << ReadFile(dir.File(absl::StrCat("batch-", *id, ".out")));
  for (int rank = 0; rank < 2; ++rank) {
    const std::string out = ReadFile(dir.File(absl::StrCat("task-", rank, ".out")));
    EXPECT_EQ(out, absl::StrCat("r", rank, " of 2 l", rank, " $(x) 'q'\n", rank, "\n2\n", rank,
                                "\n2\n", cluster.host(), "\n29517\ntok\n"))
        << "task " << rank;
  }
}

}  // namespace
}  // namespace spikeguard::daemon
