#include "daemon/server/worker_service.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "daemon/auth/authorizer.h"
#include "daemon/control/supervisor.h"
#include "daemon/ingest/worker_session.h"
#include "daemon/server/audit_interceptor.h"
#include "daemon/server/parse_errors.h"
#include "daemon/server/status_util.h"
#include "grpc/grpc.h"

namespace spikeguard::daemon {

using spikeguard::v1::ControllerMessage;
using spikeguard::v1::Reject;
using spikeguard::v1::WorkerMessage;

// One thread for every stream still waiting for its hello: at the deadline
// the call is cancelled with DEADLINE_EXCEEDED and a message saying why
// (the stream's pending read then fails).
class WorkerServiceImpl::HelloWatchdog {
 public:
  HelloWatchdog() : thread_([this] { Loop(); }) {}
  ~HelloWatchdog() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  uint64_t Arm(grpc::ServerContextBase* context, absl::Time deadline, std::string message) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    entries_[id] = Entry{context, deadline, std::move(message)};
    return id;
  }

  // Once this returns, the watchdog no longer touches the call.
  void Disarm(uint64_t id) {
    absl::MutexLock lock(&mu_);
    entries_.erase(id);
  }

 private:
  struct Entry {
    grpc::ServerContextBase* context;
    absl::Time deadline;
    std::string message;
  };

  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      const absl::Time now = absl::Now();
      absl::Time next = now + absl::Milliseconds(250);
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->second.deadline <= now) {
          // Under the lock: the handler cannot return (Disarm) meanwhile.
          grpc_call_cancel_with_status(it->second.context->c_call(), GRPC_STATUS_DEADLINE_EXCEEDED,
                                       it->second.message.c_str(), nullptr);
          it = entries_.erase(it);
        } else {
          next = std::min(next, it->second.deadline);
          ++it;
        }
      }
      mu_.AwaitWithDeadline(absl::Condition(&stop_), next);
    }
  }

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};


