#include "daemon/launch/slurm_cli.h"

#include <cctype>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/subprocess.h"

namespace spikeguard::daemon {
namespace {

constexpr std::pair<SlurmJobState, absl::string_view> kStates[] = {
    {SlurmJobState::kPending, "PENDING"},       {SlurmJobState::kRunning, "RUNNING"},
    {SlurmJobState::kSuspended, "SUSPENDED"},   {SlurmJobState::kCompleting, "COMPLETING"},
    {SlurmJobState::kCompleted, "COMPLETED"},   {SlurmJobState::kFailed, "FAILED"},
    {SlurmJobState::kCancelled, "CANCELLED"},   {SlurmJobState::kTimeout, "TIMEOUT"},
    {SlurmJobState::kNodeFail, "NODE_FAIL"},    {SlurmJobState::kPreempted, "PREEMPTED"},
    {SlurmJobState::kOutOfMemory, "OUT_OF_MEMORY"}, {SlurmJobState::kBootFail, "BOOT_FAIL"},
    {SlurmJobState::kDeadline, "DEADLINE"},     {SlurmJobState::kRequeued, "REQUEUED"},
};

// Splits "K1=v1 K2=v two K3=v3" into fields. A value may hold spaces
// (Command=, WorkDir=, Comment=): a field starts only where a space is
// followed by a key (letters, digits, '_', ':', '/', '.') and '='.
std::map<std::string, std::string> Fields(absl::string_view line) {
  std::map<std::string, std::string> out;
  auto key_at = [&](size_t i) -> size_t {  // length of "Key" if "Key=" starts at i
    size_t j = i;
    if (j >= line.size() || !std::isalpha(static_cast<unsigned char>(line[j]))) return 0;
    while (j < line.size() && (std::isalnum(static_cast<unsigned char>(line[j])) ||
                               line[j] == '_' || line[j] == ':' || line[j] == '/' || line[j] == '.')) {
      ++j;
    }
    return j < line.size() && line[j] == '=' ? j - i : 0;
  };
  size_t i = 0;
  while (i < line.size() && line[i] == ' ') ++i;
  while (i < line.size()) {
    const size_t klen = key_at(i);
    if (klen == 0) break;
    const std::string key(line.substr(i, klen));
    size_t v = i + klen + 1;
    size_t end = v;
    while (end < line.size()) {
      if (line[end] == ' ' && (end + 1 >= line.size() || key_at(end + 1) > 0)) break;
      ++end;
    }
    out[key] = std::string(line.substr(v, end - v));
    i = end;
    while (i < line.size() && line[i] == ' ') ++i;
  }
  return out;
}

}  // namespace

absl::string_view SlurmJobStateName(SlurmJobState s) {
  for (const auto& [state, name] : kStates) {
    if (state == s) return name;
  }
  return "OTHER";
}

bool SlurmJobEnded(SlurmJobState s) {
  switch (s) {
    case SlurmJobState::kPending:
    case SlurmJobState::kRunning:
    case SlurmJobState::kSuspended:
    case SlurmJobState::kCompleting:
    case SlurmJobState::kRequeued:
    case SlurmJobState::kOther:
      return false;
    default:
      return true;
  }
}

absl::StatusOr<SlurmJob> ParseScontrolJobLine(absl::string_view line) {
  line = absl::StripAsciiWhitespace(line);
  const auto f = Fields(line);
  auto need = [&](const char* key) -> absl::StatusOr<std::string> {
    auto it = f.find(key);
    if (it == f.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("scontrol job line has no ", key, "= field: '",
                       line.substr(0, 200), "'"));
    }
    return it->second;
  };
  SlurmJob job;
  SG_ASSIGN_OR_RETURN(std::string id, need("JobId"));
  if (!absl::SimpleAtoi(id, &job.id) || job.id <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("scontrol: JobId '", id, "' is not a job id"));
  }
  SG_ASSIGN_OR_RETURN(job.state_text, need("JobState"));
  job.state = SlurmJobState::kOther;
  for (const auto& [state, name] : kStates) {
    if (job.state_text == name) job.state = state;
  }
  SG_ASSIGN_OR_RETURN(std::string exit, need("ExitCode"));
  std::vector<absl::string_view> parts = absl::StrSplit(exit, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &job.exit_code) ||
      !absl::SimpleAtoi(parts[1], &job.exit_signal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scontrol: ExitCode '", exit, "' is not CODE:SIGNAL"));
  }
  if (auto it = f.find("JobName"); it != f.end()) job.name = it->second;
  if (auto it = f.find("Reason"); it != f.end()) job.reason = it->second;
  if (auto it = f.find("NodeList"); it != f.end() && it->second != "(null)") {
    job.node_list = it->second;
  }
  if (auto it = f.find("BatchHost"); it != f.end()) job.batch_host = it->second;
  if (auto it = f.find("NumTasks"); it != f.end()) {
    if (!absl::SimpleAtoi(it->second, &job.num_tasks)) job.num_tasks = 0;
  }
  return job;
}

