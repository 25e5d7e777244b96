#include "daemon/control/precursor_warnings.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;

double SeriesValue(const v1::StepRecord& r, const std::string& signal, int layer) {
  constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  if (layer < 0) {
    if (signal == "grad_norm") return r.grad_norm();
    if (signal == "lse_mean") return r.lse_mean();
    if (signal == "lse_max") return r.lse_max();
    return kNone;
  }
  for (const v1::LayerStats& l : r.layers()) {
    if (static_cast<int64_t>(l.layer()) != layer) continue;
    if (signal == "max_attn_logit") return l.max_attn_logit();
    if (signal == "grad_norm") return l.grad_norm();
    if (signal == "update_ratio") return l.update_ratio();
    if (signal == "act_rms") return l.act_rms();
    return kNone;
  }
  return kNone;
}

absl::Status WarningTracker::Load() {
  absl::StatusOr<std::vector<v1::PrecursorWarning>> all = catalog_->ListWarnings({});
  if (!all.ok()) return all.status();
  absl::MutexLock lock(&mu_);
  active_.clear();
  ended_.clear();
  for (const v1::PrecursorWarning& w : *all) {
    if (w.state() == v1::WARNING_ACTIVE) {
      Tracked t;
      t.w = w;
      t.persisted_step = w.last_step();
      // The persistence it was raised with is not stored: the clear level
      // and the step count are what the policy says now (OnCritical's).
      t.persistence_steps = 5;
      active_[w.run()].emplace(w.id(), std::move(t));
    } else {
      ended_[w.run()].push_back({w.last_generation(), w.signal(), w.layer(), w.state()});
    }
  }
  return absl::OkStatus();
}

void WarningTracker::Write(v1::PrecursorWarning* w, std::string_view kind) {
  if (w->id() == 0) {
    absl::StatusOr<int64_t> id = catalog_->CreateWarning(*w);
    if (!id.ok()) {
      SG_LOG(ERROR) << "run " << w->run() << ": cannot store a precursor warning: " << id.status();
      return;
    }
    w->set_id(*id);
  } else if (absl::Status s = catalog_->UpdateWarning(*w); !s.ok()) {
    SG_LOG(ERROR) << "run " << w->run() << ": cannot update precursor warning " << w->id() << ": "
                  << s;
    return;
  }
  if (!kind.empty() && listener_) listener_(*w, kind);
}

void WarningTracker::OnCritical(const std::string& run, int64_t generation,
                                const detect::MonitorEvent& e, const Levels& levels,
                                const OnLine& on_line) {
  v1::PrecursorWarning fresh;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, t] : active_[run]) {
      if (t.w.signal() != e.signal || t.w.layer() != e.layer) continue;
      if (!on_line(t.w.generation(), generation)) continue;
      // The same episode seen again on its line (a replay): it goes on.
      t.persistence_steps = std::max(1, levels.persistence_steps);
      return;
    }
    for (const Ended& past : ended_[run]) {
      if (past.state == v1::WARNING_PRECEDED_INCIDENT && past.signal == e.signal &&
          past.layer == e.layer && on_line(past.generation, generation)) {
        return;  // the incident it preceded owns the episode (its probes replay it)
      }
    }
    fresh.set_run(run);
    fresh.set_generation(generation);
    fresh.set_last_generation(generation);
    fresh.set_signal(e.signal);
    fresh.set_layer(e.layer);
    fresh.set_state(v1::WARNING_ACTIVE);
    fresh.set_onset_step(std::min(e.onset_step, e.step));
    fresh.set_raised_step(e.step);
    fresh.set_last_step(e.step);
    fresh.set_peak_value(e.value);
    fresh.set_peak_step(e.step);
    fresh.set_last_value(e.value);
    fresh.set_threshold(levels.critical);
    fresh.set_clear_below(levels.clear_below);
    fresh.set_lead_steps(fresh.last_step() - fresh.onset_step());
  }
  Write(&fresh, "");
  if (fresh.id() == 0) return;
  {
    absl::MutexLock lock(&mu_);
    Tracked t;
    t.w = fresh;
    t.persistence_steps = std::max(1, levels.persistence_steps);
    t.persisted_step = fresh.last_step();
    active_[run].emplace(fresh.id(), std::move(t));
  }
  SG_LOG(WARNING) << "run " << run << " generation " << generation << ": precursor warning "
                  << fresh.id() << ": " << e.signal
                  << (e.layer >= 0 ? absl::StrCat(" layer ", e.layer) : std::string()) << " at "
                  << e.value << " (critical " << levels.critical << ") since step "
                  << fresh.onset_step();
  if (listener_) listener_(fresh, "warning_opened");
}

