// A table of strings printed two ways: aligned plain text for the terminal
// (with a line of column groups above the column names) and Markdown, so
// the console and the .md file show the same rows.
#pragma once

#include <string>
#include <vector>

namespace memory_compare {

class Table {
 public:
  struct Column {
    std::string group;  // "" for none; consecutive columns of one group share a heading
    std::string name;
  };

  explicit Table(std::vector<Column> columns);
  // One cell per column.
  void add_row(std::vector<std::string> cells);

  // Right-aligned columns, two spaces apart.
  std::string text() const;
  // "| group name | ... |" with right-aligned columns.
  std::string markdown() const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace memory_compare
