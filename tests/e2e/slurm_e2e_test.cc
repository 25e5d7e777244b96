// The incident loop end to end under a real single-node Slurm
// (tests/slurm/slurm_cluster.h): spikeguardd launches the reference worker
// as a Slurm job (sbatch -> spikeguard-slurm-exec -> srun -> worker) from a
// launch profile with a slurm block, and
//   - a data poison is diagnosed DATA with the poison's documents named,
//     through a kill -9 of the daemon in the middle of the incident: the
//     restarted daemon adopts the job (no second job) and the incident
//     reaches its verdict;
//   - a scancel of the job mid-run restarts it from its newest checkpoint.
// Prints the time from scancel to the restarted job's first report and the
// time to verdict.
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>

#include <fstream>
#include <regex>

#include "absl/strings/ascii.h"
#include "tests/e2e/incident_fixture.h"
#include "tests/slurm/slurm_cluster.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;

// Every regular file under `root` whose bytes contain `needle`.
std::vector<std::string> FilesUnder(const std::string& root, const std::string& needle) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::end(it); it.increment(ec)) {
    if (it->is_regular_file(ec) && ReadFile(it->path().string()).find(needle) != std::string::npos) {
      found.push_back(it->path().string());
    }
  }
  return found;
}

class SlurmE2E : public IncidentE2E {
 protected:
  void SetUp() override {
    if (std::string why = SlurmCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    slurm_ = std::make_unique<SlurmCluster>(dir_);
    ASSERT_TRUE(slurm_->Start()) << slurm_->error();
    // The daemon (a child of this test) runs sbatch/scontrol/scancel with it.
    setenv("SLURM_CONF", slurm_->conf().c_str(), 1);
  }
  void TearDown() override {
    if (slurm_) slurm_->Stop();  // the jobs first, so no worker outlives the test
    IncidentE2E::TearDown();
    unsetenv("SLURM_CONF");
  }

  // The reference worker's profile with a slurm block: one node, one task.
  std::vector<std::string> SlurmDaemonArgs() {
    std::vector<std::string> args = daemon_args_;
    const std::string path = WriteProfiles();
    std::string text = ReadFile(path);
    const size_t end = text.rfind('}');
    text.insert(end, absl::StrCat("  slurm { partition: \"debug\" nodes: 1 tasks_per_node: 1 "
                                  "time_limit: \"30:00\" exec_path: \"", SLURM_EXEC, "\" }\n"));
    std::ofstream(path) << text;
    args.push_back("--launch-profiles=" + path);
    return args;
  }

  void LaunchUnderSlurm(const std::string& run, const std::string& scenario,
                        const std::vector<std::string>& extra_args, const std::string& policy) {
    daemon_ = cluster_.StartDaemon("first", SlurmDaemonArgs());
    {
      std::ofstream f(dir_.File("policy.textproto"));
      f << policy;
    }
    RunResult set = cluster_.Spikectl({"policy", "set", "--file", dir_.File("policy.textproto")},
                                      "policy");
    ASSERT_EQ(set.code, 0) << set.err;
    WriteSpec(dir_.File("spec.textproto"), scenario, extra_args);
    RunResult created = cluster_.Spikectl({"runs", "create", run, "--world-size=1", "--mode=auto",
                                           "--spec=" + dir_.File("spec.textproto")},
                                          "create");
    ASSERT_EQ(created.code, 0) << created.err;
  }

  // Every job Slurm knows (running or ended within MinJobAge): "ID STATE".
  std::vector<std::string> Jobs() {
    std::vector<std::string> out;
    auto r = slurm_->Run({"/usr/bin/scontrol", "show", "job", "-o"});
    if (!r.ok()) return out;
    std::regex re("JobId=(\\d+) .*JobState=(\\S+)");
    for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
      std::smatch m;
      std::string l(line);
      if (std::regex_search(l, m, re)) out.push_back(m[1].str() + " " + m[2].str());
    }
    return out;
  }

