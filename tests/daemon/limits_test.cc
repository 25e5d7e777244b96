#include "daemon/ingest/limits.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spikeguard::daemon {
namespace {

using ::testing::HasSubstr;

TEST(LimitsTest, RunNames) {
  Limits limits;
  EXPECT_TRUE(ValidateRunName("gpt-7b.v2_run", limits).ok());
  EXPECT_THAT(std::string(ValidateRunName("", limits).message()), HasSubstr("empty"));
  EXPECT_THAT(std::string(ValidateRunName(".hidden", limits).message()), HasSubstr("'.'"));
  EXPECT_THAT(std::string(ValidateRunName("a/b", limits).message()), HasSubstr("0x2f"));
  EXPECT_FALSE(ValidateRunName(std::string(129, 'a'), limits).ok());
}

TEST(LimitsTest, TextMustBeUtf8WithoutControls) {
  EXPECT_TRUE(ValidateText("f", "héllo\twörld", 100).ok());
  EXPECT_THAT(std::string(ValidateText("f", "\xc3", 100).message()), HasSubstr("UTF-8"));
  EXPECT_THAT(std::string(ValidateText("f", "\xff\xfe", 100).message()), HasSubstr("UTF-8"));
  EXPECT_THAT(std::string(ValidateText("f", "a\nb", 100).message()), HasSubstr("0xa"));
  EXPECT_THAT(std::string(ValidateText("host", "abcdef", 3).message()),
              HasSubstr("host: 6 bytes, longer than 3"));
}

TEST(LimitsTest, BatchStepsMustIncrease) {
  Limits limits;
  spikeguard::v1::StepReportBatch batch;
  batch.add_reports()->set_step(3);
  batch.add_reports()->set_step(3);
  EXPECT_THAT(std::string(ValidateBatch(batch, limits).message()),
              HasSubstr("reports[1].step: 3 is out of order"));
  batch.mutable_reports(1)->set_step(4);
  EXPECT_TRUE(ValidateBatch(batch, limits).ok());
}

TEST(LimitsTest, CheckpointNotices) {
  Limits limits;
  spikeguard::v1::CheckpointSaved c;
  c.set_step(100);
  EXPECT_THAT(std::string(ValidateCheckpointSaved(c, limits).message()), HasSubstr("uri"));
  c.set_uri("file:///ckpt/100");
  EXPECT_TRUE(ValidateCheckpointSaved(c, limits).ok());
  c.set_step(-1);
  EXPECT_THAT(std::string(ValidateCheckpointSaved(c, limits).message()), HasSubstr("negative"));
}

}  // namespace
}  // namespace spikeguard::daemon
