// spikeguard-worker: the reference worker.
//
//   spikeguard-worker corpus build --out DIR --domain NAME=PATH [--domain ...]
//   spikeguard-worker corpus synth --out DIR --seed S [--poison KIND@POSITION ...]
//       [--poison-echoes K] [--positions N]
//   spikeguard-worker train --corpus DIR [--checkpoint-dir DIR] [--config FILE]
//       [--set key=value ...] [--no-daemon --telemetry-out FILE]
//       [--addr HOST:PORT --run NAME --rank R --world-size N --generation G]
//       [--plan 0-600,610-] [--resume newest|PATH] [--fault bitflip:step=S]
//       [--stop-after STEP] [--linger-s SECONDS] [--lr-scale X]
//       [--token-file FILE] [--tls-ca FILE [--tls-cert FILE --tls-key FILE]
//        [--tls-server-name NAME]]
//
// The token and TLS flags override SPIKEGUARD_TOKEN, SPIKEGUARD_TOKEN_FILE,
// SPIKEGUARD_TLS_CA, ... (worker/client/client_security.h), which the
// daemon's launcher sets for the ranks it starts.
//
// Exit codes: 0 done; 1 failure; 2 usage; 3 rejected by spikeguardd.
#include <unistd.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/args.h"
#include "base/logging.h"
#include "storage/corpus/corpus_tools.h"
#include "storage/corpus/data_order.h"
#include "worker/ref/reference_worker.h"

namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  spikeguard-worker corpus build --out DIR --domain NAME=PATH [--domain NAME=PATH ...]\n"
    "  spikeguard-worker corpus synth --out DIR --seed S [--poison KIND@POSITION ...]\n"
    "      [--poison-echoes K] [--positions N]\n"
    "      poison kinds: ngram, junk, highbytes, duplicate; K near-copies of each poison\n"
    "      in late batches (at or past 2/3 of the N positions, default 3000)\n"
    "  spikeguard-worker train --corpus DIR [--checkpoint-dir DIR] [--config FILE]\n"
    "      [--set key=value ...] [--no-daemon] [--telemetry-out FILE]\n"
    "      [--addr HOST:PORT --run NAME --rank R --world-size N --generation G]\n"
    "      [--plan RANGES] [--resume newest|PATH] [--fault bitflip:step=S]\n"
    "      [--stop-after STEP] [--linger-s SECONDS] [--lr-scale X]\n"
    "      [--token-file FILE] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]\n"
    "      [--tls-server-name NAME]\n"
    "      (default: SPIKEGUARD_TOKEN or SPIKEGUARD_TOKEN_FILE, SPIKEGUARD_TLS_CA,\n"
    "      SPIKEGUARD_TLS_CERT, SPIKEGUARD_TLS_KEY, SPIKEGUARD_TLS_SERVER_NAME)\n"
    "exit codes: 0 done, 1 failure, 2 usage, 3 rejected by spikeguardd\n";

// The command line (base/args.h), read as the subcommands want it.
struct Args {
  spikeguard::ParsedArgs parsed;

  const std::vector<std::string>& positional() const { return parsed.positional; }
  bool Has(const std::string& k) const { return parsed.Has(k); }
  // The last occurrence wins, as with most command lines.
  std::string Get(const std::string& k, const std::string& def = "") const {
    return parsed.Get(k).value_or(def);
  }
  std::vector<std::string> All(const std::string& k) const { return parsed.GetAll(k); }
};

// Every flag of every subcommand (kUsage).
const std::vector<spikeguard::FlagSpec>& Flags() {
  using spikeguard::FlagSpec;
  static const std::vector<FlagSpec> kFlags = {
      {"out"}, {"domain", FlagSpec::kRepeated}, {"seed"}, {"poison", FlagSpec::kRepeated},
      {"poison-echoes"}, {"positions"}, {"corpus"}, {"checkpoint-dir"}, {"config"},
      {"set", FlagSpec::kRepeated}, {"steps"}, {"no-daemon", FlagSpec::kBool},
      {"telemetry-out"}, {"addr"}, {"run"}, {"rank"}, {"world-size"}, {"generation"},
      {"plan"}, {"resume"}, {"fault"}, {"stop-after"}, {"linger-s"}, {"lr-scale"},
      {"token-file"}, {"tls-ca"}, {"tls-cert"}, {"tls-key"}, {"tls-server-name"}};
  return kFlags;
}

