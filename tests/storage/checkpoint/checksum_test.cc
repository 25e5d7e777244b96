#include "storage/checkpoint/checksum.h"

#include <string>

#include "gtest/gtest.h"

namespace spikeguard::storage {
namespace {

// Published XXH64 vectors: a checksum written by this build must match any
// other xxHash implementation.
TEST(Xxh64Test, MatchesPublishedVectors) {
  EXPECT_EQ(Xxh64Of(""), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(Xxh64Of("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(Xxh64Of("abc"), 0x44BC2CF5AD770999ULL);
  EXPECT_EQ(ChecksumHex(Xxh64Of("")), "ef46db3751d8e999");
}

TEST(Xxh64Test, StreamingEqualsOneShotForAnySplit) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 131 + 7));
  const uint64_t want = Xxh64Of(data);
  for (size_t split : {0u, 1u, 7u, 31u, 32u, 33u, 64u, 999u, 1000u}) {
    Xxh64 h;
    h.Update(absl::string_view(data).substr(0, split));
    h.Update(absl::string_view(data).substr(split));
    EXPECT_EQ(h.Digest(), want) << "split at " << split;
  }
  EXPECT_NE(Xxh64Of(data), Xxh64Of(data.substr(1)));
}

}  // namespace
}  // namespace spikeguard::storage
