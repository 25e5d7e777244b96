#include "daemon/ingest/worker_session.h"

#include <algorithm>
#include <map>
#include <span>
#include <utility>

#include "absl/base/const_init.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "daemon/control/rolling_pin.h"
#include "daemon/control/supervisor.h"
#include "daemon/ingest/limits.h"
#include "daemon/launch/checkpoint_guard.h"
#include "google/protobuf/map.h"

namespace spikeguard::daemon {
namespace {

using spikeguard::v1::DataOrder;
using spikeguard::v1::Reject;

// Where a refusal keeps its Reject in the status.
constexpr char kRejectPayload[] = "type.googleapis.com/spikeguard.v1.Reject";

// Serializes the data-order check and its recording across attaching ranks.
ABSL_CONST_INIT absl::Mutex data_order_mu(absl::kConstInit);

std::string FormatBlend(const google::protobuf::Map<std::string, double>& blend) {
  if (blend.empty()) return "{} (equal weights)";
  std::map<std::string, double> sorted(blend.begin(), blend.end());
  std::string out = "{";
  for (const auto& [domain, weight] : sorted) {
    absl::StrAppend(&out, out.size() > 1 ? ", " : "", domain, ": ", weight);
  }
  return out + "}";
}

bool SameBlend(const google::protobuf::Map<std::string, double>& a,
               const google::protobuf::Map<std::string, double>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [domain, weight] : a) {
    auto it = b.find(domain);
    if (it == b.end() || it->second != weight) return false;
  }
  return true;
}

// The first field where the worker's order differs from what `manifest`
// fixes (a field the manifest leaves unset fixes nothing); "" when none.
std::string ManifestConflict(const spikeguard::v1::Manifest& manifest, const DataOrder& worker) {
  if (!manifest.dataset_fingerprint().empty() &&
      manifest.dataset_fingerprint() != worker.dataset_fingerprint()) {
    return absl::StrCat("hello.data_order.dataset_fingerprint: the worker trains on '",
                        worker.dataset_fingerprint(), "', the run's manifest says '",
                        manifest.dataset_fingerprint(), "'");
  }
  if (manifest.seed() != 0 && manifest.seed() != worker.seed()) {
    return absl::StrCat("hello.data_order.seed: the worker trains with seed ", worker.seed(),
                        ", the run's manifest says ", manifest.seed());
  }
  if (manifest.global_batch_size() > 0 &&
      manifest.global_batch_size() != worker.global_batch_size()) {
    return absl::StrCat("hello.data_order.global_batch_size: the worker trains with ",
                        worker.global_batch_size(), ", the run's manifest says ",
                        manifest.global_batch_size());
  }
  if (manifest.sequence_length() > 0 && manifest.sequence_length() != worker.sequence_length()) {
    return absl::StrCat("hello.data_order.sequence_length: the worker trains with ",
                        worker.sequence_length(), ", the run's manifest says ",
                        manifest.sequence_length());
  }
  if (!manifest.blend().empty() && !SameBlend(manifest.blend(), worker.blend())) {
    return absl::StrCat("hello.data_order.blend: the worker trains with ",
                        FormatBlend(worker.blend()), ", the run's manifest says ",
                        FormatBlend(manifest.blend()));
  }
  return "";
}

// The first field where rank `rank`'s order differs from the one the run's
// other ranks train with; "" when none.
std::string RankConflict(const DataOrder& recorded, const DataOrder& worker, uint32_t rank) {
  const std::string who = absl::StrCat("rank ", rank, " trains with ");
  const std::string others = ", the run's other connected ranks with ";
  if (recorded.dataset_fingerprint() != worker.dataset_fingerprint()) {
    return absl::StrCat("hello.data_order.dataset_fingerprint: ", who, "'",
                        worker.dataset_fingerprint(), "'", others, "'",
                        recorded.dataset_fingerprint(), "'");
  }
  if (recorded.seed() != worker.seed()) {
    return absl::StrCat("hello.data_order.seed: ", who, "seed ", worker.seed(), others, "seed ",
                        recorded.seed());
  }
  if (recorded.global_batch_size() != worker.global_batch_size()) {
    return absl::StrCat("hello.data_order.global_batch_size: ", who, worker.global_batch_size(),
                        others, recorded.global_batch_size());
  }
  if (recorded.sequence_length() != worker.sequence_length()) {
    return absl::StrCat("hello.data_order.sequence_length: ", who, worker.sequence_length(), others,
                        recorded.sequence_length());
  }
  if (!SameBlend(recorded.blend(), worker.blend())) {
    return absl::StrCat("hello.data_order.blend: ", who, FormatBlend(worker.blend()), others,
                        FormatBlend(recorded.blend()));
  }
  return "";
}

}  // namespace

