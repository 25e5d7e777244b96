#include "worker/ref/reference_worker.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "storage/checkpoint/checkpoint_uri.h"
#include "storage/checkpoint/checksum.h"
#include "storage/corpus/corpus_tools.h"
#include "storage/corpus/data_plan.h"

namespace spikeguard::worker {
namespace {

namespace v1 = spikeguard::v1;

constexpr char kTrainerSection[] = "trainer";
constexpr char kPlanKey[] = "data_plan";
// How long retention waits for the daemon to answer the last checkpoint notice.
constexpr absl::Duration kCheckpointAnswerWait = absl::Seconds(10);

// The paths of the daemon's pinned URIs, read as the daemon reads them; a URI
// that names no local path pins nothing here.
template <typename Uris>
void PinnedPaths(const Uris& uris, std::set<std::string>* paths) {
  paths->clear();
  for (const std::string& uri : uris) {
    absl::StatusOr<std::string> path = storage::CheckpointPathOfUri(uri);
    if (path.ok()) {
      paths->insert(*path);
    } else {
      SG_LOG(WARNING) << "pinned checkpoint ignored: " << path.status().message();
    }
  }
}

// The file:// URI of a checkpoint file the worker wrote, absolute.
std::string UriOfFile(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return storage::CheckpointUriOfPath(ec ? path : absolute.lexically_normal().string());
}

// Applies the fields `h` sets to `hp`.
void ApplyHParams(const v1::HParams& h, kernels::HParamOverrides* hp) {
  if (h.has_lr_scale()) hp->lr_scale = h.lr_scale();
  if (h.has_extra_warmup_steps()) {
    hp->extra_warmup_steps = h.extra_warmup_steps();
    hp->rewarm_start_step = h.has_warmup_start_step() ? h.warmup_start_step() : -1;
  }
  if (h.has_clip_norm()) hp->clip_norm = h.clip_norm();
  if (h.has_beta2()) hp->beta2 = h.beta2();
  if (h.has_eps()) hp->eps = h.eps();
}

absl::StatusOr<storage::DataPlan> PlanFromProto(const v1::DataPlan& p) {
  std::vector<storage::PositionRange> ranges;
  for (const auto& r : p.ranges()) ranges.push_back({r.begin(), r.end()});
  // No ranges: the whole stream (masks alone still apply).
  if (ranges.empty()) ranges.push_back({0, storage::PositionRange::kUnbounded});
  SG_ASSIGN_OR_RETURN(storage::DataPlan plan, storage::DataPlan::FromRanges(ranges));
  for (const v1::SampleMask& m : p.masks()) {
    SG_ASSIGN_OR_RETURN(plan, plan.WithMask(m.position(), std::vector<int32_t>(m.slots().begin(),
                                                                                m.slots().end())));
  }
  return plan;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReferenceWorker>> ReferenceWorker::Create(Options options) {
  std::unique_ptr<ReferenceWorker> w(new ReferenceWorker(std::move(options)));
  SG_RETURN_IF_ERROR(w->Init());
  return w;
}

ReferenceWorker::~ReferenceWorker() {
  if (client_) client_->Close();
}

absl::Status ReferenceWorker::Init() {
  WorkerConfig& cfg = options_.config;
  SG_RETURN_IF_ERROR(cfg.model.Validate());
  SG_RETURN_IF_ERROR(cfg.optim.Validate());
  if (options_.corpus_dir.empty()) return absl::InvalidArgumentError("corpus: no --corpus given");
  SG_ASSIGN_OR_RETURN(corpus_, storage::Corpus::Open(options_.corpus_dir));
  SG_ASSIGN_OR_RETURN(storage::CorpusMetadata meta, storage::ReadCorpusMetadata(options_.corpus_dir));
  storage::Manifest manifest = meta.default_manifest;
  manifest.dataset_fingerprint = corpus_->fingerprint();
  if (cfg.batch_size > 0) manifest.global_batch_size = cfg.batch_size;
  if (cfg.seq_len > 0) manifest.sequence_length = cfg.seq_len;
  if (cfg.data_seed_set) manifest.seed = cfg.data_seed;
  if (manifest.sequence_length > cfg.model.context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "seq_len: %d is longer than the model's context %d", manifest.sequence_length,
        cfg.model.context));
  }
  SG_ASSIGN_OR_RETURN(order_, storage::DataOrder::Create(*corpus_, manifest));
  trainer_ = std::make_unique<kernels::Trainer>(cfg.model, cfg.optim, cfg.threads);
  if (!options_.checkpoint_dir.empty()) {
    checkpoints_ = std::make_unique<storage::CheckpointDir>(options_.checkpoint_dir);
    (void)checkpoints_->CleanTemporaries();
  }
  generation_ = options_.generation;
  bitflip_done_ = options_.generation > 0;
  stop_after_ = options_.stop_after_step;

