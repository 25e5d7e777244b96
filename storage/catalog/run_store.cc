#include "storage/catalog/run_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "proto/state_names.h"
#include "storage/catalog/store_util.h"

namespace spikeguard::storage {
namespace {

using internal::Parse;
using internal::RunNotFound;
using internal::Serialize;
using internal::Sv;

constexpr char kInsertRunSql[] =
    "INSERT INTO runs (name, created_unix_ms, mode, world_size, current_generation, state, "
    "last_step, spec, incarnation) VALUES (?, ?, ?, ?, 0, ?, ?, ?, lower(hex(randomblob(16))))";
constexpr char kSelectRunIncarnationSql[] = "SELECT incarnation, state FROM runs WHERE name = ?";
constexpr char kSelectRunSql[] =
    "SELECT id, name, created_unix_ms, mode, world_size, current_generation, state, last_step, "
    "spec, data_order, total_steps FROM runs WHERE name = ?";
constexpr char kListRunsSql[] =
    "SELECT id, name, created_unix_ms, mode, world_size, current_generation, state, last_step, "
    "spec, data_order, total_steps FROM runs ORDER BY id";
constexpr char kSelectRunKeySql[] = "SELECT id, current_generation FROM runs WHERE name = ?";
constexpr char kUpdateRunDataOrderSql[] =
    "UPDATE runs SET data_order = ?, total_steps = ? WHERE name = ?";
constexpr char kUpdateRunStateSql[] = "UPDATE runs SET state = ? WHERE name = ?";
constexpr char kUpdateRunSpecSql[] = "UPDATE runs SET spec = ? WHERE name = ?";
constexpr char kUpdateRunProgressSql[] = "UPDATE runs SET last_step = ? WHERE name = ?";
constexpr char kSetCurrentGenerationSql[] =
    "UPDATE runs SET current_generation = ? WHERE id = ?";
constexpr char kInsertGenerationSql[] =
    "INSERT INTO generations (run_id, generation, parent, from_checkpoint_step, reason, "
    "created_unix_ms, record) VALUES (?, ?, ?, ?, ?, ?, ?)";
constexpr char kSelectGenerationsSql[] =
    "SELECT record FROM generations WHERE run_id = ? ORDER BY generation";
constexpr char kMaxGenerationSql[] =
    "SELECT COALESCE(MAX(generation), -1) FROM generations WHERE run_id = ?";
constexpr char kGenerationExistsSql[] =
    "SELECT 1 FROM generations WHERE run_id = ? AND generation = ?";

// The stored name of a run state (RunStateName); INVALID_ARGUMENT for
// UNSPECIFIED or a number this binary does not know.
absl::StatusOr<std::string_view> StoredName(v1::RunState state) {
  if (!v1::RunState_IsValid(state) || state == v1::RUN_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat("run state ", static_cast<int>(state),
                                                   " is not a run state"));
  }
  return RunStateName(state);
}

absl::StatusOr<v1::RunState> StoredState(std::string_view run, const std::string& name) {
  std::optional<v1::RunState> state = ParseRunState(name);
  if (!state) {
    return absl::DataLossError(absl::StrCat("run '", Sv(run), "' has state '", name,
                                            "' in the catalog, which is not a run state"));
  }
  return *state;
}

absl::StatusOr<v1::Run> ReadRunRow(const Statement& row) {
  v1::Run run;
  run.set_id(row.ColumnInt64(0));
  run.set_name(row.ColumnText(1));
  run.set_created_unix_ms(row.ColumnInt64(2));
  run.set_mode(static_cast<v1::Mode>(row.ColumnInt64(3)));
  run.set_world_size(static_cast<uint32_t>(row.ColumnInt64(4)));
  run.set_current_generation(row.ColumnInt64(5));
  SG_ASSIGN_OR_RETURN(v1::RunState state, StoredState(run.name(), row.ColumnText(6)));
  run.set_state(state);
  run.set_last_step(row.ColumnInt64(7));
  SG_ASSIGN_OR_RETURN(*run.mutable_spec(),
                      Parse<v1::RunSpec>(row.ColumnBlob(8), absl::StrCat("run spec of ", run.name())));
  if (const std::string order = row.ColumnBlob(9); !order.empty()) {
    SG_ASSIGN_OR_RETURN(*run.mutable_data_order(),
                        Parse<v1::DataOrder>(order, absl::StrCat("data order of ", run.name())));
  }
  run.set_total_steps(row.ColumnInt64(10));
  return run;
}

}  // namespace

