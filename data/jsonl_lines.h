// The records of a JSON Lines file, found in one pass: each non-blank
// line's byte range and line number, so that a dataset can check every
// record when it opens the file and read one again when asked for it.
// Lines end at '\n'; a line of spaces, tabs and '\r' is blank and skipped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/file_io.h"

namespace zest {

struct JsonlLine {
  std::string_view text;  // without its '\n'
  uint64_t offset = 0;    // of its first byte in the file
  int64_t number = 0;     // 1-based
};

// Calls `fn` for each non-blank line of `file`, in order, reading it in
// pieces of 1 MiB. Throws naming `path` for a line over 4 GiB.
void for_each_jsonl_line(const ReadOnlyFile& file, const std::string& path,
                         const std::function<void(const JsonlLine&)>& fn);

// Where each record of a JSONL dataset is, and its length in tokens: what
// a dataset keeps of its opening pass to read a record again.
class JsonlIndex {
 public:
  explicit JsonlIndex(std::string path) : path_(std::move(path)) {}
  void add(const JsonlLine& line, int64_t tokens);
  int64_t size() const { return static_cast<int64_t>(offsets_.size()); }
  // Each checks d, naming the file.
  int64_t length(int64_t d) const;
  int64_t line_of(int64_t d) const;
  // "PATH:LINE" of record d, for messages.
  std::string where(int64_t d) const;
  // Record d's line, read again.
  std::string read(const ReadOnlyFile& file, int64_t d) const;

 private:
  void check(int64_t d) const;

  std::string path_;
  std::vector<uint64_t> offsets_;
  std::vector<uint32_t> bytes_;
  std::vector<int64_t> lengths_;
  std::vector<int64_t> lines_;
};

}  // namespace zest
