// command_store.h
// -----------------------------------------------------------------------------
// Commands sent to workers (table `commands`), keyed by their id, which is
// the idempotency key: a command is stored before it is sent, and a resend
// of the same id with the same content is a no-op. Its state (v1::CommandState)
// moves through pending, sent, then acked or failed (final); the state column
// holds its name (CommandStateName, "sent"), see docs/ARCHITECTURE.md,
// "The catalog schema".
//
//   CommandStore commands(db, clock);
//   SG_RETURN_IF_ERROR(commands.Put("incident-3/1-replay", "gpt-7b", 4, "REWIND", bytes,
//                                   v1::COMMAND_PENDING));
//   SG_RETURN_IF_ERROR(commands.SetState("incident-3/1-replay", v1::COMMAND_SENT, ""));
//
// Errors: NOT_FOUND for an unknown run or command; ALREADY_EXISTS for an id
// reused with other content; INVALID_ARGUMENT for an empty id or an
// unspecified or unknown state; FAILED_PRECONDITION for leaving a final
// state; DATA_LOSS for a row whose state is not a command state's name (the
// message names the command and the value). Not thread-safe; opens no
// transaction (see run_store.h).
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

// A command to workers and its delivery state.
struct StoredCommand {
  std::string id;
  std::string run;
  int64_t generation = 0;
  std::string kind;
  std::string payload;  // bytes, typically a serialized v1::Command
  v1::CommandState state = v1::COMMAND_STATE_UNSPECIFIED;
  std::string message;
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
};

class CommandStore {
 public:
  CommandStore(Database* db, Clock* clock) : db_(db), clock_(clock) {}

  absl::Status Put(std::string_view id, std::string_view run, int64_t generation,
                   std::string_view kind, std::string_view payload, v1::CommandState state);
  // Setting the same final state again is OK.
  absl::Status SetState(std::string_view id, v1::CommandState state, std::string_view message);
  absl::StatusOr<StoredCommand> Get(std::string_view id);
  // COMMAND_STATE_UNSPECIFIED: all. In creation order.
  absl::StatusOr<std::vector<StoredCommand>> List(std::string_view run, v1::CommandState state);

 private:
  Database* const db_;
  Clock* const clock_;
};

}  // namespace spikeguard::storage
