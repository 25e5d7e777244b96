// near_duplicates.h
// -----------------------------------------------------------------------------
// Near-duplicate search over a Corpus: given one document (say, one the
// daemon quarantined after a DATA incident), the documents elsewhere in the
// corpus, in any domain, whose text is nearly the same, so an operator can
// filter them too.
//
// Method: MinHash over shingles with LSH banding.
//   * A document's shingles are its runs of `shingle_bytes` consecutive
//     tokens (bytes for the byte corpora spikeguard makes; any token dtype the
//     IndexedDataset reads works). A non-empty document shorter than that is
//     one shingle, the whole document. An empty document has no shingle: it
//     is never a result, and querying it gives no result.
//   * Its signature is, for each of `num_hashes` hash functions of a seeded
//     deterministic family, the least hash over its shingles (4 bytes each).
//     The fraction of equal signature entries of two documents estimates the
//     Jaccard similarity |A ∩ B| / |A ∪ B| of their shingle sets.
//   * Signatures are cut into `bands` bands of num_hashes / bands rows; two
//     documents agreeing on every row of some band are candidates. With the
//     defaults (32 bands of 4 rows) a pair of similarity 0.5 is a candidate
//     with probability 0.87, 0.6 with 0.99, 0.3 with 0.23.
//   * Candidates are ranked by the estimate and, with `exact_rerank`, the
//     best of them are rescored with the true Jaccard of their shingle sets
//     (read back from the corpus), so the reported similarity is exact.
//
// The index is built once, lazily, by the first query (or Prepare()): one
// pass over the corpus; memory is 4·num_hashes + 8·bands bytes per indexed
// document (640 bytes with the defaults), independent of document length.
// At most `max_documents_scanned` documents are indexed, split over the
// domains in proportion to their document counts (the lowest ids of each);
// Prepare() reports whether the corpus was cut. Any document, indexed or
// not, can be queried; only indexed documents are found.
//
// Text it finds: copies, copies with edits, a prefix or a suffix, repeated
// phrases (spikeguard's "ngram" and "duplicate" poisons). It does not relate
// documents of uniformly random bytes (the "junk" and "highbytes" poisons):
// they share no shingles, so they are not near-duplicates of each other.
//
//   SG_ASSIGN_OR_RETURN(auto corpus, Corpus::Open("/data/corpus"));
//   SG_ASSIGN_OR_RETURN(auto index, NearDuplicateIndex::Build(*corpus));
//   DocumentId quarantined{"prose", 934};
//   SG_ASSIGN_OR_RETURN(std::vector<SimilarDocument> like,
//                       index->Similar(quarantined, /*exclude=*/already_quarantined));
//   for (const SimilarDocument& s : like) {
//     SG_LOG(INFO) << s.domain << ":" << s.document_id << " " << s.similarity;
//   }
//
// Equal (corpus, options) give equal results on every machine. Thread-safe:
// concurrent queries share one index.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/corpus/corpus.h"
#include "storage/corpus/data_order.h"

namespace spikeguard::storage {

struct SimilarDocument {
  std::string domain;
  int64_t document_id = 0;
  // Jaccard similarity of the shingle sets, in [0, 1]: exact when the
  // options ask for exact_rerank (the default), else the MinHash estimate.
  double similarity = 0;
  bool operator==(const SimilarDocument&) const = default;
};

struct NearDuplicateOptions {
  // Tokens per shingle, 1..64.
  int shingle_bytes = 5;
  // MinHash functions, 1..1024; a multiple of `bands`.
  int num_hashes = 128;
  // LSH bands; more bands (fewer rows each) find less similar pairs.
  int bands = 32;
  // Results less similar than this are dropped; in [0, 1].
  double min_similarity = 0.5;
  // At most this many results, >= 1.
  int max_results = 10;
  // Picks the hash family. Equal seeds give equal signatures.
  uint64_t seed = 0x6e656172647570ULL;  // "neardup"
  // Documents the index holds at most, 1..2^32-1 (see above).
  int64_t max_documents_scanned = int64_t{1} << 20;
  // Rescore the best candidates with the true Jaccard of their shingle sets.
  bool exact_rerank = true;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// What the index holds, from Prepare().
struct NearDuplicateStats {
  int64_t documents = 0;        // in the corpus
  int64_t indexed = 0;          // signed and findable (empty ones included)
  int64_t empty = 0;            // indexed documents without tokens
  int64_t short_documents = 0;  // indexed, non-empty, shorter than a shingle
  bool truncated = false;       // indexed < documents (max_documents_scanned)
};

class NearDuplicateIndex {
 public:
  // Validates the options; reads nothing yet. The corpus must outlive the
  // index.
  static absl::StatusOr<std::unique_ptr<NearDuplicateIndex>> Build(const Corpus& corpus,
                                                                   NearDuplicateOptions options = {});

  NearDuplicateIndex(const NearDuplicateIndex&) = delete;
  NearDuplicateIndex& operator=(const NearDuplicateIndex&) = delete;

  const NearDuplicateOptions& options() const { return options_; }

  // Builds the index now if no query has (one pass over the corpus). A read
  // error is returned here and by every later call.
  absl::StatusOr<NearDuplicateStats> Prepare() const;

  // The indexed documents most similar to `query`, best first (ties by
  // domain, then id), at least options().min_similarity, at most
  // options().max_results. Never `query` itself nor a document in `exclude`.
  // NOT_FOUND for an unknown domain, OUT_OF_RANGE for a document id it lacks.
  absl::StatusOr<std::vector<SimilarDocument>> Similar(
      const DocumentId& query, const std::vector<DocumentId>& exclude = {}) const;

 private:
  // One LSH bucket entry of a band: a hash of the band's rows and the
  // document's index (see index_).
  struct BandEntry {
    uint32_t key;
    uint32_t doc;
    bool operator<(const BandEntry& o) const {
      return key != o.key ? key < o.key : doc < o.doc;
    }
  };
  // Immutable once built.
  struct Index {
    // domain_begin[d]: index of document 0 of domain d; indexed documents of
    // domain d are ids [0, indexed[d]).
    std::vector<int64_t> domain_begin;
    std::vector<int64_t> indexed;
    std::vector<uint32_t> signatures;  // num_hashes per document
    std::vector<uint8_t> empty;        // 1 for a document without tokens
    std::vector<std::vector<BandEntry>> bands;  // each sorted
    NearDuplicateStats stats;
  };

  NearDuplicateIndex(const Corpus& corpus, NearDuplicateOptions options);
  absl::StatusOr<const Index*> GetIndex() const;
  absl::StatusOr<std::unique_ptr<Index>> BuildIndex() const;

  // Signature of document `doc` of domain `domain`; false when it is empty.
  absl::StatusOr<bool> Sign(int domain, int64_t doc, uint32_t* signature) const;
  // The document's distinct shingle hashes, sorted.
  absl::StatusOr<std::vector<uint64_t>> ShingleSet(int domain, int64_t doc) const;
  uint32_t BandKey(const uint32_t* signature, int band) const;

  const Corpus& corpus_;
  const NearDuplicateOptions options_;
  // The hash family: h_i(x) = high 32 bits of (mul_[i]·x + add_[i]).
  std::vector<uint64_t> mul_;
  std::vector<uint64_t> add_;

  mutable absl::Mutex mu_;
  mutable bool built_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Status build_status_ ABSL_GUARDED_BY(mu_);
  mutable std::unique_ptr<const Index> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spikeguard::storage