void WarningTracker::OnStep(const std::string& run, const v1::StepRecord& r,
                            const OnLine& on_line) {
  std::vector<std::pair<v1::PrecursorWarning, std::string_view>> writes;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(run);
    if (it == active_.end() || it->second.empty()) return;
    for (auto t = it->second.begin(); t != it->second.end();) {
      v1::PrecursorWarning& w = t->second.w;
      const double value = SeriesValue(r, w.signal(), w.layer());
      if (!std::isfinite(value) || !on_line(w.generation(), r.generation())) {
        ++t;
        continue;
      }
      w.set_last_generation(std::max(w.last_generation(), r.generation()));
      w.set_last_step(std::max(w.last_step(), r.step()));
      w.set_last_value(value);
      if (value > w.peak_value()) {
        w.set_peak_value(value);
        w.set_peak_step(r.step());
      }
      w.set_lead_steps(w.last_step() - w.onset_step());
      t->second.below_run = value < w.clear_below() ? t->second.below_run + 1 : 0;
      if (t->second.below_run >= t->second.persistence_steps) {
        w.set_state(v1::WARNING_CLEARED);
        w.set_last_step(r.step());
        w.set_lead_steps(w.last_step() - w.onset_step());
        writes.emplace_back(w, "warning_cleared");
        ended_[run].push_back({w.last_generation(), w.signal(), w.layer(), w.state()});
        t = it->second.erase(t);
        continue;
      }
      if (w.last_step() - t->second.persisted_step >= kPersistEvery) {
        t->second.persisted_step = w.last_step();
        writes.emplace_back(w, "");
      }
      ++t;
    }
  }
  for (auto& [w, kind] : writes) {
    if (kind == "warning_cleared") {
      SG_LOG(INFO) << "run " << run << ": precursor warning " << w.id() << " (" << w.signal()
                   << (w.layer() >= 0 ? absl::StrCat(" layer ", w.layer()) : std::string())
                   << ") cleared at step " << w.last_step() << ", peak " << w.peak_value();
    }
    Write(&w, kind);
  }
}

void WarningTracker::OnIncidentOpened(const std::string& run, int64_t incident_id,
                                      int64_t onset_step) {
  std::vector<v1::PrecursorWarning> preceded;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(run);
    if (it == active_.end()) return;
    for (auto& [id, t] : it->second) {
      v1::PrecursorWarning& w = t.w;
      w.set_state(v1::WARNING_PRECEDED_INCIDENT);
      w.set_incident_id(incident_id);
      w.set_incident_onset_step(onset_step);
      w.set_incident_lead_steps(onset_step - w.onset_step());
      preceded.push_back(w);
      ended_[run].push_back({w.last_generation(), w.signal(), w.layer(), w.state()});
    }
    active_.erase(it);
  }
  for (v1::PrecursorWarning& w : preceded) {
    SG_LOG(INFO) << "run " << run << ": precursor warning " << w.id() << " preceded incident "
                 << incident_id << " by " << w.incident_lead_steps() << " steps";
    Write(&w, "warning_preceded_incident");
  }
}

std::vector<v1::PrecursorWarning> WarningTracker::Active(const std::string& run) {
  std::vector<v1::PrecursorWarning> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, warnings] : active_) {
    if (!run.empty() && name != run) continue;
    for (const auto& [id, t] : warnings) out.push_back(t.w);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id() < b.id(); });
  return out;
}

}  // namespace spikeguard::daemon
