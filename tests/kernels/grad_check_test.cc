// Analytic gradients against central finite differences, per parameter
// tensor, along a random ±1 direction (the model runs in float32, so a single
// element's difference quotient would be mostly rounding noise).
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/trainer.h"
#include "test_util.h"

namespace spikeguard::kernels {
namespace {

struct Variant {
  std::string name;
  ModelConfig model;
};

ModelConfig Tiny() {
  ModelConfig m;
  m.vocab = 64;
  m.layers = 2;
  m.heads = 2;
  m.width = 16;
  m.context = 8;
  m.init_std = 0.4f;  // large enough that soft-caps and GELU are nonlinear
  m.seed = 7;
  return m;
}

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  v.push_back({"Plain", Tiny()});
  ModelConfig m = Tiny();
  m.qk_norm = true;
  v.push_back({"QkNorm", m});
  m = Tiny();
  m.bias = false;
  v.push_back({"NoBias", m});
  m = Tiny();
  m.attn_softcap = 1.0f;
  v.push_back({"AttnSoftcap", m});
  m = Tiny();
  m.logit_softcap = 2.0f;
  v.push_back({"LogitSoftcap", m});
  m = Tiny();
  m.z_loss = 0.05f;
  v.push_back({"ZLoss", m});
  m = Tiny();
  m.tie_embeddings = true;
  v.push_back({"Tied", m});
  m = Tiny();
  m.qk_norm = true;
  m.bias = false;
  m.attn_softcap = 1.5f;
  m.logit_softcap = 3.0f;
  m.z_loss = 0.01f;
  m.tie_embeddings = true;
  v.push_back({"Everything", m});
  return v;
}

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class GradCheckTest : public ::testing::TestWithParam<Variant> {};

TEST_P(GradCheckTest, MatchesFiniteDifferences) {
  const ModelConfig model = GetParam().model;
  Trainer trainer(model, OptimConfig{}, /*threads=*/1);
  const Batch batch = testing::RandomBatch(3, 8, model.vocab, /*seed=*/11);
  // Train a little first so the parameters are not at their symmetric init.
  (void)trainer.ComputeGradients(batch);
  const std::vector<float> grads(trainer.gradients().begin(), trainer.gradients().end());
  std::span<float> params = trainer.parameters();
  // The step has norm eps along a unit direction, so the difference quotient
  // stays in the linear regime however large the tensor.
  const double eps = 1e-2;
  int checked = 0;
  for (const Trainer::TensorInfo& t : trainer.tensors()) {
    std::vector<float> dir(t.size);
    const float unit = static_cast<float>(1.0 / std::sqrt(static_cast<double>(t.size)));
    double analytic = 0;
    for (size_t i = 0; i < t.size; ++i) {
      dir[i] = (testing::Mix(i * 31 + t.offset) & 1) ? unit : -unit;
      analytic += static_cast<double>(grads[t.offset + i]) * dir[i];
    }
    const std::vector<float> saved(params.begin() + t.offset, params.begin() + t.offset + t.size);
    for (size_t i = 0; i < t.size; ++i) params[t.offset + i] = saved[i] + static_cast<float>(eps) * dir[i];
    const double plus = trainer.ComputeLoss(batch).objective;
    for (size_t i = 0; i < t.size; ++i) params[t.offset + i] = saved[i] - static_cast<float>(eps) * dir[i];
    const double minus = trainer.ComputeLoss(batch).objective;
    for (size_t i = 0; i < t.size; ++i) params[t.offset + i] = saved[i];
    const double numeric = (plus - minus) / (2.0 * eps);
    EXPECT_NEAR(analytic, numeric, 2e-5 + 1e-2 * std::fabs(numeric))
        << t.name << ": analytic " << analytic << " numeric " << numeric;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

INSTANTIATE_TEST_SUITE_P(Options, GradCheckTest, ::testing::ValuesIn(Variants()),
                         [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

// A tensor the loss does not depend on would pass any directional check with
// 0 = 0; make sure the check above is not vacuous.
TEST(GradCheckSanityTest, EveryTensorHasAGradient) {
  ModelConfig model = Tiny();
  model.qk_norm = true;
  Trainer trainer(model, OptimConfig{}, 1);
  (void)trainer.ComputeGradients(testing::RandomBatch(3, 8, model.vocab, 11));
  for (const Trainer::TensorInfo& t : trainer.tensors()) {
    double sq = 0;
    for (size_t i = 0; i < t.size; ++i)
      sq += static_cast<double>(trainer.gradients()[t.offset + i]) * trainer.gradients()[t.offset + i];
    EXPECT_GT(sq, 0) << t.name;
  }
}

}  // namespace
}  // namespace spikeguard::kernels