int Usage(const std::string& why) {
  std::cerr << "spikeguard-worker: " << why << "\n" << kUsage;
  return 2;
}

int Fail(const absl::Status& s) {
  std::cerr << "spikeguard-worker: " << s.message() << "\n";
  return absl::IsFailedPrecondition(s) && absl::StrContains(s.message(), "rejected") ? 3 : 1;
}

int CorpusBuild(const Args& a) {
  if (!a.Has("out") || !a.Has("domain")) return Usage("corpus build needs --out and --domain");
  std::map<std::string, std::string> domains;
  for (const auto& d : a.All("domain")) {
    std::pair<std::string, std::string> kv = absl::StrSplit(d, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty()) return Usage("--domain wants NAME=PATH, got '" + d + "'");
    domains[kv.first] = kv.second;
  }
  auto meta = spikeguard::storage::BuildCorpus(a.Get("out"), domains);
  if (!meta.ok()) return Fail(meta.status());
  for (const auto& d : meta->domains) {
    std::cout << "domain " << d.name << ": " << d.documents << " documents, " << d.tokens
              << " tokens\n";
  }
  std::cout << "fingerprint " << meta->fingerprint << "\n";
  return 0;
}

int CorpusSynth(const Args& a) {
  if (!a.Has("out")) return Usage("corpus synth needs --out");
  uint64_t seed = 1;
  if (a.Has("seed") && !absl::SimpleAtoi(a.Get("seed"), &seed)) return Usage("--seed: not a number");
  std::vector<std::string> poison_texts;
  for (const auto& p : a.All("poison")) {
    for (auto part : absl::StrSplit(p, ',', absl::SkipEmpty())) poison_texts.emplace_back(part);
  }
  auto poisons = spikeguard::storage::ParsePoisons(poison_texts);
  if (!poisons.ok()) return Usage(std::string(poisons.status().message()));
  spikeguard::storage::SynthOptions options;
  if (a.Has("positions") && !absl::SimpleAtoi(a.Get("positions"), &options.positions)) {
    return Usage("--positions: not a number");
  }
  if (a.Has("poison-echoes") &&
      (!absl::SimpleAtoi(a.Get("poison-echoes"), &options.poison_echoes) ||
       options.poison_echoes < 0)) {
    return Usage("--poison-echoes: not a number >= 0");
  }
  auto meta = spikeguard::storage::SynthesizeCorpus(a.Get("out"), seed, *poisons, options);
  if (!meta.ok()) return Fail(meta.status());
  for (const auto& d : meta->domains) {
    std::cout << "domain " << d.name << ": " << d.documents << " documents, " << d.tokens
              << " tokens, weight " << d.weight << "\n";
  }
  for (const auto& p : meta->poisons) {
    std::cout << "poison " << spikeguard::storage::PoisonKindName(p.kind) << " at position "
              << p.position << ":";
    for (const auto& doc : p.documents) std::cout << " " << doc.domain << ":" << doc.document;
    std::cout << "\n";
    if (p.echoes.empty()) continue;
    std::cout << "echo " << spikeguard::storage::PoisonKindName(p.kind) << " at position "
              << p.position << ":";
    for (const auto& doc : p.echoes) std::cout << " " << doc.domain << ":" << doc.document;
    std::cout << "\n";
  }
  std::cout << "fingerprint " << meta->fingerprint << "\n";
  return 0;
}

