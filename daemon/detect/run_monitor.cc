#include "daemon/detect/run_monitor.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "daemon/detect/robust_stats.h"

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
    case MonitorEvent::kBlip:
      return "blip";
    case MonitorEvent::kLevelShift:
      return "level_shift";
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
  last_incident_end_.reset();
  excursion_onset_.reset();
  excursion_last_ = 0;
  grad_corroborates_.clear();
  loss_state_ = LossState::kIdle;
  pending_peak_ = 0;
  blips_.clear();
  domains_.clear();
  domain_corroborates_.clear();
  localized_.reset();
}

size_t RunMonitor::footprint() const {
  return loss_.window_size() + grad_.window_size() + grad_corroborates_.size() + blips_.size() + divergence_.footprint() +
         precursor_.footprint() + recent_.size() + domain_corroborates_.size() + [this] {
           size_t n = 0;
           for (const DomainSeries& d : domains_) n += d.window.size();
           return n;
         }();
}

Localization RunMonitor::LocalizeNow(int64_t up_to_step) const {
  // Several events of one step (a loss and a grad-norm onset) localize the
  // same onset: the fit over every per-layer series runs once.
  if (localized_ && localized_->up_to_step == up_to_step && localized_->at_step == last_step_ &&
      localized_->warnings == recent_.size()) {
    return localized_->loc;
  }
  precursor_.HistoriesInto(&histories_);
  Localization loc = Localize(histories_, up_to_step, options_.localization);
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
  localized_ = LocalizedAt{up_to_step, last_step_, recent_.size(), loc};
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
  if (options_.localize_events) e->localization = LocalizeNow(onset - 1);
}

const char* RunMonitor::Corroboration(int64_t onset, int64_t now) const {
  if (grad_.in_event()) return "grad_norm";
  for (int64_t g : grad_corroborates_) {
    if (g >= onset - options_.corroborate_lookback && g <= now) return "grad_norm";
  }
  for (const auto& [g, name] : domain_corroborates_) {
    if (g >= onset && g <= now) return "domain_loss";
  }
  for (const PrecursorWarning& w : recent_) {
    // A warning whose growth began before the last incident ended is that
    // incident's (a blow-up's own warnings): it does not vouch for a later
    // excursion.
    if (last_incident_end_ && w.start_step <= *last_incident_end_) continue;
    if (w.step <= now && onset - w.step <= options_.precursor_horizon) return "precursor";
  }
  return nullptr;
}

bool RunMonitor::ObserveDomains(const StepSample& s, std::string* domain) {
  const RunMonitor::Options& o = options_;
  if (!(o.domain_z > 0) || s.domains.empty()) return false;
  // Robust z of each reported domain against its own window (before this
  // step's value enters it); NaN while a domain warms up.
  // (index into domains_, index into s.domains, z)
  struct Seen {
    size_t series;
    size_t sample;
    double z;
  };
  std::vector<Seen> seen;
  seen.reserve(s.domains.size());
  for (size_t k = 0; k < s.domains.size(); ++k) {
    const DomainSample& d = s.domains[k];
    if (!std::isfinite(d.loss)) continue;
    auto it = std::find_if(domains_.begin(), domains_.end(),
                           [&](const DomainSeries& x) { return x.name == d.domain; });
    if (it == domains_.end()) {
      if (domains_.size() >= static_cast<size_t>(std::max(0, o.max_domains))) continue;
      domains_.push_back(DomainSeries{d.domain, {}, 0});
      it = domains_.end() - 1;
    }
    double z = NAN;
    if (it->window.size() >= static_cast<size_t>(std::max(2, o.domain_min_samples))) {
      const RobustStats rs = ComputeRobustStats(it->window.begin(), it->window.end(), &scratch_);
      const double sigma = std::max(rs.sigma, 1e-12 * std::max(1.0, std::abs(rs.median)));
      z = (d.loss - rs.median) / sigma;
      // Under the relative floor a domain is not an outlier, however flat its window.
      if (d.loss - rs.median < std::abs(rs.median) * o.domain_relative_floor) z = std::min(z, o.domain_calm_z);
    }
    seen.push_back(Seen{static_cast<size_t>(it - domains_.begin()), k, z});
  }
  // Concentrated: one domain far out, every other warm domain calm.
  bool concentrated = false;
  int warm = 0, far = 0, loud = 0;
  size_t top = 0;
  for (const Seen& x : seen) {
    if (std::isnan(x.z)) continue;
    ++warm;
    if (x.z >= o.domain_z) {
      ++far;
      top = x.series;
    }
    if (x.z > o.domain_calm_z) ++loud;
  }
  if (warm >= 2 && far == 1 && loud == 1) {
    concentrated = true;
    *domain = domains_[top].name;
  }
  // The windows: outliers stay out, unless they stay (a new level).
  const size_t cap = static_cast<size_t>(std::max(2, o.domain_window));
  for (const Seen& x : seen) {
    DomainSeries& series = domains_[x.series];
    if (!std::isnan(x.z) && x.z >= o.domain_z) {
      if (++series.outlier_run <= static_cast<int>(cap / 4)) continue;
      series.window.clear();
    }
    series.outlier_run = 0;
    series.window.push_back(s.domains[x.sample].loss);
    while (series.window.size() > cap) series.window.pop_front();
  }
  return concentrated;
}

