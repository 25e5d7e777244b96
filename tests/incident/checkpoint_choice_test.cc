// The one checkpoint rule, as each of its callers queries it.
#include "daemon/incident/checkpoint_choice.h"

#include <vector>

#include "gtest/gtest.h"

namespace spikeguard::incident {
namespace {

CheckpointInfo C(int64_t generation, int64_t step, bool complete = true) {
  return {generation, step, "file:///ckpt/g" + std::to_string(generation) + "-" +
                                std::to_string(step),
          "sum", complete};
}

TEST(CheckpointChoiceTest, NewestCompleteInTheWindow) {
  const std::vector<CheckpointInfo> all = {C(1, 300), C(1, 500), C(1, 900), C(1, 950),
                                           C(1, 980, /*complete=*/false)};
  CheckpointQuery q;
  q.max_step = 999;
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 950);  // 980 is incomplete
  q.min_step = 500;
  q.max_step = 900;
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 900);
  q.pick = CheckpointQuery::Pick::kOldest;
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 500);
}

TEST(CheckpointChoiceTest, NoneIsNotFoundNamingTheWindow) {
  CheckpointQuery q;
  q.min_step = 100;
  q.max_step = 200;
  absl::StatusOr<CheckpointInfo> none = ChooseCheckpoint({C(1, 300), C(1, 150, false)}, q);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("[100, 200]"), std::string::npos) << none.status();
  EXPECT_EQ(ChooseCheckpoint({}, CheckpointQuery()).status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointChoiceTest, GenerationsAndExclusions) {
  const std::vector<CheckpointInfo> all = {C(1, 500), C(2, 600), C(3, 700)};
  CheckpointQuery q;
  q.max_generation = 2;  // a probe never starts from a later timeline
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 600);
  q.excluded_uris = {C(2, 600).uri};  // the workers could not load it
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 500);
  CheckpointQuery own;
  own.generation = 3;  // a relaunch resumes its own generation
  EXPECT_EQ(ChooseCheckpoint(all, own)->step, 700);
  own.generation = 4;
  EXPECT_FALSE(ChooseCheckpoint(all, own).ok());
}

spikeguard::v1::Generation G(int64_t generation, int64_t parent, int64_t branch_step) {
  spikeguard::v1::Generation g;
  g.set_generation(generation);
  g.set_parent(parent);
  g.set_from_checkpoint_step(branch_step);
  return g;
}

// A run's life: gen 0 trained to 1100; an incident probed from gen 0 @ 600
// (replay 1, skip 2, a bisect 3 from the skip's checkpoint @ 800); the fix
// continued gen 4 from gen 0 @ 600; a later incident's fix continued gen 5
// from gen 4 @ 900.
const std::vector<spikeguard::v1::Generation> kTree = {
    G(0, -1, 0), G(1, 0, 600), G(2, 0, 600), G(3, 2, 800), G(4, 0, 600), G(5, 4, 900)};

TEST(LineageTest, OnlyTheAncestryUpToWhereTheLineLeftEachAncestor) {
  const Lineage l = Lineage::Of(kTree, 5);
  EXPECT_TRUE(l.Holds(5, 1500));   // its own, any step
  EXPECT_TRUE(l.Holds(4, 900));    // the parent up to the branch
  EXPECT_FALSE(l.Holds(4, 1000));  // the parent after it
  EXPECT_TRUE(l.Holds(0, 600));    // the grandparent up to where gen 4 left it
  EXPECT_FALSE(l.Holds(0, 700));   // saved before gen 5's own branch, after gen 4's
  EXPECT_FALSE(l.Holds(2, 700));   // a probe: never on the line
  EXPECT_FALSE(l.Holds(3, 800));
  EXPECT_EQ(l.WhyNot(0, 700),
            "saved at step 700, after generation 5's line left generation 0 at step 600");
  EXPECT_EQ(l.WhyNot(2, 700), "saved by generation 2, not on generation 5's line");
  EXPECT_EQ(l.WhyNot(4, 900), "");
  // A probe's own line: its parent's checkpoints before its branch.
  const Lineage bisect = Lineage::Of(kTree, 3);
  EXPECT_TRUE(bisect.Holds(2, 800));
  EXPECT_TRUE(bisect.Holds(0, 600));
  EXPECT_FALSE(bisect.Holds(4, 600));
  // Generation 0 of a run its workers started has no record: a root.
  EXPECT_TRUE(Lineage::Of({}, 0).Holds(0, 5000));
  EXPECT_FALSE(Lineage::Of({}, 0).Holds(1, 10));
  // A malformed tree (a cycle) ends.
  EXPECT_TRUE(Lineage::Of({G(1, 2, 10), G(2, 1, 20)}, 1).Holds(2, 10));
}

