// Database (the sqlite3* owner) and the schema migrations, on real files and
// on ":memory:".
#include "storage/catalog/schema.h"

#include <sqlite3.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/state_names.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/database.h"
#include "tests/storage/catalog/temp_dir.h"

namespace spikeguard::storage {
namespace {

using ::spikeguard::storage::testing::TempDir;
namespace v1 = ::spikeguard::v1;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `sql` on a plain sqlite3 connection, independent of the code under test.
void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
      << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

std::set<std::string> TablesOf(Database& db) {
  std::set<std::string> names;
  auto select = db.Prepare(
      "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'");
  EXPECT_TRUE(select.ok()) << select.status();
  while (select.ok() && *select->Step()) names.insert(select->ColumnText(0));
  return names;
}

std::unique_ptr<Database> OpenMemory() {
  auto db = Database::Open({.path = ":memory:"});
  EXPECT_TRUE(db.ok()) << db.status();
  return std::move(*db);
}

TEST(Schema, EmptyFileMigratesToEveryTableInWalMode) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    EXPECT_EQ((*catalog)->schema_version(), kSchemaVersion);
  }
  auto db = Database::Open({.path = path});
  ASSERT_TRUE(db.ok()) << db.status();
  const std::set<std::string> expected(kCatalogTables.begin(), kCatalogTables.end());
  EXPECT_EQ(TablesOf(**db), expected);
  EXPECT_EQ(*(*db)->UserVersion(), kSchemaVersion);
  auto mode = (*db)->Prepare("PRAGMA journal_mode");
  ASSERT_TRUE(mode.ok());
  ASSERT_TRUE(*mode->Step());
  EXPECT_EQ(mode->ColumnText(0), "wal");  // persistent in the file
}

TEST(Schema, VersionOneFileMigratesToTheCurrentSchemaKeepingItsData) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("old-run");
    run.set_world_size(2);
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
  }
  // Turn the file into what a version-1 binary left behind.
  RawExec(path,
          "DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; ALTER TABLE runs DROP COLUMN incarnation; ALTER TABLE checkpoints DROP COLUMN file_identity; DROP TABLE precursor_warnings; ALTER TABLE checkpoints DROP COLUMN rolling; "
          "DROP TABLE launches; DROP INDEX audit_by_target; ALTER TABLE audit DROP COLUMN role; "
          "ALTER TABLE audit DROP COLUMN outcome; ALTER TABLE audit DROP COLUMN peer; "
          "DROP TABLE policies; ALTER TABLE runs DROP COLUMN data_order; "
          "ALTER TABLE runs DROP COLUMN total_steps; PRAGMA user_version = 1;");
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto run = (*catalog)->GetRun("old-run");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->world_size(), 2u);
  v1::Policy policy;
  policy.set_mode(v1::MODE_AUTO);
  ASSERT_TRUE((*catalog)->PutPolicy("old-run", policy).ok());
  auto back = (*catalog)->GetPolicy("old-run");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->mode(), v1::MODE_AUTO);
  EXPECT_TRUE(absl::IsNotFound((*catalog)->GetPolicy("other").status()));
}

TEST(Schema, VersionTwoFileGainsTheRunsDataOrder) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("old-run");
    run.set_world_size(4);
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
  }
  // What a version-2 binary left behind: runs without the two columns.
  RawExec(path,
          "DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; ALTER TABLE runs DROP COLUMN incarnation; ALTER TABLE checkpoints DROP COLUMN file_identity; DROP TABLE precursor_warnings; ALTER TABLE checkpoints DROP COLUMN rolling; "
          "DROP TABLE launches; DROP INDEX audit_by_target; ALTER TABLE audit DROP COLUMN role; "
          "ALTER TABLE audit DROP COLUMN outcome; ALTER TABLE audit DROP COLUMN peer; "
          "ALTER TABLE runs DROP COLUMN data_order; ALTER TABLE runs DROP COLUMN total_steps; "
          "PRAGMA user_version = 2;");
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto run = (*catalog)->GetRun("old-run");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->world_size(), 4u);
  EXPECT_FALSE(run->has_data_order());
  EXPECT_EQ(run->total_steps(), 0);
  v1::DataOrder order;
  order.set_seed(99);
  ASSERT_TRUE((*catalog)->SetRunDataOrder("old-run", order, 300).ok());
  EXPECT_EQ((*catalog)->GetRun("old-run")->data_order().seed(), 99u);
  EXPECT_EQ((*catalog)->GetRun("old-run")->total_steps(), 300);
}

