#include "storage/corpus/data_order.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "base/status_macros.h"
#include "storage/checkpoint/checksum.h"

namespace spikeguard::storage {
namespace {

// Epoch layouts kept per domain; a run reads one or two epochs at a time, and
// the daemon resolving an old window touches one more.
constexpr size_t kCachedEpochs = 4;

}  // namespace

absl::Status Manifest::Validate() const {
  if (global_batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest global_batch_size must be positive, got ", global_batch_size));
  }
  if (sequence_length <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest sequence_length must be positive, got ", sequence_length));
  }
  double total = 0;
  for (const auto& [name, w] : blend) {
    SG_RETURN_IF_ERROR(ValidateDomainName(name));
    if (!std::isfinite(w) || w < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest blend weight of '", name, "' must be finite and >= 0, got ", w));
    }
    total += w;
  }
  if (!blend.empty() && total <= 0) {
    return absl::InvalidArgumentError("manifest blend weights sum to zero");
  }
  return DataPlan::Validate(plan.ranges());
}

std::vector<int64_t> DocumentOrderForEpoch(uint64_t seed, absl::string_view domain_name,
                                           int64_t num_documents, int64_t epoch) {
  std::vector<int64_t> order(num_documents);
  std::iota(order.begin(), order.end(), 0);
  SplitMix64 rng(Xxh64Of(domain_name, seed) ^
                 (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ULL));
  for (int64_t i = num_documents - 1; i > 0; --i) {  // Fisher-Yates
    const int64_t j = static_cast<int64_t>(rng.Uniform(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

absl::StatusOr<std::vector<int32_t>> SlotsPerDomain(const std::vector<std::string>& domain_names,
                                                    const std::map<std::string, double>& blend,
                                                    int32_t global_batch_size) {
  const size_t n = domain_names.size();
  std::vector<double> w(n, 0.0);
  for (const auto& [name, weight] : blend) {
    auto it = std::find(domain_names.begin(), domain_names.end(), name);
    if (it == domain_names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest blend names domain '", name, "', which the corpus lacks"));
    }
    w[it - domain_names.begin()] = weight;
  }
  if (blend.empty()) std::fill(w.begin(), w.end(), 1.0);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  if (total <= 0) return absl::InvalidArgumentError("manifest blend weights sum to zero");

  std::vector<int32_t> slots(n, 0);
  std::vector<std::pair<double, size_t>> remainders;
  int32_t used = 0;
  for (size_t d = 0; d < n; ++d) {
    const double exact = global_batch_size * w[d] / total;
    slots[d] = static_cast<int32_t>(std::floor(exact));
    used += slots[d];
    remainders.push_back({exact - slots[d], d});
  }
  // Largest remainder first; equal remainders go to the domain first by name.
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; used < global_batch_size; ++i, ++used) ++slots[remainders[i].second];
  for (size_t d = 0; d < n; ++d) {
    if (w[d] > 0 && slots[d] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "domain '", domain_names[d], "' has blend weight ", w[d], " but gets no slot of a ",
          global_batch_size, "-sample batch; raise its weight or the batch size"));
    }
  }
  return slots;
}

DataOrder::DataOrder(const Corpus& corpus, Manifest manifest, std::vector<int32_t> slots)
    : corpus_(corpus), manifest_(std::move(manifest)), slots_(std::move(slots)) {
  for (int32_t d = 0; d < static_cast<int32_t>(slots_.size()); ++d) {
    for (int32_t j = 0; j < slots_[d]; ++j) {
      slot_domain_.push_back(d);
      slot_rank_.push_back(j);
    }
    state_.push_back(std::make_unique<DomainState>());
  }
}

absl::StatusOr<std::unique_ptr<DataOrder>> DataOrder::Create(const Corpus& corpus,
                                                             Manifest manifest) {
  SG_RETURN_IF_ERROR(manifest.Validate());
  if (!manifest.dataset_fingerprint.empty() &&
      manifest.dataset_fingerprint != corpus.fingerprint()) {
    return absl::FailedPreconditionError(
        absl::StrCat("manifest is for dataset fingerprint ", manifest.dataset_fingerprint,
                     " but the corpus has fingerprint ", corpus.fingerprint()));
  }
  SG_ASSIGN_OR_RETURN(std::vector<int32_t> slots,
                      SlotsPerDomain(corpus.domain_names(), manifest.blend,
                                     manifest.global_batch_size));
  for (int d = 0; d < corpus.num_domains(); ++d) {
    if (slots[d] > 0 && corpus.domain(d).num_tokens() == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "domain '", corpus.domain_name(d), "' has blend weight but no tokens"));
    }
  }
  return std::unique_ptr<DataOrder>(new DataOrder(corpus, std::move(manifest), std::move(slots)));
}

std::shared_ptr<const DataOrder::EpochLayout> DataOrder::Layout(int32_t domain,
                                                                int64_t epoch) const {
  DomainState& st = *state_[domain];
  {
    absl::MutexLock lock(&st.mu);
    auto it = st.epochs.find(epoch);
    if (it != st.epochs.end()) return it->second;
  }
  // Built outside the lock; two threads may both build it, the results are equal.
  const IndexedDataset& ds = corpus_.domain(domain);
  auto layout = std::make_shared<EpochLayout>();
  layout->order = DocumentOrderForEpoch(manifest_.seed, corpus_.domain_name(domain),
                                        ds.num_documents(), epoch);
  layout->starts.resize(layout->order.size() + 1);
  layout->starts[0] = 0;
  for (size_t i = 0; i < layout->order.size(); ++i) {
    layout->starts[i + 1] = layout->starts[i] + ds.document_tokens(layout->order[i]);
  }
  absl::MutexLock lock(&st.mu);
  st.epochs.emplace(epoch, layout);
  while (st.epochs.size() > kCachedEpochs) {
    // Evict the epoch farthest from the one just used.
    auto first = st.epochs.begin();
    auto last = std::prev(st.epochs.end());
    st.epochs.erase(epoch - first->first >= last->first - epoch ? first : last);
  }
  return layout;
}

