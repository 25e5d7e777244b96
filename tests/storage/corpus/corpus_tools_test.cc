#include "storage/corpus/corpus_tools.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/storage/corpus/test_dir.h"

namespace spikeguard::storage {
namespace {

using testing_util::FreshDir;
using testing_util::ReadFile;
using testing_util::WriteFile;

struct Opened {
  std::unique_ptr<Corpus> corpus;
  std::unique_ptr<DataOrder> order;
};

Opened OpenWithDefaults(const std::string& dir, const CorpusMetadata& meta) {
  Opened o;
  auto corpus = Corpus::Open(dir);
  EXPECT_TRUE(corpus.ok()) << corpus.status();
  o.corpus = std::move(*corpus);
  auto order = DataOrder::Create(*o.corpus, meta.default_manifest);
  EXPECT_TRUE(order.ok()) << order.status();
  o.order = std::move(*order);
  return o;
}

bool AllAscii(const std::vector<uint8_t>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b < 128; });
}

TEST(ParsePoisonTest, AcceptsTheFourKindsAndRejectsTheRest) {
  auto p = ParsePoison("highbytes@600");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, PoisonKind::kHighBytes);
  EXPECT_EQ(p->position, 600);
  EXPECT_TRUE(ParsePoisons({"ngram@1", "junk@2", "duplicate@3"}).ok());
  for (const char* bad : {"junk", "junk@", "junk@-1", "bits@5", "junk@5@6", "@5"}) {
    EXPECT_FALSE(ParsePoison(bad).ok()) << bad;
  }
}

TEST(SynthesizeCorpusTest, DefaultCorpusCoversATwoThousandStepRunInOneEpoch) {
  std::string dir = FreshDir();
  auto meta = SynthesizeCorpus(dir, 7, {});
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_EQ(meta->domains.size(), 3u);
  EXPECT_EQ(meta->domains[0].name, "code");
  EXPECT_EQ(meta->domains[1].name, "numbers");
  EXPECT_EQ(meta->domains[2].name, "prose");
  EXPECT_EQ(meta->default_manifest.global_batch_size, 16);
  EXPECT_EQ(meta->default_manifest.sequence_length, 64);
  Opened o = OpenWithDefaults(dir, *meta);
  EXPECT_EQ(o.order->slots_per_domain(), (std::vector<int32_t>{4, 4, 8}));
  // 3,000 batches of 16 × 65 tokens before any domain wraps.
  for (int d = 0; d < 3; ++d) {
    EXPECT_GE(o.corpus->domain(d).num_tokens(),
              3000 * o.order->slots_per_domain()[d] * 65);
  }
  auto last = o.order->Resolve(2999);
  ASSERT_TRUE(last.ok());
  for (const auto& s : last->samples) {
    for (const auto& span : s.spans) EXPECT_EQ(span.epoch, 0);
  }
  // Every batch is ASCII text of the three styles.
  for (int64_t p : {0, 1234, 2999}) {
    auto batch = o.order->Materialize(p);
    ASSERT_TRUE(batch.ok());
    EXPECT_TRUE(AllAscii(batch->tokens)) << p;
  }
  auto prose = o.corpus->domain(2).DocumentBytes(0);
  auto code = o.corpus->domain(0).DocumentBytes(0);
  auto numbers = o.corpus->domain(1).DocumentBytes(0);
  ASSERT_TRUE(prose.ok() && code.ok() && numbers.ok());
  EXPECT_NE(prose->find(' '), std::string::npos);
  EXPECT_NE(code->find('{'), std::string::npos);
  EXPECT_NE(numbers->find(','), std::string::npos);
}