TEST(Schema, VersionThreeFileKeepsItsAuditRowsAndGainsWhoAndHow) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    ASSERT_TRUE((*catalog)->AppendAudit("operator", "rewind", "old-run", "to 200").ok());
  }
  // What a version-3 binary left behind: audit without role/outcome/peer.
  RawExec(path, std::string("DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; ALTER TABLE runs DROP COLUMN incarnation; ALTER TABLE checkpoints DROP COLUMN file_identity; DROP TABLE precursor_warnings; ALTER TABLE checkpoints DROP COLUMN rolling; "
                            "DROP TABLE launches; DROP INDEX audit_by_target; ALTER TABLE audit DROP COLUMN role; "
          "ALTER TABLE audit DROP COLUMN outcome; ALTER TABLE audit DROP COLUMN peer; "
          "PRAGMA user_version = 3;"));
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ((*catalog)->schema_version(), kSchemaVersion);
  v1::AuditEntry entry;
  entry.set_principal("alice");
  entry.set_role("operator");
  entry.set_rpc("Pause");
  entry.set_run("old-run");
  entry.set_outcome("PERMISSION_DENIED");
  entry.set_peer("ipv4:127.0.0.1:5000");
  ASSERT_TRUE((*catalog)->AppendAudit(entry).ok());
  Catalog::AuditQuery query;
  query.run = "old-run";
  auto rows = (*catalog)->QueryAudit(query);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].principal(), "alice");
  EXPECT_EQ((*rows)[0].outcome(), "PERMISSION_DENIED");
  EXPECT_EQ((*rows)[0].peer(), "ipv4:127.0.0.1:5000");
  EXPECT_EQ((*rows)[1].principal(), "operator");  // the old row, kept
  EXPECT_EQ((*rows)[1].rpc(), "rewind");
  EXPECT_EQ((*rows)[1].outcome(), "");
  query.principal = "alice";
  EXPECT_EQ((*catalog)->QueryAudit(query)->size(), 1u);
  query.principal = "";
  query.before_id = (*rows)[0].id();
  ASSERT_EQ((*catalog)->QueryAudit(query)->size(), 1u);
  query.before_id = 0;
  query.run = "other-run";
  EXPECT_TRUE((*catalog)->QueryAudit(query)->empty());
}

TEST(Schema, VersionFourFileGainsTheLaunchesTableAndKeepsItsRuns) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("old-run");
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
  }
  RawExec(path,
          "DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; ALTER TABLE runs DROP COLUMN incarnation; ALTER TABLE checkpoints DROP COLUMN file_identity; DROP TABLE precursor_warnings; ALTER TABLE checkpoints DROP COLUMN rolling; DROP TABLE launches; "
          "PRAGMA user_version = 4;");
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_TRUE((*catalog)->GetRun("old-run").ok());
  EXPECT_TRUE((*catalog)->ListLaunches()->empty());
  LaunchRecord job{.run = "old-run", .slot = "job", .kind = "slurm", .handle = 42, .generation = 1};
  ASSERT_TRUE((*catalog)->PutLaunch(job).ok());
  job.handle = 43;
  job.restarts = 1;
  ASSERT_TRUE((*catalog)->PutLaunch(job).ok());  // the same slot: replaced
  LaunchRecord rank{.run = "old-run", .slot = "rank-0", .kind = "local", .handle = 999,
                    .start_ticks = 12345};
  ASSERT_TRUE((*catalog)->PutLaunch(rank).ok());
  auto all = (*catalog)->ListLaunches();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].slot, "job");
  EXPECT_EQ((*all)[0].handle, 43);
  EXPECT_EQ((*all)[0].restarts, 1);
  EXPECT_EQ((*all)[1].start_ticks, 12345);
  ASSERT_TRUE((*catalog)->DeleteLaunches("old-run", "job").ok());
  EXPECT_EQ((*catalog)->ListLaunches()->size(), 1u);
  ASSERT_TRUE((*catalog)->DeleteLaunches("old-run").ok());
  EXPECT_TRUE((*catalog)->ListLaunches()->empty());
}