  // Where to start.
  if (options_.resume_from == "newest") {
    if (checkpoints_ == nullptr) {
      return absl::InvalidArgumentError("resume: 'newest' needs a checkpoint dir");
    }
    storage::CheckpointFileInfo info;
    auto newest = checkpoints_->LoadNewestValid(cfg.model.Fingerprint(), &info);
    if (newest.ok()) {
      SG_RETURN_IF_ERROR(LoadCheckpoint(info.path, options_.plan));
    } else if (!absl::IsNotFound(newest.status())) {
      return newest.status();
    } else if (!options_.plan.empty()) {
      SG_ASSIGN_OR_RETURN(storage::DataPlan plan, storage::DataPlan::Parse(options_.plan));
      SG_RETURN_IF_ERROR(SetPlan(plan));
    }
  } else if (!options_.resume_from.empty()) {
    SG_RETURN_IF_ERROR(LoadCheckpoint(options_.resume_from, options_.plan));
  } else if (!options_.plan.empty()) {
    SG_ASSIGN_OR_RETURN(storage::DataPlan plan, storage::DataPlan::Parse(options_.plan));
    SG_RETURN_IF_ERROR(SetPlan(plan));
  }

  if (options_.lr_scale) {
    kernels::HParamOverrides hp = trainer_->hparams();
    hp.lr_scale = *options_.lr_scale;
    trainer_->SetHParams(hp);
  }
  if (!options_.telemetry_jsonl.empty()) {
    jsonl_.open(options_.telemetry_jsonl, std::ios::out | std::ios::app);
    if (!jsonl_) {
      return absl::UnavailableError(absl::StrCat("telemetry file ", options_.telemetry_jsonl,
                                                 ": cannot open for writing"));
    }
  }
  if (options_.use_daemon) {
    WorkerClient::Options co = options_.client;
    co.generation = generation_;
    co.config_fingerprint = cfg.model.Fingerprint();
    co.resume_step = step_;
    co.data_order = DataOrderProto();
    co.total_steps = cfg.steps;
    SG_ASSIGN_OR_RETURN(client_, WorkerClient::Start(co));
    SG_RETURN_IF_ERROR(client_->WaitForWelcome(absl::Seconds(60)));
  }
  return absl::OkStatus();
}

v1::DataOrder ReferenceWorker::DataOrderProto() const {
  const storage::Manifest& m = order_->manifest();
  v1::DataOrder order;
  order.set_dataset_fingerprint(m.dataset_fingerprint);
  order.set_seed(m.seed);
  order.set_global_batch_size(m.global_batch_size);
  order.set_sequence_length(m.sequence_length);
  for (const auto& [domain, weight] : m.blend) (*order.mutable_blend())[domain] = weight;
  return order;
}

kernels::HParamOverrides ReferenceWorker::BaseHParams() const {
  kernels::HParamOverrides hp;
  if (options_.lr_scale) hp.lr_scale = *options_.lr_scale;
  return hp;
}

absl::Status ReferenceWorker::SetPlan(const storage::DataPlan& plan) {
  storage::Manifest m = order_->manifest();
  m.plan = plan;
  SG_ASSIGN_OR_RETURN(order_, storage::DataOrder::Create(*corpus_, m));
  return absl::OkStatus();
}

absl::Status ReferenceWorker::LoadCheckpoint(const std::string& path,
                                             const std::string& plan_override,
                                             absl::string_view expected_checksum) {
  storage::CheckpointFileInfo info;
  SG_ASSIGN_OR_RETURN(storage::Checkpoint ckpt,
                      storage::ReadCheckpoint(path, options_.config.model.Fingerprint(), &info));
  // The daemon checked that the file is the one registered without reading
  // it; its checksum is checked here, where the file is read anyway.
  if (!expected_checksum.empty() &&
      absl::AsciiStrToLower(expected_checksum) != storage::ChecksumHex(info.checksum)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " has XXH64 ",
                                            storage::ChecksumHex(info.checksum),
                                            "; the daemon registered it with ",
                                            expected_checksum));
  }
  const storage::CheckpointSection* section = ckpt.FindSection(kTrainerSection);
  if (section == nullptr) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": no trainer section"));
  }
  SG_RETURN_IF_ERROR(trainer_->LoadState(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(section->data.data()), section->data.size())));
  std::string plan_text = plan_override;
  if (plan_text.empty()) {
    auto it = ckpt.hparams.find(kPlanKey);
    if (it != ckpt.hparams.end()) plan_text = it->second;
  }
  storage::DataPlan plan = storage::DataPlan::Default();
  if (!plan_text.empty()) {
    SG_ASSIGN_OR_RETURN(plan, storage::DataPlan::Parse(plan_text));
  }
  SG_RETURN_IF_ERROR(SetPlan(plan));
  step_ = ckpt.step;
  SG_LOG(INFO) << "loaded checkpoint " << path << " (generation " << ckpt.generation << ", step "
               << ckpt.step << ", plan " << plan.ToString() << ")";
  return absl::OkStatus();
}

