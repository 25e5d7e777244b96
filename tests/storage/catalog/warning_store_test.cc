// WarningStore: precursor warnings and the incidents they preceded.
#include "storage/catalog/warning_store.h"

#include "gtest/gtest.h"
#include "storage/catalog/incident_store.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using WarningStoreTest = testing::StoreTest;

v1::PrecursorWarning Active(const std::string& run) {
  v1::PrecursorWarning w;
  w.set_run(run);
  w.set_signal("max_attn_logit");
  w.set_layer(3);
  w.set_state(v1::WARNING_ACTIVE);
  w.set_onset_step(40);
  return w;
}

TEST_F(WarningStoreTest, CreateUpdateAndReadBack) {
  AddRun("r");
  WarningStore warnings(db_.get(), &clock_);
  auto id = warnings.Create(Active("r"));
  ASSERT_TRUE(id.ok()) << id.status();
  const int64_t opened = clock_.NowUnixMillis();
  clock_.Advance(absl::Seconds(5));
  v1::PrecursorWarning cleared = *warnings.Get(*id);
  cleared.set_state(v1::WARNING_CLEARED);
  cleared.set_opened_unix_ms(1);
  ASSERT_TRUE(warnings.Update(cleared).ok());
  auto back = warnings.Get(*id);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->state(), v1::WARNING_CLEARED);
  EXPECT_EQ(back->opened_unix_ms(), opened) << "the opening time cannot change";
  EXPECT_EQ(back->updated_unix_ms(), clock_.NowUnixMillis());
  WarningFilter active;
  active.state = v1::WARNING_ACTIVE;
  EXPECT_EQ(warnings.List(active)->size(), 0u);
  WarningFilter of_r;
  of_r.run = "r";
  EXPECT_EQ(warnings.List(of_r)->size(), 1u);
}

TEST_F(WarningStoreTest, RefusesMalformedWarningsForeignRunsAndUnknownIncidents) {
  AddRun("r");
  AddRun("s");
  WarningStore warnings(db_.get(), &clock_);
  v1::PrecursorWarning no_signal = Active("r");
  no_signal.clear_signal();
  EXPECT_EQ(warnings.Create(no_signal).status().code(), absl::StatusCode::kInvalidArgument);
  v1::PrecursorWarning no_state = Active("r");
  no_state.set_state(v1::WARNING_STATE_UNSPECIFIED);
  EXPECT_EQ(warnings.Create(no_state).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(warnings.Create(Active("nope")).status().code(), absl::StatusCode::kNotFound);
  const int64_t id = *warnings.Create(Active("r"));
  v1::PrecursorWarning moved = *warnings.Get(id);
  moved.set_run("s");
  EXPECT_EQ(warnings.Update(moved).code(), absl::StatusCode::kFailedPrecondition);
  v1::PrecursorWarning preceded = *warnings.Get(id);
  preceded.set_state(v1::WARNING_PRECEDED_INCIDENT);
  preceded.set_incident_id(5);
  EXPECT_EQ(warnings.Update(preceded).code(), absl::StatusCode::kNotFound);
  IncidentStore incidents(db_.get(), &clock_);
  preceded.set_incident_id(*incidents.Create("r", v1::Incident()));
  EXPECT_TRUE(warnings.Update(preceded).ok());
  EXPECT_EQ(warnings.Get(id + 1).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace spikeguard::storage
