#include "daemon/control/live_streams.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace spikeguard::daemon {
namespace {

TEST(LiveStreamsTest, ARunsStreamsAndTheEveryRunOnesInOrderUntilRemoved) {
  LiveStreams<std::string> streams;
  const uint64_t a = streams.Add("a", std::make_shared<std::string>("a1"));
  const uint64_t any = streams.Add("", std::make_shared<std::string>("any"));
  streams.Add("b", std::make_shared<std::string>("b1"));
  streams.Add("a", std::make_shared<std::string>("a2"));
  auto names = [](const std::vector<std::shared_ptr<std::string>>& v) {
    std::string out;
    for (const auto& s : v) out += *s + " ";
    return out;
  };
  EXPECT_EQ(names(streams.For("a")), "a1 any a2 ");
  EXPECT_EQ(names(streams.For("b")), "any b1 ");
  EXPECT_EQ(names(streams.For("c")), "any ");
  EXPECT_EQ(names(streams.All()), "a1 any b1 a2 ");
  streams.Remove(a);
  streams.Remove(any);
  streams.Remove(any);  // twice: nothing
  EXPECT_EQ(names(streams.For("a")), "a2 ");
  EXPECT_EQ(names(streams.For("c")), "");
}

TEST(LiveStreamsTest, AHandedOutStreamOutlivesItsRemoval) {
  LiveStreams<int> streams;
  const uint64_t id = streams.Add("r", std::make_shared<int>(7));
  auto taken = streams.For("r");
  streams.Remove(id);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(*taken[0], 7);
}

}  // namespace
}  // namespace spikeguard::daemon
