// run_store.h
// -----------------------------------------------------------------------------
// Runs and their generations (tables `runs`, `generations`): a run's row,
// its state and spec, the data order its workers reported, and the tree of
// timelines it went through. Generation 0 is made with the run; every later
// one names its parent and becomes the run's current generation.
//
//   RunStore runs(db, clock);
//   SG_ASSIGN_OR_RETURN(int64_t id, runs.Create(run));  // and generation 0
//   SG_ASSIGN_OR_RETURN(v1::Run stored, runs.Get("gpt-7b"));
//
// Errors: NOT_FOUND for an unknown run or generation; ALREADY_EXISTS for a
// duplicate run name or generation; INVALID_ARGUMENT for an empty name, an
// unknown state or a negative step count; DATA_LOSS for a row whose state
// is not a run state's name (the message names the run and the value).
//
// The state column holds the state's name (RunStateName, "running"), not
// its number; see docs/ARCHITECTURE.md, "The catalog schema".
//
// Like every store, it is not thread-safe and opens no transaction: its
// owner (Catalog) holds the lock and the transaction around each call.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/database.h"

namespace spikeguard::storage {

// Which run of a name this is (`incarnation`: 32 random hex digits made with
// the run, so a later run of the same name has another) and its state: what
// a launched worker's token is checked against.
struct RunIncarnation {
  std::string incarnation;
  v1::RunState state = v1::RUN_STATE_UNSPECIFIED;
};

class RunStore {
 public:
  RunStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  // Stores name, mode, world_size, state (default RUN_CREATED), spec and
  // created_unix_ms (default now), and generation 0 (parent -1, reason
  // "initial"). Returns the run's id.
  absl::StatusOr<int64_t> Create(const v1::Run& run);
  // The run's row and its generations (no ranks: rank progress is the step
  // store's).
  absl::StatusOr<v1::Run> Get(std::string_view name);
  absl::StatusOr<RunIncarnation> Incarnation(std::string_view name);
  // All runs by id, without generations or ranks.
  absl::StatusOr<std::vector<v1::Run>> List();

  // The run's id and current generation.
  struct Key {
    int64_t id = 0;
    int64_t current_generation = 0;
  };
  absl::StatusOr<Key> Lookup(std::string_view name);

  // Any state but RUN_STATE_UNSPECIFIED.
  absl::Status SetState(std::string_view name, v1::RunState state);
  absl::Status SetLastStep(std::string_view name, int64_t last_step);
  absl::Status SetSpec(std::string_view name, const v1::RunSpec& spec);
  absl::Status SetDataOrder(std::string_view name, const v1::DataOrder& order,
                            int64_t total_steps);

  // g.generation <= 0 assigns the next number. The parent must exist. Also
  // makes it the run's current generation.
  absl::StatusOr<v1::Generation> CreateGeneration(std::string_view run, const v1::Generation& g);
  // By generation number.
  absl::StatusOr<std::vector<v1::Generation>> Generations(int64_t run_id);
  // OK when the run (id, for the message its name) has that generation.
  absl::Status RequireGeneration(int64_t run_id, std::string_view run, int64_t generation);

 private:
  absl::StatusOr<v1::Generation> InsertGeneration(int64_t run_id, std::string_view run,
                                                  v1::Generation g);

  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
