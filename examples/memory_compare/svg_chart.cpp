#include "svg_chart.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "zest/core/check.h"

namespace memory_compare {
namespace {

// Geometry, in SVG user units (pixels).
constexpr double kBarWidth = 26, kBarGap = 8, kGroupGap = 36;
constexpr double kLeft = 80, kRight = 190, kTop = 50, kBottom = 78, kPlotHeight = 320;

std::string escape(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

struct Unit {
  double bytes;
  const char* name;
};

Unit unit_for(double largest) { return largest >= 1024.0 * 1024.0 ? Unit{1024.0 * 1024.0, "MiB"} : Unit{1024.0, "KiB"}; }

// A tick step of 1, 2, 2.5 or 5 times a power of ten giving about five ticks.
double tick_step(double top) {
  const double raw = top / 5.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 2.5, 5.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10.0 * magnitude;
}

double stack_total(const ChartBar& b) {
  double sum = 0.0;
  for (const double v : b.values) sum += v;
  return sum;
}

}  // namespace

std::string render_svg(const BarChart& chart) {
  ZEST_CHECK(!chart.bars.empty(), "render_svg: the chart '{}' has no bars", chart.title);
  double largest = 0.0;
  for (const ChartBar& b : chart.bars) {
    ZEST_CHECK(b.values.size() == chart.series.size(), "render_svg: bar '{} {}' has {} values for {} series",
               b.group, b.label, b.values.size(), chart.series.size());
    largest = std::max({largest, stack_total(b), b.marker});
  }
  const Unit unit = unit_for(largest);
  const double top_units = std::max(largest / unit.bytes, 1e-9);
  const double step = tick_step(top_units);
  const double axis_top = std::ceil(top_units / step - 1e-9) * step;
  const auto y_of = [&](double bytes) { return kTop + kPlotHeight * (1.0 - bytes / unit.bytes / axis_top); };

  // x of each bar: groups of consecutive bars with the same group name.
  std::vector<double> x(chart.bars.size());
  double cursor = kLeft + kBarGap * 2;
  for (size_t i = 0; i < chart.bars.size(); ++i) {
    if (i > 0) cursor += chart.bars[i].group == chart.bars[i - 1].group ? kBarGap : kGroupGap;
    x[i] = cursor;
    cursor += kBarWidth;
  }
  const double plot_right = cursor + kBarGap * 2;
  const double width = plot_right + kRight, height = kTop + kPlotHeight + kBottom;
  const double base = kTop + kPlotHeight;

  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} "
      "{1:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect class=\"background\" x=\"0\" y=\"0\" width=\"{0:.0f}\" height=\"{1:.0f}\" fill=\"#ffffff\"/>\n"
      "<text x=\"{2:.1f}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{3}</text>\n",
      width, height, (kLeft + plot_right) / 2, escape(chart.title));

  // The y axis: grid lines and tick labels, then its title.
  for (double v = 0.0; v <= axis_top + step * 1e-6; v += step) {
    const double y = y_of(v * unit.bytes);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#dddddd\"/>\n", kLeft, y,
                     plot_right, y);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n", kLeft - 6, y + 4, v);
  }
  s += fmt::format(
      "<text transform=\"translate({:.1f} {:.1f}) rotate(-90)\" text-anchor=\"middle\">{} ({})</text>\n", kLeft - 52,
      kTop + kPlotHeight / 2, escape(chart.y_title), unit.name);

  // Bars: segments bottom-up, then the marker line across the bar.
  for (size_t i = 0; i < chart.bars.size(); ++i) {
    const ChartBar& b = chart.bars[i];
    const std::string name = escape(b.name.empty() ? b.group + " " + b.label : b.name);
    double below = 0.0;
    for (size_t k = 0; k < b.values.size(); ++k) {
      if (b.values[k] <= 0.0) continue;
      const double y_top = y_of(below + b.values[k]);
      s += fmt::format(
          "<rect class=\"segment\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.2f}\" fill=\"{}\">"
          "<title>{}: {} {:.1f} KiB</title></rect>\n",
          x[i], y_top, kBarWidth, y_of(below) - y_top, chart.series[k].color, name, escape(chart.series[k].name),
          b.values[k] / 1024.0);
      below += b.values[k];
    }
    if (b.marker >= 0.0) {
      const double y = y_of(b.marker);
      s += fmt::format(
          "<line class=\"marker\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\" "
          "stroke-width=\"2\"><title>{}: {} {:.1f} KiB</title></line>\n",
          x[i] - 4, y, x[i] + kBarWidth + 4, y, name, escape(chart.marker_name), b.marker / 1024.0);
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x[i] + kBarWidth / 2,
                     base + 16, escape(b.label));
  }
  // Group labels, centred under their bars.
  for (size_t first = 0; first < chart.bars.size();) {
    size_t last = first;
    while (last + 1 < chart.bars.size() && chart.bars[last + 1].group == chart.bars[first].group) ++last;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>\n",
                     (x[first] + x[last] + kBarWidth) / 2, base + 34, escape(chart.bars[first].group));
    first = last + 1;
  }
  s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#000000\"/>\n", kLeft,
                   base, plot_right);
  s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#000000\"/>\n", kLeft,
                   kTop, base);
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", (kLeft + plot_right) / 2,
                   base + 60, escape(chart.x_title));

  // The legend: the top of the stack first, as the bars read, then the marker.
  double y = kTop + 6;
  const double lx = plot_right + 20;
  for (size_t k = chart.series.size(); k-- > 0;) {
    s += fmt::format(
        "<rect class=\"swatch\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"14\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        lx, y, chart.series[k].color, lx + 20, y + 11, escape(chart.series[k].name));
    y += 22;
  }
  if (!chart.marker_name.empty()) {
    s += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\" stroke-width=\"2\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        lx, y + 7, lx + 14, y + 7, lx + 20, y + 11, escape(chart.marker_name));
  }
  s += "</svg>\n";
  return s;
}

}  // namespace memory_compare
