// flag_usage.h
// -----------------------------------------------------------------------------
// Makes `--help` list a program's own flags. Abseil's --help (and
// --helpshort) list only the flags defined in a file named after the program
// (`spikeguardd.cc`, `spikeguardd_main.cc`); ours live in main.cc or
// daemon_main.cc, so --help printed "No flags matched" and only --helpfull
// (every flag of every library, gRPC's included) showed them.
// SetFlagsUsage sets the usage line and says which source file(s) define the
// program's flags; call it before absl::ParseCommandLine, with __FILE__ from
// the file that holds the ABSL_FLAG definitions (the same string ABSL_FLAG
// records, so the match is exact):
//
//   spikeguard::SetFlagsUsage("spikeguardd --listen=HOST:PORT", {__FILE__});
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/string_view.h"

namespace spikeguard {

inline void SetFlagsUsage(absl::string_view usage, std::vector<std::string> flag_files) {
  absl::SetProgramUsageMessage(usage);
  // Abseil hands the filter the file name with its leading slashes removed
  // (its default normalize_filename), so an absolute __FILE__ is compared
  // in that form too; a relative one (a compiler cache's base dir) has none.
  auto normalized = [](absl::string_view file) {
    const size_t start = file.find_first_not_of("\\/");
    return start == absl::string_view::npos ? absl::string_view() : file.substr(start);
  };
  auto own = [files = std::move(flag_files), normalized](absl::string_view file) {
    for (const std::string& f : files) {
      if (normalized(file) == normalized(f)) return true;
    }
    return false;
  };
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = own;
  config.contains_help_flags = own;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace spikeguard
