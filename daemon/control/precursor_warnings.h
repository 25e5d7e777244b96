// precursor_warnings.h
// -----------------------------------------------------------------------------
// Precursor warnings: a critical precursor that persisted (a max attention
// logit at or past the policy's attn_logit_critical for persistence_steps
// steps) kept as a thing of its own with a state, so an operator sees it
// before the spike it announces:
//
//   active ──(signal under the warn level for persistence_steps steps)──▶ cleared
//      └────(an incident opens on the run while it is active)──────────▶ preceded
//
// One warning per episode of a (run, line of generations, signal, layer): a
// critical event on a generation whose ancestry holds a warning of the same
// series that is active continues it (a rewind replays the same steps), and
// one whose ancestry holds a warning that preceded an incident belongs to
// that incident (its probes see the same logits again). A cleared warning
// ends its episode; the next critical event opens a new one.
//
// Each warning is in the catalog (table precursor_warnings), written when it
// opens, changes state, and every kPersistEvery steps while active; the
// tracker holds the live copy of the active ones (last step, peak) for
// readers in between. A daemon restart loads the active ones back (Load).
//
//   WarningTracker warnings(catalog, clock);
//   warnings.SetListener([](const v1::PrecursorWarning& w, std::string_view kind) { ... });
//   // on the run's pipeline, for each record:
//   warnings.OnCritical(run, gen, event, levels, on_line);   // a critical precursor event
//   warnings.OnStep(run, record, on_line);                   // every record
//   warnings.OnIncidentOpened(run, incident_id, onset_step); // the engine opened one
//
// Calls for one run come from that run's pipeline, in step order; calls for
// different runs may come from different threads. No lock is held across a
// catalog write or the listener.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/detect/run_monitor.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class WarningTracker {
 public:
  // While active, the stored record is refreshed at most this many steps apart.
  static constexpr int64_t kPersistEvery = 32;

  // The policy's levels for one critical event.
  struct Levels {
    double critical = 1e4;
    // The warning clears once the signal stays under this for `persistence_steps`.
    double clear_below = 1e3;
    int persistence_steps = 5;
  };
  // Whether generation `descendant` is `ancestor` or descends from it.
  using OnLine = std::function<bool(int64_t ancestor, int64_t descendant)>;
  // Told after a warning opened, cleared or preceded an incident is durable;
  // `kind` is "warning_opened", "warning_cleared" or "warning_preceded_incident".
  using Listener = std::function<void(const spikeguard::v1::PrecursorWarning&, std::string_view kind)>;

  explicit WarningTracker(storage::Catalog* catalog) : catalog_(catalog) {}

  void SetListener(Listener listener) { listener_ = std::move(listener); }

  // Loads the active warnings of every run from the catalog (after a restart).
  absl::Status Load();

  // A critical precursor event (MonitorEvent::kPrecursor, kLevelCritical) at
  // `generation`: opens a warning, or continues the episode it belongs to.
  void OnCritical(const std::string& run, int64_t generation, const detect::MonitorEvent& e,
                  const Levels& levels, const OnLine& on_line);
  // Every record of the run: its active warnings on the record's line take
  // the value of their series (last step, peak), and clear.
  void OnStep(const std::string& run, const spikeguard::v1::StepRecord& record,
              const OnLine& on_line);
  // An incident opened on `run`: its active warnings preceded it.
  void OnIncidentOpened(const std::string& run, int64_t incident_id, int64_t onset_step);

  // The live copies of the run's active warnings ("": every run).
  std::vector<spikeguard::v1::PrecursorWarning> Active(const std::string& run = "");

 private:
  struct Tracked {
    spikeguard::v1::PrecursorWarning w;
    int below_run = 0;
    int persistence_steps = 5;
    int64_t persisted_step = 0;
  };
  // The catalog write (create when id is 0) and the listener, no lock held.
  void Write(spikeguard::v1::PrecursorWarning* w, std::string_view kind);

  storage::Catalog* const catalog_;
  Listener listener_;
  absl::Mutex mu_;
  // Active warnings by id, per run.
  std::map<std::string, std::map<int64_t, Tracked>> active_ ABSL_GUARDED_BY(mu_);
  // Warnings that preceded an incident or cleared, per run, as (generation,
  // signal, layer, state): the episodes a later critical event may belong to.
  struct Ended {
    int64_t generation;
    std::string signal;
    int layer;
    spikeguard::v1::WarningState state;
  };
  std::map<std::string, std::vector<Ended>> ended_ ABSL_GUARDED_BY(mu_);
};

// The value of a series in a record: "max_attn_logit", "grad_norm",
// "update_ratio", "act_rms" per layer (layer ≥ 0), or the run-level
// "grad_norm", "lse_mean", "lse_max"; NaN when the record has none.
double SeriesValue(const spikeguard::v1::StepRecord& record, const std::string& signal, int layer);

}  // namespace spikeguard::daemon
