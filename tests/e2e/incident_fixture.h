// incident_fixture.h
// -----------------------------------------------------------------------------
// The fixture of the end-to-end incident tests: a temporary directory, a real
// spikeguardd on its embedded SQLite catalog, a synthetic corpus with placed
// poisons, and a run whose reference workers the daemon launches itself
// (local launcher) from a launch profile the fixture writes into its temp
// dir (spikeguardd --launch-profiles), all driven through spikectl as an
// operator would.
//
//   class MyE2E : public IncidentE2E {};
//   TEST_F(MyE2E, X) {
//     auto docs = MakeCorpus({"highbytes@300"});
//     Launch("run", "data", {"--steps", "600"});
//     auto list = WaitIncidents("run", AllClosed, absl::Minutes(6));
//   }
#pragma once

#include <dirent.h>
#include <signal.h>

#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "tests/e2e/cluster.h"
#include "tests/e2e/launch_profile.h"
#include "tests/e2e/probe_policy.h"

namespace spikeguard::testing {

namespace v1 = spikeguard::v1;

inline constexpr const char* kPolicy = kE2EProbePolicy;

class IncidentE2E : public ::testing::Test {
 protected:
  void TearDown() override {
    if (daemon_) {
      daemon_->Kill(SIGTERM);
      daemon_->Wait(std::chrono::seconds(30));
    }
    KillProcessesMentioning(dir_.path());
  }

  // Synthesizes the corpus; returns the poison documents it placed.
  std::vector<std::string> MakeCorpus(const std::vector<std::string>& poisons, int seed = 7,
                                      const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {WORKER, "corpus", "synth", "--out", dir_.File("corpus"),
                                     "--seed", std::to_string(seed)};
    for (const auto& p : poisons) {
      argv.push_back("--poison");
      argv.push_back(p);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    RunResult r = RunCommand(argv, dir_.File("synth"));
    EXPECT_EQ(r.code, 0) << r.err;
    synth_out_ = r.out;
    std::vector<std::string> docs;
    for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
      if (line.substr(0, 7) != "poison ") continue;
      std::vector<std::string> parts = absl::StrSplit(line.substr(line.find(':') + 1), ' ',
                                                      absl::SkipEmpty());
      docs.insert(docs.end(), parts.begin(), parts.end());
    }
    return docs;
  }

  // The reference worker's launch profile (tests/e2e/launch_profile.h), in
  // the temp dir.
  std::string WriteProfiles() {
    const std::string path = dir_.File("profiles.textproto");
    WriteRefWorkerProfile(path, dir_.path(), WORKER, SCENARIO_DIR);
    return path;
  }

  // The daemon's arguments: the test's own plus the launch profiles.
  std::vector<std::string> DaemonArgs() {
    std::vector<std::string> args = daemon_args_;
    args.push_back("--launch-profiles=" + WriteProfiles());
    return args;
  }

  // A RunSpec naming the profile, the scenario and the worker options.
  void WriteSpec(const std::string& path, const std::string& scenario,
                 const std::vector<std::string>& extra_args, const std::string& manifest = "") {
    WriteRefWorkerSpec(path, scenario, extra_args, dir_.File("corpus"), manifest);
  }

  // Starts the daemon, sets the policy and launches the run.
  void Launch(const std::string& run, const std::string& scenario,
              const std::vector<std::string>& extra_args, const std::string& policy = kPolicy) {
    daemon_ = cluster_.StartDaemon("first", DaemonArgs());
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

  // Polls until `done` holds for the run's incidents, or the timeout.
  v1::ListIncidentsResponse WaitIncidents(
      const std::string& run, const std::function<bool(const v1::ListIncidentsResponse&)>& done,
      absl::Duration timeout) {
    v1::ListIncidentsResponse list;
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      list.Clear();
      if (cluster_.SpikectlJson({"incidents", "list", "--run", run}, "list", &list) && done(list)) {
        return list;
      }
      absl::SleepFor(absl::Milliseconds(500));
    }
    ADD_FAILURE() << "timed out waiting for incidents of run " << run << "; last: "
                  << list.ShortDebugString().substr(0, 2000) << "\nworker log:\n"
                  << ReadFile(cluster_.data_dir() + "/runs/" + run + "/rank-0.log").substr(0, 4000);
    return list;
  }

  static bool Closed(const v1::Incident& i) { return i.state() == v1::CLOSED; }

  v1::Incident Show(int64_t id) {
    v1::Incident incident;
    EXPECT_TRUE(cluster_.SpikectlJson({"incidents", "show", absl::StrCat(id)}, "show", &incident))
        << cluster_.last_error();
    return incident;
  }

  std::string WorkerLog(const std::string& run) {
    return ReadFile(cluster_.data_dir() + "/runs/" + run + "/rank-0.log");
  }

  void PrintFigures(const std::string& scenario, const v1::Incident& i) {
    std::cout << "[figures] " << scenario << ": verdict " << v1::Verdict_Name(i.verdict())
              << ", onset " << i.onset_step() << ", probes " << i.cost().probes()
              << ", steps re-executed " << i.cost().steps_reexecuted() << ", wall "
              << i.cost().wall_time_s() << " s\n";
  }

  // The documents of the poison placed at `position` (synth output).
  std::vector<std::string> PoisonAt(int64_t position) const { return Placed("poison", position); }
  // The near-copies the synthesizer placed for the poison at `position`
  // (--poison-echoes).
  std::vector<std::string> EchoesOf(int64_t position) const { return Placed("echo", position); }

  // The documents of synth output lines "WHAT KIND at position P: domain:id ...".
  std::vector<std::string> Placed(const std::string& what, int64_t position) const {
    std::vector<std::string> docs;
    for (absl::string_view line : absl::StrSplit(synth_out_, '\n')) {
      if (!absl::StartsWith(line, what + " ")) continue;
      std::vector<std::string> head = absl::StrSplit(line.substr(0, line.find(':')), ' ');
      if (head.empty() || head.back() != std::to_string(position)) continue;
      std::vector<std::string> parts = absl::StrSplit(line.substr(line.find(':') + 1), ' ',
                                                      absl::SkipEmpty());
      docs.insert(docs.end(), parts.begin(), parts.end());
    }
    return docs;
  }

  static bool AllClosed(const v1::ListIncidentsResponse& l) {
    if (l.incidents_size() == 0) return false;
    for (const auto& i : l.incidents()) {
      if (i.state() != v1::CLOSED && i.state() != v1::ABORTED) return false;
    }
    return true;
  }

  std::string synth_out_;
  TempDir dir_;
  Cluster cluster_{dir_};
  std::unique_ptr<Process> daemon_;
  std::vector<std::string> daemon_args_;
};

}  // namespace spikeguard::testing
