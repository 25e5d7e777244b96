#include "daemon/launch/launch_profiles.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "google/protobuf/text_format.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;
namespace fs = std::filesystem;
using launch::LaunchProfile;
using launch::Param;

namespace {

// Placeholders the launcher fills in itself.
const std::set<std::string>& Builtins() {
  static const auto* names = new std::set<std::string>{
      "rank",   "local_rank", "world_size",  "run",        "addr",           "generation",
      "resume", "plan",       "master_port", "corpus_dir", "checkpoint_root"};
  return *names;
}

constexpr size_t kMaxPathLength = 4096;
constexpr size_t kMaxFlagValue = 128;
constexpr uint32_t kDefaultStringLength = 64;
constexpr uint32_t kMaxStringLength = 256;
constexpr uint32_t kDefaultMaxItems = 32;

bool IsIdentifier(absl::string_view s, bool allow_dash) {
  if (s.empty() || s.size() > 64) return false;
  if (!absl::ascii_isalpha(s[0]) && s[0] != '_') return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '_' && !(allow_dash && c == '-')) return false;
  }
  return true;
}

bool IsProfileName(absl::string_view s) {
  if (s.empty() || s.size() > 64 || s[0] == '-' || s[0] == '.') return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-' && c != '.') return false;
  }
  return true;
}

// The placeholders of one argv element ("{name}" tokens).
std::vector<std::string> PlaceholdersOf(absl::string_view arg) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = arg.find('{', pos)) != absl::string_view::npos) {
    const size_t end = arg.find('}', pos);
    if (end == absl::string_view::npos) break;
    out.emplace_back(arg.substr(pos + 1, end - pos - 1));
    pos = end + 1;
  }
  return out;
}

// Weakly canonical absolute form of `path`; `..` and symlinks resolved as far
// as the path exists.
absl::StatusOr<fs::path> Canonical(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(path), ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(Quoted(path), ": ", ec.message()));
  return p;
}

bool Inside(const fs::path& path, const fs::path& root) {
  auto r = root.begin(), p = path.begin();
  for (; r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

absl::Status ValidateFlags(const std::string& field, const launch::FlagsParam& flags,
                           const std::string& value, std::vector<std::string>* items) {
  const std::set<std::string> allow(flags.allow().begin(), flags.allow().end());
  const uint32_t max_items = flags.max_items() > 0 ? flags.max_items() : kDefaultMaxItems;
  for (char c : value) {
    if (c != ' ' && !absl::ascii_isgraph(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", Quoted(value), " has a character other than printable ASCII"));
    }
  }
  std::vector<std::string> parts = absl::StrSplit(value, ' ', absl::SkipEmpty());
  if (parts.size() > max_items) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", parts.size(),
                                                   " items, at most ", max_items));
  }
  for (const std::string& item : parts) {
    if (!absl::StartsWith(item, "--")) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": item ", Quoted(item), " is not --name=value"));
    }
    const size_t eq = item.find('=');
    const std::string name = item.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (!IsIdentifier(name, /*allow_dash=*/true) || allow.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": option ", Quoted("--" + name), " is not allowed by the profile (allowed: ",
          absl::StrJoin(allow, ", "), ")"));
    }
    if (eq != std::string::npos) {
      const std::string v = item.substr(eq + 1);
      if (v.size() > kMaxFlagValue) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": value of --", name,
                                                       " is longer than ", kMaxFlagValue));
      }
      for (char c : v) {
        if (!absl::ascii_isalnum(c) && std::string("_.:@,=+-").find(c) == std::string::npos) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": value of --", name, " ", Quoted(v),
              " has a character outside letters, digits and _.:@,=+-"));
        }
      }
    }
    if (items) items->push_back(item);
  }
  return absl::OkStatus();
}

