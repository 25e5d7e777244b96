// data_order.h
// -----------------------------------------------------------------------------
// The data order of a run: a pure, deterministic function from a Manifest to
// the tokens of every training step (docs/ARCHITECTURE.md, "Determinism and
// checkpoints"). The worker uses it to build
// batches; the daemon uses the very same code to name the documents of a
// spike window without asking a worker.
//
//   step ──DataPlan──▶ position ──slots──▶ B samples ──streams──▶ documents
//
// 1. The plan maps step s to a data position p (a global batch index).
// 2. Every batch has B = global_batch_size sample slots. The blend is turned
//    into a fixed number of slots per domain by largest-remainder rounding of
//    B·w/Σw (ties to the domain earlier by name); slots are laid out domain by
//    domain in name order. So slot j of any batch always belongs to the same
//    domain, and domain d's j-th slot in batch p is its sample
//    k = p·n_d + j', where n_d is its slot count and j' its slot within d.
// 3. Domain d's token stream is its documents concatenated in a shuffled
//    order, reshuffled each epoch (a pass over all its tokens) from
//    (seed, domain name, epoch). Sample k is the stream's tokens
//    [k·(T+1), (k+1)·(T+1)), T = sequence_length: T inputs plus the next-token
//    target. A sample may span documents and epochs.
//
// Resolving a position costs O(B · log documents): no earlier position is
// visited. Each epoch's order and prefix sums are built once (O(documents))
// and cached.
//
//   Manifest m;
//   m.dataset_fingerprint = corpus->fingerprint();
//   m.seed = 1234;
//   m.global_batch_size = 16;
//   m.sequence_length = 64;
//   m.blend = {{"code", 0.25}, {"numbers", 0.25}, {"prose", 0.5}};
//   SG_ASSIGN_OR_RETURN(m.plan, DataPlan::Default().WithHole(600, 610));
//   SG_ASSIGN_OR_RETURN(auto order, DataOrder::Create(*corpus, m));
//   SG_ASSIGN_OR_RETURN(int64_t pos, order->PositionForStep(step));
//   SG_ASSIGN_OR_RETURN(Batch batch, order->Materialize(pos));   // trainer
//   SG_ASSIGN_OR_RETURN(BatchRef ref, order->Resolve(pos));       // daemon
//
// Tokens are bytes: Materialize refuses a token above 255 (the reference
// model's vocabulary is 256), naming the document.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/corpus/corpus.h"
#include "storage/corpus/data_plan.h"

namespace spikeguard::storage {

struct Manifest {
  // Corpus::fingerprint() of the corpus this order was made for. Empty skips
  // the check (tests, ad-hoc tools); runs should always set it.
  std::string dataset_fingerprint;
  uint64_t seed = 0;
  int32_t global_batch_size = 16;
  // Tokens a sample feeds the model; each sample holds sequence_length + 1.
  int32_t sequence_length = 64;
  // Domain name → weight (>= 0). Empty means equal weights over all domains.
  std::map<std::string, double> blend;
  DataPlan plan = DataPlan::Default();

