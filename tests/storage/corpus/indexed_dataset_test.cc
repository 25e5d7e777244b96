#include "storage/corpus/indexed_dataset.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/storage/corpus/test_dir.h"

namespace spikeguard::storage {
namespace {

using testing_util::FreshDir;
using testing_util::ReadFile;
using testing_util::WriteFile;

template <typename T>
void Put(std::string* s, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    s->push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
  }
}

// An .idx built byte by byte from Megatron's published layout, independent
// of our writer: uint16 tokens, 3 sequences in 2 documents (the first holds
// two sequences, as --split-sentences writes).
std::string HandIdx(uint8_t dtype_code, const std::vector<int32_t>& lengths,
                    const std::vector<int64_t>& pointers, const std::vector<int64_t>& doc_idx) {
  std::string s("MMIDIDX\0\0", 9);
  Put<uint64_t>(&s, 1);
  Put<uint8_t>(&s, dtype_code);
  Put<uint64_t>(&s, lengths.size());
  Put<uint64_t>(&s, doc_idx.size());
  for (int32_t l : lengths) Put<int32_t>(&s, l);
  for (int64_t p : pointers) Put<int64_t>(&s, p);
  for (int64_t d : doc_idx) Put<int64_t>(&s, d);
  return s;
}

TEST(IndexedDatasetTest, ReadsAFileBuiltFromThePublishedLayout) {
  std::string dir = FreshDir();
  // uint16 (code 8): seq0 = {1, 2}, seq1 = {300, 65535, 7}, seq2 = {42}.
  std::string bin;
  for (uint16_t t : {1, 2, 300, 65535, 7, 42}) Put<uint16_t>(&bin, t);
  WriteFile(dir + "/d.bin", bin);
  WriteFile(dir + "/d.idx", HandIdx(8, {2, 3, 1}, {0, 4, 10}, {0, 2, 3}));
  ASSERT_EQ(ReadFile(dir + "/d.idx").size(), 34u + 3 * 4 + 3 * 8 + 3 * 8);

  auto ds = IndexedDataset::Open(dir + "/d");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->dtype(), TokenDType::kUint16);
  EXPECT_EQ((*ds)->num_sequences(), 3);
  EXPECT_EQ((*ds)->num_documents(), 2);
  EXPECT_EQ((*ds)->num_tokens(), 6);
  EXPECT_EQ((*ds)->document_tokens(0), 5);
  EXPECT_EQ((*ds)->document_tokens(1), 1);
  std::vector<int32_t> doc0(5);
  ASSERT_TRUE((*ds)->ReadDocument(0, 0, absl::MakeSpan(doc0)).ok());
  EXPECT_EQ(doc0, (std::vector<int32_t>{1, 2, 300, 65535, 7}));
  std::vector<int32_t> mid(2);  // crosses the sequence boundary inside doc 0
  ASSERT_TRUE((*ds)->ReadDocument(0, 1, absl::MakeSpan(mid)).ok());
  EXPECT_EQ(mid, (std::vector<int32_t>{2, 300}));
  std::vector<int32_t> doc1(1);
  ASSERT_TRUE((*ds)->ReadDocument(1, 0, absl::MakeSpan(doc1)).ok());
  EXPECT_EQ(doc1[0], 42);

