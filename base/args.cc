#include "base/args.h"

#include <cctype>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace spikeguard {

bool ParsedArgs::Has(absl::string_view name) const {
  return flags.find(std::string(name)) != flags.end();
}

std::optional<std::string> ParsedArgs::Get(absl::string_view name) const {
  auto it = flags.find(std::string(name));
  if (it == flags.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> ParsedArgs::GetAll(absl::string_view name) const {
  auto it = flags.find(std::string(name));
  if (it == flags.end()) return {};
  return it->second;
}

absl::StatusOr<ParsedArgs> ParseArgs(absl::Span<const std::string> words,
                                     absl::Span<const FlagSpec> flags,
                                     absl::Span<const std::string> positional_names,
                                     size_t min_positional) {
  ParsedArgs parsed;
  bool flags_done = false;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (flags_done || word.size() < 2 || word[0] != '-' ||
        // A negative number is an argument, not a flag.
        (word[1] != '-' && (std::isdigit(static_cast<unsigned char>(word[1])) || word[1] == '.'))) {
      parsed.positional.push_back(word);
      continue;
    }
    if (word == "--") {
      flags_done = true;
      continue;
    }
    if (word == "-h" || word == "--help") {
      parsed.help = true;
      continue;
    }
    if (!absl::StartsWith(word, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", word));
    }
    absl::string_view body = absl::string_view(word).substr(2);
    std::optional<std::string> value;
    if (size_t eq = body.find('='); eq != absl::string_view::npos) {
      value = std::string(body.substr(eq + 1));
      body = body.substr(0, eq);
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& f : flags) {
      if (f.name == body) spec = &f;
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", body));
    }
    if (spec->kind == FlagSpec::kBool) {
      if (value.has_value() && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("bad value for --", body, ": '", *value, "' (want true or false)"));
      }
      parsed.flags[spec->name] = {value.value_or("true")};
      continue;
    }
    if (!value.has_value()) {
      // "--run --gen 3" is a missing value, not a run named "--gen".
      if (i + 1 >= words.size() || absl::StartsWith(words[i + 1], "--")) {
        return absl::InvalidArgumentError(absl::StrCat("missing value for --", body));
      }
      value = words[++i];
    }
    std::vector<std::string>& values = parsed.flags[spec->name];
    if (spec->kind == FlagSpec::kValue) values.clear();
    values.push_back(*std::move(value));
  }
  if (parsed.help) return parsed;
  if (parsed.positional.size() < min_positional) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing argument ", positional_names[parsed.positional.size()]));
  }
  if (parsed.positional.size() > positional_names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed.positional[positional_names.size()], "'"));
  }
  return parsed;
}

absl::StatusOr<int64_t> ParseInt64(absl::string_view what, absl::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("bad number for ", what, ": '", text, "'"));
  }
  return value;
}

absl::StatusOr<double> ParseDouble(absl::string_view what, absl::string_view text) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("bad number for ", what, ": '", text, "'"));
  }
  return value;
}

}  // namespace spikeguard
