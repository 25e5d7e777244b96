// state_names.h
// -----------------------------------------------------------------------------
// The one mapping between the run and command state enums (RunState,
// CommandState in supervisor.proto) and their names: the lowercase word
// after the enumerator's prefix ("running", "acked"). spikectl prints and
// parses these names, the web view and reports show them, and the catalog
// stores them (docs/ARCHITECTURE.md, "The catalog schema"), so a name, like
// a number, never changes once released.
//
//   std::string_view name = RunStateName(v1::RUN_PAUSED);         // "paused"
//   std::optional<v1::RunState> s = ParseRunState("finished");     // RUN_FINISHED
//
// Parsing is exact (lowercase, no prefix) and refuses UNSPECIFIED's name.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "spikeguard/v1/supervisor.pb.h"

namespace spikeguard {

// "" for RUN_STATE_UNSPECIFIED, "unknown" for a number this binary does not
// know (a newer daemon's).
std::string_view RunStateName(v1::RunState state);
std::optional<v1::RunState> ParseRunState(std::string_view name);
// Every run state but UNSPECIFIED, by number.
std::span<const v1::RunState> AllRunStates();
// finished, failed or stopped: the run will not train again.
bool RunEnded(v1::RunState state);

std::string_view CommandStateName(v1::CommandState state);
std::optional<v1::CommandState> ParseCommandState(std::string_view name);
std::span<const v1::CommandState> AllCommandStates();
// acked or failed: the state does not change again.
bool CommandFinal(v1::CommandState state);

}  // namespace spikeguard
