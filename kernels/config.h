// config.h
// -----------------------------------------------------------------------------
// Configuration of the reference model (a byte-level GPT decoder) and of its
// AdamW optimizer, plus the hyperparameter overrides the supervisor may change
// while a run is going (REWIND and SET_HPARAMS commands; docs/ARCHITECTURE.md,
// "The incident engine", fix ladder).
//
//   ModelConfig model;            // 4 layers, 4 heads, width 128, context 64
//   model.qk_norm = true;         // an option tied to stability in the literature
//   OptimConfig optim;
//   optim.peak_lr = 3e-3f;
//   optim.warmup_steps = 100;
//   if (absl::Status s = model.Validate(); !s.ok()) ...
//   std::string fp = model.Fingerprint();   // what a worker sends in Hello
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace spikeguard::kernels {

struct ModelConfig {
  int vocab = 256;  // bytes
  int layers = 4;
  int heads = 4;
  int width = 128;              // residual stream; must be a multiple of heads
  int context = 64;             // longest sequence (learned positions)
  bool qk_norm = false;         // layernorm on q and k of each head
  bool bias = true;             // biases of linear layers and layernorms
  bool tie_embeddings = false;  // output projection = token embeddingᵀ
  bool fp16_emulation = false;  // after each matmul/activation |x| > 65504 becomes ±Inf
  float z_loss = 0;             // adds z_loss·(log Σ e^z)² per token to the objective
  float attn_softcap = 0;       // > 0: attention logits become cap·tanh(x/cap)
  float logit_softcap = 0;      // > 0: output logits become cap·tanh(x/cap)
  float init_std = 0.02f;       // normal init of weights (residual projections / √(2·layers))
  uint64_t seed = 1;            // parameter initialization

  absl::Status Validate() const;
  // A stable, human-readable description of every field, e.g.
  // "gpt:v256:l4:h4:w128:c64:qk0:b1:tie0:fp16_0:z0:ac0:lc0:init0.02:seed1".
  std::string Fingerprint() const;
};

struct OptimConfig {
  enum class Schedule { kConstant, kCosine };
  float peak_lr = 1e-3f;
  int64_t warmup_steps = 100;  // linear warmup from peak_lr/warmup_steps to peak_lr
  Schedule schedule = Schedule::kConstant;
  int64_t total_steps = 2000;  // cosine: lr reaches min_lr_ratio·peak_lr here
  float min_lr_ratio = 0.1f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0;  // decoupled; applied to matrices and embeddings only
  float clip_norm = 0;     // global gradient-norm clipping; 0 = off

  absl::Status Validate() const;
};

// Changes the supervisor applies while training (SET_HPARAMS, or with a
// rewind). They are part of the trainer's saved state.
struct HParamOverrides {
  double lr_scale = 1.0;  // multiplies the scheduled lr
  // > 0: a fresh linear warmup over this many steps, starting at
  // rewarm_start_step; -1 there means "the next step trained" and is replaced
  // by that step number once it runs.
  int64_t extra_warmup_steps = 0;
  int64_t rewarm_start_step = -1;
  std::optional<double> clip_norm;  // replaces OptimConfig::clip_norm
  std::optional<double> beta2;      // replaces OptimConfig::beta2
  std::optional<double> eps;        // replaces OptimConfig::eps

  bool operator==(const HParamOverrides&) const = default;
};

}  // namespace spikeguard::kernels
