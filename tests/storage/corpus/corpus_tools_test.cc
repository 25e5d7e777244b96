#include "storage/corpus/corpus_tools.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/corpus/near_duplicates.h"
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

// ---------------------------------------------------------------------------
// Poison echoes (SynthOptions::poison_echoes)

// Every batch position of the first epoch at which each document occurs.
std::map<DocumentId, std::set<int64_t>> WhereDocumentsAre(const DataOrder& order, int64_t positions) {
  std::map<DocumentId, std::set<int64_t>> at;
  for (int64_t p = 0; p < positions; ++p) {
    auto docs = order.DocumentsAt(p);
    EXPECT_TRUE(docs.ok()) << docs.status();
    if (!docs.ok()) continue;
    for (const DocumentId& d : *docs) at[d].insert(p);
  }
  return at;
}

TEST(PoisonEchoesTest, LeaveEveryPoisonedBatchAsItWas) {
  std::string dir = FreshDir();
  SynthOptions off;
  off.positions = 150;
  SynthOptions on = off;
  on.poison_echoes = 3;
  // One poison past EchoFirstPosition (100): echoes before it must not move it.
  const std::vector<PoisonSpec> poisons = {{PoisonKind::kHighBytes, 20},
                                           {PoisonKind::kNgram, 40},
                                           {PoisonKind::kDuplicate, 41},
                                           {PoisonKind::kJunk, 120}};
  auto plain = SynthesizeCorpus(dir + "/off", 13, poisons, off);
  auto echoed = SynthesizeCorpus(dir + "/on", 13, poisons, on);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  Opened a = OpenWithDefaults(dir + "/off", *plain);
  Opened b = OpenWithDefaults(dir + "/on", *echoed);
  ASSERT_EQ(echoed->poisons.size(), poisons.size());
  int64_t first_echo = on.positions;
  const auto where = WhereDocumentsAre(*b.order, on.positions);
  for (const PlacedPoison& p : echoed->poisons) {
    for (const DocumentId& e : p.echoes) {
      ASSERT_TRUE(where.count(e)) << e.domain << ":" << e.document;
      first_echo = std::min(first_echo, *where.at(e).begin());
    }
  }
  for (size_t i = 0; i < poisons.size(); ++i) {
    const PlacedPoison& p = echoed->poisons[i];
    EXPECT_TRUE(plain->poisons[i].echoes.empty());
    EXPECT_EQ(p.echoes.size(), 3u);
    EXPECT_EQ(p.kind, plain->poisons[i].kind);
    EXPECT_EQ(p.position, plain->poisons[i].position);
    EXPECT_EQ(p.documents.size(), plain->poisons[i].documents.size());
    // The batch: the same bytes, and the documents the daemon would name
    // there are the ones listed for the poison.
    auto x = a.order->Materialize(p.position);
    auto y = b.order->Materialize(p.position);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(x->tokens, y->tokens) << p.position;
    auto docs = b.order->DocumentsAt(p.position);
    ASSERT_TRUE(docs.ok());
    EXPECT_EQ(*docs, p.documents) << p.position;
  }
  // Every batch before the first echo is untouched.
  EXPECT_GE(first_echo, EchoFirstPosition(on.positions));
  for (int64_t q = 0; q < first_echo; ++q) {
    auto x = a.order->Materialize(q);
    auto y = b.order->Materialize(q);
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_EQ(x->tokens, y->tokens) << q;
  }
}

TEST(PoisonEchoesTest, LieInLateUnpoisonedBatchesEachOfItsOwn) {
  std::string dir = FreshDir();
  SynthOptions on;
  on.positions = 120;
  on.poison_echoes = 4;
  auto meta = SynthesizeCorpus(
      dir, 21, {{PoisonKind::kHighBytes, 10}, {PoisonKind::kNgram, 90}, {PoisonKind::kJunk, 95}},
      on);
  ASSERT_TRUE(meta.ok()) << meta.status();
  Opened o = OpenWithDefaults(dir, *meta);
  const auto where = WhereDocumentsAre(*o.order, on.positions);
  std::set<int64_t> poisoned, used;
  for (const PlacedPoison& p : meta->poisons) poisoned.insert(p.position);
  const std::vector<std::string> domains = {"code", "numbers", "prose"};
  for (const PlacedPoison& p : meta->poisons) {
    ASSERT_EQ(p.echoes.size(), 4u);
    EXPECT_TRUE(std::is_sorted(p.echoes.begin(), p.echoes.end()));
    std::map<std::string, int> per_domain;
    for (const DocumentId& e : p.echoes) {
      ++per_domain[e.domain];
      ASSERT_TRUE(where.count(e)) << e.domain << ":" << e.document;
      // Within one batch, a late one that is not poisoned, and no other
      // echo's (so the echoes of one poison are in different batches).
      ASSERT_EQ(where.at(e).size(), 1u) << e.domain << ":" << e.document;
      const int64_t q = *where.at(e).begin();
      EXPECT_GE(q, EchoFirstPosition(on.positions)) << q;
      EXPECT_LT(q, on.positions);
      EXPECT_FALSE(poisoned.count(q)) << q;
      EXPECT_TRUE(used.insert(q).second) << "two echoes at " << q;
      // An ordinary document: not one of the poison's.
      EXPECT_EQ(std::count(p.documents.begin(), p.documents.end(), e), 0);
    }
    // Echo k is in domain k mod 3: 4 echoes are 2 code, 1 numbers, 1 prose.
    EXPECT_EQ(per_domain, (std::map<std::string, int>{{"code", 2}, {"numbers", 1}, {"prose", 1}}));
  }
  EXPECT_EQ(EchoFirstPosition(120), 80);
  EXPECT_EQ(EchoFirstPosition(3000), 2000);
  EXPECT_EQ(EchoFirstPosition(100), 67);
}

