#include "daemon/detect/precursor_detector.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "daemon/detect/robust_stats.h"

namespace spikeguard::detect {

const char* PrecursorKindName(PrecursorWarning::Kind kind) {
  switch (kind) {
    case PrecursorWarning::kTrend:
      return "trend";
    case PrecursorWarning::kLevelWarn:
      return "level_warn";
    case PrecursorWarning::kLevelCritical:
      return "level_critical";
  }
  return "?";
}

class PrecursorDetector::Series {
 public:
  Series(std::string signal, int layer, bool log_scale, bool level_alarm, const Options* o)
      : signal_(std::move(signal)),
        layer_(layer),
        log_scale_(log_scale),
        level_alarm_(level_alarm),
        o_(o) {}

  const std::string& signal() const { return signal_; }
  int layer() const { return layer_; }

  void Observe(int64_t step, double raw, std::vector<PrecursorWarning>* out) {
    if (!std::isfinite(raw) || (log_scale_ && raw <= 0)) return;
    if (!any_) {
      any_ = true;
      first_step_ = step;
    }
    if (level_alarm_) Level(step, raw, out);
    recent_.push_back(log_scale_ ? std::log(raw) : raw);
    const size_t smooth = static_cast<size_t>(std::max(1, o_->smooth));
    while (recent_.size() > smooth) recent_.pop_front();
    // The trend starts once the smoothing window is full, so the smoothed
    // series has a constant lag of (smooth − 1) / 2 steps, taken off here.
    if (recent_.size() < smooth) return;
    const double y = SmoothedMedian();
    const int64_t ystep = step - static_cast<int64_t>((smooth - 1) / 2);
    hsteps_.push_back(ystep);
    hvals_.push_back(y);
    const size_t lookback = static_cast<size_t>(std::max(o_->lookback, o_->trend_window + 1));
    while (hvals_.size() > lookback) {
      hvals_.pop_front();
      hsteps_.pop_front();
    }
    const size_t w = static_cast<size_t>(std::max(1, o_->trend_window));
    if (hvals_.size() <= w) return;
    const double d = hvals_.back() - hvals_[hvals_.size() - 1 - w];
    const double min_change = log_scale_ ? o_->min_log_change : o_->min_clip_rate_change;
    if (!settled_) {
      // Warm-up: the series moves from its initial value; none of it is a
      // baseline (see Options::onset_warmup_steps).
      const int64_t min_warmup = o_->onset_warmup_steps > 0
                                     ? o_->onset_warmup_steps
                                     : 4 * static_cast<int64_t>(w);
      const int64_t age = step - first_step_;
      if (age < min_warmup) return;
      if (std::abs(d) >= min_change && age < std::max(min_warmup, o_->trend_warmup_steps)) return;
      settled_ = true;
      settled_step_ = ystep;
      level_ = y;
      noise_ = 0;
    }
    bool elevated = false;
    if (dbase_.size() >= static_cast<size_t>(std::max(2, o_->min_baseline))) {
      // Refreshed every 8 steps as before (decisions are unchanged); the
      // sorted window makes each refresh a walk from the median instead of
      // a copy and two selections over the baseline window.
      if (++since_refresh_ >= 8) {
        stats_ = dbase_sorted_.Stats();
        since_refresh_ = 0;
      }
      const double floor = log_scale_ ? 1e-3 : 0.02;
      const double z = (d - stats_.median) / std::max(stats_.sigma, floor);
      const bool over = z >= o_->trend_z_threshold && d - stats_.median >= min_change;
      // Only a rise is elevated: a series that stops falling (a change of 0
      // against a baseline of negative changes taken while it fell) must
      // rejoin its baseline, not be kept out of it for good.
      elevated = z >= 0.5 * o_->trend_z_threshold && d > 0;
      over_run_ = over ? over_run_ + 1 : 0;
      calm_run_ = elevated ? 0 : calm_run_ + 1;
      if (alarmed_ && calm_run_ >= static_cast<int>(w)) alarmed_ = false;
      if (!alarmed_ && over_run_ >= std::max(1, o_->persistence_steps) &&
          step >= o_->trend_warmup_steps) {
        alarmed_ = true;
        PrecursorWarning pw;
        pw.kind = PrecursorWarning::kTrend;
        pw.step = step;
        pw.value = raw;
        pw.score = z;
        DateStart(step - static_cast<int64_t>(w) - o_->persistence_steps, &pw);
        out->push_back(pw);
      }
    }
    if (log_scale_ && o_->slow_window > 0) Slow(step, raw, out);
    if (!elevated) {
      dbase_.push_back(d);
      dbase_sorted_.Insert(d);
      while (dbase_.size() > static_cast<size_t>(std::max(2, o_->baseline_window))) {
        dbase_sorted_.Erase(dbase_.front());
        dbase_.pop_front();
      }
      // The baseline level follows the calm series with a time constant of
      // one trend window; its noise is the mean absolute step-to-step change
      // of the smoothed values (a deviation from the lagging level would
      // count a healthy drift as noise).
      const double alpha = 1.0 / static_cast<double>(w);
      noise_ += alpha * (std::abs(y - hvals_[hvals_.size() - 2]) - noise_);
      level_ += alpha * (y - level_);
    }
  }

