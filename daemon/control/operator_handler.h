// operator_handler.h
// -----------------------------------------------------------------------------
// What an operator can ask of the daemon (spikeguard.v1.SupervisorService),
// as domain calls: runs, checkpoints, telemetry, incidents, manual actions,
// policy, manifests, quarantine and the audit log. Each call takes domain
// arguments and returns absl::StatusOr; no gRPC type appears here, so the
// calls are tested without a server (tests/daemon/operator_handler_test.cc)
// and the gRPC service (daemon/server/supervisor_service) only authorizes,
// unpacks, calls and packs.
//
// Every value is validated here: invalid input is INVALID_ARGUMENT with a
// message naming the request field it came from, the same whichever front
// end calls. Manual rewinds, replays and skips are refused while an incident
// probe runs on the run, and are idempotent by request id.
//
//   DaemonOperatorHandler handler(&state);
//   absl::StatusOr<v1::Run> run = handler.CreateRun({.name = "gpt-7b", .world_size = 8});
//   absl::StatusOr<ActionResult> r = handler.Rewind({.run = "gpt-7b", .to_step = 1200});
//
// Field names: the handler, not the transport, puts them in its messages;
// its arguments are named after the request's fields and a list argument's
// position names the element (the second skip window is "skip[1]"). The
// transport only authorizes and converts, so every check is tested here.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/auth/tokens.h"
#include "base/clock.h"
#include "daemon/ingest/counters.h"
#include "daemon/ingest/limits.h"
#include "daemon/ingest/run_registry.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {

class Supervisor;
class Launcher;
class LaunchProfiles;
class CheckpointGuard;

// Metric names QueryTelemetry accepts: every StepRecord field, plus the
// per-layer stats by name ("max_attn_logit", "update_ratio", ...).
absl::Status ValidateMetricNames(const google::protobuf::RepeatedPtrField<std::string>& metrics);
// Keeps only the requested metrics (and the step's identity fields).
spikeguard::v1::StepRecord FilterMetrics(
    const spikeguard::v1::StepRecord& record,
    const google::protobuf::RepeatedPtrField<std::string>& metrics);

// One page of a list; `next_page_token` is "" after the last page. Pages
// are cut under Limits::max_response_bytes.
template <class T>
struct Page {
  std::vector<T> items;
  std::string next_page_token;
};

// Steps from..to, inclusive.
struct StepWindow {
  int64_t from_step = 0;
  int64_t to_step = 0;
};

// A new run (CreateRunRequest's fields).
struct NewRun {
  std::string name;
  uint32_t world_size = 0;
  spikeguard::v1::Mode mode = spikeguard::v1::MODE_UNSPECIFIED;
  spikeguard::v1::RunSpec spec;
  // Start its workers now (by its launch profile).
  bool launch = false;
};

// QueryTelemetryRequest's fields; unset optionals mean "to the end" and
// "the run's current generation"; limit 0 means the default.
struct TelemetryQuery {
  std::string run;
  int64_t from_step = 0;
  std::optional<int64_t> to_step;
  std::optional<int64_t> generation;
  int32_t limit = 0;
  google::protobuf::RepeatedPtrField<std::string> metrics;
};

// A telemetry answer cut by rows or bytes says where to ask again from.
struct TelemetryPage {
  std::vector<spikeguard::v1::StepRecord> records;
  bool truncated = false;
  int64_t next_from_step = 0;
};

// A manual rewind: to the newest checkpoint at or before `to_step`, the
// `skip` windows cut out of the data plan, stopping after `stop_after_step`
// (0: never).
struct RewindArgs {
  std::string run;
  int64_t to_step = 0;
  std::vector<StepWindow> skip;
  int64_t stop_after_step = 0;
  // The caller's id for idempotence; "" gives a fresh one.
  std::string request_id;
};

// An accepted manual action.
struct ActionResult {
  std::string message;
  int64_t generation = 0;
  std::string command_id;
};

// ListAuditRequest's fields: limit 0 pages through everything.
struct AuditQuery {
  std::string run;
  std::string principal;
  int64_t since_unix_ms = 0;
  int32_t limit = 0;
  std::string page_token;
};

// A live feed of incident updates (WatchIncidents). Destroying it ends the
// subscription.
class IncidentSubscription {
 public:
  virtual ~IncidentSubscription() = default;
  // Waits up to `wait` for updates the subscriber may see; nullopt once the
  // feed is closed (the daemon stops). An empty batch is a timeout.
  virtual std::optional<std::vector<spikeguard::v1::IncidentUpdate>> Next(absl::Duration wait) = 0;
};

class OperatorHandler {
 public:
  virtual ~OperatorHandler() = default;

  // Version, uptime, catalog and counters (not who is asking: the transport
  // knows about authentication).
  virtual absl::StatusOr<spikeguard::v1::ServerStatus> GetStatus() = 0;

