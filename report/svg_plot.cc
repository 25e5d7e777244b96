#include "report/svg_plot.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "report/html.h"

namespace spikeguard::report {
namespace {

constexpr double kLeft = 70, kRight = 16, kTop = 28, kBottom = 44, kLegendRow = 16;

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

}  // namespace

const std::string& PaletteColor(size_t i) {
  static const std::vector<std::string>* palette = new std::vector<std::string>{
      "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};
  return (*palette)[i % palette->size()];
}

YScale ChooseScale(const std::vector<double>& values) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  bool any = false;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    if (v <= 0) return YScale::kLinear;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    any = true;
  }
  return any && hi / lo > 100 ? YScale::kLog : YScale::kLinear;
}

std::vector<double> LinearTicks(double lo, double hi, int target) {
  std::vector<double> ticks;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) {
    ticks.push_back(lo);
    return ticks;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  const double start = std::ceil(lo / step - 1e-9) * step;
  for (double t = start; t <= hi + step * 1e-9 && ticks.size() < 50; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::vector<double> LogTicks(double lo, double hi) {
  std::vector<double> ticks;
  if (!(lo > 0) || !(hi >= lo)) return ticks;
  for (int e = static_cast<int>(std::floor(std::log10(lo)));
       e <= static_cast<int>(std::ceil(std::log10(hi))) && ticks.size() < 40; ++e) {
    const double t = std::pow(10.0, e);
    if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) ticks.push_back(t);
  }
  return ticks;
}

std::string FormatTick(double value) {
  if (value == 0) return "0";
  const double a = std::abs(value);
  if (a >= 1e5 || a < 1e-3) return absl::StrFormat("%.0e", value);
  return absl::StrFormat("%.4g", value);
}

std::string RenderSvg(const Plot& plot) {
  const double w = plot.width, h0 = plot.height;
  const size_t legend_rows = (plot.series.size() + plot.markers.size() + plot.spans.size() + 2) / 3;
  const double h = h0 + legend_rows * kLegendRow;
  const double pw = w - kLeft - kRight, ph = h0 - kTop - kBottom;

  std::vector<double> ys;
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  for (const Series& s : plot.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x)) continue;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      ys.push_back(y);
    }
  }
  if (plot.x_min) x_lo = *plot.x_min;
  if (plot.x_max) x_hi = *plot.x_max;
  if (!std::isfinite(x_lo) || !std::isfinite(x_hi)) x_lo = 0, x_hi = 1;
  if (x_hi <= x_lo) x_hi = x_lo + 1;

  const bool log = plot.scale == YScale::kLog ||
                   (plot.scale == YScale::kAuto && ChooseScale(ys) == YScale::kLog);
  double y_lo = std::numeric_limits<double>::infinity(), y_hi = -y_lo;
  for (double y : ys) {
    if (!std::isfinite(y) || (log && y <= 0)) continue;
    y_lo = std::min(y_lo, y);
    y_hi = std::max(y_hi, y);
  }
  const bool no_data = !std::isfinite(y_lo);
  if (no_data) y_lo = log ? 1 : 0, y_hi = log ? 10 : 1;
  std::vector<double> ticks;
  if (log) {
    y_lo = std::pow(10.0, std::floor(std::log10(y_lo)));
    y_hi = std::pow(10.0, std::ceil(std::log10(y_hi)));
    if (y_hi <= y_lo) y_hi = y_lo * 10;
    ticks = LogTicks(y_lo, y_hi);
  } else {
    if (y_hi <= y_lo) {
      const double pad = std::max(std::abs(y_lo) * 0.05, 1e-6);
      y_lo -= pad;
      y_hi += pad;
    } else {
      const double pad = (y_hi - y_lo) * 0.05;
      y_lo -= pad;
      y_hi += pad;
    }
    if (plot.y_min) y_lo = *plot.y_min;
    if (plot.y_max) y_hi = *plot.y_max;
    if (y_hi <= y_lo) y_hi = y_lo + 1;
    ticks = LinearTicks(y_lo, y_hi);
  }
  const auto fy = [&](double y) {
    const double t = log ? (std::log10(y) - std::log10(y_lo)) / (std::log10(y_hi) - std::log10(y_lo))
                         : (y - y_lo) / (y_hi - y_lo);
    return kTop + ph * (1 - t);
  };
  const auto fx = [&](double x) { return kLeft + pw * (x - x_lo) / (x_hi - x_lo); };

  std::string svg = absl::StrFormat(
      "<svg class=\"%s\" data-scale=\"%s\" width=\"%d\" "
      "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
      HtmlEscape(plot.css_class), log ? "log" : "linear", static_cast<int>(w), static_cast<int>(h),
      static_cast<int>(w), static_cast<int>(h));
  absl::StrAppend(&svg, "<title>", HtmlEscape(plot.title), "</title>\n");
  absl::StrAppend(&svg, "<rect x=\"0\" y=\"0\" width=\"", Num(w), "\" height=\"", Num(h),
                  "\" fill=\"#fff\"/>\n");
  absl::StrAppend(&svg, "<text x=\"", Num(kLeft), "\" y=\"16\" font-size=\"13\" font-weight=\"bold\">",
                  HtmlEscape(plot.title), log ? " (log scale)" : "", "</text>\n");
  // Spans under everything.
  for (const Span& s : plot.spans) {
    const double a = std::clamp(fx(std::min(s.from, s.to)), kLeft, kLeft + pw);
    const double b = std::clamp(fx(std::max(s.from, s.to)), kLeft, kLeft + pw);
    absl::StrAppend(&svg, "<rect class=\"sg-span\" x=\"", Num(a), "\" y=\"", Num(kTop),
                    "\" width=\"", Num(std::max(b - a, 2.0)), "\" height=\"", Num(ph), "\" fill=\"",
                    HtmlEscape(s.color), "\" fill-opacity=\"0.25\"><title>", HtmlEscape(s.label),
                    "</title></rect>\n");
  }
  // Grid and ticks.
  for (double t : ticks) {
    const double y = fy(t);
    absl::StrAppend(&svg, "<line x1=\"", Num(kLeft), "\" x2=\"", Num(kLeft + pw), "\" y1=\"", Num(y),
                    "\" y2=\"", Num(y), "\" stroke=\"#e5e5e5\"/>\n");
    absl::StrAppend(&svg, "<text class=\"sg-ytick\" x=\"", Num(kLeft - 5), "\" y=\"", Num(y + 4),
                    "\" text-anchor=\"end\">", HtmlEscape(FormatTick(t)), "</text>\n");
  }
  for (double t : LinearTicks(x_lo, x_hi, 8)) {
    const double x = fx(t);
    absl::StrAppend(&svg, "<line x1=\"", Num(x), "\" x2=\"", Num(x), "\" y1=\"", Num(kTop + ph),
                    "\" y2=\"", Num(kTop + ph + 4), "\" stroke=\"#333\"/>\n");
    absl::StrAppend(&svg, "<text class=\"sg-xtick\" x=\"", Num(x), "\" y=\"", Num(kTop + ph + 16),
                    "\" text-anchor=\"middle\">", HtmlEscape(FormatTick(t)), "</text>\n");
  }
  absl::StrAppend(&svg, "<rect x=\"", Num(kLeft), "\" y=\"", Num(kTop), "\" width=\"", Num(pw),
                  "\" height=\"", Num(ph), "\" fill=\"none\" stroke=\"#333\"/>\n");
  absl::StrAppend(&svg, "<text x=\"", Num(kLeft + pw / 2), "\" y=\"", Num(kTop + ph + 34),
                  "\" text-anchor=\"middle\">", HtmlEscape(plot.x_label), "</text>\n");
  absl::StrAppend(&svg, "<text x=\"14\" y=\"", Num(kTop + ph / 2), "\" text-anchor=\"middle\" "
                  "transform=\"rotate(-90 14 ", Num(kTop + ph / 2), ")\">", HtmlEscape(plot.y_label),
                  "</text>\n");
  if (no_data) {
    absl::StrAppend(&svg, "<text x=\"", Num(kLeft + pw / 2), "\" y=\"", Num(kTop + ph / 2),
                    "\" text-anchor=\"middle\" fill=\"#999\">no data</text>\n");
  }
  // Series, clipped to the plot area.
  static std::atomic<uint64_t> next_clip{0};
  const std::string clip_id = absl::StrCat("sgclip", next_clip.fetch_add(1));
  absl::StrAppend(&svg, "<clipPath id=\"", clip_id, "\"><rect x=\"", Num(kLeft), "\" y=\"", Num(kTop),
                  "\" width=\"", Num(pw), "\" height=\"", Num(ph), "\"/></clipPath>\n");
  for (const Series& s : plot.series) {
    std::string d;
    bool pen_down = false;
    size_t drawn = 0;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (log && y <= 0)) {
        pen_down = false;
        continue;
      }
      const double cy = std::clamp(fy(y), kTop - 2, kTop + ph + 2);
      absl::StrAppend(&d, pen_down ? "L" : "M", Num(fx(x)), " ", Num(cy), " ");
      pen_down = true;
      ++drawn;
    }
    absl::StrAppend(&svg, "<path class=\"sg-series\" data-name=\"", HtmlEscape(s.name),
                    "\" clip-path=\"url(#", clip_id, ")\" d=\"", d, "\" fill=\"none\" stroke=\"",
                    HtmlEscape(s.color), "\" stroke-width=\"", absl::StrFormat("%.1f", s.width),
                    "\"", s.dashed ? " stroke-dasharray=\"5 3\"" : "",
                    drawn == 1 ? " stroke-linecap=\"round\"" : "", "><title>",
                    HtmlEscape(s.name), "</title></path>\n");
  }
  for (const Marker& m : plot.markers) {
    if (m.x < x_lo || m.x > x_hi) continue;
    const double x = fx(m.x);
    absl::StrAppend(&svg, "<line class=\"sg-marker\" data-label=\"", HtmlEscape(m.label), "\" x1=\"",
                    Num(x), "\" x2=\"", Num(x), "\" y1=\"", Num(kTop), "\" y2=\"", Num(kTop + ph),
                    "\" stroke=\"", HtmlEscape(m.color), "\" stroke-width=\"1.5\"",
                    m.dashed ? " stroke-dasharray=\"4 3\"" : "", "><title>", HtmlEscape(m.label),
                    "</title></line>\n");
  }
  // Legend: three entries a row under the plot.
  size_t i = 0;
  const auto entry = [&](const std::string& label, const std::string& color, const char* kind,
                         bool dashed) {
    const double x = kLeft + (i % 3) * (pw / 3);
    const double y = h0 + (i / 3) * kLegendRow + 4;
    std::string glyph;
    if (std::string(kind) == "span") {
      glyph = absl::StrCat("<rect x=\"", Num(x), "\" y=\"", Num(y - 6), "\" width=\"18\" height=\"10\" "
                           "fill=\"", HtmlEscape(color), "\" fill-opacity=\"0.35\"/>");
    } else {
      glyph = absl::StrCat("<line x1=\"", Num(x), "\" x2=\"", Num(x + 18), "\" y1=\"", Num(y - 1),
                           "\" y2=\"", Num(y - 1), "\" stroke=\"", HtmlEscape(color),
                           "\" stroke-width=\"2\"", dashed ? " stroke-dasharray=\"4 2\"" : "", "/>");
    }
    absl::StrAppend(&svg, "<g class=\"sg-legend-entry\" data-kind=\"", kind, "\">", glyph,
                    "<text x=\"", Num(x + 23), "\" y=\"", Num(y + 3), "\">", HtmlEscape(label),
                    "</text></g>\n");
    ++i;
  };
  absl::StrAppend(&svg, "<g class=\"sg-legend\">\n");
  // Solid lines (the original) first, then the dashed ones (probes).
  for (const Series& s : plot.series) {
    if (!s.dashed && s.in_legend) entry(s.name, s.color, "series", false);
  }
  for (const Series& s : plot.series) {
    if (s.dashed && s.in_legend) entry(s.name, s.color, "series", true);
  }
  for (const Marker& m : plot.markers) entry(m.label, m.color, "marker", m.dashed);
  for (const Span& s : plot.spans) entry(s.label, s.color, "span", false);
  absl::StrAppend(&svg, "</g>\n</svg>\n");
  return svg;
}

}  // namespace spikeguard::report
