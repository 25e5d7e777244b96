// The diagnosis off the tuned path, end to end: one scenario per defect class
// that a first week of real use meets (spikes near the end of the schedule,
// non-finite probes, lost checkpoints, several poisons, a culprit at the
// checkpoint's own step, another data order, a fix in force), each through a
// real spikeguardd, launched reference workers, spikectl and SQLite, with its
// own corpus seed, positions and poison kinds. Each ends with the right
// verdict, the exact culprit documents where data triggers the spike, no
// incident opened by a probe, and no wait longer than the probes' own steps.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "base/status_macros.h"
#include "daemon/incident/plan_proto.h"
#include "storage/corpus/corpus.h"
#include "storage/corpus/corpus_tools.h"
#include "storage/corpus/data_order.h"
#include "tests/e2e/incident_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

class DiagnosisScenario : public IncidentE2E {
 protected:
  std::unique_ptr<storage::Corpus> corpus_;

  // Waits until every incident of the run is closed and then a little
  // longer, so that an incident a probe would (wrongly) open shows up.
  v1::ListIncidentsResponse Settle(const std::string& run, absl::Duration timeout) {
    WaitIncidents(run, AllClosed, timeout);
    absl::SleepFor(absl::Seconds(5));
    v1::ListIncidentsResponse list;
    EXPECT_TRUE(cluster_.SpikectlJson({"incidents", "list", "--run", run}, "settled", &list));
    return list;
  }