absl::Status Refusal(Reject::Reason reason, absl::string_view message, int64_t current_generation,
                     absl::StatusCode code) {
  Reject reject;
  reject.set_reason(reason);
  reject.set_message(std::string(message));
  reject.set_current_generation(current_generation);
  absl::Status status(code, message);
  status.SetPayload(kRejectPayload, absl::Cord(reject.SerializeAsString()));
  return status;
}

std::optional<Reject> RejectOf(const absl::Status& status) {
  auto payload = status.GetPayload(kRejectPayload);
  if (!payload.has_value()) return std::nullopt;
  Reject reject;
  if (!reject.ParseFromString(std::string(*payload))) return std::nullopt;
  return reject;
}

WorkerSession::WorkerSession(const Deps& deps, Authorize authorize)
    : deps_(deps), authorize_(std::move(authorize)) {}

WorkerSession::~WorkerSession() { Detach(); }

absl::StatusOr<spikeguard::v1::Welcome> WorkerSession::Hello(const spikeguard::v1::Hello& hello) {
  hello_ = hello;
  if (absl::Status s = ValidateHello(hello_, deps_.limits); !s.ok()) {
    return Refusal(Reject::INVALID_HELLO, s.message(), 0, absl::StatusCode::kInvalidArgument);
  }
  if (authorize_ != nullptr) {
    if (absl::Status s = authorize_(hello_.run()); !s.ok()) {
      return Refusal(Reject::BAD_TOKEN, s.message(), 0, absl::StatusCode::kPermissionDenied);
    }
  }
  absl::StatusOr<spikeguard::v1::Run> run = FindRun();
  if (!run.ok()) return run.status();
  if (run->world_size() != 0 && run->world_size() != hello_.world_size()) {
    return Refusal(Reject::INVALID_HELLO,
                   absl::StrFormat("hello.world_size: %d does not match run '%s' (world size %d)",
                                   hello_.world_size(), hello_.run(), run->world_size()),
                   run->current_generation(), absl::StatusCode::kInvalidArgument);
  }
  if (absl::Status s = FenceGeneration(run->current_generation()); !s.ok()) return s;
  if (hello_.has_data_order()) {
    if (absl::Status s = RecordDataOrder(); !s.ok()) return s;
  }
  absl::StatusOr<int64_t> committed =
      deps_.catalog->CommittedStep(hello_.run(), generation_, hello_.rank());
  if (!committed.ok()) return committed.status();
  {
    absl::MutexLock lock(&mu_);
    rank_last_step_ = *committed;
  }
  stream_id_ = deps_.registry->Connect(hello_.run(), hello_.rank(), generation_, hello_.host());
  if (run->state() == spikeguard::v1::RUN_CREATED) {
    // Workers started outside the daemon (the launcher moves its own runs
    // on): the run is running from its first rank on, and finished once
    // every rank ended the generation and left (Detach).
    deps_.registry->MarkSelfStarted(hello_.run());
    if (absl::Status s = deps_.catalog->SetRunState(hello_.run(), spikeguard::v1::RUN_RUNNING); !s.ok()) {
      SG_LOG(WARNING) << "run " << hello_.run() << ": a rank attached, but its state stays "
                      << "created: " << s;
    }
  }
  spikeguard::v1::Welcome welcome;
  welcome.set_run(hello_.run());
  welcome.set_generation(generation_);
  welcome.set_committed_step(*committed);
  return welcome;
}

absl::StatusOr<spikeguard::v1::Run> WorkerSession::FindRun() const {
  absl::StatusOr<spikeguard::v1::Run> run = deps_.catalog->GetRunWithoutRanks(hello_.run());
  if (absl::IsNotFound(run.status())) {
    return Refusal(Reject::UNKNOWN_RUN,
                   absl::StrCat("unknown run '", hello_.run(),
                                "': create it first (spikectl runs create ", hello_.run(), ")"),
                   0, absl::StatusCode::kNotFound);
  }
  return run;
}