int Train(const Args& a) {
  using spikeguard::worker::ReferenceWorker;
  ReferenceWorker::Options o;
  if (!a.Has("corpus")) return Usage("train needs --corpus");
  o.corpus_dir = a.Get("corpus");
  o.checkpoint_dir = a.Get("checkpoint-dir");
  if (a.Has("config")) {
    if (auto s = spikeguard::worker::ApplyConfigFile(a.Get("config"), &o.config); !s.ok()) {
      return Usage(std::string(s.message()));
    }
  }
  for (const auto& kv : a.All("set")) {
    if (auto s = spikeguard::worker::ApplyConfigAssignment(kv, &o.config); !s.ok()) {
      return Usage(std::string(s.message()));
    }
  }
  if (a.Has("steps") && !absl::SimpleAtoi(a.Get("steps"), &o.config.steps)) {
    return Usage("--steps: not a number");
  }
  o.telemetry_jsonl = a.Get("telemetry-out");
  o.use_daemon = !a.Has("no-daemon");
  if (o.use_daemon) {
    if (!a.Has("run")) return Usage("train needs --run (or --no-daemon)");
    o.client.address = a.Get("addr", "127.0.0.1:7070");
    o.client.run = a.Get("run");
    if (!absl::SimpleAtoi(a.Get("rank", "0"), &o.client.rank) ||
        !absl::SimpleAtoi(a.Get("world-size", "1"), &o.client.world_size)) {
      return Usage("--rank/--world-size: not a number");
    }
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    o.client.host = host;
    // Over the environment's settings (o.client.security starts from them).
    auto& security = o.client.security;
    if (a.Has("token-file")) security.SetTokenFile(a.Get("token-file"), "--token-file");
    if (a.Has("tls-ca")) security.SetTlsCa(a.Get("tls-ca"), "--tls-ca");
    if (a.Has("tls-cert")) security.SetTlsCert(a.Get("tls-cert"), "--tls-cert");
    if (a.Has("tls-key")) security.SetTlsKey(a.Get("tls-key"), "--tls-key");
    if (a.Has("tls-server-name")) {
      security.SetTlsServerName(a.Get("tls-server-name"), "--tls-server-name");
    }
    // Unreadable files are a usage error, reported before any training.
    if (auto resolved = security.Resolve(); !resolved.ok()) {
      return Usage(std::string(resolved.status().message()));
    }
  }
  if (!absl::SimpleAtoi(a.Get("generation", "0"), &o.generation)) {
    return Usage("--generation: not a number");
  }
  o.plan = a.Get("plan");
  o.resume_from = a.Get("resume");
  if (a.Has("fault")) {
    const std::string f = a.Get("fault");
    if (!absl::StartsWith(f, "bitflip:step=") ||
        !absl::SimpleAtoi(f.substr(std::string("bitflip:step=").size()), &o.bitflip_step)) {
      return Usage("--fault wants bitflip:step=S, got '" + f + "'");
    }
  }
  if (a.Has("lr-scale")) {
    double scale = 0;
    if (!absl::SimpleAtod(a.Get("lr-scale"), &scale) || !(scale > 0)) {
      return Usage("--lr-scale: not a positive number");
    }
    o.lr_scale = scale;
  }
  if (a.Has("stop-after") && !absl::SimpleAtoi(a.Get("stop-after"), &o.stop_after_step)) {
    return Usage("--stop-after: not a number");
  }
  double linger = 0;
  if (a.Has("linger-s") && !absl::SimpleAtod(a.Get("linger-s"), &linger)) {
    return Usage("--linger-s: not a number");
  }
  o.linger = absl::Seconds(linger);
  if (o.config.checkpoint_every > 0 && o.checkpoint_dir.empty()) o.config.checkpoint_every = 0;

  auto worker = ReferenceWorker::Create(o);
  if (!worker.ok()) return Fail(worker.status());
  SG_LOG(INFO) << "training " << o.config.model.Fingerprint() << " from step "
               << (*worker)->next_step() << " to " << o.config.steps << ", generation "
               << (*worker)->generation() << ", plan " << (*worker)->manifest().plan.ToString();
  if (auto s = (*worker)->Run(); !s.ok()) return Fail(s);
  std::cout << "done: step " << (*worker)->next_step() << ", param hash " << std::hex
            << (*worker)->ParamHash() << std::dec << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> words(argv + 1, argv + argc);
  absl::StatusOr<spikeguard::ParsedArgs> parsed =
      spikeguard::ParseArgs(words, Flags(), {"COMMAND", "SUBCOMMAND"}, 0);
  if (!parsed.ok()) return Usage(std::string(parsed.status().message()));
  const Args a{*std::move(parsed)};
  if (a.parsed.help) {
    std::cout << kUsage;
    return 0;
  }
  const std::vector<std::string>& positional = a.positional();
  if (positional.empty()) return Usage("no command");
  const std::string cmd = positional[0];
  if (cmd == "corpus" && positional.size() == 2 && positional[1] == "build") return CorpusBuild(a);
  if (cmd == "corpus" && positional.size() == 2 && positional[1] == "synth") return CorpusSynth(a);
  if (cmd == "train" && positional.size() == 1) return Train(a);
  return Usage("unknown command '" + cmd + "'");
}
