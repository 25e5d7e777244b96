#include "daemon/detect/run_monitor.h"

#include <algorithm>

namespace spikeguard::detect {

const char* MonitorEventKindName(MonitorEvent::Kind kind) {
  switch (kind) {
    case MonitorEvent::kSpikeOnset:
      return "spike_onset";
    case MonitorEvent::kSpikeRecovered:
      return "spike_recovered";
    case MonitorEvent::kSpikeDiverged:
      return "spike_diverged";
    case MonitorEvent::kDivergence:
      return "divergence";
    case MonitorEvent::kNonFinite:
      return "nonfinite";
    case MonitorEvent::kPrecursor:
      return "precursor";
  }
  return "?";
}

RunMonitor::RunMonitor(Options options)
    : options_(options),
      loss_(options.loss),
      grad_(options.grad_norm),
      divergence_(options.divergence),
      nonfinite_(options.nonfinite),
      precursor_(options.precursor) {}

void RunMonitor::Reset() {
  loss_.Reset();
  grad_.Reset();
  divergence_.Reset();
  nonfinite_.Reset();
  precursor_.Reset();
  recent_.clear();
  last_step_.reset();
}

size_t RunMonitor::footprint() const {
  return loss_.window_size() + grad_.window_size() + divergence_.footprint() +
         precursor_.footprint() + recent_.size();
}

Localization RunMonitor::LocalizeNow(int64_t up_to_step) const {
  Localization loc = Localize(precursor_.Histories(), up_to_step, options_.localization);
  // Per-layer warnings in the horizon replace their series' lookback dating.
  for (const PrecursorWarning& w : recent_) {
    if (w.layer < 0 || w.step > up_to_step ||
        up_to_step - w.start_step > options_.precursor_horizon) {
      continue;
    }
    auto it = std::find_if(loc.order.begin(), loc.order.end(), [&](const LocalizedSeries& o) {
      return o.layer == w.layer && o.signal == w.signal;
    });
    if (it != loc.order.end() && it->departure.step <= w.start_step) continue;
    LocalizedSeries ls{w.signal, w.layer, Departure{}};
    ls.departure.step = w.start_step;
    ls.departure.baseline = w.baseline;
    ls.departure.significance = w.score;
    if (it != loc.order.end()) {
      *it = ls;
    } else {
      loc.order.push_back(ls);
    }
  }
  std::stable_sort(loc.order.begin(), loc.order.end(),
                   [](const LocalizedSeries& a, const LocalizedSeries& b) {
                     if (a.departure.step != b.departure.step) {
                       return a.departure.step < b.departure.step;
                     }
                     return a.departure.significance > b.departure.significance;
                   });
  return loc;
}

void RunMonitor::Enrich(MonitorEvent* e, int64_t onset) const {
  for (const PrecursorWarning& w : recent_) {
    if (w.step > onset || onset - w.start_step > options_.precursor_horizon) continue;
    if (!e->precursor_start || w.start_step < *e->precursor_start) {
      e->precursor_start = w.start_step;
      e->precursor_signal = w.signal;
      e->precursor_layer = w.layer;
    }
  }
  e->localization = LocalizeNow(onset - 1);
}

std::vector<MonitorEvent> RunMonitor::Observe(const StepSample& s) {
  std::vector<MonitorEvent> out;
  if (last_step_ && s.step <= *last_step_) return out;
  last_step_ = s.step;

  for (PrecursorWarning& w : precursor_.Observe(s)) {
    MonitorEvent e;
    e.kind = MonitorEvent::kPrecursor;
    e.signal = w.signal;
    e.layer = w.layer;
    e.step = w.step;
    e.onset_step = e.peak_step = e.end_step = w.start_step;
    e.value = w.value;
    e.baseline = w.baseline;
    e.score = w.score;
    e.precursor_kind = w.kind;
    out.push_back(e);
    recent_.push_back(std::move(w));
    while (recent_.size() > static_cast<size_t>(std::max(1, options_.max_recent_precursors))) {
      recent_.pop_front();
    }
  }

  if (auto nf = nonfinite_.Observe(s)) {
    MonitorEvent e;
    e.kind = MonitorEvent::kNonFinite;
    e.signal = nf->signal;
    e.layer = nf->first_layer;
    e.step = e.onset_step = e.peak_step = e.end_step = s.step;
    e.value = nf->value;
    e.score = static_cast<double>(nf->nonfinite_count);
    Enrich(&e, s.step);
    out.push_back(e);
  }

  auto spike = [&](const std::optional<SpikeEvent>& se, const char* signal) {
    if (!se) return;
    MonitorEvent e;
    e.kind = se->state == SpikeEvent::kOnset       ? MonitorEvent::kSpikeOnset
             : se->state == SpikeEvent::kRecovered ? MonitorEvent::kSpikeRecovered
                                                   : MonitorEvent::kSpikeDiverged;
    e.signal = signal;
    e.step = s.step;
    e.onset_step = se->onset_step;
    e.peak_step = se->peak_step;
    e.end_step = se->end_step;
    e.value = se->peak_value;
    e.baseline = se->baseline;
    e.score = se->onset_z;
    if (e.kind == MonitorEvent::kSpikeOnset) Enrich(&e, se->onset_step);
    out.push_back(e);
  };
  spike(grad_.Observe(s.step, s.grad_norm), "grad_norm");
  spike(loss_.Observe(s.step, s.loss), "loss");
  if (auto d = divergence_.Observe(s.step, s.loss)) {
    MonitorEvent e;
    e.kind = MonitorEvent::kDivergence;
    e.signal = "loss";
    e.step = e.end_step = s.step;
    e.onset_step = e.peak_step = d->onset_step;
    e.value = d->median;
    e.baseline = d->reference;
    e.score = d->rise;
    Enrich(&e, d->onset_step);
    out.push_back(e);
  }
  return out;
}

}  // namespace spikeguard::detect
