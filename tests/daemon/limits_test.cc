#include "daemon/ingest/limits.h"

#include <cmath>

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

TEST(LimitsTest, HelloDataOrder) {
  Limits limits;
  spikeguard::v1::Hello hello;
  hello.set_run("r");
  hello.set_world_size(1);
  hello.set_total_steps(500);
  auto* order = hello.mutable_data_order();
  order->set_seed(99);
  order->set_global_batch_size(16);
  order->set_sequence_length(64);
  (*order->mutable_blend())["prose"] = 0.5;
  EXPECT_TRUE(ValidateHello(hello, limits).ok());
  hello.set_total_steps(-1);
  EXPECT_THAT(std::string(ValidateHello(hello, limits).message()),
              HasSubstr("hello.total_steps: -1 is negative"));
  hello.set_total_steps(0);
  order->set_sequence_length(-4);
  EXPECT_THAT(std::string(ValidateHello(hello, limits).message()),
              HasSubstr("hello.data_order.sequence_length"));
  order->set_sequence_length(64);
  (*order->mutable_blend())["code"] = std::nan("");
  EXPECT_THAT(std::string(ValidateHello(hello, limits).message()),
              HasSubstr("hello.data_order.blend['code']"));
  order->mutable_blend()->erase("code");
  (*order->mutable_blend())["bad\nname"] = 1.0;
  EXPECT_THAT(std::string(ValidateHello(hello, limits).message()),
              HasSubstr("hello.data_order.blend domain"));
}

TEST(LimitsTest, GenerationEndedAndCheckpointDeleted) {
  Limits limits;
  spikeguard::v1::GenerationEnded ended;
  ended.set_generation(2);
  ended.set_last_step(499);
  ended.set_reason("end of training schedule (steps=500)");
  EXPECT_TRUE(ValidateGenerationEnded(ended, limits).ok());
  ended.set_last_step(-1);  // nothing trained
  EXPECT_TRUE(ValidateGenerationEnded(ended, limits).ok());
  ended.set_last_step(-2);
  EXPECT_THAT(std::string(ValidateGenerationEnded(ended, limits).message()),
              HasSubstr("generation_ended.last_step"));
  ended.set_last_step(1);
  ended.set_generation(-1);
  EXPECT_THAT(std::string(ValidateGenerationEnded(ended, limits).message()),
              HasSubstr("generation_ended.generation"));

  spikeguard::v1::CheckpointDeleted deleted;
  deleted.set_step(100);
  EXPECT_THAT(std::string(ValidateCheckpointDeleted(deleted, limits).message()),
              HasSubstr("checkpoint_deleted.uri: empty"));
  deleted.set_uri("file:///ckpt/100");
  EXPECT_TRUE(ValidateCheckpointDeleted(deleted, limits).ok());
  deleted.set_step(-3);
  EXPECT_THAT(std::string(ValidateCheckpointDeleted(deleted, limits).message()),
              HasSubstr("checkpoint_deleted.step"));
}

TEST(LimitsTest, ReportedDocumentsAreBoundedAndNamed) {
  Limits limits;
  spikeguard::v1::StepReportBatch batch;
  auto* r = batch.add_reports();
  r->set_step(3);
  auto* d = r->add_documents();
  d->set_domain("web");
  d->set_id(17);
  EXPECT_TRUE(ValidateBatch(batch, limits).ok());
  d->set_id(-1);
  EXPECT_THAT(std::string(ValidateBatch(batch, limits).message()),
              HasSubstr("documents[0].id: -1 is negative"));
  d->set_id(1);
  d->set_domain("");
  EXPECT_THAT(std::string(ValidateBatch(batch, limits).message()),
              HasSubstr("documents[0].domain: empty name"));
  d->set_domain("web");
  for (int i = 0; i < limits.max_documents_per_report; ++i) {
    auto* more = r->add_documents();
    more->set_domain("web");
    more->set_id(i);
  }
  EXPECT_THAT(std::string(ValidateBatch(batch, limits).message()),
              HasSubstr("documents: 4097 documents, more than the limit 4096"));
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
