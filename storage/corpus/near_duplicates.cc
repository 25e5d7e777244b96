#include "storage/corpus/near_duplicates.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/splitmix64.h"
#include "base/status_macros.h"
#include "storage/checkpoint/checksum.h"

namespace spikeguard::storage {
namespace {

// Shingles are hashed this many at a time, so a long document needs a
// bounded buffer.
constexpr int64_t kChunkShingles = int64_t{1} << 16;
// Candidates whose estimate is this far below min_similarity are still
// rescored exactly (the estimate's standard deviation is at most
// 0.5 / sqrt(num_hashes), 0.044 with 128 hashes).
constexpr double kRerankSlack = 0.15;
// Candidates rescored exactly: this many per requested result, plus a few.
constexpr int64_t kRerankPerResult = 4;
constexpr int64_t kRerankExtra = 16;
// Documents longer than this keep their estimate rather than materializing
// a shingle set (8 bytes a token).
constexpr int64_t kMaxExactTokens = int64_t{1} << 24;

uint64_t Fmix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 33;
  return h;
}

// A 64-bit hash of `n` tokens; the length is part of it, so a short
// document's single shingle never equals a full-length one by construction.
uint64_t HashShingle(const int32_t* tokens, int64_t n, uint64_t seed) {
  uint64_t h = seed ^ (static_cast<uint64_t>(n) * 0x9E3779B97F4A7C15ULL);
  for (int64_t i = 0; i < n; ++i) {
    h = (h + static_cast<uint32_t>(tokens[i]) + 1) * 0x9E3779B97F4A7C15ULL;
    h = (h << 31) | (h >> 33);
  }
  return Fmix64(h);
}

// Calls fn(std::vector<uint64_t>& hashes) with the shingle hashes of document
// `doc`, a chunk at a time (unsorted, possibly repeated). Nothing for an empty
// document; one shingle for one shorter than `k`.
template <typename Fn>
absl::Status ForEachShingleChunk(const IndexedDataset& ds, int64_t doc, int k, uint64_t seed,
                                 Fn fn) {
  const int64_t n = ds.document_tokens(doc);
  if (n == 0) return absl::OkStatus();
  std::vector<int32_t> buf;
  std::vector<uint64_t> hashes;
  if (n < k) {
    buf.resize(n);
    SG_RETURN_IF_ERROR(ds.ReadDocument(doc, 0, absl::MakeSpan(buf)));
    hashes.push_back(HashShingle(buf.data(), n, seed));
    fn(hashes);
    return absl::OkStatus();
  }
  const int64_t shingles = n - k + 1;
  for (int64_t start = 0; start < shingles; start += kChunkShingles) {
    const int64_t count = std::min(kChunkShingles, shingles - start);
    buf.resize(count + k - 1);
    SG_RETURN_IF_ERROR(ds.ReadDocument(doc, start, absl::MakeSpan(buf)));
    hashes.clear();
    for (int64_t i = 0; i < count; ++i) hashes.push_back(HashShingle(buf.data() + i, k, seed));
    fn(hashes);
  }
  return absl::OkStatus();
}

void SortUnique(std::vector<uint64_t>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

// |a ∩ b| / |a ∪ b| of two sorted sets; 0 when both are empty.
double Jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  size_t i = 0, j = 0, common = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++common;
      ++i;
      ++j;
    }
  }
  const size_t all = a.size() + b.size() - common;
  return all == 0 ? 0.0 : static_cast<double>(common) / static_cast<double>(all);
}

}  // namespace

absl::Status NearDuplicateOptions::Validate() const {
  if (shingle_bytes < 1 || shingle_bytes > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("near-duplicate shingle_bytes must be in 1..64, got ", shingle_bytes));
  }
  if (num_hashes < 1 || num_hashes > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("near-duplicate num_hashes must be in 1..1024, got ", num_hashes));
  }
  if (bands < 1 || num_hashes % bands != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "near-duplicate bands must be positive and divide num_hashes (", num_hashes, "), got ",
        bands));
  }
  if (!std::isfinite(min_similarity) || min_similarity < 0 || min_similarity > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "near-duplicate min_similarity must be in [0, 1], got ", min_similarity));
  }
  if (max_results < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("near-duplicate max_results must be positive, got ", max_results));
  }
  if (max_documents_scanned < 1 || max_documents_scanned > int64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "near-duplicate max_documents_scanned must be in 1..", UINT32_MAX, ", got ",
        max_documents_scanned));
  }
  return absl::OkStatus();
}

NearDuplicateIndex::NearDuplicateIndex(const Corpus& corpus, NearDuplicateOptions options)
    : corpus_(corpus), options_(std::move(options)) {
  SplitMix64 rng(options_.seed);
  mul_.resize(options_.num_hashes);
  add_.resize(options_.num_hashes);
  for (int i = 0; i < options_.num_hashes; ++i) {
    mul_[i] = rng.Next() | 1;
    add_[i] = rng.Next();
  }
}

