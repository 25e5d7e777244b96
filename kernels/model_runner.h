// model_runner.h
// -----------------------------------------------------------------------------
// The reference GPT's training step with every buffer in the backend's memory,
// so the same code runs on the CPU backend and on the CUDA backend. It is what
// the CPU-vs-CUDA compare drives; it needs neither Abseil nor the project's
// base library, so it builds on a GPU machine that has only a compiler.
//
//   std::unique_ptr<Backend> cuda = MakeCudaBackend({});     // cuda/cuda_backend.h
//   RunnerModel model{.layers = 2, .qk_norm = true};
//   ModelRunner runner(model, *cuda, /*batch=*/4, /*seq=*/64);
//   runner.SetParameters(weights);                            // host floats, tensors() layout
//   RunnerStepResult r = runner.Step(tokens, {}, 1, {.lr = 1e-3f});
//
// The parameter layout (names, order, offsets, decay) and the arithmetic of
// Forward/Backward/Step are those of Trainer (trainer.h), kernel call for kernel
// call: on the CPU backend both give the same bits (model_runner_test checks
// it). What Trainer has beyond that (the lr schedule, hyperparameter overrides,
// the armed bit flip, checkpoints) stays there.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace spikeguard::kernels {

// The fields of ModelConfig that shape the computation (config.h has the
// meaning of each).
struct RunnerModel {
  int vocab = 256, layers = 4, heads = 4, width = 128, context = 64;
  bool qk_norm = false, bias = true, tie_embeddings = false, fp16_emulation = false;
  float z_loss = 0, attn_softcap = 0, logit_softcap = 0;
};

struct RunnerOptim {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  float clip_norm = 0;  // 0 = off
};

struct RunnerTensor {
  std::string name;  // e.g. "layer1.w_qkv"
  size_t offset = 0, size = 0;
  int layer = -1;
  bool decay = false;
};

// StepTelemetry's fields, with the same meaning (trainer.h).
struct RunnerStepResult {
  double loss = 0, objective = 0;
  std::vector<double> domain_loss;
  std::vector<int64_t> domain_tokens;
  double grad_norm = 0;
  bool clipped = false;
  int64_t nonfinite_count = 0;
  bool update_skipped = false;
  double lse_mean = 0, lse_max = 0;
  struct Layer {
    double max_attn_logit = 0, grad_norm = 0, update_ratio = 0, act_rms = 0, param_norm = 0;
  };
  std::vector<Layer> layers;
};

class ModelRunner {
 public:
  // Buffers for batches of `batch` sequences of `seq` tokens (seq <= context).
  ModelRunner(const RunnerModel& model, Backend& backend, int batch, int seq);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  const std::vector<RunnerTensor>& tensors() const { return tensors_; }
  size_t num_parameters() const { return num_params_; }
  int batch() const { return batch_; }
  int seq() const { return seq_; }

  // Host copies in and out of backend memory, in tensors() layout.
  void SetParameters(std::span<const float> params);
  void SetOptimizerState(std::span<const float> m, std::span<const float> v, int64_t updates);
  std::vector<float> Parameters() const;
  std::vector<float> Gradients() const;
  std::vector<float> FirstMoments() const;
  std::vector<float> SecondMoments() const;
  int64_t optimizer_updates() const { return adam_t_; }

  struct Loss {
    double cross_entropy = 0, objective = 0;
  };
  // tokens: batch·(seq+1) bytes, sample b at [b·(seq+1), (b+1)·(seq+1)).
  // With backward, Gradients() holds the gradients of `objective` afterwards.
  Loss Forward(std::span<const uint8_t> tokens, bool backward);

  // Forward, backward, clipping and AdamW, like Trainer::Step with telemetry
  // on. domain: per sample, empty = all in domain 0.
  RunnerStepResult Step(std::span<const uint8_t> tokens, std::span<const int> domain, int num_domains,
                        const RunnerOptim& optim);

  // Host copies of the last Forward's outputs.
  std::vector<float> Logits() const;  // [batch·seq × vocab], raw (before the soft-cap)
  std::vector<float> Losses() const;  // per token
  std::vector<float> Lse() const;     // per token

 private:
  struct Buffers;
  void Backward();

  RunnerModel model_;
  Backend& be_;
  int batch_, seq_;
  std::vector<RunnerTensor> tensors_;
  size_t num_params_ = 0;
  int64_t adam_t_ = 0;
  std::unique_ptr<Buffers> buf_;
};

}  // namespace spikeguard::kernels
