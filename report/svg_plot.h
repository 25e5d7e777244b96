// svg_plot.h
// -----------------------------------------------------------------------------
// A small line-plot writer: SVG text with axes, ticks, axis labels with units,
// a legend, vertical markers and shaded spans. The y axis turns logarithmic
// when the positive values span more than two decades (or when asked), and
// non-finite or (on a log axis) non-positive values leave a gap in the line.
//
//   report::Plot plot;
//   plot.title = "loss";
//   plot.y_label = "loss (nats/token)";
//   plot.series.push_back({"original (gen 0)", points, "#1f77b4", false});
//   plot.markers.push_back({300, "spike onset", "#d62728"});
//   std::string svg = report::RenderSvg(plot);
//
// Every label is HTML-escaped; the SVG is meant to be inlined in HTML.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace spikeguard::report {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), x increasing
  std::string color;
  bool dashed = false;
  double width = 1.6;
  // false: drawn, but no legend entry of its own (e.g. context lines that
  // share one entry with a sibling series).
  bool in_legend = true;
};

// A vertical line at x, labelled.
struct Marker {
  double x = 0;
  std::string label;
  std::string color = "#444";
  bool dashed = true;
};

// A shaded band [from, to] along x, labelled.
struct Span {
  double from = 0;
  double to = 0;
  std::string label;
  std::string color = "#ffbf00";
};

enum class YScale { kAuto, kLinear, kLog };

struct Plot {
  std::string title;
  std::string x_label = "step";
  std::string y_label;
  std::vector<Series> series;
  std::vector<Marker> markers;
  std::vector<Span> spans;
  YScale scale = YScale::kAuto;
  int width = 760;
  int height = 300;
  // Limits of the x axis; unset: the data's.
  std::optional<double> x_min, x_max;
  // Limits of a linear y axis; unset: the data's (padded).
  std::optional<double> y_min, y_max;
  // A class on the <svg> element (tests and the web view find plots by it).
  std::string css_class = "sg-plot";
};

// The scale kAuto picks for these values: kLog when every finite value is
// positive and max/min > 100.
YScale ChooseScale(const std::vector<double>& values);

// "Nice" tick values covering [lo, hi] (about `target` of them).
std::vector<double> LinearTicks(double lo, double hi, int target = 6);
// Powers of ten covering [lo, hi] (lo > 0).
std::vector<double> LogTicks(double lo, double hi);

// Short tick text: 0.001, 12.5, 3e+04.
std::string FormatTick(double value);

std::string RenderSvg(const Plot& plot);

// A palette for series i.
const std::string& PaletteColor(size_t i);

}  // namespace spikeguard::report