  // The id of the job in state RUNNING ("" when none).
  std::string RunningJob() {
    for (const std::string& j : Jobs()) {
      if (absl::EndsWith(j, " RUNNING")) return j.substr(0, j.find(' '));
    }
    return "";
  }

  std::string JobOutput(const std::string& run, const std::string& job) {
    return ReadFile(absl::StrCat(cluster_.data_dir(), "/runs/", run, "/slurm-", job, ".out"));
  }

  int64_t ReportsSeen() {
    v1::ServerStatus status;
    if (!cluster_.SpikectlJson({"status"}, "status", &status)) return -1;
    return status.reports_accepted() + status.reports_duplicate();
  }

  std::unique_ptr<SlurmCluster> slurm_;
};

TEST_F(SlurmE2E, DataPoisonUnderSlurmIsDiagnosedThroughAKillNineOfTheDaemon) {
  const auto poison_docs = MakeCorpus({"highbytes@300"});
  ASSERT_FALSE(poison_docs.empty());
  const absl::Time launched = absl::Now();
  LaunchUnderSlurm("data", "data", {"--steps", "600"}, kPolicy);
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return !RunningJob().empty(); }, absl::Seconds(60)))
      << absl::StrJoin(Jobs(), "; ") << ReadFile(dir_.File("daemon-first.err"));
  const std::string job = RunningJob();
  // Mid-incident: the daemon is killed while its first probe runs.
  WaitIncidents("data", [](const auto& l) {
    return l.incidents_size() > 0 && l.incidents(0).state() == v1::REPLAYING;
  }, absl::Minutes(4));
  daemon_->Kill(SIGKILL);
  daemon_->Wait(std::chrono::seconds(10));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(RunningJob(), job) << "the job outlives the daemon";
  daemon_ = cluster_.StartDaemon("second", SlurmDaemonArgs());
  auto list = WaitIncidents("data", [](const auto& l) {
    return l.incidents_size() > 0 && Closed(l.incidents(0));
  }, absl::Minutes(6));
  const absl::Duration to_verdict = absl::Now() - launched;
  ASSERT_GE(list.incidents_size(), 1) << JobOutput("data", job).substr(0, 4000);
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  EXPECT_EQ(i.onset_step(), 300);
  std::set<std::string> named;
  for (const auto& d : i.documents()) named.insert(absl::StrCat(d.domain(), ":", d.document_id()));
  EXPECT_EQ(named, std::set<std::string>(poison_docs.begin(), poison_docs.end()));
  // Adopted, not submitted again: one job in all, the one from the start.
  EXPECT_THAT(ReadFile(dir_.File("daemon-second.err")), HasSubstr("adopted Slurm job " + job));
  EXPECT_EQ(Jobs().size(), 1u) << absl::StrJoin(Jobs(), "; ");
  // The worker ran as a Slurm task with the daemon's placeholders.
  EXPECT_THAT(JobOutput("data", job), HasSubstr("training"));
  std::printf("[measure] time to verdict under Slurm (launch -> incident closed, through a "
              "daemon kill -9): %.1f s; incident wall %.1f s, probes %d\n",
              absl::ToDoubleSeconds(to_verdict), i.cost().wall_time_s(), i.cost().probes());
}

