#include "storage/corpus/data_order.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "base/splitmix64.h"
#include "gtest/gtest.h"
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

TEST_F(DataOrderTest, SampleMaskDropsExactlyTheMaskedRowsOfThatBatch) {
  auto plain = Order(manifest_);
  Manifest masked_m = manifest_;
  masked_m.plan = *DataPlan::Default().WithMask(7, {0, 3, 6});
  auto masked = Order(masked_m);
  ASSERT_TRUE(plain && masked);
  auto full = plain->Materialize(7);
  auto part = masked->Materialize(7);
  ASSERT_TRUE(full.ok() && part.ok()) << part.status();
  const int32_t t = full->sample_tokens;
  ASSERT_EQ(part->batch_size, full->batch_size - 3);
  EXPECT_EQ(part->sample_slots, (std::vector<int32_t>{1, 2, 4, 5, 7}));
  for (int32_t i = 0; i < part->batch_size; ++i) {
    const int32_t slot = part->sample_slots[i];
    EXPECT_EQ(std::string(part->tokens.begin() + i * t, part->tokens.begin() + (i + 1) * t),
              std::string(full->tokens.begin() + slot * t, full->tokens.begin() + (slot + 1) * t))
        << "row " << i;
    EXPECT_EQ(part->sample_domain[i], full->sample_domain[slot]);
  }
  // Other batches are whole.
  auto other = masked->Materialize(8);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->tokens, plain->Materialize(8)->tokens);
  EXPECT_EQ(other->sample_slots.size(), static_cast<size_t>(manifest_.global_batch_size));
}