absl::StatusOr<int64_t> ParseSbatchParsable(absl::string_view out) {
  out = absl::StripAsciiWhitespace(out);
  const absl::string_view id = out.substr(0, out.find(';'));
  int64_t job = 0;
  if (!absl::SimpleAtoi(id, &job) || job <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sbatch --parsable printed '", out.substr(0, 200), "', not a job id"));
  }
  return job;
}

std::string SlurmCli::Bin(const std::string& name) const {
  return options_.bin_dir.empty() ? name : absl::StrCat(options_.bin_dir, "/", name);
}

std::vector<std::string> SlurmCli::SbatchArgv(const SlurmSubmission& s) const {
  std::vector<std::string> argv = {Bin("sbatch"), "--parsable"};
  if (!s.job_name.empty()) argv.push_back(absl::StrCat("--job-name=", s.job_name));
  if (!s.partition.empty()) argv.push_back(absl::StrCat("--partition=", s.partition));
  if (!s.account.empty()) argv.push_back(absl::StrCat("--account=", s.account));
  argv.push_back(absl::StrCat("--nodes=", s.nodes));
  argv.push_back(absl::StrCat("--ntasks-per-node=", s.ntasks_per_node));
  if (!s.time_limit.empty()) argv.push_back(absl::StrCat("--time=", s.time_limit));
  if (!s.workdir.empty()) argv.push_back(absl::StrCat("--chdir=", s.workdir));
  if (!s.output_path.empty()) argv.push_back(absl::StrCat("--output=", s.output_path));
  std::vector<std::string> names;
  for (const auto& [k, v] : s.env) names.push_back(k);
  argv.push_back(names.empty() ? "--export=NIL" : absl::StrCat("--export=", absl::StrJoin(names, ",")));
  for (const auto& o : s.extra_options) argv.push_back(o);
  argv.push_back(s.script_path);
  return argv;
}

absl::StatusOr<int64_t> SlurmCli::Submit(const SlurmSubmission& s) const {
  if (s.script_path.empty()) return absl::InvalidArgumentError("sbatch: no batch script");
  for (const auto& [k, v] : s.env) {
    if (k.empty() || k.find_first_of(",= ") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("sbatch: bad environment name '", k, "'"));
    }
  }
  SubprocessOptions run;
  run.env = options_.env;
  for (const auto& [k, v] : s.env) run.env[k] = v;
  run.timeout = options_.timeout;
  const std::vector<std::string> argv = SbatchArgv(s);
  SG_ASSIGN_OR_RETURN(SubprocessResult r, RunSubprocess(argv, run));
  if (r.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("sbatch failed (exit ", r.exit_code, "): ",
                                               absl::StripAsciiWhitespace(r.err)));
  }
  return ParseSbatchParsable(r.out);
}

absl::StatusOr<SlurmJob> SlurmCli::Query(int64_t job_id) const {
  SubprocessOptions run;
  run.env = options_.env;
  run.timeout = options_.timeout;
  absl::StatusOr<SubprocessResult> ran =
      RunSubprocess({Bin("scontrol"), "show", "job", "-o", absl::StrCat(job_id)}, run);
  if (!ran.ok()) {
    // NOT_FOUND here would read as "Slurm forgot the job": a missing or
    // hung scontrol is Slurm being unreachable, never a job's end.
    return absl::UnavailableError(
        absl::StrCat("cannot ask Slurm about job ", job_id, ": ", ran.status().message()));
  }
  SubprocessResult& r = *ran;
  if (r.exit_code != 0) {
    const std::string err(absl::StripAsciiWhitespace(r.err));
    if (absl::StrContains(err, "Invalid job id")) {
      return absl::NotFoundError(absl::StrCat("Slurm no longer knows job ", job_id, ": ", err));
    }
    return absl::UnavailableError(
        absl::StrCat("scontrol show job ", job_id, " failed (exit ", r.exit_code, "): ", err));
  }
  // One line per job; a heterogeneous or array job prints several: the one
  // whose JobId is ours.
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipWhitespace())) {
    SG_ASSIGN_OR_RETURN(SlurmJob job, ParseScontrolJobLine(line));
    if (job.id == job_id) return job;
  }
  return absl::NotFoundError(absl::StrCat("scontrol printed no line for job ", job_id));
}

absl::Status SlurmCli::Cancel(int64_t job_id, const std::string& signal) const {
  SubprocessOptions run;
  run.env = options_.env;
  run.timeout = options_.timeout;
  std::vector<std::string> argv = {Bin("scancel")};
  if (!signal.empty()) argv.push_back(absl::StrCat("--signal=", signal));
  argv.push_back(absl::StrCat(job_id));
  SG_ASSIGN_OR_RETURN(SubprocessResult r, RunSubprocess(argv, run));
  if (r.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("scancel ", job_id, " failed (exit ", r.exit_code,
                                               "): ", absl::StripAsciiWhitespace(r.err)));
  }
  return absl::OkStatus();
}

}  // namespace spikeguard::daemon
