#include "zest/hf/hf_checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/config/detail/json_parse.h"
#include "zest/core/check.h"
#include "zest/core/crc32.h"
#include "zest/core/file_io.h"

namespace zest {
namespace fs = std::filesystem;
namespace {

using nlohmann::json;

// A file source that counts the bytes read (or viewed) through it.
class CountingSource final : public SafetensorsSource {
 public:
  CountingSource(std::unique_ptr<SafetensorsSource> inner, std::shared_ptr<std::atomic<uint64_t>> count)
      : inner_(std::move(inner)), count_(std::move(count)) {}
  uint64_t size() const override { return inner_->size(); }
  void read_at(uint64_t offset, std::span<std::byte> out) const override {
    inner_->read_at(offset, out);
    count_->fetch_add(out.size(), std::memory_order_relaxed);
  }
  // A view is counted whole: its reader reads every byte of it.
  std::optional<FileView> view(uint64_t offset, uint64_t n) const override {
    std::optional<FileView> v = inner_->view(offset, n);
    if (v) count_->fetch_add(n, std::memory_order_relaxed);
    return v;
  }
  void will_need(uint64_t offset, uint64_t n) const override { inner_->will_need(offset, n); }

 private:
  std::unique_ptr<SafetensorsSource> inner_;
  std::shared_ptr<std::atomic<uint64_t>> count_;
};

constexpr size_t kMaxProblemsListed = 100;

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// config.json as text, checked to be a JSON object; "" when there is none.
std::string read_config(const fs::path& dir, std::vector<std::string>& problems) {
  const fs::path path = dir / kHfConfigFileName;
  if (!path_exists(path)) return {};
  try {
    std::string text = read_text_file(path.string());
    const json doc = detail::parse_json(text, fmt::format("'{}'", path.string()), {.max_depth = 32});
    ZEST_CHECK(doc.is_object(), "'{}' is a JSON {}; a model config is an object", path.string(), doc.type_name());
    return text;
  } catch (const Error& e) {
    problems.push_back(e.message());
    return {};
  }
}

// The index's weight_map: tensor -> file name (a plain name in dir).
std::map<std::string, std::string> read_weight_map(const fs::path& path, std::vector<std::string>& problems) {
  std::map<std::string, std::string> out;
  try {
    const std::string text = read_text_file(path.string());
    const json doc = detail::parse_json(text, fmt::format("index '{}'", path.string()), {.max_depth = 4});
    ZEST_CHECK(doc.is_object() && doc.contains("weight_map") && doc.at("weight_map").is_object(),
               "index '{}' has no \"weight_map\" object; expected {{\"metadata\": {{...}}, \"weight_map\": {{tensor "
               "name: file name}}}}",
               path.string());
    for (const auto& [tensor, file] : doc.at("weight_map").items()) {
      if (!file.is_string()) {
        problems.push_back(fmt::format("index '{}': tensor '{}' maps to {}; expected a file name", path.string(),
                                       tensor, detail::json_brief(file, 64)));
      } else if (!is_plain_name(file.get<std::string>())) {
        problems.push_back(fmt::format("index '{}': tensor '{}' maps to '{}', which is not a file name in the "
                                       "checkpoint's directory (no '/', no leading '.')",
                                       path.string(), tensor, escape_for_message(file.get<std::string>())));
      } else {
        out.emplace(tensor, file.get<std::string>());
      }
    }
  } catch (const Error& e) {
    problems.push_back(e.message());
  }
  return out;
}

}  // namespace

namespace detail {
void fail_with_problems(const std::string& intro, const std::vector<std::string>& problems, std::string_view advice) {
  std::string text = fmt::format("{}: {} problem{}:", intro, problems.size(), problems.size() == 1 ? "" : "s");
  for (size_t i = 0; i < problems.size() && i < kMaxProblemsListed; ++i) text += "\n  - " + problems[i];
  if (problems.size() > kMaxProblemsListed) {
    text += fmt::format("\n  ... and {} more", problems.size() - kMaxProblemsListed);
  }
  if (!advice.empty()) text += fmt::format("\n{}", advice);
  ZEST_FAIL("{}", text);
}
}  // namespace detail

void HfCheckpoint::open_file(const std::string& name, std::vector<std::string>& problems) {
  file_names_.push_back(name);
  const std::string path = (fs::path(dir_) / name).string();
  try {
    files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::from_source(
        std::make_unique<CountingSource>(make_safetensors_file_source(path), bytes_read_), path)));
  } catch (const Error& e) {
    files_.push_back(nullptr);
    problems.push_back(e.message());
  }
}