  // --- Runs ------------------------------------------------------------------
  virtual absl::StatusOr<spikeguard::v1::Run> CreateRun(const NewRun& run) = 0;
  // With the ranks' live state where the daemon has it.
  virtual absl::StatusOr<spikeguard::v1::Run> GetRun(const std::string& name) = 0;
  // The runs `who` may use.
  virtual absl::StatusOr<Page<spikeguard::v1::Run>> ListRuns(const auth::Principal& who,
                                                             const std::string& page_token) = 0;
  // Maps a run to a launch profile: the spec's command, env and workdir are
  // dropped, its profile and params set (validated as CreateRun does); the
  // run is launched from the profile the next time it is launched.
  virtual absl::StatusOr<spikeguard::v1::Run> SetRunProfile(
      const std::string& run, const std::string& profile,
      const std::map<std::string, std::string>& params) = 0;

  // --- Checkpoints and telemetry -----------------------------------------------
  virtual absl::StatusOr<Page<spikeguard::v1::Checkpoint>> ListCheckpoints(
      const std::string& run, const std::string& page_token) = 0;
  // Confined to the run's checkpoint root before anything is stored.
  virtual absl::StatusOr<spikeguard::v1::Checkpoint> RegisterCheckpoint(
      const spikeguard::v1::Checkpoint& checkpoint) = 0;
  virtual absl::StatusOr<spikeguard::v1::Checkpoint> PinCheckpoint(const std::string& run,
                                                                   int64_t step, bool pinned) = 0;
  virtual absl::StatusOr<TelemetryPage> QueryTelemetry(const TelemetryQuery& query) = 0;

  // --- Incidents ---------------------------------------------------------------
  // Those of `filter` that `who` may see.
  virtual absl::StatusOr<Page<spikeguard::v1::Incident>> ListIncidents(
      const auth::Principal& who, const storage::IncidentFilter& filter,
      const std::string& page_token) = 0;
  // Live state where the engine has it; with its events and document previews.
  virtual absl::StatusOr<spikeguard::v1::Incident> GetIncident(int64_t id) = 0;
  // Updates of `run` ("" = every run `who` may see), from now on: the
  // incidents' events and the precursor warnings' openings and clearings.
  virtual absl::StatusOr<std::unique_ptr<IncidentSubscription>> WatchIncidents(
      const auth::Principal& who, const std::string& run) = 0;
  // Precursor warnings of `filter` that `who` may see, by id; the active
  // ones as the supervisor has them now.
  virtual absl::StatusOr<Page<spikeguard::v1::PrecursorWarning>> ListWarnings(
      const auth::Principal& who, const storage::WarningFilter& filter,
      const std::string& page_token) = 0;
  virtual absl::StatusOr<ActionResult> Approve(int64_t incident_id) = 0;
  virtual absl::StatusOr<ActionResult> Abort(int64_t incident_id, const std::string& reason) = 0;

  // --- Manual actions ------------------------------------------------------------
  virtual absl::StatusOr<ActionResult> Rewind(const RewindArgs& args) = 0;
  // Rewinds to `from_step` and trains the same data again.
  virtual absl::StatusOr<ActionResult> Replay(const std::string& run, int64_t from_step,
                                              int64_t stop_after_step,
                                              const std::string& request_id) = 0;
  // Rewinds to window.from_step with the window's data cut out.
  virtual absl::StatusOr<ActionResult> Skip(const std::string& run, StepWindow window,
                                            const std::string& request_id) = 0;
  virtual absl::StatusOr<ActionResult> Pause(const std::string& run) = 0;
  virtual absl::StatusOr<ActionResult> Resume(const std::string& run) = 0;

  // --- Policy, manifest, quarantine, audit ---------------------------------------
  // "" = the daemon's default policy.
  virtual absl::StatusOr<spikeguard::v1::Policy> GetPolicy(const std::string& run) = 0;
  // Merges `policy` over the effective one; returns the new effective policy.
  virtual absl::StatusOr<spikeguard::v1::Policy> SetPolicy(
      const std::string& run, const spikeguard::v1::Policy& policy) = 0;
  virtual absl::StatusOr<std::vector<spikeguard::v1::ResolvedStep>> ResolveManifest(
      const std::string& run, int64_t generation, int64_t from_step, int64_t to_step) = 0;
  virtual absl::StatusOr<Page<spikeguard::v1::QuarantineEntry>> ListQuarantine(
      const std::string& run, const std::string& page_token) = 0;
  virtual absl::StatusOr<spikeguard::v1::QuarantineEntry> AddQuarantine(
      const spikeguard::v1::QuarantineEntry& entry) = 0;
  // Newest first.
  virtual absl::StatusOr<Page<spikeguard::v1::AuditEntry>> ListAudit(const AuditQuery& query) = 0;
};

