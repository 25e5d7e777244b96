// step_message.h
// -----------------------------------------------------------------------------
// The daemon's adapter from a telemetry message to what the detectors read:
// any message with StepReport's scalar, per-layer and per-domain fields (StepReport, the
// daemon's merged StepRecord) becomes a StepSample. A template, so the live
// detector library needs no proto headers or proto target; trace files
// (eval/trace_io.h) use the same conversion.
//
//   detect::StepSample s = detect::FromStepMessage(record);
#pragma once

#include <cstdint>

#include "daemon/detect/step_sample.h"

namespace spikeguard::detect {

// From any message with StepReport's scalar and per-layer fields
// (StepReport, the daemon's merged StepRecord).
template <typename StepMessage>
StepSample FromStepMessage(const StepMessage& r) {
  StepSample s;
  s.step = r.step();
  s.loss = r.loss();
  s.grad_norm = r.grad_norm();
  s.lse_mean = r.lse_mean();
  s.lse_max = r.lse_max();
  s.clipped = r.clipped();
  s.nonfinite = r.nonfinite_count();
  for (const auto& l : r.layers()) {
    if (l.layer() >= (1u << 16)) continue;  // not a layer index a model has
    if (l.layer() >= s.layers.size()) s.layers.resize(l.layer() + 1);
    LayerSample& x = s.layers[l.layer()];
    x.max_attn_logit = l.max_attn_logit();
    x.grad_norm = l.grad_norm();
    x.update_ratio = l.update_ratio();
    x.act_rms = l.act_rms();
    x.param_norm = l.param_norm();
  }
  s.domains.reserve(static_cast<size_t>(r.domain_losses_size()));
  for (const auto& d : r.domain_losses()) {
    s.domains.push_back(DomainSample{d.domain(), d.loss(), d.tokens()});
  }
  return s;
}

}  // namespace spikeguard::detect
