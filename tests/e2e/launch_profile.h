// The launch profile the e2e tests and the diagnosis bench run the reference
// worker from (spikeguardd --launch-profiles): the daemon executes nothing a
// RunSpec sends, so a test names this profile, the scenario, and the worker
// options it wants (the "flags" parameter "args", each "--name=value").
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace spikeguard::testing {

// Writes the profile "ref-worker" to `path`: WORKER train with the
// scenario's config from `scenario_dir`, checkpoints in DIR/ckpt-RANK, the
// run's corpus and checkpoints confined to `dir`.
inline void WriteRefWorkerProfile(const std::string& path, const std::string& dir,
                                  const std::string& worker, const std::string& scenario_dir) {
  std::ofstream f(path);
  f << "profile {\n  name: \"ref-worker\"\n";
  for (const std::string& a :
       {worker, std::string("train"), std::string("--corpus={corpus_dir}"),
        "--checkpoint-dir=" + dir + "/ckpt-{rank}", "--config=" + scenario_dir + "/{scenario}.conf",
        std::string("--addr={addr}"), std::string("--run={run}"), std::string("--rank={rank}"),
        std::string("--world-size={world_size}"), std::string("--generation={generation}"),
        std::string("--resume={resume}"), std::string("--plan={plan}"), std::string("--linger-s=300"),
        std::string("{args}")}) {
    f << "  argv: \"" << a << "\"\n";
  }
  for (const char* e :
       {"PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"}) {
    f << "  env_allow: \"" << e << "\"\n";
  }
  f << "  checkpoint_root: \"" << dir << "\"\n"
    << "  corpus_root: \"" << dir << "\"\n"
    << "  max_world_size: 8\n"
    << "  param { name: \"scenario\" string {} }\n"
    << "  param { name: \"args\" flags { allow: \"steps\" allow: \"set\" allow: \"fault\" "
       "allow: \"linger-s\" allow: \"stop-after\" allow: \"lr-scale\" max_items: 64 } "
       "default_value: \"\" }\n"
    << "}\n";
}

// Worker options as the profile's "args" parameter: "--name value" pairs
// become single "--name=value" items.
inline std::string FlagsParam(const std::vector<std::string>& extra_args) {
  std::vector<std::string> items;
  for (size_t i = 0; i < extra_args.size(); ++i) {
    std::string item = extra_args[i];
    if (item.rfind("--", 0) == 0 && item.find('=') == std::string::npos &&
        i + 1 < extra_args.size() && extra_args[i + 1].rfind("--", 0) != 0) {
      item += "=" + extra_args[++i];
    }
    items.push_back(item);
  }
  return absl::StrJoin(items, " ");
}

// A RunSpec (text) naming the profile, the scenario and the worker options,
// with the manifest's corpus dir (and `manifest`, more Manifest fields).
inline void WriteRefWorkerSpec(const std::string& path, const std::string& scenario,
                               const std::vector<std::string>& extra_args,
                               const std::string& corpus_dir, const std::string& manifest = "") {
  std::ofstream f(path);
  f << "profile: \"ref-worker\"\n"
    << "params { key: \"scenario\" value: \"" << scenario << "\" }\n"
    << "params { key: \"args\" value: \"" << FlagsParam(extra_args) << "\" }\n"
    << "manifest { corpus_dir: \"" << corpus_dir << "\" " << manifest << " }\n";
}

}  // namespace spikeguard::testing