// Checks `value` against the parameter's type; `out` receives the text that
// is substituted (a path in its canonical form), `items` the items of a flags
// parameter.
absl::Status ValidateParam(const std::string& field, const Param& p, const std::string& value,
                           std::string* out, std::vector<std::string>* items) {
  if (out) *out = value;
  if (value.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": contains NUL"));
  }
  switch (p.type_case()) {
    case Param::kInt: {
      int64_t v = 0;
      const bool charset = !value.empty() && value.find_first_not_of("0123456789+-") == std::string::npos;
      if (!charset || !absl::SimpleAtoi(value, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quoted(value), " is not an integer"));
      }
      if (v < p.int_().min() || v > p.int_().max()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", v, " is out of range [",
                                                       p.int_().min(), ", ", p.int_().max(), "]"));
      }
      if (out) *out = absl::StrCat(v);
      return absl::OkStatus();
    }
    case Param::kFloat: {
      double v = 0;
      const bool charset =
          !value.empty() && value.find_first_not_of("0123456789+-.eE") == std::string::npos;
      if (!charset || !absl::SimpleAtod(value, &v) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quoted(value), " is not a finite number"));
      }
      if (v < p.float_().min() || v > p.float_().max()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " is out of range [",
                                                       p.float_().min(), ", ", p.float_().max(), "]"));
      }
      return absl::OkStatus();
    }
    case Param::kString: {
      const uint32_t max_len = p.string().max_length() > 0
                                   ? std::min(p.string().max_length(), kMaxStringLength)
                                   : kDefaultStringLength;
      if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
      if (value.size() > max_len) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(),
                                                       " bytes, at most ", max_len));
      }
      for (char c : value) {
        if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-') {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": ", Quoted(value), " has a character outside letters, digits and _.-"));
        }
      }
      if (value[0] == '-' || value.find_first_not_of('.') == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": ", Quoted(value), " may not start with '-' or be only dots"));
      }
      return absl::OkStatus();
    }
    case Param::kEnum: {
      for (const auto& allowed : p.enum_().value()) {
        if (value == allowed) return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quoted(value), " is not one of ",
                                                     absl::StrJoin(p.enum_().value(), ", ")));
    }
    case Param::kPath: {
      if (value.empty() || value[0] != '/' || value.size() > kMaxPathLength) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quoted(value),
                                                       " is not an absolute path"));
      }
      SG_ASSIGN_OR_RETURN(fs::path root, Canonical(p.path().root()));
      SG_ASSIGN_OR_RETURN(fs::path path, Canonical(value));
      if (!Inside(path, root)) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quoted(value), " resolves to ",
                                                       Quoted(path.string()), ", outside ",
                                                       Quoted(root.string())));
      }
      if (out) *out = path.string();
      return absl::OkStatus();
    }
    case Param::kFlags:
      return ValidateFlags(field, p.flags(), value, items);
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, ": the parameter has no type"));
  }
}

bool SlurmName(absl::string_view s) {
  if (s.empty() || s.size() > 64 || s[0] == '-') return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-') return false;
  }
  return true;
}

// "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS", "UNLIMITED".
bool SlurmTimeLimit(absl::string_view s) {
  if (s == "UNLIMITED" || s == "INFINITE") return true;
  if (s.empty() || s.size() > 20) return false;
  absl::string_view rest = s;
  const size_t dash = s.find('-');
  if (dash != absl::string_view::npos) {
    const absl::string_view days = s.substr(0, dash);
    if (days.empty() || days.find_first_not_of("0123456789") != absl::string_view::npos) return false;
    rest = s.substr(dash + 1);
  }
  std::vector<absl::string_view> parts = absl::StrSplit(rest, ':');
  if (parts.size() > 3) return false;
  for (absl::string_view part : parts) {
    if (part.empty() || part.find_first_not_of("0123456789") != absl::string_view::npos) return false;
  }
  return true;
}

const std::set<std::string>& SbatchAllowList() {
  static const auto* names = new std::set<std::string>{
      "exclusive", "gres",        "gpus",       "gpus-per-node", "gpus-per-task",
      "cpus-per-task", "mem",     "mem-per-cpu", "mem-per-gpu",  "constraint",
      "qos",       "reservation", "nodelist",   "exclude",       "hint",
      "requeue",   "no-requeue",  "signal",     "comment"};
  return *names;
}

