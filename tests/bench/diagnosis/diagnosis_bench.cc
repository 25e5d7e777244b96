// diagnosis_bench: what a diagnosis costs.
//
//   diagnosis_bench --out DIR [--timeout-s N] [--only NAME]
//
// For each end-to-end scenario — data poison, transient bit flip, fp16
// numerics (tests/e2e/scenarios/*.conf) — starts a real spikeguardd process,
// sets the policy, creates the run in auto mode with the reference worker as
// its command, and lets the daemon launch the worker, detect the spike, run
// its probes (in-place rewinds) and reach a verdict, on a real SQLite catalog.
// From the incident it records probes, re-executed steps, the time from
// opening to the verdict and to closing (cost.wall_time_s), next to the
// worst case the budgets allow — computed from the policy, stated as such.
//
// Writes DIR/diagnosis_bench.md and DIR/diagnosis_bench.json. A benchmark
// prints figures; it fails (exit 1) only when it cannot run (no incident, no
// verdict). A wrong verdict is printed as such, not hidden.
#include <dirent.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "daemon/incident/policy.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "tests/e2e/launch_profile.h"
#include "tests/e2e/process.h"
#include "tests/e2e/probe_policy.h"

namespace {

namespace v1 = spikeguard::v1;
using spikeguard::testing::FreePort;
using spikeguard::testing::KillProcessesMentioning;
using spikeguard::testing::Process;
using spikeguard::testing::ReadFile;
using spikeguard::testing::RunCommand;
using spikeguard::testing::RunResult;
using spikeguard::testing::TempDir;

constexpr const char* kPolicy = spikeguard::testing::kE2EProbePolicy;

struct Scenario {
  std::string name;
  std::string conf;
  std::vector<std::string> poisons;
  std::vector<std::string> worker_args;
  v1::Verdict expected;
  std::string what;
  // Knobs over the e2e probe policy (text format), e.g. a baseline.
  std::string policy_over = "";
};

const std::vector<Scenario>& Scenarios() {
  static const auto* s = new std::vector<Scenario>{
      {"data", "data", {"highbytes@300"}, {"--steps", "600"}, v1::DATA,
       "poison documents (never-seen bytes) at data position 300"},
      // The same incident with every probe starting at the probe checkpoint
      // (before the replay saved a checkpoint at the window's start).
      {"data-from-probe-checkpoint", "data", {"highbytes@300"}, {"--steps", "600"}, v1::DATA,
       "the same, window checkpoint off (the baseline)", "probe { window_checkpoint: false }"},
      {"transient", "transient", {}, {"--steps", "450", "--fault", "bitflip:step=250"},
       v1::TRANSIENT, "one gradient bit flip at step 250, first attempt only"},
      {"numerics", "numerics", {}, {}, v1::NUMERICS,
       "emulated fp16 range overflows as the lr warms up"},
  };
  return *s;
}

struct Outcome {
  std::string scenario;
  bool ok = false;
  std::string error;
  v1::Incident incident;
  double launch_to_verdict_s = 0;  // measured here, from `runs create`
  double opened_to_verdict_s = 0;  // from the incident's event log
};

class ScenarioRun {
 public:
  explicit ScenarioRun(const Scenario& s) : scenario_(s), port_(FreePort()) {
    addr_ = absl::StrCat("127.0.0.1:", port_);
  }
  ~ScenarioRun() {
    if (daemon_) {
      daemon_->Kill(SIGTERM);
      if (!daemon_->Wait(std::chrono::seconds(20))) daemon_->Kill(SIGKILL);
    }
    KillProcessesMentioning(dir_.path());
  }

