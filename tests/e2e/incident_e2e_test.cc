// The whole loop end to end: a real spikeguardd launches real reference
// workers (local launcher), detects their spikes, runs the probes through
// in-place rewinds, and reaches the verdict — on a real SQLite catalog.
#include <regex>

#include "tests/e2e/incident_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(IncidentE2E, DataPoisonIsDiagnosedAsDataWithItsDocuments) {
  const auto poison_docs = MakeCorpus({"highbytes@300"});
  ASSERT_FALSE(poison_docs.empty());
  Launch("data", "data", {"--steps", "600"});
  auto list = WaitIncidents("data", [](const auto& l) {
    return l.incidents_size() > 0 && Closed(l.incidents(0));
  }, absl::Minutes(6));
  ASSERT_GE(list.incidents_size(), 1);
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  EXPECT_EQ(i.onset_step(), 300);
  std::set<std::string> named;
  for (const auto& d : i.documents()) named.insert(absl::StrCat(d.domain(), ":", d.document_id()));
  // Exactly the poison's documents: bisect isolated the culprit batch.
  EXPECT_EQ(named, std::set<std::string>(poison_docs.begin(), poison_docs.end()));
  ASSERT_GE(i.probes_size(), 2);
  EXPECT_EQ(i.probes(0).kind(), "replay");
  EXPECT_EQ(i.probes(1).kind(), "skip");

  v1::ListQuarantineResponse q;
  ASSERT_TRUE(cluster_.SpikectlJson({"quarantine", "list", "--run", "data"}, "q", &q));
  std::set<std::string> quarantined;
  for (const auto& e : q.entries()) quarantined.insert(absl::StrCat(e.domain(), ":", e.document_id()));
  EXPECT_EQ(quarantined, std::set<std::string>(poison_docs.begin(), poison_docs.end()));

  RunResult table = cluster_.Spikectl({"incidents", "show", absl::StrCat(i.id())}, "table");
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("DATA"));
  EXPECT_THAT(table.out, HasSubstr("replay"));
  EXPECT_THAT(table.out, HasSubstr("skip"));
  PrintFigures("data", i);
}

TEST_F(IncidentE2E, TransientBitflipIsDiagnosedAsTransient) {
  MakeCorpus({});
  Launch("transient", "transient", {"--steps", "450", "--fault", "bitflip:step=250"});
  auto list = WaitIncidents("transient", [](const auto& l) {
    return l.incidents_size() > 0 && Closed(l.incidents(0));
  }, absl::Minutes(6));
  ASSERT_GE(list.incidents_size(), 1);
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::TRANSIENT) << i.ShortDebugString();
  EXPECT_EQ(i.onset_step(), 250);
  PrintFigures("transient", i);
}

TEST_F(IncidentE2E, Fp16OverflowIsDiagnosedAsNumerics) {
  MakeCorpus({});
  Launch("numerics", "numerics", {});
  auto list = WaitIncidents("numerics", [](const auto& l) {
    return l.incidents_size() > 0 && l.incidents(0).verdict() != v1::VERDICT_UNSPECIFIED;
  }, absl::Minutes(6));
  ASSERT_GE(list.incidents_size(), 1);
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::NUMERICS) << i.ShortDebugString();
  // The overflow follows an instability the detectors may catch first; either
  // way a probe ran into the non-finite values.
  bool probe_nonfinite = false;
  for (const auto& p : i.probes()) probe_nonfinite |= p.outcome() == "nonfinite";
  EXPECT_TRUE(i.trigger() == "nonfinite" || probe_nonfinite) << i.ShortDebugString();
  PrintFigures("numerics", i);
}