TEST(LineageTest, TheChooserKeepsToTheLine) {
  const std::vector<CheckpointInfo> all = {C(0, 500), C(0, 600), C(0, 700), C(0, 1000),
                                           C(2, 800), C(3, 900), C(4, 700), C(4, 800)};
  CheckpointQuery q;
  q.max_step = 999;
  q.lineage = Lineage::Of(kTree, 4);
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 4);
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 800);
  q.max_step = 650;
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 0);
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 600);
  // Without the lineage, the probe's newer checkpoint would have won.
  CheckpointQuery by_number;
  by_number.max_step = 999;
  by_number.max_generation = 4;
  EXPECT_EQ(ChooseCheckpoint(all, by_number)->generation, 3);
  q.max_step = 550;
  q.min_step = 520;
  absl::StatusOr<CheckpointInfo> none = ChooseCheckpoint(all, q);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("on generation 4's line"), std::string::npos)
      << none.status();
}

// A run whose first fix (gen 2, lr x0.7 from gen 0 @ 200) and second fix
// (gen 4, lr x0.49 from gen 2 @ 325) changed its hparams; gen 1 and gen 3 are
// probes, gen 5 a replay probe of gen 4 (same hparams, from gen 4 @ 500).
TEST(LineageTest, ATargetIsNotBeforeTheLinesNewestHParamsChange) {
  auto with_lr = [](spikeguard::v1::Generation g, double lr) {
    g.mutable_hparams()->set_lr_scale(lr);
    return g;
  };
  const std::vector<spikeguard::v1::Generation> tree = {
      G(0, -1, 0), with_lr(G(1, 0, 200), 0.7), with_lr(G(2, 0, 200), 0.7),
      with_lr(G(3, 2, 325), 0.49), with_lr(G(4, 2, 325), 0.49), with_lr(G(5, 4, 500), 0.49)};
  const Lineage l = Lineage::Of(tree, 4);
  EXPECT_EQ(l.hparams_since(), 325);
  EXPECT_TRUE(l.Holds(4, 400));
  EXPECT_TRUE(l.Holds(2, 325));   // saved where gen 4 took its hparams
  EXPECT_FALSE(l.Holds(2, 300));  // on the history, but trained with lr x0.7
  EXPECT_FALSE(l.Holds(0, 150));  // on the history, trained with the original lr
  EXPECT_EQ(l.WhyNot(0, 150),
            "saved at step 150, before generation 4's line took its hparams at step 325: a "
            "replay from it would differ");
  // A replay probe has its parent's hparams: the bound is the parent's.
  EXPECT_EQ(Lineage::Of(tree, 5).hparams_since(), 325);
  EXPECT_EQ(Lineage::Of(tree, 2).hparams_since(), 200);
  EXPECT_TRUE(Lineage::Of(tree, 2).Holds(0, 200));
  // A line that never changed its hparams has no bound.
  EXPECT_TRUE(Lineage::Of(kTree, 5).Holds(0, 100));
  // The chooser: the newest checkpoint before 600 on gen 4's line is gen 4's
  // own; before 330 it is gen 2's at 325; before 320 there is none (gen 0's
  // 150 and gen 2's 300 ran with other hparams), though an operator's rewind
  // may still go back there.
  const std::vector<CheckpointInfo> all = {C(0, 150), C(2, 300), C(2, 325), C(4, 450)};
  CheckpointQuery q;
  q.lineage = l;
  q.max_step = 599;
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 450);
  q.max_step = 330;
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 325);
  q.max_step = 320;
  EXPECT_FALSE(ChooseCheckpoint(all, q).ok());
  q.lineage = l.IgnoringHParams();
  EXPECT_EQ(ChooseCheckpoint(all, q)->step, 300);
}

TEST(CheckpointChoiceTest, TiesAtTheSameStep) {
  const std::vector<CheckpointInfo> all = {C(1, 500), C(3, 500), C(2, 500)};
  CheckpointQuery q;
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 1);  // the one listed first
  q.ties_to_highest_generation = true;  // an operator's rewind
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 3);
  q.preferred_generation = 2;  // the engine: the watched generation's own first
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 2);
  q.ties_to_highest_generation = false;
  q.preferred_generation = 7;  // no checkpoint of its own: the one listed first
  EXPECT_EQ(ChooseCheckpoint(all, q)->generation, 1);
}

TEST(CheckpointChoiceTest, FromTheCatalogRow) {
  spikeguard::v1::Checkpoint row;
  row.set_generation(2);
  row.set_step(800);
  row.set_uri("file:///x");
  row.set_checksum("abc");
  row.set_complete(true);
  const CheckpointInfo c = ToCheckpointInfo(row);
  EXPECT_EQ(c.generation, 2);
  EXPECT_EQ(c.step, 800);
  EXPECT_EQ(c.uri, "file:///x");
  EXPECT_EQ(c.checksum, "abc");
  EXPECT_TRUE(c.complete);
}

}  // namespace
}  // namespace spikeguard::incident
