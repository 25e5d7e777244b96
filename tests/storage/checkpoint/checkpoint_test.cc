#include "storage/checkpoint/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/checkpoint/checksum.h"
#include "tests/storage/corpus/test_dir.h"

namespace spikeguard::storage {
namespace {

namespace fs = std::filesystem;
using testing_util::FreshDir;

Checkpoint Sample(int64_t gen, int64_t step) {
  Checkpoint c;
  c.generation = gen;
  c.step = step;
  c.data_position = step + 10;
  c.config_fingerprint = "gpt-4L-128d:abc";
  c.rng_state = std::string("\x01\x00\xff\x7f", 4);
  c.hparams["lr_scale"] = "0.7";
  c.hparams["clip"] = "0.5";
  std::vector<float> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.001f * static_cast<float>(i) - 0.3f;
  c.AddSection("params", w.data(), w.size() * sizeof(float));
  c.AddSection("adam_m", "", 0);
  return c;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(CheckpointTest, RoundTripKeepsEveryField) {
  std::string dir = FreshDir();
  Checkpoint c = Sample(3, 1200);
  auto info = WriteCheckpoint(dir + "/a.sgck", c);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bytes, fs::file_size(dir + "/a.sgck"));

  CheckpointFileInfo read_info;
  auto back = ReadCheckpoint(dir + "/a.sgck", "gpt-4L-128d:abc", &read_info);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(read_info.checksum, info->checksum);
  EXPECT_EQ(back->generation, 3);
  EXPECT_EQ(back->step, 1200);
  EXPECT_EQ(back->data_position, 1210);
  EXPECT_EQ(back->config_fingerprint, c.config_fingerprint);
  EXPECT_EQ(back->rng_state, c.rng_state);
  EXPECT_EQ(back->hparams, c.hparams);
  ASSERT_EQ(back->sections.size(), 2u);
  EXPECT_EQ(back->sections[0].name, "params");
  EXPECT_EQ(back->sections[0].data, c.sections[0].data);
  ASSERT_NE(back->FindSection("adam_m"), nullptr);
  EXPECT_TRUE(back->FindSection("adam_m")->data.empty());
  EXPECT_EQ(back->FindSection("nope"), nullptr);
}

TEST(CheckpointTest, EveryFlippedByteIsRefused) {
  std::string dir = FreshDir();
  std::string path = dir + "/a.sgck";
  ASSERT_TRUE(WriteCheckpoint(path, Sample(1, 5)).ok());
  const std::string good = ReadFile(path);
  // Flip bytes across header, blobs and trailer; none may read back as valid.
  for (size_t i = 0; i < good.size(); i += 97) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    WriteFile(path, bad);
    auto r = ReadCheckpoint(path, std::nullopt);
    ASSERT_FALSE(r.ok()) << "byte " << i;
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
  }
  // A flip in a parameter blob is reported as a checksum mismatch.
  std::string bad = good;
  bad[good.size() / 2] ^= 1;
  WriteFile(path, bad);
  auto r = ReadCheckpoint(path, std::nullopt);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos) << r.status();
}

TEST(CheckpointTest, TruncatedFileIsRefused) {
  std::string dir = FreshDir();
  std::string path = dir + "/a.sgck";
  ASSERT_TRUE(WriteCheckpoint(path, Sample(1, 5)).ok());
  const std::string good = ReadFile(path);
  for (size_t len : {size_t{0}, size_t{5}, size_t{40}, good.size() / 2, good.size() - 1}) {
    WriteFile(path, good.substr(0, len));
    auto r = ReadCheckpoint(path, std::nullopt);
    ASSERT_FALSE(r.ok()) << "length " << len;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  }
}

TEST(CheckpointTest, TrailerReadsByItsLayout) {
  auto bytes = SerializeCheckpoint(Sample(2, 7));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(HasCheckpointMagic(*bytes));
  EXPECT_FALSE(HasCheckpointMagic("SGCKP"));
  const absl::string_view all(*bytes);
  auto stored = ParseCheckpointTrailer(all.substr(all.size() - kCheckpointTrailerSize), "mem");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(*stored, Xxh64Of(all.substr(0, all.size() - kCheckpointTrailerSize)));
  // Not a trailer: short, or its end marker damaged.
  EXPECT_EQ(ParseCheckpointTrailer(all.substr(all.size() - 15), "mem").status().code(),
            absl::StatusCode::kDataLoss);
  std::string damaged(all.substr(all.size() - kCheckpointTrailerSize));
  damaged.back() = 'x';
  auto bad = ParseCheckpointTrailer(damaged, "mem");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("no end marker"), std::string::npos) << bad.status();
}

TEST(CheckpointTest, WrongFingerprintNamesBoth) {
  std::string dir = FreshDir();
  ASSERT_TRUE(WriteCheckpoint(dir + "/a.sgck", Sample(1, 5)).ok());
  auto r = ReadCheckpoint(dir + "/a.sgck", "gpt-8L-256d:xyz");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("gpt-4L-128d:abc"), std::string::npos);
  EXPECT_NE(r.status().message().find("gpt-8L-256d:xyz"), std::string::npos);
}

TEST(CheckpointTest, NewerFormatVersionIsRefused) {
  std::string dir = FreshDir();
  std::string path = dir + "/a.sgck";
  ASSERT_TRUE(WriteCheckpoint(path, Sample(1, 5)).ok());
  std::string bytes = ReadFile(path);
  bytes[8] = 2;  // the u32 version right after the magic
  WriteFile(path, bytes);
  auto r = ReadCheckpoint(path, std::nullopt);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("version 2"), std::string::npos) << r.status();
}