  void HistoryInto(SeriesHistory* h) const {
    h->signal = signal_;
    h->layer = layer_;
    const size_t from = FirstSettled();
    h->steps.assign(hsteps_.begin() + from, hsteps_.end());
    h->values.assign(hvals_.begin() + from, hvals_.end());
  }

  size_t footprint() const {
    return recent_.size() + hvals_.size() + hsteps_.size() + dbase_.size() + dbase_sorted_.size() +
           scratch_.capacity();
  }

 private:
  void Level(int64_t step, double raw, std::vector<PrecursorWarning>* out) {
    warn_run_ = raw >= o_->attn_logit_warn ? warn_run_ + 1 : 0;
    crit_run_ = raw >= o_->attn_logit_critical ? crit_run_ + 1 : 0;
    below_run_ = raw < o_->attn_logit_warn ? below_run_ + 1 : 0;
    if (below_run_ >= std::max(1, o_->trend_window)) level_raised_ = 0;
    const int persist = std::max(1, o_->persistence_steps);
    auto raise = [&](PrecursorWarning::Kind kind, double threshold, int run) {
      PrecursorWarning pw;
      pw.kind = kind;
      pw.step = step;
      pw.value = raw;
      pw.score = raw / threshold;
      // Without a baseline to search back to, the first step over the
      // threshold is all that is known.
      DateStart(step - run + 1, &pw);
      out->push_back(pw);
    };
    if (warn_run_ >= persist && level_raised_ < 1) {
      level_raised_ = 1;
      raise(PrecursorWarning::kLevelWarn, o_->attn_logit_warn, warn_run_);
    }
    if (crit_run_ >= persist && level_raised_ < 2) {
      level_raised_ = 2;
      raise(PrecursorWarning::kLevelCritical, o_->attn_logit_critical, crit_run_);
    }
  }

  // Index into hsteps_/hvals_ of the first point after the warm-up
  // (hvals_.size() while the series is still warming up).
  size_t FirstSettled() const {
    if (!settled_) return hvals_.size();
    return static_cast<size_t>(std::lower_bound(hsteps_.begin(), hsteps_.end(), settled_step_) -
                               hsteps_.begin());
  }

  // Fills signal, layer, start_step and baseline. The start is where the
  // current growth above the series' own baseline began, looking only at
  // points after the warm-up:
  //   1. walking back from the alarm, the last point that sat at the
  //      baseline level (within max(start_noise_factor × noise, ¼ of the
  //      minimum change)); the start is the point after it, or the first
  //      point after the warm-up when the whole window is above it;
  //   2. the change point of a broken-line fit (FindDeparture) over the same
  //      points dates the start more precisely, and replaces (1) unless it
  //      lies more than a trend window before it (then it belongs to an
  //      earlier excursion the series came back from).
  // `fallback` (≤ the alarm step) is used while the series is still warming
  // up.
  void DateStart(int64_t fallback, PrecursorWarning* pw) const {
    pw->signal = signal_;
    pw->layer = layer_;
    pw->start_step = std::min(fallback, pw->step);
    pw->baseline = settled_ ? Raw(level_) : pw->value;
    const size_t from = FirstSettled();
    size_t end = from;  // one past the last point at or before the alarm
    while (end < hvals_.size() && hsteps_[end] <= pw->step) ++end;
    if (end - from < 2) return;
    const double min_change = log_scale_ ? o_->min_log_change : o_->min_clip_rate_change;
    const double tol = std::max(o_->start_noise_factor * noise_, 0.25 * min_change);
    size_t i = end;
    while (i > from && hvals_[i - 1] > level_ + tol) --i;
    // hvals_[i - 1] (if i > from) is the last point at the baseline.
    int64_t start = i == end ? pw->step : hsteps_[i];
    DepartureOptions d;
    d.min_rise = min_change;
    d.noise_factor = o_->start_noise_factor;
    std::vector<int64_t> steps(hsteps_.begin() + from, hsteps_.begin() + end);
    std::vector<double> values(hvals_.begin() + from, hvals_.begin() + end);
    if (auto dep = FindDeparture(steps, values, d);
        dep && dep->step <= pw->step && dep->step + std::max(1, o_->trend_window) >= start) {
      start = dep->step;
      pw->baseline = Raw(dep->baseline);
    }
    pw->start_step = start;
  }

