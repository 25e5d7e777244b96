#include "storage/corpus/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace spikeguard::storage {
namespace {

constexpr char kIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kIdxVersion = 1;
constexpr uint64_t kHeaderSize = 9 + 8 + 1 + 8 + 8;  // 34, as in Megatron

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  int err = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == EINTR || err == EAGAIN || err == ENOSPC || err == EIO) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

template <typename T>
T LoadLE(const unsigned char* p) {
  // The format is little-endian and its arrays are unaligned (they start at
  // byte 34), so load through memcpy; x86 and ARM hosts are little-endian.
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void PutLE(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

// Maps `path` read-only. An empty file maps to (nullptr, 0).
absl::Status MapFile(const std::string& path, const unsigned char** data, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoStatus("cannot stat", path);
    ::close(fd);
    return s;
  }
  *size = static_cast<uint64_t>(st.st_size);
  *data = nullptr;
  if (*size > 0) {
    void* p = ::mmap(nullptr, *size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      absl::Status s = ErrnoStatus("cannot mmap", path);
      ::close(fd);
      return s;
    }
    *data = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
  return absl::OkStatus();
}

bool Readable(TokenDType d) {
  switch (d) {
    case TokenDType::kUint8:
    case TokenDType::kInt8:
    case TokenDType::kInt16:
    case TokenDType::kInt32:
    case TokenDType::kUint16:
      return true;
    default:
      return false;
  }
}

}  // namespace

int TokenDTypeSize(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUint8:
    case TokenDType::kInt8:
      return 1;
    case TokenDType::kInt16:
    case TokenDType::kUint16:
      return 2;
    case TokenDType::kInt32:
    case TokenDType::kFloat32:
      return 4;
    case TokenDType::kInt64:
    case TokenDType::kFloat64:
      return 8;
  }
  return 0;
}

