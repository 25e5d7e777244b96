#include "storage/corpus/data_order.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/corpus/rng.h"
#include "tests/storage/corpus/test_dir.h"

namespace spikeguard::storage {
namespace {

using testing_util::FreshDir;

// A small corpus: three domains of varied document lengths (some empty),
// each document's bytes telling domain and id apart.
class DataOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    SplitMix64 rng(99);
    const std::vector<std::pair<std::string, int>> domains = {{"alpha", 40}, {"beta", 25},
                                                              {"gamma", 60}};
    for (const auto& [name, n] : domains) {
      auto w = IndexedDatasetWriter::Create(dir_ + "/" + name, TokenDType::kUint8);
      ASSERT_TRUE(w.ok());
      std::vector<std::string> docs;
      for (int i = 0; i < n; ++i) {
        std::string doc;
        const int64_t len = (i % 7 == 3) ? 0 : rng.Range(1, 150);
        for (int64_t t = 0; t < len; ++t) doc.push_back(static_cast<char>(rng.Uniform(256)));
        docs.push_back(doc);
        ASSERT_TRUE((*w)->AddDocument(absl::string_view(doc)).ok());
      }
      ASSERT_TRUE((*w)->Finish().ok());
      docs_[name] = docs;
    }
    auto corpus = Corpus::Open(dir_);
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    corpus_ = std::move(*corpus);
    manifest_.dataset_fingerprint = corpus_->fingerprint();
    manifest_.seed = 42;
    manifest_.global_batch_size = 8;
    manifest_.sequence_length = 31;
    manifest_.blend = {{"alpha", 0.5}, {"beta", 0.25}, {"gamma", 0.25}};
  }

  std::unique_ptr<DataOrder> Order(const Manifest& m) {
    auto order = DataOrder::Create(*corpus_, m);
    EXPECT_TRUE(order.ok()) << order.status();
    return order.ok() ? std::move(*order) : nullptr;
  }

  // The reference: the domain stream built by brute force over epochs.
  std::string Stream(const std::string& name, uint64_t seed, int64_t min_tokens) {
    std::string stream;
    const auto& docs = docs_[name];
    for (int64_t e = 0; static_cast<int64_t>(stream.size()) < min_tokens; ++e) {
      for (int64_t id : DocumentOrderForEpoch(seed, name, docs.size(), e)) stream += docs[id];
    }
    return stream;
  }

  std::string dir_;
  std::map<std::string, std::vector<std::string>> docs_;
  std::unique_ptr<Corpus> corpus_;
  Manifest manifest_;
};

TEST_F(DataOrderTest, BlendBecomesFixedSlotsPerBatch) {
  auto order = Order(manifest_);
  ASSERT_NE(order, nullptr);
  EXPECT_EQ(order->slots_per_domain(), (std::vector<int32_t>{4, 2, 2}));
  auto slots = SlotsPerDomain({"a", "b", "c"}, {{"a", 1}, {"b", 1}, {"c", 1}}, 16);
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(*slots, (std::vector<int32_t>{6, 5, 5}));  // tie goes to the first by name
  auto starved = SlotsPerDomain({"a", "b"}, {{"a", 1000}, {"b", 1}}, 16);
  EXPECT_EQ(starved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(starved.status().message().find("'b'"), std::string::npos) << starved.status();
}

TEST_F(DataOrderTest, MaterializedTokensMatchABruteForceStreamAcrossEpochs) {
  auto order = Order(manifest_);
  ASSERT_NE(order, nullptr);
  const int64_t c = manifest_.sequence_length + 1;
  // Position 150 is several epochs deep for every domain here.
  const std::vector<int64_t> positions = {0, 1, 7, 33, 150};
  std::map<std::string, std::string> streams;
  for (const auto& name : corpus_->domain_names()) {
    streams[name] = Stream(name, manifest_.seed, 151 * 4 * c);
  }
  for (int64_t p : positions) {
    auto batch = order->Materialize(p);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->tokens.size(), 8u * c);
    int slot = 0;
    for (int d = 0; d < corpus_->num_domains(); ++d) {
      const int n = order->slots_per_domain()[d];
      for (int j = 0; j < n; ++j, ++slot) {
        EXPECT_EQ(batch->sample_domain[slot], d);
        const int64_t k = p * n + j;
        std::string want = streams[corpus_->domain_name(d)].substr(k * c, c);
        std::string got(batch->tokens.begin() + slot * c, batch->tokens.begin() + (slot + 1) * c);
        EXPECT_EQ(got, want) << "position " << p << " slot " << slot;
      }
    }
  }
}

