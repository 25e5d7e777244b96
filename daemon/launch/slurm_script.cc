#include "daemon/launch/slurm_script.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace spikeguard::daemon {
namespace {

constexpr absl::string_view kBanner =
    "# spikeguard batch script (written by spikeguardd; data, not a shell script)";

bool Absolute(const std::string& p) { return !p.empty() && p[0] == '/'; }

}  // namespace

absl::StatusOr<std::string> RenderSlurmScript(const SlurmScript& s) {
  if (!Absolute(s.exec_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("slurm script: the interpreter '", s.exec_path, "' is not an absolute path"));
  }
  if (!Absolute(s.srun)) {
    return absl::InvalidArgumentError(absl::StrCat("slurm script: srun '", s.srun, "' is not absolute"));
  }
  if (s.argv.empty() || !Absolute(s.argv[0])) {
    return absl::InvalidArgumentError("slurm script: the rank's argv[0] must be an absolute path");
  }
  std::string out = absl::StrCat("#!", s.exec_path, "\n", kBanner, "\n");
  absl::StrAppend(&out, "srun ", absl::CEscape(s.srun), "\n");
  for (const auto& o : s.srun_options) absl::StrAppend(&out, "srun_option ", absl::CEscape(o), "\n");
  absl::StrAppend(&out, "master_port ", s.master_port, "\n");
  for (const auto& a : s.argv) absl::StrAppend(&out, "arg ", absl::CEscape(a), "\n");
  return out;
}

absl::StatusOr<SlurmScript> ParseSlurmScript(absl::string_view text) {
  SlurmScript s;
  int n = 0;
  bool have_srun = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    if (n == 1) {
      if (!absl::ConsumePrefix(&line, "#!")) {
        return absl::InvalidArgumentError("slurm script: line 1 is not a #! line");
      }
      s.exec_path = std::string(line);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    const absl::string_view key = line.substr(0, space);
    const absl::string_view raw = space == absl::string_view::npos ? "" : line.substr(space + 1);
    std::string value;
    std::string error;
    if (!absl::CUnescape(raw, &value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("slurm script line ", n, ": bad escape (", error, ")"));
    }
    if (key == "srun") {
      s.srun = value;
      have_srun = true;
    } else if (key == "srun_option") {
      s.srun_options.push_back(value);
    } else if (key == "master_port") {
      if (!absl::SimpleAtoi(value, &s.master_port) || s.master_port < 0 || s.master_port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("slurm script line ", n, ": master_port '", value, "' is not a port"));
      }
    } else if (key == "arg") {
      s.argv.push_back(value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "slurm script line ", n, ": '", absl::CHexEscape(key.substr(0, 40)),
          "' is not one of srun, srun_option, master_port, arg"));
    }
  }
  if (!have_srun || !Absolute(s.srun)) {
    return absl::InvalidArgumentError("slurm script: no absolute 'srun' line");
  }
  if (s.argv.empty() || !Absolute(s.argv[0])) {
    return absl::InvalidArgumentError("slurm script: no 'arg' lines, or argv[0] is not absolute");
  }
  return s;
}

absl::StatusOr<std::string> FirstSlurmHost(absl::string_view nodelist) {
  nodelist = absl::StripAsciiWhitespace(nodelist);
  // The first entry: up to a ',' that is outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const absl::string_view first = nodelist.substr(0, end);
  if (first.empty()) return absl::InvalidArgumentError("empty Slurm node list");
  const size_t open = first.find('[');
  if (open == absl::string_view::npos) return std::string(first);
  const size_t close = first.find(']', open);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("Slurm node list '", nodelist, "': no ']'"));
  }
  // "node[07-09,12]suffix": the first number of the range keeps its digits.
  absl::string_view range = first.substr(open + 1, close - open - 1);
  range = range.substr(0, range.find_first_of(",-"));
  if (range.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("Slurm node list '", nodelist, "': empty range"));
  }
  return absl::StrCat(first.substr(0, open), range, first.substr(close + 1));
}

absl::StatusOr<SlurmTask> SlurmTaskFromEnv(
    const std::function<const char*(const char*)>& getenv) {
  auto number = [&](const char* name, int* out) -> absl::Status {
    const char* v = getenv(name);
    if (v == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " is not set: not a Slurm task"));
    if (!absl::SimpleAtoi(v, out) || *out < 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, "='", v, "' is not a count"));
    }
    return absl::OkStatus();
  };
  SlurmTask t;
  if (auto s = number("SLURM_PROCID", &t.rank); !s.ok()) return s;
  if (auto s = number("SLURM_NTASKS", &t.world_size); !s.ok()) return s;
  if (auto s = number("SLURM_LOCALID", &t.local_rank); !s.ok()) return s;
  if (t.world_size < 1 || t.rank >= t.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_PROCID ", t.rank, " is not below SLURM_NTASKS ", t.world_size));
  }
  // Tasks on this node: --ntasks-per-node, else the first count of
  // SLURM_TASKS_PER_NODE ("2(x3),1").
  t.local_world_size = 1;
  if (const char* per = getenv("SLURM_NTASKS_PER_NODE"); per != nullptr) {
    if (!absl::SimpleAtoi(per, &t.local_world_size)) t.local_world_size = 1;
  } else if (const char* tpn = getenv("SLURM_TASKS_PER_NODE"); tpn != nullptr) {
    absl::string_view v(tpn);
    v = v.substr(0, v.find_first_of("(,"));
    if (!absl::SimpleAtoi(v, &t.local_world_size)) t.local_world_size = 1;
  }
  if (t.local_world_size < 1) t.local_world_size = 1;
  const char* nodes = getenv("SLURM_JOB_NODELIST");
  if (nodes == nullptr) nodes = getenv("SLURM_NODELIST");
  if (nodes == nullptr) return absl::InvalidArgumentError("SLURM_JOB_NODELIST is not set");
  auto first = FirstSlurmHost(nodes);
  if (!first.ok()) return first.status();
  t.master_addr = *first;
  return t;
}

std::vector<std::string> ExpandTaskArgv(const std::vector<std::string>& argv, const SlurmTask& task) {
  std::vector<std::string> out;
  out.reserve(argv.size());
  const std::string rank = absl::StrCat(task.rank);
  const std::string local = absl::StrCat(task.local_rank);
  const std::string world = absl::StrCat(task.world_size);
  for (const auto& a : argv) {
    out.push_back(absl::StrReplaceAll(
        a, {{"{rank}", rank}, {"{local_rank}", local}, {"{world_size}", world}}));
  }
  return out;
}

}  // namespace spikeguard::daemon