absl::Status CheckSlurm(const std::string& where, const LaunchProfile& p) {
  const launch::SlurmOptions& s = p.slurm();
  const std::string w = absl::StrCat(where, ": slurm");
  if (p.argv().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(w, ": a Slurm profile needs an argv (the command of every task)"));
  }
  if (!s.partition().empty() && !SlurmName(s.partition())) {
    return absl::InvalidArgumentError(absl::StrCat(w, ".partition ", Quoted(s.partition()),
                                                   " wants letters, digits and _.-"));
  }
  if (!s.account().empty() && !SlurmName(s.account())) {
    return absl::InvalidArgumentError(absl::StrCat(w, ".account ", Quoted(s.account()),
                                                   " wants letters, digits and _.-"));
  }
  if (s.nodes() > 4096 || s.tasks_per_node() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat(w, ": nodes ", s.nodes(), " x tasks_per_node ", s.tasks_per_node(),
                     " is over the limit (4096 nodes, 1024 tasks per node)"));
  }
  if (!s.time_limit().empty() && !SlurmTimeLimit(s.time_limit())) {
    return absl::InvalidArgumentError(absl::StrCat(
        w, ".time_limit ", Quoted(s.time_limit()),
        " is not one of Slurm's forms (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, UNLIMITED)"));
  }
  for (const std::string& o : s.extra_sbatch_options()) {
    const std::string name = absl::StartsWith(o, "--") ? o.substr(2, o.find('=') - 2) : "";
    if (SbatchAllowList().count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          w, ".extra_sbatch_options ", Quoted(o), " is not allowed (allowed: --",
          absl::StrJoin(SbatchAllowList(), ", --"), ")"));
    }
    if (const size_t eq = o.find('='); eq != std::string::npos) {
      const std::string v = o.substr(eq + 1);
      if (v.empty() || v.size() > 128 ||
          v.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                              "_.:,=+-@[]%") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            w, ".extra_sbatch_options ", Quoted(o),
            ": the value wants letters, digits and _.:,=+-@[]% (no spaces, no '/')"));
      }
    }
  }
  if (!s.exec_path().empty() && (s.exec_path()[0] != '/' ||
                                 s.exec_path().find('{') != std::string::npos)) {
    return absl::InvalidArgumentError(
        absl::StrCat(w, ".exec_path ", Quoted(s.exec_path()), " is not an absolute path"));
  }
  if (s.master_port() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(w, ".master_port ", s.master_port(),
                                                   " is not a port"));
  }
  return absl::OkStatus();
}

