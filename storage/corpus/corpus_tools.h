// corpus_tools.h
// -----------------------------------------------------------------------------
// Making corpora: from text files (BuildCorpus) or synthetically, with
// poisoned batches at chosen positions (SynthesizeCorpus). The
// `spikeguard-worker corpus build|synth` commands are thin wrappers.
//
// Both write, into out_dir, one Megatron indexed dataset per domain
// (<domain>.bin/.idx, uint8 byte tokens) and a metadata file
// `corpus.meta` recording the fingerprint, the domains and the default
// manifest (seed, batch size, sequence length, blend, plan) plus any poisons:
//
//   # spikeguard corpus metadata
//   format 1
//   fingerprint 3f2a9c0d11e4b7a5
//   seed 7
//   global_batch_size 16
//   sequence_length 64
//   plan 0-
//   domain code 2210 650000 0.25          # name documents tokens weight
//   poison junk 600 code:17 numbers:2201 prose:934
//   echo junk 600 code:2871 numbers:2950 prose:1012   # only with poison echoes
//
//   std::vector<PoisonSpec> poisons;
//   SG_ASSIGN_OR_RETURN(poisons, ParsePoisons({"junk@600", "duplicate@1200"}));
//   SG_ASSIGN_OR_RETURN(CorpusMetadata meta, SynthesizeCorpus("/tmp/c", 7, poisons));
//   for (const PlacedPoison& p : meta.poisons) { ... p.position, p.documents ... }
//   SG_ASSIGN_OR_RETURN(auto corpus, Corpus::Open("/tmp/c"));
//   SG_ASSIGN_OR_RETURN(auto order, DataOrder::Create(*corpus, meta.default_manifest));
//   // order->Materialize(600) is (almost) all random bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/corpus/data_order.h"