SampleRef DataOrder::ResolveSample(int32_t domain, int64_t k) const {
  const int64_t sample_tokens = manifest_.sequence_length + 1;
  const int64_t epoch_tokens = corpus_.domain(domain).num_tokens();
  SampleRef ref;
  ref.domain = domain;
  ref.domain_sample = k;
  int64_t offset = k * sample_tokens;
  int64_t left = sample_tokens;
  while (left > 0) {
    const int64_t epoch = offset / epoch_tokens;
    const int64_t in_epoch = offset % epoch_tokens;
    std::shared_ptr<const EpochLayout> layout = Layout(domain, epoch);
    // The last stream slot starting at or before in_epoch; empty documents
    // share their start with the next one and are skipped by upper_bound.
    const auto it = std::upper_bound(layout->starts.begin(), layout->starts.end(), in_epoch);
    const size_t slot = static_cast<size_t>(it - layout->starts.begin()) - 1;
    const int64_t doc_offset = in_epoch - layout->starts[slot];
    const int64_t take = std::min(left, layout->starts[slot + 1] - layout->starts[slot] - doc_offset);
    ref.spans.push_back(DocumentSpan{domain, layout->order[slot], doc_offset, take, epoch});
    offset += take;
    left -= take;
  }
  return ref;
}

absl::StatusOr<BatchRef> DataOrder::Resolve(int64_t position) const {
  if (position < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative data position ", position));
  }
  const int64_t b = manifest_.global_batch_size;
  // k = position * n_d + j' must not overflow int64 token offsets.
  if (position > INT64_MAX / (b * (manifest_.sequence_length + 1)) - 1) {
    return absl::OutOfRangeError(absl::StrCat("data position ", position, " is too large"));
  }
  BatchRef batch;
  batch.position = position;
  batch.samples.reserve(b);
  for (int64_t j = 0; j < b; ++j) {
    const int32_t d = slot_domain_[j];
    batch.samples.push_back(ResolveSample(d, position * slots_[d] + slot_rank_[j]));
  }
  return batch;
}

absl::StatusOr<std::vector<DocumentId>> DataOrder::DocumentsAt(int64_t position) const {
  SG_ASSIGN_OR_RETURN(BatchRef batch, Resolve(position));
  std::vector<DocumentId> docs;
  for (const SampleRef& s : batch.samples) {
    for (const DocumentSpan& span : s.spans) {
      docs.push_back(DocumentId{corpus_.domain_name(span.domain), span.document});
    }
  }
  std::sort(docs.begin(), docs.end());
  docs.erase(std::unique(docs.begin(), docs.end()), docs.end());
  return docs;
}

absl::StatusOr<Batch> DataOrder::Materialize(int64_t position) const {
  SG_ASSIGN_OR_RETURN(BatchRef ref, Resolve(position));
  // The plan's sample mask of this batch, if any.
  std::vector<int32_t> kept;
  const SampleMask* mask = manifest_.plan.MaskAt(position);
  for (int32_t j = 0; j < manifest_.global_batch_size; ++j) {
    if (mask == nullptr || !std::binary_search(mask->slots.begin(), mask->slots.end(), j)) {
      kept.push_back(j);
    }
  }
  if (mask != nullptr) {
    if (mask->slots.back() >= manifest_.global_batch_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("data plan masks sample slot ", mask->slots.back(), " of batch ", position,
                       ", which has only ", manifest_.global_batch_size, " samples"));
    }
    if (kept.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data plan masks every sample of batch ", position, ": nothing left to train on"));
    }
  }
  Batch batch;
  batch.position = position;
  batch.batch_size = static_cast<int32_t>(kept.size());
  batch.sample_tokens = manifest_.sequence_length + 1;
  batch.tokens.resize(static_cast<size_t>(batch.batch_size) * batch.sample_tokens);
  batch.sample_domain.resize(batch.batch_size);
  batch.sample_slots = kept;
  std::vector<int32_t> buf;
  for (int32_t i = 0; i < batch.batch_size; ++i) {
    const SampleRef& s = ref.samples[kept[i]];
    batch.sample_domain[i] = s.domain;
    uint8_t* row = batch.tokens.data() + static_cast<size_t>(i) * batch.sample_tokens;
    for (const DocumentSpan& span : s.spans) {
      buf.resize(span.length);
      const IndexedDataset& ds = corpus_.domain(span.domain);
      SG_RETURN_IF_ERROR(ds.ReadDocument(span.document, span.offset, absl::MakeSpan(buf)));
      for (int64_t t = 0; t < span.length; ++t) {
        if (buf[t] < 0 || buf[t] > 255) {
          return absl::FailedPreconditionError(absl::StrCat(
              "token ", buf[t], " in document ", span.document, " of domain '",
              corpus_.domain_name(span.domain), "' is not a byte (vocabulary 256)"));
        }
        *row++ = static_cast<uint8_t>(buf[t]);
      }
    }
  }
  return batch;
}

absl::StatusOr<Batch> MaterializeBatch(const Corpus& corpus, const Manifest& manifest,
                                       int64_t position) {
  SG_ASSIGN_OR_RETURN(std::unique_ptr<DataOrder> order, DataOrder::Create(corpus, manifest));
  return order->Materialize(position);
}

}  // namespace spikeguard::storage
