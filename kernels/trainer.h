// trainer.h
// -----------------------------------------------------------------------------
// The reference model of spikeguard: a small byte-level GPT decoder (learned
// positions, pre-LN blocks, GELU MLP) trained with AdamW, written like llm.c.
// The trainer owns parameters, optimizer state and activations, and calls a
// `Backend` (backend.h) for every kernel; the CPU backend is bit-exact across
// runs, thread counts and save/load, so a replayed step gives the same loss
// hash as the original.
//
//   ModelConfig model;                      // config.h
//   OptimConfig optim;
//   Trainer trainer(model, optim, /*threads=*/2);
//   for (int64_t step = 0; step < 2000; ++step) {
//     Batch batch = NextBatch(step);        // B·(T+1) bytes per batch
//     StepTelemetry t = trainer.Step(batch, step);
//     Report(t.loss, t.grad_norm, t.layers[0].max_attn_logit, t.loss_hash);
//   }
//   std::vector<uint8_t> state = trainer.SaveState();   // into a checkpoint
//   ...
//   Trainer resumed(model, optim, 2);
//   SG_RETURN_IF_ERROR(resumed.LoadState(state));        // refuses another config
//
// Fault and fix hooks used by the supervisor's probes:
//   trainer.ArmGradientBitflip(600);   // a one-time transient fault at step 600
//   trainer.SetHParams({.lr_scale = 0.7});   // the first FRAGILITY rung
//
// Not thread-safe: one thread drives a trainer (the backend has its own).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/config.h"

namespace spikeguard::kernels {

// One training batch of bytes. Sample b holds tokens[b·(T+1), (b+1)·(T+1)):
// the inputs are its first T bytes and the targets its last T.
struct Batch {
  int batch_size = 0;
  int seq_len = 0;  // T, at most ModelConfig::context
  std::vector<uint8_t> tokens;
  std::vector<int> domain;  // per sample, in [0, num_domains); empty = all domain 0
  int num_domains = 1;
};

struct LayerTelemetry {
  double max_attn_logit = 0;  // max of cap(q·k/√d) over heads and causal positions
  double grad_norm = 0;       // ‖∇‖ of the block's parameters, before clipping
  double update_ratio = 0;    // ‖Δw‖/‖w‖ of this step's update
  double act_rms = 0;         // RMS of the residual stream after the block
  double param_norm = 0;      // ‖w‖ before this step's update
};

struct StepTelemetry {
  double loss = 0;                     // mean cross-entropy, nats per token (z-loss not included)
  std::vector<double> domain_loss;     // mean cross-entropy per domain (0 when no tokens)
  std::vector<int64_t> domain_tokens;  // tokens per domain
  int64_t tokens = 0;
  double grad_norm = 0;  // global, before clipping
  bool clipped = false;
  double lr = 0;
  double lse_mean = 0, lse_max = 0;    // log Σ exp(output logits) per token
  int64_t nonfinite_count = 0;         // non-finite loss + logits + gradient values
  bool update_skipped = false;         // non-finite loss or gradients: AdamW did not run
  uint64_t loss_hash = 0;              // LossHash(loss)
  std::vector<LayerTelemetry> layers;  // empty when telemetry is off
};

// A 64-bit hash of the loss's bits (splitmix64): equal hashes = bit-exact replay.
uint64_t LossHash(double loss);

class Trainer {
 public:
  // Dies on an invalid config (check with ModelConfig/OptimConfig::Validate).
  Trainer(ModelConfig model, OptimConfig optim, int threads);
  Trainer(ModelConfig model, OptimConfig optim, std::unique_ptr<Backend> backend);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  const ModelConfig& model_config() const { return model_; }
  const OptimConfig& optim_config() const { return optim_; }
  Backend& backend() { return *backend_; }

  // OK when `batch` fits the model: shapes, token range, domains.
  absl::Status ValidateBatch(const Batch& batch) const;

  // One training step: forward, backward, clipping, AdamW (skipped when the
  // loss or a gradient is non-finite). `step` drives the lr schedule and the
  // armed bit flip. With telemetry=false, lse_mean/lse_max and `layers` are
  // left empty (their reductions are skipped); everything else is filled.
  // Dies on an invalid batch.
  StepTelemetry Step(const Batch& batch, int64_t step, bool telemetry = true);

  // Mean cross-entropy of `batch` without changing anything.
  double Evaluate(const Batch& batch);

  // The lr Step(…, step) would use under the current overrides.
  double LearningRate(int64_t step) const;

  void SetHParams(const HParamOverrides& overrides);
  const HParamOverrides& hparams() const { return overrides_; }

  // At `step` (once), after the backward pass, flips exponent bit 30 of the
  // gradient element of largest magnitude (×2^128 for |g| < 1): a transient
  // fault. The arming is not part of the saved state.
  void ArmGradientBitflip(int64_t step) { bitflip_step_ = step; }

  // Parameters, AdamW moments, update count and overrides, with the configs
  // they belong to and a checksum.
  std::vector<uint8_t> SaveState() const;
  // Replaces the whole state, or changes nothing and returns: INVALID_ARGUMENT
  // (not a trainer state), DATA_LOSS (truncated or corrupt), FAILED_PRECONDITION
  // (saved with another config; the message names the field, e.g.
  // "model.layers: state has 4, this trainer has 2"). The seed is not compared.
  absl::Status LoadState(std::span<const uint8_t> state);

  // Hash of all parameter bits.
  uint64_t ParamHash() const;
  int64_t optimizer_updates() const { return adam_t_; }
  int64_t num_parameters() const { return static_cast<int64_t>(params_.size()); }

  // ---- inspection, for tests and gradient checks --------------------------
  struct TensorInfo {
    std::string name;  // e.g. "layer1.w_qkv", "wte"
    size_t offset = 0, size = 0;
    int layer = -1;  // -1 for embeddings, final norm and head
    bool decay = false;
  };
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::span<float> parameters() { return params_; }
  std::span<const float> gradients() const { return grads_; }
  struct Loss {
    double cross_entropy = 0;  // mean, nats per token
    double objective = 0;      // cross_entropy + z_loss·mean(lse²): what the gradients are of
  };
  Loss ComputeLoss(const Batch& batch);       // forward only
  Loss ComputeGradients(const Batch& batch);  // forward and backward; no update

 private:
  struct LayerOffsets;
  struct Activations;

  void BuildLayout();
  void InitParameters();
  void EnsureActivations(int batch, int seq);
  Loss Forward(const Batch& batch, bool backward);
  void Backward();
  float* P(size_t offset) { return offset == kNone ? nullptr : params_.data() + offset; }
  float* G(size_t offset) { return offset == kNone ? nullptr : grads_.data() + offset; }
  std::string ConfigText() const;

  static constexpr size_t kNone = ~size_t{0};

  ModelConfig model_;
  OptimConfig optim_;
  std::unique_ptr<Backend> backend_;
  HParamOverrides overrides_;
  int64_t adam_t_ = 0;
  int64_t bitflip_step_ = -1;

  std::vector<TensorInfo> tensors_;
  std::vector<LayerOffsets> layer_offsets_;
  size_t wte_ = kNone, wpe_ = kNone, lnf_g_ = kNone, lnf_b_ = kNone, lm_head_ = kNone;
  std::vector<float> params_, grads_, m_, v_;
  std::unique_ptr<Activations> acts_;
};

}  // namespace spikeguard::kernels
