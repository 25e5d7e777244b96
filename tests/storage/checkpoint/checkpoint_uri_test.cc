// CheckpointPathOfUri and CheckpointUriOfPath against the cases of
// tests/testdata/checkpoint_uris.tsv, which the Python package's reading
// (spikeguard.checkpoint_uri, tests/python/test_checkpoint_uri.py) is
// tested against too: one table, so both read a URI alike.
#include "storage/checkpoint/checkpoint_uri.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spikeguard::storage {
namespace {

using ::testing::HasSubstr;

struct Case {
  int line = 0;
  std::string kind, given, expected;
};

// The table's escapes: \xHH (exactly two hex digits) and \\.
bool Unescape(absl::string_view field, std::string* out) {
  out->clear();
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] != '\\') {
      out->push_back(field[i]);
      continue;
    }
    if (i + 1 < field.size() && field[i + 1] == '\\') {
      out->push_back('\\');
      ++i;
      continue;
    }
    int value = 0;
    if (i + 3 >= field.size()) return false;
    if (field[i + 1] != 'x' || !absl::ascii_isxdigit(field[i + 2]) ||
        !absl::ascii_isxdigit(field[i + 3])) {
      return false;
    }
    for (int k = 2; k <= 3; ++k) {
      const char c = absl::ascii_tolower(field[i + k]);
      value = value * 16 + (c <= '9' ? c - '0' : c - 'a' + 10);
    }
    out->push_back(static_cast<char>(value));
    i += 3;
  }
  return true;
}

std::vector<Case> Cases() {
  const std::string file = std::string(SPIKEGUARD_SOURCE_DIR) + "/tests/testdata/checkpoint_uris.tsv";
  std::ifstream in(file);
  EXPECT_TRUE(in.good()) << file;
  std::vector<Case> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    EXPECT_EQ(fields.size(), 3u) << file << ":" << number;
    if (fields.size() != 3) continue;
    Case c;
    c.line = number;
    c.kind = fields[0];
    EXPECT_TRUE(Unescape(fields[1], &c.given)) << file << ":" << number;
    EXPECT_TRUE(Unescape(fields[2], &c.expected)) << file << ":" << number;
    out.push_back(std::move(c));
  }
  return out;
}

TEST(CheckpointUriTest, TheSharedCases) {
  const std::vector<Case> cases = Cases();
  int paths = 0, refused = 0, uris = 0;
  for (const Case& c : cases) {
    const std::string where = absl::StrCat("line ", c.line, ": ", absl::CHexEscape(c.given));
    if (c.kind == "path") {
      ++paths;
      absl::StatusOr<std::string> path = CheckpointPathOfUri(c.given);
      ASSERT_TRUE(path.ok()) << where << ": " << path.status();
      EXPECT_EQ(*path, c.expected) << where;
    } else if (c.kind == "refuse") {
      ++refused;
      absl::StatusOr<std::string> path = CheckpointPathOfUri(c.given);
      ASSERT_FALSE(path.ok()) << where << " names " << *path;
      EXPECT_EQ(path.status().code(), absl::StatusCode::kInvalidArgument) << where;
      EXPECT_THAT(path.status().message(), HasSubstr(c.expected)) << where;
    } else if (c.kind == "uri") {
      ++uris;
      EXPECT_EQ(CheckpointUriOfPath(c.given), c.expected) << where;
      absl::StatusOr<std::string> back = CheckpointPathOfUri(c.expected);
      ASSERT_TRUE(back.ok()) << where << ": " << back.status();
      EXPECT_EQ(*back, c.given) << where;
    } else {
      ADD_FAILURE() << where << ": unknown kind " << c.kind;
    }
  }
  EXPECT_GE(paths, 15);
  EXPECT_GE(refused, 25);
  EXPECT_GE(uris, 5);
}

TEST(CheckpointUriTest, AnOverLongUriIsRefused) {
  EXPECT_TRUE(CheckpointPathOfUri("/" + std::string(kMaxCheckpointUri - 1, 'a')).ok());
  absl::StatusOr<std::string> long_one = CheckpointPathOfUri("/" + std::string(kMaxCheckpointUri, 'a'));
  ASSERT_FALSE(long_one.ok());
  EXPECT_THAT(long_one.status().message(), HasSubstr("longer than 4096 bytes"));
}

}  // namespace
}  // namespace spikeguard::storage
