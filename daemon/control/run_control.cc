#include "daemon/control/run_control.h"

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "daemon/control/rolling_pin.h"
#include "daemon/ingest/limits.h"
#include "base/status_macros.h"
#include "proto/state_names.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = spikeguard::v1;

const char* KindName(v1::Command::Kind kind) {
  switch (kind) {
    case v1::Command::REWIND: return "rewind";
    case v1::Command::CONTINUE: return "continue";
    case v1::Command::PAUSE: return "pause";
    case v1::Command::STOP: return "stop";
    case v1::Command::SET_HPARAMS: return "set_hparams";
    default: return "unknown";
  }
}

// The innermost Outbox of this thread, if any.
thread_local RunControl::Outbox* current_outbox = nullptr;

}  // namespace

RunControl::Outbox::Outbox(RunControl* control) : control_(control), outer_(current_outbox) {
  current_outbox = this;
}

RunControl::Outbox::~Outbox() {
  current_outbox = outer_;
  if (outer_ != nullptr) {
    for (auto& q : queued_) outer_->queued_.push_back(std::move(q));
    return;
  }
  for (const auto& q : queued_) control_->SendNow(q.run, q.message, q.mark_sent);
}

void RunControl::Send(const std::string& run, const v1::ControllerMessage& message,
                      bool mark_sent) {
  if (current_outbox != nullptr) {
    current_outbox->queued_.push_back(Outbox::Queued{run, message, mark_sent});
    return;
  }
  SendNow(run, message, mark_sent);
}

int RunControl::SendNow(const std::string& run, const v1::ControllerMessage& message,
                        bool mark_sent) {
  const int sent = hub_->SendToRun(run, message);
  if (mark_sent && sent > 0) (void)catalog_->UpdateCommandState(message.command().id(), v1::COMMAND_SENT);
  SG_LOG(INFO) << "run " << run << ": command " << message.command().id() << " ("
               << KindName(message.command().kind()) << ") sent to " << sent << " stream(s)";
  return sent;
}

