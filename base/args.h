// args.h
// -----------------------------------------------------------------------------
// The one command-line parser of the programs whose flags differ by
// subcommand or mode: spikectl's subcommands, spikeguard-worker (corpus
// build|synth, train) and spikeguard-detect (--trace | --generate). The
// daemon and spikeguard-tracegen use Abseil flags.
//
// Each command declares the flags and positional arguments it takes; the
// parser turns its words into a `ParsedArgs` or a one-line reason why they
// are wrong (the program prints it with its usage and exits 2). Flags are
// written `--name=value` or `--name value`; `--` ends the flags. Hand-rolled
// rather than absl::flags because flags are per subcommand and must be
// reported, not fatal.
//
//   const std::vector<FlagSpec> kFlags = {{"run", FlagSpec::kValue},
//                                         {"skip", FlagSpec::kRepeated}};
//   absl::StatusOr<ParsedArgs> args = ParseArgs(words, kFlags, {"ID"}, 1);
//   if (!args.ok()) { /* usage error: args.status().message() */ }
//   std::optional<std::string> run = args->Get("run");
//   absl::StatusOr<int64_t> id = ParseInt64("ID", args->positional[0]);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace spikeguard {

struct FlagSpec {
  enum Kind {
    kValue,     // --name=value; given twice, the last one wins
    kRepeated,  // --name=value, may repeat; every value is kept in order
    kBool,      // --name (or --name=true|false)
  };
  std::string name;  // without the leading dashes
  Kind kind = kValue;
};

struct ParsedArgs {
  std::map<std::string, std::vector<std::string>> flags;
  std::vector<std::string> positional;
  bool help = false;  // -h or --help appeared anywhere

  bool Has(absl::string_view name) const;
  // The last value of a flag, if it was given.
  std::optional<std::string> Get(absl::string_view name) const;
  // Every value of a repeated flag, in order.
  std::vector<std::string> GetAll(absl::string_view name) const;
};

// Parses `words` against `flags`. Positional arguments must number between
// `min_positional` and `positional_names.size()`; the names appear in the
// error of a missing one. `-h`/`--help` set `help` and skip the count checks,
// so help works on otherwise incomplete command lines.
absl::StatusOr<ParsedArgs> ParseArgs(absl::Span<const std::string> words,
                                     absl::Span<const FlagSpec> flags,
                                     absl::Span<const std::string> positional_names,
                                     size_t min_positional);

// Number parsing with errors that name what was being parsed, e.g.
// "bad number for --to-step: 'abc'".
absl::StatusOr<int64_t> ParseInt64(absl::string_view what, absl::string_view text);
absl::StatusOr<double> ParseDouble(absl::string_view what, absl::string_view text);

}  // namespace spikeguard