TEST(Schema, VersionFiveFileKeepsItsCheckpointsAndGainsTheRollingPin) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("old-run");
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
    v1::Checkpoint c;
    c.set_run("old-run");
    c.set_step(100);
    c.set_uri("/ckpt/100");
    c.set_complete(true);
    ASSERT_TRUE((*catalog)->UpsertCheckpoint(c).ok());
  }
  RawExec(path, "DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; ALTER TABLE runs DROP COLUMN incarnation; ALTER TABLE checkpoints DROP COLUMN file_identity; DROP TABLE precursor_warnings; ALTER TABLE checkpoints DROP COLUMN rolling; PRAGMA user_version = 5;");
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto listed = (*catalog)->ListCheckpoints("old-run");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_FALSE(listed->at(0).rolling_pin());
  ASSERT_TRUE((*catalog)->SetRollingPin("old-run", 100, "/ckpt/100").ok());
  EXPECT_TRUE((*catalog)->ListCheckpoints("old-run")->at(0).rolling_pin());
  ASSERT_TRUE((*catalog)->SetRollingPin("old-run", -1, "").ok());  // released
  EXPECT_FALSE((*catalog)->ListCheckpoints("old-run")->at(0).rolling_pin());
}

TEST(Schema, VersionSixFileGainsThePrecursorWarningsTableKeepingItsData) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("old-run");
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
  }
  RawExec(path, "DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; ALTER TABLE runs DROP COLUMN incarnation; ALTER TABLE checkpoints DROP COLUMN file_identity; DROP TABLE precursor_warnings; PRAGMA user_version = 6;");
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_TRUE((*catalog)->GetRun("old-run").ok());
  EXPECT_TRUE((*catalog)->ListWarnings({})->empty());
  v1::PrecursorWarning w;
  w.set_run("old-run");
  w.set_signal("max_attn_logit");
  w.set_state(v1::WARNING_ACTIVE);
  EXPECT_TRUE((*catalog)->CreateWarning(w).ok());
}

// Version 8 adds the file identity of a checkpoint, "" for the rows of an
// older file (the daemon then verifies the file by its checksum once).
TEST(Schema, VersionSevenFileGainsCheckpointFileIdentities) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("old-run");
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
    v1::Checkpoint c;
    c.set_run("old-run");
    c.set_step(100);
    c.set_uri("/ckpt/100");
    c.set_checksum("0123456789abcdef");
    ASSERT_TRUE((*catalog)->UpsertCheckpoint(c).ok());
  }
  RawExec(path, "DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; ALTER TABLE runs DROP COLUMN incarnation; ALTER TABLE checkpoints DROP COLUMN file_identity; PRAGMA user_version = 7;");
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ((*catalog)->schema_version(), kSchemaVersion);
  EXPECT_EQ(*(*catalog)->CheckpointFileIdentity("old-run", 100, "/ckpt/100"), "");
  ASSERT_TRUE((*catalog)->SetCheckpointFileIdentity("old-run", 100, "/ckpt/100", "dev=1").ok());
  EXPECT_EQ(*(*catalog)->CheckpointFileIdentity("old-run", 100, "/ckpt/100"), "dev=1");
  EXPECT_EQ((*catalog)->ListCheckpoints("old-run")->at(0).checksum(), "0123456789abcdef");
}

// Version 9 gives every run an incarnation: the ones stored before get a
// random one each, and a run created afresh under an old name another.
TEST(Schema, VersionEightFileGivesEveryRunAnIncarnation) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    for (const char* name : {"old-a", "old-b"}) {
      v1::Run run;
      run.set_name(name);
      ASSERT_TRUE((*catalog)->CreateRun(run).ok());
    }
  }
  RawExec(path, "DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; ALTER TABLE runs DROP COLUMN incarnation; PRAGMA user_version = 8;");
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ((*catalog)->schema_version(), kSchemaVersion);
  auto a = (*catalog)->GetRunIncarnation("old-a");
  auto b = (*catalog)->GetRunIncarnation("old-b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->incarnation.size(), 32u);
  EXPECT_NE(a->incarnation, b->incarnation);
  EXPECT_EQ(a->state, v1::RUN_CREATED);
  // The same again: kept.
  EXPECT_EQ((*catalog)->GetRunIncarnation("old-a")->incarnation, a->incarnation);
  EXPECT_EQ((*catalog)->GetRunIncarnation("none").status().code(), absl::StatusCode::kNotFound);
}

