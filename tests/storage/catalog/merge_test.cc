// MergeReport: the per-step reduction of rank reports into one StepRecord.
#include "storage/catalog/merge.h"

#include <bit>
#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace spikeguard::storage {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

v1::StepReport Report(int64_t step, double loss, double grad_norm, double step_time) {
  v1::StepReport r;
  r.set_step(step);
  r.set_data_position(step + 100);
  r.set_loss(loss);
  r.set_grad_norm(grad_norm);
  r.set_step_time_s(step_time);
  r.set_lr(3e-4);
  r.set_loss_scale(1024);
  r.set_tokens(1000);
  r.set_lse_mean(5.0);
  r.set_lse_max(7.0);
  return r;
}

v1::LayerStats Layer(uint32_t index, double value) {
  v1::LayerStats l;
  l.set_layer(index);
  l.set_max_attn_logit(value);
  l.set_grad_norm(value);
  l.set_update_ratio(value);
  l.set_act_rms(value);
  l.set_param_norm(value);
  return l;
}

TEST(MergeReport, FirstReportSetsEverything) {
  v1::StepRecord record;
  v1::StepReport r = Report(7, 2.5, 1.5, 0.25);
  r.set_clipped(true);
  r.set_nonfinite_count(0);
  MergeReport(&record, 3, r);
  EXPECT_EQ(record.step(), 7);
  EXPECT_EQ(record.data_position(), 107);
  EXPECT_EQ(record.ranks_reported(), 1u);
  EXPECT_EQ(record.loss(), 2.5);
  EXPECT_EQ(record.grad_norm(), 1.5);
  EXPECT_TRUE(record.clipped());
  EXPECT_EQ(record.max_loss().rank(), 3u);
  EXPECT_EQ(record.slowest_step().value(), 0.25);
  EXPECT_FALSE(record.has_first_nonfinite_rank());
  EXPECT_EQ(record.loss_hash(), LossHashContribution(3, 0));
}

TEST(MergeReport, MeansSumsMaximaAndExtremesOverEightRanks) {
  v1::StepRecord record;
  // Merge in a scrambled rank order: results must not depend on it.
  const uint32_t order[] = {5, 2, 7, 0, 3, 6, 1, 4};
  for (uint32_t rank : order) {
    v1::StepReport r = Report(10, 1.0 + rank, 0.5 * rank, rank == 6 ? 9.0 : 1.0);
    r.set_clipped(rank == 2);
    r.set_tokens(100 + rank);
    r.set_nonfinite_count(rank == 4 ? 2 : 0);
    r.set_lse_max(rank == 1 ? 30.0 : 7.0);
    MergeReport(&record, rank, r);
  }
  EXPECT_EQ(record.ranks_reported(), 8u);
  EXPECT_DOUBLE_EQ(record.loss(), 4.5);  // mean of 1..8
  EXPECT_EQ(record.grad_norm(), 3.5);    // max of 0.5 * rank
  EXPECT_EQ(record.step_time_s(), 9.0);
  EXPECT_EQ(record.lse_max(), 30.0);
  EXPECT_DOUBLE_EQ(record.lse_mean(), 5.0);
  EXPECT_EQ(record.tokens(), 800 + 28);
  EXPECT_EQ(record.nonfinite_count(), 2);
  EXPECT_TRUE(record.clipped());
  EXPECT_EQ(record.max_loss().rank(), 7u);
  EXPECT_EQ(record.max_loss().value(), 8.0);
  EXPECT_EQ(record.slowest_step().rank(), 6u);
  ASSERT_TRUE(record.has_first_nonfinite_rank());
  EXPECT_EQ(record.first_nonfinite_rank(), 4u);
  EXPECT_EQ(record.lr(), 3e-4);
  EXPECT_EQ(record.data_position(), 110);
}

TEST(MergeReport, ReportedDocumentsAreTheRanksUnionEachOnce) {
  v1::StepRecord record;
  for (uint32_t rank : {1u, 0u}) {
    v1::StepReport r = Report(10, 1.0, 0.5, 1.0);
    for (int64_t id : {5 + rank, 3 + 0 * rank}) {
      auto* d = r.add_documents();
      d->set_domain(rank == 0 ? "web" : "code");
      d->set_id(id);
    }
    auto* shared = r.add_documents();
    shared->set_domain("web");
    shared->set_id(3);
    MergeReport(&record, rank, r);
  }
  std::vector<std::string> got;
  for (const auto& d : record.documents()) got.push_back(d.domain() + ":" + std::to_string(d.id()));
  EXPECT_EQ(got, (std::vector<std::string>{"code:3", "code:6", "web:3", "web:5"}));
}