TEST(SynthesizeCorpusTest, SameSeedSameBytesOtherSeedOtherBytes) {
  std::string dir = FreshDir();
  SynthOptions small;
  small.positions = 200;
  auto a = SynthesizeCorpus(dir + "/a", 11, {{PoisonKind::kJunk, 50}}, small);
  auto b = SynthesizeCorpus(dir + "/b", 11, {{PoisonKind::kJunk, 50}}, small);
  auto c = SynthesizeCorpus(dir + "/c", 12, {{PoisonKind::kJunk, 50}}, small);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->fingerprint, b->fingerprint);
  EXPECT_EQ(ReadFile(dir + "/a/prose.bin"), ReadFile(dir + "/b/prose.bin"));
  EXPECT_NE(a->fingerprint, c->fingerprint);
}

// Synthesizes with one poison of `kind` at 40 and checks that batch.
class PoisonPlacementTest : public ::testing::TestWithParam<PoisonKind> {};

TEST_P(PoisonPlacementTest, PoisonFillsExactlyTheRequestedBatch) {
  const PoisonKind kind = GetParam();
  const int64_t at = 40;
  std::string dir = FreshDir();
  SynthOptions small;
  small.positions = 120;
  auto meta = SynthesizeCorpus(dir, 5, {{kind, at}}, small);
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_EQ(meta->poisons.size(), 1u);
  EXPECT_EQ(meta->poisons[0].position, at);
  Opened o = OpenWithDefaults(dir, *meta);

  // The documents the daemon would name for that batch are the poison's.
  auto docs = o.order->DocumentsAt(at);
  ASSERT_TRUE(docs.ok());
  EXPECT_EQ(*docs, meta->poisons[0].documents);

  auto batch = o.order->Materialize(at);
  ASSERT_TRUE(batch.ok());
  const auto& t = batch->tokens;
  const size_t c = batch->sample_tokens;
  switch (kind) {
    case PoisonKind::kHighBytes:
      EXPECT_TRUE(std::all_of(t.begin(), t.end(), [](uint8_t b) { return b >= 128; }));
      break;
    case PoisonKind::kJunk: {
      const auto high = std::count_if(t.begin(), t.end(), [](uint8_t b) { return b >= 128; });
      EXPECT_GT(high, static_cast<long>(t.size() / 3));  // ~half, and not ASCII text
      EXPECT_LT(high, static_cast<long>(t.size() * 2 / 3));
      break;
    }
    case PoisonKind::kNgram: {
      EXPECT_TRUE(AllAscii(t));
      // Very few distinct 8-grams: the batch is one phrase repeated.
      std::set<std::string> grams;
      for (size_t i = 0; i + 8 <= t.size(); i += 1) grams.emplace(t.begin() + i, t.begin() + i + 8);
      EXPECT_LE(grams.size(), 24u * 16 + 24u);
      break;
    }
    case PoisonKind::kDuplicate: {
      EXPECT_TRUE(AllAscii(t));
      for (size_t row = 1; row < 16; ++row) {
        EXPECT_TRUE(std::equal(t.begin(), t.begin() + c, t.begin() + row * c)) << row;
      }
      EXPECT_EQ(meta->poisons[0].documents.size(), 16u);
      break;
    }
  }
  // The neighbours are ordinary text.
  for (int64_t p : {at - 1, at + 1}) {
    auto other = o.order->Materialize(p);
    ASSERT_TRUE(other.ok());
    EXPECT_TRUE(AllAscii(other->tokens)) << p;
    if (kind == PoisonKind::kDuplicate) {
      EXPECT_FALSE(std::equal(other->tokens.begin(), other->tokens.begin() + c,
                              other->tokens.begin() + c));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, PoisonPlacementTest,
                         ::testing::Values(PoisonKind::kNgram, PoisonKind::kJunk,
                                           PoisonKind::kHighBytes, PoisonKind::kDuplicate),
                         [](const auto& info) { return std::string(PoisonKindName(info.param)); });

TEST(SynthesizeCorpusTest, SeveralPoisonsIncludingAdjacentOnesAndPositionZero) {
  std::string dir = FreshDir();
  SynthOptions small;
  small.positions = 100;
  auto meta = SynthesizeCorpus(
      dir, 3, {{PoisonKind::kHighBytes, 31}, {PoisonKind::kHighBytes, 0}, {PoisonKind::kHighBytes, 30}},
      small);
  ASSERT_TRUE(meta.ok()) << meta.status();
  Opened o = OpenWithDefaults(dir, *meta);
  for (int64_t p = 0; p < 40; ++p) {
    auto batch = o.order->Materialize(p);
    ASSERT_TRUE(batch.ok());
    const bool poisoned = p == 0 || p == 30 || p == 31;
    const auto high = std::count_if(batch->tokens.begin(), batch->tokens.end(),
                                    [](uint8_t b) { return b >= 128; });
    EXPECT_EQ(high, poisoned ? static_cast<long>(batch->tokens.size()) : 0) << p;
  }
  EXPECT_FALSE(SynthesizeCorpus(dir, 3, {{PoisonKind::kJunk, 100}}, small).ok());
  EXPECT_FALSE(SynthesizeCorpus(dir, 3, {{PoisonKind::kJunk, 5}, {PoisonKind::kNgram, 5}}, small).ok());
}

TEST(CorpusMetadataTest, RoundTripsThroughTheFile) {
  std::string dir = FreshDir();
  SynthOptions small;
  small.positions = 60;
  auto meta = SynthesizeCorpus(dir, 9, {{PoisonKind::kNgram, 10}, {PoisonKind::kDuplicate, 20}},
                               small);
  ASSERT_TRUE(meta.ok());
  auto back = ReadCorpusMetadata(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->fingerprint, meta->fingerprint);
  EXPECT_EQ(back->default_manifest.seed, 9u);
  EXPECT_EQ(back->default_manifest.blend, meta->default_manifest.blend);
  EXPECT_EQ(back->default_manifest.plan, DataPlan::Default());
  ASSERT_EQ(back->domains.size(), 3u);
  EXPECT_EQ(back->domains[2].tokens, meta->domains[2].tokens);
  ASSERT_EQ(back->poisons.size(), 2u);
  EXPECT_EQ(back->poisons[1].kind, PoisonKind::kDuplicate);
  EXPECT_EQ(back->poisons[1].documents, meta->poisons[1].documents);
  auto corpus = Corpus::Open(dir);
  ASSERT_TRUE(corpus.ok());
  EXPECT_EQ((*corpus)->fingerprint(), back->fingerprint);

  WriteFile(dir + "/corpus.meta", "format 2\n");
  EXPECT_EQ(ReadCorpusMetadata(dir).status().code(), absl::StatusCode::kDataLoss);
}

TEST(BuildCorpusTest, SplitsDocumentsAtBlankLines) {
  std::string dir = FreshDir();
  WriteFile(dir + "/a.txt", "First paragraph\nstill first.\n\n\n  \nSecond one.\r\n\r\nThird");
  WriteFile(dir + "/b.txt", "only one document\n");
  auto meta = BuildCorpus(dir + "/out", {{"essays", dir + "/a.txt"}, {"notes", dir + "/b.txt"}});
  ASSERT_TRUE(meta.ok()) << meta.status();
  auto corpus = Corpus::Open(dir + "/out");
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  ASSERT_EQ((*corpus)->num_domains(), 2);
  const IndexedDataset& essays = (*corpus)->domain(0);
  ASSERT_EQ(essays.num_documents(), 3);
  EXPECT_EQ(*essays.DocumentBytes(0), "First paragraph\nstill first.\n");
  EXPECT_EQ(*essays.DocumentBytes(1), "Second one.\n");
  EXPECT_EQ(*essays.DocumentBytes(2), "Third\n");
  EXPECT_EQ((*corpus)->domain(1).num_documents(), 1);
  EXPECT_EQ(meta->default_manifest.blend.size(), 2u);
  EXPECT_EQ(meta->fingerprint, (*corpus)->fingerprint());

  EXPECT_EQ(BuildCorpus(dir + "/x", {{"bad name", dir + "/a.txt"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildCorpus(dir + "/x", {{"missing", dir + "/nope.txt"}}).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace spikeguard::storage