TEST_F(DataOrderTest, SampleMaskPastTheBatchOrOfEveryRowIsRefused) {
  Manifest past = manifest_;
  past.plan = *DataPlan::Default().WithMask(2, {8});
  auto batch = Order(past)->Materialize(2);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(batch.status().message().find("slot 8 of batch 2"), std::string::npos)
      << batch.status();
  Manifest all = manifest_;
  all.plan = *DataPlan::Default().WithMask(2, {0, 1, 2, 3, 4, 5, 6, 7});
  batch = Order(all)->Materialize(2);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(batch.status().message().find("every sample of batch 2"), std::string::npos)
      << batch.status();
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

// The brute-force stream of domain `name` (epochs 0, 1, ... concatenated), as
// the id of the document each token comes from.
std::vector<int64_t> OriginStream(const Corpus& corpus, const std::string& name, uint64_t seed,
                                  int64_t min_tokens) {
  const IndexedDataset& ds = corpus.domain(*corpus.DomainIndex(name));
  std::vector<int64_t> origin;
  for (int64_t e = 0; static_cast<int64_t>(origin.size()) < min_tokens; ++e) {
    for (int64_t id : DocumentOrderForEpoch(seed, name, ds.num_documents(), e)) {
      origin.insert(origin.end(), ds.document_tokens(id), id);
    }
  }
  return origin;
}

// The documents of batch `p` by brute force: every document with a token in
// the token range of one of the batch's samples.
std::set<DocumentId> DocumentsByBruteForce(const Corpus& corpus, const DataOrder& order,
                                           int64_t p) {
  const int64_t c = order.manifest().sequence_length + 1;
  std::set<DocumentId> want;
  for (int d = 0; d < corpus.num_domains(); ++d) {
    const int64_t n = order.slots_per_domain()[d];
    if (n == 0) continue;
    const std::string& name = corpus.domain_name(d);
    const std::vector<int64_t> origin =
        OriginStream(corpus, name, order.manifest().seed, (p + 1) * n * c);
    for (int64_t t = p * n * c; t < (p + 1) * n * c; ++t) want.insert(DocumentId{name, origin[t]});
  }
  return want;
}

TEST_F(DataOrderTest, DocumentsAtListsEveryDocumentOverlappingTheBatchAcrossEpochs) {
  auto order = Order(manifest_);
  ASSERT_NE(order, nullptr);
  // 1..4 documents per sample, empty documents, and several epochs per domain.
  for (int64_t p = 0; p < 90; ++p) {
    auto docs = order->DocumentsAt(p);
    ASSERT_TRUE(docs.ok()) << docs.status();
    const std::set<DocumentId> want = DocumentsByBruteForce(*corpus_, *order, p);
    EXPECT_EQ(std::set<DocumentId>(docs->begin(), docs->end()), want) << "position " << p;
    EXPECT_EQ(docs->size(), want.size()) << "duplicates at position " << p;
  }
}

// A corpus laid out by hand so that documents cross sample and batch
// boundaries at known places. Every document is one repeated byte unique to
// it, so a token names its document.
class SpanningDocumentTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSeed = 5;

  void SetUp() override {
    dir_ = FreshDir();
    // Batch: 2 samples of "long", 1 of "short"; a sample is 16 tokens, so
    // batch p is "long" stream tokens [32p, 32p + 32) and "short" stream
    // tokens [16p, 16p + 16).
    //   long stream slots: [0,10) [10,50) [50,60) [60,70) [70,90) [90,112)
    //                      [112,120) [120,140); epoch 140 tokens.
    //   [10,50) crosses the sample boundary 16 of batch 0, the batch boundary
    //   32 and the sample boundary 48 of batch 1; [70,90) crosses only the
    //   sample boundary 80 inside batch 2.
    Write("long", {10, 40, 10, 10, 20, 22, 8, 20}, 'A');
    Write("short", {5, 25, 7, 3, 13}, 'a');
    auto corpus = Corpus::Open(dir_);
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    corpus_ = std::move(*corpus);
    manifest_.seed = kSeed;
    manifest_.global_batch_size = 3;
    manifest_.sequence_length = 15;
    manifest_.blend = {{"long", 2}, {"short", 1}};
    auto order = DataOrder::Create(*corpus_, manifest_);
    ASSERT_TRUE(order.ok()) << order.status();
    order_ = std::move(*order);
    ASSERT_EQ(order_->slots_per_domain(), (std::vector<int32_t>{2, 1}));
  }

  // Documents whose epoch-0 stream slot s has lengths[s] tokens, all of byte
  // first + id.
  void Write(const std::string& name, const std::vector<int64_t>& lengths, char first) {
    const int64_t n = static_cast<int64_t>(lengths.size());
    const std::vector<int64_t> order = DocumentOrderForEpoch(kSeed, name, n, 0);
    std::vector<std::string> docs(n);
    for (int64_t s = 0; s < n; ++s) {
      docs[order[s]] = std::string(lengths[s], static_cast<char>(first + order[s]));
    }
    stream_ids_[name] = order;
    auto w = IndexedDatasetWriter::Create(dir_ + "/" + name, TokenDType::kUint8);
    ASSERT_TRUE(w.ok());
    for (const std::string& d : docs) ASSERT_TRUE((*w)->AddDocument(absl::string_view(d)).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }

  DocumentId LongAt(int slot) { return DocumentId{"long", stream_ids_["long"][slot]}; }

  std::vector<DocumentId> Docs(int64_t p) {
    auto docs = order_->DocumentsAt(p);
    EXPECT_TRUE(docs.ok()) << docs.status();
    return docs.ok() ? *docs : std::vector<DocumentId>{};
  }

  static bool Has(const std::vector<DocumentId>& docs, const DocumentId& id) {
    return std::find(docs.begin(), docs.end(), id) != docs.end();
  }

  std::string dir_;
  std::unique_ptr<Corpus> corpus_;
  Manifest manifest_;
  std::unique_ptr<DataOrder> order_;
  std::map<std::string, std::vector<int64_t>> stream_ids_;
};

TEST_F(SpanningDocumentTest, ADocumentCrossingABatchBoundaryIsListedAtBothPositions) {
  const DocumentId spanning = LongAt(1);  // stream [10, 50)
  EXPECT_TRUE(Has(Docs(0), spanning));
  EXPECT_TRUE(Has(Docs(1), spanning));
  EXPECT_FALSE(Has(Docs(2), spanning));
  // [60,70) crosses 64 into batch 2; [90,112) crosses 96 into batch 3;
  // [120,140) crosses 128 into batch 4, which also starts epoch 1.
  for (auto [slot, first] : {std::pair{3, 1}, {5, 2}, {7, 3}}) {
    EXPECT_TRUE(Has(Docs(first), LongAt(slot))) << "slot " << slot;
    EXPECT_TRUE(Has(Docs(first + 1), LongAt(slot))) << "slot " << slot;
  }
  // [70, 90) crosses the sample boundary 80 inside batch 2 only; both of the
  // batch's "long" samples name it, the batch lists it once.
  const DocumentId inner = LongAt(4);
  EXPECT_FALSE(Has(Docs(1), inner));
  const std::vector<DocumentId> at2 = Docs(2);
  EXPECT_EQ(std::count(at2.begin(), at2.end(), inner), 1);
  EXPECT_FALSE(Has(Docs(3), inner));
  auto ref = order_->Resolve(2);
  ASSERT_TRUE(ref.ok());
  for (int sample : {0, 1}) {
    const auto& spans = ref->samples[sample].spans;
    EXPECT_TRUE(std::any_of(spans.begin(), spans.end(), [&](const DocumentSpan& s) {
      return s.domain == 0 && s.document == inner.document && s.epoch == 0;
    })) << "sample " << sample;
  }
  // Batch 0 is exactly stream slots 0 and 1 of "long" and 0, 1 of "short".
  const std::vector<int64_t>& short_ids = stream_ids_["short"];
  std::vector<DocumentId> want = {LongAt(0), LongAt(1), {"short", short_ids[0]},
                                  {"short", short_ids[1]}};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Docs(0), want);
}

