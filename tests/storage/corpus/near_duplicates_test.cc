#include "storage/corpus/near_duplicates.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "gtest/gtest.h"
#include "storage/corpus/corpus_tools.h"
#include "tests/storage/corpus/test_dir.h"

namespace spikeguard::storage {
namespace {

using testing_util::FreshDir;

// The true Jaccard similarity of two documents' k-byte shingle sets (a
// document shorter than k is one shingle, an empty one none).
std::set<std::string> Shingles(const std::string& doc, int k) {
  std::set<std::string> out;
  if (doc.empty()) return out;
  if (static_cast<int>(doc.size()) < k) return {doc};
  for (size_t i = 0; i + k <= doc.size(); ++i) out.insert(doc.substr(i, k));
  return out;
}

double TrueJaccard(const std::string& a, const std::string& b, int k = 5) {
  const std::set<std::string> sa = Shingles(a, k), sb = Shingles(b, k);
  size_t common = 0;
  for (const std::string& s : sa) common += sb.count(s);
  const size_t all = sa.size() + sb.size() - common;
  return all == 0 ? 0.0 : static_cast<double>(common) / all;
}

std::vector<DocumentId> Ids(const std::vector<SimilarDocument>& docs) {
  std::vector<DocumentId> ids;
  for (const SimilarDocument& d : docs) ids.push_back(DocumentId{d.domain, d.document_id});
  return ids;
}

// Two domains of 30 documents of pseudo-words. news:3 is the original; near
// copies of it: web:7 (3% of bytes changed), web:12 (a prefix added) and
// news:20 (a suffix added). news:25 and web:25 are the same 3-byte document,
// news:26 and web:26 are empty; the rest are unrelated.
class NearDuplicateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    SplitMix64 rng(2024);
    std::vector<std::string> words;
    for (int i = 0; i < 800; ++i) {
      std::string w;
      const int64_t len = rng.Range(3, 9);
      for (int64_t j = 0; j < len; ++j) w.push_back(static_cast<char>('a' + rng.Uniform(26)));
      words.push_back(w);
    }
    auto text = [&] {
      std::string t;
      const int64_t n = rng.Range(80, 140);
      for (int64_t i = 0; i < n; ++i) {
        t += words[rng.Uniform(words.size())];
        t += i % 12 == 11 ? ". " : " ";
      }
      return t;
    };
    for (const char* name : {"news", "web"}) {
      docs_[name].resize(30);
      for (std::string& d : docs_[name]) d = text();
    }
    original_ = docs_["news"][3];
    std::string mutated = original_;
    for (size_t i = 0; i < mutated.size(); ++i) {
      if (rng.Uniform(100) < 3) mutated[i] = static_cast<char>('A' + rng.Uniform(26));
    }
    docs_["web"][7] = mutated;
    docs_["web"][12] = "Reprinted from the morning edition. " + original_;
    docs_["news"][20] = original_ + " Comments are closed on this story.";
    docs_["news"][25] = docs_["web"][25] = "hey";
    docs_["news"][26] = docs_["web"][26] = "";
    for (const auto& [name, docs] : docs_) {
      auto w = IndexedDatasetWriter::Create(dir_ + "/" + name, TokenDType::kUint8);
      ASSERT_TRUE(w.ok()) << w.status();
      for (const std::string& d : docs) ASSERT_TRUE((*w)->AddDocument(absl::string_view(d)).ok());
      ASSERT_TRUE((*w)->Finish().ok());
    }
    auto corpus = Corpus::Open(dir_);
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    corpus_ = std::move(*corpus);
  }

  std::unique_ptr<NearDuplicateIndex> Index(NearDuplicateOptions o = {}) {
    auto index = NearDuplicateIndex::Build(*corpus_, o);
    EXPECT_TRUE(index.ok()) << index.status();
    return index.ok() ? std::move(*index) : nullptr;
  }