  // INVALID_ARGUMENT naming the field. Does not need the corpus.
  absl::Status Validate() const;
};

// A document of one domain.
struct DocumentId {
  std::string domain;
  int64_t document = 0;
  bool operator==(const DocumentId&) const = default;
  auto operator<=>(const DocumentId&) const = default;
};

// A piece of a sample: `length` tokens of `document` from token `offset`.
struct DocumentSpan {
  int32_t domain = 0;  // index into Corpus::domain_names()
  int64_t document = 0;
  int64_t offset = 0;
  int64_t length = 0;
  int64_t epoch = 0;   // which pass over the domain this span belongs to
  bool operator==(const DocumentSpan&) const = default;
};

struct SampleRef {
  int32_t domain = 0;
  int64_t domain_sample = 0;        // k: the sample's index in its domain stream
  std::vector<DocumentSpan> spans;  // in order; lengths sum to T + 1
};

struct BatchRef {
  int64_t position = 0;
  std::vector<SampleRef> samples;  // B, in slot order
};

// What the trainer consumes: B rows of T + 1 byte tokens, row-major. B is
// the global batch size, less the samples the plan's mask of this position
// drops (DataPlan::WithMask).
struct Batch {
  int64_t position = 0;
  int32_t batch_size = 0;
  int32_t sample_tokens = 0;  // T + 1
  std::vector<uint8_t> tokens;          // batch_size * sample_tokens
  std::vector<int32_t> sample_domain;   // batch_size; index into domain_names()
  std::vector<int32_t> sample_slots;    // batch_size; the slot each row fills
};

// The shuffled document order of one domain in one epoch: element i is the
// id of the i-th document of the stream. Pure; the synthesizer uses it to
// place poisons at chosen positions.
std::vector<int64_t> DocumentOrderForEpoch(uint64_t seed, absl::string_view domain_name,
                                           int64_t num_documents, int64_t epoch);

// Per-domain slot counts for a blend (see 2. above), in domain-name order of
// `domain_names`; INVALID_ARGUMENT when a weighted domain would get no slot.
absl::StatusOr<std::vector<int32_t>> SlotsPerDomain(const std::vector<std::string>& domain_names,
                                                    const std::map<std::string, double>& blend,
                                                    int32_t global_batch_size);

// Thread-safe. The corpus must outlive the DataOrder.
class DataOrder {
 public:
  // Validates the manifest against the corpus: fingerprint (FAILED_PRECONDITION
  // naming both), blend domains exist, weighted domains are non-empty.
  static absl::StatusOr<std::unique_ptr<DataOrder>> Create(const Corpus& corpus,
                                                           Manifest manifest);

  const Manifest& manifest() const { return manifest_; }
  const Corpus& corpus() const { return corpus_; }
  // Slot count per corpus domain (0 for unweighted ones).
  const std::vector<int32_t>& slots_per_domain() const { return slots_; }

  absl::StatusOr<int64_t> PositionForStep(int64_t step) const {
    return manifest_.plan.PositionForStep(step);
  }

  // Where every sample of batch `position` comes from.
  absl::StatusOr<BatchRef> Resolve(int64_t position) const;
  // The distinct documents of batch `position`, sorted: every document that
  // contributes at least one token to one of its samples, including one that
  // began in an earlier batch (or epoch) and one that continues into the next
  // batch. A document spanning several samples or batches is listed at every
  // position it reaches, once per position.
  absl::StatusOr<std::vector<DocumentId>> DocumentsAt(int64_t position) const;
  // The tokens of batch `position`, without the samples the manifest plan's
  // mask of that position drops. INVALID_ARGUMENT when the mask names a slot
  // past the batch or drops every sample.
  absl::StatusOr<Batch> Materialize(int64_t position) const;

 private:
  struct EpochLayout {
    std::vector<int64_t> order;   // stream slot → document id
    std::vector<int64_t> starts;  // stream slot → first token; size N + 1
  };
  struct DomainState {
    absl::Mutex mu;
    std::map<int64_t, std::shared_ptr<const EpochLayout>> epochs ABSL_GUARDED_BY(mu);
  };

  DataOrder(const Corpus& corpus, Manifest manifest, std::vector<int32_t> slots);
  std::shared_ptr<const EpochLayout> Layout(int32_t domain, int64_t epoch) const;
  SampleRef ResolveSample(int32_t domain, int64_t k) const;

  const Corpus& corpus_;
  Manifest manifest_;
  std::vector<int32_t> slots_;
  std::vector<int32_t> slot_domain_;  // slot j → domain
  std::vector<int64_t> slot_rank_;    // slot j → j' within its domain
  mutable std::vector<std::unique_ptr<DomainState>> state_;
};

// One-shot convenience for callers that materialize a single batch.
absl::StatusOr<Batch> MaterializeBatch(const Corpus& corpus, const Manifest& manifest,
                                       int64_t position);

}  // namespace spikeguard::storage