absl::StatusOr<storage::CheckpointFileInfo> ReferenceWorker::SaveCheckpoint() {
  if (checkpoints_ == nullptr) return absl::FailedPreconditionError("no checkpoint dir");
  storage::Checkpoint ckpt;
  ckpt.generation = generation_;
  ckpt.step = step_;
  auto pos = order_->PositionForStep(step_);
  ckpt.data_position = pos.ok() ? *pos : -1;
  ckpt.config_fingerprint = options_.config.model.Fingerprint();
  // The data order is a pure function of the manifest and plan; the trainer
  // has no other random state (no dropout), so nothing more is needed to
  // resume bit for bit.
  ckpt.rng_state = absl::StrCat("data_seed=", order_->manifest().seed);
  ckpt.hparams[kPlanKey] = order_->manifest().plan.ToString();
  const auto& hp = trainer_->hparams();
  ckpt.hparams["lr_scale"] = absl::StrCat(hp.lr_scale);
  ckpt.hparams["extra_warmup_steps"] = absl::StrCat(hp.extra_warmup_steps);
  std::vector<uint8_t> state = trainer_->SaveState();
  ckpt.AddSection(kTrainerSection, state.data(), state.size());
  SG_ASSIGN_OR_RETURN(storage::CheckpointFileInfo info, checkpoints_->Write(ckpt));
  // The daemon's pins as its last answer to a checkpoint notice gave them
  // (the rolling rewind target among them).
  if (client_) {
    // The daemon may be about to pin a checkpoint this would delete (the
    // rolling rewind target moves with each notice): its answers come first.
    // A daemon that did not answer once is not waited for again until it
    // answers.
    if (!answers_missing_ && !client_->AwaitCheckpointAnswers(kCheckpointAnswerWait)) {
      SG_LOG(WARNING) << "no answer from spikeguardd to a checkpoint notice within "
                      << absl::FormatDuration(kCheckpointAnswerWait)
                      << "; retention uses the pins it last sent";
      answers_missing_ = true;
    }
    if (std::optional<std::vector<std::string>> pins = client_->TakePins()) {
      answers_missing_ = false;
      PinnedPaths(*pins, &pinned_paths_);
    }
  }
  SG_ASSIGN_OR_RETURN(
      std::vector<storage::CheckpointFileInfo> deleted,
      checkpoints_->Retain(std::max(1, options_.config.keep_checkpoints), pinned_paths_));
  for (const storage::CheckpointFileInfo& gone : deleted) {
    SG_LOG(INFO) << "retention deleted checkpoint " << gone.path << " (step " << gone.step << ")";
    if (!client_) continue;
    v1::CheckpointDeleted notice;
    notice.set_step(gone.step);
    notice.set_uri(UriOfFile(gone.path));
    client_->ReportCheckpointDeleted(notice);
  }
  if (client_) {
    v1::CheckpointSaved saved;
    saved.set_step(step_);
    saved.set_data_position(ckpt.data_position);
    saved.set_uri(UriOfFile(info.path));
    saved.set_bytes(static_cast<int64_t>(info.bytes));
    saved.set_checksum(absl::StrFormat("%016x", info.checksum));
    saved.set_has_rng_state(true);
    saved.set_has_data_loader_state(true);
    saved.set_complete(true);
    client_->ReportCheckpoint(saved);
  }
  return info;
}

