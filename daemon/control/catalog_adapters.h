// catalog_adapters.h
// -----------------------------------------------------------------------------
// The incident engine's view of the world (RunView) and its persistence
// (IncidentStore), backed by the catalog. Documents of a step window are
// resolved through the run's manifest with the same data-order code the
// worker trains with (storage/corpus), without asking a worker.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/incident/engine.h"
#include "daemon/launch/checkpoint_guard.h"
#include "storage/catalog/catalog.h"
#include "storage/corpus/corpus.h"
#include "storage/corpus/data_order.h"
#include "storage/corpus/near_duplicates.h"

namespace spikeguard::daemon {

// The policy in force for a run: the run's own, else the daemon default,
// else the built-in defaults.
spikeguard::v1::Policy EffectivePolicy(storage::Catalog* catalog, const std::string& run);

incident::StepObservation ToObservation(const spikeguard::v1::StepRecord& record);

class CatalogRunView final : public incident::RunView {
 public:
  // `guard`, when given: Checkpoints() returns only the checkpoints it
  // verifies (inside the run's checkpoint root, file there, checksum
  // matching); each one left out is logged with the reason. `profiles`, when
  // given: a run's corpus dir is read only after LaunchProfiles::CorpusDir
  // confines it again (every manifest resolution, not only the run's
  // creation): a dir replaced since by a symlink leading out of its
  // profile's corpus_root is refused, naming it.
  explicit CatalogRunView(storage::Catalog* catalog, CheckpointGuard* guard = nullptr,
                          LaunchProfiles* profiles = nullptr)
      : guard_(guard), catalog_(catalog), profiles_(profiles) {}

  absl::StatusOr<std::vector<incident::CheckpointInfo>> Checkpoints(const std::string& run) override;
  absl::StatusOr<std::vector<incident::StepObservation>> Steps(const std::string& run,
                                                              int64_t generation, int64_t from,
                                                              int64_t to) override;
  absl::StatusOr<spikeguard::v1::DataPlan> Plan(const std::string& run, int64_t generation) override;
  absl::StatusOr<std::vector<spikeguard::v1::Generation>> Generations(
      const std::string& run) override {
    return catalog_->ListGenerations(run);
  }
  absl::StatusOr<std::vector<spikeguard::v1::DocumentRef>> Documents(const std::string& run,
                                                                     int64_t generation,
                                                                     int64_t from,
                                                                     int64_t to) override;
  uint32_t WorldSize(const std::string& run) override;
  spikeguard::v1::Policy PolicyFor(const std::string& run) override;
  absl::StatusOr<spikeguard::v1::HParams> HParams(const std::string& run,
                                                  int64_t generation) override;
  std::optional<int64_t> FinalStep(const std::string& run) override;
  absl::StatusOr<std::vector<incident::SampleContent>> Samples(const std::string& run,
                                                               int64_t generation,
                                                               int64_t position) override;
  absl::StatusOr<std::vector<incident::Carrier>> Carriers(
      const std::string& run, const std::vector<spikeguard::v1::DocumentRef>& documents,
      int64_t from, int64_t to) override;
  absl::StatusOr<std::vector<spikeguard::v1::NearDuplicate>> NearDuplicates(
      const std::string& run, const std::vector<spikeguard::v1::DocumentRef>& documents) override;

  // Steps [from, to] of a generation resolved to positions and documents:
  // from the run's manifest, or, without one, from the documents the
  // trainer reported with its steps (StepReport.documents); NOT_FOUND when
  // neither is there.
  absl::StatusOr<std::vector<spikeguard::v1::ResolvedStep>> Resolve(const std::string& run,
                                                                    int64_t generation,
                                                                    int64_t from, int64_t to);

 private:
  // What PolicyFor and WorldSize answer, kept until the catalog's
  // configuration changes (Catalog::config_version): an incident opening
  // reads them without waiting for the catalog's lock.
  struct RunConfig {
    int64_t version = -1;
    spikeguard::v1::Policy policy;
    uint32_t world_size = 1;
  };
  RunConfig ConfigOf(const std::string& run);
  // A position's samples from the documents the trainer reported per sample.
  absl::StatusOr<std::vector<incident::SampleContent>> ReportedSamples(const std::string& run,
                                                                       int64_t generation,
                                                                       int64_t position);
  // The run's corpus and manifest; NOT_FOUND when the run has none.
  absl::StatusOr<const storage::Corpus*> CorpusFor(const std::string& run,
                                                   storage::Manifest* manifest);

  CheckpointGuard* const guard_;
  storage::Catalog* const catalog_;
  LaunchProfiles* const profiles_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<storage::Corpus>> corpora_ ABSL_GUARDED_BY(mu_);
  // Built on the first query of a run (one pass over its corpus).
  std::map<std::string, std::unique_ptr<storage::NearDuplicateIndex>> near_duplicates_
      ABSL_GUARDED_BY(mu_);
  absl::Mutex config_mu_;
  std::map<std::string, RunConfig> configs_ ABSL_GUARDED_BY(config_mu_);
};

class CatalogIncidentStore final : public incident::IncidentStore {
 public:
  explicit CatalogIncidentStore(storage::Catalog* catalog) : catalog_(catalog) {}

  absl::StatusOr<int64_t> CreateIncident(const std::string& run,
                                         const spikeguard::v1::Incident& incident) override;
  absl::Status SaveIncident(const spikeguard::v1::Incident& incident) override;
  absl::StatusOr<int64_t> AppendEvent(int64_t incident_id, const std::string& kind,
                                      const std::string& payload) override;
  absl::StatusOr<int64_t> AppendAndSave(int64_t incident_id, const std::string& kind,
                                        const std::string& payload, const ApplyFn& apply,
                                        const DurableFn& durable) override;
  absl::StatusOr<int64_t> CreateWithEvent(const std::string& run,
                                          const spikeguard::v1::Incident& initial,
                                          const std::string& kind, const std::string& payload,
                                          const OpenFn& apply, const DurableFn& durable) override;
  absl::StatusOr<std::vector<StoredEvent>> Events(int64_t incident_id) override;
  absl::StatusOr<std::vector<spikeguard::v1::Incident>> OpenIncidents() override;
  absl::StatusOr<std::vector<spikeguard::v1::Incident>> RunIncidents(const std::string& run) override;
  absl::Status Quarantine(const spikeguard::v1::QuarantineEntry& entry) override;
  absl::Status PinCheckpoint(const std::string& run, int64_t step, bool pinned) override;

 private:
  storage::Catalog* const catalog_;
};

}  // namespace spikeguard::daemon