  double Raw(double y) const { return log_scale_ ? std::exp(y) : y; }

  // The slow-build rule: growth too slow for the trend window —
  // a grad norm ×20 over 600 steps changes by ~0.16 per 32 steps, under the
  // trend rule's minimum — measured as the rise of the block mean (a trend
  // window of smoothed values) across `slow_window` steps, all after the
  // warm-up. It warns when that rise reaches `slow_min_log_change` and is
  // not slowing down (the second half rose at least 0.9× the first: an lr
  // warm-up's ratio growth decelerates, an instability does not), for
  // `persistence_steps` steps. It re-arms when the rise falls under half.
  void Slow(int64_t step, double raw, std::vector<PrecursorWarning>* out) {
    const size_t n = hvals_.size();
    const size_t span = static_cast<size_t>(o_->slow_window);
    const size_t block = static_cast<size_t>(std::max(1, o_->trend_window));
    if (n < span + block || span < 4 * block) return;
    const size_t first_i = n - span - block;
    if (hsteps_[first_i] < settled_step_) return;
    auto mean = [&](size_t from) {
      double sum = 0;
      for (size_t i = from; i < from + block; ++i) sum += hvals_[i];
      return sum / static_cast<double>(block);
    };
    const double first = mean(first_i);
    const double mid = mean(n - span / 2 - block);
    const double last = mean(n - block);
    const double rise = last - first;
    const bool over = rise >= o_->slow_min_log_change && mid - first > 0 &&
                      last - mid >= 0.9 * (mid - first);
    slow_run_ = over ? slow_run_ + 1 : 0;
    if (slow_alarmed_ && rise < 0.5 * o_->slow_min_log_change) slow_alarmed_ = false;
    if (slow_alarmed_ || alarmed_ || slow_run_ < std::max(1, o_->persistence_steps) ||
        step < o_->trend_warmup_steps) {
      return;
    }
    slow_alarmed_ = true;
    PrecursorWarning pw;
    pw.kind = PrecursorWarning::kTrend;
    pw.signal = signal_;
    pw.layer = layer_;
    pw.step = step;
    pw.value = raw;
    pw.score = rise / o_->slow_min_log_change;
    pw.baseline = Raw(first);
    pw.start_step = hsteps_[first_i];
    // The start: where the broken line over the window leaves its level.
    DepartureOptions d;
    d.min_rise = 0.5 * o_->slow_min_log_change;
    d.noise_factor = o_->start_noise_factor;
    const size_t lb = static_cast<size_t>(std::max(1, o_->lookback));
    const size_t from = std::max(FirstSettled(), n > lb ? n - lb : size_t{0});
    std::vector<int64_t> steps(hsteps_.begin() + from, hsteps_.end());
    std::vector<double> values(hvals_.begin() + from, hvals_.end());
    if (auto dep = FindDeparture(steps, values, d); dep && dep->step <= step) {
      pw.start_step = dep->step;
      pw.baseline = Raw(dep->baseline);
    }
    out->push_back(pw);
  }

  // Median of the smoothing window (a handful of values): a copy on the
  // stack and a selection, no allocation.
  double SmoothedMedian() {
    constexpr size_t kStack = 32;
    if (recent_.size() <= kStack) {
      double buf[kStack];
      std::copy(recent_.begin(), recent_.end(), buf);
      return MedianInPlace(buf, buf + recent_.size());
    }
    scratch_.assign(recent_.begin(), recent_.end());
    return MedianInPlace(scratch_);
  }