TEST(MergeReport, LossHashIsOrderIndependentAndDoesNotCancel) {
  v1::StepRecord forward, backward;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    v1::StepReport r = Report(1, 1.0, 1.0, 1.0);
    r.set_loss_hash(0xdeadbeefULL);  // every rank has the same loss bits
    MergeReport(&forward, rank, r);
  }
  for (int rank = 3; rank >= 0; --rank) {
    v1::StepReport r = Report(1, 1.0, 1.0, 1.0);
    r.set_loss_hash(0xdeadbeefULL);
    MergeReport(&backward, static_cast<uint32_t>(rank), r);
  }
  EXPECT_EQ(forward.loss_hash(), backward.loss_hash());
  // Equal hashes on two ranks must not cancel out (as XOR would).
  v1::StepRecord two;
  v1::StepReport r = Report(1, 1.0, 1.0, 1.0);
  r.set_loss_hash(42);
  MergeReport(&two, 0, r);
  MergeReport(&two, 1, r);
  EXPECT_NE(two.loss_hash(), 0u);
  // A different loss on one rank changes the combined hash.
  v1::StepRecord changed;
  MergeReport(&changed, 0, r);
  r.set_loss_hash(43);
  MergeReport(&changed, 1, r);
  EXPECT_NE(changed.loss_hash(), two.loss_hash());
}

TEST(MergeReport, NaNWinsEveryMaxAndPropagatesThroughMeans) {
  v1::StepRecord record;
  MergeReport(&record, 0, Report(1, 2.0, 1.0, 1.0));
  v1::StepReport bad = Report(1, kNaN, kNaN, kNaN);
  bad.set_lse_max(kNaN);
  *bad.add_layers() = Layer(0, kNaN);
  MergeReport(&record, 5, bad);
  // Larger finite values after the NaN must not hide it.
  v1::StepReport big = Report(1, 3.0, 1e9, 1e9);
  big.set_lse_max(1e9);
  *big.add_layers() = Layer(0, 1e9);
  MergeReport(&record, 2, big);
  EXPECT_TRUE(std::isnan(record.loss()));
  EXPECT_TRUE(std::isnan(record.grad_norm()));
  EXPECT_TRUE(std::isnan(record.step_time_s()));
  EXPECT_TRUE(std::isnan(record.lse_max()));
  ASSERT_EQ(record.layers_size(), 1);
  EXPECT_TRUE(std::isnan(record.layers(0).max_attn_logit()));
  EXPECT_TRUE(std::isnan(record.layers(0).param_norm()));
  EXPECT_EQ(record.max_loss().rank(), 5u);
  EXPECT_TRUE(std::isnan(record.max_loss().value()));
  ASSERT_TRUE(record.has_first_nonfinite_rank());
  EXPECT_EQ(record.first_nonfinite_rank(), 5u);
}

TEST(MergeReport, InfinityStaysInfinityInTheMean) {
  v1::StepRecord record;
  MergeReport(&record, 0, Report(1, kInf, 1.0, 1.0));
  MergeReport(&record, 1, Report(1, kInf, 1.0, 1.0));
  MergeReport(&record, 2, Report(1, 1.0, 1.0, 1.0));
  EXPECT_EQ(record.loss(), kInf);
  EXPECT_EQ(record.first_nonfinite_rank(), 0u);
}

TEST(MergeReport, FirstNonfiniteRankIsTheLowest) {
  v1::StepRecord record;
  for (uint32_t rank : {6u, 3u, 1u, 4u}) {
    v1::StepReport r = Report(1, 1.0, 1.0, 1.0);
    r.set_nonfinite_count(rank == 1 ? 0 : 1);  // rank 1 is clean
    MergeReport(&record, rank, r);
  }
  EXPECT_EQ(record.first_nonfinite_rank(), 3u);
}