absl::Status RunControl::Issue(const std::string& run, int64_t generation, v1::Command command) {
  // Every command tells the workers which checkpoints their retention must
  // keep: the run's pinned ones (rolling_pin.h), and the one a rewind loads.
  command.clear_pinned_uris();
  std::set<std::string> pinned;
  if (command.kind() == v1::Command::REWIND && !command.checkpoint().uri().empty()) {
    pinned.insert(command.checkpoint().uri());
  }
  SG_ASSIGN_OR_RETURN(std::vector<std::string> retained, RetainedPins(catalog_, run));
  pinned.insert(retained.begin(), retained.end());
  for (const auto& uri : pinned) command.add_pinned_uris(uri);
  absl::Status put = catalog_->PutCommand(command.id(), run, generation, KindName(command.kind()),
                                          command.SerializeAsString(), v1::COMMAND_PENDING);
  if (absl::IsAlreadyExists(put)) {
    // The same command issued again (after a crash) while the pins changed:
    // it is the same command; the stored one goes out again.
    SG_ASSIGN_OR_RETURN(storage::StoredCommand stored, catalog_->GetCommand(command.id()));
    v1::Command before;
    if (!before.ParseFromString(stored.payload)) {
      return absl::DataLossError(absl::StrCat("command ", command.id(), ": corrupt payload"));
    }
    v1::Command now = command;
    before.clear_pinned_uris();
    now.clear_pinned_uris();
    if (stored.generation != generation ||
        before.SerializeAsString() != now.SerializeAsString()) {
      return put;
    }
    if (CommandFinal(stored.state)) return absl::OkStatus();
    before.ParseFromString(stored.payload);
    command = before;
  } else if (!put.ok()) {
    return put;
  }
  v1::ControllerMessage msg;
  *msg.mutable_command() = command;
  Send(run, msg, /*mark_sent=*/true);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RunControl::Rewind(const std::string& run, const incident::RewindSpec& spec) {
  if (spec.request_id.empty()) return absl::InvalidArgumentError("rewind: empty request id");
  auto existing = catalog_->GetCommand(spec.request_id);
  if (existing.ok()) {
    v1::Command command;
    if (!command.ParseFromString(existing->payload)) {
      return absl::DataLossError(absl::StrCat("command ", spec.request_id, ": corrupt payload"));
    }
    if (!CommandFinal(existing->state)) {
      v1::ControllerMessage msg;
      *msg.mutable_command() = command;
      Send(run, msg, /*mark_sent=*/false);
    }
    return command.new_generation();
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();

  SG_ASSIGN_OR_RETURN(v1::Run current, catalog_->GetRun(run));
  SG_ASSIGN_OR_RETURN(std::vector<v1::Generation> generations, catalog_->ListGenerations(run));
  int64_t next = current.current_generation() + 1;
  for (const auto& g : generations) next = std::max(next, g.generation() + 1);

  // The new line leaves the generation that saved the checkpoint, at its
  // step (the generation tree of checkpoint_choice.h): not the generation
  // running now, which may be a probe of another data plan.
  int64_t parent = current.current_generation();
  for (const auto& g : generations) {
    if (g.generation() == spec.checkpoint.generation) parent = g.generation();
  }
  v1::Generation gen;
  gen.set_generation(next);
  gen.set_parent(parent);
  gen.set_from_checkpoint_step(spec.checkpoint.step);
  gen.set_reason(spec.reason);
  *gen.mutable_data_plan() = spec.plan;
  *gen.mutable_hparams() = spec.hparams;
  // A warmup introduced by this rewind ramps from its checkpoint; recorded,
  // so a later replay of this generation continues the same ramp.
  if (spec.hparams.has_extra_warmup_steps() && !spec.hparams.has_warmup_start_step()) {
    gen.mutable_hparams()->set_warmup_start_step(spec.checkpoint.step);
  }
  gen.set_created_unix_ms(clock_->NowUnixMillis());
  SG_RETURN_IF_ERROR(catalog_->CreateGeneration(run, gen).status());

  v1::Command command;
  command.set_id(spec.request_id);
  command.set_kind(v1::Command::REWIND);
  command.mutable_checkpoint()->set_uri(spec.checkpoint.uri);
  command.mutable_checkpoint()->set_step(spec.checkpoint.step);
  command.mutable_checkpoint()->set_checksum(spec.checkpoint.checksum);
  command.set_new_generation(next);
  *command.mutable_data_plan() = spec.plan;
  command.set_stop_after_step(spec.stop_after_step);
  if (spec.checkpoint_at_step > spec.checkpoint.step) {
    command.set_checkpoint_at_step(spec.checkpoint_at_step);
  }
  const auto& h = gen.hparams();
  if (h.has_lr_scale() || h.has_extra_warmup_steps() || h.has_clip_norm() || h.has_beta2() ||
      h.has_eps()) {
    *command.mutable_hparams() = h;
  }
  command.set_reason(spec.reason);
  SG_RETURN_IF_ERROR(Issue(run, next, command));
  // A paused run trains again in the new generation (`runs show` said
  // paused until then).
  if (current.state() == v1::RUN_PAUSED) {
    if (absl::Status s = catalog_->SetRunState(run, v1::RUN_RUNNING); !s.ok()) {
      SG_LOG(WARNING) << "run " << run << ": rewind sent, but its state stays paused: " << s;
    }
  }
  {
    // The daemon's own rewinds (incident probes, fixes) sit in the audit log
    // next to the operators' calls.
    v1::AuditEntry audit;
    audit.set_principal("spikeguardd");
    audit.set_role("daemon");
    audit.set_rpc("Rewind");
    audit.set_run(run);
    audit.set_outcome("OK");
    audit.set_detail(absl::StrCat("generation ", next, " from step ", spec.checkpoint.step, ": ",
                                  spec.reason.substr(0, 400)));
    (void)catalog_->AppendAudit(audit);
  }
  return next;
}

absl::Status RunControl::Continue(const std::string& run, const std::string& request_id,
                                  const std::optional<v1::HParams>& hparams) {
  auto existing = catalog_->GetCommand(request_id);
  if (existing.ok()) return absl::OkStatus();
  SG_ASSIGN_OR_RETURN(v1::Run current, catalog_->GetRun(run));
  if (hparams) {
    v1::Command set;
    set.set_id(request_id + "/hparams");
    set.set_kind(v1::Command::SET_HPARAMS);
    *set.mutable_hparams() = *hparams;
    SG_RETURN_IF_ERROR(Issue(run, current.current_generation(), set));
  }
  v1::Command command;
  command.set_id(request_id);
  command.set_kind(v1::Command::CONTINUE);
  SG_RETURN_IF_ERROR(Issue(run, current.current_generation(), command));
  // A paused run shows as running again once CONTINUE is out.
  if (current.state() == v1::RUN_PAUSED) {
    if (absl::Status s = catalog_->SetRunState(run, v1::RUN_RUNNING); !s.ok()) {
      SG_LOG(WARNING) << "run " << run << ": continue sent, but its state stays paused: " << s;
    }
  }
  return absl::OkStatus();
}

absl::Status RunControl::Pause(const std::string& run, const std::string& request_id) {
  auto existing = catalog_->GetCommand(request_id);
  if (existing.ok()) return absl::OkStatus();
  SG_ASSIGN_OR_RETURN(v1::Run current, catalog_->GetRun(run));
  v1::Command command;
  command.set_id(request_id);
  command.set_kind(v1::Command::PAUSE);
  SG_RETURN_IF_ERROR(Issue(run, current.current_generation(), command));
  // The run shows as paused from the command on (by the incident engine or
  // an operator); a run that already ended keeps its final state.
  if (current.state() == v1::RUN_CREATED || current.state() == v1::RUN_RUNNING) {
    if (absl::Status s = catalog_->SetRunState(run, v1::RUN_PAUSED); !s.ok()) {
      SG_LOG(WARNING) << "run " << run << ": pause sent, but its state was not updated: " << s;
    }
  }
  return absl::OkStatus();
}

std::vector<v1::Command> RunControl::Unacknowledged(const std::string& run,
                                                    int64_t stream_generation) {
  std::vector<v1::Command> out;
  auto pending = catalog_->ListCommands(run, v1::COMMAND_PENDING);
  auto sent = catalog_->ListCommands(run, v1::COMMAND_SENT);
  if (!pending.ok() || !sent.ok()) return out;
  std::vector<storage::StoredCommand> all = *pending;
  all.insert(all.end(), sent->begin(), sent->end());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.created_unix_ms < b.created_unix_ms ||
           (a.created_unix_ms == b.created_unix_ms && a.generation < b.generation);
  });
  for (const auto& c : all) {
    if (c.generation < stream_generation) continue;
    v1::Command command;
    if (command.ParseFromString(c.payload)) out.push_back(std::move(command));
  }
  return out;
}

bool RunControl::RewindPendingInto(const std::string& run, int64_t generation) {
  for (const auto& c : Unacknowledged(run, generation)) {
    if (c.kind() == v1::Command::REWIND && c.new_generation() == generation) return true;
  }
  return false;
}

void RunControl::OnCommandResult(const std::string& run, uint32_t rank,
                                 const v1::CommandResult& result) {
  if (!result.ok()) {
    (void)catalog_->UpdateCommandState(result.command_id(), v1::COMMAND_FAILED, result.message());
    SG_LOG(ERROR) << "run " << run << " rank " << rank << ": command "
                  << LogText(result.command_id(), 128) << " failed: " << LogText(result.message());
    return;
  }
  auto run_row = catalog_->GetRun(run);
  const uint32_t world = run_row.ok() ? std::max<uint32_t>(1, run_row->world_size()) : 1;
  size_t acked = 0;
  {
    absl::MutexLock lock(&mu_);
    auto& ranks = acks_[result.command_id()];
    ranks.insert(rank);
    acked = ranks.size();
  }
  if (acked >= world) (void)catalog_->UpdateCommandState(result.command_id(), v1::COMMAND_ACKED);
}

}  // namespace spikeguard::daemon