absl::Status WorkerSession::FenceGeneration(int64_t current) {
  current_ = current;
  // A rank still in an older generation may attach only to receive the
  // rewind that leads into the current one; its reports stay fenced.
  catching_up_ = hello_.generation() < current_ && deps_.supervisor != nullptr &&
                 deps_.supervisor->control()->RewindPendingInto(hello_.run(), current_);
  generation_ = catching_up_ ? hello_.generation() : current_;
  if (hello_.generation() == generation_) return absl::OkStatus();
  return Refusal(Reject::STALE_GENERATION,
                 absl::StrFormat("stale generation: rank %d of run '%s' runs generation %d, the "
                                 "run is at generation %d; exit and restart from the run's "
                                 "current checkpoint",
                                 hello_.rank(), hello_.run(), hello_.generation(), current_),
                 current_, absl::StatusCode::kFailedPrecondition);
}

absl::Status WorkerSession::RecordDataOrder() {
  // The data order is what the daemon names documents with: a rank that
  // contradicts the run's manifest or the other ranks would make every
  // resolved document wrong, so it does not attach.
  absl::MutexLock lock(&data_order_mu);
  absl::StatusOr<spikeguard::v1::Run> latest = deps_.catalog->GetRunWithoutRanks(hello_.run());
  if (!latest.ok()) return latest.status();
  std::string conflict = ManifestConflict(latest->spec().manifest(), hello_.data_order());
  if (conflict.empty() && latest->has_data_order()) {
    // With no other rank live, a relaunch with a new order replaces it.
    if (deps_.registry->OtherRankConnected(hello_.run(), hello_.rank())) {
      conflict = RankConflict(latest->data_order(), hello_.data_order(), hello_.rank());
    }
  }
  if (!conflict.empty()) {
    SG_LOG(WARNING) << "run " << hello_.run() << " rank " << hello_.rank()
                    << " refused: " << LogText(conflict, deps_.limits.max_logged_text);
    return Refusal(Reject::DATA_ORDER_MISMATCH, conflict, current_,
                   absl::StatusCode::kFailedPrecondition);
  }
  return deps_.catalog->SetRunDataOrder(hello_.run(), hello_.data_order(),
                                          hello_.total_steps());
}

std::vector<spikeguard::v1::Command> WorkerSession::Unacknowledged() const {
  if (deps_.supervisor == nullptr) return {};
  return deps_.supervisor->control()->Unacknowledged(run(), generation_);
}

int64_t WorkerSession::LastKnownStep() const {
  int64_t last;
  {
    absl::MutexLock lock(&mu_);
    last = std::max(rank_last_step_, hello_.total_steps());
  }
  return std::max(last, deps_.registry->LastStep(run()));
}

absl::StatusOr<WorkerSession::AcceptedBatch> WorkerSession::Reports(
    spikeguard::v1::StepReportBatch batch) {
  const int64_t batch_gen = batch.has_generation() ? batch.generation() : generation_;
  if (catching_up_) {
    deps_.counters->reports_rejected.fetch_add(batch.reports_size());
    return absl::FailedPreconditionError(absl::StrFormat(
        "stale generation: reports of generation %d refused; the run is at generation %d",
        batch_gen, current_));
  }
  if (batch_gen != generation_) {
    return Refusal(Reject::STALE_GENERATION,
                   absl::StrFormat("stale generation: reports of generation %d on a stream of "
                                   "generation %d",
                                   batch_gen, generation_),
                   generation_, absl::StatusCode::kFailedPrecondition);
  }
  absl::Status valid = ValidateBatch(batch, deps_.limits);
  if (valid.ok()) valid = ValidateStepsAhead(batch, LastKnownStep(), deps_.limits);
  if (!valid.ok()) {
    deps_.counters->reports_rejected.fetch_add(batch.reports_size());
    SG_LOG(WARNING) << "run " << run() << " rank " << rank() << ": batch " << batch.seq()
                    << " rejected: " << LogText(valid.message(), deps_.limits.max_logged_text);
    return valid;
  }
  AcceptedBatch accepted;
  accepted.ticket.seq = batch.seq();
  accepted.ticket.generation = batch_gen;
  accepted.ticket.reports = batch.reports_size();
  const auto furthest =
      std::max_element(batch.reports().begin(), batch.reports().end(),
                       [](const auto& a, const auto& b) { return a.step() < b.step(); });
  if (furthest != batch.reports().end()) accepted.ticket.furthest = *furthest;
  IngestBatch& to_commit = accepted.batch;
  to_commit.run = run();
  to_commit.generation = generation_;
  to_commit.rank = rank();
  to_commit.world_size = std::max<uint32_t>(1, hello_.world_size());
  // The generation fence is checked in the transaction that stores the batch.
  to_commit.require_current = true;
  to_commit.reports.reserve(batch.reports_size());
  for (auto& r : *batch.mutable_reports()) to_commit.reports.push_back(std::move(r));
  return accepted;
}

