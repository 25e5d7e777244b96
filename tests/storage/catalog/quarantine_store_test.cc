// QuarantineStore: idempotent quarantine entries.
#include "storage/catalog/quarantine_store.h"

#include "gtest/gtest.h"
#include "storage/catalog/incident_store.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using QuarantineStoreTest = testing::StoreTest;

v1::QuarantineEntry Entry(const std::string& domain, int64_t document, const std::string& reason) {
  v1::QuarantineEntry e;
  e.set_run("r");
  e.set_domain(domain);
  e.set_document_id(document);
  e.set_reason(reason);
  return e;
}

TEST_F(QuarantineStoreTest, AnEntryKeepsItsFirstReasonAndIncident) {
  AddRun("r");
  IncidentStore incidents(db_.get(), &clock_);
  const int64_t incident = *incidents.Create("r", v1::Incident());
  QuarantineStore quarantine(db_.get(), &clock_);
  v1::QuarantineEntry first = Entry("web", 7, "incident");
  first.set_incident_id(incident);
  auto stored = quarantine.Add(first);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->incident_id(), incident);
  EXPECT_EQ(stored->created_unix_ms(), clock_.NowUnixMillis());
  auto again = quarantine.Add(Entry("web", 7, "operator"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->reason(), "incident");
  EXPECT_EQ(again->incident_id(), incident);
}

TEST_F(QuarantineStoreTest, ListIsByDomainThenDocument) {
  AddRun("r");
  QuarantineStore quarantine(db_.get(), &clock_);
  ASSERT_TRUE(quarantine.Add(Entry("web", 9, "x")).ok());
  ASSERT_TRUE(quarantine.Add(Entry("code", 3, "x")).ok());
  ASSERT_TRUE(quarantine.Add(Entry("web", 2, "x")).ok());
  auto all = quarantine.List("r");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].domain(), "code");
  EXPECT_EQ((*all)[1].document_id(), 2);
  EXPECT_EQ((*all)[2].document_id(), 9);
  EXPECT_EQ((*all)[0].incident_id(), 0) << "none";
}

TEST_F(QuarantineStoreTest, RefusesAnEmptyDomainAnUnknownRunAndAnUnknownIncident) {
  AddRun("r");
  QuarantineStore quarantine(db_.get(), &clock_);
  EXPECT_EQ(quarantine.Add(Entry("", 1, "x")).status().code(), absl::StatusCode::kInvalidArgument);
  v1::QuarantineEntry stray = Entry("web", 1, "x");
  stray.set_run("nope");
  EXPECT_EQ(quarantine.Add(stray).status().code(), absl::StatusCode::kNotFound);
  v1::QuarantineEntry orphan = Entry("web", 1, "x");
  orphan.set_incident_id(42);
  EXPECT_EQ(quarantine.Add(orphan).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(quarantine.List("r")->empty());
}

}  // namespace
}  // namespace spikeguard::storage
