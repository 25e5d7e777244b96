#include "storage/checkpoint/torch_checkpoint.h"

#include <string>

#include "gtest/gtest.h"

namespace spikeguard::storage {
namespace {

const std::string kSha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

// The head worker/python/spikeguard/checkpoint.py writes: magic, u32
// length, the JSON header (keys sorted) padded with spaces to that length.
std::string Head(const std::string& json, size_t padded) {
  std::string out = "SGTORCH1";
  const auto n = static_cast<uint32_t>(padded);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += json;
  out.append(padded - json.size(), ' ');
  return out;
}

TEST(TorchCheckpointTest, ReadsTheHeaderPythonWrites) {
  const std::string json =
      "{\"data_plan\": null, \"data_position\": 12, \"format\": 1, \"generation\": 3, "
      "\"payload_bytes\": 4096, \"rank\": 0, \"saved_unix\": 1765000000.25, \"sha256\": \"" +
      kSha + "\", \"step\": 10}";
  const std::string head = Head(json, json.size() + 40);
  EXPECT_TRUE(HasTorchCheckpointMagic(head));
  auto len = TorchCheckpointHeaderLength(head, "f.pt");
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(*len, json.size() + 40);
  auto h = ParseTorchCheckpointHeader(absl::string_view(head).substr(kTorchCheckpointPrefixSize),
                                      "f.pt");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->step, 10);
  EXPECT_EQ(h->data_position, 12);
  EXPECT_EQ(h->payload_bytes, 4096);
  EXPECT_EQ(h->sha256, kSha);
  EXPECT_EQ(h->payload_offset, static_cast<int64_t>(head.size()));
}

TEST(TorchCheckpointTest, TheChecksumIsTheFieldNotAStringThatLooksLikeIt) {
  // A data plan whose text looks like the sha256 key, before the real one;
  // and no space after the colon (any valid JSON spelling).
  const std::string decoy(64, 'a');
  const std::string json = "{\"data_plan\":\"\\\"sha256\\\": \\\"" + decoy +
                           "\",\"format\":1,\"step\":1,\"data_position\":1,"
                           "\"payload_bytes\":1,\"sha256\":\"" + kSha + "\"}";
  auto h = ParseTorchCheckpointHeader(json, "f.pt");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->sha256, kSha);
}

TEST(TorchCheckpointTest, RefusesWhatPythonRefuses) {
  const std::string ok_rest = "\"step\":1,\"data_position\":1,\"payload_bytes\":1";
  for (const std::string& json : {
           std::string("not json"),
           std::string("[1, 2]"),
           "{\"format\":2," + ok_rest + ",\"sha256\":\"" + kSha + "\"}",
           "{" + ok_rest + ",\"sha256\":\"" + kSha + "\"}",
           "{\"format\":1," + ok_rest + "}",
           "{\"format\":1," + ok_rest + ",\"sha256\":\"abc\"}",
           "{\"format\":1,\"step\":1,\"data_position\":1,\"sha256\":\"" + kSha + "\"}",
           "{\"format\":1,\"step\":-1,\"data_position\":1,\"payload_bytes\":1,\"sha256\":\"" +
               kSha + "\"}",
       }) {
    auto h = ParseTorchCheckpointHeader(json, "f.pt");
    EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << json;
    EXPECT_NE(h.status().message().find("f.pt"), std::string::npos) << h.status();
  }
  EXPECT_FALSE(TorchCheckpointHeaderLength("SGTORCH1\x01", "f.pt").ok());
  EXPECT_FALSE(TorchCheckpointHeaderLength("SGCKPT\0\0\x01\0\0\0", "f.pt").ok());
  EXPECT_FALSE(TorchCheckpointHeaderLength(std::string("SGTORCH1\0\0\x20\0", 12), "f.pt").ok());
}

}  // namespace
}  // namespace spikeguard::storage