  Outcome Run(absl::Duration timeout) {
    Outcome out;
    out.scenario = scenario_.name;
    if (std::string err = Prepare(); !err.empty()) {
      out.error = err;
      return out;
    }
    const absl::Time launched = absl::Now();
    RunResult created = Spikectl({"runs", "create", scenario_.name, "--world-size=1", "--mode=auto",
                                  "--spec=" + dir_.File("spec.textproto")});
    if (created.code != 0) {
      out.error = "runs create: " + created.err;
      return out;
    }
    // Done when the first incident is closed; a verdict without a close (a
    // recommendation that waits for an operator) counts after a grace period.
    absl::Time verdict_seen = absl::InfiniteFuture();
    const absl::Time deadline = launched + timeout;
    v1::ListIncidentsResponse list;
    while (absl::Now() < deadline) {
      list.Clear();
      if (SpikectlJson({"incidents", "list", "--run", scenario_.name}, &list) &&
          list.incidents_size() > 0) {
        const v1::Incident& i = list.incidents(0);
        if (i.verdict() != v1::VERDICT_UNSPECIFIED && verdict_seen == absl::InfiniteFuture()) {
          verdict_seen = absl::Now();
          out.launch_to_verdict_s = absl::ToDoubleSeconds(verdict_seen - launched);
        }
        if (i.state() == v1::CLOSED || absl::Now() - verdict_seen > absl::Seconds(20)) break;
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
    if (list.incidents_size() == 0) {
      out.error = "no incident within the timeout; worker log:\n" +
                  ReadFile(dir_.File("data/runs/" + scenario_.name + "/rank-0.log")).substr(0, 3000);
      return out;
    }
    if (!SpikectlJson({"incidents", "show", absl::StrCat(list.incidents(0).id())}, &out.incident)) {
      out.error = "incidents show failed: " + last_error_;
      return out;
    }
    if (out.incident.verdict() == v1::VERDICT_UNSPECIFIED) {
      out.error = "no verdict within the timeout: " + out.incident.ShortDebugString().substr(0, 2000);
      return out;
    }
    for (const auto& e : out.incident.events()) {
      if (e.kind() == "verdict") {
        out.opened_to_verdict_s = (e.unix_ms() - out.incident.opened_unix_ms()) / 1000.0;
        break;
      }
    }
    out.ok = true;
    return out;
  }

 private:
  std::string Prepare() {
    // Daemon.
    const std::string port_file = dir_.File("port");
    spikeguard::testing::WriteRefWorkerProfile(dir_.File("profiles.textproto"), dir_.path(), WORKER, SCENARIO_DIR);
    daemon_ = std::make_unique<Process>(
        std::vector<std::string>{SPIKEGUARDD, "--listen=" + addr_, "--data-dir=" + dir_.File("data"),
                                 "--port-file=" + port_file,
                                 "--launch-profiles=" + dir_.File("profiles.textproto")},
        dir_.File("daemon"));
    for (int i = 0; i < 500 && ReadFile(port_file).empty(); ++i) {
      if (!daemon_->running()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (ReadFile(port_file).empty()) return "daemon did not start: " + daemon_->err();
    // Corpus, with the scenario's poison.
    std::vector<std::string> synth = {WORKER, "corpus", "synth", "--out", dir_.File("corpus"),
                                      "--seed", "7"};
    for (const auto& p : scenario_.poisons) {
      synth.push_back("--poison");
      synth.push_back(p);
    }
    if (RunResult r = RunCommand(synth, dir_.File("synth")); r.code != 0) {
      return "corpus synth: " + r.err;
    }
    // Policy.
    std::string policy = kPolicy;
    if (!scenario_.policy_over.empty()) {
      auto base = spikeguard::incident::ParsePolicyText(kPolicy, "bench policy");
      auto over = spikeguard::incident::ParsePolicyText(scenario_.policy_over, "scenario policy");
      if (!base.ok() || !over.ok()) return "policy: does not parse";
      google::protobuf::TextFormat::PrintToString(
          spikeguard::incident::MergePolicy(*base, *over), &policy);
    }
    std::ofstream(dir_.File("policy.textproto")) << policy;
    if (RunResult r = Spikectl({"policy", "set", "--file", dir_.File("policy.textproto")});
        r.code != 0) {
      return "policy set: " + r.err;
    }
    // The run spec: the daemon launches the reference worker itself, from
    // its launch profile.
    spikeguard::testing::WriteRefWorkerSpec(dir_.File("spec.textproto"), scenario_.conf,
                                            scenario_.worker_args, dir_.File("corpus"));
    return "";
  }

  RunResult Spikectl(std::vector<std::string> args) {
    // The daemon makes its admin token on first start (DATA_DIR/admin.token).
    std::vector<std::string> argv = {SPIKECTL, "--addr=" + addr_,
                                     "--token-file=" + dir_.File("data/admin.token")};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, dir_.File(absl::StrCat("spikectl-", ++calls_)));
  }

  template <typename Message>
  bool SpikectlJson(std::vector<std::string> args, Message* out) {
    args.insert(args.begin(), "--output=json");
    RunResult r = Spikectl(args);
    if (r.code != 0) {
      last_error_ = r.err;
      return false;
    }
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    return google::protobuf::util::JsonStringToMessage(r.out, out, options).ok();
  }

  const Scenario& scenario_;
  TempDir dir_;
  int port_;
  std::string addr_;
  std::unique_ptr<Process> daemon_;
  int calls_ = 0;
  std::string last_error_;
};

// The worst case a policy's budgets allow, computed (not measured). A probe
// rewinds to a checkpoint at most max_steps_before_onset before the onset and
// runs to its horizon; the longest horizon past the onset is the largest of
// the replay, skip, bisect and fix horizons. A probe may start while fewer
// than max_reexecuted_steps have been re-executed, so the last one can
// overshoot that budget by one probe.
struct WorstCase {
  std::string policy_name;
  int max_probes = 0;
  int64_t longest_probe_steps = 0;
  int64_t max_reexecuted_steps = 0;
  int64_t probes_times_longest = 0;
  int64_t worst_steps = 0;
};

WorstCase ComputeWorstCase(const std::string& name, const v1::Policy& p) {
  WorstCase w;
  w.policy_name = name;
  const auto& probe = p.probe();
  const int64_t past_onset =
      std::max({probe.replay_steps_past_onset(), probe.skip_horizon(),
                probe.skip_after() + probe.replay_steps_past_onset(), p.fix().verify_steps()});
  w.max_probes = p.budget().max_probes();
  w.longest_probe_steps = probe.max_steps_before_onset() + past_onset;
  w.max_reexecuted_steps = p.budget().max_reexecuted_steps();
  w.probes_times_longest = w.max_probes * w.longest_probe_steps;
  w.worst_steps =
      std::min(w.probes_times_longest, w.max_reexecuted_steps - 1 + w.longest_probe_steps);
  return w;
}

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "diagnosis_bench: " << what << "\n";
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir, only;
  int64_t timeout_s = 150;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--out") {
      out_dir = next();
    } else if (a == "--only") {
      only = next();
    } else if (a == "--timeout-s") {
      if (!absl::SimpleAtoi(next(), &timeout_s) || timeout_s <= 0) Die("--timeout-s: not a number");
    } else {
      std::cerr << "usage: diagnosis_bench --out DIR [--timeout-s N] [--only data|"
                   "data-from-probe-checkpoint|transient|numerics]\n";
      return 2;
    }
  }
  if (out_dir.empty()) Die("--out DIR is required");
  std::filesystem::create_directories(out_dir);

