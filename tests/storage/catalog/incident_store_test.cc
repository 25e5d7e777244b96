// IncidentStore: records, filters and the append-only event log.
#include "storage/catalog/incident_store.h"

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using IncidentStoreTest = testing::StoreTest;

v1::Incident Opened(int64_t onset) {
  v1::Incident inc;
  inc.set_state(v1::DETECTED);
  inc.set_trigger("loss_spike");
  inc.set_onset_step(onset);
  return inc;
}

TEST_F(IncidentStoreTest, CreateAssignsAnIdAndKeepsTheRunFromTheColumns) {
  AddRun("r");
  IncidentStore incidents(db_.get(), &clock_);
  v1::Incident inc = Opened(10);
  inc.set_id(99);
  inc.set_run("elsewhere");
  auto id = incidents.Create("r", inc);
  ASSERT_TRUE(id.ok()) << id.status();
  auto stored = incidents.Get(*id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->id(), *id);
  EXPECT_EQ(stored->run(), "r");
  EXPECT_EQ(stored->opened_unix_ms(), clock_.NowUnixMillis());
  EXPECT_EQ(incidents.Create("nope", inc).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(incidents.Get(*id + 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(IncidentStoreTest, UpdateCannotMoveAnIncidentToAnotherRun) {
  AddRun("r");
  AddRun("s");
  IncidentStore incidents(db_.get(), &clock_);
  const int64_t id = *incidents.Create("r", Opened(10));
  v1::Incident closed = *incidents.Get(id);
  closed.set_state(v1::CLOSED);
  closed.set_verdict(v1::DATA);
  ASSERT_TRUE(incidents.Update(closed).ok());
  closed.set_run("s");
  EXPECT_EQ(incidents.Update(closed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(incidents.Get(id)->verdict(), v1::DATA);
}

TEST_F(IncidentStoreTest, ListFiltersByRunStateVerdictAndTime) {
  AddRun("r");
  AddRun("s");
  IncidentStore incidents(db_.get(), &clock_);
  const int64_t a = *incidents.Create("r", Opened(1));
  clock_.Advance(absl::Seconds(10));
  const int64_t b = *incidents.Create("s", Opened(2));
  v1::Incident closed = *incidents.Get(b);
  closed.set_state(v1::CLOSED);
  ASSERT_TRUE(incidents.Update(closed).ok());
  EXPECT_EQ(incidents.List({})->size(), 2u);
  IncidentFilter of_r_filter;
  of_r_filter.run = "r";
  auto of_r = incidents.List(of_r_filter);
  ASSERT_EQ(of_r->size(), 1u);
  EXPECT_EQ(of_r->front().id(), a);
  IncidentFilter closed_filter;
  closed_filter.state = v1::CLOSED;
  EXPECT_EQ(incidents.List(closed_filter)->front().id(), b);
  IncidentFilter recent;
  recent.since_unix_ms = clock_.NowUnixMillis();
  EXPECT_EQ(incidents.List(recent)->size(), 1u);
  IncidentFilter unknown;
  unknown.run = "nope";
  EXPECT_EQ(incidents.List(unknown).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(IncidentStoreTest, EventsAreAppendedInOrderWithTheRecordTheyLeadTo) {
  AddRun("r");
  IncidentStore incidents(db_.get(), &clock_);
  v1::Incident record;
  auto id = incidents.CreateWithEvent("r", Opened(5), "opened", std::string("p\0q", 3),
                                      [&](int64_t id, int64_t seq) -> const v1::Incident& {
                                        record = Opened(5);
                                        record.set_id(id);
                                        record.set_note("after " + std::to_string(seq));
                                        return record;
                                      });
  ASSERT_TRUE(id.ok()) << id.status();
  auto seq = incidents.Record(*id, "verdict", "v", [&](int64_t) -> const v1::Incident& {
    record.set_verdict(v1::TRANSIENT);
    return record;
  });
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(incidents.Get(*id)->verdict(), v1::TRANSIENT);
  auto events = incidents.Events(*id);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].kind, "opened");
  EXPECT_EQ((*events)[0].payload, std::string("p\0q", 3)) << "payload bytes as given";
  EXPECT_EQ((*events)[1].seq, *seq);
  EXPECT_LT((*events)[0].seq, (*events)[1].seq);
  EXPECT_EQ(incidents.AppendEvent(*id, "", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(incidents.AppendEvent(*id + 1, "note", "x").status().code(),
            absl::StatusCode::kNotFound);
  v1::Incident other;
  other.set_id(*id + 1);
  EXPECT_EQ(incidents.Record(*id, "note", "", [&](int64_t) -> const v1::Incident& { return other; })
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument)
      << "an event's record must be its own incident's";
}

TEST_F(IncidentStoreTest, TheEventLogRefusesUpdatesAndDeletes) {
  AddRun("r");
  IncidentStore incidents(db_.get(), &clock_);
  const int64_t id = *incidents.Create("r", Opened(1));
  ASSERT_TRUE(incidents.AppendEvent(id, "note", "x").ok());
  EXPECT_FALSE(db_->Execute("UPDATE incident_events SET kind = 'forged'").ok());
  EXPECT_FALSE(db_->Execute("DELETE FROM incident_events").ok());
  EXPECT_EQ(incidents.Events(id)->front().kind, "note");
}

}  // namespace
}  // namespace spikeguard::storage
