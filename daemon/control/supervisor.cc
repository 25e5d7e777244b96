#include "daemon/control/supervisor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "daemon/ingest/limits.h"
#include "daemon/detect/step_message.h"
#include "daemon/incident/policy.h"

namespace spikeguard::daemon {
namespace {

namespace v1 = spikeguard::v1;

detect::RunMonitor::Options MonitorOptions(const v1::Policy& policy) {
  detect::RunMonitor::Options o;
  o.loss = incident::SpikeOptions(policy.loss_spike(), o.loss);
  o.grad_norm = incident::SpikeOptions(policy.grad_norm_spike(), o.grad_norm);
  const auto& p = policy.precursor();
  // Knobs the policy sets replace the detector's defaults; values that
  // ValidatePolicy rejects (none is meaningful at 0) keep them.
  if (p.has_trend_window() && p.trend_window() > 0) o.precursor.trend_window = p.trend_window();
  if (p.has_trend_z_threshold() && p.trend_z_threshold() > 0) {
    o.precursor.trend_z_threshold = p.trend_z_threshold();
  }
  if (p.has_attn_logit_warn() && p.attn_logit_warn() > 0) {
    o.precursor.attn_logit_warn = p.attn_logit_warn();
  }
  if (p.has_attn_logit_critical() && p.attn_logit_critical() > 0) {
    o.precursor.attn_logit_critical = p.attn_logit_critical();
  }
  if (p.has_persistence_steps() && p.persistence_steps() > 0) {
    o.precursor.persistence_steps = p.persistence_steps();
  }
  // Localized by the engine once the incident is opened (Detection::localize).
  o.localize_events = false;
  return o;
}

void SetLocalization(const detect::Localization& loc, incident::Detection* d) {
  if (loc.order.empty()) return;
  d->localized_signal = loc.order.front().signal;
  d->localized_layer = loc.order.front().layer;
  d->localization_order = loc.Names();
}

detect::StepSample ToSample(const v1::StepRecord& r) { return detect::FromStepMessage(r); }

}  // namespace

Supervisor::Supervisor(Deps deps)
    : catalog_(deps.catalog),
      clock_(deps.clock),
      control_(deps.catalog, deps.hub, deps.clock),
      view_(deps.catalog, deps.checkpoints, deps.profiles),
      store_(deps.catalog),
      warnings_(deps.catalog),
      metrics_(deps.metrics),
      latency_observer_(std::move(deps.latency_observer)),
      completed_(deps.completed),
      pipeline_threads_(std::max(1, deps.pipeline_threads)) {}

Supervisor::~Supervisor() { Stop(); }

absl::Status Supervisor::Start() {
  {
    absl::MutexLock lock(&mu_);
    engine_ = std::make_unique<incident::IncidentEngine>(clock_, &control_, &view_, &store_);
    engine_->SetListener([this](const v1::Incident& incident, const v1::IncidentEvent& event) {
      Publish(incident, event);
    });
    engine_->SetDecisionObserver(
        [this](const std::string&) { decided_at_ns_.store(absl::GetCurrentTimeNanos()); });
    warnings_.SetListener([this](const v1::PrecursorWarning& w, std::string_view kind) {
      PublishWarning(w, kind);
    });
    if (absl::Status s = warnings_.Load(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("precursor warnings: ", s.message()));
    }
    if (absl::Status s = engine_->Recover(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("incident recovery: ", s.message()));
    }
    const auto active = engine_->Active();
    if (!active.empty()) {
      SG_LOG(INFO) << "recovered " << active.size() << " open incident(s) from their event logs";
    }
  }
  tick_thread_ = std::thread([this] { TickLoop(); });
  pipeline_pool_ = std::make_unique<TaskPool>(pipeline_threads_);
  {
    absl::MutexLock lock(&exec_mu_);
    exec_started_ = true;
  }
  if (completed_ != nullptr) {
    completed_->Open();
    dispatcher_ = std::thread([this] { DispatchLoop(); });
  }
  return absl::OkStatus();
}

void Supervisor::Stop() {
  {
    absl::MutexLock lock(&tick_mu_);
    stopping_ = true;
  }
  if (tick_thread_.joinable()) tick_thread_.join();
  // What was handed over is processed before the pipelines stop; what the
  // ingest stage queues after that is dropped.
  if (dispatcher_.joinable()) DispatchPending();
  Drain();
  if (dispatcher_.joinable()) {
    completed_->Close();
    dispatcher_.join();
  }
  {
    absl::MutexLock lock(&exec_mu_);
    exec_stopping_ = true;
  }
  // Runs the pipelines' turns still queued (each returns at once: stopping)
  // and joins.
  pipeline_pool_.reset();
  for (auto& w : watchers_.All()) {
    absl::MutexLock wl(&w->mu);
    w->closed = true;
    w->cv.SignalAll();
  }
}

void Supervisor::TickLoop() {
  while (true) {
    {
      absl::MutexLock lock(&tick_mu_);
      auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(tick_mu_) { return stopping_; };
      tick_mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Seconds(1));
      if (stopping_) return;
    }
    RunControl::Outbox outbox(&control_);
    absl::MutexLock lock(&mu_);
    if (engine_) {
      if (absl::Status s = engine_->Tick(); !s.ok()) SG_LOG(WARNING) << "incident tick: " << s;
    }
  }
}

