#include "worker/client/worker_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace spikeguard::worker {
namespace {

namespace v1 = spikeguard::v1;
constexpr size_t kRecentCheckpoints = 16;
// The daemon's limit on reports in one batch (daemon/ingest/limits.h).
constexpr int kMaxBatchReports = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerClient>> WorkerClient::Start(Options options) {
  if (options.run.empty()) return absl::InvalidArgumentError("run: empty");
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d is not below world size %d",
                                                      options.rank, options.world_size));
  }
  options.max_batch_reports = std::clamp(options.max_batch_reports, 1, kMaxBatchReports);
  if (options.max_unacked_reports != 0) options.max_queued_reports = options.max_unacked_reports;
  options.max_queued_reports = std::max<size_t>(options.max_queued_reports, 1);
  options.max_backoff = std::max(options.max_backoff, options.initial_backoff);
  absl::StatusOr<ResolvedSecurity> security = options.security.Resolve();
  if (!security.ok()) return security.status();
  std::unique_ptr<WorkerClient> client(
      new WorkerClient(std::move(options), *std::move(security)));
  client->thread_ = std::thread([c = client.get()] { c->ConnectionLoop(); });
  return client;
}

WorkerClient::WorkerClient(Options options, ResolvedSecurity security)
    : options_(std::move(options)), security_(std::move(security)), generation_(options_.generation) {
  channel_ = options_.channel;
  if (channel_ == nullptr) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
    // Reconnect quickly after a daemon restart: gRPC's own backoff is kept
    // within the loop's (as the Python client's).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.initial_backoff)));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.max_backoff)));
    channel_ = CreateClientChannel(options_.address, security_, args);
  }
  stub_ = v1::WorkerService::NewStub(channel_);
}

WorkerClient::~WorkerClient() { Close(); }

void WorkerClient::Close() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
    // A live stream is half-closed by the connection thread, and ended by the
    // daemon once it has read everything; cancel only if that takes too long.
    const absl::Time deadline = absl::Now() + options_.close_grace;
    while (active_context_ != nullptr && connected_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (active_context_ != nullptr) active_context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status WorkerClient::WaitForWelcome(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!welcomed_ && !rejection_.has_value()) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (rejection_.has_value()) return RejectionStatusLocked();
  if (!welcomed_) {
    std::string why;
    if (!stats_.last_error.empty()) {
      why = absl::StrCat(" (last error ", stats_.last_error, ")");
      // A connection that never came up may be a TLS mismatch.
      if (absl::StartsWith(stats_.last_error, "UNAVAILABLE")) {
        absl::StrAppend(&why, "; ", security_.Hint(grpc::StatusCode::UNAVAILABLE));
      }
    }
    return absl::DeadlineExceededError(
        absl::StrFormat("no welcome from spikeguardd at %s within %s%s", options_.address,
                        absl::FormatDuration(timeout), why));
  }
  return absl::OkStatus();
}

absl::Status WorkerClient::RejectionStatusLocked() const {
  std::string message = absl::StrFormat("rejected by spikeguardd (%s): %s",
                                        v1::Reject::Reason_Name(rejection_->reason()),
                                        rejection_->message());
  // A synthesized rejection (a refused stream) carries its hint already.
  if (rejection_->reason() == v1::Reject::BAD_TOKEN &&
      !absl::StrContains(rejection_->message(), "SPIKEGUARD_TOKEN")) {
    // The daemon refuses with BAD_TOKEN an unknown token and a token whose
    // role or runs do not cover this rank alike.
    absl::StrAppend(
        &message, "; ",
        security_.token.empty()
            ? security_.Hint(grpc::StatusCode::UNAUTHENTICATED)
            : absl::StrCat("check the token from ", security_.token_origin,
                           ": the daemon's tokens file must have its hash, for a principal "
                           "with the role worker (or above) and run '",
                           options_.run, "'"));
  }
  return absl::FailedPreconditionError(message);
}

