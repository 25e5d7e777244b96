#include "daemon/server/worker_service.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/const_init.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "daemon/auth/authorizer.h"
#include "daemon/control/supervisor.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/server/audit_interceptor.h"
#include "daemon/server/parse_errors.h"
#include "daemon/server/status_util.h"
#include "grpc/grpc.h"
#include "google/protobuf/map.h"

namespace spikeguard::daemon {
namespace {

using spikeguard::v1::ControllerMessage;
using spikeguard::v1::DataOrder;
using spikeguard::v1::Reject;
using spikeguard::v1::WorkerMessage;

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

ControllerMessage RejectMessage(Reject::Reason reason, const std::string& message,
                                int64_t current_generation) {
  ControllerMessage out;
  Reject* reject = out.mutable_reject();
  reject->set_reason(reason);
  reject->set_message(message);
  reject->set_current_generation(current_generation);
  return out;
}

}  // namespace

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


// The threads that handle the streams' messages. A stream posts one task at
// a time (its next message is read only once the task is done), so a
// stream's messages are handled in order.
class WorkerServiceImpl::TaskPool {
 public:
  explicit TaskPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  // Runs what is queued, then joins.
  ~TaskPool() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (auto& t : threads_) t.join();
  }
  void Post(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || !tasks_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
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
      : service_(service), state_(service->state_), context_(context) {}

  void Start() {
    // The token is in the call's metadata: a stream without a valid one is
    // answered before anything it sends is read.
    if (state_->authorizer != nullptr) {
      auto principal = state_->authorizer->Authenticate(*context_);
      if (!principal.ok()) {
        EndWith(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                             std::string(principal.status().message())),
                RejectMessage(Reject::BAD_TOKEN, std::string(principal.status().message()), 0));
        Pump();
        return;
      }
      who_ = std::move(*principal);
    }
    // Until its hello, a stream is unauthenticated: bounded in number and
    // in time.
    counted_pending_ = true;
    const int pending = service_->pending_hellos_.fetch_add(1) + 1;
    if (pending > state_->limits.max_pending_hellos) {
      EndWith(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrFormat("too many streams waiting for their hello (limits.max_pending_hellos = "
                          "%d); retry later",
                          state_->limits.max_pending_hellos)));
      Pump();
      return;
    }
    hello_timer_ = service_->hello_watchdog_->Arm(
        context_, absl::Now() + state_->limits.hello_timeout,
        absl::StrCat("no hello within ", absl::FormatDuration(state_->limits.hello_timeout),
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
        SG_LOG(WARNING) << "run " << run_name_ << " rank " << rank_
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
        if (state_->catalog != nullptr) {
          AuditRefusedStream(state_->authorizer, state_->catalog, *context_, "Attach",
                             hello_.run(), status);
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
    if (hub_id_ != 0) state_->hub.Remove(hub_id_);
    if (attached_) state_->registry.Disconnect(run_name_, rank_, stream_id_);
    // The hello's timer is disarmed by OnReadDone: a read still pending
    // completes (failed) after Finish.
    if (counted_pending_) service_->pending_hellos_.fetch_sub(1);
    counted_pending_ = false;
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
    if (HandleMessage(msg)) WantNextRead();
  }

  void RejectAndEnd(Reject::Reason reason, const std::string& message,
                    int64_t current_generation, grpc::StatusCode code) {
    EndWith(grpc::Status(code, message), RejectMessage(reason, message, current_generation));
  }

  // The hello: false when the stream ends (a Reject is queued).
  bool HandleHello(const WorkerMessage& msg) {
    if (counted_pending_) {
      service_->pending_hellos_.fetch_sub(1);
      counted_pending_ = false;
    }
    if (!msg.has_hello()) {
      RejectAndEnd(Reject::INVALID_HELLO, "the first message of a stream must be hello", 0,
             grpc::StatusCode::INVALID_ARGUMENT);
      return false;
    }
    hello_ = msg.hello();
    const auto& hello = hello_;
    if (absl::Status s = ValidateHello(hello, state_->limits); !s.ok()) {
      RejectAndEnd(Reject::INVALID_HELLO, std::string(s.message()), 0,
             grpc::StatusCode::INVALID_ARGUMENT);
      return false;
    }
    if (state_->authorizer != nullptr) {
      if (absl::Status s =
              state_->authorizer->Authorize(who_, auth::Need::kWorker, "Attach", hello.run());
          !s.ok()) {
        RejectAndEnd(Reject::BAD_TOKEN, std::string(s.message()), 0,
               grpc::StatusCode::PERMISSION_DENIED);
        return false;
      }
    }
    auto run = state_->catalog->GetRunWithoutRanks(hello.run());
    if (!run.ok()) {
      if (absl::IsNotFound(run.status())) {
        RejectAndEnd(Reject::UNKNOWN_RUN,
               absl::StrCat("unknown run '", hello.run(), "': create it first (spikectl runs create ",
                            hello.run(), ")"),
               0, grpc::StatusCode::NOT_FOUND);
      } else {
        EndWith(ToGrpcStatus(run.status()));
      }
      return false;
    }
    if (run->world_size() != 0 && run->world_size() != hello.world_size()) {
      RejectAndEnd(Reject::INVALID_HELLO,
             absl::StrFormat("hello.world_size: %d does not match run '%s' (world size %d)",
                             hello.world_size(), hello.run(), run->world_size()),
             run->current_generation(), grpc::StatusCode::INVALID_ARGUMENT);
      return false;
    }
    current_ = run->current_generation();
    // A rank still in an older generation may attach only to receive the
    // rewind that leads into the current one; its reports stay fenced.
    catching_up_ = hello.generation() < current_ && state_->supervisor != nullptr &&
                   state_->supervisor->control()->RewindPendingInto(hello.run(), current_);
    generation_ = catching_up_ ? hello.generation() : current_;
    if (hello.generation() != generation_) {
      RejectAndEnd(Reject::STALE_GENERATION,
             absl::StrFormat("stale generation: rank %d of run '%s' runs generation %d, the run "
                             "is at generation %d; exit and restart from the run's current "
                             "checkpoint",
                             hello.rank(), hello.run(), hello.generation(), current_),
             current_, grpc::StatusCode::FAILED_PRECONDITION);
      return false;
    }
    if (hello.has_data_order()) {
      // The data order is what the daemon names documents with: a rank that
      // contradicts the run's manifest or the other ranks would make every
      // resolved document wrong, so it does not attach.
      absl::MutexLock lock(&data_order_mu);
      auto latest = state_->catalog->GetRunWithoutRanks(hello.run());
      if (!latest.ok()) {
        EndWith(ToGrpcStatus(latest.status()));
        return false;
      }
      std::string conflict = ManifestConflict(latest->spec().manifest(), hello.data_order());
      if (conflict.empty() && latest->has_data_order()) {
        // With no other rank live, a relaunch with a new order replaces it.
        if (state_->registry.OtherRankConnected(hello.run(), hello.rank())) {
          conflict = RankConflict(latest->data_order(), hello.data_order(), hello.rank());
        }
      }
      if (!conflict.empty()) {
        SG_LOG(WARNING) << "run " << hello.run() << " rank " << hello.rank()
                        << " refused: " << LogText(conflict, state_->limits.max_logged_text);
        RejectAndEnd(Reject::DATA_ORDER_MISMATCH, conflict, current_,
               grpc::StatusCode::FAILED_PRECONDITION);
        return false;
      }
      if (absl::Status s = state_->catalog->SetRunDataOrder(hello.run(), hello.data_order(),
                                                            hello.total_steps());
          !s.ok()) {
        EndWith(ToGrpcStatus(s));
        return false;
      }
    }
    auto committed = state_->catalog->CommittedStep(hello.run(), generation_, hello.rank());
    if (!committed.ok()) {
      EndWith(ToGrpcStatus(committed.status()));
      return false;
    }
    run_name_ = hello.run();
    rank_ = hello.rank();
    {
      absl::MutexLock lock(&mu_);
      rank_last_step_ = *committed;
    }
    stream_id_ = state_->registry.Connect(run_name_, rank_, generation_, hello.host());
    attached_ = true;
    SG_LOG(INFO) << "attach: run " << run_name_ << " rank " << rank_ << "/" << hello.world_size()
                 << " generation " << generation_ << " from " << context_->peer()
                 << " (committed step " << *committed << ")";
    ControllerMessage welcome;
    welcome.mutable_welcome()->set_run(run_name_);
    welcome.mutable_welcome()->set_generation(generation_);
    welcome.mutable_welcome()->set_committed_step(*committed);
    {
      absl::MutexLock lock(&mu_);
      SendLocked(std::move(welcome));
      // Commands pushed through the hub from now on wait behind the backlog.
      replaying_ = true;
    }
    push_target_ = std::make_shared<PushTarget>();
    {
      absl::MutexLock lock(&push_target_->mu);
      push_target_->reactor = this;
    }
    // Commands pushed by a run's pipeline or an operator's call: queued on
    // this stream (never written by the pusher), so a rank that stops
    // reading stalls only its own stream.
    hub_id_ = state_->hub.Add(
        run_name_, rank_, generation_,
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
    // Whatever this rank has not acknowledged yet, in order (SQLite is read
    // outside every lock), then what was pushed meanwhile.
    std::vector<spikeguard::v1::Command> backlog;
    if (state_->supervisor != nullptr) {
      backlog = state_->supervisor->control()->Unacknowledged(run_name_, generation_);
    }
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

  void Push(const ControllerMessage& m) {
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
        const auto& c = msg.checkpoint();
        if (absl::Status s = ValidateCheckpointSaved(c, state_->limits); !s.ok()) {
          SG_LOG(WARNING) << "run " << run_name_ << " rank " << rank_
                          << ": checkpoint refused: " << LogText(s.message());
          // The worker is told why (an Ack naming no batch: seq 0).
          ControllerMessage refused;
          refused.mutable_ack()->set_rejected(1);
          refused.mutable_ack()->set_message(absl::StrCat("checkpoint refused: ", s.message()));
          Send(std::move(refused));
          return true;
        }
        // Confined to the run's checkpoint root before anything is stored;
        // the worker is told why (an Ack naming no batch).
        if (state_->checkpoints != nullptr) {
          if (auto confined = state_->checkpoints->Confine(run_name_, c.uri()); !confined.ok()) {
            SG_LOG(WARNING) << "run " << run_name_ << " rank " << rank_
                            << ": checkpoint refused: " << LogText(confined.status().message());
            ControllerMessage refused;
            refused.mutable_ack()->set_rejected(1);
            refused.mutable_ack()->set_message(
                absl::StrCat("checkpoint refused: ", confined.status().message()));
            Send(std::move(refused));
            return true;
          }
        }
        spikeguard::v1::Checkpoint ckpt;
        ckpt.set_run(run_name_);
        ckpt.set_generation(generation_);
        ckpt.set_step(c.step());
        ckpt.set_data_position(c.data_position());
        ckpt.set_uri(c.uri());
        ckpt.set_bytes(c.bytes());
        ckpt.set_checksum(c.checksum());
        ckpt.set_complete(c.complete());
        ckpt.set_has_rng_state(c.has_rng_state());
        ckpt.set_has_data_loader_state(c.has_data_loader_state());
        ckpt.set_created_unix_ms(state_->clock->NowUnixMillis());
        if (auto s = state_->catalog->UpsertCheckpoint(ckpt); !s.ok()) {
          SG_LOG(ERROR) << "run " << run_name_ << ": checkpoint not recorded: " << s.status();
        }
        return true;
      }
      case WorkerMessage::kCheckpointDeleted: {
        const auto& d = msg.checkpoint_deleted();
        if (absl::Status s = ValidateCheckpointDeleted(d, state_->limits); !s.ok()) {
          SG_LOG(WARNING) << "run " << run_name_ << " rank " << rank_
                          << ": checkpoint deletion notice refused: " << LogText(s.message());
          ControllerMessage refused;
          refused.mutable_ack()->set_rejected(1);
          refused.mutable_ack()->set_message(
              absl::StrCat("checkpoint deletion notice refused: ", s.message()));
          Send(std::move(refused));
          return true;
        }
        auto deleted = state_->catalog->DeleteCheckpoint(run_name_, d.step(), d.uri());
        if (!deleted.ok()) {
          SG_LOG(ERROR) << "run " << run_name_ << ": checkpoint deletion not recorded: "
                        << deleted.status();
        } else if (*deleted) {
          SG_LOG(INFO) << "run " << run_name_ << " rank " << rank_ << " deleted checkpoint "
                       << LogText(d.uri(), state_->limits.max_logged_text) << " (step "
                       << d.step() << ")";
        }
        return true;
      }
      case WorkerMessage::kGenerationEnded: {
        const auto& e = msg.generation_ended();
        if (absl::Status s = ValidateGenerationEnded(e, state_->limits); !s.ok()) {
          SG_LOG(WARNING) << "run " << run_name_ << " rank " << rank_
                          << ": generation_ended refused: " << LogText(s.message());
          return true;
        }
        if (catching_up_ || e.generation() != generation_) {
          // Fenced like reports: only the stream's own generation counts.
          SG_LOG(WARNING) << "run " << run_name_ << " rank " << rank_ << ": end of generation "
                          << e.generation() << " ignored on a stream of generation "
                          << generation_ << (catching_up_ ? " (catching up)" : "");
          return true;
        }
        SG_LOG(INFO) << "run " << run_name_ << " rank " << rank_ << ": generation "
                     << e.generation() << " ended at step " << e.last_step() << ": "
                     << LogText(e.reason(), state_->limits.max_logged_text);
        if (state_->supervisor != nullptr) {
          state_->supervisor->OnGenerationEnded(run_name_, e.generation(), rank_, e.last_step(),
                                                e.reason());
        }
        return true;
      }
      case WorkerMessage::kHeartbeat: {
        // A heartbeat's step moves the rank's last step only as far as a
        // report could (it bounds the steps of later reports).
        const int64_t step = msg.heartbeat().step();
        int64_t base;
        {
          absl::MutexLock lock(&mu_);
          base = std::max<int64_t>(rank_last_step_, 0);
        }
        const bool plausible =
            step >= 0 && (step <= base || step - base <= state_->limits.max_step_ahead);
        state_->registry.Touch(run_name_, rank_, plausible ? step : -1);
        return true;
      }
      case WorkerMessage::kCommandResult: {
        const auto& r = msg.command_result();
        SG_LOG(INFO) << "run " << run_name_ << " rank " << rank_ << ": command "
                     << LogText(r.command_id(), 128) << " " << (r.ok() ? "ok" : "failed") << ": "
                     << LogText(r.message(), state_->limits.max_logged_text);
        if (state_->supervisor != nullptr) {
          state_->supervisor->control()->OnCommandResult(run_name_, rank_, r);
          if (!r.ok()) {
            state_->supervisor->OnCommandFailed(run_name_, r.command_id(), rank_, r.message());
          }
        }
        return true;
      }
      case WorkerMessage::kHello:
        RejectAndEnd(Reject::INVALID_HELLO, "hello sent twice on one stream", generation_,
               grpc::StatusCode::INVALID_ARGUMENT);
        return false;
      case WorkerMessage::BODY_NOT_SET:
        SG_LOG(WARNING) << "run " << run_name_ << " rank " << rank_
                        << ": message with no body ignored";
        return true;
    }
    return true;
  }

  bool HandleReports(WorkerMessage& msg) {
    const absl::Time received = absl::Now();
    const auto& batch = msg.reports();
    ControllerMessage ack_msg;
    auto* ack = ack_msg.mutable_ack();
    ack->set_seq(batch.seq());
    const int64_t batch_gen = batch.has_generation() ? batch.generation() : generation_;
    if (catching_up_) {
      ack->set_rejected(batch.reports_size());
      ack->set_message(absl::StrFormat(
          "stale generation: reports of generation %d refused; the run is at generation %d",
          batch_gen, current_));
      state_->counters.reports_rejected.fetch_add(batch.reports_size());
      SendAck(std::move(ack_msg), received);
      return true;
    }
    if (batch_gen != generation_) {
      RejectAndEnd(Reject::STALE_GENERATION,
             absl::StrFormat("stale generation: reports of generation %d on a stream of "
                             "generation %d",
                             batch_gen, generation_),
             generation_, grpc::StatusCode::FAILED_PRECONDITION);
      return false;
    }
    absl::Status valid = ValidateBatch(batch, state_->limits);
    if (valid.ok()) {
      int64_t run_last_step;
      {
        absl::MutexLock lock(&mu_);
        run_last_step = std::max(rank_last_step_, hello_.total_steps());
      }
      run_last_step = std::max(run_last_step, state_->registry.LastStep(run_name_));
      valid = ValidateStepsAhead(batch, run_last_step, state_->limits);
    }
    if (!valid.ok()) {
      ack->set_rejected(batch.reports_size());
      ack->set_message(std::string(valid.message()));
      state_->counters.reports_rejected.fetch_add(batch.reports_size());
      SG_LOG(WARNING) << "run " << run_name_ << " rank " << rank_ << ": batch " << batch.seq()
                      << " rejected: " << LogText(valid.message(), state_->limits.max_logged_text);
      SendAck(std::move(ack_msg), received);
      return true;
    }
    storage::IngestBatch to_commit;
    to_commit.run = run_name_;
    to_commit.generation = generation_;
    to_commit.rank = rank_;
    to_commit.world_size = std::max<uint32_t>(1, hello_.world_size());
    // The generation fence is checked in the transaction that stores the batch.
    to_commit.require_current = true;
    // The registry keeps only each rank's furthest step.
    const auto furthest =
        std::max_element(batch.reports().begin(), batch.reports().end(),
                         [](const auto& a, const auto& b) { return a.step() < b.step(); });
    spikeguard::v1::StepReport last =
        furthest != batch.reports().end() ? *furthest : spikeguard::v1::StepReport();
    const int batch_reports = batch.reports_size();
    const uint64_t seq = batch.seq();
    // The reports move into the batch.
    auto* moved = msg.mutable_reports()->mutable_reports();
    to_commit.reports.reserve(moved->size());
    for (auto& r : *moved) to_commit.reports.push_back(std::move(r));
    {
      absl::MutexLock lock(&mu_);
      ++holds_;
      ++commits_;
    }
    service_->ingest_->CommitAsync(
        std::move(to_commit),
        [this, seq, batch_gen, batch_reports, received, last = std::move(last)](
            storage::BatchOutcome outcome) {
          OnCommitted(outcome, seq, batch_gen, batch_reports, last, received);
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

  // On the commit thread: answers one batch (only queues).
  void OnCommitted(const storage::BatchOutcome& outcome, uint64_t seq, int64_t batch_gen,
                   int batch_reports, const spikeguard::v1::StepReport& last,
                   absl::Time received) {
    ControllerMessage ack_msg;
    auto* ack = ack_msg.mutable_ack();
    ack->set_seq(seq);
    if (absl::IsFailedPrecondition(outcome.status)) {
      ack->set_rejected(batch_reports);
      ack->set_message(absl::StrFormat(
          "stale generation: reports of generation %d refused; the run is at generation %d",
          batch_gen, outcome.run_generation));
      state_->counters.reports_rejected.fetch_add(batch_reports);
      SendAck(std::move(ack_msg), received);
      return;
    }
    if (!outcome.status.ok()) {
      // Not committed, so not acknowledged: the client resends after it reconnects.
      SG_LOG(ERROR) << "run " << run_name_ << " rank " << rank_
                    << ": ingest failed: " << outcome.status;
      EndWith(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrCat("catalog write failed: ", outcome.status.message())));
      return;
    }
    const storage::IngestResult& ingested = outcome.result;
    {
      absl::MutexLock lock(&mu_);
      rank_last_step_ = std::max(rank_last_step_, ingested.committed_step);
    }
    if (batch_reports > 0) state_->registry.AddReports(run_name_, rank_, std::span(&last, 1));
    state_->counters.reports_accepted.fetch_add(ingested.accepted);
    state_->counters.reports_duplicate.fetch_add(ingested.duplicates);
    ack->set_accepted(ingested.accepted);
    ack->set_duplicates(ingested.duplicates);
    if (ingested.duplicates > 0) {
      ack->set_message(absl::StrFormat(
          "%d duplicate or out-of-order reports ignored: rank %d already committed step %d",
          ingested.duplicates, rank_, ingested.committed_step));
    }
    SendAck(std::move(ack_msg), received);
  }

  // An ack, timed from when its batch was read (spikeguard_ack_latency_seconds).
  void SendAck(ControllerMessage ack, absl::Time received) {
    state_->metrics.ack_latency_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - received));
    Send(std::move(ack));
  }

  WorkerServiceImpl* const service_;
  DaemonState* const state_;
  grpc::CallbackServerContext* const context_;

  // Set before the first read, or by the pool task handling the hello (the
  // stream's tasks never run at once, and the next read starts after it):
  // read-only afterwards.
  auth::Principal who_;
  uint64_t hello_timer_ = 0;
  bool counted_pending_ = false;
  bool attached_ = false;
  spikeguard::v1::Hello hello_;
  std::string run_name_;
  uint32_t rank_ = 0;
  int64_t current_ = 0;
  int64_t generation_ = 0;
  bool catching_up_ = false;
  uint64_t stream_id_ = 0;
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
  // The furthest step this rank committed: later reports may not run
  // arbitrarily far past what the run has reached.
  int64_t rank_last_step_ ABSL_GUARDED_BY(mu_) = 0;
};

WorkerServiceImpl::WorkerServiceImpl(DaemonState* state)
    : state_(state), hello_watchdog_(std::make_unique<HelloWatchdog>()) {
  InstallParseErrorCapture();
  GroupCommitter::Options options;
  options.metrics = &state_->metrics;
  // Test hook (tests/e2e/telemetry_e2e_test.cc): exit between a group's
  // commit and its acks.
  if (const char* n = std::getenv("SPIKEGUARD_TEST_EXIT_AFTER_GROUPS"); n != nullptr) {
    options.exit_after_groups = std::atoll(n);
  }
  ingest_ = std::make_unique<GroupCommitter>(
      state_->catalog, options,
      [state](std::vector<storage::CompletedStep> completed, absl::Time arrived) {
        if (state->supervisor != nullptr) {
          state->supervisor->OnCompleted(std::move(completed), arrived);
        }
      },
      [state] {
        if (state->supervisor != nullptr) state->supervisor->WaitForRoom();
      });
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
