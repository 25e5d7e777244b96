#include "daemon/launch/launcher.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "daemon/control/catalog_adapters.h"
#include "daemon/incident/checkpoint_choice.h"
#include "daemon/incident/plan_proto.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "storage/corpus/data_plan.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;

namespace {

// "HOST:PORT" / "[V6]:PORT" / "HOST" / "[V6]" split; port "" when absent.
// False when the brackets are unbalanced or an unbracketed host has a ':'
// left (a bare IPv6 address, where the port would be ambiguous).
bool SplitHostPort(const std::string& text, std::string* host, std::string* port) {
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) return false;
    *host = text.substr(0, close + 1);
    const std::string rest = text.substr(close + 1);
    if (rest.empty()) {
      port->clear();
      return true;
    }
    if (rest[0] != ':') return false;
    *port = rest.substr(1);
    return true;
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) {
    *host = text;
    port->clear();
    return true;
  }
  *host = text.substr(0, colon);
  *port = text.substr(colon + 1);
  return host->find(':') == std::string::npos;
}

bool HostnameOk(const std::string& host) {
  if (host.empty() || host.size() > 253 || host.front() == '-' || host.front() == '.') return false;
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_') {
      return false;
    }
  }
  return true;
}

bool BracketedV6Ok(const std::string& host) {
  if (host.size() < 4 || host.front() != '[' || host.back() != ']') return false;
  for (size_t i = 1; i + 1 < host.size(); ++i) {
    const char c = host[i];
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return false;
  }
  return host.find(':') != std::string::npos;
}

}  // namespace

absl::StatusOr<std::string> ResolveAdvertiseAddress(const std::string& flag,
                                                    const std::string& listen) {
  if (flag.empty()) return std::string();
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--advertise-address '", flag, "': ", why));
  };
  std::string host;
  std::string port;
  if (!SplitHostPort(flag, &host, &port)) {
    return bad("not HOST or HOST:PORT (write an IPv6 address in brackets: [fd00::1]:7070)");
  }
  const bool v6 = !host.empty() && host[0] == '[';
  if (v6 ? !BracketedV6Ok(host) : !HostnameOk(host)) {
    return bad("the host must be a host name, an IPv4 address or a bracketed IPv6 address");
  }
  if (host == "0.0.0.0" || host == "[::]" || host == "[::0]" || host == "[0::0]") {
    return bad("an unspecified address is where the daemon listens, not one a worker can dial; "
               "give this node's name or address");
  }
  if (port.empty() && flag.back() != ':') {
    std::string listen_host;
    if (!SplitHostPort(listen, &listen_host, &port) || port.empty()) {
      return bad(absl::StrCat("no port given, and --listen '", listen, "' names none"));
    }
    int listen_port = 0;
    if (!absl::SimpleAtoi(port, &listen_port) || listen_port == 0) {
      return bad(absl::StrCat("no port given, and --listen '", listen,
                              "' picks one at startup: give the port (HOST:PORT)"));
    }
  }
  int p = 0;
  if (!absl::SimpleAtoi(port, &p) || p < 1 || p > 65535 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return bad(absl::StrCat("port '", port, "' is not 1-65535"));
  }
  return absl::StrCat(host, ":", p);
}

absl::StatusOr<ResumePoint> ChooseResumePoint(storage::Catalog* catalog,
                                              CheckpointGuard* checkpoints, const std::string& run,
                                              bool restart, const std::string& who) {
  SG_ASSIGN_OR_RETURN(v1::Run row, catalog->GetRun(run));
  ResumePoint point;
  point.generation = row.current_generation();
  SG_ASSIGN_OR_RETURN(std::vector<v1::Generation> gens, catalog->ListGenerations(run));
  int64_t origin_step = -1;
  for (const auto& g : gens) {
    if (g.generation() != point.generation) continue;
    if (auto plan = incident::PlanFromProto(g.data_plan()); plan.ok()) point.plan = plan->ToString();
    if (point.generation > 0) origin_step = g.from_checkpoint_step();
  }
  if (!restart && point.generation == 0) return point;
  if (checkpoints == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("run '", run, "': no checkpoint guard"));
  }
  // Newest complete checkpoint of this generation; else the one the
  // generation was rewound to. Only one that still verifies (inside the run's
  // checkpoint root, file there, checksum matching) is named.
  SG_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> ckpts, catalog->ListCheckpoints(run));
  std::vector<incident::CheckpointInfo> all;
  for (const auto& c : ckpts) all.push_back(incident::ToCheckpointInfo(c));
  incident::CheckpointQuery own;
  own.generation = point.generation;
  incident::CheckpointQuery origin;
  origin.min_step = origin.max_step = origin_step;
  origin.lineage = incident::Lineage::Of(gens, point.generation);
  std::vector<std::string> failed;
  for (incident::CheckpointQuery* query : {&own, &origin}) {
    while (point.resume.empty()) {
      query->excluded_uris = failed;
      absl::StatusOr<incident::CheckpointInfo> c = incident::ChooseCheckpoint(all, *query);
      if (!c.ok()) break;
      const auto it = std::find_if(ckpts.begin(), ckpts.end(), [&](const v1::Checkpoint& r) {
        return r.generation() == c->generation && r.step() == c->step && r.uri() == c->uri;
      });
      auto verified = checkpoints->Verify(*it);
      if (!verified.ok()) {
        SG_LOG(WARNING) << "run " << run << ": " << who
                        << " not resumed from it: " << verified.status().message();
        failed.push_back(c->uri);
        continue;
      }
      point.resume = *verified;
    }
  }
  return point;
}

void ProfileLauncher::SetDaemonAddress(const std::string& address) {
  if (local_ != nullptr) local_->SetDaemonAddress(address);
  if (slurm_ != nullptr) slurm_->SetDaemonAddress(address);
}

absl::Status ProfileLauncher::Launch(const std::string& run) {
  SG_ASSIGN_OR_RETURN(v1::Run row, catalog_->GetRun(run));
  bool slurm = false;
  if (profiles_ != nullptr && !row.spec().profile().empty()) {
    // An unknown profile is the local launcher's to refuse, with its message.
    if (auto p = profiles_->Find(row.spec().profile()); p.ok()) slurm = p->has_slurm();
  }
  if (!slurm) return local_->Launch(run);
  if (slurm_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run '", run, "': its launch profile '", row.spec().profile(),
        "' runs under Slurm, and this daemon has no Slurm launcher"));
  }
  return slurm_->Launch(run);
}

void ProfileLauncher::StopAll(absl::Duration grace) {
  if (slurm_ != nullptr) slurm_->StopAll(grace);
  if (local_ != nullptr) local_->StopAll(grace);
}

absl::StatusOr<int64_t> ProcessStartTicks(int64_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream text;
  text << f.rdbuf();
  if (!f || text.str().empty()) {
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  }
  // "PID (COMM) S PPID ...": COMM may hold spaces and ')', so the fields
  // start after the last ')'. Field 3 is the state; field 22 the start time.
  const std::string s = text.str();
  const size_t close = s.rfind(')');
  if (close == std::string::npos) {
    return absl::InternalError(absl::StrCat("/proc/", pid, "/stat: no ')'"));
  }
  std::vector<std::string> fields = absl::StrSplit(s.substr(close + 2), ' ', absl::SkipEmpty());
  // fields[0] is field 3.
  int64_t ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &ticks)) {
    return absl::InternalError(absl::StrCat("/proc/", pid, "/stat: no start time"));
  }
  if (fields[0] == "Z" || fields[0] == "X") {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  return ticks;
}

}  // namespace spikeguard::daemon