absl::StatusOr<int64_t> RunStore::Create(const v1::Run& run) {
  if (run.name().empty()) return absl::InvalidArgumentError("run.name is empty");
  SG_ASSIGN_OR_RETURN(
      std::string_view state,
      StoredName(run.state() == v1::RUN_STATE_UNSPECIFIED ? v1::RUN_CREATED : run.state()));
  if (absl::StatusOr<int64_t> existing = internal::RunId(*db_, run.name()); existing.ok()) {
    return absl::AlreadyExistsError(absl::StrCat("run '", run.name(), "' already exists"));
  } else if (!absl::IsNotFound(existing.status())) {
    return existing.status();
  }
  const int64_t now = clock_->NowUnixMillis();
  {
    SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertRunSql));
    insert.BindText(1, run.name())
        .BindInt64(2, run.created_unix_ms() != 0 ? run.created_unix_ms() : now)
        .BindInt64(3, run.mode())
        .BindInt64(4, run.world_size())
        .BindText(5, state)
        .BindInt64(6, run.last_step())
        .BindBlob(7, Serialize(run.spec()));
    SG_RETURN_IF_ERROR(insert.Run());
  }
  const int64_t run_id = db_->LastInsertRowId();
  v1::Generation initial;
  initial.set_generation(0);
  initial.set_parent(-1);
  initial.set_reason("initial");
  initial.set_created_unix_ms(now);
  SG_RETURN_IF_ERROR(InsertGeneration(run_id, run.name(), initial).status());
  return run_id;
}

absl::StatusOr<v1::Run> RunStore::Get(std::string_view name) {
  v1::Run run;
  {
    SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectRunSql));
    select.BindText(1, name);
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) return absl::NotFoundError(RunNotFound(name));
    SG_ASSIGN_OR_RETURN(run, ReadRunRow(select));
  }
  SG_ASSIGN_OR_RETURN(std::vector<v1::Generation> generations, Generations(run.id()));
  for (auto& g : generations) *run.add_generations() = std::move(g);
  return run;
}

absl::StatusOr<RunIncarnation> RunStore::Incarnation(std::string_view name) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectRunIncarnationSql));
  select.BindText(1, name);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(RunNotFound(name));
  RunIncarnation out;
  out.incarnation = select.ColumnText(0);
  SG_ASSIGN_OR_RETURN(out.state, StoredState(name, select.ColumnText(1)));
  return out;
}

absl::StatusOr<std::vector<v1::Run>> RunStore::List() {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kListRunsSql));
  std::vector<v1::Run> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    SG_ASSIGN_OR_RETURN(out.emplace_back(), ReadRunRow(select));
  }
  return out;
}

absl::StatusOr<RunStore::Key> RunStore::Lookup(std::string_view name) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectRunKeySql));
  select.BindText(1, name);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) return absl::NotFoundError(RunNotFound(name));
  return Key{select.ColumnInt64(0), select.ColumnInt64(1)};
}

absl::Status RunStore::SetState(std::string_view name, v1::RunState state) {
  SG_ASSIGN_OR_RETURN(std::string_view stored, StoredName(state));
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateRunStateSql));
  update.BindText(1, stored).BindText(2, name);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(RunNotFound(name));
  return absl::OkStatus();
}

absl::Status RunStore::SetLastStep(std::string_view name, int64_t last_step) {
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateRunProgressSql));
  update.BindInt64(1, last_step).BindText(2, name);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(RunNotFound(name));
  return absl::OkStatus();
}