// What a version-9 binary left behind: the schema without version 10's
// triggers, and rows written as that binary wrote them (states as text).
std::string VersionNineFile(TempDir& dir, const std::string& rows) {
  const std::string path = dir.File("catalog.db");
  { EXPECT_TRUE(Catalog::Open({.path = path}).ok()); }
  RawExec(path,
          "DROP TRIGGER runs_state_is_known_on_insert; DROP TRIGGER runs_state_is_known_on_update; "
          "PRAGMA user_version = 9;" + rows);
  return path;
}

// One run per state, generation 0 each, and one command per state on the
// first, with the column values a version-9 binary stored.
std::string VersionNineRows(const std::string& bad_run_state = "failed",
                            const std::string& bad_command_state = "failed") {
  std::string sql;
  const std::vector<std::string> states = {"created",  "running", "paused",
                                           "stopped",  "finished", bad_run_state};
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string id = std::to_string(i + 1);
    sql += "INSERT INTO runs (id, name, created_unix_ms, mode, world_size, current_generation, "
           "state, last_step, spec, incarnation) VALUES (" + id + ", 'r" + id + "', 1, 1, 1, 0, '" +
           states[i] + "', 0, x'', 'inc" + id + "');"
           "INSERT INTO generations (run_id, generation, parent, from_checkpoint_step, reason, "
           "created_unix_ms, record) VALUES (" + id + ", 0, -1, 0, 'initial', 1, x'');";
  }
  sql += "PRAGMA ignore_check_constraints = ON;";
  for (const std::string& state : {std::string("pending"), std::string("sent"),
                                   std::string("acked"), bad_command_state}) {
    sql += "INSERT INTO commands (id, run_id, generation, kind, payload, state, message, "
           "created_unix_ms, updated_unix_ms) VALUES ('cmd-" + state + "', 1, 0, 'PAUSE', x'', '" +
           state + "', '', 1, 1);";
  }
  return sql;
}

// Version 10 makes run and command states enums; their columns keep the
// names, so a version-9 catalog reads back unchanged, state for state.
TEST(Schema, VersionNineFileReadsItsTextStatesAsEnums) {
  TempDir dir;
  const std::string path = VersionNineFile(dir, VersionNineRows());
  auto catalog = Catalog::Open({.path = path});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ((*catalog)->schema_version(), 10);
  const std::vector<v1::RunState> want = {v1::RUN_CREATED, v1::RUN_RUNNING,  v1::RUN_PAUSED,
                                          v1::RUN_STOPPED, v1::RUN_FINISHED, v1::RUN_FAILED};
  auto runs = (*catalog)->ListRuns();
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*runs)[i].state(), want[i]) << (*runs)[i].name();
    const std::string name = "r" + std::to_string(i + 1);
    EXPECT_EQ((*catalog)->GetRun(name)->state(), want[i]) << name;
    EXPECT_EQ((*catalog)->GetRunIncarnation(name)->state, want[i]) << name;
  }
  auto commands = (*catalog)->ListCommands("r1");
  ASSERT_TRUE(commands.ok()) << commands.status();
  ASSERT_EQ(commands->size(), 4u);
  EXPECT_EQ((*commands)[0].state, v1::COMMAND_PENDING);
  EXPECT_EQ((*commands)[1].state, v1::COMMAND_SENT);
  EXPECT_EQ((*commands)[2].state, v1::COMMAND_ACKED);
  EXPECT_EQ((*commands)[3].state, v1::COMMAND_FAILED);
  EXPECT_EQ((*catalog)->ListCommands("r1", v1::COMMAND_SENT)->size(), 1u);
  // The old rows go on like new ones.
  ASSERT_TRUE((*catalog)->UpdateCommandState("cmd-sent", v1::COMMAND_ACKED).ok());
  EXPECT_EQ((*catalog)->GetCommand("cmd-sent")->state, v1::COMMAND_ACKED);
  ASSERT_TRUE((*catalog)->SetRunState("r3", v1::RUN_RUNNING).ok());
  EXPECT_EQ((*catalog)->GetRun("r3")->state(), v1::RUN_RUNNING);
}

