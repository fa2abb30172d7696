#include "zest/data/jsonl_lines.h"

#include <algorithm>
#include <limits>
#include <span>
#include <vector>

#include "zest/core/check.h"

namespace zest {

void for_each_jsonl_line(const ReadOnlyFile& file, const std::string& path,
                         const std::function<void(const JsonlLine&)>& fn) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<std::byte> chunk;
  std::string line;
  uint64_t line_start = 0;
  int64_t line_number = 1;
  const auto finish_line = [&](uint64_t end) {
    const bool blank = std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
    if (!blank) {
      ZEST_CHECK(end - line_start <= std::numeric_limits<uint32_t>::max(), "{}:{}: a line of {} bytes", path,
                 line_number, end - line_start);
      fn({line, line_start, line_number});
    }
    line.clear();
  };
  for (uint64_t at = 0; at < file.size(); at += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, file.size() - at));
    chunk.resize(n);
    file.read_at(at, chunk);
    for (size_t i = 0; i < n; ++i) {
      const char c = static_cast<char>(chunk[i]);
      if (c != '\n') {
        line.push_back(c);
        continue;
      }
      finish_line(at + i);
      ++line_number;
      line_start = at + i + 1;
    }
  }
  finish_line(file.size());
}

void JsonlIndex::add(const JsonlLine& line, int64_t tokens) {
  offsets_.push_back(line.offset);
  bytes_.push_back(static_cast<uint32_t>(line.text.size()));
  lengths_.push_back(tokens);
  lines_.push_back(line.number);
}

void JsonlIndex::check(int64_t d) const {
  ZEST_CHECK(d >= 0 && d < size(), "{}: record {} of {}", path_, d, size());
}

int64_t JsonlIndex::length(int64_t d) const {
  check(d);
  return lengths_[static_cast<size_t>(d)];
}

int64_t JsonlIndex::line_of(int64_t d) const {
  check(d);
  return lines_[static_cast<size_t>(d)];
}

std::string JsonlIndex::where(int64_t d) const { return fmt::format("{}:{}", path_, line_of(d)); }

std::string JsonlIndex::read(const ReadOnlyFile& file, int64_t d) const {
  check(d);
  std::string line(bytes_[static_cast<size_t>(d)], '\0');
  file.read_at(offsets_[static_cast<size_t>(d)], std::as_writable_bytes(std::span(line.data(), line.size())));
  return line;
}

}  // namespace zest