void Supervisor::AwaitRoomLocked() {
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_) {
    return exec_stopping_ || queued_records_ < kMaxQueuedRecords;
  };
  exec_mu_.Await(absl::Condition(&room));
}

bool Supervisor::Post(const std::string& run, int64_t records, std::function<void()> task,
                      bool wait) {
  absl::MutexLock lock(&exec_mu_);
  if (exec_stopping_ || !exec_started_) return false;
  if (wait) AwaitRoomLocked();
  if (exec_stopping_) return false;
  auto& slot = pipelines_[run];
  if (slot == nullptr) {
    slot = std::make_unique<Pipeline>();
    slot->run = run;
  }
  Pipeline* p = slot.get();
  p->tasks.emplace_back(records, std::move(task));
  queued_records_ += records;
  if (!p->scheduled) {
    p->scheduled = true;
    ++scheduled_;
    pipeline_pool_->Post([this, p] { RunPipeline(p); });
  }
  return true;
}

void Supervisor::DispatchLoop() {
  while (completed_->WaitForRecords()) DispatchPending();
}

void Supervisor::DispatchPending() {
  if (completed_ == nullptr) return;
  absl::MutexLock lock(&dispatch_mu_);
  for (CompletedSlice& slice : completed_->TakeAll()) {
    OnCompleted(std::move(slice.records), slice.arrived);
  }
}

void Supervisor::RunPipeline(Pipeline* p) {
  std::deque<std::pair<int64_t, std::function<void()>>> tasks;
  {
    absl::MutexLock lock(&exec_mu_);
    if (exec_stopping_) return;
    // The pipeline stays `scheduled` while it runs: no other turn of it is
    // queued, so its tasks run one at a time, in order.
    tasks = std::move(p->tasks);
    p->tasks.clear();
  }
  int64_t records = 0;
  for (auto& [n, task] : tasks) {
    task();
    records += n;
  }
  absl::MutexLock lock(&exec_mu_);
  queued_records_ -= records;
  if (p->tasks.empty() || exec_stopping_) {
    p->scheduled = false;
    --scheduled_;
  } else {
    // Behind the other runs' turns already queued.
    pipeline_pool_->Post([this, p] { RunPipeline(p); });
  }
}

void Supervisor::Drain() {
  absl::MutexLock lock(&exec_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_) {
    return exec_stopping_ || scheduled_ == 0;
  };
  exec_mu_.Await(absl::Condition(&idle));
}

