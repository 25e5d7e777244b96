// worker_client.h
// -----------------------------------------------------------------------------
// The client library every trainer links: one long-lived WorkerService.Attach
// stream per rank, carrying batched StepReports, checkpoint notices,
// heartbeats and command results up, and acknowledgements and commands down.
//
// Delivery: reports are kept until the daemon acknowledges their batch, which
// it does only after committing it. When the stream breaks (the daemon
// restarts, the network blips), the client reconnects with exponential
// backoff and resends every unacknowledged batch; the daemon drops the ones it
// already committed. Nothing acknowledged is lost; nothing is stored twice.
// When Options::max_queued_reports reports are queued, Report() blocks
// (backpressure) instead of growing without bound.
//
//   WorkerClient::Options options;
//   options.address = "127.0.0.1:7070";
//   options.run = "gpt-small"; options.rank = 0; options.world_size = 8;
//   auto client = WorkerClient::Start(options);
//   SG_RETURN_IF_ERROR((*client)->WaitForWelcome(absl::Seconds(30)));
//   for (...) (*client)->Report(report);
//   SG_RETURN_IF_ERROR((*client)->Flush(absl::Seconds(30)));
//
// A Reject (unknown run, stale generation, invalid hello, bad token) is
// final: the client stops, and WaitForWelcome/Flush return
// FAILED_PRECONDITION with the daemon's reason. A stream the daemon ends with
// UNAUTHENTICATED or PERMISSION_DENIED counts as Reject(BAD_TOKEN): retrying
// with the same token cannot help.
//
// Security (worker/client/client_security.h): Options::security starts from
// the environment (SPIKEGUARD_TOKEN or SPIKEGUARD_TOKEN_FILE,
// SPIKEGUARD_TLS_CA, SPIKEGUARD_TLS_CERT/KEY, SPIKEGUARD_TLS_SERVER_NAME),
// which the daemon's launcher sets for the ranks it starts. The token goes
// on the Attach stream as `authorization: Bearer <token>`; a CA turns TLS on.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "spikeguard/v1/worker.grpc.pb.h"
#include "worker/client/client_security.h"

namespace spikeguard::worker {

class WorkerClient {
 public:
  struct Options {
    std::string address = "127.0.0.1:7070";
    // Use this channel instead of dialing `address` (in-process tests); the
    // token of `security` is still sent.
    std::shared_ptr<grpc::Channel> channel;
    // Token and TLS, from the environment unless set otherwise; Start() fails
    // with INVALID_ARGUMENT naming a file it cannot read.
    ClientSecurity security = ClientSecurity::FromEnv();
    std::string run;
    uint32_t rank = 0;
    uint32_t world_size = 1;
    int64_t generation = 0;
    std::string host;
    int32_t device_id = -1;
    std::string config_fingerprint;
    int64_t manifest_version = 0;
    int64_t resume_step = 0;
    // The data order the trainer reads its batches in (unset: not reported).
    // The daemon refuses a rank whose order contradicts the run's manifest or
    // the other ranks' (Reject DATA_ORDER_MISMATCH), and resolves documents
    // with it.
    std::optional<spikeguard::v1::DataOrder> data_order;
    // Steps the trainer's schedule runs (steps [0, total_steps)); 0 = unknown.
    int64_t total_steps = 0;
    // A batch is sealed at this many reports or after flush_interval, and
    // before a report whose step does not follow the open batch's last (the
    // daemon refuses a batch whose steps do not increase). At most the
    // daemon's limit of reports per batch (4096): more is cut to it.
    int max_batch_reports = 64;
    absl::Duration flush_interval = absl::Milliseconds(50);
    // A heartbeat goes after this long without a batch or a heartbeat.
    absl::Duration heartbeat_interval = absl::Seconds(1);
    absl::Duration initial_backoff = absl::Milliseconds(100);
    absl::Duration max_backoff = absl::Seconds(2);
    // Report() blocks while this many reports are queued (in the open batch
    // or waiting for an acknowledgement), as the Python client's
    // max_queued_reports. A queued report holds ~0.3 KB plus ~0.11 KB per
    // layer (measured in both clients: 4 KB at 32 layers, 11 KB at 96), so
    // 10,000 hold 40-120 MB per rank (200,000 held up to 2 GB, on every rank
    // of a node). At pre-training's step times (0.1-10 s, one report a
    // step) 10,000 ride out a daemon outage of 17 minutes to a day before
    // the trainer waits; a daemon restart takes seconds.
    size_t max_queued_reports = 10'000;
    // The old name of max_queued_reports: when set (non-zero) it wins.
    size_t max_unacked_reports = 0;
    // Close() first half-closes the stream and waits this long for the
    // daemon to have read everything sent (notices included), then cancels.
    absl::Duration close_grace = absl::Seconds(2);
  };

  struct Stats {
    int64_t reports_acked = 0;
    int64_t reports_duplicate = 0;
    int64_t reports_rejected = 0;
    // Unacknowledged reports of an older generation dropped by SetGeneration.
    int64_t reports_dropped_stale = 0;
    int64_t batches_sent = 0;
    int64_t heartbeats_sent = 0;
    int64_t connects = 0;
    std::string last_ack_message;
    // Why the last stream or attempt failed ("" when none did).
    std::string last_error;
  };

