#include "report.h"

#include <functional>

#include <fmt/format.h>

#include "table.h"
#include "zest/core/dtype.h"

namespace memory_compare {
namespace {

using zest::MemoryCategory;

// Words filled into lines of at most `columns` characters.
std::string wrap(const std::string& text, size_t columns = 100) {
  std::string out, line, word;
  const auto flush_word = [&] {
    if (word.empty()) return;
    if (!line.empty() && line.size() + 1 + word.size() > columns) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    word.clear();
  };
  for (const char ch : text) {
    if (ch == ' ') flush_word();
    else word += ch;
  }
  flush_word();
  return out + line + "\n";
}

std::string kib(int64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / 1024.0); }
std::string kib(double bytes) { return fmt::format("{:.1f}", bytes / 1024.0); }

// One compared quantity: its heading and its bytes, measured and estimated.
struct Compared {
  std::string heading;
  std::function<int64_t(const Comparison&)> measured;
  std::function<int64_t(const Comparison&)> estimated;
};

// stage and ranks, then measured, estimated and their difference for each
// compared quantity, then the extra columns.
Table comparison_table(const std::vector<Comparison>& runs, const std::vector<Compared>& compared,
                       const std::vector<Table::Column>& extra_columns,
                       const std::function<std::vector<std::string>(const Comparison&)>& extra_cells) {
  std::vector<Table::Column> cols = {{"", "stage"}, {"", "ranks"}};
  for (const Compared& q : compared) {
    cols.insert(cols.end(), {{q.heading, "measured"}, {q.heading, "estimated"}, {q.heading, "diff B"}});
  }
  cols.insert(cols.end(), extra_columns.begin(), extra_columns.end());
  Table t(std::move(cols));
  for (const Comparison& r : runs) {
    std::vector<std::string> row = {std::to_string(r.stage), std::to_string(r.world)};
    for (const Compared& q : compared) {
      const int64_t measured = q.measured(r), estimated = q.estimated(r);
      row.insert(row.end(), {kib(measured), kib(estimated),
                             measured == estimated ? "0" : fmt::format("{:+}", measured - estimated)});
    }
    const std::vector<std::string> extra = extra_cells(r);
    row.insert(row.end(), extra.begin(), extra.end());
    t.add_row(std::move(row));
  }
  return t;
}

// End-of-run bytes by model-state category and in all, and the paper's figure.
Table model_state_table(const std::vector<Comparison>& runs) {
  std::vector<Compared> compared;
  for (MemoryCategory c : kModelStates) {
    compared.push_back({std::string(zest::category_name(c)),
                        [c](const Comparison& r) { return r.measured.current(c); },
                        [c](const Comparison& r) { return r.estimate[c].persistent; }});
  }
  compared.push_back({"model states", [](const Comparison& r) { return r.measured.model_states(); },
                      [](const Comparison& r) { return r.estimate.model_state_bytes; }});
  return comparison_table(runs, compared, {{"ZeRO paper", "formula"}, {"ZeRO paper", "padding"}},
                          [](const Comparison& r) {
                            const double paper = r.estimate.paper_bytes;
                            const double measured = static_cast<double>(r.measured.model_states());
                            return std::vector<std::string>{
                                kib(paper), fmt::format("{:+.2f}%", 100.0 * (measured - paper) / paper)};
                          });
}

// Whole-run peaks of the categories with transients (master weights and
// optimizer state are allocated once: their peak is their current size),
// and all categories at once by phase.
Table peak_table(const std::vector<Comparison>& runs) {
  std::vector<Compared> compared;
  for (MemoryCategory c : {MemoryCategory::kParameters, MemoryCategory::kGradients, MemoryCategory::kCommBuffers}) {
    compared.push_back({fmt::format("{} peak", zest::category_name(c)),
                        [c](const Comparison& r) { return r.measured.run_peak(c); },
                        [c](const Comparison& r) { return r.estimate[c].peak; }});
  }
  const std::string all = "all categories at once";
  return comparison_table(runs, compared, {{all, "set-up"}, {all, "training"}, {all, "estimated bound"}},
                          [](const Comparison& r) {
                            return std::vector<std::string>{kib(r.measured.setup_peak_total),
                                                            kib(r.measured.training_peak_total),
                                                            kib(r.estimate.peak_bytes)};
                          });
}

}  // namespace

std::vector<std::string> problems(const std::vector<Comparison>& runs) {
  std::vector<std::string> out;
  for (const Comparison& r : runs) {
    for (std::string& m : r.mismatches()) out.push_back(std::move(m));
    out.insert(out.end(), r.rank_differences.begin(), r.rank_differences.end());
  }
  return out;
}

std::string format_report(const std::vector<Comparison>& runs, const Options& opt, Format format) {
  const bool md = format == Format::kMarkdown;
  const auto heading = [&](const std::string& s) { return md ? "## " + s + "\n\n" : "== " + s + " ==\n"; };
  const auto table = [&](const Table& t) { return (md ? t.markdown() : t.text()) + "\n"; };
  const auto para = [&](const std::string& s) { return md ? s + "\n\n" : wrap(s); };

  std::string out = md ? "# Measured memory against the estimate\n\n" : "";
  const zest::MemoryEstimate& e0 = runs.front().estimate;
  out += para(fmt::format(
      "The example MLP ({} layers, hidden {}, Ψ = {} parameters in {} units), {} steps of AdamW in {} on "
      "in-process ranks, each with its own host caching allocator. Bytes per rank in KiB (requested sizes, "
      "as the allocator's categories count them), rank 0's; the last line says whether every rank measured "
      "the same. Estimated: zest::estimate_memory with EstimateOptions::from_config(config, ranks) and the "
      "units of the engine's layout.",
      opt.shape.layers, opt.shape.hidden, e0.numel, runs.front().model.num_units(), opt.steps, opt.dtype));
  if (!md) out += "\n";

  out += heading("Model states at the end of the run");
  out += para(fmt::format(
      "Bytes held after the last step. diff B: measured minus estimated, in bytes. ZeRO paper: "
      "paper_model_bytes at Ψ with b = {} bytes, K = {}, by stage 0:(2b+K)Ψ 1:2bΨ+KΨ/N 2:bΨ+(b+K)Ψ/N "
      "3:(2b+K)Ψ/N; padding: how far the measured model states exceed it (the layout's alignment and shard "
      "padding).",
      zest::elem_size(e0.options.compute_dtype), e0.paper_k));
  out += table(model_state_table(runs));

  out += heading("Peaks");
  out += para(
      "Per category: the highest bytes over the whole run, construction and finalize() included (the "
      "comm_buffers peak is finalize()'s fp32 staging of one unit or step()'s gradient-norm sums, whichever is "
      "larger), against the estimate's per-category peak. All categories at once: the allocator's requested bytes at "
      "their highest during set-up (construction and finalize()) and during training (the steps, after "
      "reset_peak_stats() at the end of finalize()); the estimate's peak_bytes bounds both.");
  out += table(peak_table(runs));

  const std::vector<std::string> bad = problems(runs);
  if (bad.empty()) {
    out += para(fmt::format("Measured equals estimated for every model-state category of all {} runs, and "
                            "every rank measured rank 0's bytes.",
                            runs.size()));
  } else {
    out += fmt::format("{} problem(s):\n", bad.size());
    for (const std::string& b : bad) out += (md ? "- " : "  ") + b + "\n";
  }
  return out;
}

}  // namespace memory_compare
