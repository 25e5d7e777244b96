// What the catalog stores for each enum: a fixed table per enum, written
// out here rather than derived from the code under test, so a reordered,
// renumbered or renamed enumerator fails here before it changes what a
// catalog holds (docs/ARCHITECTURE.md, "The catalog schema"). Run and
// command states are stored by name, the proto enums in INTEGER columns by
// their proto number.
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "proto/state_names.h"
#include "storage/catalog/command_store.h"
#include "storage/catalog/incident_store.h"
#include "storage/catalog/run_store.h"
#include "storage/catalog/warning_store.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using PersistedEnumsTest = testing::StoreTest;

// The single column `sql` selects from its single row, as text.
std::string Column(Database& db, const std::string& sql) {
  auto select = db.Prepare(sql);
  EXPECT_TRUE(select.ok()) << select.status();
  if (!select.ok()) return "";
  auto row = select->Step();
  EXPECT_TRUE(row.ok() && *row) << sql;
  return row.ok() && *row ? select->ColumnText(0) : "";
}

const std::vector<std::pair<v1::RunState, std::string>> kRunStates = {
    {v1::RUN_CREATED, "created"}, {v1::RUN_RUNNING, "running"},   {v1::RUN_PAUSED, "paused"},
    {v1::RUN_STOPPED, "stopped"}, {v1::RUN_FINISHED, "finished"}, {v1::RUN_FAILED, "failed"}};

const std::vector<std::pair<v1::CommandState, std::string>> kCommandStates = {
    {v1::COMMAND_PENDING, "pending"},
    {v1::COMMAND_SENT, "sent"},
    {v1::COMMAND_ACKED, "acked"},
    {v1::COMMAND_FAILED, "failed"}};

TEST_F(PersistedEnumsTest, RunStatesAreStoredByTheirNamesAndKeepTheirProtoNumbers) {
  // The proto numbers are the wire contract (Run.state).
  const std::vector<std::pair<v1::RunState, int>> numbers = {
      {v1::RUN_STATE_UNSPECIFIED, 0}, {v1::RUN_CREATED, 1},  {v1::RUN_RUNNING, 2},
      {v1::RUN_PAUSED, 3},            {v1::RUN_STOPPED, 4},  {v1::RUN_FINISHED, 5},
      {v1::RUN_FAILED, 6}};
  for (const auto& [state, number] : numbers) EXPECT_EQ(static_cast<int>(state), number);
  ASSERT_EQ(AllRunStates().size(), kRunStates.size()) << "a new state needs a row here";

  RunStore runs(db_.get(), &clock_);
  AddRun("r");
  for (const auto& [state, name] : kRunStates) {
    EXPECT_EQ(RunStateName(state), name);
    EXPECT_EQ(ParseRunState(name), state);
    ASSERT_TRUE(runs.SetState("r", state).ok()) << name;
    EXPECT_EQ(Column(*db_, "SELECT state FROM runs WHERE name = 'r'"), name);
    EXPECT_EQ(runs.Get("r")->state(), state) << name;
  }
  EXPECT_EQ(ParseRunState("RUN_RUNNING"), std::nullopt) << "names only, no enumerator names";
  EXPECT_EQ(ParseRunState(""), std::nullopt);
}

TEST_F(PersistedEnumsTest, CommandStatesAreStoredByTheirNamesAndKeepTheirProtoNumbers) {
  const std::vector<std::pair<v1::CommandState, int>> numbers = {
      {v1::COMMAND_STATE_UNSPECIFIED, 0}, {v1::COMMAND_PENDING, 1}, {v1::COMMAND_SENT, 2},
      {v1::COMMAND_ACKED, 3},             {v1::COMMAND_FAILED, 4}};
  for (const auto& [state, number] : numbers) EXPECT_EQ(static_cast<int>(state), number);
  ASSERT_EQ(AllCommandStates().size(), kCommandStates.size()) << "a new state needs a row here";

  AddRun("r");
  CommandStore commands(db_.get(), &clock_);
  for (const auto& [state, name] : kCommandStates) {
    EXPECT_EQ(CommandStateName(state), name);
    EXPECT_EQ(ParseCommandState(name), state);
    const std::string id = "c-" + name;
    ASSERT_TRUE(commands.Put(id, "r", 0, "PAUSE", "", state).ok()) << name;
    EXPECT_EQ(Column(*db_, "SELECT state FROM commands WHERE id = '" + id + "'"), name);
    EXPECT_EQ(commands.Get(id)->state, state) << name;
  }
}

TEST_F(PersistedEnumsTest, IncidentStatesAndVerdictsAreStoredByTheirProtoNumbers) {
  const std::vector<std::pair<v1::IncidentState, int>> states = {
      {v1::DETECTED, 1}, {v1::REPLAYING, 2},         {v1::SKIPPING, 3}, {v1::BISECTING, 4},
      {v1::TRANSPLANTING, 5}, {v1::FIXING, 6},       {v1::VERIFYING, 7},
      {v1::AWAITING_APPROVAL, 8}, {v1::CLOSED, 9},   {v1::ABORTED, 10}};
  const std::vector<std::pair<v1::Verdict, int>> verdicts = {
      {v1::VERDICT_UNSPECIFIED, 0}, {v1::TRANSIENT, 1}, {v1::DATA, 2},
      {v1::FRAGILITY, 3},           {v1::NUMERICS, 4},  {v1::INCONCLUSIVE, 5}};
  AddRun("r");
  IncidentStore incidents(db_.get(), &clock_);
  for (size_t i = 0; i < states.size(); ++i) {
    v1::Incident inc;
    inc.set_state(states[i].first);
    inc.set_verdict(verdicts[i % verdicts.size()].first);
    inc.set_trigger("loss_spike");
    auto id = incidents.Create("r", inc);
    ASSERT_TRUE(id.ok()) << id.status();
    const std::string where = " FROM incidents WHERE id = " + std::to_string(*id);
    EXPECT_EQ(Column(*db_, "SELECT state" + where), std::to_string(states[i].second));
    EXPECT_EQ(Column(*db_, "SELECT verdict" + where),
              std::to_string(verdicts[i % verdicts.size()].second));
  }
}

TEST_F(PersistedEnumsTest, WarningStatesAndModesAreStoredByTheirProtoNumbers) {
  const std::vector<std::pair<v1::WarningState, int>> states = {
      {v1::WARNING_ACTIVE, 1}, {v1::WARNING_CLEARED, 2}, {v1::WARNING_PRECEDED_INCIDENT, 3}};
  AddRun("r");
  WarningStore warnings(db_.get(), &clock_);
  for (const auto& [state, number] : states) {
    v1::PrecursorWarning w;
    w.set_run("r");
    w.set_signal("max_attn_logit");
    w.set_state(state);
    auto id = warnings.Create(w);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(Column(*db_, "SELECT state FROM precursor_warnings WHERE id = " +
                               std::to_string(*id)),
              std::to_string(number));
  }

  const std::vector<std::pair<v1::Mode, int>> modes = {
      {v1::MODE_OBSERVE, 1}, {v1::MODE_PROPOSE, 2}, {v1::MODE_AUTO, 3}};
  RunStore runs(db_.get(), &clock_);
  for (const auto& [mode, number] : modes) {
    v1::Run run;
    run.set_name("m" + std::to_string(number));
    run.set_mode(mode);
    ASSERT_TRUE(runs.Create(run).ok());
    EXPECT_EQ(Column(*db_, "SELECT mode FROM runs WHERE name = '" + run.name() + "'"),
              std::to_string(number));
  }
}

}  // namespace
}  // namespace spikeguard::storage