// A state no binary writes (a row edited by hand) stops the migration with
// the run or command and the value, and leaves the file at version 9 to be
// corrected and opened again.
TEST(Schema, VersionNineFileWithAStateThatIsNotOneIsRefusedNamingTheRow) {
  TempDir dir;
  const std::string path = VersionNineFile(dir, VersionNineRows("Done"));
  auto catalog = Catalog::Open({.path = path});
  ASSERT_FALSE(catalog.ok());
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(std::string(catalog.status().message()),
            "catalog " + path + ": run 'r6' has state 'Done', which is not a run state (created, "
            "running, paused, stopped, finished, failed); correct the row (sqlite3), then open "
            "the catalog again");
  {
    auto db = Database::Open({.path = path});
    ASSERT_TRUE(db.ok());
    EXPECT_EQ(*(*db)->UserVersion(), 9);
  }
  RawExec(path, "UPDATE runs SET state = 'failed' WHERE name = 'r6';");
  auto fixed = Catalog::Open({.path = path});
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ((*fixed)->GetRun("r6")->state(), v1::RUN_FAILED);
}

TEST(Schema, VersionNineFileWithACommandStateThatIsNotOneIsRefusedNamingTheCommand) {
  TempDir dir;
  const std::string path = VersionNineFile(dir, VersionNineRows("failed", "delivered"));
  auto catalog = Catalog::Open({.path = path});
  ASSERT_FALSE(catalog.ok());
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(std::string(catalog.status().message()),
            "catalog " + path + ": command 'cmd-delivered' has state 'delivered', which is not a "
            "command state (pending, sent, acked, failed); correct the row (sqlite3), then open "
            "the catalog again");
}

// From version 10 `runs` refuses a state that is not one, as `commands`
// does (CHECK), and accepts every name the code stores: the names frozen in
// the migration and the ones in proto/state_names.cc agree.
TEST(Schema, RunsRefuseAStateThatIsNotOneAndAcceptEveryName) {
  auto db = OpenMemory();
  ASSERT_TRUE(OpenSchema(*db).ok());
  EXPECT_EQ(db->Execute("INSERT INTO runs (name, created_unix_ms, mode, world_size, "
                        "current_generation, state, last_step, spec) "
                        "VALUES ('r', 0, 0, 1, 0, 'RUN_RUNNING', 0, x'')")
                .code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(db->Execute("INSERT INTO runs (name, created_unix_ms, mode, world_size, "
                          "current_generation, state, last_step, spec) "
                          "VALUES ('r', 0, 0, 1, 0, 'created', 0, x'')")
                  .ok());
  for (v1::RunState state : AllRunStates()) {
    EXPECT_TRUE(db->Execute("UPDATE runs SET state = '" + std::string(RunStateName(state)) +
                            "' WHERE name = 'r'")
                    .ok())
        << RunStateName(state);
  }
  absl::Status bad = db->Execute("UPDATE runs SET state = '2' WHERE name = 'r'");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.message()).find("runs.state: not a run state"), std::string::npos)
      << bad;
  for (v1::CommandState state : AllCommandStates()) {
    EXPECT_TRUE(db->Execute("INSERT INTO commands (id, run_id, generation, kind, payload, state, "
                            "message, created_unix_ms, updated_unix_ms) VALUES ('" +
                            std::string(CommandStateName(state)) + "', 1, 0, 'PAUSE', x'', '" +
                            std::string(CommandStateName(state)) + "', '', 0, 0)")
                    .ok())
        << CommandStateName(state);
  }
}

TEST(Schema, InMemoryDatabaseMigratesToo) {
  auto db = OpenMemory();
  ASSERT_TRUE(OpenSchema(*db).ok());
  EXPECT_EQ(TablesOf(*db).size(), kCatalogTables.size());
  EXPECT_EQ(*db->UserVersion(), kSchemaVersion);
  // Migrating again is a no-op.
  EXPECT_TRUE(MigrateSchema(*db).ok());
}

TEST(Schema, NewerFileIsRefusedAndLeftUntouched) {
  TempDir dir;
  const std::string path = dir.File("newer.db");
  RawExec(path, "CREATE TABLE future (x INTEGER); PRAGMA user_version = " +
                    std::to_string(kSchemaVersion + 41) + ";");
  const std::string before = ReadFile(path);
  ASSERT_FALSE(before.empty());

  auto catalog = Catalog::Open({.path = path});
  ASSERT_FALSE(catalog.ok());
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(catalog.status().message()),
            "catalog " + path + " has schema version " + std::to_string(kSchemaVersion + 41) +
                ", newer than this binary's " + std::to_string(kSchemaVersion) +
                "; upgrade spikeguard");
  EXPECT_EQ(ReadFile(path), before);
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
}

