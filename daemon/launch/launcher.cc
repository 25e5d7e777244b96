#include "daemon/launch/launcher.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

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