absl::Status CheckProfile(const LaunchProfile& p) {
  const std::string where = absl::StrCat("profile ", Quoted(p.name()));
  if (!IsProfileName(p.name())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": name wants letters, digits and _.-"));
  }
  // No argv: an external profile (workers started by the operator's own
  // scheduler, torchrun or Slurm); it gives the run its checkpoint and
  // corpus roots and limits, and the daemon never launches it.
  if (!p.argv().empty() && (p.argv(0).empty() || p.argv(0)[0] != '/' ||
                            p.argv(0).find('{') != std::string::npos)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": argv[0] must be an absolute path without placeholders"));
  }
  std::map<std::string, const Param*> params;
  for (const Param& param : p.param()) {
    if (!IsIdentifier(param.name(), false) || Builtins().count(param.name()) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": parameter name ", Quoted(param.name()),
                                                     " is not an identifier or is a built-in"));
    }
    if (!params.emplace(param.name(), &param).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": parameter ", param.name(), " twice"));
    }
    const std::string pw = absl::StrCat(where, ": parameter ", param.name());
    switch (param.type_case()) {
      case Param::kInt:
        if (param.int_().min() > param.int_().max()) {
          return absl::InvalidArgumentError(absl::StrCat(pw, ": min > max"));
        }
        break;
      case Param::kFloat:
        if (!std::isfinite(param.float_().min()) || !std::isfinite(param.float_().max()) ||
            param.float_().min() > param.float_().max()) {
          return absl::InvalidArgumentError(absl::StrCat(pw, ": min/max not a finite range"));
        }
        break;
      case Param::kEnum:
        if (param.enum_().value().empty()) {
          return absl::InvalidArgumentError(absl::StrCat(pw, ": enum without values"));
        }
        break;
      case Param::kPath:
        if (param.path().root().empty() || param.path().root()[0] != '/') {
          return absl::InvalidArgumentError(absl::StrCat(pw, ": path root must be absolute"));
        }
        break;
      case Param::kFlags:
        for (const auto& a : param.flags().allow()) {
          if (!IsIdentifier(a, true)) {
            return absl::InvalidArgumentError(absl::StrCat(pw, ": allowed option ", Quoted(a),
                                                           " is not a name"));
          }
        }
        break;
      case Param::kString:
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(pw, ": no type"));
    }
    if (param.has_default_value() && !(param.type_case() == Param::kFlags &&
                                       param.default_value().empty())) {
      SG_RETURN_IF_ERROR(ValidateParam(absl::StrCat(pw, " default"), param,
                                       param.default_value(), nullptr, nullptr));
    }
  }
  for (int i = 0; i < p.argv_size(); ++i) {
    for (const std::string& name : PlaceholdersOf(p.argv(i))) {
      auto it = params.find(name);
      if (Builtins().count(name) == 0 && it == params.end()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": argv[", i, "] uses ",
                                                       Quoted("{" + name + "}"),
                                                       ", neither built in nor a declared parameter"));
      }
      if (it != params.end() && it->second->type_case() == Param::kFlags &&
          p.argv(i) != "{" + name + "}") {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": argv[", i, "]: the flags parameter {", name, "} must be a whole element"));
      }
    }
  }
  for (const auto& name : p.env_allow()) {
    if (!IsIdentifier(name, false)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": env_allow ", Quoted(name)));
    }
  }
  for (const auto& [k, v] : p.env()) {
    if (!IsIdentifier(k, false) || v.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": env ", Quoted(k)));
    }
  }
  if (p.checkpoint_root().empty() || p.checkpoint_root()[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(where, ": checkpoint_root must be absolute"));
  }
  if (!p.corpus_root().empty() && p.corpus_root()[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(where, ": corpus_root must be absolute"));
  }
  if (!p.workdir().empty() && p.workdir()[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(where, ": workdir must be absolute"));
  }
  if (p.max_restarts() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": max_restarts negative"));
  }
  if (p.has_slurm()) SG_RETURN_IF_ERROR(CheckSlurm(where, p));
  return absl::OkStatus();
}

const Param* FindParam(const LaunchProfile& p, const std::string& name) {
  for (const Param& param : p.param()) {
    if (param.name() == name) return &param;
  }
  return nullptr;
}

std::string ParamField(const std::string& prefix, const std::string& name) {
  return absl::StrCat(prefix.empty() ? "" : prefix + ".", "params[", Quoted(name), "]");
}

// Every declared parameter's value: validated text and flags items.
absl::Status ResolveParams(const LaunchProfile& p, const v1::RunSpec& spec,
                           const std::string& prefix, std::map<std::string, std::string>* values,
                           std::map<std::string, std::vector<std::string>>* items) {
  for (const auto& [name, value] : spec.params()) {
    if (FindParam(p, name) == nullptr) {
      std::vector<std::string> declared;
      for (const Param& param : p.param()) declared.push_back(param.name());
      return absl::InvalidArgumentError(absl::StrCat(
          ParamField(prefix, name), ": profile ", Quoted(p.name()),
          " declares no such parameter (declared: ", absl::StrJoin(declared, ", "), ")"));
    }
  }
  for (const Param& param : p.param()) {
    auto it = spec.params().find(param.name());
    std::string value;
    if (it != spec.params().end()) {
      value = it->second;
    } else if (param.has_default_value()) {
      value = param.default_value();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(ParamField(prefix, param.name()),
                                                     ": missing (profile ", Quoted(p.name()),
                                                     " requires it)"));
    }
    std::string text;
    std::vector<std::string> list;
    if (param.type_case() == Param::kFlags && value.empty()) {
      // No options.
    } else {
      SG_RETURN_IF_ERROR(
          ValidateParam(ParamField(prefix, param.name()), param, value, &text, &list));
    }
    (*values)[param.name()] = text;
    (*items)[param.name()] = list;
  }
  return absl::OkStatus();
}

