// ManifestStore: immutable manifests by version.
#include "storage/catalog/manifest_store.h"

#include "gtest/gtest.h"
#include "tests/storage/catalog/store_fixture.h"

namespace spikeguard::storage {
namespace {

using ManifestStoreTest = testing::StoreTest;

TEST_F(ManifestStoreTest, AVersionIsWrittenOnceAndReadBackWhole) {
  AddRun("r");
  ManifestStore manifests(db_.get());
  v1::Manifest m;
  m.set_version(1);
  m.set_dataset_fingerprint("fp");
  m.set_seed(0xFFFFFFFFFFFFFFFFull);
  (*m.mutable_blend())["web"] = 0.7;
  (*m.mutable_blend())["code"] = 0.3;
  ASSERT_TRUE(manifests.Put("r", m).ok());
  ASSERT_TRUE(manifests.Put("r", m).ok()) << "an identical resend is fine";
  v1::Manifest other = m;
  other.set_seed(1);
  EXPECT_EQ(manifests.Put("r", other).code(), absl::StatusCode::kAlreadyExists);
  auto back = manifests.Get("r", 1);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->seed(), 0xFFFFFFFFFFFFFFFFull);
  EXPECT_EQ(back->blend().at("web"), 0.7);
  EXPECT_EQ(manifests.Get("r", 2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manifests.Put("nope", m).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace spikeguard::storage
