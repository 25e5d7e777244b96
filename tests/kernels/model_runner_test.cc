// ModelRunner is the Trainer's step with its buffers in backend memory (what
// the CUDA compare drives). On the CPU backend the two must give the same
// bits, so a CPU-vs-GPU difference seen through the runner is the backend's.
#include "kernels/model_runner.h"

#include <bit>
#include <cstring>
#include <ostream>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/trainer.h"
#include "tests/kernels/test_util.h"

namespace spikeguard::kernels {
namespace {

using testing::PatternBatch;
using testing::RandomBatch;

RunnerModel ToRunner(const ModelConfig& m) {
  return {.vocab = m.vocab,
          .layers = m.layers,
          .heads = m.heads,
          .width = m.width,
          .context = m.context,
          .qk_norm = m.qk_norm,
          .bias = m.bias,
          .tie_embeddings = m.tie_embeddings,
          .fp16_emulation = m.fp16_emulation,
          .z_loss = m.z_loss,
          .attn_softcap = m.attn_softcap,
          .logit_softcap = m.logit_softcap};
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Variant {
  const char* name;
  ModelConfig model;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::vector<Variant> Variants() {
  ModelConfig plain = testing::SmallModel();
  ModelConfig all = plain;
  all.qk_norm = true;
  all.tie_embeddings = true;
  all.z_loss = 1e-3f;
  all.attn_softcap = 2.0f;
  all.logit_softcap = 3.0f;
  all.init_std = 0.1f;
  ModelConfig bare = plain;
  bare.bias = false;
  bare.fp16_emulation = true;
  bare.vocab = 123;  // below 256, above the pattern text's bytes
  return {{"plain", plain}, {"qknorm_tied_zloss_softcaps", all}, {"nobias_fp16", bare}};
}

class ModelRunnerTest : public ::testing::TestWithParam<Variant> {};

TEST_P(ModelRunnerTest, SameLayoutAsTrainer) {
  Trainer trainer(GetParam().model, OptimConfig{}, 1);
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  ModelRunner runner(ToRunner(GetParam().model), *cpu, 2, 8);
  ASSERT_EQ(runner.tensors().size(), trainer.tensors().size());
  for (size_t i = 0; i < runner.tensors().size(); ++i) {
    const RunnerTensor& r = runner.tensors()[i];
    const Trainer::TensorInfo& t = trainer.tensors()[i];
    EXPECT_EQ(r.name, t.name);
    EXPECT_EQ(r.offset, t.offset) << t.name;
    EXPECT_EQ(r.size, t.size) << t.name;
    EXPECT_EQ(r.layer, t.layer) << t.name;
    EXPECT_EQ(r.decay, t.decay) << t.name;
  }
  EXPECT_EQ(runner.num_parameters(), static_cast<size_t>(trainer.num_parameters()));
}

TEST_P(ModelRunnerTest, GradientsBitIdenticalToTrainer) {
  const ModelConfig& model = GetParam().model;
  Trainer trainer(model, OptimConfig{}, 2);
  std::unique_ptr<Backend> cpu = MakeCpuBackend(2);
  const Batch batch = RandomBatch(3, 12, model.vocab, 5);
  ModelRunner runner(ToRunner(model), *cpu, batch.batch_size, batch.seq_len);
  runner.SetParameters(trainer.parameters());
  const Trainer::Loss lt = trainer.ComputeGradients(batch);
  const ModelRunner::Loss lr = runner.Forward(batch.tokens, /*backward=*/true);
  EXPECT_EQ(std::bit_cast<uint64_t>(lt.cross_entropy), std::bit_cast<uint64_t>(lr.cross_entropy));
  EXPECT_EQ(std::bit_cast<uint64_t>(lt.objective), std::bit_cast<uint64_t>(lr.objective));
  const std::vector<float> g = runner.Gradients();
  for (const Trainer::TensorInfo& t : trainer.tensors()) {
    EXPECT_TRUE(SameBits(trainer.gradients().subspan(t.offset, t.size), std::span(g).subspan(t.offset, t.size)))
        << t.name;
  }
}

TEST_P(ModelRunnerTest, StepsBitIdenticalToTrainer) {
  const ModelConfig& model = GetParam().model;
  OptimConfig optim;
  optim.peak_lr = 3e-3f;
  optim.warmup_steps = 3;
  optim.weight_decay = 0.1f;
  optim.clip_norm = 0.5f;
  Trainer trainer(model, optim, 2);
  std::unique_ptr<Backend> cpu = MakeCpuBackend(2);
  ModelRunner runner(ToRunner(model), *cpu, 4, 16);
  runner.SetParameters(trainer.parameters());
  for (int64_t s = 0; s < 6; ++s) {
    Batch batch = PatternBatch(4, 16, s);
    batch.num_domains = 2;
    batch.domain = {0, 1, 1, 0};
    const StepTelemetry t = trainer.Step(batch, s);
    const RunnerStepResult r = runner.Step(batch.tokens, batch.domain, batch.num_domains,
                                           {.lr = static_cast<float>(trainer.LearningRate(s)),
                                            .beta1 = optim.beta1,
                                            .beta2 = optim.beta2,
                                            .eps = optim.eps,
                                            .weight_decay = optim.weight_decay,
                                            .clip_norm = optim.clip_norm});
    SCOPED_TRACE(s);
    EXPECT_EQ(t.loss_hash, LossHash(r.loss));
    EXPECT_EQ(t.grad_norm, r.grad_norm);
    EXPECT_EQ(t.clipped, r.clipped);
    EXPECT_EQ(t.nonfinite_count, r.nonfinite_count);
    EXPECT_EQ(t.update_skipped, r.update_skipped);
    EXPECT_EQ(t.lse_mean, r.lse_mean);
    EXPECT_EQ(t.lse_max, r.lse_max);
    EXPECT_EQ(t.domain_loss, r.domain_loss);
    EXPECT_EQ(t.domain_tokens, r.domain_tokens);
    ASSERT_EQ(t.layers.size(), r.layers.size());
    for (size_t l = 0; l < t.layers.size(); ++l) {
      EXPECT_EQ(t.layers[l].max_attn_logit, r.layers[l].max_attn_logit) << l;
      EXPECT_EQ(t.layers[l].grad_norm, r.layers[l].grad_norm) << l;
      EXPECT_EQ(t.layers[l].update_ratio, r.layers[l].update_ratio) << l;
      EXPECT_EQ(t.layers[l].act_rms, r.layers[l].act_rms) << l;
      EXPECT_EQ(t.layers[l].param_norm, r.layers[l].param_norm) << l;
    }
    EXPECT_TRUE(SameBits(trainer.parameters(), runner.Parameters()));
    EXPECT_EQ(trainer.optimizer_updates(), runner.optimizer_updates());
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, ModelRunnerTest, ::testing::ValuesIn(Variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace spikeguard::kernels
