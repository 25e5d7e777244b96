#include "daemon/server/worker_service.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <map>
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

grpc::Status SendReject(grpc::ServerReaderWriter<ControllerMessage, WorkerMessage>* stream,
                        Reject::Reason reason, const std::string& message,
                        int64_t current_generation, grpc::StatusCode code) {
  ControllerMessage out;
  Reject* reject = out.mutable_reject();
  reject->set_reason(reason);
  reject->set_message(message);
  reject->set_current_generation(current_generation);
  stream->Write(out);
  return grpc::Status(code, message);
}

}  // namespace

// One thread for every stream still waiting for its hello: at the deadline
// the call is cancelled with DEADLINE_EXCEEDED and a message saying why
// (the handler's blocked Read then returns).
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

  uint64_t Arm(grpc::ServerContext* context, absl::Time deadline, std::string message) {
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
    grpc::ServerContext* context;
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

WorkerServiceImpl::WorkerServiceImpl(DaemonState* state)
    : state_(state), hello_watchdog_(std::make_unique<HelloWatchdog>()) {
  InstallParseErrorCapture();
  GroupCommitter::Options options;
  // Test hook (tests/e2e/telemetry_e2e_test.cc): exit between a group's
  // commit and its acks.
  if (const char* n = std::getenv("SPIKEGUARD_TEST_EXIT_AFTER_GROUPS"); n != nullptr) {
    options.exit_after_groups = std::atoll(n);
  }
  ingest_ = std::make_unique<GroupCommitter>(
      state_->catalog, options, [state](std::vector<storage::CompletedStep> completed) {
        if (state->supervisor != nullptr) state->supervisor->OnCompleted(std::move(completed));
      });
}

WorkerServiceImpl::~WorkerServiceImpl() = default;

grpc::Status WorkerServiceImpl::Attach(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<ControllerMessage, WorkerMessage>* stream) {
  // The token is in the call's metadata: a stream without a valid one is
  // answered before anything it sends is read.
  auth::Principal who;
  if (state_->authorizer != nullptr) {
    auto principal = state_->authorizer->Authenticate(*context);
    if (!principal.ok()) {
      return SendReject(stream, Reject::BAD_TOKEN, std::string(principal.status().message()), 0,
                        grpc::StatusCode::UNAUTHENTICATED);
    }
    who = std::move(*principal);
  }
  WorkerMessage msg;
  {
    // Until its hello, a stream is unauthenticated: bounded in number and
    // in time.
    const int pending = pending_hellos_.fetch_add(1) + 1;
    struct Pending {
      std::atomic<int>* n;
      ~Pending() { n->fetch_sub(1); }
    } pending_guard{&pending_hellos_};
    if (pending > state_->limits.max_pending_hellos) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrFormat("too many streams waiting for their hello (limits.max_pending_hellos = "
                          "%d); retry later",
                          state_->limits.max_pending_hellos));
    }
    const uint64_t timer = hello_watchdog_->Arm(
        context, absl::Now() + state_->limits.hello_timeout,
        absl::StrCat("no hello within ", absl::FormatDuration(state_->limits.hello_timeout),
                     " (limits.hello_timeout): the first message of a stream must be hello"));
    TakeParseError();
    const bool read = stream->Read(&msg);
    hello_watchdog_->Disarm(timer);
    if (!read) {
      if (context->IsCancelled()) return grpc::Status::OK;  // the client went away, or no hello in time
      // Half-closed without a hello, or a first message that does not parse
      // (malformed bytes, invalid UTF-8 in a string field).
      const std::string field = TakeParseError();
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("no hello: the stream ended or its first message could not "
                                       "be parsed as a WorkerMessage (",
                                       field.empty() ? "malformed protobuf or invalid UTF-8 in a "
                                                       "string field"
                                                     : ParseErrorMessage(field, "the hello"),
                                       ")"));
    }
  }
  if (!msg.has_hello()) {
    return SendReject(stream, Reject::INVALID_HELLO, "the first message of a stream must be hello",
                      0, grpc::StatusCode::INVALID_ARGUMENT);
  }
  const spikeguard::v1::Hello hello = msg.hello();
  if (absl::Status s = ValidateHello(hello, state_->limits); !s.ok()) {
    return SendReject(stream, Reject::INVALID_HELLO, std::string(s.message()), 0,
                      grpc::StatusCode::INVALID_ARGUMENT);
  }
  if (state_->authorizer != nullptr) {
    if (absl::Status s = state_->authorizer->Authorize(who, auth::Need::kWorker, "Attach",
                                                       hello.run());
        !s.ok()) {
      return SendReject(stream, Reject::BAD_TOKEN, std::string(s.message()), 0,
                        grpc::StatusCode::PERMISSION_DENIED);
    }
  }
  auto run = state_->catalog->GetRun(hello.run());
  if (!run.ok()) {
    if (absl::IsNotFound(run.status())) {
      return SendReject(stream, Reject::UNKNOWN_RUN,
                        absl::StrCat("unknown run '", hello.run(),
                                     "': create it first (spikectl runs create ", hello.run(), ")"),
                        0, grpc::StatusCode::NOT_FOUND);
    }
    return ToGrpcStatus(run.status());
  }
  if (run->world_size() != 0 && run->world_size() != hello.world_size()) {
    return SendReject(stream, Reject::INVALID_HELLO,
                      absl::StrFormat("hello.world_size: %d does not match run '%s' (world size %d)",
                                      hello.world_size(), hello.run(), run->world_size()),
                      run->current_generation(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  const int64_t current = run->current_generation();
  // A rank still in an older generation may attach only to receive the
  // rewind that leads into the current one; its reports stay fenced.
  const bool catching_up = hello.generation() < current && state_->supervisor != nullptr &&
                           state_->supervisor->control()->RewindPendingInto(hello.run(), current);
  const int64_t generation = catching_up ? hello.generation() : current;
  if (hello.generation() != generation) {
    return SendReject(
        stream, Reject::STALE_GENERATION,
        absl::StrFormat("stale generation: rank %d of run '%s' runs generation %d, the run is at "
                        "generation %d; exit and restart from the run's current checkpoint",
                        hello.rank(), hello.run(), hello.generation(), current),
        current, grpc::StatusCode::FAILED_PRECONDITION);
  }
  if (hello.has_data_order()) {
    // The data order is what the daemon names documents with: a rank that
    // contradicts the run's manifest or the other ranks would make every
    // resolved document wrong, so it does not attach.
    absl::MutexLock lock(&data_order_mu);
    auto latest = state_->catalog->GetRun(hello.run());
    if (!latest.ok()) return ToGrpcStatus(latest.status());
    std::string conflict = ManifestConflict(latest->spec().manifest(), hello.data_order());
    if (conflict.empty() && latest->has_data_order()) {
      bool others_connected = false;
      for (const auto& r : state_->registry.Ranks(hello.run())) {
        if (r.connected() && r.rank() != hello.rank()) others_connected = true;
      }
      // With no other rank live, a relaunch with a new order replaces it.
      if (others_connected) {
        conflict = RankConflict(latest->data_order(), hello.data_order(), hello.rank());
      }
    }
    if (!conflict.empty()) {
      SG_LOG(WARNING) << "run " << hello.run() << " rank " << hello.rank()
                      << " refused: " << LogText(conflict, state_->limits.max_logged_text);
      return SendReject(stream, Reject::DATA_ORDER_MISMATCH, conflict, current,
                        grpc::StatusCode::FAILED_PRECONDITION);
    }
    if (absl::Status s = state_->catalog->SetRunDataOrder(hello.run(), hello.data_order(),
                                                          hello.total_steps());
        !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  auto committed = state_->catalog->CommittedStep(hello.run(), generation, hello.rank());
  if (!committed.ok()) return ToGrpcStatus(committed.status());

  const std::string run_name = hello.run();
  const uint32_t rank = hello.rank();
  const uint64_t stream_id = state_->registry.Connect(run_name, rank, generation, hello.host());
  SG_LOG(INFO) << "attach: run " << run_name << " rank " << rank << "/" << hello.world_size()
               << " generation " << generation << " from " << context->peer()
               << " (committed step " << *committed << ")";

  // Writes on one stream are serialized, and a command goes out at most
  // once per stream (one issued while the backlog below is listed is in the
  // backlog and pushed through the hub too).
  struct Writer {
    absl::Mutex mu;
    std::set<std::string> commands_sent ABSL_GUARDED_BY(mu);
    bool WriteLocked(grpc::ServerReaderWriter<ControllerMessage, WorkerMessage>* s,
                     const ControllerMessage& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (m.has_command() && !commands_sent.insert(m.command().id()).second) return true;
      return s->Write(m);
    }
  };
  auto writer = std::make_shared<Writer>();
  auto write = [stream, writer](const ControllerMessage& m) {
    absl::MutexLock lock(&writer->mu);
    return writer->WriteLocked(stream, m);
  };
  ControllerMessage welcome;
  welcome.mutable_welcome()->set_run(run_name);
  welcome.mutable_welcome()->set_generation(generation);
  welcome.mutable_welcome()->set_committed_step(*committed);
  if (!write(welcome)) {
    state_->registry.Disconnect(run_name, rank, stream_id);
    return grpc::Status::OK;
  }
  // Commands pushed through the hub (by a run's pipeline or an operator's
  // call) are written by a sender thread of this stream, started when one
  // arrives and gone when none is left: a rank that stops reading stalls
  // only its own stream, never the pusher nor another rank's stream. Until
  // the backlog is replayed (below) no sender starts: pushes queue behind it.
  struct Sender : std::enable_shared_from_this<Sender> {
    absl::Mutex mu;
    std::deque<ControllerMessage> queue ABSL_GUARDED_BY(mu);
    bool sending ABSL_GUARDED_BY(mu) = true;  // held for the backlog
    bool closed ABSL_GUARDED_BY(mu) = false;
    std::thread thread ABSL_GUARDED_BY(mu);
    // Starts a sender thread that writes the queue until it is empty.
    void StartLocked(std::function<bool(const ControllerMessage&)> write)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      sending = true;
      // The previous sender has left its loop (sending was false).
      if (thread.joinable()) thread.join();
      thread = std::thread([self = shared_from_this(), write = std::move(write)] {
        while (true) {
          ControllerMessage next;
          {
            absl::MutexLock lock(&self->mu);
            if (self->queue.empty()) {
              self->sending = false;
              return;
            }
            next = std::move(self->queue.front());
            self->queue.pop_front();
          }
          write(next);
        }
      });
    }
  };
  auto sender = std::make_shared<Sender>();
  auto push = [sender, write](const ControllerMessage& m) {
    absl::MutexLock lock(&sender->mu);
    if (sender->closed) return false;
    sender->queue.push_back(m);
    if (!sender->sending) sender->StartLocked(write);
    return true;
  };
  // Joined before the stream goes away (after the hub forgot the stream).
  struct SenderGuard {
    std::shared_ptr<Sender> sender;
    ~SenderGuard() {
      std::thread t;
      {
        absl::MutexLock lock(&sender->mu);
        sender->closed = true;
        t = std::move(sender->thread);
      }
      if (t.joinable()) t.join();
    }
  } sender_guard{sender};
  const uint64_t hub_id = state_->hub.Add(run_name, rank, generation, push);
  struct HubGuard {
    StreamHub* hub;
    uint64_t id;
    ~HubGuard() { hub->Remove(id); }
  } hub_guard{&state_->hub, hub_id};
  if (state_->supervisor != nullptr) {
    // Whatever this rank has not acknowledged yet, in order (SQLite is read
    // outside every lock).
    for (auto& command : state_->supervisor->control()->Unacknowledged(run_name, generation)) {
      ControllerMessage out;
      *out.mutable_command() = std::move(command);
      write(out);
    }
  }
  {
    // Then what was pushed meanwhile.
    absl::MutexLock lock(&sender->mu);
    if (sender->queue.empty()) {
      sender->sending = false;
    } else {
      sender->StartLocked(write);
    }
  }

  // The furthest step this rank committed: later reports may not run
  // arbitrarily far past what the run has reached.
  int64_t rank_last_step = *committed;
  grpc::Status result = grpc::Status::OK;
  TakeParseError();
  while (stream->Read(&msg)) {
    switch (msg.body_case()) {
      case WorkerMessage::kReports: {
        const auto& batch = msg.reports();
        ControllerMessage ack_msg;
        auto* ack = ack_msg.mutable_ack();
        ack->set_seq(batch.seq());
        const int64_t batch_gen = batch.has_generation() ? batch.generation() : generation;
        if (catching_up) {
          ack->set_rejected(batch.reports_size());
          ack->set_message(absl::StrFormat(
              "stale generation: reports of generation %d refused; the run is at generation %d",
              batch_gen, current));
          state_->counters.reports_rejected.fetch_add(batch.reports_size());
          if (!write(ack_msg)) break;
          continue;
        }
        if (batch_gen != generation) {
          absl::MutexLock lock(&writer->mu);
          return SendReject(stream, Reject::STALE_GENERATION,
                            absl::StrFormat("stale generation: reports of generation %d on a stream "
                                            "of generation %d",
                                            batch_gen, generation),
                            generation, grpc::StatusCode::FAILED_PRECONDITION);
        }
        absl::Status valid = ValidateBatch(batch, state_->limits);
        if (valid.ok()) {
          int64_t run_last_step = std::max(rank_last_step, hello.total_steps());
          for (const auto& r : state_->registry.Ranks(run_name)) {
            run_last_step = std::max(run_last_step, r.last_step());
          }
          valid = ValidateStepsAhead(batch, run_last_step, state_->limits);
        }
        if (absl::Status s = valid; !s.ok()) {
          ack->set_rejected(batch.reports_size());
          ack->set_message(std::string(s.message()));
          state_->counters.reports_rejected.fetch_add(batch.reports_size());
          SG_LOG(WARNING) << "run " << run_name << " rank " << rank << ": batch " << batch.seq()
                          << " rejected: " << LogText(s.message(), state_->limits.max_logged_text);
        } else {
          storage::IngestBatch to_commit;
          to_commit.run = run_name;
          to_commit.generation = generation;
          to_commit.rank = rank;
          to_commit.world_size = std::max<uint32_t>(1, hello.world_size());
          // The generation fence is checked in the transaction that stores the batch.
          to_commit.require_current = true;
          // The registry keeps only each rank's furthest step.
          const auto furthest = std::max_element(
              batch.reports().begin(), batch.reports().end(),
              [](const auto& a, const auto& b) { return a.step() < b.step(); });
          const spikeguard::v1::StepReport last =
              furthest != batch.reports().end() ? *furthest : spikeguard::v1::StepReport();
          const int batch_reports = batch.reports_size();
          // The reports move into the batch (the message is read into afresh).
          auto* moved = msg.mutable_reports()->mutable_reports();
          to_commit.reports.reserve(moved->size());
          for (auto& r : *moved) to_commit.reports.push_back(std::move(r));
          storage::BatchOutcome outcome = ingest_->Commit(std::move(to_commit));
          if (absl::IsFailedPrecondition(outcome.status)) {
            ack->set_rejected(batch_reports);
            ack->set_message(absl::StrFormat(
                "stale generation: reports of generation %d refused; the run is at generation %d",
                batch_gen, outcome.run_generation));
            state_->counters.reports_rejected.fetch_add(batch_reports);
            if (!write(ack_msg)) break;
            continue;
          }
          if (!outcome.status.ok()) {
            // Not committed, so not acknowledged: the client resends after it reconnects.
            SG_LOG(ERROR) << "run " << run_name << " rank " << rank
                          << ": ingest failed: " << outcome.status;
            result = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  absl::StrCat("catalog write failed: ", outcome.status.message()));
            break;
          }
          const storage::IngestResult* ingested = &outcome.result;
          rank_last_step = std::max(rank_last_step, ingested->committed_step);
          if (batch_reports > 0) state_->registry.AddReports(run_name, rank, std::span(&last, 1));
          state_->counters.reports_accepted.fetch_add(ingested->accepted);
          state_->counters.reports_duplicate.fetch_add(ingested->duplicates);
          ack->set_accepted(ingested->accepted);
          ack->set_duplicates(ingested->duplicates);
          if (ingested->duplicates > 0) {
            ack->set_message(absl::StrFormat(
                "%d duplicate or out-of-order reports ignored: rank %d already committed step %d",
                ingested->duplicates, rank, ingested->committed_step));
          }
        }
        if (!write(ack_msg)) {
          state_->registry.Disconnect(run_name, rank, stream_id);
          return grpc::Status::OK;
        }
        break;
      }
      case WorkerMessage::kCheckpoint: {
        const auto& c = msg.checkpoint();
        if (absl::Status s = ValidateCheckpointSaved(c, state_->limits); !s.ok()) {
          SG_LOG(WARNING) << "run " << run_name << " rank " << rank
                          << ": checkpoint refused: " << LogText(s.message());
          // The worker is told why (an Ack naming no batch: seq 0).
          ControllerMessage refused;
          refused.mutable_ack()->set_rejected(1);
          refused.mutable_ack()->set_message(absl::StrCat("checkpoint refused: ", s.message()));
          if (!write(refused)) {
            state_->registry.Disconnect(run_name, rank, stream_id);
            return grpc::Status::OK;
          }
          break;
        }
        // Confined to the run's checkpoint root before anything is stored;
        // the worker is told why (an Ack naming no batch).
        if (state_->checkpoints != nullptr) {
          if (auto confined = state_->checkpoints->Confine(run_name, c.uri()); !confined.ok()) {
            SG_LOG(WARNING) << "run " << run_name << " rank " << rank
                            << ": checkpoint refused: " << LogText(confined.status().message());
            ControllerMessage refused;
            refused.mutable_ack()->set_rejected(1);
            refused.mutable_ack()->set_message(
                absl::StrCat("checkpoint refused: ", confined.status().message()));
            if (!write(refused)) {
              state_->registry.Disconnect(run_name, rank, stream_id);
              return grpc::Status::OK;
            }
            break;
          }
        }
        spikeguard::v1::Checkpoint ckpt;
        ckpt.set_run(run_name);
        ckpt.set_generation(generation);
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
          SG_LOG(ERROR) << "run " << run_name << ": checkpoint not recorded: " << s.status();
        }
        break;
      }
      case WorkerMessage::kCheckpointDeleted: {
        const auto& d = msg.checkpoint_deleted();
        if (absl::Status s = ValidateCheckpointDeleted(d, state_->limits); !s.ok()) {
          SG_LOG(WARNING) << "run " << run_name << " rank " << rank
                          << ": checkpoint deletion notice refused: " << LogText(s.message());
          ControllerMessage refused;
          refused.mutable_ack()->set_rejected(1);
          refused.mutable_ack()->set_message(
              absl::StrCat("checkpoint deletion notice refused: ", s.message()));
          if (!write(refused)) {
            state_->registry.Disconnect(run_name, rank, stream_id);
            return grpc::Status::OK;
          }
          break;
        }
        auto deleted = state_->catalog->DeleteCheckpoint(run_name, d.step(), d.uri());
        if (!deleted.ok()) {
          SG_LOG(ERROR) << "run " << run_name << ": checkpoint deletion not recorded: "
                        << deleted.status();
        } else if (*deleted) {
          SG_LOG(INFO) << "run " << run_name << " rank " << rank << " deleted checkpoint "
                       << LogText(d.uri(), state_->limits.max_logged_text) << " (step "
                       << d.step() << ")";
        }
        break;
      }
      case WorkerMessage::kGenerationEnded: {
        const auto& e = msg.generation_ended();
        if (absl::Status s = ValidateGenerationEnded(e, state_->limits); !s.ok()) {
          SG_LOG(WARNING) << "run " << run_name << " rank " << rank
                          << ": generation_ended refused: " << LogText(s.message());
          break;
        }
        if (catching_up || e.generation() != generation) {
          // Fenced like reports: only the stream's own generation counts.
          SG_LOG(WARNING) << "run " << run_name << " rank " << rank << ": end of generation "
                          << e.generation() << " ignored on a stream of generation "
                          << generation << (catching_up ? " (catching up)" : "");
          break;
        }
        SG_LOG(INFO) << "run " << run_name << " rank " << rank << ": generation " << e.generation()
                     << " ended at step " << e.last_step() << ": "
                     << LogText(e.reason(), state_->limits.max_logged_text);
        if (state_->supervisor != nullptr) {
          state_->supervisor->OnGenerationEnded(run_name, e.generation(), rank, e.last_step(),
                                                e.reason());
        }
        break;
      }
      case WorkerMessage::kHeartbeat: {
        // A heartbeat's step moves the rank's last step only as far as a
        // report could (it bounds the steps of later reports).
        const int64_t step = msg.heartbeat().step();
        const int64_t base = std::max<int64_t>(rank_last_step, 0);
        const bool plausible = step >= 0 && (step <= base || step - base <= state_->limits.max_step_ahead);
        state_->registry.Touch(run_name, rank, plausible ? step : -1);
        break;
      }
      case WorkerMessage::kCommandResult:
        SG_LOG(INFO) << "run " << run_name << " rank " << rank << ": command "
                     << LogText(msg.command_result().command_id(), 128) << " "
                     << (msg.command_result().ok() ? "ok" : "failed") << ": "
                     << LogText(msg.command_result().message(), state_->limits.max_logged_text);
        if (state_->supervisor != nullptr) {
          const auto& r = msg.command_result();
          state_->supervisor->control()->OnCommandResult(run_name, rank, r);
          if (!r.ok()) {
            state_->supervisor->OnCommandFailed(run_name, r.command_id(), rank, r.message());
          }
        }
        break;
      case WorkerMessage::kHello: {
        state_->registry.Disconnect(run_name, rank, stream_id);
        absl::MutexLock lock(&writer->mu);
        return SendReject(stream, Reject::INVALID_HELLO, "hello sent twice on one stream",
                          generation, grpc::StatusCode::INVALID_ARGUMENT);
      }
      case WorkerMessage::BODY_NOT_SET:
        SG_LOG(WARNING) << "run " << run_name << " rank " << rank
                        << ": message with no body ignored";
        break;
    }
    if (!result.ok()) break;
  }
  state_->registry.Disconnect(run_name, rank, stream_id);
  if (result.ok() && !context->IsCancelled()) {
    // Read fails alike on a half-close and on a message that does not
    // parse: protobuf names the field of the latter.
    if (const std::string field = TakeParseError(); !field.empty()) {
      SG_LOG(WARNING) << "run " << run_name << " rank " << rank << ": stream ended: "
                      << ParseErrorMessage(field, "a message");
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, ParseErrorMessage(field, "a message"));
    }
  }
  return result;
}

}  // namespace spikeguard::daemon