  std::vector<Outcome> outcomes;
  for (const Scenario& s : Scenarios()) {
    if (!only.empty() && s.name != only) continue;
    std::cout << "scenario " << s.name << " (" << s.what << ") ..." << std::flush;
    ScenarioRun run(s);
    Outcome o = run.Run(absl::Seconds(timeout_s));
    if (!o.ok) Die(absl::StrCat("scenario ", s.name, ": ", o.error));
    const auto& c = o.incident.cost();
    std::cout << absl::StrFormat(
        " verdict %s (expected %s), onset %d, probes %d, steps re-executed %d, verdict %.2f s "
        "after opening, closed after %.2f s, %.2f s from launch to verdict\n",
        v1::Verdict_Name(o.incident.verdict()), v1::Verdict_Name(s.expected),
        o.incident.onset_step(), c.probes(), c.steps_reexecuted(), o.opened_to_verdict_s,
        c.wall_time_s(), o.launch_to_verdict_s);
    outcomes.push_back(std::move(o));
  }

  std::string md =
      "# Diagnosis cost (diagnosis_bench)\n\n## Measured, per scenario\n\n"
      "| scenario | expected | verdict | probes | probe kinds | steps re-executed | opened → "
      "verdict s | opened → closed s | launch → verdict s |\n"
      "|---|---|---|---:|---|---:|---:|---:|---:|\n";
  std::vector<std::string> rows;
  double worst_s_per_step = 0;
  int correct = 0;
  for (size_t k = 0; k < outcomes.size(); ++k) {
    const Outcome& o = outcomes[k];
    const Scenario* s = nullptr;
    for (const auto& sc : Scenarios()) {
      if (sc.name == o.scenario) s = &sc;
    }
    const auto& c = o.incident.cost();
    std::vector<std::string> kinds;
    for (const auto& p : o.incident.probes()) kinds.push_back(absl::StrCat(p.kind(), ":", p.outcome()));
    correct += o.incident.verdict() == s->expected;
    // Seconds per re-executed step inside the probes (rewind and checkpoint
    // load included), from each probe's start, finish and step count.
    double probe_s = 0;
    int64_t probe_steps = 0;
    for (const auto& p : o.incident.probes()) {
      if (p.finished_unix_ms() <= p.started_unix_ms() || p.steps_executed() <= 0) continue;
      probe_s += (p.finished_unix_ms() - p.started_unix_ms()) / 1000.0;
      probe_steps += p.steps_executed();
    }
    if (probe_steps > 0) worst_s_per_step = std::max(worst_s_per_step, probe_s / probe_steps);
    md += absl::StrFormat("| %s | %s | %s | %d | %s | %d | %.2f | %.2f | %.2f |\n", o.scenario,
                          v1::Verdict_Name(s->expected), v1::Verdict_Name(o.incident.verdict()),
                          c.probes(), absl::StrJoin(kinds, ", "), c.steps_reexecuted(),
                          o.opened_to_verdict_s, c.wall_time_s(), o.launch_to_verdict_s);
    rows.push_back(absl::StrFormat(
        "{\"scenario\": \"%s\", \"expected\": \"%s\", \"verdict\": \"%s\", \"onset_step\": %d, "
        "\"probes\": %d, \"steps_reexecuted\": %d, \"opened_to_verdict_s\": %.3f, "
        "\"wall_time_s\": %.3f, \"launch_to_verdict_s\": %.3f, \"probe_kinds\": [%s]}",
        o.scenario, v1::Verdict_Name(s->expected), v1::Verdict_Name(o.incident.verdict()),
        o.incident.onset_step(), c.probes(), c.steps_reexecuted(), o.opened_to_verdict_s,
        c.wall_time_s(), o.launch_to_verdict_s,
        kinds.empty() ? "" : absl::StrCat("\"", absl::StrJoin(kinds, "\", \""), "\"")));
  }
  md += absl::StrFormat(
      "\nReal spikeguardd + reference worker processes (1 rank, CPU), auto mode, the incident "
      "e2e tests' probe policy. Probes and steps re-executed are the incident's cost at close "
      "(fix verification included where the verdict has a fix); opened → verdict is from the "
      "incident's event log, opened → closed is cost.wall_time_s, launch → verdict includes "
      "training up to the spike. Verdicts correct: %d of %d.\n\n",
      correct, static_cast<int>(outcomes.size()));

