#include "storage/corpus/data_plan.h"

#include <limits>

#include "gtest/gtest.h"

namespace spikeguard::storage {
namespace {

int64_t Pos(const DataPlan& plan, int64_t step) {
  auto p = plan.PositionForStep(step);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : -1;
}

TEST(DataPlanTest, DefaultConsumesPositionEqualToStep) {
  DataPlan plan = DataPlan::Default();
  EXPECT_EQ(plan.ToString(), "0-");
  EXPECT_EQ(plan.StepCount(), -1);
  for (int64_t s : {0, 1, 599, 1000000}) EXPECT_EQ(Pos(plan, s), s);
  EXPECT_FALSE(plan.PositionForStep(-1).ok());
}

TEST(DataPlanTest, HoleShiftsEveryLaterStep) {
  auto plan = DataPlan::Default().WithHole(600, 610);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ToString(), "0-600,610-");
  EXPECT_EQ(Pos(*plan, 599), 599);
  EXPECT_EQ(Pos(*plan, 600), 610);
  EXPECT_EQ(Pos(*plan, 1000), 1010);
  EXPECT_EQ(plan->FirstStepForPosition(605).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*plan->FirstStepForPosition(610), 600);

  // A second hole before the first shifts by both.
  auto two = plan->WithHole(100, 105);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->ToString(), "0-100,105-600,610-");
  EXPECT_EQ(Pos(*two, 100), 105);
  EXPECT_EQ(Pos(*two, 595), 610);
}

TEST(DataPlanTest, HoleAcrossRangesAndAtTheStart) {
  auto plan = DataPlan::FromRanges({{0, 100}, {200, 300}, {400, PositionRange::kUnbounded}});
  ASSERT_TRUE(plan.ok());
  auto holed = plan->WithHole(50, 250);
  ASSERT_TRUE(holed.ok());
  EXPECT_EQ(holed->ToString(), "0-50,250-300,400-");
  auto front = DataPlan::Default().WithHole(0, 3);
  ASSERT_TRUE(front.ok());
  EXPECT_EQ(Pos(*front, 0), 3);
  EXPECT_FALSE(DataPlan::Default().WithHole(5, 5).ok());
  EXPECT_FALSE(DataPlan::Default().WithHole(-1, 5).ok());
}

TEST(DataPlanTest, SpliceTransplantsARangeToAnotherStep) {
  // The culprit batches 600..609 skipped in place and fed at step 300.
  auto holed = DataPlan::Default().WithHole(600, 610);
  ASSERT_TRUE(holed.ok());
  auto plan = holed->WithSplice(300, {600, 610});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ToString(), "0-300,600-610,300-600,610-");
  EXPECT_EQ(Pos(*plan, 299), 299);
  EXPECT_EQ(Pos(*plan, 300), 600);
  EXPECT_EQ(Pos(*plan, 309), 609);
  EXPECT_EQ(Pos(*plan, 310), 300);
  EXPECT_EQ(Pos(*plan, 610), 610);  // from here on, back in step with the default
  EXPECT_FALSE(DataPlan::Default().WithSplice(5, {1, PositionRange::kUnbounded}).ok());
}