// The daemon's handler: the operations over the catalog, the supervisor,
// the launcher, the launch profiles and the checkpoint guard.
class DaemonOperatorHandler final : public OperatorHandler {
 public:
  // What the handler uses; everything outlives it. A component that is null
  // (a test builds the handler without it) answers UNAVAILABLE where it is
  // needed.
  struct Deps {
    storage::Catalog* catalog = nullptr;
    // The catalog's file, for the status.
    std::string catalog_path;
    Clock* clock = nullptr;
    Limits limits;
    // The live ranks, merged into the runs' rank lists.
    RunRegistry* registry = nullptr;
    Counters* counters = nullptr;
    Supervisor* supervisor = nullptr;
    Launcher* launcher = nullptr;
    LaunchProfiles* profiles = nullptr;
    CheckpointGuard* checkpoints = nullptr;
    // For the status: whether the daemon serves TLS, and since when.
    bool tls = false;
    absl::Time started;
  };

  explicit DaemonOperatorHandler(Deps deps) : deps_(std::move(deps)) {}

  absl::StatusOr<spikeguard::v1::ServerStatus> GetStatus() override;
  absl::StatusOr<spikeguard::v1::Run> CreateRun(const NewRun& run) override;
  absl::StatusOr<spikeguard::v1::Run> GetRun(const std::string& name) override;
  absl::StatusOr<Page<spikeguard::v1::Run>> ListRuns(const auth::Principal& who,
                                                     const std::string& page_token) override;
  absl::StatusOr<spikeguard::v1::Run> SetRunProfile(
      const std::string& run, const std::string& profile,
      const std::map<std::string, std::string>& params) override;
  absl::StatusOr<Page<spikeguard::v1::Checkpoint>> ListCheckpoints(
      const std::string& run, const std::string& page_token) override;
  absl::StatusOr<spikeguard::v1::Checkpoint> RegisterCheckpoint(
      const spikeguard::v1::Checkpoint& checkpoint) override;
  absl::StatusOr<spikeguard::v1::Checkpoint> PinCheckpoint(const std::string& run, int64_t step,
                                                           bool pinned) override;
  absl::StatusOr<TelemetryPage> QueryTelemetry(const TelemetryQuery& query) override;
  absl::StatusOr<Page<spikeguard::v1::Incident>> ListIncidents(
      const auth::Principal& who, const storage::IncidentFilter& filter,
      const std::string& page_token) override;
  absl::StatusOr<spikeguard::v1::Incident> GetIncident(int64_t id) override;
  absl::StatusOr<std::unique_ptr<IncidentSubscription>> WatchIncidents(
      const auth::Principal& who, const std::string& run) override;
  absl::StatusOr<Page<spikeguard::v1::PrecursorWarning>> ListWarnings(
      const auth::Principal& who, const storage::WarningFilter& filter,
      const std::string& page_token) override;
  absl::StatusOr<ActionResult> Approve(int64_t incident_id) override;
  absl::StatusOr<ActionResult> Abort(int64_t incident_id, const std::string& reason) override;
  absl::StatusOr<ActionResult> Rewind(const RewindArgs& args) override;
  absl::StatusOr<ActionResult> Replay(const std::string& run, int64_t from_step,
                                      int64_t stop_after_step,
                                      const std::string& request_id) override;
  absl::StatusOr<ActionResult> Skip(const std::string& run, StepWindow window,
                                    const std::string& request_id) override;
  absl::StatusOr<ActionResult> Pause(const std::string& run) override;
  absl::StatusOr<ActionResult> Resume(const std::string& run) override;
  absl::StatusOr<spikeguard::v1::Policy> GetPolicy(const std::string& run) override;
  absl::StatusOr<spikeguard::v1::Policy> SetPolicy(const std::string& run,
                                                   const spikeguard::v1::Policy& policy) override;
  absl::StatusOr<std::vector<spikeguard::v1::ResolvedStep>> ResolveManifest(
      const std::string& run, int64_t generation, int64_t from_step, int64_t to_step) override;
  absl::StatusOr<Page<spikeguard::v1::QuarantineEntry>> ListQuarantine(
      const std::string& run, const std::string& page_token) override;
  absl::StatusOr<spikeguard::v1::QuarantineEntry> AddQuarantine(
      const spikeguard::v1::QuarantineEntry& entry) override;
  absl::StatusOr<Page<spikeguard::v1::AuditEntry>> ListAudit(const AuditQuery& query) override;

 private:
  // The rewind every manual action comes down to; `to_step`,
  // `stop_after_step` and the skip windows' shape already checked.
  absl::StatusOr<ActionResult> ManualRewind(const RewindArgs& args, const std::string& kind,
                                            const std::string& reason);
  // A run a command can be sent to now: a valid name, a Supervisor to send
  // it, a stored run (checked in that order).
  absl::Status CheckCommandable(const std::string& run);
  // A run name that is valid and names a stored run.
  absl::StatusOr<spikeguard::v1::Run> ExistingRun(const std::string& name);

  const Deps deps_;
};

}  // namespace spikeguard::daemon
