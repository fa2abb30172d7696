// memory_compare: runs the example MLP under ZeRO stages 0-3 on several
// world sizes (in-process ranks on the host) and compares each rank's
// measured memory by category with the memory estimator, the figures of
// estimate/memory_estimate.h, which must agree byte for byte on the model
// states. Prints the tables, and writes them as Markdown and as an SVG
// chart (a bar per stage and world size, stacked by category, with the
// estimate marked).
//
//   memory_compare                                   stages 0-3 x 1, 2, 4, 8 ranks, bf16
//   memory_compare --worlds 1,3 --steps 2 --markdown out/m.md --svg out/m.svg
//
// Exit status: 0 when measured equals estimated for every model-state
// category and every rank measured the same; 1 otherwise or on an error;
// 2 on a bad argument.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "options.h"
#include "report.h"
#include "runs.h"
#include "svg_chart.h"
#include "zest/core/check.h"

namespace memory_compare {
namespace {

// The bars: measured bytes at the end of the run, one bar per (stage,
// world), the estimated model states marked on each.
BarChart memory_chart(const std::vector<Comparison>& runs, const Options& opt) {
  std::vector<zest::MemoryCategory> categories(kModelStates.begin(), kModelStates.end());
  for (const Comparison& r : runs) {
    if (r.measured.current(zest::MemoryCategory::kCommBuffers) != 0) {
      categories.push_back(zest::MemoryCategory::kCommBuffers);
      break;
    }
  }
  static constexpr const char* kColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2"};
  BarChart chart;
  chart.title = fmt::format("Memory per rank after {} steps: MLP of {} parameters, {} AdamW", opt.steps,
                            runs.front().estimate.numel, opt.dtype);
  chart.x_title = "in-process ranks, grouped by ZeRO stage";
  chart.y_title = "bytes per rank, measured";
  chart.marker_name = "estimated total";
  for (size_t k = 0; k < categories.size(); ++k) {
    chart.series.push_back({std::string(zest::category_name(categories[k])), kColors[k]});
  }
  for (const Comparison& r : runs) {
    ChartBar bar{fmt::format("stage {}", r.stage), std::to_string(r.world), {}, 0.0,
                 fmt::format("stage {}, {} rank{}", r.stage, r.world, r.world == 1 ? "" : "s")};
    int64_t estimated = 0;
    for (zest::MemoryCategory c : categories) {
      bar.values.push_back(static_cast<double>(r.measured.current(c)));
      estimated += r.estimate[c].persistent;
    }
    bar.marker = static_cast<double>(estimated);
    chart.bars.push_back(std::move(bar));
  }
  return chart;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  ZEST_CHECK(out.good(), "memory_compare: cannot write {}: check that its directory exists and is writable",
             path);
}

// The chart's path as the Markdown file links it: relative to the
// Markdown's directory when they share one.
std::string chart_link(const Options& opt) {
  namespace fs = std::filesystem;
  const fs::path md = fs::absolute(opt.markdown_path), svg = fs::absolute(opt.svg_path);
  return md.parent_path() == svg.parent_path() ? svg.filename().string() : svg.string();
}

int run(const Options& opt) {
  std::vector<Comparison> runs;
  for (int stage : opt.stages) {
    for (int world : opt.worlds) runs.push_back(run_comparison(opt, stage, world));
  }
  std::fputs(format_report(runs, opt, Format::kText).c_str(), stdout);

  write_file(opt.markdown_path, format_report(runs, opt, Format::kMarkdown) +
                                    fmt::format("![memory per rank by category]({})\n", chart_link(opt)));
  write_file(opt.svg_path, render_svg(memory_chart(runs, opt)));
  fmt::print("\nwrote {} and {}\n", opt.markdown_path, opt.svg_path);
  return problems(runs).empty() ? 0 : 1;
}

}  // namespace
}  // namespace memory_compare

int main(int argc, char** argv) {
  try {
    return memory_compare::run(memory_compare::parse_options(argc, argv));
  } catch (const memory_compare::UsageError& e) {
    return cli::usage_exit("memory_compare", e, memory_compare::usage());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory_compare: %s\n", e.what());
    return 1;
  }
}