  std::vector<SimilarDocument> Similar(const NearDuplicateIndex& index, const DocumentId& q,
                                       const std::vector<DocumentId>& exclude = {}) {
    auto got = index.Similar(q, exclude);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : std::vector<SimilarDocument>{};
  }

  const std::string& Doc(const DocumentId& id) { return docs_[id.domain][id.document]; }

  std::string dir_;
  std::map<std::string, std::vector<std::string>> docs_;
  std::string original_;
  std::unique_ptr<Corpus> corpus_;
};

const DocumentId kOriginal{"news", 3};
const DocumentId kMutated{"web", 7};
const DocumentId kPrefixed{"web", 12};
const DocumentId kSuffixed{"news", 20};

TEST_F(NearDuplicateTest, NearCopiesRankFirstWithTheirTrueJaccard) {
  auto index = Index();
  ASSERT_NE(index, nullptr);
  const std::vector<SimilarDocument> got = Similar(*index, kOriginal);

  // The reference: every other document at least 0.5 similar, by brute force.
  std::set<DocumentId> want;
  for (const auto& [name, docs] : docs_) {
    for (int64_t i = 0; i < static_cast<int64_t>(docs.size()); ++i) {
      const DocumentId id{name, i};
      if (id != kOriginal && TrueJaccard(original_, docs[i]) >= 0.5) want.insert(id);
    }
  }
  EXPECT_EQ(want, (std::set<DocumentId>{kMutated, kPrefixed, kSuffixed}));  // the corpus is sane
  const std::vector<DocumentId> ids = Ids(got);
  EXPECT_EQ(std::set<DocumentId>(ids.begin(), ids.end()), want);
  EXPECT_EQ(ids.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i].similarity, TrueJaccard(original_, Doc(ids[i])), 1e-12) << i;
    EXPECT_GE(got[i].similarity, 0.5);
    if (i > 0) {
      EXPECT_GE(got[i - 1].similarity, got[i].similarity);
    }
  }
  // The small edits (prefix, suffix) are nearer than 3% of bytes changed.
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(ids.back(), kMutated);
  EXPECT_LT(got.back().similarity, 0.9);
}

TEST_F(NearDuplicateTest, NeverReturnsTheQueryOrAnExcludedDocument) {
  auto index = Index();
  ASSERT_NE(index, nullptr);
  const std::vector<DocumentId> without_mutated =
      Ids(Similar(*index, kOriginal, {kMutated, DocumentId{"web", 0}}));
  EXPECT_EQ(std::set<DocumentId>(without_mutated.begin(), without_mutated.end()),
            (std::set<DocumentId>{kPrefixed, kSuffixed}));
  EXPECT_EQ(without_mutated.size(), 2u);
  EXPECT_TRUE(Similar(*index, kOriginal, {kMutated, kPrefixed, kSuffixed}).empty());
  // From a copy, the original and the other copies; not the copy itself.
  const std::vector<DocumentId> from_copy = Ids(Similar(*index, kPrefixed));
  EXPECT_EQ(std::set<DocumentId>(from_copy.begin(), from_copy.end()),
            (std::set<DocumentId>{kOriginal, kMutated, kSuffixed}));
}

TEST_F(NearDuplicateTest, ADocumentWithoutNearDuplicatesGetsNothing) {
  auto index = Index();
  ASSERT_NE(index, nullptr);
  for (int64_t i : {0, 10, 29}) {
    EXPECT_TRUE(Similar(*index, DocumentId{"news", i}).empty()) << i;
    EXPECT_TRUE(Similar(*index, DocumentId{"web", i}).empty()) << i;
  }
  // A lower threshold lets in less similar documents, best first, and
  // max_results caps them.
  NearDuplicateOptions loose;
  loose.min_similarity = 0;
  loose.max_results = 2;
  auto loose_index = Index(loose);
  ASSERT_NE(loose_index, nullptr);
  const std::vector<SimilarDocument> top2 = Similar(*loose_index, kOriginal);
  ASSERT_EQ(top2.size(), 2u);
  EXPECT_EQ(std::set<DocumentId>({Ids(top2)[0], Ids(top2)[1]}),
            (std::set<DocumentId>{kPrefixed, kSuffixed}));
}

