// A stacked bar chart of byte counts as hand-written SVG (no dependency):
// bars side by side in labelled groups, each bar stacked bottom-up from its
// series' values, an optional marker line across each bar (an expected
// total), a legend, and a y axis in KiB or MiB, whichever suits the largest
// bar.
//
//   BarChart c{"Memory per rank", "ranks, by ZeRO stage", "bytes per rank", "estimate", {...}, {}};
//   c.bars.push_back({"stage 0", "1", {params, grads, ...}, estimated_total, "stage 0, 1 rank"});
//   write_text_file("chart.svg", render_svg(c));
//
// Each stacked segment is one <rect class="segment"> (with a <title> for a
// tooltip); segments of zero bytes are left out.
#pragma once

#include <string>
#include <vector>

namespace memory_compare {

struct ChartSeries {
  std::string name;
  std::string color;  // an SVG colour, e.g. "#4e79a7"
};

struct ChartBar {
  std::string group;           // consecutive bars of one group sit together, labelled once
  std::string label;           // under the bar
  std::vector<double> values;  // bytes, one per series, stacked bottom-up
  double marker = -1.0;        // bytes; < 0: no marker
  std::string name;            // in tooltips; "group label" when empty
};

struct BarChart {
  std::string title;
  std::string x_title;
  std::string y_title;      // the unit is appended: "bytes per rank (MiB)"
  std::string marker_name;  // the marker's legend entry
  std::vector<ChartSeries> series;
  std::vector<ChartBar> bars;
};

std::string render_svg(const BarChart& chart);

}  // namespace memory_compare