TEST(DataPlanTest, InsertBeforePositionSplicesWhereThePlanReachesIt) {
  // A skipped window [600, 610): position 300 is consumed at step 300, so
  // the culprit 605 is fed there, and 300 follows it.
  auto holed = DataPlan::Default().WithHole(600, 610);
  ASSERT_TRUE(holed.ok());
  auto plan = holed->WithInsertBeforePosition(300, {605, 606});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ToString(), "0-300,605-606,300-600,610-");
  EXPECT_EQ(Pos(*plan, 300), 605);
  EXPECT_EQ(Pos(*plan, 301), 300);
  // Keyed by position, not step: after the hole, position 700 is consumed at
  // step 690, and the insert lands there.
  auto late = holed->WithInsertBeforePosition(700, {605, 606});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(Pos(*late, 689), 699);
  EXPECT_EQ(Pos(*late, 690), 605);
  EXPECT_EQ(Pos(*late, 691), 700);
  // A position the plan never consumes (inside the hole) has no such point.
  EXPECT_EQ(holed->WithInsertBeforePosition(603, {0, 1}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(DataPlan::Default().WithInsertBeforePosition(5, {1, PositionRange::kUnbounded}).ok());
  // Masks are kept.
  auto masked = DataPlan::Default().WithMask(40, {1});
  ASSERT_TRUE(masked.ok());
  auto kept = masked->WithInsertBeforePosition(10, {50, 51});
  ASSERT_TRUE(kept.ok());
  EXPECT_NE(kept->MaskAt(40), nullptr);
}

TEST(DataPlanTest, OverlapsAreAllowedAndRepeatPositions) {
  // A transplant from an earlier checkpoint without a hole feeds 600..609 twice.
  auto plan = DataPlan::Default().WithSplice(300, {600, 610});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(Pos(*plan, 300), 600);
  EXPECT_EQ(Pos(*plan, 610), 600);
  EXPECT_EQ(*plan->FirstStepForPosition(600), 300);
}

TEST(DataPlanTest, BoundedPlanEndsWithOutOfRange) {
  auto plan = DataPlan::FromRanges({{10, 20}, {20, 25}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ToString(), "10-25");  // adjacent ranges merge
  EXPECT_EQ(plan->StepCount(), 15);
  EXPECT_EQ(Pos(*plan, 14), 24);
  EXPECT_EQ(plan->PositionForStep(15).status().code(), absl::StatusCode::kOutOfRange);
  auto spliced = plan->WithSplice(15, {0, 2});  // append at the end
  ASSERT_TRUE(spliced.ok());
  EXPECT_EQ(Pos(*spliced, 16), 1);
  EXPECT_FALSE(plan->WithSplice(16, {0, 2}).ok());
}

TEST(DataPlanTest, ValidationNamesTheBadRange) {
  auto neg = DataPlan::FromRanges({{0, 10}, {-5, 3}});
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("range 1"), std::string::npos) << neg.status();
  EXPECT_NE(neg.status().message().find("negative"), std::string::npos);
  EXPECT_FALSE(DataPlan::FromRanges({{10, 10}}).ok());
  EXPECT_FALSE(DataPlan::FromRanges({{10, 5}}).ok());
  EXPECT_FALSE(DataPlan::FromRanges({{0, -7}}).ok());
  auto unreachable = DataPlan::FromRanges({{0, PositionRange::kUnbounded}, {5, 6}});
  ASSERT_FALSE(unreachable.ok());
  EXPECT_NE(unreachable.status().message().find("unbounded"), std::string::npos);
}

TEST(DataPlanTest, ParseRoundTripsAndRejectsGarbage) {
  for (const char* text : {"0-", "0-600,610-", "0-300,600-610,300-600,610-", "5-9"}) {
    auto plan = DataPlan::Parse(text);
    ASSERT_TRUE(plan.ok()) << text << ": " << plan.status();
    EXPECT_EQ(plan->ToString(), text);
  }
  EXPECT_EQ(DataPlan::Parse(" 0 - 10 , 20 - ")->ToString(), "0-10,20-");
  EXPECT_EQ(DataPlan::Parse("")->StepCount(), 0);
  for (const char* bad : {"x", "1", "1-2-3", "-5", "3-1", "0-,5-"}) {
    EXPECT_FALSE(DataPlan::Parse(bad).ok()) << bad;
  }
}

TEST(DataPlanTest, SampleMasksRoundTripAndSurviveHolesAndSplices) {
  auto plan = DataPlan::Default().WithHole(600, 610);
  ASSERT_TRUE(plan.ok());
  auto masked = plan->WithMask(300, {5, 0, 1, 5});
  ASSERT_TRUE(masked.ok()) << masked.status();
  EXPECT_EQ(masked->ToString(), "0-600,610-;drop=300:0.1.5");
  ASSERT_NE(masked->MaskAt(300), nullptr);
  EXPECT_EQ(masked->MaskAt(300)->slots, (std::vector<int32_t>{0, 1, 5}));
  EXPECT_EQ(masked->MaskAt(301), nullptr);
  // Positions are unchanged by a mask; the text form parses back equal.
  EXPECT_EQ(Pos(*masked, 300), 300);
  auto back = DataPlan::Parse(masked->ToString());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *masked);
  EXPECT_NE(*back, *plan);
  // Holes and splices keep the masks; an empty slot list removes one.
  auto holed = masked->WithHole(100, 105);
  ASSERT_TRUE(holed.ok());
  EXPECT_EQ(holed->ToString(), "0-100,105-600,610-;drop=300:0.1.5");
  auto spliced = masked->WithSplice(50, {300, 301});
  ASSERT_TRUE(spliced.ok());
  EXPECT_NE(spliced->MaskAt(300), nullptr);
  auto cleared = masked->WithMask(300, {});
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(cleared->ToString(), "0-600,610-");
  // A plan without masks prints as before.
  EXPECT_EQ(DataPlan::Parse("0-600,610-")->ToString(), "0-600,610-");
}

TEST(DataPlanTest, BadSampleMasksAreRefusedNamingThePart) {
  for (const char* text : {"0-;drop=300", "0-;drop=x:1", "0-;drop=300:1.a", "0-;keep=300:1",
                           "0-;drop=300:1;drop=300:2", "0-;drop=-1:1", "0-;drop=300:-2"}) {
    auto plan = DataPlan::Parse(text);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
  auto plan = DataPlan::Parse("0-;drop=300:1.a");
  EXPECT_NE(plan.status().message().find("slot 'a'"), std::string::npos) << plan.status();
  auto twice = DataPlan::Parse("0-;drop=300:1;drop=300:2");
  EXPECT_NE(twice.status().message().find("masks batch 300 twice"), std::string::npos)
      << twice.status();
}

}  // namespace
// Found by tests/fuzz/data_plan_fuzz (UBSan: signed overflow): step and
// position arithmetic near INT64_MAX.
TEST(DataPlanTest, StepsAndPositionsNearInt64MaxDoNotOverflow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto plan = DataPlan::Parse("0-600,610-");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->PositionForStep(kMax).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*plan->PositionForStep(kMax - 10), kMax);
  EXPECT_EQ(*plan->FirstStepForPosition(kMax), kMax - 10);
  // Position INT64_MAX would be step 2^63+4 of "5-10,0-": no int64 step.
  auto late = DataPlan::Parse("5-10,0-");
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->FirstStepForPosition(kMax).status().code(), absl::StatusCode::kNotFound);
  // More than 2^63-1 steps in bounded ranges is refused, naming the range.
  auto huge = DataPlan::Parse("0-9223372036854775807,0-9223372036854775807");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("range 1"), std::string::npos) << huge.status();
}

}  // namespace spikeguard::storage