TEST(Schema, NotADatabaseIsDataLoss) {
  TempDir dir;
  const std::string path = dir.File("junk.db");
  std::ofstream(path) << std::string(4096, 'x');
  auto catalog = Catalog::Open({.path = path});
  ASSERT_FALSE(catalog.ok());
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kDataLoss) << catalog.status();
}

TEST(Schema, ForeignKeysAreEnforced) {
  auto db = OpenMemory();
  ASSERT_TRUE(OpenSchema(*db).ok());
  absl::Status s = db->Execute(
      "INSERT INTO checkpoints (run_id, step, uri, generation, data_position, bytes, checksum, "
      "complete, pinned, has_rng_state, has_data_loader_state, created_unix_ms) "
      "VALUES (42, 1, 'file:///x', 0, 0, 0, '', 1, 0, 0, 0, 0)");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("FOREIGN KEY"), std::string::npos) << s;
}

TEST(Schema, NotNullAndCheckConstraintsHold) {
  auto db = OpenMemory();
  ASSERT_TRUE(OpenSchema(*db).ok());
  EXPECT_EQ(db->Execute("INSERT INTO runs (name, created_unix_ms, mode, world_size, "
                        "current_generation, state, last_step, spec) "
                        "VALUES (NULL, 0, 0, 1, 0, 'created', 0, x'')")
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(db->Execute("INSERT INTO runs (name, created_unix_ms, mode, world_size, "
                          "current_generation, state, last_step, spec) "
                          "VALUES ('r', 0, 0, 1, 0, 'created', 0, x'')")
                  .ok());
  EXPECT_EQ(db->Execute("INSERT INTO commands (id, run_id, generation, kind, payload, state, "
                        "message, created_unix_ms, updated_unix_ms) "
                        "VALUES ('c', 1, 0, 'PAUSE', x'', 'lost', '', 0, 0)")
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Schema, IncidentEventsAndAuditAreAppendOnly) {
  auto db = OpenMemory();
  ASSERT_TRUE(OpenSchema(*db).ok());
  ASSERT_TRUE(db->Execute("INSERT INTO audit (unix_ms, actor, action, target, detail) "
                          "VALUES (1, 'alice', 'rewind', 'run', '')")
                  .ok());
  absl::Status update = db->Execute("UPDATE audit SET actor = 'mallory'");
  EXPECT_FALSE(update.ok());
  EXPECT_NE(std::string(update.message()).find("append-only"), std::string::npos) << update;
  EXPECT_FALSE(db->Execute("DELETE FROM audit").ok());
  ASSERT_TRUE(db->Execute("INSERT INTO runs (name, created_unix_ms, mode, world_size, "
                          "current_generation, state, last_step, spec) "
                          "VALUES ('r', 0, 0, 1, 0, 'created', 0, x'');"
                          "INSERT INTO incidents (run_id, state, verdict, trigger_kind, "
                          "generation, onset_step, opened_unix_ms, closed_unix_ms, record) "
                          "VALUES (1, 1, 0, 'loss_spike', 0, 10, 0, 0, x'');"
                          "INSERT INTO incident_events (incident_id, unix_ms, kind, payload) "
                          "VALUES (1, 0, 'opened', x'')")
                  .ok());
  EXPECT_FALSE(db->Execute("UPDATE incident_events SET kind = 'forged'").ok());
  EXPECT_FALSE(db->Execute("DELETE FROM incident_events").ok());
}

TEST(Database, TransactionRollsBackUnlessCommitted) {
  auto db = OpenMemory();
  ASSERT_TRUE(db->Execute("CREATE TABLE t (x INTEGER NOT NULL)").ok());
  {
    auto txn = Transaction::Begin(db.get());
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE(db->Execute("INSERT INTO t VALUES (1)").ok());
  }  // dropped: rolled back
  EXPECT_FALSE(db->InTransaction());
  {
    auto txn = Transaction::Begin(db.get());
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE(db->Execute("INSERT INTO t VALUES (2)").ok());
    ASSERT_TRUE(txn->Commit().ok());
  }
  auto count = db->Prepare("SELECT COUNT(*), SUM(x) FROM t");
  ASSERT_TRUE(count.ok());
  ASSERT_TRUE(*count->Step());
  EXPECT_EQ(count->ColumnInt64(0), 1);
  EXPECT_EQ(count->ColumnInt64(1), 2);
}

TEST(Database, StatementIsResetAndBindingsClearedOnRelease) {
  auto db = OpenMemory();
  constexpr char kSql[] = "SELECT ?";
  {
    auto s = db->Prepare(kSql);
    ASSERT_TRUE(s.ok());
    s->BindInt64(1, 5);
    ASSERT_TRUE(*s->Step());
    EXPECT_EQ(s->ColumnInt64(0), 5);
  }
  auto again = db->Prepare(kSql);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(*again->Step());
  EXPECT_TRUE(again->ColumnIsNull(0));  // the 5 did not leak to the next user
  // The same SQL while the cached statement is held gets its own statement.
  auto nested = db->Prepare(kSql);
  ASSERT_TRUE(nested.ok());
  nested->BindText(1, "nested");
  ASSERT_TRUE(*nested->Step());
  EXPECT_EQ(nested->ColumnText(0), "nested");
  EXPECT_TRUE(again->ColumnIsNull(0));
}

TEST(Database, ErrorsNameTheStatementAndSqliteMessage) {
  auto db = OpenMemory();
  auto bad = db->Prepare("SELEC 1");
  ASSERT_FALSE(bad.ok());
  const std::string message(bad.status().message());
  EXPECT_NE(message.find("SELEC 1"), std::string::npos) << message;
  EXPECT_NE(message.find("syntax error"), std::string::npos) << message;
}

TEST(Database, SqliteTurnsABoundNaNIntoNull) {
  // Why the catalog keeps full records as proto BLOBs.
  auto db = OpenMemory();
  auto s = db->Prepare("SELECT ?, ?");
  ASSERT_TRUE(s.ok());
  s->BindDouble(1, std::numeric_limits<double>::quiet_NaN())
      .BindDouble(2, std::numeric_limits<double>::infinity());
  ASSERT_TRUE(*s->Step());
  EXPECT_TRUE(s->ColumnIsNull(0));
  EXPECT_EQ(s->ColumnDouble(1), std::numeric_limits<double>::infinity());
}

// The catalog (and its write-ahead log) holds the audit log and every
// run's telemetry: it was created 0644, readable by every local user.
TEST(Schema, TheCatalogAndItsLogAreOwnerOnlyAndAnOlderLooseFileIsTightened) {
  TempDir dir;
  const std::string path = dir.File("catalog.db");
  {
    auto catalog = Catalog::Open({.path = path});
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run run;
    run.set_name("r");
    run.set_world_size(1);
    ASSERT_TRUE((*catalog)->CreateRun(run).ok());
    for (const std::string& file : {path, path + "-wal"}) {
      ASSERT_TRUE(std::filesystem::exists(file)) << file;
      const auto perms = std::filesystem::status(file).permissions();
      EXPECT_EQ(perms & (std::filesystem::perms::group_all | std::filesystem::perms::others_all),
                std::filesystem::perms::none)
          << file;
    }
  }
  std::filesystem::permissions(path, std::filesystem::perms::owner_read |
                                         std::filesystem::perms::owner_write |
                                         std::filesystem::perms::group_read |
                                         std::filesystem::perms::others_read);
  auto again = Catalog::Open({.path = path});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::others_all,
            std::filesystem::perms::none);
}

// A catalog that cannot be created names the real cause (it said "No such
// file or directory" on a read-only file system).
TEST(Schema, ACatalogThatCannotBeCreatedNamesTheCause) {
  auto missing = Catalog::Open({.path = "/nonexistent-dir-for-spikeguard/catalog.db"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent-dir-for-spikeguard/catalog.db"),
            std::string::npos);
  EXPECT_NE(missing.status().message().find("No such file or directory"), std::string::npos)
      << missing.status();
  // /proc/self holds no new files, even for root: the OS's reason, not SQLite's.
  auto refused = Catalog::Open({.path = "/proc/self/catalog.db"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message().find("unable to open database file"), std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace spikeguard::storage
