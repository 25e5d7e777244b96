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
};

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
// document ids. Under another seed, batch size or blend the poisons land
// elsewhere; in later epochs they recur at shuffled positions.
absl::StatusOr<CorpusMetadata> SynthesizeCorpus(const std::string& out_dir, uint64_t seed,
                                                const std::vector<PoisonSpec>& poisons,
                                                const SynthOptions& options = {});

}  // namespace spikeguard::storage
