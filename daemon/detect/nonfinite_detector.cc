#include "daemon/detect/nonfinite_detector.h"

#include <cmath>

namespace spikeguard::detect {
namespace {

bool Bad(double x) { return !std::isfinite(x); }

}  // namespace

int FirstNonFiniteLayer(const StepSample& s, std::string* layer_signal) {
  // Forward-pass values: the lowest layer is the origin.
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const LayerSample& x = s.layers[l];
    const char* what = Bad(x.max_attn_logit) ? "max_attn_logit"
                       : Bad(x.act_rms)      ? "act_rms"
                       : Bad(x.param_norm)   ? "param_norm"
                                             : nullptr;
    if (what != nullptr) {
      if (layer_signal != nullptr) *layer_signal = what;
      return static_cast<int>(l);
    }
  }
  // Gradients only: the backward pass starts at the last layer.
  for (size_t i = s.layers.size(); i-- > 0;) {
    const LayerSample& x = s.layers[i];
    const char* what = Bad(x.grad_norm) ? "grad_norm" : Bad(x.update_ratio) ? "update_ratio" : nullptr;
    if (what != nullptr) {
      if (layer_signal != nullptr) *layer_signal = what;
      return static_cast<int>(i);
    }
  }
  if (layer_signal != nullptr) layer_signal->clear();
  return -1;
}

bool IsNonFinite(const StepSample& s) {
  if (Bad(s.loss) || Bad(s.grad_norm) || s.nonfinite > 0) return true;
  std::string unused;
  return FirstNonFiniteLayer(s, &unused) >= 0;
}

void NonFiniteDetector::Reset() {
  in_episode_ = false;
  finite_run_ = 0;
}

std::optional<NonFiniteEvent> NonFiniteDetector::Observe(const StepSample& s) {
  if (!IsNonFinite(s)) {
    if (in_episode_ && ++finite_run_ >= options_.rearm_steps) in_episode_ = false;
    return std::nullopt;
  }
  finite_run_ = 0;
  if (in_episode_) return std::nullopt;
  in_episode_ = true;
  NonFiniteEvent e;
  e.step = s.step;
  e.nonfinite_count = s.nonfinite;
  if (Bad(s.loss)) {
    e.signal = "loss";
    e.value = s.loss;
  } else if (Bad(s.grad_norm)) {
    e.signal = "grad_norm";
    e.value = s.grad_norm;
  } else if (s.nonfinite > 0) {
    e.signal = "nonfinite_count";
    e.value = static_cast<double>(s.nonfinite);
  } else {
    e.signal = "layer";
  }
  e.first_layer = FirstNonFiniteLayer(s, &e.layer_signal);
  if (e.signal == "layer" && !e.layer_signal.empty()) e.value = NAN;
  return e;
}

}  // namespace spikeguard::detect