  static std::vector<std::string> Named(const v1::Incident& i) {
    std::vector<std::string> out;
    for (const auto& d : i.documents()) out.push_back(absl::StrCat(d.domain(), ":", d.document_id()));
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  std::vector<std::string> Quarantined(const std::string& run) {
    v1::ListQuarantineResponse q;
    EXPECT_TRUE(cluster_.SpikectlJson({"quarantine", "list", "--run", run}, "q", &q));
    std::vector<std::string> out;
    for (const auto& e : q.entries()) out.push_back(absl::StrCat(e.domain(), ":", e.document_id()));
    std::sort(out.begin(), out.end());
    return out;
  }

  // No probe or verification waited for steps that never came.
  static void ExpectNoTimeout(const v1::Incident& i) {
    for (const auto& e : i.events()) {
      EXPECT_THAT(e.detail(), ::testing::Not(HasSubstr("timeout"))) << e.kind();
    }
  }

  static std::string EventLines(const v1::Incident& i) {
    std::string out;
    for (const auto& e : i.events()) absl::StrAppend(&out, e.kind(), ": ", e.detail(), "\n");
    return out;
  }

  v1::Run ShowRun(const std::string& run) {
    v1::Run r;
    EXPECT_TRUE(cluster_.SpikectlJson({"runs", "show", run}, "run", &r));
    return r;
  }

  // The synthesized corpus's data order: its default manifest, with another
  // data seed when given. The corpus stays open with the fixture.
  absl::StatusOr<std::unique_ptr<storage::DataOrder>> CorpusOrder(
      std::optional<uint64_t> seed = std::nullopt) {
    SG_ASSIGN_OR_RETURN(corpus_, storage::Corpus::Open(dir_.File("corpus")));
    SG_ASSIGN_OR_RETURN(storage::CorpusMetadata meta,
                        storage::ReadCorpusMetadata(dir_.File("corpus")));
    storage::Manifest m = meta.default_manifest;
    m.dataset_fingerprint = corpus_->fingerprint();
    if (seed) m.seed = *seed;
    return storage::DataOrder::Create(*corpus_, m);
  }

  void Figures(const std::string& scenario, const v1::Incident& i) {
    double to_verdict = 0;
    for (const auto& e : i.events()) {
      if (e.kind() == "verdict" && to_verdict == 0) {
        to_verdict = (e.unix_ms() - i.opened_unix_ms()) / 1000.0;
      }
    }
    std::cout << "[scenario] " << scenario << ": verdict " << v1::Verdict_Name(i.verdict())
              << ", probes " << i.cost().probes() << ", steps re-executed "
              << i.cost().steps_reexecuted() << ", seconds to verdict " << to_verdict
              << ", seconds to close " << i.cost().wall_time_s() << std::endl;
  }
};

// Class 1: a spike near the end of the schedule. The skip horizon (onset +
// 100) lies past the last step: it is clamped, the workers say when their
// schedule ends, and the verdict comes at once; the finished run is not
// paused.
TEST_F(DiagnosisScenario, SpikeNearTheEndOfTheRun) {
  MakeCorpus({"highbytes@452"}, /*seed=*/11, {"--poison-echoes", "2"});
  const std::vector<std::string> poison = PoisonAt(452);
  ASSERT_FALSE(poison.empty()) << synth_out_;
  const std::vector<std::string> echoes = EchoesOf(452);
  ASSERT_EQ(echoes.size(), 2u) << synth_out_;
  Launch("tail", "data", {"--steps", "470"});
  const auto list = Settle("tail", absl::Minutes(4));
  ASSERT_EQ(list.incidents_size(), 1) << list.ShortDebugString();
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  EXPECT_EQ(i.state(), v1::CLOSED);
  EXPECT_THAT(Named(i), UnorderedElementsAreArray(poison));
  for (const auto& p : i.probes()) EXPECT_LE(p.horizon_step(), 469) << p.kind();
  // The near-copies of the culprit documents elsewhere in the corpus.
  std::vector<std::string> similar;
  for (const auto& d : i.near_duplicates()) {
    similar.push_back(absl::StrCat(d.domain(), ":", d.document_id()));
    EXPECT_GE(d.similarity(), 0.5);
  }
  for (const auto& e : echoes) EXPECT_THAT(similar, ::testing::Contains(e));
  ExpectNoTimeout(i);
  EXPECT_NE(ShowRun("tail").state(), v1::RUN_PAUSED);
  // Telemetry as JSON without --metrics carries every stored scalar.
  v1::QueryTelemetryResponse t;
  ASSERT_TRUE(cluster_.SpikectlJson({"telemetry", "--run", "tail", "--gen", "0", "--from", "100", "--to", "100"},
                                    "telemetry", &t));
  ASSERT_EQ(t.records_size(), 1);
  EXPECT_EQ(t.records(0).data_position(), 100);
  EXPECT_NE(t.records(0).loss_hash(), 0u);
  EXPECT_GT(t.records(0).tokens(), 0);
  Figures("spike near the end", i);
}

// Class 2: NUMERICS. The probes' own non-finite steps open no incident; the
// run is paused after the verdict and stays paused.
TEST_F(DiagnosisScenario, NumericsPausesOnceWithoutCascading) {
  MakeCorpus({}, /*seed=*/29);
  Launch("nan", "numerics", {"--set", "warmup_steps=330", "--set", "peak_lr=0.28"});
  auto list = WaitIncidents("nan", [](const auto& l) {
    return l.incidents_size() > 0 && Closed(l.incidents(0));
  }, absl::Minutes(5));
  absl::SleepFor(absl::Seconds(8));
  list.Clear();
  ASSERT_TRUE(cluster_.SpikectlJson({"incidents", "list", "--run", "nan"}, "after", &list));
  ASSERT_EQ(list.incidents_size(), 1) << list.ShortDebugString();
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::NUMERICS) << i.ShortDebugString();
  ExpectNoTimeout(i);
  const v1::Run run = ShowRun("nan");
  EXPECT_EQ(run.state(), v1::RUN_PAUSED);
  // Original, replay, skip: no generation piled up after the verdict.
  EXPECT_LE(run.current_generation(), 2) << run.ShortDebugString();
  Figures("numerics", i);
}

// Class 3: the workers keep one checkpoint. The chosen checkpoint is pinned
// while the incident may rewind there; one already deleted is never chosen.
TEST_F(DiagnosisScenario, KeepingOneCheckpointStillDiagnoses) {
  MakeCorpus({"junk@263"}, /*seed=*/5);
  const std::vector<std::string> poison = PoisonAt(263);
  Launch("keep1", "data",
         {"--steps", "520", "--set", "keep_checkpoints=1", "--set", "checkpoint_every=40"});
  const auto list = Settle("keep1", absl::Minutes(5));
  ASSERT_EQ(list.incidents_size(), 1) << list.ShortDebugString();
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  EXPECT_THAT(Named(i), UnorderedElementsAreArray(poison));
  for (const auto& p : i.probes()) {
    EXPECT_THAT(p.detail(), ::testing::Not(HasSubstr("cannot open"))) << p.kind();
  }
  ExpectNoTimeout(i);
  Figures("keep_checkpoints=1", i);
}