TEST_F(DataOrderTest, ResolutionAgreesWithMaterializedTokens) {
  auto order = Order(manifest_);
  ASSERT_NE(order, nullptr);
  const int64_t c = manifest_.sequence_length + 1;
  for (int64_t p : {0, 5, 61, 1000000007}) {
    auto ref = order->Resolve(p);
    auto batch = order->Materialize(p);
    ASSERT_TRUE(ref.ok() && batch.ok());
    ASSERT_EQ(ref->samples.size(), 8u);
    for (size_t i = 0; i < ref->samples.size(); ++i) {
      std::string from_spans;
      for (const DocumentSpan& s : ref->samples[i].spans) {
        EXPECT_GT(s.length, 0);
        const std::string& doc = docs_[corpus_->domain_name(s.domain)][s.document];
        ASSERT_LE(s.offset + s.length, static_cast<int64_t>(doc.size()));
        from_spans += doc.substr(s.offset, s.length);
      }
      std::string got(batch->tokens.begin() + i * c, batch->tokens.begin() + (i + 1) * c);
      EXPECT_EQ(from_spans, got) << "position " << p << " sample " << i;
    }
  }
  auto docs = order->DocumentsAt(5);
  ASSERT_TRUE(docs.ok());
  EXPECT_FALSE(docs->empty());
  EXPECT_TRUE(std::is_sorted(docs->begin(), docs->end()));
}

TEST_F(DataOrderTest, IsDeterministicAndDependsOnTheSeed) {
  auto a = Order(manifest_);
  auto b = Order(manifest_);
  Manifest other = manifest_;
  other.seed = 43;
  auto c = Order(other);
  ASSERT_TRUE(a && b && c);
  int differing = 0;
  for (int64_t p = 0; p < 20; ++p) {
    auto ta = a->Materialize(p);
    auto tb = b->Materialize(p);
    auto tc = c->Materialize(p);
    ASSERT_TRUE(ta.ok() && tb.ok() && tc.ok());
    EXPECT_EQ(ta->tokens, tb->tokens) << p;
    differing += ta->tokens != tc->tokens;
  }
  EXPECT_GT(differing, 15);
  // Resolving out of order gives the same answer as in order (no hidden state).
  auto late = b->Materialize(3);
  auto fresh = Order(manifest_)->Materialize(3);
  ASSERT_TRUE(late.ok() && fresh.ok());
  EXPECT_EQ(late->tokens, fresh->tokens);
  auto one_shot = MaterializeBatch(*corpus_, manifest_, 3);
  ASSERT_TRUE(one_shot.ok());
  EXPECT_EQ(one_shot->tokens, fresh->tokens);
}

TEST_F(DataOrderTest, EachEpochVisitsEveryDocumentOnce) {
  for (int64_t e : {0, 1, 2}) {
    auto order = DocumentOrderForEpoch(7, "alpha", 40, e);
    std::set<int64_t> seen(order.begin(), order.end());
    EXPECT_EQ(seen.size(), 40u);
    EXPECT_EQ(*seen.rbegin(), 39);
  }
  EXPECT_NE(DocumentOrderForEpoch(7, "alpha", 40, 0), DocumentOrderForEpoch(7, "alpha", 40, 1));
  EXPECT_NE(DocumentOrderForEpoch(7, "alpha", 40, 0), DocumentOrderForEpoch(7, "beta", 40, 0));
}

TEST_F(DataOrderTest, HoleShiftsLaterStepsToLaterBatches) {
  auto plain = Order(manifest_);
  Manifest holed_m = manifest_;
  holed_m.plan = *DataPlan::Default().WithHole(10, 13);
  auto holed = Order(holed_m);
  ASSERT_TRUE(plain && holed);
  for (int64_t step : {0, 9, 10, 11, 40}) {
    auto pos = holed->PositionForStep(step);
    ASSERT_TRUE(pos.ok());
    auto got = holed->Materialize(*pos);
    auto want = plain->Materialize(step < 10 ? step : step + 3);
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_EQ(got->tokens, want->tokens) << "step " << step;
  }
}

TEST_F(DataOrderTest, ManifestErrorsNameTheProblem) {
  Manifest m = manifest_;
  m.dataset_fingerprint = "0000000000000000";
  auto wrong = DataOrder::Create(*corpus_, m);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find(corpus_->fingerprint()), std::string::npos);

  m = manifest_;
  m.blend["delta"] = 1;
  auto unknown = DataOrder::Create(*corpus_, m);
  EXPECT_NE(unknown.status().message().find("'delta'"), std::string::npos) << unknown.status();

  m = manifest_;
  m.global_batch_size = 0;
  EXPECT_NE(m.Validate().message().find("global_batch_size"), std::string::npos);
  m = manifest_;
  m.blend["beta"] = -1;
  EXPECT_NE(m.Validate().message().find("beta"), std::string::npos);

  auto order = Order(manifest_);
  EXPECT_EQ(order->Resolve(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DataOrderTest, MaterializeRefusesNonByteTokens) {
  std::string dir = dir_ + "/wide";
  std::filesystem::create_directories(dir);
  auto w = IndexedDatasetWriter::Create(dir + "/w", TokenDType::kUint16);
  ASSERT_TRUE(w.ok());
  std::vector<int32_t> doc(100, 7);
  doc[50] = 300;
  ASSERT_TRUE((*w)->AddDocument(absl::MakeConstSpan(doc)).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto corpus = Corpus::Open(dir);
  ASSERT_TRUE(corpus.ok());
  Manifest m;
  m.global_batch_size = 2;
  m.sequence_length = 63;
  auto batch = MaterializeBatch(**corpus, m, 0);
  ASSERT_FALSE(batch.ok());
  EXPECT_NE(batch.status().message().find("token 300"), std::string::npos) << batch.status();
}

}  // namespace
}  // namespace spikeguard::storage