  // The Python client's defaults for its start() and flush() timeouts.
  static constexpr absl::Duration kDefaultWelcomeTimeout = absl::Seconds(60);
  static constexpr absl::Duration kDefaultFlushTimeout = absl::Seconds(30);

  static absl::StatusOr<std::unique_ptr<WorkerClient>> Start(Options options);
  ~WorkerClient();
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  // Waits for the daemon's first Welcome; FAILED_PRECONDITION on a Reject,
  // DEADLINE_EXCEEDED when none came in time.
  absl::Status WaitForWelcome(absl::Duration timeout = kDefaultWelcomeTimeout);

  void Report(const spikeguard::v1::StepReport& report);
  void ReportCheckpoint(const spikeguard::v1::CheckpointSaved& checkpoint);
  void SendCommandResult(const spikeguard::v1::CommandResult& result);
  // The generation ended before any horizon: the trainer reached the end of
  // its schedule. Sent after the reports queued before it, and again after a
  // reconnect until the generation changes (the daemon's handling must be
  // idempotent).
  void SendGenerationEnded(const spikeguard::v1::GenerationEnded& ended);
  // Retention deleted a checkpoint file. Sent after the reports queued
  // before it, and again after a reconnect (with the recent notices); a
  // deleted checkpoint's CheckpointSaved is no longer resent.
  void ReportCheckpointDeleted(const spikeguard::v1::CheckpointDeleted& deleted);
  // The step the worker is at, sent with heartbeats.
  void SetCurrentStep(int64_t step);

  // Seals the open batch and waits until every report is acknowledged and
  // every notice queued so far (checkpoints, command results, ...) is
  // written to the stream.
  absl::Status Flush(absl::Duration timeout = kDefaultFlushTimeout);

  // The next command from the daemon, if one arrives within `timeout`.
  std::optional<spikeguard::v1::Command> WaitCommand(absl::Duration timeout);

  // Adopts a new generation (after a REWIND): the next Hello and every new
  // batch carry it; unacknowledged reports of older generations are dropped
  // and counted.
  void SetGeneration(int64_t generation);

  std::optional<spikeguard::v1::Reject> rejection() const;
  // The run's pinned checkpoint URIs as the daemon last sent them in answer
  // to a CheckpointSaved (Ack.pinned_uris), once: nullopt when none arrived
  // since the last call or since the last command (whose pinned_uris are
  // newer). Retention must keep them.
  std::optional<std::vector<std::string>> TakePins();
  // Waits up to `timeout` until the daemon has answered every checkpoint
  // notice queued or written on the current stream (with its pins, or by
  // refusing it), so retention does not delete a checkpoint the daemon is
  // about to pin. False on timeout; true at once when not connected (the
  // last pins known then stand).
  bool AwaitCheckpointAnswers(absl::Duration timeout);
  bool connected() const;
  Stats stats() const;
  // Stops the connection thread without waiting for acknowledgements. When
  // connected, it half-closes the stream and waits up to
  // Options::close_grace for the daemon to end it, so whatever was written
  // is read before the stream goes.
  void Close();

 private:
  struct Batch {
    spikeguard::v1::StepReportBatch batch;
    bool sent = false;  // on the current connection
  };

  WorkerClient(Options options, ResolvedSecurity security);
  // The rejection's text for WaitForWelcome/Flush.
  absl::Status RejectionStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ConnectionLoop();
  // Runs one connection until it breaks; returns false when the client must
  // stop for good (closed or rejected).
  // Sleeps until `wake` (false once the client is stopping) while driving
  // the channel's reconnection; returns early when the channel is ready.
  bool WaitOutBackoff(absl::Time wake);
  bool RunConnection();
  void SealLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const ResolvedSecurity security_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<spikeguard::v1::WorkerService::Stub> stub_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool welcomed_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<spikeguard::v1::Reject> rejection_ ABSL_GUARDED_BY(mu_);
  std::optional<std::vector<std::string>> pins_ ABSL_GUARDED_BY(mu_);
  // Checkpoint notices written on the current stream and not yet answered.
  int notices_unanswered_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_);
  int64_t current_step_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<spikeguard::v1::StepReport> open_ ABSL_GUARDED_BY(mu_);
  absl::Time open_since_ ABSL_GUARDED_BY(mu_);
  std::deque<Batch> unacked_ ABSL_GUARDED_BY(mu_);
  size_t unacked_reports_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<spikeguard::v1::WorkerMessage> outbox_ ABSL_GUARDED_BY(mu_);
  // Recent checkpoint notices, resent after a reconnect (the daemon's upsert
  // is idempotent), so a notice lost with a broken stream still arrives.
  std::deque<spikeguard::v1::CheckpointSaved> recent_checkpoints_ ABSL_GUARDED_BY(mu_);
  std::deque<spikeguard::v1::CheckpointDeleted> recent_deletions_ ABSL_GUARDED_BY(mu_);
  // Resent after a reconnect while generation_ is its generation.
  std::optional<spikeguard::v1::GenerationEnded> generation_ended_ ABSL_GUARDED_BY(mu_);
  // Messages taken from outbox_ and not yet written to the stream.
  int writing_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<spikeguard::v1::Command> commands_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* active_context_ ABSL_GUARDED_BY(mu_) = nullptr;

  std::thread thread_;
};

}  // namespace spikeguard::worker
