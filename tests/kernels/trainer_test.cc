#include "kernels/trainer.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace spikeguard::kernels {
namespace {

using ::testing::HasSubstr;
using testing::PatternBatch;
using testing::RandomBatch;
using testing::SmallModel;

OptimConfig FastOptim() {
  OptimConfig o;
  o.peak_lr = 3e-3f;
  o.warmup_steps = 5;
  return o;
}

// Loss hashes of `steps` steps, starting at `first`.
std::vector<uint64_t> Train(Trainer& trainer, int64_t first, int64_t steps) {
  std::vector<uint64_t> hashes;
  for (int64_t s = first; s < first + steps; ++s) hashes.push_back(trainer.Step(PatternBatch(4, 16, s), s).loss_hash);
  return hashes;
}

TEST(TrainerTest, UntrainedLossIsLogVocab) {
  ModelConfig model;  // the default 4×128 model, vocabulary 256
  model.context = 16;
  Trainer trainer(model, OptimConfig{}, 2);
  // Logits of std ≈ 0.02·√128 add about σ²/2 ≈ 0.03 nats to ln 256.
  const double loss = trainer.Evaluate(RandomBatch(16, 16, 256, 3));
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

TEST(TrainerTest, RepetitivePatternDrivesLossDown) {
  Trainer trainer(SmallModel(), FastOptim(), 2);
  const double first = trainer.Step(PatternBatch(8, 16, 0), 0).loss;
  double last = 0;
  for (int s = 1; s < 150; ++s) last = trainer.Step(PatternBatch(8, 16, s), s).loss;
  EXPECT_GT(first, 5.0);
  EXPECT_LT(last, 1.0) << "first " << first;
  EXPECT_LT(trainer.Evaluate(PatternBatch(8, 16, 1000)), 1.0);
}

TEST(TrainerTest, DeterministicAcrossRuns) {
  Trainer a(SmallModel(), FastOptim(), 2), b(SmallModel(), FastOptim(), 2);
  EXPECT_EQ(Train(a, 0, 20), Train(b, 0, 20));
  EXPECT_EQ(a.ParamHash(), b.ParamHash());
}

TEST(TrainerTest, OneAndTwoThreadsAreBitIdentical) {
  for (bool qk : {false, true}) {
    ModelConfig model = SmallModel();
    model.qk_norm = qk;
    model.attn_softcap = qk ? 0.0f : 5.0f;
    model.z_loss = 1e-4f;
    Trainer one(model, FastOptim(), 1), two(model, FastOptim(), 2);
    EXPECT_EQ(Train(one, 0, 10), Train(two, 0, 10)) << "qk_norm=" << qk;
    EXPECT_EQ(one.ParamHash(), two.ParamHash());
  }
}

// Shapes large enough that every kernel splits into many tasks.
TEST(TrainerTest, ThreadCountNeverChangesBitsAtScale) {
  ModelConfig model;
  model.layers = 2;
  model.width = 96;
  model.heads = 3;
  model.context = 40;
  model.qk_norm = true;
  model.tie_embeddings = true;
  std::vector<std::vector<uint64_t>> runs;
  std::vector<uint64_t> params;
  for (int threads : {1, 2, 3}) {
    Trainer trainer(model, FastOptim(), threads);
    std::vector<uint64_t> hashes;
    for (int s = 0; s < 3; ++s) hashes.push_back(trainer.Step(PatternBatch(13, 40, s), s).loss_hash);
    runs.push_back(hashes);
    params.push_back(trainer.ParamHash());
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
  EXPECT_EQ(params[0], params[1]);
  EXPECT_EQ(params[0], params[2]);
}

TEST(TrainerTest, SaveLoadMidRunIsBitExact) {
  Trainer straight(SmallModel(), FastOptim(), 2);
  const std::vector<uint64_t> expected = Train(straight, 0, 30);

  Trainer first(SmallModel(), FastOptim(), 2);
  std::vector<uint64_t> got = Train(first, 0, 12);
  const std::vector<uint8_t> state = first.SaveState();
  ModelConfig other_seed = SmallModel();
  other_seed.seed = 99;  // the seed only shapes the initial parameters
  Trainer resumed(other_seed, FastOptim(), 1);
  ASSERT_TRUE(resumed.LoadState(state).ok());
  EXPECT_EQ(resumed.optimizer_updates(), 12);
  const std::vector<uint64_t> rest = Train(resumed, 12, 18);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, expected);
  EXPECT_EQ(resumed.ParamHash(), straight.ParamHash());
}

TEST(TrainerTest, LoadStateRejectsAnotherConfigNamingTheField) {
  Trainer source(SmallModel(), FastOptim(), 1);
  const std::vector<uint8_t> state = source.SaveState();
  ModelConfig deeper = SmallModel();
  deeper.layers = 3;
  Trainer target(deeper, FastOptim(), 1);
  const uint64_t before = target.ParamHash();
  const absl::Status s = target.LoadState(state);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.layers: state has 2, this trainer has 3"));
  EXPECT_EQ(target.ParamHash(), before);

  ModelConfig qk = SmallModel();
  qk.qk_norm = true;
  Trainer qk_target(qk, FastOptim(), 1);
  EXPECT_THAT(std::string(qk_target.LoadState(state).message()), HasSubstr("model.qk_norm"));

  OptimConfig other_optim = FastOptim();
  other_optim.beta2 = 0.95f;
  Trainer optim_target(SmallModel(), other_optim, 1);
  EXPECT_THAT(std::string(optim_target.LoadState(state).message()), HasSubstr("optim.beta2: state has 0.999"));
}

TEST(TrainerTest, LoadStateRejectsCorruptOrForeignBytes) {
  Trainer trainer(SmallModel(), FastOptim(), 1);
  std::vector<uint8_t> state = trainer.SaveState();
  std::vector<uint8_t> flipped = state;
  flipped[flipped.size() / 2] ^= 0x10;
  EXPECT_EQ(trainer.LoadState(flipped).code(), absl::StatusCode::kDataLoss);
  std::vector<uint8_t> truncated(state.begin(), state.begin() + state.size() - 100);
  EXPECT_EQ(trainer.LoadState(truncated).code(), absl::StatusCode::kDataLoss);
  const std::vector<uint8_t> junk(64, 'x');
  EXPECT_EQ(trainer.LoadState(junk).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(trainer.LoadState(state).ok());
}

TEST(TrainerTest, Fp16EmulationOverflowsReproducibly) {
  ModelConfig model = SmallModel();
  model.fp16_emulation = true;
  model.init_std = 1.0f;
  OptimConfig optim;
  optim.peak_lr = 1.0f;  // absurd on purpose: weights grow until activations leave the fp16 range
  optim.warmup_steps = 1;
  auto run = [&](int threads) {
    Trainer trainer(model, optim, threads);
    std::vector<int64_t> counts;
    for (int s = 0; s < 40; ++s) counts.push_back(trainer.Step(PatternBatch(4, 16, s), s).nonfinite_count);
    return counts;
  };
  const std::vector<int64_t> a = run(2), b = run(1);
  EXPECT_EQ(a, b);
  int64_t first_bad = -1;
  for (size_t i = 0; i < a.size() && first_bad < 0; ++i) {
    if (a[i] > 0) first_bad = static_cast<int64_t>(i);
  }
  EXPECT_GE(first_bad, 1) << "the untrained model must be finite";

  // The same run without the emulation stays finite.
  model.fp16_emulation = false;
  Trainer fp32(model, optim, 2);
  for (int s = 0; s <= first_bad; ++s) EXPECT_EQ(fp32.Step(PatternBatch(4, 16, s), s).nonfinite_count, 0) << s;
}

TEST(TrainerTest, GradientBitflipHitsOnlyTheArmedStep) {
  Trainer clean(SmallModel(), FastOptim(), 2), faulty(SmallModel(), FastOptim(), 2);
  faulty.ArmGradientBitflip(5);
  std::vector<StepTelemetry> c, f;
  for (int s = 0; s < 8; ++s) {
    c.push_back(clean.Step(PatternBatch(4, 16, s), s));
    f.push_back(faulty.Step(PatternBatch(4, 16, s), s));
  }
  for (int s = 0; s < 5; ++s) EXPECT_EQ(c[s].grad_norm, f[s].grad_norm) << s;
  EXPECT_GT(f[5].grad_norm, 1e20 * c[5].grad_norm);
  EXPECT_EQ(c[5].loss_hash, f[5].loss_hash);        // the loss of the step itself is unaffected
  EXPECT_NE(c[7].loss_hash, f[7].loss_hash);        // the corrupted update changes what follows
  EXPECT_LT(f[7].grad_norm, 100 * c[7].grad_norm);  // the fault does not repeat

  // Not armed (a replay): identical to the clean run.
  Trainer replay(SmallModel(), FastOptim(), 2);
  for (int s = 0; s < 8; ++s) EXPECT_EQ(replay.Step(PatternBatch(4, 16, s), s).loss_hash, c[s].loss_hash);
}

TEST(TrainerTest, ClippingCapsTheUpdate) {
  OptimConfig optim = FastOptim();
  optim.clip_norm = 1e-3f;
  Trainer trainer(SmallModel(), optim, 1);
  const StepTelemetry t = trainer.Step(PatternBatch(4, 16, 0), 0);
  EXPECT_TRUE(t.clipped);
  EXPECT_GT(t.grad_norm, 1e-3);
  HParamOverrides no_clip;
  no_clip.clip_norm = 0.0;
  trainer.SetHParams(no_clip);
  EXPECT_FALSE(trainer.Step(PatternBatch(4, 16, 1), 1).clipped);
}

TEST(TrainerTest, SetHParamsChangesLrAndSurvivesSaveLoad) {
  OptimConfig optim = FastOptim();
  Trainer trainer(SmallModel(), optim, 2);
  Train(trainer, 0, 10);
  const double base = trainer.LearningRate(10);
  EXPECT_DOUBLE_EQ(base, optim.peak_lr);
  HParamOverrides o;
  o.lr_scale = 0.7;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  trainer.SetHParams(o);
  EXPECT_NEAR(trainer.Step(PatternBatch(4, 16, 10), 10).lr, 0.7 * optim.peak_lr, 1e-12);

  // A re-warmup starts at the next step trained.
  o.extra_warmup_steps = 4;
  trainer.SetHParams(o);
  EXPECT_NEAR(trainer.Step(PatternBatch(4, 16, 11), 11).lr, 0.7 * optim.peak_lr / 4, 1e-12);
  EXPECT_EQ(trainer.hparams().rewarm_start_step, 11);

  Trainer resumed(SmallModel(), optim, 2);
  ASSERT_TRUE(resumed.LoadState(trainer.SaveState()).ok());
  EXPECT_EQ(resumed.hparams(), trainer.hparams());
  for (int64_t s = 12; s < 16; ++s) {
    const StepTelemetry a = trainer.Step(PatternBatch(4, 16, s), s), b = resumed.Step(PatternBatch(4, 16, s), s);
    EXPECT_EQ(a.lr, b.lr);
    EXPECT_EQ(a.loss_hash, b.loss_hash);
  }
  EXPECT_NEAR(resumed.LearningRate(16), 0.7 * optim.peak_lr, 1e-12);
}

TEST(TrainerTest, ScheduleWarmsUpThenDecays) {
  OptimConfig optim;
  optim.peak_lr = 1e-2f;
  optim.warmup_steps = 10;
  optim.schedule = OptimConfig::Schedule::kCosine;
  optim.total_steps = 110;
  optim.min_lr_ratio = 0.1f;
  Trainer trainer(SmallModel(), optim, 1);
  const double peak = optim.peak_lr;
  EXPECT_NEAR(trainer.LearningRate(0), peak / 10, 1e-9);
  EXPECT_NEAR(trainer.LearningRate(9), peak, 1e-9);
  EXPECT_NEAR(trainer.LearningRate(60), peak * (0.1 + 0.9 * 0.5), 1e-9);
  EXPECT_NEAR(trainer.LearningRate(500), peak * 0.1, 1e-9);
}

TEST(TrainerTest, TelemetryIsCompleteAndDoesNotChangeTraining) {
  Trainer with(SmallModel(), FastOptim(), 2), without(SmallModel(), FastOptim(), 2);
  for (int s = 0; s < 6; ++s) {
    const Batch batch = RandomBatch(4, 16, 256, s, /*domains=*/2);
    const StepTelemetry a = with.Step(batch, s, true), b = without.Step(batch, s, false);
    EXPECT_EQ(a.loss_hash, b.loss_hash);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    ASSERT_EQ(a.layers.size(), 2u);
    EXPECT_TRUE(b.layers.empty());
    EXPECT_EQ(a.domain_tokens, (std::vector<int64_t>{32, 32}));
    EXPECT_NEAR((a.domain_loss[0] + a.domain_loss[1]) / 2, a.loss, 1e-9);
    EXPECT_GE(a.lse_max, a.lse_mean);
    EXPECT_EQ(a.nonfinite_count, 0);
    for (const LayerTelemetry& l : a.layers) {
      EXPECT_GT(l.max_attn_logit, 0);
      EXPECT_GT(l.grad_norm, 0);
      EXPECT_GT(l.update_ratio, 0);
      EXPECT_LT(l.update_ratio, 1);
      EXPECT_GT(l.act_rms, 0);
      EXPECT_GT(l.param_norm, 0);
    }
  }
  EXPECT_EQ(with.ParamHash(), without.ParamHash());
}

TEST(TrainerTest, MaxAttentionLogitRespectsTheSoftcap) {
  ModelConfig model = SmallModel();
  model.init_std = 1.0f;  // large logits at init
  model.attn_softcap = 2.0f;
  Trainer trainer(model, FastOptim(), 1);
  const StepTelemetry t = trainer.Step(RandomBatch(4, 16, 256, 1), 0);
  for (const LayerTelemetry& l : t.layers) EXPECT_LE(l.max_attn_logit, 2.0);
}

TEST(TrainerTest, ValidateBatchNamesTheProblem) {
  Trainer trainer(SmallModel(), FastOptim(), 1);
  Batch b = RandomBatch(2, 16, 256, 1);
  EXPECT_TRUE(trainer.ValidateBatch(b).ok());
  b.seq_len = 17;
  EXPECT_THAT(std::string(trainer.ValidateBatch(b).message()), HasSubstr("seq_len"));
  b = RandomBatch(2, 16, 256, 1);
  b.tokens.pop_back();
  EXPECT_THAT(std::string(trainer.ValidateBatch(b).message()), HasSubstr("tokens"));
}

}  // namespace
}  // namespace spikeguard::kernels