absl::StatusOr<v1::StepReport> ReferenceWorker::TrainStep() {
  SG_ASSIGN_OR_RETURN(int64_t position, order_->PositionForStep(step_));
  SG_ASSIGN_OR_RETURN(storage::Batch data, order_->Materialize(position));
  kernels::Batch batch;
  batch.batch_size = data.batch_size;
  batch.seq_len = data.sample_tokens - 1;
  batch.tokens = std::move(data.tokens);
  batch.domain.assign(data.sample_domain.begin(), data.sample_domain.end());
  batch.num_domains = corpus_->num_domains();
  // A transient fault: the first time this process trains that step, in
  // whichever generation the run is by then; a replay does not repeat it.
  if (!bitflip_done_ && options_.bitflip_step == step_) {
    trainer_->ArmGradientBitflip(step_);
    bitflip_done_ = true;
  }

  const auto start = std::chrono::steady_clock::now();
  kernels::StepTelemetry t = trainer_->Step(batch, step_, options_.telemetry);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  v1::StepReport r;
  r.set_step(step_);
  r.set_data_position(position);
  r.set_loss(t.loss);
  for (size_t d = 0; d < t.domain_loss.size(); ++d) {
    if (d >= t.domain_tokens.size() || t.domain_tokens[d] == 0) continue;
    auto* dl = r.add_domain_losses();
    dl->set_domain(corpus_->domain_names()[d]);
    dl->set_loss(t.domain_loss[d]);
    dl->set_tokens(t.domain_tokens[d]);
  }
  r.set_grad_norm(t.grad_norm);
  r.set_clipped(t.clipped);
  r.set_lr(t.lr);
  r.set_loss_scale(1.0);
  r.set_tokens(t.tokens);
  r.set_step_time_s(seconds);
  r.set_lse_mean(t.lse_mean);
  r.set_lse_max(t.lse_max);
  r.set_nonfinite_count(t.nonfinite_count);
  r.set_loss_hash(t.loss_hash);
  r.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  for (size_t l = 0; l < t.layers.size(); ++l) {
    auto* ls = r.add_layers();
    ls->set_layer(static_cast<uint32_t>(l));
    ls->set_max_attn_logit(t.layers[l].max_attn_logit);
    ls->set_grad_norm(t.layers[l].grad_norm);
    ls->set_update_ratio(t.layers[l].update_ratio);
    ls->set_act_rms(t.layers[l].act_rms);
    ls->set_param_norm(t.layers[l].param_norm);
  }
  ++step_;
  return r;
}