TEST_F(NearDuplicateTest, ShortAndEmptyDocuments) {
  auto index = Index();
  ASSERT_NE(index, nullptr);
  auto stats = index->Prepare();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 60);
  EXPECT_EQ(stats->indexed, 60);
  EXPECT_FALSE(stats->truncated);
  EXPECT_EQ(stats->empty, 2);
  EXPECT_EQ(stats->short_documents, 2);
  // A document shorter than a shingle is one shingle: its copy is found.
  const std::vector<SimilarDocument> hey = Similar(*index, DocumentId{"news", 25});
  ASSERT_EQ(hey.size(), 1u);
  EXPECT_EQ(hey[0], (SimilarDocument{"web", 25, 1.0}));
  // Empty documents have nothing to compare: no results, never a result.
  EXPECT_TRUE(Similar(*index, DocumentId{"news", 26}).empty());
  EXPECT_TRUE(Similar(*index, DocumentId{"web", 26}).empty());
}

TEST_F(NearDuplicateTest, DeterministicForASeedAndEstimatesTrackTheTrueJaccard) {
  NearDuplicateOptions estimate_only;
  estimate_only.exact_rerank = false;
  auto a = Index(estimate_only);
  auto b = Index(estimate_only);
  NearDuplicateOptions other_seed = estimate_only;
  other_seed.seed = 99;
  auto c = Index(other_seed);
  ASSERT_TRUE(a && b && c);
  const std::vector<SimilarDocument> from_a = Similar(*a, kOriginal);
  EXPECT_EQ(from_a, Similar(*b, kOriginal));
  const std::vector<SimilarDocument> from_c = Similar(*c, kOriginal);
  ASSERT_EQ(from_a.size(), 3u);
  ASSERT_EQ(from_c.size(), 3u);
  bool any_differs = false;
  for (size_t i = 0; i < 3; ++i) {
    const double truth = TrueJaccard(original_, Doc(Ids(from_a)[i]));
    EXPECT_NEAR(from_a[i].similarity, truth, 0.15) << i;  // ~3.4 standard deviations
    // 128 hashes: every estimate is a multiple of 1/128.
    EXPECT_DOUBLE_EQ(from_a[i].similarity * 128, std::round(from_a[i].similarity * 128));
    auto same_in_c = std::find_if(from_c.begin(), from_c.end(), [&](const SimilarDocument& s) {
      return s.domain == from_a[i].domain && s.document_id == from_a[i].document_id;
    });
    ASSERT_NE(same_in_c, from_c.end());
    any_differs = any_differs || same_in_c->similarity != from_a[i].similarity;
  }
  EXPECT_TRUE(any_differs) << "the seed should pick another hash family";
}

TEST_F(NearDuplicateTest, MaxDocumentsScannedBoundsTheIndexPerDomain) {
  NearDuplicateOptions small;
  small.max_documents_scanned = 20;
  auto index = Index(small);
  ASSERT_NE(index, nullptr);
  auto stats = index->Prepare();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->indexed, 20);
  EXPECT_TRUE(stats->truncated);
  // Ten of each domain: ids 0..9. Only the mutated copy (web:7) is findable,
  // but any document can still be a query.
  EXPECT_EQ(Ids(Similar(*index, kOriginal)), (std::vector<DocumentId>{kMutated}));
  EXPECT_EQ(Ids(Similar(*index, kPrefixed)), (std::vector<DocumentId>{kOriginal, kMutated}));
}