std::string SubstituteAll(const std::string& arg, const std::map<std::string, std::string>& values) {
  std::string out;
  size_t pos = 0;
  while (pos < arg.size()) {
    const size_t open = arg.find('{', pos);
    if (open == std::string::npos) break;
    const size_t close = arg.find('}', open);
    if (close == std::string::npos) break;
    auto it = values.find(arg.substr(open + 1, close - open - 1));
    out.append(arg, pos, open - pos);
    if (it != values.end()) {
      out += it->second;
    } else {
      out.append(arg, open, close - open + 1);
    }
    pos = close + 1;
  }
  out.append(arg, std::min(pos, arg.size()), std::string::npos);
  return out;
}

}  // namespace

uint32_t SlurmWorldSize(const launch::SlurmOptions& s) {
  return std::max<uint32_t>(1, s.nodes()) * std::max<uint32_t>(1, s.tasks_per_node());
}

std::string Quoted(const std::string& value) {
  std::string v = value.size() > 64 ? value.substr(0, 64) : value;
  return absl::StrCat("'", absl::CHexEscape(v), value.size() > 64 ? "...'" : "'");
}

bool IsLegacySpec(const v1::RunSpec& spec) {
  return spec.profile().empty() &&
         (!spec.command().empty() || !spec.env().empty() || !spec.workdir().empty());
}

std::string LegacyRunMessage(const std::string& run) {
  return absl::StrCat("run '", run,
                      "' was created with a free command line before launch profiles and is not "
                      "launched; an admin must map it to a profile: spikectl runs set-profile ",
                      run, " --profile=NAME [--param k=v ...]");
}

absl::StatusOr<std::map<std::string, LaunchProfile>> LaunchProfiles::Parse(
    const std::string& text, const std::string& source) {
  launch::LaunchProfiles file;
  if (!google::protobuf::TextFormat::ParseFromString(text, &file)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a LaunchProfiles text proto"));
  }
  std::map<std::string, LaunchProfile> out;
  for (const LaunchProfile& p : file.profile()) {
    if (auto s = CheckProfile(p); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
    }
    if (!out.emplace(p.name(), p).second) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": profile ", Quoted(p.name()), " twice"));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<LaunchProfiles>> LaunchProfiles::FromText(const std::string& text) {
  SG_ASSIGN_OR_RETURN(auto parsed, Parse(text, "launch profiles"));
  auto out = std::make_unique<LaunchProfiles>();
  absl::MutexLock lock(&out->mu_);
  out->profiles_ = std::move(parsed);
  return out;
}

absl::StatusOr<std::unique_ptr<LaunchProfiles>> LaunchProfiles::Load(const std::string& path) {
  auto out = std::make_unique<LaunchProfiles>();
  out->path_ = path;
  SG_RETURN_IF_ERROR(out->ReloadIfChanged());
  absl::MutexLock lock(&out->mu_);
  SG_LOG(INFO) << "launch profiles: " << out->profiles_.size() << " from " << path;
  return out;
}

absl::Status LaunchProfiles::ReloadIfChanged() {
  if (path_.empty()) return absl::OkStatus();
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--launch-profiles ", path_, ": ", std::strerror(errno)));
  }
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  {
    absl::MutexLock lock(&mu_);
    if (mtime == mtime_ns_ && st.st_size == size_) return absl::OkStatus();
  }
  std::ifstream f(path_);
  std::stringstream text;
  text << f.rdbuf();
  if (!f) {
    return absl::FailedPreconditionError(absl::StrCat("--launch-profiles ", path_, ": cannot read"));
  }
  SG_ASSIGN_OR_RETURN(auto parsed, Parse(text.str(), path_));
  absl::MutexLock lock(&mu_);
  const bool first = size_ < 0;
  profiles_ = std::move(parsed);
  mtime_ns_ = mtime;
  size_ = st.st_size;
  if (!first) SG_LOG(INFO) << "launch profiles reloaded from " << path_ << ": " << profiles_.size();
  return absl::OkStatus();
}

absl::StatusOr<LaunchProfile> LaunchProfiles::Find(const std::string& name) {
  if (auto s = ReloadIfChanged(); !s.ok()) {
    SG_LOG(ERROR) << "launch profiles not reloaded (the previous ones stay): " << s.message();
  }
  absl::MutexLock lock(&mu_);
  auto it = profiles_.find(name);
  if (it == profiles_.end()) {
    std::vector<std::string> known;
    for (const auto& [n, p] : profiles_) known.push_back(n);
    return absl::NotFoundError(absl::StrCat(
        "no launch profile ", Quoted(name), " (known: ",
        known.empty() ? "none; start spikeguardd with --launch-profiles FILE"
                      : absl::StrJoin(known, ", "),
        ")"));
  }
  return it->second;
}

