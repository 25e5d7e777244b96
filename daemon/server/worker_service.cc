#include "daemon/server/worker_service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "daemon/control/supervisor.h"
#include "daemon/server/status_util.h"

namespace spikeguard::daemon {
namespace {

using spikeguard::v1::ControllerMessage;
using spikeguard::v1::Reject;
using spikeguard::v1::WorkerMessage;

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

grpc::Status WorkerServiceImpl::Attach(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<ControllerMessage, WorkerMessage>* stream) {
  WorkerMessage msg;
  if (!stream->Read(&msg)) {
    if (context->IsCancelled()) return grpc::Status::OK;  // the client went away
    // Half-closed without a hello, or a first message that does not parse
    // (malformed bytes, invalid UTF-8 in a string field).
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "no hello: the stream ended or its first message could not be parsed as "
                        "a WorkerMessage (malformed protobuf or invalid UTF-8 in a string field)");
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
  auto committed = state_->catalog->CommittedStep(hello.run(), generation, hello.rank());
  if (!committed.ok()) return ToGrpcStatus(committed.status());

  const std::string run_name = hello.run();
  const uint32_t rank = hello.rank();
  const uint64_t stream_id = state_->registry.Connect(run_name, rank, generation, hello.host());
  SG_LOG(INFO) << "attach: run " << run_name << " rank " << rank << "/" << hello.world_size()
               << " generation " << generation << " from " << context->peer()
               << " (committed step " << *committed << ")";

  // Commands may be pushed from other threads (the incident engine); writes
  // on one stream are serialized.
  auto write_mu = std::make_shared<absl::Mutex>();
  auto write = [stream, write_mu](const ControllerMessage& m) {
    absl::MutexLock lock(write_mu.get());
    return stream->Write(m);
  };
  ControllerMessage welcome;
  welcome.mutable_welcome()->set_run(run_name);
  welcome.mutable_welcome()->set_generation(generation);
  welcome.mutable_welcome()->set_committed_step(*committed);
  if (!write(welcome)) {
    state_->registry.Disconnect(run_name, rank, stream_id);
    return grpc::Status::OK;
  }
  const uint64_t hub_id = state_->hub.Add(run_name, rank, generation, write);
  struct HubGuard {
    StreamHub* hub;
    uint64_t id;
    ~HubGuard() { hub->Remove(id); }
  } hub_guard{&state_->hub, hub_id};
  if (state_->supervisor != nullptr) {
    // Whatever this rank has not acknowledged yet, in order.
    for (const auto& command : state_->supervisor->control()->Unacknowledged(run_name, generation)) {
      ControllerMessage out;
      *out.mutable_command() = command;
      write(out);
    }
  }

  grpc::Status result = grpc::Status::OK;
  while (stream->Read(&msg)) {
    switch (msg.body_case()) {
      case WorkerMessage::kReports: {
        const auto& batch = msg.reports();
        ControllerMessage ack_msg;
        auto* ack = ack_msg.mutable_ack();
        ack->set_seq(batch.seq());
        const int64_t batch_gen = batch.has_generation() ? batch.generation() : generation;
        int64_t run_generation = current;
        if (auto now = state_->catalog->GetRun(run_name); now.ok()) {
          run_generation = now->current_generation();
        }
        if (catching_up || run_generation != generation) {
          ack->set_rejected(batch.reports_size());
          ack->set_message(absl::StrFormat(
              "stale generation: reports of generation %d refused; the run is at generation %d",
              batch_gen, run_generation));
          state_->counters.reports_rejected.fetch_add(batch.reports_size());
          if (!write(ack_msg)) break;
          continue;
        }
        if (batch_gen != generation) {
          absl::MutexLock lock(write_mu.get());
          return SendReject(stream, Reject::STALE_GENERATION,
                            absl::StrFormat("stale generation: reports of generation %d on a stream "
                                            "of generation %d",
                                            batch_gen, generation),
                            generation, grpc::StatusCode::FAILED_PRECONDITION);
        }
        if (absl::Status s = ValidateBatch(batch, state_->limits); !s.ok()) {
          ack->set_rejected(batch.reports_size());
          ack->set_message(std::string(s.message()));
          state_->counters.reports_rejected.fetch_add(batch.reports_size());
          SG_LOG(WARNING) << "run " << run_name << " rank " << rank << ": batch " << batch.seq()
                          << " rejected: " << s.message();
        } else {
          const std::vector<spikeguard::v1::StepReport> reports(batch.reports().begin(),
                                                                batch.reports().end());
          auto ingested = state_->catalog->IngestReports(run_name, generation, rank, reports);
          if (!ingested.ok()) {
            // Not committed, so not acknowledged: the client resends after it reconnects.
            SG_LOG(ERROR) << "run " << run_name << " rank " << rank
                          << ": ingest failed: " << ingested.status();
            result = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  absl::StrCat("catalog write failed: ", ingested.status().message()));
            break;
          }
          state_->registry.AddReports(run_name, rank, reports);
          if (state_->supervisor != nullptr && ingested->accepted > 0) {
            state_->supervisor->OnCommitted(run_name, generation, hello.world_size(),
                                            reports.front().step(),
                                            reports.back().step());
          }
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
                          << ": checkpoint refused: " << s.message();
          break;
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
      case WorkerMessage::kHeartbeat:
        state_->registry.Touch(run_name, rank, msg.heartbeat().step());
        break;
      case WorkerMessage::kCommandResult:
        SG_LOG(INFO) << "run " << run_name << " rank " << rank << ": command "
                     << msg.command_result().command_id() << " "
                     << (msg.command_result().ok() ? "ok" : "failed") << ": "
                     << msg.command_result().message();
        if (state_->supervisor != nullptr) {
          state_->supervisor->control()->OnCommandResult(run_name, rank, msg.command_result());
        }
        break;
      case WorkerMessage::kHello: {
        state_->registry.Disconnect(run_name, rank, stream_id);
        absl::MutexLock lock(write_mu.get());
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
  return result;
}

}  // namespace spikeguard::daemon