  std::string signal_;
  int layer_;
  // Warm-up and baseline level (see DateStart).
  bool any_ = false;
  int64_t first_step_ = 0;
  bool settled_ = false;
  int64_t settled_step_ = 0;
  double level_ = 0;
  double noise_ = 0;
  bool log_scale_;
  bool level_alarm_;
  const Options* o_;
  std::deque<double> recent_;
  std::deque<int64_t> hsteps_;
  std::deque<double> hvals_;
  std::deque<double> dbase_;
  // dbase_ in sorted order, for its median and MAD.
  SortedWindow dbase_sorted_;
  // For a smoothing window too large for the stack buffer only.
  std::vector<double> scratch_;
  RobustStats stats_;
  int slow_run_ = 0;
  bool slow_alarmed_ = false;
  int since_refresh_ = 1 << 20;
  int over_run_ = 0;
  int calm_run_ = 0;
  bool alarmed_ = false;
  int warn_run_ = 0;
  int crit_run_ = 0;
  int below_run_ = 0;
  int level_raised_ = 0;
};

PrecursorDetector::PrecursorDetector(Options options) : options_(options) {}
PrecursorDetector::~PrecursorDetector() = default;
PrecursorDetector::PrecursorDetector(PrecursorDetector&&) noexcept = default;
PrecursorDetector& PrecursorDetector::operator=(PrecursorDetector&&) noexcept = default;

PrecursorDetector::Series* PrecursorDetector::SeriesFor(const std::string& signal, int layer,
                                                        bool log_scale, bool level_alarm) {
  for (auto& s : series_) {
    if (s->layer() == layer && s->signal() == signal) return s.get();
  }
  series_.push_back(std::make_unique<Series>(signal, layer, log_scale, level_alarm, &options_));
  return series_.back().get();
}

std::vector<PrecursorWarning> PrecursorDetector::Observe(const StepSample& s) {
  std::vector<PrecursorWarning> out;
  if (any_step_ && s.step <= last_step_) return out;
  any_step_ = true;
  last_step_ = s.step;
  // Series are created in a fixed order on first use (run level, then layer
  // by layer), so index arithmetic finds them without a lookup.
  const size_t kRun = 4, kPerLayer = 4;
  if (series_.empty()) {
    SeriesFor("lse_mean", -1, true, false);
    SeriesFor("lse_max", -1, true, false);
    SeriesFor("grad_norm", -1, true, false);
    SeriesFor("clip_rate", -1, false, false);
  }
  while (series_.size() < kRun + kPerLayer * s.layers.size()) {
    const int l = static_cast<int>((series_.size() - kRun) / kPerLayer);
    SeriesFor("max_attn_logit", l, true, true);
    SeriesFor("grad_norm", l, true, false);
    SeriesFor("update_ratio", l, true, false);
    SeriesFor("act_rms", l, true, false);
  }
  series_[0]->Observe(s.step, s.lse_mean, &out);
  series_[1]->Observe(s.step, s.lse_max, &out);
  series_[2]->Observe(s.step, s.grad_norm, &out);
  clipped_.push_back(s.clipped);
  const size_t cw = static_cast<size_t>(std::max(1, options_.clip_window));
  while (clipped_.size() > cw) clipped_.pop_front();
  if (clipped_.size() == cw) {
    const double rate =
        static_cast<double>(std::count(clipped_.begin(), clipped_.end(), true)) / cw;
    series_[3]->Observe(s.step, rate, &out);
  }
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const LayerSample& x = s.layers[l];
    const size_t base = kRun + kPerLayer * l;
    series_[base + 0]->Observe(s.step, x.max_attn_logit, &out);
    series_[base + 1]->Observe(s.step, x.grad_norm, &out);
    series_[base + 2]->Observe(s.step, x.update_ratio, &out);
    series_[base + 3]->Observe(s.step, x.act_rms, &out);
  }
  return out;
}

std::vector<SeriesHistory> PrecursorDetector::Histories() const {
  std::vector<SeriesHistory> out;
  HistoriesInto(&out);
  return out;
}

void PrecursorDetector::HistoriesInto(std::vector<SeriesHistory>* out) const {
  out->resize(series_.size());
  for (size_t i = 0; i < series_.size(); ++i) series_[i]->HistoryInto(&(*out)[i]);
}

size_t PrecursorDetector::footprint() const {
  size_t n = clipped_.size();
  for (const auto& s : series_) n += s->footprint();
  return n;
}

size_t PrecursorDetector::series_count() const { return series_.size(); }

void PrecursorDetector::Reset() {
  series_.clear();
  clipped_.clear();
  any_step_ = false;
  last_step_ = -1;
}

}  // namespace spikeguard::detect
