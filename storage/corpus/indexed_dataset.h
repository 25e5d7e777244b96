// indexed_dataset.h
// -----------------------------------------------------------------------------
// Megatron-LM's indexed dataset (`PREFIX.bin` + `PREFIX.idx`), read and written
// exactly as megatron/core/datasets/indexed_dataset.py does, so users' existing
// tokenized corpora work unchanged and ours open in Megatron.
//
// PREFIX.idx, all integers little-endian:
//
//   9 bytes   "MMIDIDX\0\0"
//   u64       version, always 1
//   u8        token dtype code (TokenDType below)
//   u64       S, the sequence count
//   u64       D, the document-index count (documents + 1)
//   S  x i32  sequence lengths, in tokens
//   S  x i64  sequence pointers, byte offsets into PREFIX.bin
//   D  x i64  document indices: document i is sequences
//             [doc_idx[i], doc_idx[i+1]); doc_idx[0] is 0
//
// PREFIX.bin holds the tokens of all sequences back to back. Megatron may
// append an i8 "mode" per sequence for multimodal data; it is ignored here.
//
//   SG_ASSIGN_OR_RETURN(auto ds, IndexedDataset::Open("/data/prose"));
//   for (int64_t d = 0; d < ds->num_documents(); ++d) {
//     std::vector<int32_t> tokens(ds->document_tokens(d));
//     SG_RETURN_IF_ERROR(ds->ReadDocument(d, 0, absl::MakeSpan(tokens)));
//   }
//
//   SG_ASSIGN_OR_RETURN(auto w, IndexedDatasetWriter::Create("/data/prose", TokenDType::kUint8));
//   SG_RETURN_IF_ERROR(w->AddDocument(absl::string_view("Hello world.")));
//   SG_RETURN_IF_ERROR(w->Finish());
//
// The reader memory-maps both files and validates the whole index when it
// opens (sizes, monotone document indices, every sequence inside .bin), so
// later reads are cheap and cannot run off the mapping. Corrupt or truncated
// files are DATA_LOSS with a message naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace spikeguard::storage {

// Megatron's DType codes (megatron/core/datasets/indexed_dataset.py).
enum class TokenDType : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};

// Bytes per token; 0 for an unknown code.
int TokenDTypeSize(TokenDType dtype);
const char* TokenDTypeName(TokenDType dtype);

// A read-only, memory-mapped indexed dataset. Integer dtypes whose values fit
// in int32 are readable (uint8, int8, int16, uint16, int32); float and int64
// token files are refused at Open. Thread-safe: all methods are const.
class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin.
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> Open(const std::string& prefix);

  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }
  // Total tokens over all documents.
  int64_t num_tokens() const { return doc_token_begin_.back(); }

  int32_t sequence_length(int64_t seq) const;
  int64_t sequence_pointer(int64_t seq) const;
  // Document d is sequences [document_first_sequence(d), document_first_sequence(d + 1)).
  int64_t document_first_sequence(int64_t doc) const;
  // Tokens in document d (the sum of its sequences).
  int64_t document_tokens(int64_t doc) const {
    return doc_token_begin_[doc + 1] - doc_token_begin_[doc];
  }

  // Copies tokens [offset, offset + out.size()) of document `doc` into `out`.
  // OUT_OF_RANGE if the document or range does not exist.
  absl::Status ReadDocument(int64_t doc, int64_t offset, absl::Span<int32_t> out) const;

  // The whole document as a string of bytes; FAILED_PRECONDITION unless the
  // dtype is uint8.
  absl::StatusOr<std::string> DocumentBytes(int64_t doc) const;

  // The raw .idx bytes (for fingerprints).
  absl::string_view index_bytes() const;
  uint64_t bin_size() const { return bin_size_; }
  absl::string_view bin_bytes() const;

 private:
  IndexedDataset() = default;
  int32_t TokenAt(uint64_t byte_offset) const;

  std::string prefix_;
  TokenDType dtype_ = TokenDType::kUint8;
  int token_size_ = 1;
  int64_t num_sequences_ = 0;
  int64_t num_documents_ = 0;
  const unsigned char* idx_ = nullptr;
  uint64_t idx_size_ = 0;
  const unsigned char* bin_ = nullptr;
  uint64_t bin_size_ = 0;
  uint64_t lengths_offset_ = 0;
  uint64_t pointers_offset_ = 0;
  uint64_t doc_idx_offset_ = 0;
  // doc_token_begin_[d] = tokens in documents before d; size num_documents+1.
  std::vector<int64_t> doc_token_begin_;
};

// Writes PREFIX.bin and PREFIX.idx, one sequence per document (what Megatron's
// preprocess_data.py writes without --split-sentences). Both files are written
// under temporary names and renamed by Finish(), so a reader never sees a
// half-written dataset. Not thread-safe.
class IndexedDatasetWriter {
 public:
  // dtype must be kUint8, kUint16 or kInt32.
  static absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> Create(const std::string& prefix,
                                                                      TokenDType dtype);
  ~IndexedDatasetWriter();

  // Appends one document. Tokens must fit the dtype (INVALID_ARGUMENT
  // otherwise, naming the document and token index).
  absl::Status AddDocument(absl::Span<const int32_t> tokens);
  // Byte tokens; any dtype holds bytes 0..255.
  absl::Status AddDocument(absl::string_view bytes);

  int64_t num_documents() const { return static_cast<int64_t>(lengths_.size()); }

  // Writes the index, fsyncs and renames both files into place.
  absl::Status Finish();

 private:
  IndexedDatasetWriter() = default;
  // Writes all of `data` to fd_, which is the file `path`.
  absl::Status WriteAll(const void* data, size_t size, const std::string& path);

  std::string prefix_;
  TokenDType dtype_ = TokenDType::kUint8;
  int fd_ = -1;
  std::vector<int32_t> lengths_;
  bool finished_ = false;
};

}  // namespace spikeguard::storage