void WorkerClient::Report(const v1::StepReport& report) {
  absl::MutexLock lock(&mu_);
  while (!stopping_ && unacked_reports_ + open_.size() >= options_.max_queued_reports) {
    cv_.Wait(&mu_);
  }
  if (stopping_) return;
  // The daemon refuses a batch whose steps do not increase, every report in
  // it: a repeated or earlier step goes in a batch of its own (where the
  // daemon counts it as a duplicate).
  if (!open_.empty() && report.step() <= open_.back().step()) SealLocked();
  if (open_.empty()) open_since_ = absl::Now();
  open_.push_back(report);
  if (static_cast<int>(open_.size()) >= options_.max_batch_reports) SealLocked();
  cv_.SignalAll();
}

void WorkerClient::ReportCheckpoint(const v1::CheckpointSaved& saved) {
  v1::CheckpointSaved checkpoint = saved;
  absl::MutexLock lock(&mu_);
  // Resent on a later generation's stream, it still names its saver.
  if (!checkpoint.has_generation()) checkpoint.set_generation(generation_);
  // Reports up to the checkpoint travel before it.
  SealLocked();
  // Written again: an older deletion notice must not be resent after it.
  recent_deletions_.erase(std::remove_if(recent_deletions_.begin(), recent_deletions_.end(),
                                         [&](const v1::CheckpointDeleted& d) {
                                           return d.uri() == checkpoint.uri();
                                         }),
                          recent_deletions_.end());
  v1::WorkerMessage msg;
  *msg.mutable_checkpoint() = checkpoint;
  outbox_.push_back(std::move(msg));
  recent_checkpoints_.push_back(checkpoint);
  while (recent_checkpoints_.size() > kRecentCheckpoints) recent_checkpoints_.pop_front();
  cv_.SignalAll();
}

void WorkerClient::SendCommandResult(const v1::CommandResult& result) {
  absl::MutexLock lock(&mu_);
  SealLocked();
  v1::WorkerMessage msg;
  *msg.mutable_command_result() = result;
  outbox_.push_back(std::move(msg));
  cv_.SignalAll();
}

void WorkerClient::SendGenerationEnded(const v1::GenerationEnded& ended) {
  absl::MutexLock lock(&mu_);
  SealLocked();
  v1::WorkerMessage msg;
  *msg.mutable_generation_ended() = ended;
  outbox_.push_back(std::move(msg));
  generation_ended_ = ended;
  cv_.SignalAll();
}

void WorkerClient::ReportCheckpointDeleted(const v1::CheckpointDeleted& deleted) {
  absl::MutexLock lock(&mu_);
  SealLocked();
  v1::WorkerMessage msg;
  *msg.mutable_checkpoint_deleted() = deleted;
  outbox_.push_back(std::move(msg));
  recent_checkpoints_.erase(std::remove_if(recent_checkpoints_.begin(), recent_checkpoints_.end(),
                                           [&](const v1::CheckpointSaved& c) {
                                             return c.uri() == deleted.uri();
                                           }),
                            recent_checkpoints_.end());
  recent_deletions_.push_back(deleted);
  while (recent_deletions_.size() > kRecentCheckpoints) recent_deletions_.pop_front();
  cv_.SignalAll();
}

void WorkerClient::SetCurrentStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  current_step_ = step;
}