absl::StatusOr<std::unique_ptr<NearDuplicateIndex>> NearDuplicateIndex::Build(
    const Corpus& corpus, NearDuplicateOptions options) {
  SG_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<NearDuplicateIndex>(new NearDuplicateIndex(corpus, std::move(options)));
}

absl::StatusOr<bool> NearDuplicateIndex::Sign(int domain, int64_t doc, uint32_t* signature) const {
  const int h = options_.num_hashes;
  std::fill(signature, signature + h, UINT32_MAX);
  bool any = false;
  SG_RETURN_IF_ERROR(ForEachShingleChunk(
      corpus_.domain(domain), doc, options_.shingle_bytes, options_.seed,
      [&](std::vector<uint64_t>& hashes) {
        SortUnique(&hashes);  // repetitive text costs once per distinct shingle
        any = any || !hashes.empty();
        for (uint64_t x : hashes) {
          for (int i = 0; i < h; ++i) {
            const uint32_t v = static_cast<uint32_t>((mul_[i] * x + add_[i]) >> 32);
            signature[i] = std::min(signature[i], v);
          }
        }
      }));
  return any;
}

absl::StatusOr<std::vector<uint64_t>> NearDuplicateIndex::ShingleSet(int domain,
                                                                     int64_t doc) const {
  std::vector<uint64_t> all;
  SG_RETURN_IF_ERROR(ForEachShingleChunk(corpus_.domain(domain), doc, options_.shingle_bytes,
                                         options_.seed, [&](std::vector<uint64_t>& hashes) {
                                           all.insert(all.end(), hashes.begin(), hashes.end());
                                         }));
  SortUnique(&all);
  return all;
}

uint32_t NearDuplicateIndex::BandKey(const uint32_t* signature, int band) const {
  const int rows = options_.num_hashes / options_.bands;
  return static_cast<uint32_t>(
      Xxh64Of(signature + band * rows, sizeof(uint32_t) * rows, options_.seed + band));
}

absl::StatusOr<std::unique_ptr<NearDuplicateIndex::Index>> NearDuplicateIndex::BuildIndex()
    const {
  auto ix = std::make_unique<Index>();
  const int domains = corpus_.num_domains();
  int64_t total = 0;
  for (int d = 0; d < domains; ++d) total += corpus_.domain(d).num_documents();
  ix->stats.documents = total;

  // Quotas: everything, or max_documents_scanned split in proportion to the
  // domains' document counts, the rounding remainder to domains by name.
  const int64_t cap = options_.max_documents_scanned;
  ix->indexed.resize(domains);
  int64_t used = 0;
  for (int d = 0; d < domains; ++d) {
    const int64_t n = corpus_.domain(d).num_documents();
    ix->indexed[d] = total <= cap ? n
                                  : static_cast<int64_t>(static_cast<__int128>(cap) * n / total);
    used += ix->indexed[d];
  }
  for (int d = 0; d < domains && used < std::min(cap, total); ++d) {
    if (ix->indexed[d] < corpus_.domain(d).num_documents()) {
      ++ix->indexed[d];
      ++used;
    }
  }
  ix->stats.indexed = used;
  ix->stats.truncated = used < total;
  ix->domain_begin.resize(domains + 1, 0);
  for (int d = 0; d < domains; ++d) ix->domain_begin[d + 1] = ix->domain_begin[d] + ix->indexed[d];

  const int h = options_.num_hashes;
  ix->signatures.resize(static_cast<size_t>(used) * h);
  ix->empty.resize(used, 0);
  for (int d = 0; d < domains; ++d) {
    const IndexedDataset& ds = corpus_.domain(d);
    for (int64_t doc = 0; doc < ix->indexed[d]; ++doc) {
      const int64_t g = ix->domain_begin[d] + doc;
      SG_ASSIGN_OR_RETURN(bool any, Sign(d, doc, &ix->signatures[static_cast<size_t>(g) * h]));
      if (!any) {
        ix->empty[g] = 1;
        ++ix->stats.empty;
      } else if (ds.document_tokens(doc) < options_.shingle_bytes) {
        ++ix->stats.short_documents;
      }
    }
  }
  ix->bands.resize(options_.bands);
  for (int b = 0; b < options_.bands; ++b) {
    std::vector<BandEntry>& entries = ix->bands[b];
    entries.reserve(static_cast<size_t>(used - ix->stats.empty));
    for (int64_t g = 0; g < used; ++g) {
      if (ix->empty[g]) continue;
      entries.push_back(BandEntry{BandKey(&ix->signatures[static_cast<size_t>(g) * h], b),
                                  static_cast<uint32_t>(g)});
    }
    std::sort(entries.begin(), entries.end());
  }
  return ix;
}