absl::StatusOr<spikeguard::v1::Ack> WorkerSession::Committed(const BatchOutcome& outcome,
                                                             const BatchTicket& ticket) {
  spikeguard::v1::Ack ack;
  ack.set_seq(ticket.seq);
  if (absl::IsFailedPrecondition(outcome.status)) {
    ack.set_rejected(ticket.reports);
    ack.set_message(absl::StrFormat(
        "stale generation: reports of generation %d refused; the run is at generation %d",
        ticket.generation, outcome.run_generation));
    deps_.counters->reports_rejected.fetch_add(ticket.reports);
    return ack;
  }
  if (!outcome.status.ok()) {
    // Not committed, so not acknowledged: the client resends after it reconnects.
    SG_LOG(ERROR) << "run " << run() << " rank " << rank() << ": ingest failed: " << outcome.status;
    return absl::UnavailableError(
        absl::StrCat("catalog write failed: ", outcome.status.message()));
  }
  const storage::IngestResult& ingested = outcome.result;
  {
    absl::MutexLock lock(&mu_);
    rank_last_step_ = std::max(rank_last_step_, ingested.committed_step);
  }
  if (ticket.reports > 0) {
    deps_.registry->AddReports(run(), rank(), std::span(&ticket.furthest, 1));
  }
  deps_.counters->reports_accepted.fetch_add(ingested.accepted);
  deps_.counters->reports_duplicate.fetch_add(ingested.duplicates);
  ack.set_accepted(ingested.accepted);
  ack.set_duplicates(ingested.duplicates);
  if (ingested.duplicates > 0) {
    ack.set_message(absl::StrFormat(
        "%d duplicate or out-of-order reports ignored: rank %d already committed step %d",
        ingested.duplicates, rank(), ingested.committed_step));
  }
  return ack;
}

// A notice refused: logged, and the same words for the worker.
absl::Status WorkerSession::StampRefused(absl::string_view what, const absl::Status& why) const {
  SG_LOG(WARNING) << "run " << run() << " rank " << rank() << ": " << what
                  << " refused: " << LogText(why.message());
  return absl::Status(why.code(), absl::StrCat(what, " refused: ", why.message()));
}

absl::Status WorkerSession::CheckpointSaved(const spikeguard::v1::CheckpointSaved& c,
                                            spikeguard::v1::Ack* pins) {
  if (absl::Status s = ValidateCheckpointSaved(c, deps_.limits); !s.ok()) {
    return StampRefused("checkpoint", s);
  }
  // Confined to the run's checkpoint root before anything is stored, and
  // stored with the identity of the file as registered (what a rewind checks).
  std::optional<std::string> file_identity;
  if (deps_.checkpoints != nullptr) {
    auto admitted = deps_.checkpoints->Admit(run(), c.uri());
    if (!admitted.ok()) return StampRefused("checkpoint", admitted.status());
    file_identity = admitted->file_identity;
  }
  // The saver: a notice resent on a later generation's stream names it.
  if (c.has_generation() && (c.generation() < 0 || c.generation() > generation_)) {
    return StampRefused(
        "checkpoint", absl::InvalidArgumentError(absl::StrCat(
                          "checkpoint.generation ", c.generation(), ": not in [0, ", generation_,
                          "] (the stream's generation)")));
  }
  spikeguard::v1::Checkpoint ckpt;
  ckpt.set_run(run());
  ckpt.set_generation(c.has_generation() ? c.generation() : generation_);
  ckpt.set_step(c.step());
  ckpt.set_data_position(c.data_position());
  ckpt.set_uri(c.uri());
  ckpt.set_bytes(c.bytes());
  ckpt.set_checksum(c.checksum());
  ckpt.set_complete(c.complete());
  ckpt.set_has_rng_state(c.has_rng_state());
  ckpt.set_has_data_loader_state(c.has_data_loader_state());
  ckpt.set_created_unix_ms(deps_.clock->NowUnixMillis());
  if (auto s = deps_.catalog->UpsertCheckpoint(ckpt, file_identity); !s.ok()) {
    SG_LOG(ERROR) << "run " << run() << ": checkpoint not recorded: " << s.status();
    return absl::OkStatus();
  }
  // The run has reached this step: the rolling rewind target may move, and
  // the worker learns what its retention must keep.
  absl::StatusOr<std::vector<std::string>> keep =
      UpdateRollingPin(deps_.catalog, run(), c.step());
  if (!keep.ok()) {
    SG_LOG(WARNING) << "run " << run() << ": rolling pin not updated: " << keep.status();
  } else if (pins != nullptr) {
    pins->set_has_pins(true);
    for (const std::string& uri : *keep) pins->add_pinned_uris(uri);
  }
  return absl::OkStatus();
}

