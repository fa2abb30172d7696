// A model directory as Hugging Face writes it (save_pretrained,
// huggingface_hub), read without reading any tensor data:
//
//   dir/config.json                        the model's config (kept as text)
//   dir/model.safetensors                  the weights in one file, or
//   dir/model.safetensors.index.json       {"metadata": {"total_size": N},
//                                           "weight_map": {tensor: file}}
//   dir/model-00001-of-00003.safetensors   ... with the shards it names
//
//   // zest-example
//   zest::HfCheckpoint ckpt = zest::HfCheckpoint::open("Llama-3.2-1B");
//   for (const std::string& name : ckpt.names()) {
//     const zest::SafetensorsTensor& t = ckpt.tensor(name);  // dtype, shape
//   }
//
// open() validates everything a later read relies on and reports every
// problem it finds in ONE zest::Error, each line naming the file and the
// tensor: an index that is not JSON or has no weight_map, a file name that
// leaves the directory, a shard that is missing, truncated or malformed (its
// header is validated in full: safetensors.h), a tensor listed in the index
// but absent from its shard, a tensor in two shards, a tensor in a shard the
// index does not list. When both model.safetensors and an index exist, the
// single file is read, as transformers does. Tensor data is read later, by
// positioned reads of byte ranges (hf_import.h reads only a rank's shard).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zest/checkpoint/safetensors.h"

namespace zest {

inline constexpr const char* kHfConfigFileName = "config.json";
inline constexpr const char* kHfWeightsFileName = "model.safetensors";
inline constexpr const char* kHfIndexFileName = "model.safetensors.index.json";
inline constexpr const char* kHfAdapterWeightsFileName = "adapter_model.safetensors";
inline constexpr const char* kHfAdapterConfigFileName = "adapter_config.json";
// PEFT's prefix of the names in adapter_model.safetensors: the wrapped
// model's (PeftModel.base_model.model).
inline constexpr std::string_view kPeftNamePrefix = "base_model.model.";

class HfCheckpoint {
 public:
  static HfCheckpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // config.json's text (validated as a JSON object); empty when the
  // directory has none.
  const std::string& config_json() const { return config_json_; }
  // The safetensors files, by name in dir: model.safetensors, or the
  // index's shards in name order.
  std::vector<std::string> files() const;
  bool indexed() const { return indexed_; }

  // Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // A missing name is an error naming the checkpoint.
  const SafetensorsTensor& tensor(const std::string& name) const;
  // The open file holding `name` (reads go through it).
  const SafetensorsFile& file_of(const std::string& name) const;

  // Bytes read from the files since open, headers included: the measure of
  // how much of the checkpoint one rank read.
  uint64_t bytes_read() const { return bytes_read_->load(std::memory_order_relaxed); }
  // The tensors' bytes, all files together.
  uint64_t tensor_bytes() const;
  // What identifies these files cheaply, for ranks to agree that they read
  // the same checkpoint (import_hf): each file's name and header (its
  // tensors' names, dtypes, shapes and offsets, its metadata) and 16 bytes
  // at the start and the middle of every tensor. Copies that differ in
  // their shapes or in any sampled bytes (another fine-tune, a copy being
  // replaced) differ here; reads 32 bytes a tensor.
  uint32_t fingerprint() const;

 private:
  HfCheckpoint() = default;
  struct Entry {
    size_t file = 0;
    const SafetensorsTensor* tensor = nullptr;
  };
  void open_file(const std::string& name, std::vector<std::string>& problems);

  std::string dir_;
  std::string config_json_;
  bool indexed_ = false;
  std::vector<std::string> file_names_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;  // null: failed to open
  std::map<std::string, Entry> tensors_;
  std::shared_ptr<std::atomic<uint64_t>> bytes_read_ = std::make_shared<std::atomic<uint64_t>>(0);
};

namespace detail {
// One zest::Error listing every problem (the first 100, and how many more):
// "<intro>: N problem(s):\n  - ...\n<advice>".
[[noreturn]] void fail_with_problems(const std::string& intro, const std::vector<std::string>& problems,
                                     std::string_view advice);
}  // namespace detail

}  // namespace zest