TEST_F(NearDuplicateTest, InvalidOptionsAndQueriesAreRefused) {
  NearDuplicateOptions o;
  o.bands = 30;  // does not divide 128
  auto bad = NearDuplicateIndex::Build(*corpus_, o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bands"), std::string::npos) << bad.status();
  o = {};
  o.shingle_bytes = 0;
  EXPECT_NE(o.Validate().message().find("shingle_bytes"), std::string::npos);
  o = {};
  o.min_similarity = 1.5;
  EXPECT_NE(o.Validate().message().find("min_similarity"), std::string::npos);

  auto index = Index();
  ASSERT_NE(index, nullptr);
  auto unknown = index->Similar(DocumentId{"blogs", 1});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("'blogs'"), std::string::npos) << unknown.status();
  EXPECT_EQ(index->Similar(DocumentId{"news", 30}).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(index->Similar(DocumentId{"news", -1}).status().code(),
            absl::StatusCode::kOutOfRange);
}

// How spikeguard lists "documents like the quarantined one": in a synthetic
// corpus, one poison document finds the other documents of its poison, in
// every domain, and not those of another poison.
TEST(NearDuplicateSynthTest, APoisonDocumentFindsTheOtherDocumentsOfItsPoison) {
  const std::string dir = FreshDir();
  SynthOptions small;
  small.positions = 120;
  auto meta = SynthesizeCorpus(dir, 3,
                               {{PoisonKind::kDuplicate, 30},
                                {PoisonKind::kNgram, 50},
                                {PoisonKind::kDuplicate, 70},
                                {PoisonKind::kNgram, 90}},
                               small);
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_EQ(meta->poisons.size(), 4u);
  auto corpus = Corpus::Open(dir);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  NearDuplicateOptions o;
  o.max_results = 50;
  auto index = NearDuplicateIndex::Build(**corpus, o);
  ASSERT_TRUE(index.ok()) << index.status();

  std::set<DocumentId> all_poison;
  for (const PlacedPoison& p : meta->poisons) {
    all_poison.insert(p.documents.begin(), p.documents.end());
  }
  for (const PlacedPoison& p : meta->poisons) {
    SCOPED_TRACE(absl::StrCat(PoisonKindName(p.kind), "@", p.position));
    // duplicate: one document per sample (16); ngram: one per domain (3).
    ASSERT_EQ(p.documents.size(), p.kind == PoisonKind::kDuplicate ? 16u : 3u);
    const DocumentId quarantined = p.documents[1];
    auto got = (*index)->Similar(quarantined);
    ASSERT_TRUE(got.ok()) << got.status();
    std::set<DocumentId> want(p.documents.begin(), p.documents.end());
    want.erase(quarantined);
    ASSERT_GE(got->size(), want.size());
    // The poison's other documents first, all of them, as identical text.
    const std::vector<DocumentId> ids = Ids(*got);
    EXPECT_EQ(std::set<DocumentId>(ids.begin(), ids.begin() + want.size()), want);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ((*got)[i].similarity, 1.0) << i;
    // Nothing of another poison; anything else is ordinary text, less alike.
    for (size_t i = want.size(); i < ids.size(); ++i) {
      EXPECT_FALSE(all_poison.count(ids[i])) << ids[i].domain << ":" << ids[i].document;
      EXPECT_LT((*got)[i].similarity, 1.0);
    }
    // Excluding what is already quarantined leaves the rest of the poison.
    auto rest = (*index)->Similar(quarantined, {p.documents[0], p.documents[2]});
    ASSERT_TRUE(rest.ok());
    const std::vector<DocumentId> rest_ids = Ids(*rest);
    EXPECT_EQ(std::count(rest_ids.begin(), rest_ids.end(), p.documents[0]), 0);
    EXPECT_EQ(std::count(rest_ids.begin(), rest_ids.end(), p.documents[2]), 0);
    if (got->size() < 50u) {
      EXPECT_EQ(rest->size(), got->size() - 2);
    }
  }
}

}  // namespace
}  // namespace spikeguard::storage