void RunMonitor::ObserveLoss(const StepSample& s, std::vector<MonitorEvent>* out) {
  const SpikeDetector::Options& lo = options_.loss;
  const std::optional<SpikeEvent> se = loss_.Observe(s.step, s.loss);
  auto emit = [&](MonitorEvent::Kind kind, const SpikeEvent& ev) {
    MonitorEvent e;
    e.kind = kind;
    e.signal = "loss";
    e.step = s.step;
    e.onset_step = ev.onset_step;
    e.peak_step = ev.peak_step;
    e.end_step = ev.end_step;
    e.value = ev.peak_value;
    e.baseline = ev.baseline;
    e.score = ev.onset_z;
    if (kind == MonitorEvent::kSpikeOnset) Enrich(&e, ev.onset_step);
    out->push_back(std::move(e));
  };
  auto mark = [&](const char* why) {
    MonitorEvent& e = out->back();
    e.corroborated_by = why;
    if (std::string_view(why) == "domain_loss") {
      for (const auto& [g, name] : domain_corroborates_) {
        if (g >= e.onset_step && g <= s.step) {
          e.domain = name;
          break;
        }
      }
    }
  };
  if (se && se->state == SpikeEvent::kOnset) {
    const char* why = lo.blip_steps <= 0 ? nullptr : Corroboration(se->onset_step, s.step);
    if (lo.blip_steps <= 0 || why) {
      loss_state_ = LossState::kOpened;
      emit(MonitorEvent::kSpikeOnset, *se);
      if (why) mark(why);
    } else {
      loss_state_ = LossState::kPending;
      pending_ = *se;
      pending_peak_ = se->peak_value;
      pending_full_ = 1;
    }
    return;
  }
  if (loss_state_ == LossState::kOpened) {
    if (se) {
      emit(se->state == SpikeEvent::kRecovered ? MonitorEvent::kSpikeRecovered
                                               : MonitorEvent::kSpikeDiverged,
           *se);
      loss_state_ = LossState::kIdle;
      last_incident_end_ = s.step;
    }
    return;
  }
  if (loss_state_ != LossState::kPending) return;
  if (se) {
    loss_state_ = LossState::kIdle;
    if (se->state == SpikeEvent::kDiverged) {
      // Moved to a new level and stayed, with nothing corroborating it.
      emit(MonitorEvent::kLevelShift, *se);
      return;
    }
    if (pending_full_ > std::max(1, lo.blip_steps)) {
      // Over the full threshold for longer than a blip, then back down: a
      // spike with a shape (a rise and a decay), too small to open at once;
      // it opens now, dated at its onset. (Two heavy-tailed draws in a row,
      // the second only over the hold level, stay a blip.)
      last_incident_end_ = s.step;
      emit(MonitorEvent::kSpikeOnset, *se);
      return;
    }
    emit(MonitorEvent::kBlip, *se);
    blips_.push_back(Blip{se->onset_step, se->peak_value, se->baseline, se->onset_z});
    while (!blips_.empty() && blips_.front().step < s.step - lo.blip_window) blips_.pop_front();
    if (lo.blip_escalate_count > 0 &&
        blips_.size() >= static_cast<size_t>(lo.blip_escalate_count)) {
      SpikeEvent esc;
      esc.state = SpikeEvent::kOnset;
      esc.onset_step = blips_.front().step;
      esc.baseline = blips_.front().baseline;
      esc.end_step = se->end_step;
      for (const Blip& b : blips_) {
        if (b.peak >= esc.peak_value) {
          esc.peak_value = b.peak;
          esc.peak_step = b.step;
          esc.onset_z = b.z;
        }
      }
      blips_.clear();
      emit(MonitorEvent::kSpikeOnset, esc);
      out->back().escalated = true;
    }
    return;
  }
  // Still over the hold level.
  if (std::isfinite(s.loss)) pending_peak_ = std::max(pending_peak_, s.loss);
  if (loss_.last_z() >= loss_.threshold()) ++pending_full_;
  if (const char* why = Corroboration(pending_.onset_step, s.step)) {
    loss_state_ = LossState::kOpened;
    pending_.peak_value = pending_peak_;
    emit(MonitorEvent::kSpikeOnset, pending_);
    mark(why);
    return;
  }
  if (s.step - pending_.onset_step < lo.blip_steps) return;
  const double base = std::abs(pending_.baseline);
  // Noise scales in the run's own tail units: heavy tails widen them as
  // they raise the threshold.
  const double tail = lo.z_threshold > 0 ? std::max(1.0, loss_.threshold() / lo.z_threshold) : 1.0;
  const bool big =
      !(lo.shift_tolerance > 0) ||
      pending_peak_ - pending_.baseline >=
          base * lo.shift_tolerance + options_.shift_noise_scales * tail * loss_.noise_scale();
  if (big) {
    loss_state_ = LossState::kOpened;
    pending_.peak_value = pending_peak_;
    emit(MonitorEvent::kSpikeOnset, pending_);
  }
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
    last_incident_end_ = s.step;
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
  {
    // Does this step's grad norm corroborate a loss excursion?
    const double gmed = grad_.window_size() > 0 && grad_.last_z() >= grad_.threshold()
                            ? grad_.baseline()
                            : 0;
    if (grad_.in_event() ||
        (gmed > 0 && std::isfinite(s.grad_norm) &&
         s.grad_norm >= options_.corroborate_grad_ratio * gmed)) {
      grad_corroborates_.push_back(s.step);
    }
    while (!grad_corroborates_.empty() &&
           grad_corroborates_.front() <
               s.step - options_.corroborate_lookback - std::max(0, options_.loss.blip_steps) - 1) {
      grad_corroborates_.pop_front();
    }
  }
  {
    std::string domain;
    if (ObserveDomains(s, &domain)) domain_corroborates_.emplace_back(s.step, std::move(domain));
    while (!domain_corroborates_.empty() &&
           domain_corroborates_.front().first <
               s.step - options_.corroborate_lookback - std::max(0, options_.loss.blip_steps) - 1) {
      domain_corroborates_.pop_front();
    }
  }
  ObserveLoss(s, &out);
  if (loss_state_ != LossState::kIdle || loss_.in_event()) {
    if (!excursion_onset_ || excursion_last_ < s.step - 1) {  // a new excursion
      excursion_onset_ = loss_state_ == LossState::kPending ? pending_.onset_step : s.step;
      for (const MonitorEvent& e : out) {
        if (e.signal == "loss" && e.kind == MonitorEvent::kSpikeOnset) {
          excursion_onset_ = e.onset_step;
        }
      }
    }
    excursion_last_ = s.step;
  }
  std::optional<DivergenceEvent> d = divergence_.Observe(s.step, s.loss);
  if (d && excursion_onset_) {
    const int64_t window = std::max(1, options_.divergence.median_window);
    const bool window_holds_it = s.step - excursion_last_ < window;
    const bool dated_inside =
        d->onset_step >= *excursion_onset_ - window && d->onset_step <= excursion_last_;
    if (window_holds_it || dated_inside) d.reset();  // the excursion itself
  }
  if (d) {
    MonitorEvent e;
    e.kind = MonitorEvent::kDivergence;
    e.signal = "loss";
    e.step = e.end_step = s.step;
    e.onset_step = e.peak_step = d->onset_step;
    e.value = d->median;
    e.baseline = d->reference;
    e.score = d->rise;
    Enrich(&e, d->onset_step);
    last_incident_end_ = s.step;
    out.push_back(e);
  }
  return out;
}

}  // namespace spikeguard::detect