absl::Status WorkerSession::CheckpointDeleted(const spikeguard::v1::CheckpointDeleted& d) {
  if (absl::Status s = ValidateCheckpointDeleted(d, deps_.limits); !s.ok()) {
    return StampRefused("checkpoint deletion notice", s);
  }
  absl::StatusOr<bool> deleted = deps_.catalog->DeleteCheckpoint(run(), d.step(), d.uri());
  if (!deleted.ok()) {
    SG_LOG(ERROR) << "run " << run() << ": checkpoint deletion not recorded: "
                  << deleted.status();
  } else if (*deleted) {
    SG_LOG(INFO) << "run " << run() << " rank " << rank() << " deleted checkpoint "
                 << LogText(d.uri(), deps_.limits.max_logged_text) << " (step " << d.step()
                 << ")";
  }
  return absl::OkStatus();
}

void WorkerSession::GenerationEnded(const spikeguard::v1::GenerationEnded& e) {
  if (absl::Status s = ValidateGenerationEnded(e, deps_.limits); !s.ok()) {
    SG_LOG(WARNING) << "run " << run() << " rank " << rank()
                    << ": generation_ended refused: " << LogText(s.message());
    return;
  }
  if (catching_up_ || e.generation() != generation_) {
    // Fenced like reports: only the stream's own generation counts.
    SG_LOG(WARNING) << "run " << run() << " rank " << rank() << ": end of generation "
                    << e.generation() << " ignored on a stream of generation " << generation_
                    << (catching_up_ ? " (catching up)" : "");
    return;
  }
  SG_LOG(INFO) << "run " << run() << " rank " << rank() << ": generation " << e.generation()
               << " ended at step " << e.last_step() << ": "
               << LogText(e.reason(), deps_.limits.max_logged_text);
  deps_.registry->GenerationEnded(run(), rank(), e.generation());
  if (deps_.supervisor != nullptr) {
    deps_.supervisor->OnGenerationEnded(run(), e.generation(), rank(), e.last_step(),
                                          e.reason());
  }
}

void WorkerSession::Heartbeat(const spikeguard::v1::Heartbeat& heartbeat) {
  // A heartbeat's step moves the rank's last step only as far as a report
  // could (it bounds the steps of later reports).
  const int64_t step = heartbeat.step();
  int64_t base;
  {
    absl::MutexLock lock(&mu_);
    base = std::max<int64_t>(rank_last_step_, 0);
  }
  const bool plausible =
      step >= 0 && (step <= base || step - base <= deps_.limits.max_step_ahead);
  deps_.registry->Touch(run(), rank(), plausible ? step : -1);
}

void WorkerSession::CommandResult(const spikeguard::v1::CommandResult& r) {
  SG_LOG(INFO) << "run " << run() << " rank " << rank() << ": command "
               << LogText(r.command_id(), 128) << " " << (r.ok() ? "ok" : "failed") << ": "
               << LogText(r.message(), deps_.limits.max_logged_text);
  if (deps_.supervisor == nullptr) return;
  deps_.supervisor->control()->OnCommandResult(run(), rank(), r);
  if (!r.ok()) deps_.supervisor->OnCommandFailed(run(), r.command_id(), rank(), r.message());
}

void WorkerSession::Detach() {
  if (!stream_id_.has_value()) return;
  deps_.registry->Disconnect(run(), rank(), *stream_id_);
  stream_id_.reset();
  if (!deps_.registry->SelfStarted(run())) return;
  absl::StatusOr<spikeguard::v1::Run> row = deps_.catalog->GetRunWithoutRanks(run());
  if (row.ok() && row->state() == spikeguard::v1::RUN_RUNNING &&
      deps_.registry->AllRanksDone(run(), row->current_generation(), row->world_size())) {
    if (absl::Status s = deps_.catalog->SetRunState(run(), spikeguard::v1::RUN_FINISHED); !s.ok()) {
      SG_LOG(WARNING) << "run " << run() << ": its workers are done, but it stays running: " << s;
    } else {
      SG_LOG(INFO) << "run " << run() << " finished: every rank ended generation "
                   << row->current_generation() << " and left";
    }
  }
}

}  // namespace spikeguard::daemon