HfCheckpoint HfCheckpoint::open(const std::string& dir) {
  HfCheckpoint c;
  c.dir_ = dir;
  std::error_code ec;
  ZEST_CHECK(fs::is_directory(dir, ec), "Hugging Face checkpoint '{}' is not a directory; give the directory that "
             "holds config.json and the safetensors files", dir);
  std::vector<std::string> problems;
  c.config_json_ = read_config(dir, problems);
  const fs::path single = fs::path(dir) / kHfWeightsFileName;
  const fs::path index = fs::path(dir) / kHfIndexFileName;
  if (path_exists(single) || !path_exists(index)) {
    ZEST_CHECK(path_exists(single), "Hugging Face checkpoint '{}' has neither {} nor {}; only safetensors weights can be "
               "read (convert a pytorch_model.bin with transformers' save_pretrained(safe_serialization=True))",
               dir, kHfWeightsFileName, kHfIndexFileName);
    c.open_file(kHfWeightsFileName, problems);
    if (c.files_[0]) {
      for (const SafetensorsTensor& t : c.files_[0]->tensors()) c.tensors_.emplace(t.name, Entry{0, &t});
    }
  } else {
    c.indexed_ = true;
    const std::map<std::string, std::string> weight_map = read_weight_map(index, problems);
    std::map<std::string, size_t> file_index;
    for (const auto& [tensor, file] : weight_map) {
      if (file_index.emplace(file, c.file_names_.size()).second) c.open_file(file, problems);
    }
    if (weight_map.empty() && problems.empty()) {
      problems.push_back(fmt::format("index '{}' lists no tensors", index.string()));
    }
    // Every listed tensor in its file, and every file's tensors listed there.
    for (const auto& [tensor, file] : weight_map) {
      const size_t f = file_index.at(file);
      if (!c.files_[f]) continue;  // its problem is listed already
      if (const SafetensorsTensor* t = c.files_[f]->find(tensor)) {
        c.tensors_.emplace(tensor, Entry{f, t});
      } else {
        problems.push_back(fmt::format("tensor '{}' is listed in the index under '{}', which has no such tensor",
                                       tensor, file));
      }
    }
    for (size_t f = 0; f < c.files_.size(); ++f) {
      if (!c.files_[f]) continue;
      for (const SafetensorsTensor& t : c.files_[f]->tensors()) {
        const auto listed = weight_map.find(t.name);
        if (listed == weight_map.end()) {
          problems.push_back(fmt::format("tensor '{}' is in '{}' but not in the index", t.name, c.file_names_[f]));
        } else if (listed->second != c.file_names_[f]) {
          problems.push_back(fmt::format("tensor '{}' is in '{}' but the index lists it under '{}' (a tensor in two "
                                         "shards, or a stale index)",
                                         t.name, c.file_names_[f], listed->second));
        }
      }
    }
  }
  if (!problems.empty()) {
    detail::fail_with_problems(fmt::format("Hugging Face checkpoint '{}'", dir), problems,
                               "The directory is not a complete checkpoint: download or export it again.");
  }
  return c;
}

std::vector<std::string> HfCheckpoint::files() const {
  std::vector<std::string> out = file_names_;
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;
}

const SafetensorsTensor& HfCheckpoint::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  ZEST_CHECK(it != tensors_.end(), "Hugging Face checkpoint '{}' has no tensor '{}'", dir_, name);
  return *it->second.tensor;
}

const SafetensorsFile& HfCheckpoint::file_of(const std::string& name) const {
  tensor(name);  // the error for a missing name
  return *files_[tensors_.at(name).file];
}

uint32_t HfCheckpoint::fingerprint() const {
  uint32_t crc = 0;
  const auto add = [&](const void* p, size_t n) { crc = crc32(p, n, crc); };
  const auto add_text = [&](const std::string& s) {
    const uint64_t n = s.size();
    add(&n, sizeof n);
    add(s.data(), s.size());
  };
  for (size_t f = 0; f < files_.size(); ++f) {
    add_text(file_names_[f]);
    if (!files_[f]) continue;
    const SafetensorsFile& file = *files_[f];
    const uint64_t header = file.header_bytes();
    add(&header, sizeof header);
    for (const auto& [key, value] : file.metadata()) {
      add_text(key);
      add_text(value);
    }
    std::array<std::byte, 16> sample{};
    for (const SafetensorsTensor& t : file.tensors()) {
      add_text(t.name);
      add_text(t.dtype);
      add(t.shape.data(), t.shape.size() * sizeof(int64_t));
      add(&t.begin, sizeof t.begin);
      add(&t.end, sizeof t.end);
      const uint64_t n = std::min<uint64_t>(sample.size(), t.size_bytes());
      for (const uint64_t at : {uint64_t{0}, (t.size_bytes() - n) / 2}) {
        if (n == 0) break;
        file.read_range(t.name, at, std::span(sample).first(n));
        add(sample.data(), n);
      }
    }
  }
  return crc;
}

uint64_t HfCheckpoint::tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, entry] : tensors_) total += entry.tensor->size_bytes();
  return total;
}

}  // namespace zest
