#include "common/corpus.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/core/file_io.h"

namespace examples {
namespace {

constexpr size_t kHoldOutEvery = 20;

// Not a FIFO or a device (which would block).
std::string read_file(const std::filesystem::path& path) { return zest::read_text_file(path.string()); }

// The fortune files of a directory in name order: regular files, not the
// strfile indexes (*.dat) nor the *.u8 links to the same files.
std::vector<std::filesystem::path> fortune_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_symlink() || !entry.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// splitmix64: a row's offset from (seed, step, row), nothing else.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Windows of context + 1 bytes starting at `starts`, as inputs and targets.
Batch windows(const std::string& text, const std::vector<int64_t>& starts, int64_t context) {
  const auto rows = static_cast<int64_t>(starts.size());
  torch::Tensor all = torch::empty({rows, context + 1}, torch::kLong);
  int64_t* out = all.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t <= context; ++t) {
      out[r * (context + 1) + t] = static_cast<unsigned char>(text[static_cast<size_t>(starts[static_cast<size_t>(r)] + t)]);
    }
  }
  Batch b;
  b.inputs = all.slice(1, 0, context).contiguous();
  b.targets = all.slice(1, 1, context + 1).contiguous();
  return b;
}

}  // namespace

Corpus Corpus::from_text(const std::string& text) {
  Corpus c;
  std::istringstream in(text);
  std::string line, cookie;
  const auto finish = [&] {
    if (cookie.empty()) return;
    (c.cookies_ % kHoldOutEvery == 0 ? c.validation_ : c.train_) += cookie + "%\n";
    ++c.cookies_;
    cookie.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%") {
      finish();
    } else {
      cookie += line + "\n";
    }
  }
  finish();
  return c;
}

Corpus Corpus::load(const std::string& path) {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) {
    throw std::runtime_error(fmt::format(
        "no corpus at {}: install Debian's fortune cookies (scripts/setup.sh does: apt-get install "
        "fortunes) or pass --data with a fortune file or a directory of them",
        path));
  }
  std::string text;
  if (std::filesystem::is_directory(p)) {
    for (const auto& f : fortune_files(p)) {
      std::string t = read_file(f);
      if (!t.empty() && t.back() != '\n') t += '\n';
      text += t + "%\n";  // a file's last cookie ends with the file
    }
  } else {
    text = read_file(p);
  }
  Corpus c = from_text(text);
  if (c.cookies_ < kHoldOutEvery) {
    throw std::runtime_error(fmt::format(
        "{} holds {} fortune cookies ('%'-separated texts); at least {} are needed for a validation split",
        path, c.cookies_, kHoldOutEvery));
  }
  return c;
}

Batch Corpus::train_batch(int64_t step, int64_t first_row, int64_t rows, int64_t context, uint64_t seed) const {
  const auto size = static_cast<int64_t>(train_.size());
  if (size <= context) {
    throw std::runtime_error(fmt::format("the training split has {} bytes, not more than the context {}",
                                         size, context));
  }
  std::vector<int64_t> starts(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t h = mix(mix(mix(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(first_row + r));
    starts[static_cast<size_t>(r)] = static_cast<int64_t>(h % static_cast<uint64_t>(size - context));
  }
  return windows(train_, starts, context);
}

int64_t Corpus::validation_window_count(int64_t context, int64_t max_windows) const {
  const auto size = static_cast<int64_t>(validation_.size());
  return std::min(max_windows, size > context ? (size - 1) / context : 0);
}

Batch Corpus::validation_windows(int64_t first, int64_t count, int64_t context) const {
  std::vector<int64_t> starts(static_cast<size_t>(count));
  for (int64_t w = 0; w < count; ++w) starts[static_cast<size_t>(w)] = (first + w) * context;
  if (count > 0 && starts.back() + context >= static_cast<int64_t>(validation_.size())) {
    throw std::out_of_range(fmt::format("validation window {} is past the split's {} bytes", first + count - 1,
                                        validation_.size()));
  }
  return windows(validation_, starts, context);
}

torch::Tensor encode(const std::string& text) {
  torch::Tensor t = torch::empty({1, static_cast<int64_t>(text.size())}, torch::kLong);
  int64_t* out = t.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return t;
}

std::string decode(const torch::Tensor& tokens) {
  const torch::Tensor flat = tokens.to(torch::kLong).contiguous().view({-1});
  std::string out;
  out.reserve(static_cast<size_t>(flat.numel()));
  const int64_t* v = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) out += static_cast<char>(static_cast<unsigned char>(v[i]));
  return out;
}

}  // namespace examples
