#include "table.h"

#include <algorithm>

#include <fmt/format.h>

#include "zest/core/check.h"

namespace memory_compare {
namespace {

constexpr size_t kGap = 2;  // spaces between text columns

// Display width: the tables hold ASCII plus the odd "Ψ" or "Δ" (two bytes).
size_t width(const std::string& s) {
  size_t n = 0;
  for (const char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

std::string pad_left(const std::string& s, size_t w) { return std::string(w - std::min(w, width(s)), ' ') + s; }

// "---- label ----" across `w` columns (blank when there is no label).
std::string rule_around(const std::string& label, size_t w) {
  if (label.empty()) return std::string(w, ' ');
  const size_t dashes = w - std::min(w, width(label) + 2);
  return std::string(dashes / 2, '-') + " " + label + " " + std::string(dashes - dashes / 2, '-');
}

}  // namespace

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::add_row(std::vector<std::string> cells) {
  ZEST_CHECK(cells.size() == columns_.size(), "Table::add_row: {} cells for {} columns", cells.size(),
             columns_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::text() const {
  std::vector<size_t> w(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    w[c] = width(columns_[c].name);
    for (const auto& row : rows_) w[c] = std::max(w[c], width(row[c]));
  }
  // Groups: [first, last] column spans; a heading wider than its span
  // widens the span's last column.
  std::string groups;
  for (size_t first = 0; first < columns_.size();) {
    size_t last = first;
    while (last + 1 < columns_.size() && columns_[last + 1].group == columns_[first].group) ++last;
    size_t span = 0;
    for (size_t c = first; c <= last; ++c) span += w[c] + (c == first ? 0 : kGap);
    const std::string& label = columns_[first].group;
    const size_t needed = label.empty() ? 0 : width(label) + 6;  // at least "-- label --"
    if (needed > span) {
      w[last] += needed - span;
      span = needed;
    }
    groups += std::string(first == 0 ? 0 : kGap, ' ') + rule_around(label, span);
    first = last + 1;
  }

  std::string out;
  const auto line = [&](const auto& cell) {
    std::string l;
    for (size_t c = 0; c < columns_.size(); ++c) l += std::string(c == 0 ? 0 : kGap, ' ') + pad_left(cell(c), w[c]);
    out += l + "\n";
  };
  if (groups.find_first_not_of(' ') != std::string::npos) out += groups + "\n";
  line([&](size_t c) { return columns_[c].name; });
  for (const auto& row : rows_) line([&](size_t c) { return row[c]; });
  return out;
}

std::string Table::markdown() const {
  std::string head = "|", rule = "|";
  for (const Column& c : columns_) {
    head += fmt::format(" {} |", c.group.empty() ? c.name : c.group + " " + c.name);
    rule += "---:|";
  }
  std::string out = head + "\n" + rule + "\n";
  for (const auto& row : rows_) {
    out += "|";
    for (const std::string& cell : row) out += fmt::format(" {} |", cell);
    out += "\n";
  }
  return out;
}

}  // namespace memory_compare