TEST(MergeReport, PipelineStagesComplementLayersAndOverlapsKeepTheLarger) {
  v1::StepRecord record;
  v1::StepReport stage1 = Report(1, 1.0, 1.0, 1.0);
  for (uint32_t l = 4; l < 8; ++l) *stage1.add_layers() = Layer(l, 10.0 + l);
  v1::StepReport stage0 = Report(1, 1.0, 1.0, 1.0);
  for (uint32_t l = 0; l < 5; ++l) *stage0.add_layers() = Layer(l, 1.0 + l);  // overlaps at 4
  v1::StepReport stage0b = stage0;
  stage0b.mutable_layers(2)->set_act_rms(99.0);
  MergeReport(&record, 1, stage1);
  MergeReport(&record, 0, stage0);
  MergeReport(&record, 2, stage0b);
  ASSERT_EQ(record.layers_size(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(record.layers(i).layer(), static_cast<uint32_t>(i));
  EXPECT_EQ(record.layers(4).grad_norm(), 14.0);  // max(5, 14)
  EXPECT_EQ(record.layers(2).act_rms(), 99.0);
  EXPECT_EQ(record.layers(2).grad_norm(), 3.0);
}

TEST(MergeReport, DomainLossIsTokenWeighted) {
  v1::StepRecord record;
  v1::StepReport a = Report(1, 1.0, 1.0, 1.0);
  auto* web = a.add_domain_losses();
  web->set_domain("web");
  web->set_loss(2.0);
  web->set_tokens(300);
  v1::StepReport b = Report(1, 1.0, 1.0, 1.0);
  auto* web_b = b.add_domain_losses();
  web_b->set_domain("web");
  web_b->set_loss(4.0);
  web_b->set_tokens(100);
  auto* code = b.add_domain_losses();
  code->set_domain("code");
  code->set_loss(1.5);
  code->set_tokens(50);
  MergeReport(&record, 0, a);
  MergeReport(&record, 1, b);
  ASSERT_EQ(record.domain_losses_size(), 2);
  EXPECT_EQ(record.domain_losses(0).domain(), "code");
  EXPECT_EQ(record.domain_losses(0).loss(), 1.5);
  EXPECT_EQ(record.domain_losses(1).domain(), "web");
  EXPECT_DOUBLE_EQ(record.domain_losses(1).loss(), (2.0 * 300 + 4.0 * 100) / 400);
  EXPECT_EQ(record.domain_losses(1).tokens(), 400);
}

// Counts at INT64_MAX from two ranks wrapped to a negative sum: tokens -2,
// and one real non-finite value beside INT64_MAX became INT64_MIN, so no
// non-finite incident opened. Sums now stop at INT64_MAX.
TEST(MergeReport, CountsSummedOverRanksSaturateInsteadOfWrapping) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  v1::StepRecord tokens;
  v1::StepReport a = Report(1, 2.0, 1.0, 0.1), b = Report(1, 2.0, 1.0, 0.1);
  a.set_tokens(kMax);
  b.set_tokens(kMax);
  auto* da = a.add_domain_losses();
  da->set_domain("web");
  da->set_loss(2.0);
  da->set_tokens(kMax);
  *b.add_domain_losses() = *da;
  MergeReport(&tokens, 0, a);
  MergeReport(&tokens, 1, b);
  EXPECT_EQ(tokens.tokens(), kMax);
  ASSERT_EQ(tokens.domain_losses_size(), 1);
  EXPECT_EQ(tokens.domain_losses(0).tokens(), kMax);
  EXPECT_DOUBLE_EQ(tokens.domain_losses(0).loss(), 2.0);

  v1::StepRecord nonfinite;
  v1::StepReport real = Report(1, kNaN, 1.0, 0.1), huge = Report(1, 2.0, 1.0, 0.1);
  real.set_nonfinite_count(1);
  huge.set_nonfinite_count(kMax);
  MergeReport(&nonfinite, 0, real);
  MergeReport(&nonfinite, 1, huge);
  EXPECT_EQ(nonfinite.nonfinite_count(), kMax);
  EXPECT_GT(nonfinite.nonfinite_count(), 0);
  EXPECT_EQ(nonfinite.first_nonfinite_rank(), 0u);
}

TEST(MergeReport, ExtremeTiesGoToTheLowestRank) {
  v1::StepRecord record;
  MergeReport(&record, 5, Report(1, 3.0, 1.0, 2.0));
  MergeReport(&record, 2, Report(1, 3.0, 1.0, 2.0));
  MergeReport(&record, 9, Report(1, 3.0, 1.0, 2.0));
  EXPECT_EQ(record.max_loss().rank(), 2u);
  EXPECT_EQ(record.slowest_step().rank(), 2u);
}

}  // namespace
}  // namespace spikeguard::storage
