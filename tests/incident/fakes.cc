#include "tests/incident/fakes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "daemon/incident/plan_proto.h"
#include "gtest/gtest.h"

namespace spikeguard::incident::testing {

namespace v1 = spikeguard::v1;

// --- FakeController ------------------------------------------------------------

absl::StatusOr<int64_t> FakeController::Rewind(const std::string& run, const RewindSpec& spec) {
  ++rewind_calls;
  if (!fail_next_rewind.ok()) {
    absl::Status s = fail_next_rewind;
    fail_next_rewind = absl::OkStatus();
    return s;
  }
  if (auto it = generation_of.find(spec.request_id); it != generation_of.end()) return it->second;
  int64_t gen = current_generation;
  for (const auto& [g, s] : spec_of) gen = std::max(gen, g);
  ++gen;
  generation_of[spec.request_id] = gen;
  spec_of[gen] = spec;
  v1::Generation g;
  g.set_generation(gen);
  g.set_parent(spec.checkpoint.generation);
  g.set_from_checkpoint_step(spec.checkpoint.step);
  tree.push_back(g);
  executed.push_back(spec);
  current_generation = gen;
  paused = false;
  return gen;
}

absl::Status FakeController::Continue(const std::string& run, const std::string& request_id,
                                      const std::optional<v1::HParams>& hparams) {
  if (std::find(continue_calls.begin(), continue_calls.end(), request_id) == continue_calls.end()) {
    continued.insert(current_generation);
    paused = false;
  }
  continue_calls.push_back(request_id);
  return absl::OkStatus();
}

absl::Status FakeController::Pause(const std::string& run, const std::string& request_id) {
  pause_calls.push_back(request_id);
  paused = true;
  return absl::OkStatus();
}

// --- FakeView ----------------------------------------------------------------------

absl::StatusOr<std::vector<CheckpointInfo>> FakeView::Checkpoints(const std::string& run) {
  return checkpoints;
}

absl::StatusOr<std::vector<StepObservation>> FakeView::Steps(const std::string& run,
                                                             int64_t generation, int64_t from,
                                                             int64_t to) {
  std::vector<StepObservation> out;
  auto g = steps.find(generation);
  if (g == steps.end()) return out;
  for (auto it = g->second.lower_bound(from); it != g->second.end() && it->first <= to; ++it) {
    out.push_back(it->second);
  }
  return out;
}

absl::StatusOr<v1::DataPlan> FakeView::Plan(const std::string& run, int64_t generation) {
  auto it = plans.find(generation);
  return it == plans.end() ? v1::DataPlan() : it->second;
}

absl::StatusOr<std::vector<SampleContent>> FakeView::Samples(const std::string& run,
                                                             int64_t generation,
                                                             int64_t position) {
  std::vector<SampleContent> out;
  if (!has_manifest) return out;
  auto doc = [&](int k) {
    v1::DocumentRef d;
    d.set_domain("web");
    d.set_document_id(10 * position + k);
    d.set_data_position(position);
    return d;
  };
  for (int j = 0; j < 8; ++j) {
    SampleContent& row = out.emplace_back();
    if (j == 3) {
      row.documents = {doc(0), doc(1)};
    } else {
      row.documents = {doc(j < 3 ? 0 : 1)};
    }
  }
  return out;
}

absl::StatusOr<std::vector<v1::DocumentRef>> FakeView::Documents(const std::string& run,
                                                                 int64_t generation, int64_t from,
                                                                 int64_t to) {
  std::vector<v1::DocumentRef> out;
  if (!has_manifest) return out;
  auto rows = Steps(run, generation, from, to);
  if (!rows.ok()) return rows.status();
  for (const StepObservation& o : *rows) {
    for (int k = 0; k < 2; ++k) {
      v1::DocumentRef d;
      d.set_domain("web");
      d.set_document_id(10 * o.data_position + k);
      d.set_data_position(o.data_position);
      d.set_step(o.step);
      out.push_back(d);
    }
  }
  return out;
}

absl::StatusOr<std::vector<Carrier>> FakeView::Carriers(
    const std::string& run, const std::vector<v1::DocumentRef>& documents, int64_t from,
    int64_t to) {
  if (!has_manifest || !carriers_known) {
    return absl::FailedPreconditionError("the fake view knows no later batches");
  }
  std::map<int64_t, Carrier> found;
  std::vector<int64_t>& asked = carrier_queries.emplace_back();
  for (const auto& d : documents) {
    asked.push_back(d.document_id());
    auto it = carriers.find(d.document_id());
    if (it == carriers.end()) continue;
    for (const Carrier& c : it->second) {
      if (c.position < from || c.position >= to) continue;
      Carrier& f = found[c.position];
      f.position = c.position;
      f.samples = c.samples;
      f.slots.insert(f.slots.end(), c.slots.begin(), c.slots.end());
    }
  }
  std::vector<Carrier> out;
  for (auto& [p, c] : found) {
    std::sort(c.slots.begin(), c.slots.end());
    c.slots.erase(std::unique(c.slots.begin(), c.slots.end()), c.slots.end());
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<std::vector<v1::NearDuplicate>> FakeView::NearDuplicates(
    const std::string& run, const std::vector<v1::DocumentRef>& documents) {
  std::vector<v1::NearDuplicate> out;
  for (const auto& d : documents) {
    v1::NearDuplicate& n = out.emplace_back();
    n.set_domain(d.domain());
    n.set_document_id(d.document_id() + 50000);
    n.set_similarity(0.9);
    n.set_similar_to_domain(d.domain());
    n.set_similar_to_document_id(d.document_id());
  }
  return out;
}

// --- FakeStore -----------------------------------------------------------------------

absl::StatusOr<int64_t> FakeStore::CreateIncident(const std::string& run,
                                                  const v1::Incident& incident) {
  const int64_t id = next_id++;
  v1::Incident copy = incident;
  copy.set_id(id);
  copy.set_run(run);
  incidents[id] = copy;
  return id;
}

absl::Status FakeStore::SaveIncident(const v1::Incident& incident) {
  if (!incidents.count(incident.id())) {
    return absl::NotFoundError(absl::StrCat("no incident ", incident.id()));
  }
  incidents[incident.id()] = incident;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FakeStore::AppendEvent(int64_t incident_id, const std::string& kind,
                                               const std::string& payload) {
  if (!fail_append_kind.empty() && kind == fail_append_kind) {
    fail_append_kind.clear();
    return absl::UnavailableError("injected crash before the event was logged");
  }
  const int64_t seq = next_seq++;
  events[incident_id].push_back({seq, 0, kind, payload});
  return seq;
}

absl::StatusOr<std::vector<IncidentStore::StoredEvent>> FakeStore::Events(int64_t incident_id) {
  return events[incident_id];
}

absl::StatusOr<std::vector<v1::Incident>> FakeStore::OpenIncidents() {
  std::vector<v1::Incident> out;
  for (const auto& [id, inc] : incidents) {
    if (inc.state() != v1::CLOSED && inc.state() != v1::ABORTED) out.push_back(inc);
  }
  return out;
}

absl::StatusOr<std::vector<v1::Incident>> FakeStore::RunIncidents(const std::string& run) {
  std::vector<v1::Incident> out;
  for (const auto& [id, inc] : incidents) {
    if (inc.run() == run) out.push_back(inc);
  }
  return out;
}

absl::Status FakeStore::Quarantine(const v1::QuarantineEntry& entry) {
  quarantine.push_back(entry);
  return absl::OkStatus();
}

// --- World -----------------------------------------------------------------------------

int World::Rung(int64_t generation) const {
  auto it = controller_->spec_of.find(generation);
  if (it == controller_->spec_of.end()) return 0;
  const v1::HParams& h = it->second.hparams;
  if (h.has_beta2()) return 3;
  if (h.has_clip_norm()) return 2;
  if (h.has_lr_scale()) return 1;
  return 0;
}

StepObservation World::Make(int64_t generation, int64_t step) const {
  StepObservation o;
  o.generation = generation;
  o.step = step;
  auto spec = controller_->spec_of.find(generation);
  const v1::DataPlan plan =
      spec == controller_->spec_of.end() ? v1::DataPlan() : spec->second.plan;
  o.data_position = PositionOfStep(plan, step);
  // Deterministic noise: a few distinct values, so the MAD is not zero.
  o.loss = 2.0 + 0.02 * (static_cast<double>((step * 7919) % 13) - 6.0) / 6.0;
  o.grad_norm = 1.0 + 0.02 * (static_cast<double>((step * 104729) % 11) - 5.0) / 5.0;
  o.step_time_s = 1.0;
  o.max_loss_rank = static_cast<uint32_t>(step % 8);
  bool spike = false;
  if (scenario_.poison.count(o.data_position) &&
      !(scenario_.poison_needs_full_lr && Rung(generation) >= 1)) {
    spike = true;
    auto slots = scenario_.poison_slots.find(o.data_position);
    if (slots != scenario_.poison_slots.end()) {
      std::set<int32_t> masked;
      for (const v1::SampleMask& m : plan.masks()) {
        if (m.position() == o.data_position) masked.insert(m.slots().begin(), m.slots().end());
      }
      spike = false;
      for (int32_t slot : slots->second) spike = spike || !masked.count(slot);
    }
  }
  if (scenario_.fragile_until_rung > 0 && step == scenario_.onset &&
      Rung(generation) < scenario_.fragile_until_rung &&
      (!scenario_.fragile_on_onset_batch_only || o.data_position == scenario_.onset)) {
    spike = true;
  }
  if (scenario_.transient && generation == 1 && step == scenario_.onset) spike = true;
  if (!scenario_.spike_needs_all.empty() && o.data_position == *scenario_.spike_needs_all.rbegin()) {
    bool all = true;
    for (int64_t x : scenario_.spike_needs_all) all = all && StepOfPosition(plan, x) >= 0;
    if (all) spike = true;
  }
  if (scenario_.late_spike_step > 0 && generation != 1 && step == scenario_.late_spike_step) {
    spike = true;
  }
  if (spike) {
    if (scenario_.grad_spike) {
      o.grad_norm *= 10;
    } else {
      o.loss = 6.0;
    }
    o.max_loss_rank = 5;
  }
  if (scenario_.nonfinite && step == scenario_.onset) {
    o.loss = std::numeric_limits<double>::quiet_NaN();
    o.nonfinite_count = 1;
    o.first_nonfinite_layer = scenario_.nonfinite_layer;
  }
  if (scenario_.nondeterministic && generation != 1) o.loss += 1e-9;
  uint64_t bits = 0;
  std::memcpy(&bits, &o.loss, sizeof(bits));
  o.loss_hash = bits * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(step);
  return o;
}

void World::SeedOriginal(int64_t last) {
  for (int64_t s = 0; s <= last; ++s) view_->steps[1][s] = Make(1, s);
  next_step[1] = last + 1;
}

void World::Feed(IncidentEngine* engine, const std::string& run, int64_t generation, int64_t from,
                 int64_t to) {
  for (int64_t s = from; s <= to; ++s) {
    StepObservation o = Make(generation, s);
    view_->steps[generation][s] = o;
    EXPECT_TRUE(engine->OnStep(run, o).ok());
  }
}

int World::Pump(IncidentEngine* engine, const std::string& run, int64_t max_step) {
  int fed = 0;
  for (int i = 0; i < 100000; ++i) {
    if (controller_->paused) break;
    const int64_t gen = controller_->current_generation;
    auto spec = controller_->spec_of.find(gen);
    // A checkpoint at step c holds the state after steps 0..c-1: c runs first.
    const int64_t start = spec == controller_->spec_of.end() ? 0 : spec->second.checkpoint.step;
    auto [it, fresh] = next_step.try_emplace(gen, start);
    int64_t limit = max_step;
    if (spec != controller_->spec_of.end() && !controller_->continued.count(gen) &&
        spec->second.stop_after_step > 0) {
      limit = std::min(limit, spec->second.stop_after_step);
    }
    if (auto c = cap.find(gen); c != cap.end()) limit = std::min(limit, c->second);
    if (spec != controller_->spec_of.end() && missing_uris.count(spec->second.checkpoint.uri)) {
      if (!failed_.insert(gen).second) break;
      absl::Status s = engine->OnCommandFailed(
          run, spec->second.request_id,
          absl::StrCat("rank 0: cannot open checkpoint ", spec->second.checkpoint.uri));
      EXPECT_TRUE(s.ok()) << s;
      continue;
    }
    if (final_step) limit = std::min(limit, *final_step);
    if (it->second > limit) {
      if (final_step && it->second > *final_step && ended_.insert(gen).second) {
        absl::Status s = engine->OnGenerationEnded(run, gen, *final_step,
                                                   "end of training schedule");
        EXPECT_TRUE(s.ok()) << s;
        continue;
      }
      break;
    }
    const StepObservation o = Make(gen, it->second);
    view_->steps[gen][o.step] = o;
    ++it->second;
    ++fed;
    // The checkpoint a rewind asked for, registered once the step before
    // it ran (as the workers do).
    if (save_asked_checkpoints && spec != controller_->spec_of.end() &&
        spec->second.checkpoint_at_step == it->second) {
      view_->checkpoints.push_back({gen, it->second,
                                    absl::StrCat("file:///ckpt/g", gen, "-", it->second), "sum",
                                    true});
    }
    absl::Status s = engine->OnStep(run, o);
    EXPECT_TRUE(s.ok()) << s;
  }
  return fed;
}

}  // namespace spikeguard::incident::testing
