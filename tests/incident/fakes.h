// fakes.h
// -----------------------------------------------------------------------------
// Scripted in-memory implementations of the incident engine's three
// interfaces, plus a tiny simulated training world, so every branch of the
// protocol runs without real time, processes or sockets.
//
// The world computes each step's loss from (generation, step, data position,
// hparams) through a Scenario: poisoned data positions (DATA), a spike at a
// step whatever the data unless the fix rung is strong enough (FRAGILITY), a
// one-off spike in the original generation only (TRANSIENT), non-finite
// values (NUMERICS), and replays whose loss bits differ (non-determinism).
// World::Pump() plays the workers: it runs the controller's current
// generation up to its horizon (or further once continued).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/incident/engine.h"
#include "daemon/incident/policy.h"

namespace spikeguard::incident::testing {

// Records every command; idempotent by request id like the real controller.
class FakeController final : public RunController {
 public:
  absl::StatusOr<int64_t> Rewind(const std::string& run, const RewindSpec& spec) override;
  absl::Status Continue(const std::string& run, const std::string& request_id,
                        const std::optional<spikeguard::v1::HParams>& hparams) override;
  absl::Status Pause(const std::string& run, const std::string& request_id) override;

  // Every call, repeats included.
  int rewind_calls = 0;
  std::vector<std::string> continue_calls;
  std::vector<std::string> pause_calls;
  // Rewinds executed once per request id, in order.
  std::vector<RewindSpec> executed;
  std::map<std::string, int64_t> generation_of;
  std::map<int64_t, RewindSpec> spec_of;
  // The workers' state.
  int64_t current_generation = 1;
  std::set<int64_t> continued;
  bool paused = false;
  // Fails the next Rewind with this status (then clears it).
  absl::Status fail_next_rewind;
  // The generation tree the rewinds made, as the daemon records it: each
  // new generation's parent is the generation whose checkpoint it started
  // from, its branch step that checkpoint's step.
  std::vector<spikeguard::v1::Generation> tree;

  std::set<std::string> UniqueContinues() const {
    return {continue_calls.begin(), continue_calls.end()};
  }
};

class FakeView final : public RunView {
 public:
  absl::StatusOr<std::vector<CheckpointInfo>> Checkpoints(const std::string& run) override;
  absl::StatusOr<std::vector<StepObservation>> Steps(const std::string& run, int64_t generation,
                                                     int64_t from, int64_t to) override;
  absl::StatusOr<spikeguard::v1::DataPlan> Plan(const std::string& run, int64_t generation) override;
  absl::StatusOr<std::vector<spikeguard::v1::DocumentRef>> Documents(const std::string& run,
                                                                     int64_t generation,
                                                                     int64_t from,
                                                                     int64_t to) override;
  uint32_t WorldSize(const std::string& run) override { return world_size; }
  spikeguard::v1::Policy PolicyFor(const std::string& run) override { return policy; }
  absl::StatusOr<spikeguard::v1::HParams> HParams(const std::string& run,
                                                  int64_t generation) override {
    auto it = hparams.find(generation);
    return it == hparams.end() ? spikeguard::v1::HParams() : it->second;
  }
  std::optional<int64_t> FinalStep(const std::string& run) override { return final_step; }
  // The controller's generation tree when `tree_of` is set; none otherwise
  // (the engine then counts every generation up to the watched one).
  absl::StatusOr<std::vector<spikeguard::v1::Generation>> Generations(
      const std::string& run) override {
    if (tree_of == nullptr) return std::vector<spikeguard::v1::Generation>();
    return tree_of->tree;
  }
  const FakeController* tree_of = nullptr;
  // One near-duplicate per document: id + 50000, similarity 0.9.
  absl::StatusOr<std::vector<spikeguard::v1::NearDuplicate>> NearDuplicates(
      const std::string& run, const std::vector<spikeguard::v1::DocumentRef>& documents) override;

  // Eight samples per batch p: slots 0-2 hold document 10p, slot 3 holds
  // the end of 10p and the start of 10p + 1, slots 4-7 hold 10p + 1.
  absl::StatusOr<std::vector<SampleContent>> Samples(const std::string& run, int64_t generation,
                                                     int64_t position) override;

  // The later batches carrying each document id (held out by a DATA fix);
  // FAILED_PRECONDITION without a manifest.
  absl::StatusOr<std::vector<Carrier>> Carriers(
      const std::string& run, const std::vector<spikeguard::v1::DocumentRef>& documents,
      int64_t from, int64_t to) override;
  std::map<int64_t, std::vector<Carrier>> carriers;
  bool carriers_known = true;
  // Documents each Carriers call asked for.
  std::vector<std::vector<int64_t>> carrier_queries;

  std::map<int64_t, spikeguard::v1::HParams> hparams;
  std::optional<int64_t> final_step;