// Class 4: a second poison just outside the skip window. The skip probe's
// spike is on another batch: that batch is skipped too, and both poisons are
// the culprits (DATA, not FRAGILITY).
TEST_F(DiagnosisScenario, SecondPoisonJustOutsideTheSkipWindow) {
  MakeCorpus({"highbytes@331", "highbytes@336"}, /*seed=*/13);
  std::vector<std::string> poison = PoisonAt(331);
  const std::vector<std::string> second = PoisonAt(336);
  poison.insert(poison.end(), second.begin(), second.end());
  Launch("two", "data", {"--steps", "560"});
  const auto list = Settle("two", absl::Minutes(6));
  ASSERT_EQ(list.incidents_size(), 1) << list.ShortDebugString();
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  EXPECT_THAT(Named(i), UnorderedElementsAreArray(poison));
  EXPECT_THAT(Quarantined("two"), UnorderedElementsAreArray(poison));
  ExpectNoTimeout(i);
  Figures("second poison outside the window", i);
}

// Class 5: two culprit batches inside the window are both found.
TEST_F(DiagnosisScenario, TwoCulpritsInsideTheWindow) {
  MakeCorpus({"junk@377", "highbytes@379"}, /*seed=*/17);
  std::vector<std::string> poison = PoisonAt(377);
  const std::vector<std::string> b = PoisonAt(379);
  poison.insert(poison.end(), b.begin(), b.end());
  Launch("pair", "data", {"--steps", "560"});
  const auto list = Settle("pair", absl::Minutes(6));
  ASSERT_EQ(list.incidents_size(), 1) << list.ShortDebugString();
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  EXPECT_THAT(i.culprit_positions(), ::testing::ElementsAre(377, 379));
  EXPECT_THAT(Named(i), UnorderedElementsAreArray(poison));
  EXPECT_THAT(Quarantined("pair"), UnorderedElementsAreArray(poison));
  ExpectNoTimeout(i);
  Figures("two culprits in the window", i);
}

// Class 6 (and 11, an explicit 0 in a policy): with min_steps_before_onset 0
// the probes start at the checkpoint right before the culprit, so a bisect
// probe feeds the culprit at its very first step; it is judged and named.
TEST_F(DiagnosisScenario, CulpritAtTheProbesFirstStep) {
  MakeCorpus({"highbytes@241"}, /*seed=*/19);
  const std::vector<std::string> poison = PoisonAt(241);
  const std::string policy = R"pb(
    probe {
      min_steps_before_onset: 0
      max_steps_before_onset: 400
      replay_steps_past_onset: 5
      skip_before: 2
      skip_after: 2
      skip_horizon: 80
    }
    fix { verify_steps: 80 }
  )pb";
  Launch("first", "data", {"--steps", "480", "--set", "checkpoint_every=40"}, policy);
  const auto list = Settle("first", absl::Minutes(5));
  ASSERT_EQ(list.incidents_size(), 1) << list.ShortDebugString();
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  ASSERT_GE(i.probes_size(), 3);
  EXPECT_EQ(i.probes(0).checkpoint_step(), 240);  // the explicit 0 held
  EXPECT_EQ(i.probes(0).outcome(), "spiked");
  EXPECT_THAT(i.culprit_positions(), ::testing::ElementsAre(241));
  EXPECT_THAT(Named(i), UnorderedElementsAreArray(poison));
  ExpectNoTimeout(i);
  Figures("culprit at the probe's first step", i);
}