TEST_F(SlurmE2E, ScancelMidRunRestartsTheJobFromItsNewestCheckpoint) {
  MakeCorpus({});
  {
    std::ofstream f(dir_.File("daemon-policy.textproto"));
    f << "mode: MODE_OBSERVE\nlaunch { heartbeat_timeout_ms: 20000 max_restarts: 2 }\n";
  }
  daemon_args_ = {"--policy", dir_.File("daemon-policy.textproto")};
  LaunchUnderSlurm("relaunch", "small", {"--steps", "600", "--linger-s", "0"},
                   "mode: MODE_OBSERVE\nlaunch { heartbeat_timeout_ms: 20000 max_restarts: 2 }\n");
  v1::Run run;
  for (int k = 0; k < 900 && run.last_step() < 250; ++k) {
    run.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"runs", "show", "relaunch"}, "run", &run));
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_GE(run.last_step(), 250);
  const std::string first = RunningJob();
  ASSERT_FALSE(first.empty());
  // The worker authenticated (its reports were accepted) with the token from
  // its 0600 file; the token is nowhere in Slurm's job record or state.
  const std::string token_file = absl::StrCat(cluster_.data_dir(), "/runs/relaunch/worker.token");
  struct stat st {};
  ASSERT_EQ(stat(token_file.c_str(), &st), 0) << token_file;
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  const std::string token(absl::StripAsciiWhitespace(ReadFile(token_file)));
  ASSERT_GE(token.size(), 16u);
  EXPECT_THAT(FilesUnder(slurm_->root(), "SPIKEGUARD_TOKEN_FILE=" + token_file),
              ::testing::Not(::testing::IsEmpty()))
      << "Slurm's state keeps the job's environment";
  EXPECT_THAT(FilesUnder(slurm_->root(), token), ::testing::IsEmpty());
  EXPECT_THAT(slurm_->Run({"/usr/bin/scontrol", "show", "job", "-dd", first})->out,
              ::testing::Not(HasSubstr(token)));
  const absl::Time cancelled = absl::Now();
  ASSERT_EQ(slurm_->Run({"/usr/bin/scancel", first})->exit_code, 0);
  // Once the first job has ended, any report comes from the next one.
  ASSERT_TRUE(SlurmCluster::WaitFor([&] {
    for (const std::string& j : Jobs()) {
      if (j.rfind(first + " ", 0) == 0) return j != first + " RUNNING" && j != first + " COMPLETING";
    }
    return false;
  }, absl::Seconds(60)));
  const int64_t before = ReportsSeen();
  // On failure, what the cluster and the daemon were doing (the job may
  // pend, the node drain, or the launcher not resubmit).
  ASSERT_TRUE(SlurmCluster::WaitFor([&] { return ReportsSeen() > before; }, absl::Seconds(120)))
      << [&] {
           auto node = slurm_->Run({"/usr/bin/scontrol", "show", "node", "-o"});
           const std::string log = ReadFile(dir_.File("daemon-first.err"));
           return absl::StrCat("jobs: ", absl::StrJoin(Jobs(), "; "),
                               "\nnode: ", node.ok() ? node->out : node.status().ToString(),
                               "\njob output: ", JobOutput("relaunch", RunningJob()).substr(0, 2000),
                               "\ndaemon log (tail): ",
                               log.substr(log.size() > 6000 ? log.size() - 6000 : 0));
         }();
  const absl::Duration to_first_report = absl::Now() - cancelled;
  const std::string second = RunningJob();
  EXPECT_NE(second, first);
  for (int k = 0; k < 1500; ++k) {
    run.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"runs", "show", "relaunch"}, "run", &run));
    if (run.state() == v1::RUN_FINISHED || run.state() == v1::RUN_FAILED) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(run.state(), v1::RUN_FINISHED) << JobOutput("relaunch", second).substr(0, 3000);
  EXPECT_GE(run.last_step(), 599);
  // The second job resumed from a checkpoint, not from step 0.
  EXPECT_THAT(JobOutput("relaunch", second), HasSubstr("loaded checkpoint"));
  EXPECT_THAT(ReadFile(dir_.File("daemon-first.err")),
              HasSubstr(absl::StrCat("Slurm job ", first, " ended CANCELLED")));
  // Every step stored once, re-executed steps deduplicated.
  v1::QueryTelemetryResponse telemetry;
  ASSERT_TRUE(cluster_.SpikectlJson({"telemetry", "--run", "relaunch", "--limit", "1000"}, "t",
                                    &telemetry));
  EXPECT_EQ(telemetry.records_size(), 600);
  EXPECT_FALSE(std::filesystem::exists(token_file)) << "removed when the run finished";
  std::printf("[measure] scancel -> restarted job's first report: %.2f s\n",
              absl::ToDoubleSeconds(to_first_report));
}

}  // namespace
}  // namespace spikeguard::testing