  std::vector<CheckpointInfo> checkpoints;
  std::map<int64_t, std::map<int64_t, StepObservation>> steps;
  std::map<int64_t, spikeguard::v1::DataPlan> plans;
  uint32_t world_size = 8;
  spikeguard::v1::Policy policy;
  // Two documents per data position: ids 10·p and 10·p + 1.
  bool has_manifest = true;
};

class FakeStore final : public IncidentStore {
 public:
  absl::StatusOr<int64_t> CreateIncident(const std::string& run,
                                         const spikeguard::v1::Incident& incident) override;
  absl::Status SaveIncident(const spikeguard::v1::Incident& incident) override;
  absl::StatusOr<int64_t> AppendEvent(int64_t incident_id, const std::string& kind,
                                      const std::string& payload) override;
  absl::StatusOr<std::vector<StoredEvent>> Events(int64_t incident_id) override;
  absl::StatusOr<std::vector<spikeguard::v1::Incident>> OpenIncidents() override;
  absl::StatusOr<std::vector<spikeguard::v1::Incident>> RunIncidents(
      const std::string& run) override;
  absl::Status Quarantine(const spikeguard::v1::QuarantineEntry& entry) override;
  absl::Status PinCheckpoint(const std::string& run, int64_t step, bool pinned) override {
    pins[step] = pinned;
    return absl::OkStatus();
  }

  // Checkpoint step -> pinned now.
  std::map<int64_t, bool> pins;
  std::map<int64_t, spikeguard::v1::Incident> incidents;
  std::map<int64_t, std::vector<StoredEvent>> events;
  std::vector<spikeguard::v1::QuarantineEntry> quarantine;
  int64_t next_id = 1;
  int64_t next_seq = 1;
  // AppendEvent of this kind fails once (a crash right before it).
  std::string fail_append_kind;
};

struct Scenario {
  int64_t onset = 1000;
  // Data positions whose batch spikes the loss (DATA).
  std::set<int64_t> poison = {};
  // ...unless the generation runs with an lr scale (data × state).
  bool poison_needs_full_lr = false;
  // A spike at `onset` in every generation whose fix rung is below this
  // (FRAGILITY); 0 = none.
  int fragile_until_rung = 0;
  // ...and only on the batch the original fed there (data × state): a skip
  // that moves the data past the onset does not spike there.
  bool fragile_on_onset_batch_only = false;
  // A one-off spike at `onset` in generation 1 only (TRANSIENT).
  bool transient = false;
  // Non-finite loss at `onset` in every generation (NUMERICS).
  bool nonfinite = false;
  int nonfinite_layer = 3;
  // Replays' losses differ in the last bits (non-determinism).
  bool nondeterministic = false;
  // Poisoned positions whose trigger is only in these sample slots: a plan
  // masking all of them feeds the batch clean.
  std::map<int64_t, std::set<int32_t>> poison_slots = {};
  // Spike the grad norm instead of the loss.
  bool grad_spike = false;
  // A spike (at the step consuming the last of them) only when every one of
  // these positions is fed: no single batch triggers it alone.
  std::set<int64_t> spike_needs_all = {};
  // A spike at this step in every generation but the original (0 = none):
  // the fix does not hold.
  int64_t late_spike_step = 0;
};

class World {
 public:
  World(FakeController* controller, FakeView* view, Scenario scenario)
      : controller_(controller), view_(view), scenario_(scenario) {}

  // The original generation 1, steps [0, last], straight into the view.
  void SeedOriginal(int64_t last);
  StepObservation Make(int64_t generation, int64_t step) const;
  // Runs the workers: feeds `engine` the steps of the current generation up
  // to its horizon (up to `max_step` once continued), following rewinds,
  // until nothing moves. Returns the number of steps fed.
  int Pump(IncidentEngine* engine, const std::string& run, int64_t max_step);
  // Feeds steps [from, to] of one generation (no following).
  void Feed(IncidentEngine* engine, const std::string& run, int64_t generation, int64_t from,
            int64_t to);

  std::map<int64_t, int64_t> next_step;
  // Per-generation last step the workers may run (a crash point in tests).
  std::map<int64_t, int64_t> cap;
  // The workers' schedule ends after this step: each generation that gets
  // there tells the engine (GenerationEnded) and stops.
  std::optional<int64_t> final_step;
  // Checkpoints the workers no longer have: a rewind there fails on the
  // worker (OnCommandFailed) and the generation never runs.
  std::set<std::string> missing_uris;
  // The workers save the checkpoint a rewind asks for (checkpoint_at_step);
  // off, they ignore the request (an older trainer).
  bool save_asked_checkpoints = false;

 private:
  int Rung(int64_t generation) const;
  std::set<int64_t> ended_;
  std::set<int64_t> failed_;

  FakeController* controller_;
  FakeView* view_;
  Scenario scenario_;
};

}  // namespace spikeguard::incident::testing