void Supervisor::ResetMonitor(const std::string& run, int64_t generation, int64_t first_step,
                              Monitor* m) {
  const v1::Policy policy = view_.PolicyFor(run);
  m->generation = generation;
  m->detectors = std::make_unique<detect::RunMonitor>(MonitorOptions(policy));

  // Where this generation starts, and where it came from.
  int64_t gen_start = 0, parent = -1;
  if (auto gens = catalog_->ListGenerations(run); gens.ok()) {
    for (const auto& g : *gens) {
      if (g.generation() == generation) {
        gen_start = g.from_checkpoint_step();
        parent = g.parent();
      }
    }
  }
  // After a daemon restart the engine reads an open probe's earlier steps
  // back from the catalog itself; delivery starts with this batch.
  m->next_step = first_step;

  // Warm the detectors with history: this generation's steps before the
  // cursor, preceded by the parent's steps before the rewind point.
  const int window = policy.loss_spike().window() > 0 ? policy.loss_spike().window() : 128;
  std::vector<v1::StepRecord> history;
  if (parent >= 0 && gen_start > 0 && m->next_step - gen_start < window) {
    if (auto p = catalog_->QueryTelemetry(run, parent, std::max<int64_t>(0, gen_start - window),
                                          gen_start - 1, window);
        p.ok()) {
      history = *p;
    }
  }
  if (m->next_step > 0) {
    if (auto own = catalog_->QueryTelemetry(run, generation,
                                            std::max<int64_t>(0, m->next_step - window),
                                            m->next_step - 1, window);
        own.ok()) {
      history.insert(history.end(), own->begin(), own->end());
    }
  }
  for (const auto& r : history) (void)m->detectors->Observe(ToSample(r));
}

bool Supervisor::OnLine(Pipeline* p, int64_t ancestor, int64_t descendant) {
  if (ancestor == descendant) return true;
  if (p->parents.count(descendant) == 0) {
    if (auto gens = catalog_->ListGenerations(p->run); gens.ok()) {
      for (const auto& g : *gens) p->parents[g.generation()] = g.parent();
    }
  }
  // Parents are older than their children: the walk ends.
  for (int64_t g = descendant; g >= 0;) {
    if (g == ancestor) return true;
    auto it = p->parents.find(g);
    if (it == p->parents.end() || it->second >= g) return false;
    g = it->second;
  }
  return false;
}