// One Attach stream. Every gRPC operation (StartRead, StartWrite, Finish) is
// started outside mu_, by Pump, which decides under mu_ what to start; a
// flag set under mu_ (reading_, writing_, finished_) makes each start happen
// once. Work outside the reactions (a pool task, a commit callback, a pushed
// command) holds the reactor (holds_): the stream is finished only when no
// hold is left, no write is pending and the end (end_) is decided, so
// nothing touches the reactor after Finish; gRPC calls OnDone, which
// deletes it, once Finish and every pending operation completed.
class WorkerServiceImpl::AttachReactor final
    : public grpc::ServerBidiReactor<WorkerMessage, ControllerMessage> {
 public:
  AttachReactor(WorkerServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service),
        deps_(service->deps_),
        context_(context),
        session_(deps_.session, [this](const std::string& run) { return Authorize(run); }) {}

  void Start() {
    // The token is in the call's metadata: a stream without a valid one is
    // answered before anything it sends is read.
    if (deps_.authorizer != nullptr) {
      auth_epoch_ = deps_.authorizer->epoch();
      auto principal = deps_.authorizer->Authenticate(*context_);
      if (!principal.ok()) {
        EndWithError(Refusal(Reject::BAD_TOKEN, principal.status().message(), 0,
                             absl::StatusCode::kUnauthenticated));
        Pump();
        return;
      }
      who_ = std::move(*principal);
      // A principal that may attach no rank (a viewer) takes no slot.
      if (absl::Status s = deps_.authorizer->AuthorizeRole(who_, auth::Need::kWorker, "Attach");
          !s.ok()) {
        EndWithError(Refusal(Reject::BAD_TOKEN, s.message(), 0, absl::StatusCode::kPermissionDenied));
        Pump();
        return;
      }
    }
    // Until its hello, a stream is unauthenticated: bounded in number and
    // in time, and per principal.
    counted_pending_ = true;
    const int pending = service_->pending_hellos_.fetch_add(1) + 1;
    if (!CountPendingOfPrincipal()) {
      EndWith(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrFormat("principal '%s' has too many streams waiting for their hello "
                          "(limits.max_pending_hellos_per_principal = %d); retry later",
                          who_.name, deps_.session.limits.max_pending_hellos_per_principal)));
      Pump();
      return;
    }
    if (pending > deps_.session.limits.max_pending_hellos) {
      EndWith(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrFormat("too many streams waiting for their hello (limits.max_pending_hellos = "
                          "%d); retry later",
                          deps_.session.limits.max_pending_hellos)));
      Pump();
      return;
    }
    hello_timer_ = service_->hello_watchdog_->Arm(
        context_, absl::Now() + deps_.session.limits.hello_timeout,
        absl::StrCat("no hello within ", absl::FormatDuration(deps_.session.limits.hello_timeout),
                     " (limits.hello_timeout): the first message of a stream must be hello"));
    {
      absl::MutexLock lock(&mu_);
      read_wanted_ = true;
    }
    Pump();
  }

  void OnReadDone(bool ok) override {
    const bool first = !attached_ && hello_timer_ != 0;
    if (first) {
      service_->hello_watchdog_->Disarm(hello_timer_);
      hello_timer_ = 0;
    }
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      // The end is decided (a failed commit, a cancel): a message that was
      // already on its way is dropped unhandled. The stream may be finished
      // already, and gRPC deletes the reactor once this reaction returns: a
      // task or a commit started from here would outlive it.
      if (ok && end_.has_value()) return;
    }
    if (!ok) {
      // Read fails alike on a half-close, a cancel and a message that does
      // not parse: protobuf names the field of the latter.
      const std::string field = TakeStreamParseError(context_);
      grpc::Status status = grpc::Status::OK;
      if (context_->IsCancelled()) {
        // The client went away, or no hello in time.
      } else if (!attached_) {
        // Half-closed without a hello, or a first message that does not
        // parse (malformed bytes, invalid UTF-8 in a string field).
        status = grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("no hello: the stream ended or its first message could not be parsed as "
                         "a WorkerMessage (",
                         field.empty()
                             ? "malformed protobuf or invalid UTF-8 in a string field"
                             : ParseErrorMessage(field, "the hello"),
                         ")"));
      } else if (!field.empty()) {
        SG_LOG(WARNING) << "run " << session_.run() << " rank " << session_.rank()
                        << ": stream ended: " << ParseErrorMessage(field, "a message");
        status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              ParseErrorMessage(field, "a message"));
      }
      EndWith(status);
      Pump();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      ++holds_;
    }
    service_->pool_->Post([this, msg = std::move(in_)]() mutable {
      Handle(std::move(msg));
      Release();
    });
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        // The stream is gone: nothing more can be written.
        write_failed_ = true;
        if (!end_.has_value()) end_ = grpc::Status::OK;
      }
    }
    Pump();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (!end_.has_value()) end_ = grpc::Status::OK;
    }
    Pump();
  }

  void OnDone() override { delete this; }

 private:
  // What the hub's push reaches: the reactor until its stream ends.
  struct PushTarget {
    absl::Mutex mu;
    AttachReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };

  // A hold from outside the reactions; false once the end is decided.
  bool TryHold() {
    absl::MutexLock lock(&mu_);
    if (end_.has_value()) return false;
    ++holds_;
    return true;
  }
  void Release() {
    {
      absl::MutexLock lock(&mu_);
      --holds_;
    }
    Pump();
  }

  // The stream ends with `status` once what is queued (and `last`, when
  // given: a Reject) is written and every hold is released. The first end
  // decided wins.
  void EndWith(grpc::Status status, std::optional<ControllerMessage> last = std::nullopt) {
    absl::MutexLock lock(&mu_);
    if (end_.has_value()) return;
    if (last.has_value()) queue_.push_back(std::move(*last));
    end_ = std::move(status);
  }

  // Queues `m` (a command goes out at most once per stream).
  void Send(ControllerMessage m) {
    {
      absl::MutexLock lock(&mu_);
      SendLocked(std::move(m));
    }
    Pump();
  }
  void SendLocked(ControllerMessage m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (write_failed_) return;
    if (m.has_command() && !commands_sent_.insert(m.command().id()).second) return;
    queue_.push_back(std::move(m));
  }

  // Starts what can start: the next write, the next read, or the end.
  void Pump() {
    while (true) {
      bool start_write = false, start_read = false, finish = false;
      grpc::Status status;
      {
        absl::MutexLock lock(&mu_);
        if (finished_) return;
        if (write_failed_) queue_.clear();
        if (!writing_ && !queue_.empty()) {
          writing_msg_ = std::move(queue_.front());
          queue_.pop_front();
          writing_ = true;
          start_write = true;
        }
        if (read_wanted_ && !reading_ && !end_.has_value()) {
          read_wanted_ = false;
          reading_ = true;
          start_read = true;
        }
        if (start_write || start_read) {
          ++starting_;
        } else if (end_.has_value() && holds_ == 0 && starting_ == 0 && !writing_) {
          finished_ = true;
          finish = true;
          status = *end_;
        }
      }
      if (finish) {
        Teardown();
        if (deps_.session.catalog != nullptr) {
          AuditRefusedStream(deps_.authorizer, deps_.session.catalog, *context_, "Attach",
                             session_.hello().run(), status);
        }
        Finish(status);
        return;
      }
      if (!start_write && !start_read) return;
      if (start_write) StartWrite(&writing_msg_);
      if (start_read) StartRead(&in_);
      absl::MutexLock lock(&mu_);
      --starting_;
    }
  }

  // Before Finish: nothing reaches this reactor any more.
  void Teardown() {
    if (push_target_ != nullptr) {
      absl::MutexLock lock(&push_target_->mu);
      push_target_->reactor = nullptr;
    }
    if (hub_id_ != 0) deps_.hub->Remove(hub_id_);
    session_.Detach();
    // The hello's timer is disarmed by OnReadDone: a read still pending
    // completes after Finish (failed, or with a message it drops).
    UncountPending();
  }

  // The principal's pending-hello slot: false (and none taken) when it
  // holds its share already. Only with authentication on.
  bool CountPendingOfPrincipal() {
    if (deps_.authorizer == nullptr || !deps_.authorizer->enabled()) return true;
    absl::MutexLock lock(&service_->pending_mu_);
    int& mine = service_->pending_by_principal_[who_.name];
    if (mine >= deps_.session.limits.max_pending_hellos_per_principal) {
      if (mine == 0) service_->pending_by_principal_.erase(who_.name);
      return false;
    }
    ++mine;
    counted_principal_ = true;
    return true;
  }

  // Gives back the stream's pending-hello slots (once).
  void UncountPending() {
    if (counted_pending_) service_->pending_hellos_.fetch_sub(1);
    counted_pending_ = false;
    if (!counted_principal_) return;
    counted_principal_ = false;
    absl::MutexLock lock(&service_->pending_mu_);
    auto it = service_->pending_by_principal_.find(who_.name);
    if (it != service_->pending_by_principal_.end() && --it->second <= 0) {
      service_->pending_by_principal_.erase(it);
    }
  }

  // After a message is handled: read the next one, unless the stream is
  // ending or too many of its batches wait for their commit.
  void WantNextRead() {
    absl::MutexLock lock(&mu_);
    if (end_.has_value()) return;
    if (commits_ < kMaxBatchesInFlight) {
      read_wanted_ = true;
    } else {
      read_paused_ = true;
    }
  }

  void Handle(WorkerMessage msg) {
    if (!attached_) {
      if (HandleHello(msg)) WantNextRead();
      return;
    }
    if (!StillAuthorized()) return;
    if (HandleMessage(msg)) WantNextRead();
  }

  // The principal authenticated in Start may attach ranks of `run` (checked
  // again if the tokens were re-read since).
  absl::Status Authorize(const std::string& run) {
    if (deps_.authorizer == nullptr) return absl::OkStatus();
    grpc::Status again = deps_.authorizer->Recheck(*context_, auth::Need::kWorker, "Attach",
                                                      run, &auth_epoch_);
    if (!again.ok()) return absl::PermissionDeniedError(again.error_message());
    return deps_.authorizer->Authorize(who_, auth::Need::kWorker, "Attach", run);
  }

  // An attached stream whose token was revoked (the tokens file re-read)
  // ends with a Reject: false then.
  bool StillAuthorized() {
    if (deps_.authorizer == nullptr) return true;
    grpc::Status s = deps_.authorizer->Recheck(*context_, auth::Need::kWorker, "Attach",
                                                 session_.run(), &auth_epoch_);
    if (s.ok()) return true;
    EndWithError(Refusal(Reject::BAD_TOKEN, s.error_message(), session_.generation(),
                         static_cast<absl::StatusCode>(s.error_code())));
    return false;
  }

  // Ends the stream with a session's error, after its Reject when it
  // carries one.
  void EndWithError(const absl::Status& error) {
    std::optional<ControllerMessage> last;
    if (std::optional<Reject> reject = RejectOf(error); reject.has_value()) {
      last.emplace();
      *last->mutable_reject() = std::move(*reject);
    }
    EndWith(ToGrpcStatus(error), std::move(last));
  }

  // The hello: false when the stream ends (a Reject is queued).
  bool HandleHello(const WorkerMessage& msg) {
    UncountPending();
    if (!msg.has_hello()) {
      EndWithError(Refusal(Reject::INVALID_HELLO, "the first message of a stream must be hello", 0,
                           absl::StatusCode::kInvalidArgument));
      return false;
    }
    absl::StatusOr<spikeguard::v1::Welcome> welcome = session_.Hello(msg.hello());
    if (!welcome.ok()) {
      EndWithError(welcome.status());
      return false;
    }
    attached_ = true;
    SG_LOG(INFO) << "attach: run " << session_.run() << " rank " << session_.rank() << "/"
                 << msg.hello().world_size() << " generation " << session_.generation()
                 << " from " << context_->peer() << " (committed step "
                 << welcome->committed_step() << ")";
    {
      ControllerMessage out;
      *out.mutable_welcome() = std::move(*welcome);
      absl::MutexLock lock(&mu_);
      SendLocked(std::move(out));
      // Commands pushed through the hub from now on wait behind the backlog.
      replaying_ = true;
    }
    SubscribeToPushes();
    // Whatever this rank has not acknowledged yet, in order (SQLite is read
    // outside every lock), then what was pushed meanwhile.
    std::vector<spikeguard::v1::Command> backlog = session_.Unacknowledged();
    {
      absl::MutexLock lock(&mu_);
      for (auto& command : backlog) {
        ControllerMessage out;
        *out.mutable_command() = std::move(command);
        SendLocked(std::move(out));
      }
      for (auto& m : held_pushes_) SendLocked(std::move(m));
      held_pushes_.clear();
      replaying_ = false;
    }
    return true;
  }

  // Commands pushed by a run's pipeline or an operator's call: queued on
  // this stream (never written by the pusher), so a rank that stops reading
  // stalls only its own stream.
  void SubscribeToPushes() {
    push_target_ = std::make_shared<PushTarget>();
    {
      absl::MutexLock lock(&push_target_->mu);
      push_target_->reactor = this;
    }
    hub_id_ = deps_.hub->Add(
        session_.run(),
        [target = push_target_](const ControllerMessage& m) {
          AttachReactor* reactor = nullptr;
          {
            absl::MutexLock lock(&target->mu);
            if (target->reactor == nullptr || !target->reactor->TryHold()) return false;
            reactor = target->reactor;
          }
          reactor->Push(m);
          reactor->Release();
          return true;
        });
  }

  void Push(const ControllerMessage& m) {
    if (!StillAuthorized()) {
      Pump();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (replaying_) {
        held_pushes_.push_back(m);
        return;
      }
      SendLocked(m);
    }
    Pump();
  }

  // Every message after the hello: false when the stream ends.
  bool HandleMessage(WorkerMessage& msg) {
    switch (msg.body_case()) {
      case WorkerMessage::kReports:
        return HandleReports(msg);
      case WorkerMessage::kCheckpoint: {
        // Stored: answered with the pins retention must keep (seq 0, no batch).
        ControllerMessage pins;
        const absl::Status saved = session_.CheckpointSaved(msg.checkpoint(), pins.mutable_ack());
        AnswerNotice(saved);
        if (saved.ok() && pins.ack().has_pins()) Send(std::move(pins));
        return true;
      }
      case WorkerMessage::kCheckpointDeleted:
        AnswerNotice(session_.CheckpointDeleted(msg.checkpoint_deleted()));
        return true;
      case WorkerMessage::kGenerationEnded:
        session_.GenerationEnded(msg.generation_ended());
        return true;
      case WorkerMessage::kHeartbeat:
        session_.Heartbeat(msg.heartbeat());
        return true;
      case WorkerMessage::kCommandResult:
        session_.CommandResult(msg.command_result());
        return true;
      case WorkerMessage::kHello:
        EndWithError(Refusal(Reject::INVALID_HELLO, "hello sent twice on one stream",
                             session_.generation(), absl::StatusCode::kInvalidArgument));
        return false;
      case WorkerMessage::BODY_NOT_SET:
        SG_LOG(WARNING) << "run " << session_.run() << " rank " << session_.rank()
                        << ": message with no body ignored";
        return true;
    }
    return true;
  }

  // A refused notice is answered by an Ack naming no batch (seq 0).
  void AnswerNotice(const absl::Status& refused) {
    if (refused.ok()) return;
    ControllerMessage out;
    out.mutable_ack()->set_rejected(1);
    out.mutable_ack()->set_message(std::string(refused.message()));
    Send(std::move(out));
  }

  // A batch goes to the group committer and is acknowledged once durable;
  // an invalid one is acknowledged as rejected at once.
  bool HandleReports(WorkerMessage& msg) {
    const absl::Time received = absl::Now();
    const uint64_t seq = msg.reports().seq();
    const int reports = msg.reports().reports_size();
    absl::StatusOr<WorkerSession::AcceptedBatch> accepted =
        session_.Reports(std::move(*msg.mutable_reports()));
    if (!accepted.ok()) {
      if (RejectOf(accepted.status()).has_value()) {
        EndWithError(accepted.status());
        return false;
      }
      spikeguard::v1::Ack ack;
      ack.set_seq(seq);
      ack.set_rejected(reports);
      ack.set_message(std::string(accepted.status().message()));
      SendAck(std::move(ack), received);
      return true;
    }
    {
      absl::MutexLock lock(&mu_);
      ++holds_;
      ++commits_;
    }
    service_->ingest_->CommitAsync(
        std::move(accepted->batch),
        [this, ticket = std::move(accepted->ticket), received](BatchOutcome outcome) {
          // On the commit thread: only queues.
          absl::StatusOr<spikeguard::v1::Ack> ack = session_.Committed(outcome, ticket);
          if (ack.ok()) {
            SendAck(std::move(*ack), received);
          } else {
            EndWith(ToGrpcStatus(ack.status()));
          }
          {
            absl::MutexLock lock(&mu_);
            --commits_;
            if (read_paused_ && commits_ < kMaxBatchesInFlight && !end_.has_value()) {
              read_paused_ = false;
              read_wanted_ = true;
            }
          }
          Release();
        });
    return true;
  }

  // An ack, timed from when its batch was read (spikeguard_ack_latency_seconds).
  void SendAck(spikeguard::v1::Ack ack, absl::Time received) {
    deps_.metrics->ack_latency_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - received));
    ControllerMessage out;
    *out.mutable_ack() = std::move(ack);
    Send(std::move(out));
  }

  WorkerServiceImpl* const service_;
  const WorkerServiceImpl::Deps& deps_;
  grpc::CallbackServerContext* const context_;
  // What the stream's messages mean; the reactor only carries them.
  WorkerSession session_;

  // Set before the first read, or by the pool task handling the hello (the
  // stream's tasks never run at once, and the next read starts after it):
  // read-only afterwards.
  auth::Principal who_;
  // The tokens table who_ was checked against (Authorizer::Recheck).
  std::atomic<uint64_t> auth_epoch_{0};
  uint64_t hello_timer_ = 0;
  bool counted_pending_ = false;
  bool counted_principal_ = false;
  bool attached_ = false;
  uint64_t hub_id_ = 0;
  std::shared_ptr<PushTarget> push_target_;

  WorkerMessage in_;                // the pending read's message
  ControllerMessage writing_msg_;   // the pending write's message

  absl::Mutex mu_;
  std::deque<ControllerMessage> queue_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> commands_sent_ ABSL_GUARDED_BY(mu_);
  bool replaying_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<ControllerMessage> held_pushes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  int commits_ ABSL_GUARDED_BY(mu_) = 0;
  int starting_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

WorkerServiceImpl::WorkerServiceImpl(const Deps& deps, GroupCommitter* ingest)
    : deps_(deps), hello_watchdog_(std::make_unique<HelloWatchdog>()), ingest_(ingest) {
  InstallParseErrorCapture();
  // Message handling does SQLite reads (hello, checkpoint notices): a few
  // threads, so one slow statement does not hold every stream.
  pool_ = std::make_unique<TaskPool>(4);
}

WorkerServiceImpl::~WorkerServiceImpl() = default;

grpc::ServerBidiReactor<WorkerMessage, ControllerMessage>* WorkerServiceImpl::Attach(
    grpc::CallbackServerContext* context) {
  auto* reactor = new AttachReactor(this, context);
  reactor->Start();
  return reactor;
}

}  // namespace spikeguard::daemon