void ReferenceWorker::Emit(const v1::StepReport& report) {
  if (jsonl_.is_open()) {
    std::string line;
    google::protobuf::util::JsonPrintOptions opts;
    opts.preserve_proto_field_names = true;
    opts.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(report, &line, opts);
    jsonl_ << line << '\n';
  }
  if (client_) {
    client_->Report(report);
    client_->SetCurrentStep(report.step());
  }
}

absl::Status ReferenceWorker::HandleCommand(const v1::Command& command, bool* stop) {
  if (!command.id().empty() && executed_commands_.count(command.id()) > 0) {
    // Re-sent after a reconnect: already done.
    v1::CommandResult result;
    result.set_command_id(command.id());
    result.set_ok(true);
    result.set_message("already executed");
    result.set_step(step_);
    client_->SendCommandResult(result);
    return absl::OkStatus();
  }
  // The daemon's pins as of this command: retention keeps them.
  PinnedPaths(command.pinned_uris(), &pinned_paths_);
  SG_LOG(INFO) << "executing command " << command.id() << " ("
               << v1::Command::Kind_Name(command.kind()) << ") at step " << step_;
  absl::Status status = absl::OkStatus();
  switch (command.kind()) {
    case v1::Command::PAUSE:
      paused_ = true;
      break;
    case v1::Command::CONTINUE:
      paused_ = false;
      stop_after_ = -1;
      break;
    case v1::Command::STOP:
      *stop = true;
      break;
    case v1::Command::SET_HPARAMS: {
      kernels::HParamOverrides hp = trainer_->hparams();
      ApplyHParams(command.hparams(), &hp);
      trainer_->SetHParams(hp);
      break;
    }
    case v1::Command::REWIND: {
      // Everything of the old generation is delivered before the switch.
      (void)client_->Flush(absl::Seconds(30));
      std::string plan_text;
      if (command.data_plan().ranges_size() > 0 || command.data_plan().masks_size() > 0) {
        absl::StatusOr<storage::DataPlan> plan = PlanFromProto(command.data_plan());
        if (plan.ok()) {
          plan_text = plan->ToString();
        } else {
          status = absl::InvalidArgumentError(
              absl::StrCat("rewind: bad data plan: ", plan.status().message()));
        }
      }
      if (status.ok()) {
        absl::StatusOr<std::string> path = storage::CheckpointPathOfUri(command.checkpoint().uri());
        status = path.ok() ? LoadCheckpoint(*path, plan_text, command.checkpoint().checksum())
                           : path.status();
      }
      if (status.ok()) {
        generation_ = command.new_generation();
        client_->SetGeneration(generation_);
        stop_after_ = command.stop_after_step() > 0 ? command.stop_after_step() : -1;
        // A checkpoint the daemon asked for off the cadence (where a probe
        // window starts): saved once this generation gets there.
        checkpoint_at_ = command.checkpoint_at_step() > step_ ? command.checkpoint_at_step() : -1;
        paused_ = false;
        // Absolute: after the checkpoint (which restores the overrides it was
        // saved with), the configured base with the command's fields.
        kernels::HParamOverrides hp = BaseHParams();
        ApplyHParams(command.hparams(), &hp);
        trainer_->SetHParams(hp);
      } else {
        // Going on in the old generation would train where nobody expects
        // it: hold until the daemon says what next.
        paused_ = true;
        SG_LOG(ERROR) << "rewind to " << command.checkpoint().uri()
                      << " failed; paused in generation " << generation_ << " at step " << step_
                      << " until the next command";
      }
      break;
    }
    default:
      status = absl::InvalidArgumentError(
          absl::StrCat("unknown command kind ", static_cast<int>(command.kind())));
  }
  if (!command.id().empty()) {
    executed_commands_.insert(command.id());
    v1::CommandResult result;
    result.set_command_id(command.id());
    result.set_ok(status.ok());
    result.set_message(status.ok() ? "ok" : std::string(status.message()));
    result.set_step(step_);
    client_->SendCommandResult(result);
  }
  if (!status.ok()) SG_LOG(ERROR) << "command " << command.id() << " failed: " << status;
  return absl::OkStatus();
}

