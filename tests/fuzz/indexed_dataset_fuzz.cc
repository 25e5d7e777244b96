// Fuzz target: the Megatron indexed-dataset reader (storage/corpus/
// indexed_dataset.h), i.e. a user's PREFIX.idx and PREFIX.bin.
//
// The input's last two bytes give the size of PREFIX.bin (filled with a
// pattern); the rest is PREFIX.idx. Open validates the whole index; a dataset
// that opens must then read every document in full and in pieces without
// leaving the mapping (ASan guards the reads; the harness bounds the sizes).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "storage/corpus/indexed_dataset.h"

namespace {

namespace storage = spikeguard::storage;

// Never destroyed: the atexit handler below runs after static destructors
// registered later would have.
const std::string& Prefix() {
  static const std::string* const prefix = [] {
    const char* dir = std::getenv("TMPDIR");
    auto* p = new std::string(std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                              "/sg-idx-fuzz-" + std::to_string(::getpid()));
    std::atexit([] {
      ::unlink((Prefix() + ".idx").c_str());
      ::unlink((Prefix() + ".bin").c_str());
    });
    return p;
  }();
  return *prefix;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t bin_size = data[size - 2] | (static_cast<size_t>(data[size - 1]) << 8);
  const std::string idx(reinterpret_cast<const char*>(data), size - 2);
  std::string bin(bin_size, '\0');
  for (size_t i = 0; i < bin_size; ++i) bin[i] = static_cast<char>(i * 131 + 7);
  if (!spikeguard::fuzz::WriteFile(Prefix() + ".idx", idx) || !spikeguard::fuzz::WriteFile(Prefix() + ".bin", bin)) return 0;

  auto opened = storage::IndexedDataset::Open(Prefix());
  if (!opened.ok()) {
    const absl::StatusCode code = opened.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kFailedPrecondition);
    return 0;
  }
  const storage::IndexedDataset& ds = **opened;
  FUZZ_CHECK(ds.num_documents() >= 0 && ds.num_sequences() >= 0);
  FUZZ_CHECK(ds.index_bytes().size() == idx.size());
  FUZZ_CHECK(ds.bin_size() == bin_size);
  int64_t total = 0;
  std::vector<int32_t> tokens;
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    const int64_t n = ds.document_tokens(d);
    FUZZ_CHECK(n >= 0);
    total += n;
    if (total > (int64_t{1} << 24)) break;  // a tiny .bin can be named many times over
    tokens.assign(static_cast<size_t>(n), 0);
    FUZZ_CHECK(ds.ReadDocument(d, 0, absl::MakeSpan(tokens)).ok());
    if (n > 2) {
      // A piece from the middle equals the same tokens of the whole.
      std::vector<int32_t> piece(static_cast<size_t>(n - 2));
      FUZZ_CHECK(ds.ReadDocument(d, 1, absl::MakeSpan(piece)).ok());
      for (size_t i = 0; i < piece.size(); ++i) FUZZ_CHECK(piece[i] == tokens[i + 1]);
    }
    // Past the end is refused, not read.
    std::vector<int32_t> one(1);
    FUZZ_CHECK(!ds.ReadDocument(d, n, absl::MakeSpan(one)).ok());
    if (ds.dtype() == storage::TokenDType::kUint8) {
      auto bytes = ds.DocumentBytes(d);
      FUZZ_CHECK(bytes.ok() && static_cast<int64_t>(bytes->size()) == n);
    }
  }
  FUZZ_CHECK(!ds.ReadDocument(ds.num_documents(), 0, {}).ok());
  FUZZ_CHECK(!ds.ReadDocument(-1, 0, {}).ok());
  return 0;
}
