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
    if (level_alarm_) Level(step, raw, out);
    recent_.push_back(log_scale_ ? std::log(raw) : raw);
    const size_t smooth = static_cast<size_t>(std::max(1, o_->smooth));
    while (recent_.size() > smooth) recent_.pop_front();
    // The trend starts once the smoothing window is full, so the smoothed
    // series has a constant lag of (smooth − 1) / 2 steps, taken off here.
    if (recent_.size() < smooth) return;
    scratch_.assign(recent_.begin(), recent_.end());
    const double y = MedianInPlace(scratch_);
    hsteps_.push_back(step - static_cast<int64_t>((smooth - 1) / 2));
    hvals_.push_back(y);
    const size_t lookback = static_cast<size_t>(std::max(o_->lookback, o_->trend_window + 1));
    while (hvals_.size() > lookback) {
      hvals_.pop_front();
      hsteps_.pop_front();
    }
    const size_t w = static_cast<size_t>(std::max(1, o_->trend_window));
    if (hvals_.size() <= w) return;
    const double d = hvals_.back() - hvals_[hvals_.size() - 1 - w];
    bool elevated = false;
    if (dbase_.size() >= static_cast<size_t>(std::max(2, o_->min_baseline))) {
      if (++since_refresh_ >= 8) {
        stats_ = ComputeRobustStats(dbase_.begin(), dbase_.end(), &scratch_);
        since_refresh_ = 0;
      }
      const double floor = log_scale_ ? 1e-3 : 0.02;
      const double z = (d - stats_.median) / std::max(stats_.sigma, floor);
      const double min_change = log_scale_ ? o_->min_log_change : o_->min_clip_rate_change;
      const bool over = z >= o_->trend_z_threshold && d - stats_.median >= min_change;
      elevated = z >= 0.5 * o_->trend_z_threshold;
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
    if (!elevated) {
      dbase_.push_back(d);
      while (dbase_.size() > static_cast<size_t>(std::max(2, o_->baseline_window))) {
        dbase_.pop_front();
      }
    }
  }

  SeriesHistory History() const {
    SeriesHistory h;
    h.signal = signal_;
    h.layer = layer_;
    h.steps.assign(hsteps_.begin(), hsteps_.end());
    h.values.assign(hvals_.begin(), hvals_.end());
    return h;
  }

  size_t footprint() const {
    return recent_.size() + hvals_.size() + hsteps_.size() + dbase_.size() + scratch_.capacity();
  }

 private:
  void Level(int64_t step, double raw, std::vector<PrecursorWarning>* out) {
    warn_run_ = raw >= o_->attn_logit_warn ? warn_run_ + 1 : 0;
    crit_run_ = raw >= o_->attn_logit_critical ? crit_run_ + 1 : 0;
    below_run_ = raw < o_->attn_logit_warn ? below_run_ + 1 : 0;
    if (below_run_ >= std::max(1, o_->trend_window)) level_raised_ = 0;
    const int persist = std::max(1, o_->persistence_steps);
    auto raise = [&](PrecursorWarning::Kind kind, double threshold) {
      PrecursorWarning pw;
      pw.kind = kind;
      pw.step = step;
      pw.value = raw;
      pw.score = raw / threshold;
      // Steadily growing for the whole lookback: it started at least that early.
      DateStart(hsteps_.empty() ? step : hsteps_.front(), &pw);
      out->push_back(pw);
    };
    if (warn_run_ >= persist && level_raised_ < 1) {
      level_raised_ = 1;
      raise(PrecursorWarning::kLevelWarn, o_->attn_logit_warn);
    }
    if (crit_run_ >= persist && level_raised_ < 2) {
      level_raised_ = 2;
      raise(PrecursorWarning::kLevelCritical, o_->attn_logit_critical);
    }
  }

  // Fills signal, layer, start_step and baseline: the departure of the
  // lookback window, or `fallback` when there is none to see.
  void DateStart(int64_t fallback, PrecursorWarning* pw) const {
    pw->signal = signal_;
    pw->layer = layer_;
    pw->start_step = std::min(fallback, pw->step);
    pw->baseline = hvals_.empty() ? pw->value : Raw(hvals_.front());
    DepartureOptions d;
    d.min_rise = log_scale_ ? o_->min_log_change : o_->min_clip_rate_change;
    d.noise_factor = o_->start_noise_factor;
    std::vector<int64_t> steps(hsteps_.begin(), hsteps_.end());
    std::vector<double> values(hvals_.begin(), hvals_.end());
    if (auto dep = FindDeparture(steps, values, d); dep && dep->step <= pw->step) {
      pw->start_step = dep->step;
      pw->baseline = Raw(dep->baseline);
    }
  }

  double Raw(double y) const { return log_scale_ ? std::exp(y) : y; }

  std::string signal_;
  int layer_;
  bool log_scale_;
  bool level_alarm_;
  const Options* o_;
  std::deque<double> recent_;
  std::deque<int64_t> hsteps_;
  std::deque<double> hvals_;
  std::deque<double> dbase_;
  RobustStats stats_;
  int since_refresh_ = 1 << 20;
  int over_run_ = 0;
  int calm_run_ = 0;
  bool alarmed_ = false;
  int warn_run_ = 0;
  int crit_run_ = 0;
  int below_run_ = 0;
  int level_raised_ = 0;
  std::vector<double> scratch_;
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
  out.reserve(series_.size());
  for (const auto& s : series_) out.push_back(s->History());
  return out;
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