std::vector<incident::Detection> Supervisor::Detect(Pipeline* p, const v1::StepRecord& r) {
  const std::string& run = p->run;
  Monitor* m = &p->monitor;
  // Every detector that fires on this step describes one event: it opens
  // (at most) one incident, the strongest signal first, the others as
  // evidence.
  std::vector<incident::Detection> found;
  for (const detect::MonitorEvent& e : m->detectors->Observe(ToSample(r))) {
    if (e.kind == detect::MonitorEvent::kPrecursor) {
      SG_LOG(INFO) << "run " << run << " generation " << r.generation() << ": precursor "
                   << e.signal << (e.layer >= 0 ? absl::StrCat(" layer ", e.layer) : "")
                   << " (" << detect::PrecursorKindName(e.precursor_kind) << ") since step "
                   << e.onset_step << " (value " << e.value << ", baseline " << e.baseline << ")";
      if (e.precursor_kind != detect::PrecursorWarning::kLevelCritical) continue;
      // A critical level that persisted: what it becomes is the policy's
      // choice (read now: such events are rare).
      const v1::PrecursorPolicy pre = view_.PolicyFor(run).precursor();
      const detect::PrecursorDetector::Options& levels = m->detectors->options().precursor;
      const v1::PrecursorAction action =
          pre.has_on_critical() ? pre.on_critical() : v1::PRECURSOR_WARN;
      if (action == v1::PRECURSOR_WARN) {
        WarningTracker::Levels l;
        l.critical = levels.attn_logit_critical;
        l.clear_below = levels.attn_logit_warn;
        l.persistence_steps = levels.persistence_steps;
        warnings_.OnCritical(run, r.generation(), e, l,
                             [this, p](int64_t a, int64_t d) { return OnLine(p, a, d); });
      } else if (action == v1::PRECURSOR_INCIDENT) {
        incident::Detection d;
        d.kind = incident::Detection::Kind::kPrecursor;
        d.generation = r.generation();
        d.onset_step = e.step;
        d.peak_step = e.step;
        d.peak_value = e.value;
        d.baseline = e.baseline;
        if (e.onset_step < e.step) d.precursor_onset_step = e.onset_step;
        d.precursor = e.signal;
        d.localized_signal = e.signal;
        d.localized_layer = e.layer;
        d.also.push_back(absl::StrCat("critical precursor ", e.signal,
                                      e.layer >= 0 ? absl::StrCat(" layer ", e.layer) : "", " at ",
                                      e.value, " (critical ", levels.attn_logit_critical,
                                      ") since step ", e.onset_step));
        found.push_back(std::move(d));
      }
      continue;
    }
    if (!e.opens_incident()) continue;
    incident::Detection d;
    switch (e.kind) {
      case detect::MonitorEvent::kNonFinite:
        d.kind = incident::Detection::Kind::kNonFinite;
        break;
      case detect::MonitorEvent::kSpikeOnset:
        d.kind = e.signal == "grad_norm" ? incident::Detection::Kind::kGradNormSpike
                                         : incident::Detection::Kind::kLossSpike;
        break;
      default:  // a slow divergence opens as a loss event
        d.kind = incident::Detection::Kind::kLossSpike;
    }
    d.generation = r.generation();
    d.onset_step = e.onset_step;
    d.peak_step = std::max(e.peak_step, e.onset_step);
    d.peak_value = e.value;
    d.baseline = e.baseline;
    if (e.precursor_start && *e.precursor_start < e.onset_step) {
      d.precursor_onset_step = *e.precursor_start;
      d.precursor = e.precursor_signal;
    }
    if (e.kind == detect::MonitorEvent::kSpikeOnset &&
        !m->detectors->options().localize_events) {
      // Worked out after the incident is opened, from the monitor as it is
      // now (the engine calls this within this step's delivery).
      d.localize = [monitor = m->detectors.get(), onset = e.onset_step](incident::Detection* out) {
        SetLocalization(monitor->LocalizeNow(onset - 1), out);
      };
    } else if (!e.localization.order.empty()) {
      SetLocalization(e.localization, &d);
    } else if (e.kind == detect::MonitorEvent::kNonFinite && e.layer >= 0) {
      d.localized_signal = "non-finite";
      d.localized_layer = e.layer;
    }
    SG_LOG(INFO) << "run " << run << " generation " << d.generation << ": "
                 << detect::MonitorEventKindName(e.kind) << " of " << e.signal << " at step "
                 << d.onset_step << " (value " << d.peak_value << ", baseline " << d.baseline
                 << (d.precursor_onset_step ? absl::StrCat(", precursor ", d.precursor, " since ",
                                                           *d.precursor_onset_step)
                                            : std::string())
                 << ")";
    found.push_back(std::move(d));
  }
  if (found.empty()) return found;
  auto rank = [](const incident::Detection& d) {
    switch (d.kind) {
      case incident::Detection::Kind::kNonFinite: return 0;
      case incident::Detection::Kind::kLossSpike: return 1;
      case incident::Detection::Kind::kGradNormSpike: return 2;
      case incident::Detection::Kind::kPrecursor: return 3;
    }
    return 4;
  };
  std::stable_sort(found.begin(), found.end(),
                   [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  incident::Detection d = found.front();
  for (size_t i = 1; i < found.size(); ++i) {
    const incident::Detection& o = found[i];
    const char* name = o.kind == incident::Detection::Kind::kNonFinite       ? "non-finite"
                       : o.kind == incident::Detection::Kind::kGradNormSpike ? "grad-norm spike"
                       : o.kind == incident::Detection::Kind::kPrecursor     ? "critical precursor"
                                                                             : "loss spike";
    d.also.push_back(absl::StrCat(name, " at step ", o.onset_step, " (peak ", o.peak_value, ")"));
    if (!d.precursor_onset_step && o.precursor_onset_step) {
      d.precursor_onset_step = o.precursor_onset_step;
      d.precursor = o.precursor;
    }
  }
  return {std::move(d)};
}

void Supervisor::OnCompleted(std::vector<CompletedStep> completed, absl::Time arrived) {
  // Split by run; each run's slice keeps the (generation, step) order.
  size_t begin = 0;
  while (begin < completed.size()) {
    size_t end = begin + 1;
    while (end < completed.size() && completed[end].run == completed[begin].run) ++end;
    auto slice = std::make_shared<std::vector<CompletedStep>>(
        std::make_move_iterator(completed.begin() + begin),
        std::make_move_iterator(completed.begin() + end));
    const std::string run = slice->front().run;
    const int64_t records = static_cast<int64_t>(slice->size());
    const bool posted = Post(
        run, records,
        [this, run, slice, arrived, records] {
          Pipeline* p = nullptr;
          {
            absl::MutexLock lock(&exec_mu_);
            p = pipelines_[run].get();
          }
          Deliver(p, std::move(*slice), arrived);
          completed_->Done(records);
        },
        /*wait=*/false);
    if (!posted) completed_->Done(records);  // never delivered
    begin = end;
  }
}

void Supervisor::Deliver(Pipeline* p, std::vector<CompletedStep> records,
                         absl::Time arrived) {
  Monitor& m = p->monitor;
  // Step by step: the detectors under no lock, then the engine under mu_;
  // the commands it issued go out after the last step (the outbox is
  // flushed when it goes out of scope, after mu_ is released).
  RunControl::Outbox outbox(&control_);
  for (const CompletedStep& c : records) {
    const v1::StepRecord& r = c.record;
    const bool stale = r.generation() < m.generation;
    const bool delivered = r.generation() == m.generation && r.step() < m.next_step;
    if (stale || delivered) continue;
    if (r.generation() > m.generation) ResetMonitor(p->run, r.generation(), r.step(), &m);
    const std::vector<incident::Detection> detections = Detect(p, r);
    warnings_.OnStep(p->run, r, [this, p](int64_t a, int64_t d) { return OnLine(p, a, d); });
    const incident::StepObservation observation = ToObservation(r);
    m.next_step = r.step() + 1;
    int64_t decided_ns = 0, opened_ns = 0;
    {
      absl::MutexLock lock(&mu_);
      decided_at_ns_.store(0);
      opened_at_ns_.store(0);
      if (engine_) {
        if (absl::Status s = engine_->OnStep(p->run, observation); !s.ok()) {
          SG_LOG(ERROR) << "run " << p->run << ": incident engine: " << s;
        }
        for (const incident::Detection& d : detections) {
          if (absl::Status s = engine_->OnDetection(p->run, d); !s.ok()) {
            SG_LOG(ERROR) << "run " << p->run << ": incident engine refused a detection: " << s;
          }
        }
      }
      decided_ns = decided_at_ns_.load();
      opened_ns = opened_at_ns_.load();
    }
    // An incident opened on this step: the run's active precursor warnings
    // preceded it.
    std::vector<std::tuple<std::string, int64_t, int64_t>> opened;
    {
      absl::MutexLock lock(&opened_mu_);
      opened.swap(opened_);
    }
    for (const auto& [run, id, onset] : opened) warnings_.OnIncidentOpened(run, id, onset);
    // Arrival -> the decision: this record's detectors and engine done, or
    // for a record that opened an incident, the engine's decision to open
    // it; and for that record, -> its "opened" event durable and published
    // (what the engine then does, a rewind or observe mode's close, is the
    // incident's work, not detection).
    metrics::DetectionLatency latency;
    latency.decision = (decided_ns != 0 ? absl::FromUnixNanos(decided_ns) : absl::Now()) - arrived;
    if (opened_ns != 0) latency.opened = absl::FromUnixNanos(opened_ns) - arrived;
    if (metrics_ != nullptr) {
      metrics_->detection_latency_seconds->Observe(absl::ToDoubleSeconds(latency.decision));
      if (latency.opened) {
        metrics_->incident_open_latency_seconds->Observe(absl::ToDoubleSeconds(*latency.opened));
      }
    }
    if (latency_observer_) latency_observer_(latency);
  }
}

void Supervisor::OnGenerationEnded(const std::string& run, int64_t generation, uint32_t rank,
                                   int64_t last_step, const std::string& reason) {
  // Behind the run's records already queued by the ingest stage.
  DispatchPending();
  Post(run, 0, [this, run, generation, rank, last_step, reason] {
    RunControl::Outbox outbox(&control_);
    absl::MutexLock lock(&mu_);
    if (!engine_) return;
    SG_LOG(INFO) << "run " << run << " rank " << rank << ": generation " << generation
                 << " ended at step " << last_step << " (" << LogText(reason) << ")";
    if (absl::Status s = engine_->OnGenerationEnded(run, generation, last_step, reason);
        !s.ok()) {
      SG_LOG(ERROR) << "run " << run << ": incident engine: " << s;
    }
  });
}

void Supervisor::OnCommandFailed(const std::string& run, const std::string& command_id,
                                 uint32_t rank, const std::string& message) {
  Post(run, 0, [this, run, command_id, rank, message] {
    RunControl::Outbox outbox(&control_);
    absl::MutexLock lock(&mu_);
    if (!engine_) return;
    if (absl::Status s = engine_->OnCommandFailed(run, command_id,
                                                  absl::StrCat("rank ", rank, ": ", message));
        !s.ok()) {
      SG_LOG(ERROR) << "run " << run << ": incident engine: " << s;
    }
  });
}

absl::Status Supervisor::Approve(int64_t id) {
  RunControl::Outbox outbox(&control_);
  absl::MutexLock lock(&mu_);
  return engine_->Approve(id);
}

absl::Status Supervisor::Abort(int64_t id, const std::string& reason) {
  RunControl::Outbox outbox(&control_);
  absl::MutexLock lock(&mu_);
  return engine_->Abort(id, reason);
}

absl::StatusOr<int64_t> Supervisor::OperatorRewind(const std::string& run,
                                                   const incident::RewindSpec& spec) {
  RunControl::Outbox outbox(&control_);
  absl::MutexLock lock(&mu_);
  if (!engine_) return control_.Rewind(run, spec);
  return engine_->OperatorRewind(run, spec);
}

bool Supervisor::ProbeRunning(const std::string& run) {
  absl::MutexLock lock(&mu_);
  return engine_ && engine_->ProbeRunning(run);
}

std::optional<v1::Incident> Supervisor::LiveIncident(int64_t id) {
  absl::MutexLock lock(&mu_);
  if (!engine_) return std::nullopt;
  return engine_->Get(id);
}

int Supervisor::OpenIncidents() {
  absl::MutexLock lock(&mu_);
  return engine_ ? static_cast<int>(engine_->Active().size()) : 0;
}

std::shared_ptr<Supervisor::Watcher> Supervisor::Watch(const std::string& run) {
  auto w = std::make_shared<Watcher>();
  w->id = watchers_.Add(run, w);
  return w;
}

void Supervisor::Unwatch(const std::shared_ptr<Watcher>& watcher) { watchers_.Remove(watcher->id); }

void Supervisor::Publish(const v1::Incident& incident, const v1::IncidentEvent& event) {
  v1::IncidentUpdate update;
  *update.mutable_incident() = incident;
  *update.mutable_event() = event;
  if (event.kind() == "opened") {
    opened_at_ns_.store(absl::GetCurrentTimeNanos());
    absl::MutexLock lock(&opened_mu_);
    opened_.emplace_back(incident.run(), incident.id(), incident.onset_step());
  }
  SG_LOG(INFO) << "incident " << incident.id() << " (run " << incident.run() << "): " << event.kind()
               << (event.detail().empty() ? "" : ": ") << event.detail();
  Broadcast(incident.run(), update);
}

void Supervisor::PublishWarning(const v1::PrecursorWarning& warning, std::string_view kind) {
  v1::IncidentUpdate update;
  *update.mutable_warning() = warning;
  v1::IncidentEvent* event = update.mutable_event();
  event->set_kind(std::string(kind));
  event->set_unix_ms(clock_->NowUnixMillis());
  const std::string where =
      absl::StrCat(warning.signal(), warning.layer() >= 0 ? absl::StrCat(" layer ", warning.layer()) : "");
  if (kind == "warning_opened") {
    event->set_detail(absl::StrCat(where, " at ", warning.last_value(), " (critical ",
                                   warning.threshold(), ") since step ", warning.onset_step(),
                                   ", lead ", warning.lead_steps(), " steps"));
  } else if (kind == "warning_cleared") {
    event->set_detail(absl::StrCat(where, " under ", warning.clear_below(), " at step ",
                                   warning.last_step(), " (peak ", warning.peak_value(), ")"));
  } else {
    event->set_detail(absl::StrCat(where, " preceded incident ", warning.incident_id(), " by ",
                                   warning.incident_lead_steps(), " steps"));
  }
  Broadcast(warning.run(), update);
}

void Supervisor::Broadcast(const std::string& run, const v1::IncidentUpdate& update) {
  absl::MutexLock lock(&watch_mu_);
  for (auto& w : watchers_.For(run)) {
    absl::MutexLock wl(&w->mu);
    // Bounded: a watcher that does not read loses the oldest updates.
    if (w->updates.size() >= 1024) w->updates.pop_front();
    w->updates.push_back(update);
    w->cv.SignalAll();
  }
}

}  // namespace spikeguard::daemon