const char* TokenDTypeName(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUint8: return "uint8";
    case TokenDType::kInt8: return "int8";
    case TokenDType::kInt16: return "int16";
    case TokenDType::kInt32: return "int32";
    case TokenDType::kInt64: return "int64";
    case TokenDType::kFloat64: return "float64";
    case TokenDType::kFloat32: return "float32";
    case TokenDType::kUint16: return "uint16";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------
// Reader

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::Open(const std::string& prefix) {
  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  SG_RETURN_IF_ERROR(MapFile(idx_path, &ds->idx_, &ds->idx_size_));
  SG_RETURN_IF_ERROR(MapFile(bin_path, &ds->bin_, &ds->bin_size_));

  auto corrupt = [&](const std::string& path, absl::string_view what) {
    return absl::DataLossError(absl::StrCat("indexed dataset ", path, " is corrupt: ", what));
  };
  const unsigned char* idx = ds->idx_;
  const uint64_t n = ds->idx_size_;
  if (n < kHeaderSize) {
    return corrupt(idx_path, absl::StrCat("truncated header: ", n, " bytes, need ", kHeaderSize));
  }
  if (std::memcmp(idx, kIdxMagic, sizeof(kIdxMagic)) != 0) {
    return corrupt(idx_path, "bad magic (expected \"MMIDIDX\\0\\0\")");
  }
  const uint64_t version = LoadLE<uint64_t>(idx + 9);
  if (version != kIdxVersion) {
    return corrupt(idx_path, absl::StrCat("unsupported version ", version, " (expected 1)"));
  }
  const uint8_t code = idx[17];
  ds->dtype_ = static_cast<TokenDType>(code);
  ds->token_size_ = TokenDTypeSize(ds->dtype_);
  if (ds->token_size_ == 0) {
    return corrupt(idx_path, absl::StrCat("unknown dtype code ", int{code}));
  }
  if (!Readable(ds->dtype_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("indexed dataset ", idx_path, " has ", TokenDTypeName(ds->dtype_),
                     " tokens; only integer tokens that fit in int32 are supported"));
  }
  const uint64_t seqs = LoadLE<uint64_t>(idx + 18);
  const uint64_t docs = LoadLE<uint64_t>(idx + 26);
  // Bound the counts by the file size before multiplying, so nothing overflows.
  if (seqs > n / 12 || docs > n / 8) {
    return corrupt(idx_path, absl::StrCat("counts (", seqs, " sequences, ", docs,
                                          " document indices) exceed the file size ", n));
  }
  const uint64_t need = kHeaderSize + seqs * 4 + seqs * 8 + docs * 8;
  if (n < need) {
    return corrupt(idx_path, absl::StrCat("truncated: ", n, " bytes, the header's ", seqs,
                                          " sequences and ", docs, " document indices need ",
                                          need));
  }
  if (n != need && n != need + seqs) {  // + seqs: Megatron's optional i8 modes
    return corrupt(idx_path, absl::StrCat(n - need, " unexpected bytes after the index arrays"));
  }
  if (docs < 1) return corrupt(idx_path, "document index array is empty (needs a leading 0)");
  ds->num_sequences_ = static_cast<int64_t>(seqs);
  ds->num_documents_ = static_cast<int64_t>(docs) - 1;
  ds->lengths_offset_ = kHeaderSize;
  ds->pointers_offset_ = kHeaderSize + seqs * 4;
  ds->doc_idx_offset_ = ds->pointers_offset_ + seqs * 8;

  for (int64_t s = 0; s < ds->num_sequences_; ++s) {
    const int32_t len = ds->sequence_length(s);
    const int64_t ptr = ds->sequence_pointer(s);
    if (len < 0 || ptr < 0) {
      return corrupt(idx_path, absl::StrCat("sequence ", s, " has length ", len, " and pointer ",
                                            ptr));
    }
    const uint64_t end = static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * ds->token_size_;
    if (end > ds->bin_size_) {
      return corrupt(bin_path, absl::StrCat("truncated: sequence ", s, " ends at byte ", end,
                                            " but the file has ", ds->bin_size_, " bytes"));
    }
  }
  ds->doc_token_begin_.assign(ds->num_documents_ + 1, 0);
  int64_t prev = ds->document_first_sequence(0);
  if (prev != 0) {
    return corrupt(idx_path, absl::StrCat("document index 0 is ", prev, ", expected 0"));
  }
  for (int64_t d = 0; d < ds->num_documents_; ++d) {
    const int64_t next = ds->document_first_sequence(d + 1);
    if (next < prev || next > ds->num_sequences_) {
      return corrupt(idx_path, absl::StrCat("document index ", d + 1, " is ", next,
                                            " (previous ", prev, ", sequences ",
                                            ds->num_sequences_, ")"));
    }
    int64_t tokens = 0;
    for (int64_t s = prev; s < next; ++s) tokens += ds->sequence_length(s);
    ds->doc_token_begin_[d + 1] = ds->doc_token_begin_[d] + tokens;
    prev = next;
  }
  if (prev != ds->num_sequences_) {
    return corrupt(idx_path, absl::StrCat("the last document ends at sequence ", prev, " of ",
                                          ds->num_sequences_));
  }
  return ds;
}

IndexedDataset::~IndexedDataset() {
  if (idx_ != nullptr) ::munmap(const_cast<unsigned char*>(idx_), idx_size_);
  if (bin_ != nullptr) ::munmap(const_cast<unsigned char*>(bin_), bin_size_);
}

int32_t IndexedDataset::sequence_length(int64_t seq) const {
  return LoadLE<int32_t>(idx_ + lengths_offset_ + 4 * static_cast<uint64_t>(seq));
}

int64_t IndexedDataset::sequence_pointer(int64_t seq) const {
  return LoadLE<int64_t>(idx_ + pointers_offset_ + 8 * static_cast<uint64_t>(seq));
}

int64_t IndexedDataset::document_first_sequence(int64_t doc) const {
  return LoadLE<int64_t>(idx_ + doc_idx_offset_ + 8 * static_cast<uint64_t>(doc));
}

int32_t IndexedDataset::TokenAt(uint64_t off) const {
  const unsigned char* p = bin_ + off;
  switch (dtype_) {
    case TokenDType::kUint8: return *p;
    case TokenDType::kInt8: return static_cast<int8_t>(*p);
    case TokenDType::kInt16: return LoadLE<int16_t>(p);
    case TokenDType::kUint16: return LoadLE<uint16_t>(p);
    case TokenDType::kInt32: return LoadLE<int32_t>(p);
    default: return 0;  // refused at Open
  }
}

absl::Status IndexedDataset::ReadDocument(int64_t doc, int64_t offset,
                                          absl::Span<int32_t> out) const {
  if (doc < 0 || doc >= num_documents_) {
    return absl::OutOfRangeError(absl::StrCat("document ", doc, " of ", prefix_, " does not exist (",
                                              num_documents_, " documents)"));
  }
  const int64_t count = static_cast<int64_t>(out.size());
  if (offset < 0 || offset + count > document_tokens(doc)) {
    return absl::OutOfRangeError(absl::StrCat("tokens [", offset, ", ", offset + count,
                                              ") are outside document ", doc, " of ", prefix_,
                                              " (", document_tokens(doc), " tokens)"));
  }
  int64_t skip = offset;
  int64_t written = 0;
  const int64_t last = document_first_sequence(doc + 1);
  for (int64_t s = document_first_sequence(doc); s < last && written < count; ++s) {
    const int64_t len = sequence_length(s);
    if (skip >= len) {
      skip -= len;
      continue;
    }
    const uint64_t base = static_cast<uint64_t>(sequence_pointer(s));
    const int64_t take = std::min(len - skip, count - written);
    if (dtype_ == TokenDType::kUint8) {
      const unsigned char* p = bin_ + base + skip;
      for (int64_t i = 0; i < take; ++i) out[written + i] = p[i];
    } else {
      for (int64_t i = 0; i < take; ++i) {
        out[written + i] = TokenAt(base + static_cast<uint64_t>(skip + i) * token_size_);
      }
    }
    written += take;
    skip = 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> IndexedDataset::DocumentBytes(int64_t doc) const {
  if (dtype_ != TokenDType::kUint8) {
    return absl::FailedPreconditionError(absl::StrCat(prefix_, " has ", TokenDTypeName(dtype_),
                                                      " tokens, not bytes"));
  }
  if (doc < 0 || doc >= num_documents_) {
    return absl::OutOfRangeError(absl::StrCat("document ", doc, " of ", prefix_, " does not exist (",
                                              num_documents_, " documents)"));
  }
  std::string out;
  out.reserve(document_tokens(doc));
  const int64_t last = document_first_sequence(doc + 1);
  for (int64_t s = document_first_sequence(doc); s < last; ++s) {
    out.append(reinterpret_cast<const char*>(bin_ + sequence_pointer(s)), sequence_length(s));
  }
  return out;
}

absl::string_view IndexedDataset::index_bytes() const {
  return absl::string_view(reinterpret_cast<const char*>(idx_), idx_size_);
}

absl::string_view IndexedDataset::bin_bytes() const {
  if (bin_ == nullptr) return absl::string_view();
  return absl::string_view(reinterpret_cast<const char*>(bin_), bin_size_);
}

// ---------------------------------------------------------------------------
// Writer

absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> IndexedDatasetWriter::Create(
    const std::string& prefix, TokenDType dtype) {
  if (dtype != TokenDType::kUint8 && dtype != TokenDType::kUint16 &&
      dtype != TokenDType::kInt32) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", TokenDTypeName(dtype),
                                                   " tokens; use uint8, uint16 or int32"));
  }
  std::unique_ptr<IndexedDatasetWriter> w(new IndexedDatasetWriter());
  w->prefix_ = prefix;
  w->dtype_ = dtype;
  const std::string tmp = prefix + ".bin.tmp";
  w->fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return ErrnoStatus("cannot create", tmp);
  return w;
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) {
    ::unlink((prefix_ + ".bin.tmp").c_str());
    ::unlink((prefix_ + ".idx.tmp").c_str());
  }
}