TEST_F(IncidentE2E, FragilityIsFixedByLowerLrAndTheRunFinishesClean) {
  MakeCorpus({});
  Launch("fragile", "fragility", {"--steps", "1500"});
  // Seven probes (replay, skip, four bisections, the fix): ~7 min alone,
  // 14+ min beside the rest of the suite on 2 cores.
  auto list = WaitIncidents("fragile", [](const auto& l) {
    return l.incidents_size() > 0 && Closed(l.incidents(0));
  }, absl::Minutes(22));
  ASSERT_GE(list.incidents_size(), 1);
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::FRAGILITY) << i.ShortDebugString();
  ASSERT_GE(i.probes_size(), 3);
  EXPECT_EQ(i.probes(0).kind(), "replay");
  EXPECT_EQ(i.probes(0).outcome(), "spiked");
  EXPECT_EQ(i.probes(1).kind(), "skip");
  // Either the spike comes back with the window skipped, or (the detector,
  // with its blip rule, opens at the first corroborated excursion of the instability,
  // which the skip removes) no batch of the window reproduces it on its own:
  // every bisection probe is clean, so the data is not the trigger.
  if (i.probes(1).outcome() != "spiked") {
    EXPECT_EQ(i.probes(1).outcome(), "clean");
    int bisects = 0;
    for (const auto& p : i.probes()) {
      if (p.kind() != "bisect") continue;
      ++bisects;
      EXPECT_EQ(p.outcome(), "clean") << p.ShortDebugString();
    }
    EXPECT_GE(bisects, 1);
  }
  const v1::Probe& fix = i.probes(i.probes_size() - 1);
  EXPECT_EQ(fix.kind(), "fix");
  EXPECT_EQ(fix.outcome(), "clean");
  // Rung 1 of the ladder: peak lr x 0.7 from the probe checkpoint, verified.
  // A rung of the ladder (lr × 0.7 first) from the probe checkpoint, verified.
  bool rung_verified = false;
  for (const auto& e : i.events()) {
    rung_verified |= e.detail().find("fix rung") != std::string::npos &&
                     e.detail().find("0.7") != std::string::npos &&
                     e.detail().find("verified") != std::string::npos;
  }
  EXPECT_TRUE(rung_verified) << i.ShortDebugString();
  EXPECT_THAT(i.fix(), HasSubstr("fix rung"));
  // The precursor dates the abnormal growth, not the warm-up rise.
  if (!i.precursor().empty()) {
    EXPECT_GT(i.precursor_onset_step(), 100);
  }
  // The run then trains to its end in the fixed generation without a spike.
  v1::Run run;
  for (int k = 0; k < 600; ++k) {
    run.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"runs", "show", "fragile"}, "run", &run));
    if (run.last_step() >= 1499) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_GE(run.last_step(), 1499);
  v1::ListIncidentsResponse after;
  ASSERT_TRUE(cluster_.SpikectlJson({"incidents", "list", "--run", "fragile"}, "after", &after));
  EXPECT_EQ(after.incidents_size(), 1) << after.ShortDebugString();
  PrintFigures("fragility", i);

  // A replay of the fixed generation keeps the fix in force: its losses are
  // the fixed generation's, bit for bit.
  const int64_t fixed = run.current_generation();
  RunResult replay = cluster_.Spikectl(
      {"replay", "--run", "fragile", "--from-step", "1400", "--stop-after", "1420"}, "replay");
  ASSERT_EQ(replay.code, 0) << replay.err;
  v1::QueryTelemetryResponse mine, theirs;
  for (int k = 0; k < 300; ++k) {
    mine.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"telemetry", "--run", "fragile", "--gen",
                                       absl::StrCat(fixed + 1), "--from", "1400", "--to", "1420"},
                                      "replayed", &mine));
    if (mine.records_size() >= 21) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(mine.records_size(), 21);
  ASSERT_TRUE(cluster_.SpikectlJson({"telemetry", "--run", "fragile", "--gen", absl::StrCat(fixed),
                                     "--from", "1400", "--to", "1420"},
                                    "fixed", &theirs));
  ASSERT_EQ(theirs.records_size(), 21);
  for (int k = 0; k < 21; ++k) {
    EXPECT_EQ(mine.records(k).loss_hash(), theirs.records(k).loss_hash()) << "step " << 1400 + k;
    EXPECT_DOUBLE_EQ(mine.records(k).lr(), theirs.records(k).lr()) << "step " << 1400 + k;
  }
}

TEST_F(IncidentE2E, LauncherRestartsACrashedWorkerFromItsNewestCheckpoint) {
  MakeCorpus({});
  {
    std::ofstream f(dir_.File("daemon-policy.textproto"));
    f << "mode: MODE_OBSERVE\nlaunch { heartbeat_timeout_ms: 20000 max_restarts: 2 }\n";
  }
  daemon_args_ = {"--policy", dir_.File("daemon-policy.textproto")};
  Launch("relaunch", "small", {"--steps", "600", "--linger-s", "0"});
  v1::Run run;
  for (int k = 0; k < 600 && run.last_step() < 250; ++k) {
    run.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"runs", "show", "relaunch"}, "run", &run));
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_GE(run.last_step(), 250);
  auto pids = PidsMentioning({dir_.path(), " train "});
  ASSERT_EQ(pids.size(), 1u);
  kill(pids[0], SIGKILL);
  for (int k = 0; k < 900; ++k) {
    run.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"runs", "show", "relaunch"}, "run", &run));
    if (run.state() == v1::RUN_FINISHED || run.state() == v1::RUN_FAILED) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(run.state(), v1::RUN_FINISHED) << WorkerLog("relaunch").substr(0, 3000);
  EXPECT_GE(run.last_step(), 599);
  // The second process resumed from a checkpoint, not from step 0.
  EXPECT_THAT(WorkerLog("relaunch"), HasSubstr("loaded checkpoint"));
  EXPECT_THAT(ReadFile(dir_.File("daemon-first.err")), HasSubstr("rank 0 restarted"));
  // Every step is stored once, re-executed steps deduplicated.
  v1::QueryTelemetryResponse telemetry;
  ASSERT_TRUE(cluster_.SpikectlJson({"telemetry", "--run", "relaunch", "--limit", "1000"}, "t",
                                    &telemetry));
  ASSERT_EQ(telemetry.records_size(), 600);
  for (const auto& r : telemetry.records()) ASSERT_EQ(r.ranks_reported(), 1u) << r.step();
}

