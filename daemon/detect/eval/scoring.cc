#include "daemon/detect/eval/scoring.h"

#include <algorithm>
#include <cmath>

#include "daemon/detect/robust_stats.h"

namespace spikeguard::detect {

void ScoreCounts::Add(const ScoreCounts& o) {
  steps += o.steps;
  labels += o.labels;
  detected += o.detected;
  false_alarms += o.false_alarms;
  duplicates += o.duplicates;
  leads.insert(leads.end(), o.leads.begin(), o.leads.end());
  false_alarm_steps.insert(false_alarm_steps.end(), o.false_alarm_steps.begin(),
                           o.false_alarm_steps.end());
  precursor_labels += o.precursor_labels;
  precursors_detected += o.precursors_detected;
  false_warnings += o.false_warnings;
  start_errors.insert(start_errors.end(), o.start_errors.begin(), o.start_errors.end());
  precursor_leads.insert(precursor_leads.end(), o.precursor_leads.begin(), o.precursor_leads.end());
}

double MedianOrNan(std::vector<double> v) {
  if (v.empty()) return NAN;
  return MedianInPlace(v);
}

ScoreCounts ScoreTrace(const std::vector<Alarm>& alarms, const std::vector<Label>& labels,
                       int64_t steps, const MatchRule& rule) {
  ScoreCounts c;
  c.steps = steps;
  std::vector<const Label*> events, precursors;
  for (const Label& l : labels) {
    (l.kind == Label::kPrecursor ? precursors : events).push_back(&l);
  }
  c.labels = static_cast<int>(events.size());
  c.precursor_labels = static_cast<int>(precursors.size());
  std::vector<bool> hit(events.size(), false), pre_hit(precursors.size(), false);
  auto inside_any = [&](int64_t a) {
    for (const Label& l : labels) {
      if (a >= l.onset - rule.lead_window && a <= std::max(l.end, l.peak) + rule.post_peak) {
        return true;
      }
    }
    return false;
  };
  std::vector<const Alarm*> sorted;
  for (const Alarm& a : alarms) sorted.push_back(&a);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Alarm* a, const Alarm* b) { return a->step < b->step; });
  for (const Alarm* a : sorted) {
    // A grad-norm spike onset ahead of the loss is that series' warning too.
    const bool spike_onset = a->kind == a->signal + "_spike";
    if (a->kind == "precursor" || spike_onset) {
      bool matched = false;
      for (size_t i = 0; i < precursors.size(); ++i) {
        const Label& l = *precursors[i];
        if (pre_hit[i] || a->signal != l.signal || a->layer != l.layer) continue;
        if (a->step > l.peak || a->step < l.onset - rule.lead_window) continue;
        pre_hit[i] = true;
        matched = true;
        ++c.precursors_detected;
        c.start_errors.push_back(static_cast<double>(a->start_step - l.onset));
        c.precursor_leads.push_back(static_cast<double>(l.peak - a->step));
        break;
      }
      if (!spike_onset) {
        if (!matched && !inside_any(a->step)) ++c.false_warnings;
        continue;
      }
    }
    if (!a->scored) continue;
    bool matched = false;
    for (size_t i = 0; i < events.size(); ++i) {
      const Label& l = *events[i];
      if (hit[i] || a->step < l.onset - rule.lead_window || a->step > l.peak + rule.post_peak) {
        continue;
      }
      hit[i] = true;
      matched = true;
      ++c.detected;
      c.leads.push_back(static_cast<double>(l.peak - a->step));
      break;
    }
    if (matched) continue;
    bool duplicate = false;
    for (const Label* l : events) {
      if (a->step >= l->onset - rule.lead_window && a->step <= l->end + rule.post_peak) {
        duplicate = true;
      }
    }
    if (duplicate) {
      ++c.duplicates;
    } else {
      ++c.false_alarms;
      c.false_alarm_steps.push_back(a->step);
    }
  }
  return c;
}

DetectorScore Summarize(const std::string& detector, const ScoreCounts& c) {
  DetectorScore s;
  s.detector = detector;
  s.counts = c;
  const double tp = c.detected;
  s.precision = tp + c.false_alarms > 0 ? tp / (tp + c.false_alarms) : 0;
  s.recall = c.labels > 0 ? tp / c.labels : 0;
  s.f1 = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0;
  s.false_alarms_per_10k = c.steps > 0 ? 1e4 * c.false_alarms / static_cast<double>(c.steps) : 0;
  s.median_lead = MedianOrNan(c.leads);
  s.precursor_recall =
      c.precursor_labels > 0 ? static_cast<double>(c.precursors_detected) / c.precursor_labels : 0;
  std::vector<double> abs_err;
  for (double e : c.start_errors) abs_err.push_back(std::abs(e));
  s.median_abs_start_error = MedianOrNan(abs_err);
  s.median_precursor_lead = MedianOrNan(c.precursor_leads);
  s.false_warnings_per_10k =
      c.steps > 0 ? 1e4 * c.false_warnings / static_cast<double>(c.steps) : 0;
  return s;
}

}  // namespace spikeguard::detect
