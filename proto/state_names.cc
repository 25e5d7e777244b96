#include "proto/state_names.h"

#include <array>
#include <utility>

namespace spikeguard {
namespace {

// Listed explicitly rather than derived from the generated descriptor, so a
// renamed enumerator cannot change what is stored or printed.
constexpr std::array<std::pair<v1::RunState, std::string_view>, 6> kRunStateNames = {{
    {v1::RUN_CREATED, "created"},
    {v1::RUN_RUNNING, "running"},
    {v1::RUN_PAUSED, "paused"},
    {v1::RUN_STOPPED, "stopped"},
    {v1::RUN_FINISHED, "finished"},
    {v1::RUN_FAILED, "failed"},
}};
constexpr std::array<v1::RunState, 6> kRunStates = {
    v1::RUN_CREATED, v1::RUN_RUNNING,  v1::RUN_PAUSED,
    v1::RUN_STOPPED, v1::RUN_FINISHED, v1::RUN_FAILED};

constexpr std::array<std::pair<v1::CommandState, std::string_view>, 4> kCommandStateNames = {{
    {v1::COMMAND_PENDING, "pending"},
    {v1::COMMAND_SENT, "sent"},
    {v1::COMMAND_ACKED, "acked"},
    {v1::COMMAND_FAILED, "failed"},
}};
constexpr std::array<v1::CommandState, 4> kCommandStates = {
    v1::COMMAND_PENDING, v1::COMMAND_SENT, v1::COMMAND_ACKED, v1::COMMAND_FAILED};

template <typename E, size_t N>
std::string_view NameIn(const std::array<std::pair<E, std::string_view>, N>& names, E value) {
  if (static_cast<int>(value) == 0) return "";
  for (const auto& [v, name] : names) {
    if (v == value) return name;
  }
  return "unknown";
}

template <typename E, size_t N>
std::optional<E> ValueIn(const std::array<std::pair<E, std::string_view>, N>& names,
                         std::string_view name) {
  for (const auto& [v, n] : names) {
    if (n == name) return v;
  }
  return std::nullopt;
}

}  // namespace

std::string_view RunStateName(v1::RunState state) { return NameIn(kRunStateNames, state); }

std::optional<v1::RunState> ParseRunState(std::string_view name) {
  return ValueIn(kRunStateNames, name);
}

std::span<const v1::RunState> AllRunStates() { return kRunStates; }

bool RunEnded(v1::RunState state) {
  return state == v1::RUN_FINISHED || state == v1::RUN_FAILED || state == v1::RUN_STOPPED;
}

std::string_view CommandStateName(v1::CommandState state) {
  return NameIn(kCommandStateNames, state);
}

std::optional<v1::CommandState> ParseCommandState(std::string_view name) {
  return ValueIn(kCommandStateNames, name);
}

std::span<const v1::CommandState> AllCommandStates() { return kCommandStates; }

bool CommandFinal(v1::CommandState state) {
  return state == v1::COMMAND_ACKED || state == v1::COMMAND_FAILED;
}

}  // namespace spikeguard