absl::Status WorkerClient::Flush(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  SealLocked();
  cv_.SignalAll();
  auto pending = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !unacked_.empty() || !outbox_.empty() || writing_ > 0;
  };
  while (pending() && !rejection_.has_value() && !stopping_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (rejection_.has_value()) return RejectionStatusLocked();
  if (!unacked_.empty()) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "%d reports still unacknowledged after %s", unacked_reports_, absl::FormatDuration(timeout)));
  }
  if (pending()) {
    return absl::DeadlineExceededError(
        absl::StrFormat("%d notices still unsent after %s", outbox_.size() + writing_,
                        absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

std::optional<v1::Command> WorkerClient::WaitCommand(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (commands_.empty() && !stopping_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (commands_.empty()) return std::nullopt;
  v1::Command c = std::move(commands_.front());
  commands_.pop_front();
  return c;
}

void WorkerClient::SetGeneration(int64_t generation) {
  absl::MutexLock lock(&mu_);
  SealLocked();
  for (auto it = unacked_.begin(); it != unacked_.end();) {
    if (it->batch.generation() != generation) {
      stats_.reports_dropped_stale += it->batch.reports_size();
      unacked_reports_ -= it->batch.reports_size();
      it = unacked_.erase(it);
    } else {
      ++it;
    }
  }
  generation_ = generation;
  if (generation_ended_.has_value() && generation_ended_->generation() != generation) {
    generation_ended_.reset();
  }
  // The next Hello must carry the new generation.
  if (active_context_ != nullptr) active_context_->TryCancel();
  cv_.SignalAll();
}

std::optional<v1::Reject> WorkerClient::rejection() const {
  absl::MutexLock lock(&mu_);
  return rejection_;
}

std::optional<std::vector<std::string>> WorkerClient::TakePins() {
  absl::MutexLock lock(&mu_);
  std::optional<std::vector<std::string>> out = std::move(pins_);
  pins_.reset();
  return out;
}

bool WorkerClient::AwaitCheckpointAnswers(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  auto pending = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!connected_ || stopping_) return false;
    return notices_unanswered_ > 0 ||
           std::any_of(outbox_.begin(), outbox_.end(),
                       [](const v1::WorkerMessage& m) { return m.has_checkpoint(); });
  };
  while (pending()) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) return !pending();
  }
  return true;
}

bool WorkerClient::connected() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

WorkerClient::Stats WorkerClient::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void WorkerClient::SealLocked() {
  if (open_.empty()) return;
  Batch b;
  b.batch.set_seq(next_seq_++);
  b.batch.set_generation(generation_);
  for (auto& r : open_) *b.batch.add_reports() = std::move(r);
  unacked_reports_ += open_.size();
  open_.clear();
  unacked_.push_back(std::move(b));
}

void WorkerClient::ConnectionLoop() {
  absl::Duration backoff = options_.initial_backoff;
  while (true) {
    const int64_t connects_before = stats().connects;
    if (!RunConnection()) return;
    if (stats().connects > connects_before) backoff = options_.initial_backoff;
    if (!WaitOutBackoff(absl::Now() + backoff)) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

bool WorkerClient::WaitOutBackoff(absl::Time wake) {
  // The wait drives the channel's reconnection. With the synchronous API
  // nothing polls a channel that no call is using: its TCP connect and TLS
  // handshake then advance only on gRPC's backup poller (every 5 s), and a
  // rank took a minute or more to come back after a daemon restart. A
  // channel that becomes ready ends the wait early (one that was ready all
  // along does not: the attach failed for another reason).
  bool was_ready = channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return false;
    }
    const absl::Time now = absl::Now();
    if (now >= wake) return true;
    const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY && !was_ready) return true;
    if (state != GRPC_CHANNEL_READY) was_ready = false;
    // A bounded step, so that Close() is seen within 100 ms.
    channel_->WaitForStateChange(state, absl::ToChronoTime(std::min(wake, now + absl::Milliseconds(100))));
  }
}