  std::vector<int32_t> too_long(2);
  EXPECT_EQ((*ds)->ReadDocument(1, 0, absl::MakeSpan(too_long)).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*ds)->ReadDocument(2, 0, absl::MakeSpan(doc1)).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(IndexedDatasetTest, WriterProducesTheExactMegatronBytes) {
  std::string dir = FreshDir();
  auto w = IndexedDatasetWriter::Create(dir + "/p", TokenDType::kUint8);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->AddDocument(absl::string_view("Hi.\n")).ok());
  ASSERT_TRUE((*w)->AddDocument(absl::string_view("")).ok());
  ASSERT_TRUE((*w)->AddDocument(absl::string_view("abc")).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(ReadFile(dir + "/p.bin"), "Hi.\nabc");
  EXPECT_EQ(ReadFile(dir + "/p.idx"), HandIdx(1, {4, 0, 3}, {0, 4, 4}, {0, 1, 2, 3}));
  EXPECT_FALSE(std::filesystem::exists(dir + "/p.bin.tmp"));
}

TEST(IndexedDatasetTest, RoundTripsUint8AndUint16) {
  std::string dir = FreshDir();
  std::vector<std::vector<int32_t>> docs = {{0, 255, 17}, {65535, 1000, 0, 9}, {5}};
  for (TokenDType dt : {TokenDType::kUint8, TokenDType::kUint16, TokenDType::kInt32}) {
    const std::string prefix = dir + "/" + TokenDTypeName(dt);
    auto w = IndexedDatasetWriter::Create(prefix, dt);
    ASSERT_TRUE(w.ok());
    for (const auto& d : docs) {
      std::vector<int32_t> doc = d;
      if (dt == TokenDType::kUint8) {
        for (int32_t& t : doc) t &= 0xff;
      }
      ASSERT_TRUE((*w)->AddDocument(absl::MakeConstSpan(doc)).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
    auto ds = IndexedDataset::Open(prefix);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ((*ds)->dtype(), dt);
    ASSERT_EQ((*ds)->num_documents(), 3);
    for (int64_t i = 0; i < 3; ++i) {
      std::vector<int32_t> want = docs[i];
      if (dt == TokenDType::kUint8) {
        for (int32_t& t : want) t &= 0xff;
      }
      std::vector<int32_t> got((*ds)->document_tokens(i));
      ASSERT_TRUE((*ds)->ReadDocument(i, 0, absl::MakeSpan(got)).ok());
      EXPECT_EQ(got, want) << TokenDTypeName(dt) << " doc " << i;
    }
  }
}

TEST(IndexedDatasetTest, WriterRefusesTokensThatDoNotFit) {
  std::string dir = FreshDir();
  auto w = IndexedDatasetWriter::Create(dir + "/p", TokenDType::kUint8);
  ASSERT_TRUE(w.ok());
  std::vector<int32_t> doc = {1, 256};
  absl::Status st = (*w)->AddDocument(absl::MakeConstSpan(doc));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("256"), std::string::npos) << st;
  EXPECT_FALSE(IndexedDatasetWriter::Create(dir + "/f", TokenDType::kFloat32).ok());
}

class CorruptIdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    auto w = IndexedDatasetWriter::Create(dir_ + "/c", TokenDType::kUint8);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AddDocument(absl::string_view("first document")).ok());
    ASSERT_TRUE((*w)->AddDocument(absl::string_view("second")).ok());
    ASSERT_TRUE((*w)->Finish().ok());
    idx_ = ReadFile(dir_ + "/c.idx");
    bin_ = ReadFile(dir_ + "/c.bin");
  }
  // Opens with a modified .idx/.bin; returns the error.
  absl::Status OpenWith(const std::string& idx, const std::string& bin) {
    WriteFile(dir_ + "/c.idx", idx);
    WriteFile(dir_ + "/c.bin", bin);
    return IndexedDataset::Open(dir_ + "/c").status();
  }
  std::string dir_, idx_, bin_;
};

TEST_F(CorruptIdxTest, BadMagicIsRefusedNamingTheFile) {
  std::string idx = idx_;
  idx[0] = 'X';
  absl::Status st = OpenWith(idx, bin_);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("c.idx"), std::string::npos) << st;
  EXPECT_NE(st.message().find("magic"), std::string::npos) << st;
}

TEST_F(CorruptIdxTest, BadVersionIsRefused) {
  std::string idx = idx_;
  idx[9] = 2;
  absl::Status st = OpenWith(idx, bin_);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("version 2"), std::string::npos) << st;
}

TEST_F(CorruptIdxTest, UnknownAndFloatDtypesAreRefused) {
  std::string idx = idx_;
  idx[17] = 9;
  EXPECT_NE(OpenWith(idx, bin_).message().find("dtype code 9"), std::string::npos);
  idx[17] = 7;  // float32 in Megatron's table
  absl::Status st = OpenWith(idx, bin_);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("float32"), std::string::npos) << st;
}

TEST_F(CorruptIdxTest, TruncatedIndexIsRefused) {
  for (size_t len : {size_t{0}, size_t{20}, size_t{34}, idx_.size() - 1}) {
    absl::Status st = OpenWith(idx_.substr(0, len), bin_);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << len << ": " << st;
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st;
  }
}

TEST_F(CorruptIdxTest, TruncatedBinIsRefusedNamingTheBin) {
  absl::Status st = OpenWith(idx_, bin_.substr(0, bin_.size() - 1));
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("c.bin"), std::string::npos) << st;
  EXPECT_NE(st.message().find("sequence 1"), std::string::npos) << st;
}

TEST_F(CorruptIdxTest, NonMonotoneDocumentIndexIsRefused) {
  std::string idx = idx_;
  // Document indices start after 2 lengths and 2 pointers; make doc_idx[1] 5.
  idx[34 + 2 * 4 + 2 * 8 + 8] = 5;
  absl::Status st = OpenWith(idx, bin_);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("document index 1"), std::string::npos) << st;
}

TEST_F(CorruptIdxTest, MissingBinIsNotFound) {
  std::filesystem::remove(dir_ + "/c.bin");
  absl::Status st = IndexedDataset::Open(dir_ + "/c").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("c.bin"), std::string::npos) << st;
}

}  // namespace
}  // namespace spikeguard::storage
