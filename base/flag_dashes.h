// flag_dashes.h
// -----------------------------------------------------------------------------
// Abseil flag names are C identifiers (`data_dir`), while people type
// `--data-dir`. DashesToUnderscores rewrites the name part of every
// `--some-flag[=value]` argument before absl::ParseCommandLine sees it.
//
//   std::vector<std::string> args = DashesToUnderscores(argc, argv);
//   std::vector<char*> ptrs = ArgvPointers(args);
//   absl::ParseCommandLine(static_cast<int>(ptrs.size()), ptrs.data());
#pragma once

#include <string>
#include <vector>

namespace spikeguard {

inline std::vector<std::string> DashesToUnderscores(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.size() > 2 && a[0] == '-' && a[1] == '-') {
      const size_t end = a.find('=');
      for (size_t k = 2; k < std::min(end, a.size()); ++k) {
        if (a[k] == '-') a[k] = '_';
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

inline std::vector<char*> ArgvPointers(std::vector<std::string>& args) {
  std::vector<char*> ptrs;
  for (auto& a : args) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  return ptrs;
}

}  // namespace spikeguard