bool WorkerClient::RunConnection() {
  grpc::ClientContext context;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    active_context_ = &context;
    generation = generation_;
  }
  auto clear_context = [&] {
    absl::MutexLock lock(&mu_);
    active_context_ = nullptr;
    connected_ = false;
    cv_.SignalAll();
  };
  security_.Authorize(&context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::ControllerMessage>> stream =
      stub_->Attach(&context);

  v1::WorkerMessage hello_msg;
  v1::Hello* hello = hello_msg.mutable_hello();
  hello->set_run(options_.run);
  hello->set_rank(options_.rank);
  hello->set_world_size(options_.world_size);
  hello->set_generation(generation);
  hello->set_host(options_.host);
  hello->set_device_id(options_.device_id);
  hello->set_config_fingerprint(options_.config_fingerprint);
  hello->set_manifest_version(options_.manifest_version);
  hello->set_resume_step(options_.resume_step);
  hello->set_protocol("spikeguard.v1");
  if (options_.data_order.has_value()) *hello->mutable_data_order() = *options_.data_order;
  hello->set_total_steps(options_.total_steps);
  v1::ControllerMessage first;
  const bool wrote = stream->Write(hello_msg);
  if (!wrote || !stream->Read(&first)) {
    // A stream the daemon ended at once says why in its status.
    if (!wrote) stream->WritesDone();
    const grpc::Status status = stream->Finish();
    const std::string error =
        status.ok() ? std::string("stream ended before a welcome")
                    : absl::StrCat(absl::StatusCodeToString(
                                       static_cast<absl::StatusCode>(status.error_code())),
                                   ": ", status.error_message());
    const bool refused = status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                         status.error_code() == grpc::StatusCode::PERMISSION_DENIED;
    absl::MutexLock lock(&mu_);
    if (refused) {
      // The same token would be refused again: final, like Reject(BAD_TOKEN).
      v1::Reject reject;
      reject.set_reason(v1::Reject::BAD_TOKEN);
      reject.set_message(absl::StrCat(error, " (", security_.Hint(status.error_code()), ")"));
      rejection_ = reject;
      stopping_ = true;
      SG_LOG(ERROR) << "spikeguardd refused rank " << options_.rank << " of run '"
                    << options_.run << "': " << reject.message();
    } else if (error != stats_.last_error) {
      // Said once per distinct failure; the retries that follow are quiet.
      SG_LOG(WARNING) << "cannot attach rank " << options_.rank << " of run '" << options_.run
                      << "' to spikeguardd at " << options_.address << ": " << error
                      << "; retrying";
    }
    stats_.last_error = error;
    active_context_ = nullptr;
    connected_ = false;
    cv_.SignalAll();
    return !refused;
  }
  if (first.has_reject()) {
    stream->WritesDone();
    stream->Finish();
    absl::MutexLock lock(&mu_);
    rejection_ = first.reject();
    stopping_ = true;
    active_context_ = nullptr;
    connected_ = false;
    cv_.SignalAll();
    SG_LOG(ERROR) << "spikeguardd rejected rank " << options_.rank << " of run '" << options_.run
                  << "' (" << v1::Reject::Reason_Name(first.reject().reason())
                  << "): " << first.reject().message();
    return false;
  }
  if (!first.has_welcome()) {
    context.TryCancel();
    stream->Finish();
    clear_context();
    return true;
  }
  {
    absl::MutexLock lock(&mu_);
    connected_ = true;
    welcomed_ = true;
    ++stats_.connects;
    for (auto& b : unacked_) b.sent = false;
    // Notices that may have died with the last stream go first: checkpoints
    // saved, then deleted, then the end of the generation.
    if (stats_.connects > 1) {
      std::vector<v1::WorkerMessage> resend;
      for (const auto& c : recent_checkpoints_) *resend.emplace_back().mutable_checkpoint() = c;
      for (const auto& d : recent_deletions_) {
        *resend.emplace_back().mutable_checkpoint_deleted() = d;
      }
      const bool queued_end = std::any_of(outbox_.begin(), outbox_.end(), [](const auto& m) {
        return m.has_generation_ended();
      });
      if (generation_ended_.has_value() && generation_ended_->generation() == generation &&
          !queued_end) {
        *resend.emplace_back().mutable_generation_ended() = *generation_ended_;
      }
      outbox_.insert(outbox_.begin(), std::make_move_iterator(resend.begin()),
                     std::make_move_iterator(resend.end()));
    }
    cv_.SignalAll();
  }

  std::thread reader([&] {
    v1::ControllerMessage in;
    while (stream->Read(&in)) {
      absl::MutexLock lock(&mu_);
      if (in.has_ack()) {
        const auto& ack = in.ack();
        for (auto it = unacked_.begin(); it != unacked_.end(); ++it) {
          if (it->batch.seq() == ack.seq()) {
            unacked_reports_ -= it->batch.reports_size();
            unacked_.erase(it);
            break;
          }
        }
        if (ack.has_pins()) pins_.emplace(ack.pinned_uris().begin(), ack.pinned_uris().end());
        // A notice is answered by its pins, or refused by an Ack naming no
        // batch.
        if ((ack.has_pins() || (ack.seq() == 0 && ack.rejected() > 0)) &&
            notices_unanswered_ > 0) {
          --notices_unanswered_;
        }
        stats_.reports_acked += ack.accepted();
        stats_.reports_duplicate += ack.duplicates();
        stats_.reports_rejected += ack.rejected();
        if (!ack.message().empty()) {
          stats_.last_ack_message = ack.message();
          if (ack.rejected() > 0) {
            SG_LOG(WARNING) << "spikeguardd refused batch " << ack.seq() << ": " << ack.message();
          }
        }
      } else if (in.has_command()) {
        commands_.push_back(in.command());
        // The command's pins are newer than any answer to a notice read
        // before it.
        pins_.reset();
      } else if (in.has_reject()) {
        rejection_ = in.reject();
        stopping_ = true;
        SG_LOG(ERROR) << "spikeguardd rejected rank " << options_.rank << ": "
                      << in.reject().message();
      }
      cv_.SignalAll();
      // On Close the stream is read until the daemon ends it (or the close
      // grace runs out and it is cancelled).
      if (rejection_.has_value()) break;
    }
    absl::MutexLock lock(&mu_);
    connected_ = false;
    // Unanswered notices are resent on the next stream.
    notices_unanswered_ = 0;
    cv_.SignalAll();
  });

  absl::Time last_heartbeat = absl::Now();
  bool graceful = false;
  while (true) {
    std::vector<v1::WorkerMessage> to_send;
    bool finishing = false;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        if (stopping_ || !connected_) break;
        const absl::Time now = absl::Now();
        if (!open_.empty() && now - open_since_ >= options_.flush_interval) SealLocked();
        const bool unsent = std::any_of(unacked_.begin(), unacked_.end(),
                                        [](const Batch& b) { return !b.sent; });
        if (unsent || !outbox_.empty() || now - last_heartbeat >= options_.heartbeat_interval) break;
        absl::Time wake = last_heartbeat + options_.heartbeat_interval;
        if (!open_.empty()) wake = std::min(wake, open_since_ + options_.flush_interval);
        cv_.WaitWithDeadline(&mu_, wake);
      }
      if (!connected_ || rejection_.has_value()) break;
      // Closing: what is queued still goes, then the stream is half-closed.
      finishing = stopping_;
      if (finishing) SealLocked();
      while (!outbox_.empty()) {
        if (outbox_.front().has_checkpoint()) ++notices_unanswered_;
        to_send.push_back(std::move(outbox_.front()));
        outbox_.pop_front();
      }
      for (auto& b : unacked_) {
        if (b.sent) continue;
        b.sent = true;
        v1::WorkerMessage msg;
        *msg.mutable_reports() = b.batch;
        to_send.push_back(std::move(msg));
        ++stats_.batches_sent;
        // A batch is a sign of life as a heartbeat is (the daemon takes
        // both as one): the next heartbeat after heartbeat_interval of none.
        last_heartbeat = absl::Now();
      }
      if (!finishing && absl::Now() - last_heartbeat >= options_.heartbeat_interval) {
        v1::WorkerMessage msg;
        msg.mutable_heartbeat()->set_step(current_step_);
        msg.mutable_heartbeat()->set_unix_ms(absl::ToUnixMillis(absl::Now()));
        to_send.push_back(std::move(msg));
        last_heartbeat = absl::Now();
        ++stats_.heartbeats_sent;
      }
      writing_ = static_cast<int>(to_send.size());
    }
    size_t written = 0;
    while (written < to_send.size() && stream->Write(to_send[written])) ++written;
    {
      absl::MutexLock lock(&mu_);
      writing_ = 0;
      // Notices that did not go out wait for the next stream, in order
      // (report batches are resent from unacked_, heartbeats are not needed).
      for (size_t i = to_send.size(); i > written; --i) {
        v1::WorkerMessage& msg = to_send[i - 1];
        if (msg.has_reports() || msg.has_heartbeat()) continue;
        outbox_.push_front(std::move(msg));
      }
      cv_.SignalAll();
    }
    if (written < to_send.size()) break;
    if (finishing) {
      graceful = true;
      break;
    }
  }
  if (graceful) {
    // The daemon reads to the end, then ends the stream, which ends the reader.
    stream->WritesDone();
  } else {
    context.TryCancel();
  }
  reader.join();
  stream->Finish();
  clear_context();
  absl::MutexLock lock(&mu_);
  return !stopping_;
}

}  // namespace spikeguard::worker