// A run's life: 3,000 steps with three poisons of two kinds far apart, a
// fragility episode and a one-off gradient bit flip (past the episode's
// probes, which would otherwise meet it first) between them, on a worker
// that keeps only its newest checkpoint. The peak lr (6e-2, cosine, warm-up
// to step 1,200) is past what this model holds: its max attention logit
// climbs from ~100 to ~2e4 and the loss breaks away near step 1,400 whatever
// the batches. A fix rung (0.7x, then 0.49x that lr) makes it train through;
// which rung, and whether the model grows fragile again later in the run,
// depends on which checkpoint the worker still has when each incident opens
// (it keeps one), so the episode may be one to three FRAGILITY incidents,
// one of them possibly next to a poison that the fix must not be judged on.
// After each fix the run trains on another line (holes in its plan, a lower
// lr); each later incident rewinds to a checkpoint of that line (no
// "nondeterminism"), finds one still there (the rolling pin), and ends
// right: DATA with exactly its documents, FRAGILITY with a verified fix and
// no pause, or TRANSIENT. The probes that change only data start at the
// replay's window checkpoint.
TEST_F(DiagnosisScenario, ALongRunStaysOnItsLineThroughEveryIncidentToItsEnd) {
  MakeCorpus({"highbytes@500", "junk@2300", "highbytes@2700"}, /*seed=*/31);
  const std::map<int64_t, std::vector<std::string>> poisons = {
      {500, PoisonAt(500)}, {2300, PoisonAt(2300)}, {2700, PoisonAt(2700)}};
  for (const auto& [at, docs] : poisons) ASSERT_FALSE(docs.empty()) << at << synth_out_;
  Launch("life", "data",
         {"--steps", "3000", "--set", "keep_checkpoints=1", "--set", "peak_lr=6e-2", "--set",
          "warmup_steps=1200", "--set", "schedule=cosine", "--set", "total_steps=3000", "--set",
          "min_lr_ratio=0.1", "--fault", "bitflip:step=2100"});
  // Every incident closed, and the run at its last step; a paused run goes
  // no further. The wait ends well inside the test's own timeout, so a run
  // that does not get there fails with its incidents printed.
  v1::Run run;
  v1::ListIncidentsResponse list;
  const absl::Time deadline = absl::Now() + absl::Minutes(8);
  while (absl::Now() < deadline) {
    run = ShowRun("life");
    list.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"incidents", "list", "--run", "life"}, "list", &list));
    bool closed = true;
    for (const auto& i : list.incidents()) closed = closed && Closed(i);
    if (closed && (run.last_step() >= 2999 || run.state() == v1::RUN_PAUSED)) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  std::vector<v1::Incident> incidents;
  for (const auto& brief : list.incidents()) incidents.push_back(Show(brief.id()));
  std::sort(incidents.begin(), incidents.end(),
            [](const v1::Incident& a, const v1::Incident& b) {
              return a.onset_step() < b.onset_step();
            });
  std::string summary;
  for (const v1::Incident& i : incidents) {
    absl::StrAppend(&summary, i.id(), " onset ", i.onset_step(), " ", v1::Verdict_Name(i.verdict()),
                    ": ", i.note(), "\n", EventLines(i));
  }
  EXPECT_GE(run.last_step(), 2999) << run.ShortDebugString() << "\n" << summary;
  EXPECT_NE(run.state(), v1::RUN_PAUSED) << run.ShortDebugString() << "\n" << summary;
  // Three poisons, the bit flip, and the fragility episode (one to three
  // incidents, see above).
  ASSERT_GE(incidents.size(), 5u) << summary;
  ASSERT_LE(incidents.size(), 7u) << summary;
  int transient = 0, fragility = 0;
  std::set<int64_t> culprits;
  std::vector<std::string> all_poison;
  for (const v1::Incident& i : incidents) {
    SCOPED_TRACE(absl::StrCat("incident at step ", i.onset_step()));
    EXPECT_EQ(i.state(), v1::CLOSED);
    for (const auto& e : i.events()) EXPECT_NE(e.kind(), "nondeterminism") << e.detail();
    ExpectNoTimeout(i);
    Figures(absl::StrCat("life, onset ", i.onset_step()), i);
    if (i.onset_step() >= 2095 && i.onset_step() <= 2110) {
      ++transient;
      EXPECT_EQ(i.verdict(), v1::TRANSIENT) << i.ShortDebugString();
      continue;
    }
    if (i.verdict() != v1::DATA) {
      // The fragility episode: the spike comes back whatever is skipped, and
      // the ladder's fix is verified; the run is not paused for it.
      ++fragility;
      EXPECT_EQ(i.verdict(), v1::FRAGILITY) << EventLines(i);
      EXPECT_GT(i.onset_step(), 1100) << EventLines(i);
      ASSERT_GE(i.probes_size(), 2);
      EXPECT_EQ(i.probes(i.probes_size() - 1).kind(), "fix") << EventLines(i);
      EXPECT_EQ(i.probes(i.probes_size() - 1).outcome(), "clean") << EventLines(i);
      EXPECT_THAT(i.fix(), HasSubstr("fix rung")) << EventLines(i);
      continue;
    }
    // A poison: DATA with exactly its documents, once each.
    ASSERT_EQ(i.culprit_positions_size(), 1) << i.ShortDebugString();
    const auto it = poisons.find(i.culprit_positions(0));
    ASSERT_NE(it, poisons.end()) << i.ShortDebugString();
    EXPECT_TRUE(culprits.insert(it->first).second) << "poison " << it->first << " twice\n"
                                                   << summary;
    EXPECT_THAT(Named(i), UnorderedElementsAreArray(it->second));
    all_poison.insert(all_poison.end(), it->second.begin(), it->second.end());
    // Skip, bisect and document probes started at the replay's checkpoint
    // at the window's start, after the (last) replay itself.
    ASSERT_GE(i.probes_size(), 3);
    EXPECT_EQ(i.probes(0).kind(), "replay");
    int replay = 0;
    for (int k = 0; k < i.probes_size(); ++k) {
      if (i.probes(k).kind() == "replay") replay = k;
    }
    for (int k = replay + 1; k < i.probes_size(); ++k) {
      EXPECT_GT(i.probes(k).checkpoint_step(), i.probes(replay).checkpoint_step())
          << i.probes(k).ShortDebugString() << "\n" << EventLines(i);
    }
  }
  EXPECT_EQ(culprits.size(), 3u) << summary;
  EXPECT_GE(fragility, 1) << summary;
  EXPECT_LE(fragility, 3) << summary;
  EXPECT_EQ(transient, 1) << summary;
  EXPECT_THAT(Quarantined("life"), UnorderedElementsAreArray(all_poison));
  // The listing says which checkpoints the current line may rewind to; the
  // rolling pin is one of them.
  v1::ListCheckpointsResponse ckpts;
  ASSERT_TRUE(cluster_.SpikectlJson({"checkpoints", "list", "--run", "life"}, "ckpts", &ckpts));
  int rolling = 0;
  for (const auto& c : ckpts.checkpoints()) {
    if (!c.rolling_pin()) continue;
    ++rolling;
    EXPECT_TRUE(c.rewind_target()) << c.ShortDebugString();
  }
  EXPECT_EQ(rolling, 1) << ckpts.ShortDebugString();
}