namespace spikeguard::storage {

inline constexpr char kCorpusMetadataFile[] = "corpus.meta";

enum class PoisonKind {
  kNgram,      // one short ASCII phrase repeated for the whole batch
  kJunk,       // uniformly random bytes 0..255
  kHighBytes,  // random bytes 128..255, which the ASCII domains never contain
  kDuplicate,  // one ordinary document copied into every sample of the batch
};

const char* PoisonKindName(PoisonKind kind);

// "KIND@POSITION", e.g. "junk@600"; kinds: ngram, junk, highbytes, duplicate.
struct PoisonSpec {
  PoisonKind kind = PoisonKind::kJunk;
  int64_t position = 0;
};
absl::StatusOr<PoisonSpec> ParsePoison(absl::string_view text);
absl::StatusOr<std::vector<PoisonSpec>> ParsePoisons(const std::vector<std::string>& texts);

struct PlacedPoison {
  PoisonKind kind = PoisonKind::kJunk;
  int64_t position = 0;
  std::vector<DocumentId> documents;  // sorted
  // Its echoes (SynthOptions::poison_echoes): near-copies of its documents
  // elsewhere in the corpus, ordinary documents of late batches. Sorted;
  // empty without echoes. corpus.meta records them on an `echo` line.
  std::vector<DocumentId> echoes;
};

struct CorpusMetadata {
  struct Domain {
    std::string name;
    int64_t documents = 0;
    int64_t tokens = 0;
    double weight = 0;
  };
  std::string fingerprint;
  std::vector<Domain> domains;  // by name
  // Fingerprint, seed, batch size, sequence length, blend and plan to train with.
  Manifest default_manifest;
  std::vector<PlacedPoison> poisons;  // by position
};

absl::Status WriteCorpusMetadata(const std::string& dir, const CorpusMetadata& meta);
absl::StatusOr<CorpusMetadata> ReadCorpusMetadata(const std::string& dir);

// Default manifest parameters recorded by the tools.
struct CorpusDefaults {
  uint64_t seed = 0;
  int32_t global_batch_size = 16;
  int32_t sequence_length = 64;
};

// One domain per input text file, byte tokens. Documents are split at blank
// lines (lines empty or all whitespace): each paragraph, with its line breaks
// and a final '\n', is one document; runs of blank lines are one separator.
// The default blend weighs domains equally. Creates out_dir if needed;
// existing files of the same domains are replaced.
absl::StatusOr<CorpusMetadata> BuildCorpus(const std::string& out_dir,
                                           const std::map<std::string, std::string>& inputs,
                                           const CorpusDefaults& defaults = {});

struct SynthOptions {
  // Default manifest: batch 16 × (64 + 1) tokens; blend prose 0.5, code 0.25,
  // numbers 0.25, i.e. 8 + 4 + 4 samples a batch.
  int32_t global_batch_size = 16;
  int32_t sequence_length = 64;
  // Batches the first epoch of every domain covers under the default
  // manifest; a run of more steps wraps into a reshuffled second epoch.
  int64_t positions = 3000;
  // Echoes: for each poison, this many near-copies of its documents, placed
  // as ordinary documents where a short run never reads them, so a
  // near-duplicate search (near_duplicates.h) from the quarantined documents
  // has copies elsewhere in the corpus to find, as real junk recurs.
  // `spikeguard-worker corpus synth --poison-echoes K`. >= 0; 0 (the
  // default) writes exactly the corpus of earlier versions.
  //
  //   * Echo k of a poison lies in domain k mod 3 (code, numbers, prose,
  //     code, ...) and is a copy of the poison's document in that domain
  //     (any one of them for "duplicate"), slightly changed: a prefix of up
  //     to 1/16 of it dropped, then for junk, highbytes and duplicate about
  //     2% of its bytes (at least one) replaced by other bytes of the same
  //     kind (random, 128..255, lowercase letters); an "ngram" echo is the
  //     same phrase repeated from another offset, no byte replaced. The
  //     Jaccard similarity of 5-byte shingles to its source is about 0.75
  //     or more (1 for ngram).
  //   * Each echo starts a batch of its own, at a position in
  //     [EchoFirstPosition(positions), positions) that no poison and no
  //     other echo holds (chosen from the seed), and ends within that batch;
  //     the batch's other tokens are ordinary text. So echoes of one poison are
  //     in different batches, and a run of fewer steps than
  //     EchoFirstPosition (2,000 for the default 3,000 positions) never
  //     trains on one.
  //   * Poisoned batches keep exactly their bytes, but document ids are a
  //     shuffle over each domain's document count, which echoes change: the
  //     returned (and written) poison documents are the ids of this corpus.
  //   * INVALID_ARGUMENT when [EchoFirstPosition, positions) lacks a free
  //     position for every echo (poisons × poison_echoes of them).
  int32_t poison_echoes = 0;
};

// The first batch position echoes may take: ceil(2·positions / 3).
inline int64_t EchoFirstPosition(int64_t positions) { return (2 * positions + 2) / 3; }

// A deterministic corpus of three ASCII-only domains (bytes < 128):
//   prose    English-like sentences in paragraphs,
//   code     C-like functions with indentation and braces,
//   numbers  CSV tables of numeric rows.
// Equal (seed, poisons, options) give byte-identical files.
//
// Each poison fills the whole batch at its position under the default
// manifest: in every domain, the stream tokens of that batch are poison
// documents (the document before is cut short to end exactly at the batch's
// first token). Positions must be below options.positions and distinct.
// The returned metadata (also written to corpus.meta) lists each poison's
// document ids, and its echoes' (see SynthOptions::poison_echoes). Under another seed, batch size or blend the poisons land
// elsewhere; in later epochs they recur at shuffled positions.
absl::StatusOr<CorpusMetadata> SynthesizeCorpus(const std::string& out_dir, uint64_t seed,
                                                const std::vector<PoisonSpec>& poisons,
                                                const SynthOptions& options = {});

}  // namespace spikeguard::storage