TEST_F(IncidentE2E, CleanRunHasNoIncident) {
  MakeCorpus({});
  Launch("clean", "clean", {"--linger-s", "0"});
  // Wait for the run to finish.
  v1::Run run;
  for (int i = 0; i < 600; ++i) {
    run.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"runs", "show", "clean"}, "show", &run));
    if (run.state() == v1::RUN_FINISHED || run.state() == v1::RUN_FAILED) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  ASSERT_EQ(run.state(), v1::RUN_FINISHED) << WorkerLog("clean").substr(0, 3000);
  EXPECT_GE(run.last_step(), 1999);
  v1::ListIncidentsResponse list;
  ASSERT_TRUE(cluster_.SpikectlJson({"incidents", "list", "--run", "clean"}, "list", &list));
  EXPECT_EQ(list.incidents_size(), 0) << list.ShortDebugString();
}

// Three bad batches within the escalation window (3 DATA incidents in 5,000
// steps): the third's own evidence (a clean skip, bisect naming its culprit
// batch) keeps it DATA, and the run reaches its end with every culprit
// document, not a fragility ladder that spikes and pauses the run.
TEST_F(IncidentE2E, RepeatedDataIncidentsWithNamedCulpritsStayDataToTheRunsEnd) {
  MakeCorpus({"highbytes@300", "junk@600", "highbytes@900"});
  std::vector<std::string> poison;
  for (int64_t at : {300, 600, 900}) {
    const std::vector<std::string> docs = PoisonAt(at);
    ASSERT_FALSE(docs.empty()) << at;
    poison.insert(poison.end(), docs.begin(), docs.end());
  }
  Launch("escalate", "data", {"--steps", "1300"});
  auto list = WaitIncidents("escalate", [](const auto& l) {
    int closed = 0;
    for (const auto& i : l.incidents()) closed += Closed(i);
    return closed >= 3;
  }, absl::Minutes(10));
  ASSERT_EQ(list.incidents_size(), 3) << list.ShortDebugString();
  std::vector<std::string> named;
  bool kept_by_evidence = false;
  for (const auto& brief : list.incidents()) {
    const v1::Incident i = Show(brief.id());
    EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
    for (const auto& d : i.documents()) {
      named.push_back(absl::StrCat(d.domain(), ":", d.document_id()));
    }
    kept_by_evidence |= i.note().find("not escalated to FRAGILITY") != std::string::npos;
  }
  EXPECT_TRUE(kept_by_evidence);
  EXPECT_THAT(named, ::testing::UnorderedElementsAreArray(poison));
  v1::Run run;
  for (int k = 0; k < 600; ++k) {
    run.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"runs", "show", "escalate"}, "run", &run));
    if (run.last_step() >= 1299) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_GE(run.last_step(), 1299);
  EXPECT_NE(run.state(), v1::RUN_PAUSED);
}

TEST_F(IncidentE2E, KillNineDuringReplayResumesFromTheEventLog) {
  MakeCorpus({"highbytes@300"});
  Launch("crash", "data", {"--steps", "600"});
  WaitIncidents("crash", [](const auto& l) {
    return l.incidents_size() > 0 && l.incidents(0).state() == v1::REPLAYING;
  }, absl::Minutes(4));
  // A manual rewind while the probe runs is refused with the reason.
  RunResult manual = cluster_.Spikectl({"rewind", "--run", "crash", "--to-step", "100"}, "manual");
  EXPECT_EQ(manual.code, 1);
  EXPECT_THAT(manual.err, HasSubstr("probe"));
  daemon_->Kill(SIGKILL);
  absl::SleepFor(absl::Milliseconds(300));
  daemon_ = cluster_.StartDaemon("second", DaemonArgs());
  auto list = WaitIncidents("crash", [](const auto& l) {
    return l.incidents_size() > 0 && Closed(l.incidents(0));
  }, absl::Minutes(6));
  ASSERT_GE(list.incidents_size(), 1);
  EXPECT_EQ(list.incidents_size(), 1);
  EXPECT_EQ(list.incidents(0).verdict(), v1::DATA);
  // No command was executed twice by the worker.
  std::map<std::string, int> executed;
  std::regex re("executing command (\\S+) ");
  const std::string log = WorkerLog("crash");
  for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) {
    ++executed[(*it)[1]];
  }
  EXPECT_FALSE(executed.empty());
  for (const auto& [id, n] : executed) EXPECT_EQ(n, 1) << "command " << id << " executed " << n << " times";
}

}  // namespace
}  // namespace spikeguard::testing