std::vector<std::string> LaunchProfiles::Names() {
  (void)ReloadIfChanged();
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [n, p] : profiles_) out.push_back(n);
  return out;
}

absl::Status LaunchProfiles::ValidateSpec(const v1::RunSpec& spec, uint32_t world_size,
                                          const std::string& field) {
  const std::string prefix = field.empty() ? "" : field + ".";
  if (!spec.command().empty() || !spec.env().empty() || !spec.workdir().empty()) {
    const char* which = !spec.command().empty() ? "command" : !spec.env().empty() ? "env" : "workdir";
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, which,
        ": refused; launch commands come from daemon-side launch profiles (spikeguardd "
        "--launch-profiles): name one in ",
        prefix, "profile and give its parameters in ", prefix, "params"));
  }
  if (spec.profile().empty()) {
    if (!spec.params().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "params: given without a profile"));
    }
    if (!spec.manifest().corpus_dir().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "manifest.corpus_dir: ", Quoted(spec.manifest().corpus_dir()),
          " refused: a corpus dir is allowed only under a launch profile's corpus_root"));
    }
    return absl::OkStatus();
  }
  auto profile = Find(spec.profile());
  if (!profile.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "profile: ", profile.status().message()));
  }
  if (profile->max_world_size() > 0 && world_size > profile->max_world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: ", world_size,
                                                   " is over the max_world_size ",
                                                   profile->max_world_size(), " of profile ",
                                                   Quoted(profile->name())));
  }
  if (profile->has_slurm() && world_size > 0 &&
      world_size != SlurmWorldSize(profile->slurm())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", world_size, " is not the ", SlurmWorldSize(profile->slurm()),
        " tasks of Slurm profile ", Quoted(profile->name()), " (nodes ",
        std::max<uint32_t>(1, profile->slurm().nodes()), " x tasks_per_node ",
        std::max<uint32_t>(1, profile->slurm().tasks_per_node()), ")"));
  }
  std::map<std::string, std::string> values;
  std::map<std::string, std::vector<std::string>> items;
  SG_RETURN_IF_ERROR(ResolveParams(*profile, spec, field, &values, &items));
  if (const std::string& dir = spec.manifest().corpus_dir(); !dir.empty()) {
    const std::string f = absl::StrCat(prefix, "manifest.corpus_dir: ");
    if (profile->corpus_root().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(f, Quoted(dir), " refused: profile ",
                                                     Quoted(profile->name()), " has no corpus_root"));
    }
    if (dir[0] != '/' || dir.size() > kMaxPathLength || dir.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(f, Quoted(dir), " is not an absolute path"));
    }
    SG_ASSIGN_OR_RETURN(fs::path root, Canonical(profile->corpus_root()));
    SG_ASSIGN_OR_RETURN(fs::path path, Canonical(dir));
    if (!Inside(path, root)) {
      return absl::InvalidArgumentError(absl::StrCat(f, Quoted(dir), " resolves to ",
                                                     Quoted(path.string()), ", outside the corpus root ",
                                                     Quoted(root.string()), " of profile ",
                                                     Quoted(profile->name())));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchCommand> LaunchProfiles::Build(const std::string& run, const v1::RunSpec& spec,
                                                    uint32_t world_size,
                                                    const std::map<std::string, std::string>& values) {
  if (IsLegacySpec(spec)) return absl::FailedPreconditionError(LegacyRunMessage(run));
  if (spec.profile().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "' names no launch profile; map it with spikectl runs set-profile ", run,
        " --profile=NAME"));
  }
  if (auto s = ValidateSpec(spec, world_size, "spec"); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "' no longer matches its launch profile: ", s.message()));
  }
  SG_ASSIGN_OR_RETURN(LaunchProfile profile, Find(spec.profile()));
  if (profile.argv().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "': launch profile ", Quoted(profile.name()),
        " has no argv (its workers are started outside the daemon); the daemon launches only "
        "runs whose profile has a command line"));
  }
  std::map<std::string, std::string> subs;
  std::map<std::string, std::vector<std::string>> items;
  SG_RETURN_IF_ERROR(ResolveParams(profile, spec, "spec", &subs, &items));
  for (const auto& [k, v] : values) subs[k] = v;
  subs["run"] = run;
  if (!spec.manifest().corpus_dir().empty()) {
    SG_ASSIGN_OR_RETURN(fs::path dir, Canonical(spec.manifest().corpus_dir()));
    subs["corpus_dir"] = dir.string();
  } else {
    subs["corpus_dir"] = "";
  }
  SG_ASSIGN_OR_RETURN(std::optional<std::string> root, CheckpointRoot(run, spec));
  subs["checkpoint_root"] = root.value_or("");

  LaunchCommand cmd;
  for (const std::string& arg : profile.argv()) {
    if (arg.size() > 2 && arg.front() == '{' && arg.back() == '}') {
      auto it = items.find(arg.substr(1, arg.size() - 2));
      if (it != items.end() && FindParam(profile, it->first)->type_case() == Param::kFlags) {
        for (const auto& item : it->second) cmd.argv.push_back(item);
        continue;
      }
    }
    std::string expanded = SubstituteAll(arg, subs);
    const bool had_placeholder = expanded != arg;
    if (had_placeholder && expanded.empty()) {
      // "--resume {resume}" with nothing to resume from: drop the flag too.
      if (!cmd.argv.empty() && absl::StartsWith(cmd.argv.back(), "--") &&
          cmd.argv.back().find('=') == std::string::npos && cmd.argv.size() > 1) {
        cmd.argv.pop_back();
      }
      continue;
    }
    if (had_placeholder && absl::EndsWith(expanded, "=") && absl::StartsWith(expanded, "--")) {
      continue;  // "--resume={resume}" with nothing to resume from
    }
    cmd.argv.push_back(std::move(expanded));
  }
  for (const auto& name : profile.env_allow()) {
    if (const char* v = std::getenv(name.c_str()); v != nullptr) cmd.env[name] = v;
  }
  for (const auto& [k, v] : profile.env()) cmd.env[k] = v;
  cmd.workdir = profile.workdir();
  cmd.max_restarts = profile.max_restarts();
  return cmd;
}

