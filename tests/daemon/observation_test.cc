// What the incident engine reads of a merged step record (ToObservation)
// names the same first non-finite layer as the detectors do, so one incident
// never names two layers.
#include <cmath>
#include <limits>

#include "daemon/control/catalog_adapters.h"
#include "daemon/detect/nonfinite_detector.h"
#include "daemon/detect/step_message.h"
#include "gtest/gtest.h"

namespace spikeguard::daemon {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

v1::StepRecord Record(int layers) {
  v1::StepRecord r;
  r.set_step(40);
  r.set_loss(3.0);
  r.set_grad_norm(1.0);
  for (int i = 0; i < layers; ++i) {
    v1::LayerStats* l = r.add_layers();
    l->set_layer(i);
    l->set_max_attn_logit(10);
    l->set_act_rms(1);
    l->set_grad_norm(0.5);
    l->set_update_ratio(1e-3);
    l->set_param_norm(20);
  }
  return r;
}

int DetectorsLayer(const v1::StepRecord& r) {
  return detect::FirstNonFiniteLayer(detect::FromStepMessage(r), nullptr);
}

TEST(ObservationTest, AFiniteRecordNamesNoLayer) {
  v1::StepRecord r = Record(4);
  EXPECT_EQ(ToObservation(r).first_nonfinite_layer, -1);
}

TEST(ObservationTest, GradientsOnlyNameTheLastBadLayerAsTheDetectorsDo) {
  // The backward pass starts at the last layer: of layers 1 and 3, 3 went first.
  v1::StepRecord r = Record(4);
  r.mutable_layers(1)->set_grad_norm(kNaN);
  r.mutable_layers(3)->set_grad_norm(kInf);
  EXPECT_EQ(ToObservation(r).first_nonfinite_layer, 3);
  EXPECT_EQ(ToObservation(r).first_nonfinite_layer, DetectorsLayer(r));
}

TEST(ObservationTest, ForwardValuesNameTheLowestBadLayerBeforeAnyGradient) {
  v1::StepRecord r = Record(4);
  r.mutable_layers(0)->set_grad_norm(kNaN);
  r.mutable_layers(2)->set_act_rms(kInf);
  EXPECT_EQ(ToObservation(r).first_nonfinite_layer, 2);
  EXPECT_EQ(ToObservation(r).first_nonfinite_layer, DetectorsLayer(r));
}

TEST(ObservationTest, AParameterNormOrUpdateRatioAloneNamesItsLayer) {
  v1::StepRecord r = Record(4);
  r.mutable_layers(2)->set_param_norm(kInf);
  EXPECT_EQ(ToObservation(r).first_nonfinite_layer, 2);
  v1::StepRecord u = Record(4);
  u.mutable_layers(1)->set_update_ratio(kNaN);
  EXPECT_EQ(ToObservation(u).first_nonfinite_layer, 1);
}

TEST(ObservationTest, TheLayerIsTheReportedIndexNotThePosition) {
  // A pipeline stage reports layers 8..11 only.
  v1::StepRecord r = Record(4);
  for (int i = 0; i < 4; ++i) r.mutable_layers(i)->set_layer(8 + i);
  r.mutable_layers(1)->set_max_attn_logit(kNaN);
  EXPECT_EQ(ToObservation(r).first_nonfinite_layer, 9);
}

}  // namespace
}  // namespace spikeguard::daemon