absl::Status IndexedDatasetWriter::WriteAll(const void* data, size_t size,
                                            const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot write", path);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::AddDocument(absl::Span<const int32_t> tokens) {
  if (finished_) return absl::FailedPreconditionError("indexed dataset writer already finished");
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("a document over 2^31 tokens does not fit the index");
  }
  const int64_t lo = 0;
  const int64_t hi = dtype_ == TokenDType::kUint8    ? 255
                     : dtype_ == TokenDType::kUint16 ? 65535
                                                     : std::numeric_limits<int32_t>::max();
  std::string buf;
  buf.reserve(tokens.size() * TokenDTypeSize(dtype_));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < lo || t > hi) {
      return absl::InvalidArgumentError(absl::StrCat("token ", t, " at index ", i, " of document ",
                                                     num_documents(), " does not fit ",
                                                     TokenDTypeName(dtype_)));
    }
    switch (dtype_) {
      case TokenDType::kUint8: buf.push_back(static_cast<char>(t)); break;
      case TokenDType::kUint16: PutLE<uint16_t>(&buf, static_cast<uint16_t>(t)); break;
      default: PutLE<int32_t>(&buf, t); break;
    }
  }
  SG_RETURN_IF_ERROR(WriteAll(buf.data(), buf.size(), prefix_ + ".bin.tmp"));
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::AddDocument(absl::string_view bytes) {
  if (dtype_ == TokenDType::kUint8) {
    if (finished_) return absl::FailedPreconditionError("indexed dataset writer already finished");
    if (bytes.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError("a document over 2^31 tokens does not fit the index");
    }
    SG_RETURN_IF_ERROR(WriteAll(bytes.data(), bytes.size(), prefix_ + ".bin.tmp"));
    lengths_.push_back(static_cast<int32_t>(bytes.size()));
    return absl::OkStatus();
  }
  std::vector<int32_t> tokens(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
  return AddDocument(absl::MakeConstSpan(tokens));
}

absl::Status IndexedDatasetWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError("indexed dataset writer already finished");
  const std::string bin_tmp = prefix_ + ".bin.tmp";
  const std::string idx_tmp = prefix_ + ".idx.tmp";
  if (::fsync(fd_) != 0) return ErrnoStatus("cannot fsync", bin_tmp);
  if (::close(fd_) != 0) {
    fd_ = -1;
    return ErrnoStatus("cannot close", bin_tmp);
  }
  fd_ = -1;

  const uint64_t n = lengths_.size();
  std::string idx;
  idx.reserve(kHeaderSize + n * 20 + 8);
  idx.append(kIdxMagic, sizeof(kIdxMagic));
  PutLE<uint64_t>(&idx, kIdxVersion);
  idx.push_back(static_cast<char>(dtype_));
  PutLE<uint64_t>(&idx, n);
  PutLE<uint64_t>(&idx, n + 1);
  for (int32_t len : lengths_) PutLE<int32_t>(&idx, len);
  int64_t ptr = 0;
  for (int32_t len : lengths_) {
    PutLE<int64_t>(&idx, ptr);
    ptr += static_cast<int64_t>(len) * TokenDTypeSize(dtype_);
  }
  for (uint64_t d = 0; d <= n; ++d) PutLE<int64_t>(&idx, static_cast<int64_t>(d));

  int fd = ::open(idx_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", idx_tmp);
  fd_ = fd;
  absl::Status st = WriteAll(idx.data(), idx.size(), idx_tmp);
  fd_ = -1;
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoStatus("cannot fsync", idx_tmp);
  ::close(fd);
  SG_RETURN_IF_ERROR(st);
  // .bin first: a reader that finds the new .idx also finds its data.
  if (::rename(bin_tmp.c_str(), (prefix_ + ".bin").c_str()) != 0) {
    return ErrnoStatus("cannot rename", bin_tmp);
  }
  if (::rename(idx_tmp.c_str(), (prefix_ + ".idx").c_str()) != 0) {
    return ErrnoStatus("cannot rename", idx_tmp);
  }
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace spikeguard::storage