absl::Status RunStore::SetSpec(std::string_view name, const v1::RunSpec& spec) {
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateRunSpecSql));
  const std::string blob = Serialize(spec);
  update.BindBlob(1, blob).BindText(2, name);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(RunNotFound(name));
  return absl::OkStatus();
}

absl::Status RunStore::SetDataOrder(std::string_view name, const v1::DataOrder& order,
                                    int64_t total_steps) {
  if (total_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("total_steps: ", total_steps, " is negative"));
  }
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kUpdateRunDataOrderSql));
  update.BindBlob(1, Serialize(order)).BindInt64(2, total_steps).BindText(3, name);
  SG_RETURN_IF_ERROR(update.Run());
  if (db_->Changes() == 0) return absl::NotFoundError(RunNotFound(name));
  return absl::OkStatus();
}

absl::StatusOr<v1::Generation> RunStore::CreateGeneration(std::string_view run,
                                                          const v1::Generation& g) {
  SG_ASSIGN_OR_RETURN(int64_t run_id, internal::RunId(*db_, run));
  v1::Generation stored = g;
  if (stored.generation() <= 0) {
    SG_ASSIGN_OR_RETURN(Statement max, db_->Prepare(kMaxGenerationSql));
    max.BindInt64(1, run_id);
    SG_ASSIGN_OR_RETURN(bool row, max.Step());
    stored.set_generation(row ? max.ColumnInt64(0) + 1 : 1);
  }
  if (absl::Status s = RequireGeneration(run_id, run, stored.parent()); !s.ok()) {
    return absl::NotFoundError(
        absl::StrCat("parent generation ", stored.parent(), " of run '", Sv(run), "' not found"));
  }
  SG_ASSIGN_OR_RETURN(stored, InsertGeneration(run_id, run, std::move(stored)));
  SG_ASSIGN_OR_RETURN(Statement update, db_->Prepare(kSetCurrentGenerationSql));
  update.BindInt64(1, stored.generation()).BindInt64(2, run_id);
  SG_RETURN_IF_ERROR(update.Run());
  return stored;
}

absl::StatusOr<std::vector<v1::Generation>> RunStore::Generations(int64_t run_id) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kSelectGenerationsSql));
  select.BindInt64(1, run_id);
  std::vector<v1::Generation> out;
  while (true) {
    SG_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    SG_ASSIGN_OR_RETURN(out.emplace_back(),
                        Parse<v1::Generation>(select.ColumnBlob(0), "generation"));
  }
  return out;
}

absl::Status RunStore::RequireGeneration(int64_t run_id, std::string_view run,
                                         int64_t generation) {
  SG_ASSIGN_OR_RETURN(Statement select, db_->Prepare(kGenerationExistsSql));
  select.BindInt64(1, run_id).BindInt64(2, generation);
  SG_ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) {
    return absl::NotFoundError(
        absl::StrCat("generation ", generation, " of run '", Sv(run), "' not found"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Generation> RunStore::InsertGeneration(int64_t run_id, std::string_view run,
                                                          v1::Generation g) {
  if (g.created_unix_ms() == 0) g.set_created_unix_ms(clock_->NowUnixMillis());
  SG_ASSIGN_OR_RETURN(Statement insert, db_->Prepare(kInsertGenerationSql));
  insert.BindInt64(1, run_id)
      .BindInt64(2, g.generation())
      .BindInt64(3, g.parent())
      .BindInt64(4, g.from_checkpoint_step())
      .BindText(5, g.reason())
      .BindInt64(6, g.created_unix_ms())
      .BindBlob(7, Serialize(g));
  if (absl::Status s = insert.Run(); !s.ok()) {
    if (absl::IsAlreadyExists(s)) {
      return absl::AlreadyExistsError(
          absl::StrCat("generation ", g.generation(), " of run '", Sv(run), "' already exists"));
    }
    return s;
  }
  return g;
}

}  // namespace spikeguard::storage