TEST(CheckpointDirTest, CrashLeftoverTempFileIsNotACheckpoint) {
  std::string dir = FreshDir();
  CheckpointDir ckpts(dir);
  ASSERT_TRUE(ckpts.Write(Sample(1, 100)).ok());
  // What an interrupted write leaves: a partial temp file for a newer step.
  std::string full = ReadFile(ckpts.PathFor(1, 100));
  std::string leftover =
      dir + "/." + fs::path(ckpts.PathFor(1, 200)).filename().string() + ".tmp.4242";
  WriteFile(leftover, full.substr(0, full.size() / 3));

  auto list = ckpts.List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 100);

  CheckpointFileInfo info;
  auto newest = ckpts.LoadNewestValid("gpt-4L-128d:abc", &info);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 100);
  EXPECT_EQ(info.step, 100);
  EXPECT_NE(info.checksum, 0u);

  auto cleaned = ckpts.CleanTemporaries();
  ASSERT_TRUE(cleaned.ok());
  EXPECT_EQ(*cleaned, 1);
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_TRUE(fs::exists(ckpts.PathFor(1, 100)));
}

TEST(CheckpointDirTest, NewestValidSkipsCorruptNewerFile) {
  std::string dir = FreshDir();
  CheckpointDir ckpts(dir);
  ASSERT_TRUE(ckpts.Write(Sample(1, 100)).ok());
  ASSERT_TRUE(ckpts.Write(Sample(1, 200)).ok());
  std::string p = ckpts.PathFor(1, 200);
  std::string bytes = ReadFile(p);
  bytes[bytes.size() / 2] ^= 0x55;
  WriteFile(p, bytes);
  auto newest = ckpts.LoadNewestValid("gpt-4L-128d:abc");
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 100);

  auto none = ckpts.LoadNewestValid("other-config");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointDirTest, NewerGenerationWinsOverLaterStep) {
  std::string dir = FreshDir();
  CheckpointDir ckpts(dir);
  // Generation 1 reached step 500; a rewind started generation 2 from step 300.
  ASSERT_TRUE(ckpts.Write(Sample(1, 300)).ok());
  ASSERT_TRUE(ckpts.Write(Sample(1, 500)).ok());
  ASSERT_TRUE(ckpts.Write(Sample(2, 400)).ok());
  auto newest = ckpts.LoadNewestValid("gpt-4L-128d:abc");
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->generation, 2);
  EXPECT_EQ(newest->step, 400);
}

TEST(CheckpointDirTest, RetainKeepsTheLastN) {
  std::string dir = FreshDir();
  CheckpointDir ckpts(dir);
  for (int step : {100, 200, 300, 400, 500}) ASSERT_TRUE(ckpts.Write(Sample(1, step)).ok());
  WriteFile(dir + "/.ckpt-g000001-s000000000600.sgck.tmp.1", "partial");
  WriteFile(dir + "/notes.txt", "operator file, not ours");
  ASSERT_TRUE(ckpts.Retain(2).ok());
  auto list = ckpts.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 400);
  EXPECT_EQ((*list)[1].step, 500);
  EXPECT_FALSE(fs::exists(ckpts.PathFor(1, 300)));
  EXPECT_FALSE(fs::exists(dir + "/.ckpt-g000001-s000000000600.sgck.tmp.1"));
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  EXPECT_EQ(ckpts.Retain(0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointDirTest, RetainNeverDeletesAPinnedCheckpoint) {
  std::string dir = FreshDir();
  CheckpointDir ckpts(dir);
  for (int step : {100, 200, 300, 400, 500}) ASSERT_TRUE(ckpts.Write(Sample(1, step)).ok());
  // An open incident rewinds to step 200; the pin names it the way the
  // daemon does (a path with a redundant component).
  const std::set<std::string> pinned = {dir + "/./" +
                                        fs::path(ckpts.PathFor(1, 200)).filename().string()};
  auto deleted = ckpts.Retain(1, pinned);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  ASSERT_EQ(deleted->size(), 3u);
  EXPECT_EQ((*deleted)[0].step, 100);
  EXPECT_EQ((*deleted)[1].step, 300);
  EXPECT_EQ((*deleted)[2].step, 400);
  EXPECT_EQ((*deleted)[0].path, ckpts.PathFor(1, 100));
  auto list = ckpts.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 200);  // pinned, older than keep_last allows
  EXPECT_EQ((*list)[1].step, 500);  // the newest unpinned one
  EXPECT_TRUE(ReadCheckpoint(ckpts.PathFor(1, 200), "gpt-4L-128d:abc").ok());

  // A pinned newest checkpoint does not count towards keep_last.
  ASSERT_TRUE(ckpts.Write(Sample(1, 600)).ok());
  deleted = ckpts.Retain(1, {ckpts.PathFor(1, 600), ckpts.PathFor(1, 200)});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(deleted->empty());
  EXPECT_EQ(ckpts.List()->size(), 3u);

  // Unpinned, it goes like any other; nothing left to delete is no error.
  deleted = ckpts.Retain(1, {});
  ASSERT_TRUE(deleted.ok());
  ASSERT_EQ(deleted->size(), 2u);
  EXPECT_EQ((*deleted)[0].step, 200);
  EXPECT_EQ((*deleted)[1].step, 500);
  EXPECT_TRUE(ckpts.Retain(1, {})->empty());
  EXPECT_EQ(ckpts.Retain(0, pinned).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointDirTest, MissingDirectoryListsNothing) {
  CheckpointDir ckpts(FreshDir() + "/not-yet");
  auto list = ckpts.List();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  EXPECT_EQ(ckpts.LoadNewestValid("x").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace spikeguard::storage