TEST_F(SpanningDocumentTest, ListedDocumentsAreExactlyTheOnesWhoseTokensTheBatchHolds) {
  // 10 batches: two epochs of "long", three of "short".
  for (int64_t p = 0; p < 10; ++p) {
    auto batch = order_->Materialize(p);
    ASSERT_TRUE(batch.ok()) << batch.status();
    std::set<DocumentId> from_tokens;
    for (int32_t i = 0; i < batch->batch_size; ++i) {
      const bool is_long = batch->sample_domain[i] == 0;
      for (int32_t t = 0; t < batch->sample_tokens; ++t) {
        const uint8_t b = batch->tokens[static_cast<size_t>(i) * batch->sample_tokens + t];
        from_tokens.insert(is_long ? DocumentId{"long", b - 'A'} : DocumentId{"short", b - 'a'});
      }
    }
    const std::vector<DocumentId> docs = Docs(p);
    EXPECT_EQ(std::set<DocumentId>(docs.begin(), docs.end()), from_tokens) << "position " << p;
    EXPECT_EQ(std::set<DocumentId>(docs.begin(), docs.end()),
              DocumentsByBruteForce(*corpus_, *order_, p))
        << "position " << p;
  }
}

TEST_F(SpanningDocumentTest, ResolvedSpansTileEveryDocumentOncePerEpoch) {
  // Positions 0..9 cover epochs 0 and 1 of "long" (280 of 320 tokens) and
  // epochs 0..2 of "short" (159 of 160): every document of those epochs must
  // be covered by its spans exactly once, in stream order, across batches.
  std::map<std::tuple<int32_t, int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>>
      pieces;  // (domain, epoch, document) → (offset, length)
  std::map<int32_t, int64_t> stream_offset;  // where the next span must start
  for (int64_t p = 0; p < 10; ++p) {
    auto ref = order_->Resolve(p);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_EQ(ref->position, p);
    ASSERT_EQ(ref->samples.size(), 3u);
    for (const SampleRef& s : ref->samples) {
      int64_t total = 0;
      for (const DocumentSpan& span : s.spans) {
        ASSERT_EQ(span.domain, s.domain);
        ASSERT_GT(span.length, 0);
        pieces[{span.domain, span.epoch, span.document}].push_back({span.offset, span.length});
        total += span.length;
      }
      EXPECT_EQ(total, 16);
      // Samples of a domain follow each other in its stream.
      EXPECT_EQ(s.domain_sample * 16, stream_offset[s.domain]);
      stream_offset[s.domain] += total;
    }
  }
  const std::map<int32_t, int64_t> full_epochs = {{0, 2}, {1, 3}};
  for (const auto& [domain, epochs] : full_epochs) {
    const IndexedDataset& ds = corpus_->domain(domain);
    for (int64_t e = 0; e < epochs; ++e) {
      for (int64_t doc = 0; doc < ds.num_documents(); ++doc) {
        auto it = pieces.find({domain, e, doc});
        ASSERT_NE(it, pieces.end()) << domain << "/" << e << "/" << doc;
        int64_t next = 0;
        for (auto [offset, length] : it->second) {
          EXPECT_EQ(offset, next) << domain << "/" << e << "/" << doc;
          next = offset + length;
        }
        EXPECT_EQ(next, ds.document_tokens(doc)) << domain << "/" << e << "/" << doc;
      }
    }
  }
}

}  // namespace
}  // namespace spikeguard::storage
