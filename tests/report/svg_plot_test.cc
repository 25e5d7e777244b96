#include "report/svg_plot.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spikeguard::report {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(ScaleTest, LogWhenValuesSpanDecades) {
  EXPECT_EQ(ChooseScale({1, 10, 1000}), YScale::kLog);
  EXPECT_EQ(ChooseScale({1, 2, 50}), YScale::kLinear);
  EXPECT_EQ(ChooseScale({-1, 10, 1000}), YScale::kLinear);  // a log axis cannot show -1
  EXPECT_EQ(ChooseScale({1, NAN, INFINITY, 1e4}), YScale::kLog);
}

TEST(ScaleTest, LogTicksArePowersOfTen) {
  EXPECT_EQ(LogTicks(1, 1000), (std::vector<double>{1, 10, 100, 1000}));
  EXPECT_EQ(LogTicks(0.5, 20), (std::vector<double>{1, 10}));
  EXPECT_TRUE(LogTicks(0, 10).empty());
}

TEST(ScaleTest, LinearTicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(LinearTicks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  const std::vector<double> t = LinearTicks(2.13, 2.87, 6);
  ASSERT_FALSE(t.empty());
  EXPECT_GE(t.front(), 2.13);
  EXPECT_LE(t.back(), 2.87);
  EXPECT_EQ(FormatTick(0.5), "0.5");
  EXPECT_EQ(FormatTick(1e6), "1e+06");
}

Plot TwoSeries() {
  Plot plot;
  plot.title = "max attention logit";
  plot.y_label = "logit";
  plot.series.push_back({"original (gen 0)", {{0, 1}, {1, 10}, {2, 5000}}, "#222", false});
  plot.series.push_back({"replay (gen 1)", {{0, 1}, {1, 12}, {2, 4000}}, "#d62728", true});
  plot.markers.push_back({1, "spike onset (step 1)", "#d62728", true});
  plot.spans.push_back({1.5, 2.5, "culprit batch", "#d62728"});
  return plot;
}

TEST(RenderSvgTest, OverlaysEverySeriesWithALegendEntry) {
  const std::string svg = RenderSvg(TwoSeries());
  EXPECT_EQ(Count(svg, "class=\"sg-series\""), 2);
  EXPECT_THAT(svg, HasSubstr("data-name=\"original (gen 0)\""));
  EXPECT_THAT(svg, HasSubstr("data-name=\"replay (gen 1)\""));
  EXPECT_THAT(svg, HasSubstr("stroke-dasharray"));  // the probe is dashed
  EXPECT_EQ(Count(svg, "class=\"sg-legend-entry\""), 4);  // 2 series, 1 marker, 1 span
  EXPECT_THAT(svg, HasSubstr(">spike onset (step 1)</text>"));
  EXPECT_THAT(svg, HasSubstr(">culprit batch</text>"));
  EXPECT_THAT(svg, HasSubstr("class=\"sg-marker\""));
  EXPECT_THAT(svg, HasSubstr("class=\"sg-span\""));
}

TEST(RenderSvgTest, DecadesGetALogAxisWithPowerOfTenTicks) {
  const std::string svg = RenderSvg(TwoSeries());
  EXPECT_THAT(svg, HasSubstr("data-scale=\"log\""));
  EXPECT_THAT(svg, HasSubstr("(log scale)"));
  for (const char* tick : {">1<", ">10<", ">100<", ">1000<"}) EXPECT_THAT(svg, HasSubstr(tick));
  Plot linear = TwoSeries();
  linear.scale = YScale::kLinear;
  EXPECT_THAT(RenderSvg(linear), HasSubstr("data-scale=\"linear\""));
}

TEST(RenderSvgTest, NonFiniteValuesLeaveAGapNotAGarbledPath) {
  Plot plot;
  plot.series.push_back({"loss", {{0, 1}, {1, NAN}, {2, INFINITY}, {3, 2}}, "#000", false});
  const std::string svg = RenderSvg(plot);
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("inf")));
  // Two pen-downs: before and after the gap.
  const size_t d = svg.find("d=\"M");
  ASSERT_NE(d, std::string::npos);
  const std::string path = svg.substr(d, svg.find('"', d + 3) - d);
  EXPECT_EQ(Count(path, "M"), 2) << path;
}

TEST(RenderSvgTest, HostileLabelsAreEscaped) {
  Plot plot;
  plot.title = "<script>alert(1)</script>";
  plot.y_label = "\"><img src=x onerror=alert(1)>";
  plot.series.push_back({"run '<b>' \xff", {{0, 1}, {1, 2}}, "red\"/><script>", false});
  plot.markers.push_back({0, "</svg><script>", "#000", true});
  const std::string svg = RenderSvg(plot);
  EXPECT_THAT(svg, Not(HasSubstr("<script")));
  EXPECT_THAT(svg, Not(HasSubstr("<img")));
  EXPECT_THAT(svg, Not(HasSubstr("\xff")));
  EXPECT_EQ(Count(svg, "</svg>"), 1);
}

TEST(RenderSvgTest, EmptyPlotSaysNoData) {
  Plot plot;
  plot.title = "nothing";
  EXPECT_THAT(RenderSvg(plot), HasSubstr("no data"));
}

}  // namespace
}  // namespace spikeguard::report