// One poison of `kind` at 30 with 3 echoes (one per domain): the
// near-duplicate search from its documents finds exactly the echoes.
class PoisonEchoSimilarityTest : public ::testing::TestWithParam<PoisonKind> {};

TEST_P(PoisonEchoSimilarityTest, NearDuplicateSearchFromThePoisonFindsItsEchoes) {
  const PoisonKind kind = GetParam();
  std::string dir = FreshDir();
  SynthOptions on;
  on.positions = 120;
  on.poison_echoes = 3;
  auto meta = SynthesizeCorpus(dir, 8, {{kind, 30}}, on);
  ASSERT_TRUE(meta.ok()) << meta.status();
  const PlacedPoison& p = meta->poisons[0];
  ASSERT_EQ(p.echoes.size(), 3u);
  auto corpus = Corpus::Open(dir);
  ASSERT_TRUE(corpus.ok());
  auto index = NearDuplicateIndex::Build(**corpus);
  ASSERT_TRUE(index.ok());
  // Random-byte poisons: a document's only near-copy is its own domain's
  // echo. Phrase and duplicate poisons: every echo is like every document.
  const bool random_bytes = kind == PoisonKind::kJunk || kind == PoisonKind::kHighBytes;
  for (const DocumentId& q : p.documents) {
    auto like = (*index)->Similar(q, p.documents);
    ASSERT_TRUE(like.ok()) << like.status();
    std::vector<DocumentId> found;
    for (const SimilarDocument& s : *like) {
      found.push_back(DocumentId{s.domain, s.document_id});
      EXPECT_GE(s.similarity, 0.5) << s.domain << ":" << s.document_id;
      EXPECT_LE(s.similarity, random_bytes ? 0.99 : 1.0);
    }
    std::sort(found.begin(), found.end());
    std::vector<DocumentId> want;
    for (const DocumentId& e : p.echoes) {
      if (!random_bytes || e.domain == q.domain) want.push_back(e);
    }
    EXPECT_EQ(found, want) << q.domain << ":" << q.document;
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, PoisonEchoSimilarityTest,
                         ::testing::Values(PoisonKind::kNgram, PoisonKind::kJunk,
                                           PoisonKind::kHighBytes, PoisonKind::kDuplicate),
                         [](const auto& info) { return std::string(PoisonKindName(info.param)); });

TEST(PoisonEchoesTest, SameInputsSameBytesAndTheyRoundTripThroughTheMetadata) {
  std::string dir = FreshDir();
  SynthOptions on;
  on.positions = 120;
  on.poison_echoes = 2;
  const std::vector<PoisonSpec> poisons = {{PoisonKind::kHighBytes, 50}, {PoisonKind::kNgram, 60}};
  auto a = SynthesizeCorpus(dir + "/a", 4, poisons, on);
  auto b = SynthesizeCorpus(dir + "/b", 4, poisons, on);
  auto c = SynthesizeCorpus(dir + "/c", 5, poisons, on);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (const char* f : {"code.bin", "code.idx", "numbers.bin", "numbers.idx", "prose.bin",
                        "prose.idx", "corpus.meta"}) {
    EXPECT_EQ(ReadFile(dir + "/a/" + f), ReadFile(dir + "/b/" + f)) << f;
  }
  EXPECT_EQ(a->fingerprint, b->fingerprint);
  EXPECT_NE(a->fingerprint, c->fingerprint);
  for (size_t i = 0; i < poisons.size(); ++i) {
    EXPECT_EQ(a->poisons[i].echoes, b->poisons[i].echoes);
  }

  const std::string meta_text = ReadFile(dir + "/a/corpus.meta");
  EXPECT_NE(meta_text.find("\necho highbytes 50 "), std::string::npos) << meta_text;
  auto back = ReadCorpusMetadata(dir + "/a");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->poisons.size(), 2u);
  for (size_t i = 0; i < poisons.size(); ++i) {
    EXPECT_EQ(back->poisons[i].documents, a->poisons[i].documents);
    EXPECT_EQ(back->poisons[i].echoes, a->poisons[i].echoes);
    EXPECT_EQ(back->poisons[i].echoes.size(), 2u);
  }
  // Without echoes no echo line is written.
  auto none = SynthesizeCorpus(dir + "/d", 4, poisons, SynthOptions{.positions = 120});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(ReadFile(dir + "/d/corpus.meta").find("echo"), std::string::npos);
  // An echo line must follow its poison's.
  WriteFile(dir + "/d/corpus.meta", "format 1\necho junk 5 code:1\n");
  EXPECT_EQ(ReadCorpusMetadata(dir + "/d").status().code(), absl::StatusCode::kDataLoss);
}

TEST(PoisonEchoesTest, RejectsNegativeCountsAndTooFewLatePositions) {
  std::string dir = FreshDir();
  SynthOptions o;
  o.positions = 30;  // echoes may take positions 20..29
  o.poison_echoes = -1;
  EXPECT_EQ(SynthesizeCorpus(dir, 1, {{PoisonKind::kJunk, 5}}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.poison_echoes = 5;
  // 2 poisons × 5 echoes: 10 positions, but poison 25 holds one of them.
  EXPECT_EQ(SynthesizeCorpus(dir, 1, {{PoisonKind::kJunk, 5}, {PoisonKind::kNgram, 25}}, o)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SynthesizeCorpus(dir, 1, {{PoisonKind::kJunk, 5}, {PoisonKind::kNgram, 15}}, o).ok());
  // No poisons, no echoes, whatever the count.
  o.poison_echoes = 1000;
  auto meta = SynthesizeCorpus(dir, 1, {}, o);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->poisons.empty());
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