absl::StatusOr<std::string> LaunchProfiles::CorpusDir(const std::string& run,
                                                      const v1::RunSpec& spec) {
  const std::string& dir = spec.manifest().corpus_dir();
  if (dir.empty()) {
    return absl::NotFoundError(absl::StrCat("run '", run, "' has no manifest with a corpus"));
  }
  const std::string what = absl::StrCat("corpus dir ", Quoted(dir), " of run '", run, "'");
  if (spec.profile().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " is refused: a corpus dir is allowed only under a launch profile's corpus_root"));
  }
  auto profile = Find(spec.profile());
  if (!profile.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", profile.status().message()));
  }
  if (profile->corpus_root().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is refused: profile ",
                                                      Quoted(profile->name()), " has no corpus_root"));
  }
  if (dir[0] != '/' || dir.size() > kMaxPathLength || dir.find('\0') != std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is not an absolute path"));
  }
  auto root = Canonical(profile->corpus_root());
  auto path = Canonical(dir);
  if (!root.ok() || !path.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", (root.ok() ? path : root).status().message()));
  }
  if (!Inside(*path, *root)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " now resolves to ", Quoted(path->string()), ", outside the corpus root ",
        Quoted(root->string()), " of profile ", Quoted(profile->name()),
        " (replaced by a symbolic link since the run was created?); it is not read"));
  }
  return path->string();
}

absl::StatusOr<std::optional<std::string>> LaunchProfiles::CheckpointRoot(const std::string& run,
                                                                          const v1::RunSpec& spec) {
  if (spec.profile().empty()) return std::optional<std::string>();
  SG_ASSIGN_OR_RETURN(LaunchProfile profile, Find(spec.profile()));
  return std::optional<std::string>(absl::StrReplaceAll(profile.checkpoint_root(), {{"{run}", run}}));
}

}  // namespace spikeguard::daemon
