// reference_worker.h
// -----------------------------------------------------------------------------
// The reference trainer behind `spikeguard-worker train`: a small byte-level
// GPT (kernels/) trained on a corpus of Megatron indexed datasets in the order
// a manifest and data plan define (storage/corpus), checkpointing atomically
// every K steps (storage/checkpoint), and reporting the full telemetry of
// every step to spikeguardd through the client library, or to a JSONL file
// (one StepReport per line) when it runs standalone.
//
// It obeys the daemon's commands: PAUSE, CONTINUE, STOP, SET_HPARAMS and
// REWIND (load the checkpoint, adopt the new generation and data plan, run to
// `stop_after_step` if given, report, and wait for the next command). Each
// command id is executed at most once. A REWIND's hparams are absolute: the
// worker runs with its configured base (the config, plus --lr-scale) with
// the command's fields applied, whatever the checkpoint or an earlier command
// set. A REWIND that fails (the checkpoint cannot be read) is reported as a
// failed CommandResult and leaves the worker paused in its old generation
// until the next command.
//
// Its hello carries the data order it trains with (fingerprint, seed, batch
// size, sequence length, blend) and the steps of its schedule. When the
// schedule ends before a horizon it was given (or at all), it tells the
// daemon with GenerationEnded once its reports are delivered. Checkpoint
// retention (keep_checkpoints) never deletes a checkpoint the last command
// named as pinned, and every deletion is reported (CheckpointDeleted). A
// REWIND's checkpoint_at_step adds one checkpoint off the cadence, at that
// step of the new generation.
//
//   ReferenceWorker::Options o;
//   o.corpus_dir = "/data/synth";
//   o.checkpoint_dir = "/runs/r1/ckpt";
//   o.telemetry_jsonl = "/runs/r1/telemetry.jsonl";
//   SG_ASSIGN_OR_RETURN(auto worker, ReferenceWorker::Create(o));
//   SG_RETURN_IF_ERROR(worker->Run());
//
// Determinism: on CPU a run resumed from a checkpoint produces the same loss
// hashes and parameters, bit for bit, as the uninterrupted run.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/trainer.h"
#include "spikeguard/v1/telemetry.pb.h"
#include "spikeguard/v1/worker.pb.h"
#include "storage/checkpoint/checkpoint.h"
#include "storage/corpus/corpus.h"
#include "storage/corpus/data_order.h"
#include "worker/client/worker_client.h"
#include "worker/ref/worker_config.h"

namespace spikeguard::worker {

class ReferenceWorker {
 public:
  struct Options {
    WorkerConfig config;
    std::string corpus_dir;
    std::string checkpoint_dir;
    // Standalone telemetry: one StepReport (proto JSON) per line. "" = none.
    std::string telemetry_jsonl;
    // Report to spikeguardd through the client library.
    bool use_daemon = false;
    WorkerClient::Options client;
    int64_t generation = 0;
    // DataPlan text ("0-600,610-"); "" = the checkpoint's plan, else [0, inf).
    std::string plan;
    // Checkpoint to start from: a path, "newest" (newest valid one in
    // checkpoint_dir, fresh start when there is none), or "" (fresh start).
    std::string resume_from;
    // Flip one gradient bit at this step, the first time this process
    // trains it, in whatever generation it has reached by then (a transient
    // hardware fault that a replay does not reproduce); never in a process
    // started in a generation > 0 (a relaunched replay).
    int64_t bitflip_step = -1;
    // Stop after this step (inclusive): standalone, return; with a daemon,
    // report and wait for a command. -1 = none.
    int64_t stop_after_step = -1;
    bool telemetry = true;
    // Peak-lr scale applied after the checkpoint is loaded (what SET_HPARAMS
    // would do); unset = keep the checkpoint's.
    std::optional<double> lr_scale;
    // With a daemon: after the last step, wait this long for commands (a
    // rewind restarts training) before exiting.
    absl::Duration linger = absl::ZeroDuration();
  };

  static absl::StatusOr<std::unique_ptr<ReferenceWorker>> Create(Options options);
  ~ReferenceWorker();

  // Trains until config.steps are done or a STOP arrives. FAILED_PRECONDITION
  // when the daemon rejected the worker.
  absl::Status Run();

  // The next step to train.
  int64_t next_step() const { return step_; }
  int64_t generation() const { return generation_; }
  uint64_t ParamHash() const { return trainer_->ParamHash(); }
  const storage::Manifest& manifest() const { return order_->manifest(); }
  kernels::Trainer& trainer() { return *trainer_; }

  // The data order it trains with, as its hello reports it.
  spikeguard::v1::DataOrder DataOrderProto() const;
  // The hparam overrides a REWIND starts from: the defaults, with
  // Options::lr_scale when given.
  kernels::HParamOverrides BaseHParams() const;

  // One step of training with telemetry, as reported.
  absl::StatusOr<spikeguard::v1::StepReport> TrainStep();
  // Saves a checkpoint of the current state (steps completed = next_step()).
  absl::StatusOr<storage::CheckpointFileInfo> SaveCheckpoint();
  // Loads a checkpoint file; resets step, hparams and (unless plan_override
  // is set) the data plan.
  // `expected_checksum` (a rewind command's, 16 hex digits; "" = none): the
  // file's XXH64 must be it.
  absl::Status LoadCheckpoint(const std::string& path, const std::string& plan_override,
                              absl::string_view expected_checksum = "");

 private:
  explicit ReferenceWorker(Options options) : options_(std::move(options)) {}
  absl::Status Init();
  absl::Status SetPlan(const storage::DataPlan& plan);
  // Handles a command; sets *stop when the worker must end.
  absl::Status HandleCommand(const spikeguard::v1::Command& command, bool* stop);
  // Blocks for commands until one lets training go on (or stop).
  absl::Status WaitForGo(bool* stop);
  void Emit(const spikeguard::v1::StepReport& report);

  Options options_;
  std::unique_ptr<storage::Corpus> corpus_;
  std::unique_ptr<storage::DataOrder> order_;
  std::unique_ptr<kernels::Trainer> trainer_;
  std::unique_ptr<storage::CheckpointDir> checkpoints_;
  std::unique_ptr<WorkerClient> client_;
  std::ofstream jsonl_;
  int64_t step_ = 0;
  int64_t generation_ = 0;
  int64_t stop_after_ = -1;
  // The step of the current generation to checkpoint at besides the cadence
  // (Command.checkpoint_at_step), -1 when none.
  int64_t checkpoint_at_ = -1;
  // The --fault bit flip fired (once per process).
  bool bitflip_done_ = false;
  bool paused_ = false;
  std::set<std::string> executed_commands_;
  // Checkpoint paths the last command named as pinned: retention keeps them.
  std::set<std::string> pinned_paths_;
  // The last wait for the daemon's answer to a checkpoint notice timed out.
  bool answers_missing_ = false;
  // The generation a GenerationEnded was sent for (-1: none).
  int64_t ended_generation_ = -1;
};

}  // namespace spikeguard::worker