  // The window checkpoint against its baseline, in the same process.
  const Outcome* with = nullptr;
  const Outcome* without = nullptr;
  for (const Outcome& o : outcomes) {
    if (o.scenario == "data") with = &o;
    if (o.scenario == "data-from-probe-checkpoint") without = &o;
  }
  if (with != nullptr && without != nullptr &&
      without->incident.cost().steps_reexecuted() > 0) {
    const std::string line = absl::StrFormat(
        "data: %d steps re-executed with the window checkpoint, %d from the probe checkpoint: "
        "%.2fx (probes %d vs %d; culprits %s vs %s)",
        with->incident.cost().steps_reexecuted(), without->incident.cost().steps_reexecuted(),
        static_cast<double>(with->incident.cost().steps_reexecuted()) /
            without->incident.cost().steps_reexecuted(),
        with->incident.cost().probes(), without->incident.cost().probes(),
        absl::StrJoin(with->incident.culprit_positions(), ","),
        absl::StrJoin(without->incident.culprit_positions(), ","));
    std::cout << line << "\n";
    md += "## Window checkpoint against its baseline\n\n" + line + "\n\n";
  }

  auto bench_policy = spikeguard::incident::ParsePolicyText(kPolicy, "bench policy");
  if (!bench_policy.ok()) Die(bench_policy.status().ToString());
  const v1::Policy defaults = spikeguard::incident::DefaultPolicy();
  const std::vector<WorstCase> worst = {
      ComputeWorstCase("default", defaults),
      ComputeWorstCase("bench (e2e)", spikeguard::incident::MergePolicy(defaults, *bench_policy))};
  md += "## Worst case the budgets allow (computed)\n\n"
        "| policy | max_probes | longest probe (steps) | max_probes × longest | "
        "max_reexecuted_steps | worst-case steps re-executed | at the slowest measured s/step |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n";
  std::vector<std::string> wrows;
  for (const WorstCase& w : worst) {
    md += absl::StrFormat("| %s | %d | %d | %d | %d | %d | %.0f s |\n", w.policy_name,
                          w.max_probes, w.longest_probe_steps, w.probes_times_longest,
                          w.max_reexecuted_steps, w.worst_steps,
                          w.worst_steps * worst_s_per_step);
    std::cout << absl::StrFormat(
        "worst case (%s policy, computed): %d probes x %d steps = %d; max_reexecuted_steps %d; "
        "worst %d steps re-executed, ~%.0f s at %.4f s/step\n",
        w.policy_name, w.max_probes, w.longest_probe_steps, w.probes_times_longest,
        w.max_reexecuted_steps, w.worst_steps, w.worst_steps * worst_s_per_step, worst_s_per_step);
    wrows.push_back(absl::StrFormat(
        "{\"policy\": \"%s\", \"max_probes\": %d, \"longest_probe_steps\": %d, "
        "\"max_probes_times_longest\": %d, \"max_reexecuted_steps\": %d, \"worst_steps\": %d, "
        "\"worst_wall_s_estimate\": %.1f}",
        w.policy_name, w.max_probes, w.longest_probe_steps, w.probes_times_longest,
        w.max_reexecuted_steps, w.worst_steps, w.worst_steps * worst_s_per_step));
  }
  md += absl::StrFormat(
      "\nComputed from the policy, not measured: a probe rewinds at most max_steps_before_onset "
      "before the onset (when a checkpoint lies in the window) and runs to its horizon — the "
      "largest of the replay, skip, bisect and fix-verification horizons past the onset. The "
      "budget stops the engine at max_probes, or before a probe once max_reexecuted_steps are "
      "spent (so the last probe may overshoot by one probe); past either the incident is "
      "INCONCLUSIVE and waits for an operator. Wall time is estimated at the slowest measured "
      "seconds per re-executed step inside a scenario's probes (%.4f s, rewind and checkpoint "
      "load included; the reference worker on CPU).\n",
      worst_s_per_step);

  std::ofstream(out_dir + "/diagnosis_bench.md") << md;
  std::ofstream(out_dir + "/diagnosis_bench.json")
      << "{\"scenarios\": [" << absl::StrJoin(rows, ", ") << "], \"verdicts_correct\": " << correct
      << ", \"worst_case\": [" << absl::StrJoin(wrows, ", ") << "]}\n";
  std::cout << "wrote " << out_dir << "/diagnosis_bench.{md,json}\n";
  return 0;
}