// One culprit document, one incident: a corpus of 600 positions under a
// run of 1,400 steps, so the poison's documents recur in the reshuffled
// later epochs. The DATA fix holds them out of every later batch that
// carries them (masks, or holes where every sample does): the run reaches
// its end with the one incident.
TEST_F(DiagnosisScenario, OneCulpritDocumentIsOneIncidentThroughLaterEpochs) {
  MakeCorpus({"highbytes@250"}, /*seed=*/41, {"--positions", "600"});
  const std::vector<std::string> poison = PoisonAt(250);
  ASSERT_FALSE(poison.empty()) << synth_out_;
  constexpr int64_t kSteps = 1400;
  // Where the poison's documents recur under the run's order.
  auto order = CorpusOrder();
  ASSERT_TRUE(order.ok()) << order.status();
  std::map<int64_t, std::set<int32_t>> later;
  for (int64_t p = 260; p < kSteps + 20; ++p) {
    auto batch = (*order)->Resolve(p);
    ASSERT_TRUE(batch.ok()) << batch.status();
    for (size_t j = 0; j < batch->samples.size(); ++j) {
      for (const auto& span : batch->samples[j].spans) {
        const std::string name = absl::StrCat(corpus_->domain_name(span.domain), ":", span.document);
        if (std::find(poison.begin(), poison.end(), name) != poison.end()) {
          later[p].insert(static_cast<int32_t>(j));
        }
      }
    }
  }
  ASSERT_FALSE(later.empty()) << "the poison does not recur within the run";
  Launch("epochs", "data", {"--steps", std::to_string(kSteps)});
  v1::Run run;
  v1::ListIncidentsResponse list;
  for (int k = 0; k < 900; ++k) {
    run = ShowRun("epochs");
    list.Clear();
    ASSERT_TRUE(cluster_.SpikectlJson({"incidents", "list", "--run", "epochs"}, "list", &list));
    bool closed = true;
    for (const auto& i : list.incidents()) closed = closed && Closed(i);
    if (closed && run.last_step() >= kSteps - 1) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_GE(run.last_step(), kSteps - 1) << run.ShortDebugString();
  ASSERT_EQ(list.incidents_size(), 1) << list.ShortDebugString();
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  EXPECT_EQ(i.state(), v1::CLOSED);
  EXPECT_THAT(Named(i), UnorderedElementsAreArray(poison));
  EXPECT_THAT(i.note(), HasSubstr("the fix holds the document(s)"));
  // The fix's plan: every later batch it feeds within the run goes without
  // the samples that carry the poison.
  const v1::Probe& fix = i.probes(i.probes_size() - 1);
  ASSERT_EQ(fix.kind(), "fix") << EventLines(i);
  int held = 0;
  for (const auto& [p, slots] : later) {
    const int64_t step = incident::StepOfPosition(fix.data_plan(), p);
    if (step < 0) {
      ++held;  // a hole
      continue;
    }
    if (step >= kSteps) continue;
    std::set<int32_t> masked;
    for (const auto& m : fix.data_plan().masks()) {
      if (m.position() == p) masked.insert(m.slots().begin(), m.slots().end());
    }
    for (int32_t slot : slots) EXPECT_TRUE(masked.count(slot)) << "position " << p << " slot " << slot;
    held += !masked.empty();
  }
  EXPECT_GT(held, 0);
  ExpectNoTimeout(i);
  Figures("one culprit document through later epochs", i);
}

// Classes 7 and 8: the data order the workers use is the run's. A worker
// whose seed contradicts the run's manifest is refused, naming the field;
// one the manifest leaves free has its order recorded, and the daemon names
// every document of a position from that order, one spanning two batches at
// both.
TEST_F(DiagnosisScenario, DocumentsAreNamedFromTheWorkersDataOrder) {
  MakeCorpus({}, /*seed=*/23);
  daemon_ = cluster_.StartDaemon("first", DaemonArgs());
  auto spec = [&](const std::string& name, const std::string& manifest) {
    WriteSpec(dir_.File(name), "small", {"--steps", "40", "--linger-s", "0", "--set", "data_seed=99"},
              manifest);
  };
  spec("contradicts.textproto", "seed: 7");
  spec("free.textproto", "");
  ASSERT_EQ(cluster_.Spikectl({"runs", "create", "contra", "--world-size=1", "--mode=observe",
                               "--spec=" + dir_.File("contradicts.textproto")},
                              "create-contra")
                .code,
            0);
  ASSERT_EQ(cluster_.Spikectl({"runs", "create", "free", "--world-size=1", "--mode=observe",
                               "--spec=" + dir_.File("free.textproto")},
                              "create-free")
                .code,
            0);
  v1::Run free;
  for (int k = 0; k < 600; ++k) {
    free = ShowRun("free");
    if (free.state() == v1::RUN_FINISHED || free.state() == v1::RUN_FAILED) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(free.state(), v1::RUN_FINISHED) << WorkerLog("free").substr(0, 3000);
  EXPECT_THAT(WorkerLog("contra"), HasSubstr("seed"));
  EXPECT_EQ(ShowRun("contra").last_step(), 0);

  // What the daemon names, against the order seed 99 gives.
  v1::ResolveManifestResponse resolved;
  ASSERT_TRUE(cluster_.SpikectlJson({"manifest", "--run", "free", "--from", "0", "--to", "39"},
                                    "manifest", &resolved));
  ASSERT_EQ(resolved.steps_size(), 40);
  auto order = CorpusOrder(/*seed=*/99);
  ASSERT_TRUE(order.ok()) << order.status();
  std::map<std::string, int> positions_of;
  for (const auto& step : resolved.steps()) {
    auto docs = (*order)->DocumentsAt(step.data_position());
    ASSERT_TRUE(docs.ok());
    std::vector<std::string> want, got;
    for (const auto& d : *docs) want.push_back(absl::StrCat(d.domain, ":", d.document));
    for (const auto& d : step.documents()) {
      got.push_back(absl::StrCat(d.domain(), ":", d.document_id()));
      ++positions_of[got.back()];
    }
    EXPECT_THAT(got, UnorderedElementsAreArray(want)) << "step " << step.step();
  }
  int spanning = 0;
  for (const auto& [doc, n] : positions_of) spanning += n > 1;
  EXPECT_GT(spanning, 0) << "no document spans two batches in 40 steps";
}

// Document-level bisection: a near-copy of a junk poison
// fills only the code samples of an otherwise ordinary batch. Batch bisect
// names the batch; document bisect feeds parts of it (sample masks) and
// names the junk document alone, the rest of the batch being cleared.
TEST_F(DiagnosisScenario, DocumentBisectNamesTheJunkDocumentInsideItsBatch) {
  // The poison itself lies past the run's last position; its one echo (code)
  // starts a batch in [400, 600) of its own.
  MakeCorpus({"junk@599"}, /*seed=*/11, {"--positions", "600", "--poison-echoes", "1"});
  const std::vector<std::string> echo = EchoesOf(599);
  ASSERT_EQ(echo.size(), 1u) << synth_out_;
  const std::string policy = R"pb(
    probe {
      min_steps_before_onset: 50
      max_steps_before_onset: 500
      replay_steps_past_onset: 5
      skip_before: 2
      skip_after: 2
      skip_horizon: 100
      bisect_documents: true
      max_document_probes: 6
    }
    budget { max_probes: 24 }
    fix { verify_steps: 100 }
  )pb";
  Launch("docs", "data", {"--steps", "598"}, policy);
  const auto list = Settle("docs", absl::Minutes(6));
  ASSERT_EQ(list.incidents_size(), 1) << list.ShortDebugString();
  const v1::Incident i = Show(list.incidents(0).id());
  EXPECT_EQ(i.verdict(), v1::DATA) << i.ShortDebugString();
  ASSERT_EQ(i.culprit_positions_size(), 1);
  int document_probes = 0;
  for (const auto& p : i.probes()) {
    if (p.kind() != "bisect_samples") continue;
    ++document_probes;
    ASSERT_EQ(p.data_plan().masks_size(), 1) << p.ShortDebugString();
    EXPECT_EQ(p.data_plan().masks(0).position(), i.culprit_positions(0));
  }
  EXPECT_GE(document_probes, 2);
  // Exactly the junk document; the batch's other documents are suspects.
  EXPECT_THAT(Named(i), UnorderedElementsAreArray(echo));
  EXPECT_THAT(Quarantined("docs"), UnorderedElementsAreArray(echo));
  // The culprit batch's other documents (under the corpus's own order) were
  // cleared: each is listed as a suspect.
  auto order = CorpusOrder();
  ASSERT_TRUE(order.ok()) << order.status();
  auto batch = (*order)->DocumentsAt(i.culprit_positions(0));
  ASSERT_TRUE(batch.ok()) << batch.status();
  std::vector<std::string> suspects;
  for (const auto& d : i.suspects()) suspects.push_back(absl::StrCat(d.domain(), ":", d.document_id()));
  int cleared = 0;
  for (const auto& d : *batch) {
    const std::string name = absl::StrCat(d.domain, ":", d.document);
    if (name == echo[0]) continue;
    ++cleared;
    EXPECT_THAT(suspects, ::testing::Contains(name));
  }
  EXPECT_GE(cleared, 2);
  EXPECT_THAT(i.note(), HasSubstr("1 of its"));
  ExpectNoTimeout(i);
  Figures("document bisect inside the culprit batch", i);
}

}  // namespace
}  // namespace spikeguard::testing