absl::StatusOr<const NearDuplicateIndex::Index*> NearDuplicateIndex::GetIndex() const {
  absl::MutexLock lock(&mu_);
  if (!built_) {
    // Built under the lock: concurrent first queries wait for one pass.
    absl::StatusOr<std::unique_ptr<Index>> ix = BuildIndex();
    built_ = true;
    if (ix.ok()) {
      index_ = std::move(*ix);
    } else {
      build_status_ = ix.status();
    }
  }
  if (!build_status_.ok()) return build_status_;
  return index_.get();  // immutable from here on
}

absl::StatusOr<NearDuplicateStats> NearDuplicateIndex::Prepare() const {
  SG_ASSIGN_OR_RETURN(const Index* ix, GetIndex());
  return ix->stats;
}

absl::StatusOr<std::vector<SimilarDocument>> NearDuplicateIndex::Similar(
    const DocumentId& query, const std::vector<DocumentId>& exclude) const {
  SG_ASSIGN_OR_RETURN(const int qd, corpus_.DomainIndex(query.domain));
  if (query.document < 0 || query.document >= corpus_.domain(qd).num_documents()) {
    return absl::OutOfRangeError(absl::StrCat("domain '", query.domain, "' has no document ",
                                              query.document, " (it has ",
                                              corpus_.domain(qd).num_documents(), ")"));
  }
  SG_ASSIGN_OR_RETURN(const Index* ix, GetIndex());
  const int h = options_.num_hashes;
  std::vector<uint32_t> sig(h);
  SG_ASSIGN_OR_RETURN(const bool any, Sign(qd, query.document, sig.data()));
  if (!any) return std::vector<SimilarDocument>{};  // an empty document has no shingle

  // The index of an indexed document, or -1.
  auto global = [&](const DocumentId& id) -> int64_t {
    auto d = corpus_.DomainIndex(id.domain);
    if (!d.ok() || id.document < 0 || id.document >= ix->indexed[*d]) return -1;
    return ix->domain_begin[*d] + id.document;
  };
  std::vector<int64_t> excluded;
  excluded.push_back(global(query));
  for (const DocumentId& id : exclude) excluded.push_back(global(id));
  std::sort(excluded.begin(), excluded.end());

  // LSH: every document sharing a whole band with the query.
  std::vector<uint32_t> candidates;
  for (int b = 0; b < options_.bands; ++b) {
    const uint32_t key = BandKey(sig.data(), b);
    const std::vector<BandEntry>& entries = ix->bands[b];
    auto it = std::lower_bound(entries.begin(), entries.end(), BandEntry{key, 0});
    for (; it != entries.end() && it->key == key; ++it) candidates.push_back(it->doc);
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());

  struct Scored {
    int64_t g;
    double similarity;
  };
  const double keep_from =
      options_.exact_rerank ? options_.min_similarity - kRerankSlack : options_.min_similarity;
  std::vector<Scored> scored;
  for (uint32_t g : candidates) {
    if (std::binary_search(excluded.begin(), excluded.end(), int64_t{g})) continue;
    const uint32_t* other = &ix->signatures[static_cast<size_t>(g) * h];
    int equal = 0;
    for (int i = 0; i < h; ++i) equal += sig[i] == other[i];
    const double estimate = static_cast<double>(equal) / h;
    if (estimate >= keep_from) scored.push_back({g, estimate});
  }
  auto best_first = [](const Scored& a, const Scored& b) {
    return a.similarity != b.similarity ? a.similarity > b.similarity : a.g < b.g;
  };
  std::sort(scored.begin(), scored.end(), best_first);

  // Where document g lives.
  auto locate = [&](int64_t g) {
    const int d = static_cast<int>(
        std::upper_bound(ix->domain_begin.begin(), ix->domain_begin.end(), g) -
        ix->domain_begin.begin() - 1);
    return std::pair<int, int64_t>(d, g - ix->domain_begin[d]);
  };

  if (options_.exact_rerank && !scored.empty()) {
    const size_t rescore = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(scored.size()),
                          kRerankPerResult * options_.max_results + kRerankExtra));
    scored.resize(rescore);
    const bool query_fits = corpus_.domain(qd).document_tokens(query.document) <= kMaxExactTokens;
    std::vector<uint64_t> query_set;
    if (query_fits) {
      SG_ASSIGN_OR_RETURN(query_set, ShingleSet(qd, query.document));
    }
    for (Scored& s : scored) {
      const auto [d, doc] = locate(s.g);
      if (!query_fits || corpus_.domain(d).document_tokens(doc) > kMaxExactTokens) continue;
      SG_ASSIGN_OR_RETURN(std::vector<uint64_t> other, ShingleSet(d, doc));
      s.similarity = Jaccard(query_set, other);
    }
    std::sort(scored.begin(), scored.end(), best_first);
  }

  std::vector<SimilarDocument> out;
  for (const Scored& s : scored) {
    if (s.similarity < options_.min_similarity) continue;
    if (static_cast<int64_t>(out.size()) >= options_.max_results) break;
    const auto [d, doc] = locate(s.g);
    out.push_back(SimilarDocument{corpus_.domain_name(d), doc, s.similarity});
  }
  return out;
}

}  // namespace spikeguard::storage