absl::Status ReferenceWorker::WaitForGo(bool* stop) {
  while (!*stop && (paused_ || (stop_after_ >= 0 && step_ > stop_after_))) {
    if (client_->rejection().has_value()) {
      return absl::FailedPreconditionError(client_->rejection()->message());
    }
    auto command = client_->WaitCommand(absl::Milliseconds(200));
    if (command) SG_RETURN_IF_ERROR(HandleCommand(*command, stop));
  }
  return absl::OkStatus();
}

absl::Status ReferenceWorker::Run() {
  const WorkerConfig& cfg = options_.config;
  bool stop = false;
  while (!stop) {
    if (client_) {
      while (auto command = client_->WaitCommand(absl::ZeroDuration())) {
        SG_RETURN_IF_ERROR(HandleCommand(*command, &stop));
      }
      if (client_->rejection().has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat("rejected by spikeguardd: ", client_->rejection()->message()));
      }
      if (stop_after_ >= 0 && step_ > stop_after_) {
        SG_RETURN_IF_ERROR(client_->Flush(absl::Seconds(60)));
      }
      SG_RETURN_IF_ERROR(WaitForGo(&stop));
      if (stop) break;
    } else if (stop_after_ >= 0 && step_ > stop_after_) {
      break;
    }
    if (step_ >= cfg.steps) {
      if (!client_) break;
      // Done: deliver everything, say the generation ended (once), then wait
      // up to `linger` for a rewind or a stop (the supervisor may still want
      // to probe).
      SG_RETURN_IF_ERROR(client_->Flush(absl::Seconds(60)));
      if (ended_generation_ != generation_) {
        v1::GenerationEnded ended;
        ended.set_generation(generation_);
        ended.set_last_step(step_ - 1);
        std::string reason = absl::StrFormat("end of training schedule (steps=%d)", cfg.steps);
        if (stop_after_ >= step_) {
          absl::StrAppendFormat(&reason, " before the horizon at step %d", stop_after_);
        }
        ended.set_reason(reason);
        SG_LOG(INFO) << "generation " << generation_ << " ended at step " << step_ - 1 << ": "
                     << reason;
        client_->SendGenerationEnded(ended);
        ended_generation_ = generation_;
        SG_RETURN_IF_ERROR(client_->Flush(absl::Seconds(60)));
      }
      const absl::Time until = absl::Now() + options_.linger;
      bool handled = false;
      while (!handled && absl::Now() < until) {
        auto command = client_->WaitCommand(absl::Milliseconds(200));
        if (command) {
          SG_RETURN_IF_ERROR(HandleCommand(*command, &stop));
          handled = true;
        }
        if (client_->rejection().has_value()) {
          return absl::FailedPreconditionError(client_->rejection()->message());
        }
      }
      if (!handled) break;
      continue;
    }
    SG_ASSIGN_OR_RETURN(v1::StepReport report, TrainStep());
    Emit(report);
    const bool asked = step_ == checkpoint_at_;
    if (asked) checkpoint_at_ = -1;
    if (checkpoints_ &&
        (asked || (cfg.checkpoint_every > 0 && step_ % cfg.checkpoint_every == 0))) {
      SG_RETURN_IF_ERROR(SaveCheckpoint().status());
    }
  }
  if (jsonl_.is_open()) jsonl_.flush();
  if (client_) SG_RETURN_IF_ERROR(client_->Flush(absl::Seconds(60)));
  return absl::OkStatus();
}

}  // namespace spikeguard::worker
