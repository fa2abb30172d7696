// Hugging Face checkpoint directories out: shards, index and config as
// save_pretrained writes them, back in bit for bit, published atomically,
// and LoRA adapters merged or written apart.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "hf/hf_test_util.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/core/file_io.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/hf/hf_export.h"
#include "zest/hf/hf_import.h"

namespace test_hf_export {

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kShard = 8000;

// On `world` ranks at `stage`: imports `from` (when given), trains `steps`,
// exports to `to`. Returns rank 0's master values after the export.
Params import_train_export(int world, int stage, const std::string& from, int steps, const std::string& to,
                           const HfExportOptions& options, const TinyLlama& m = {},
                           const HfImportOptions& import_options = {}) {
  Params out;
  run_inprocess(world, [&](Communicator& comm) {
    RankEngine engine(comm, stage, [&](Engine& e) { register_llama(e, m); });
    if (!from.empty()) import_hf(*engine, from, import_options);
    RankResult r;
    run_steps(*engine, comm, runs(world, steps), 0, steps, r);
    export_hf(*engine, to, options);
    Params p = master_params(*engine);
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

Params import_params(int world, int stage, const std::string& dir, const TinyLlama& m = {}) {
  Params out;
  run_inprocess(world, [&](Communicator& comm) {
    RankEngine engine(comm, stage, [&](Engine& e) { register_llama(e, m); });
    import_hf(*engine, dir);
    Params p = master_params(*engine);
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

int compare_dirs(const std::string& a, const std::string& b) {
  return std::system(hf_tool(fmt::format("compare {} {}", a, b)).c_str());
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text_file(path)); }

}  // namespace

TEST_CASE("a checkpoint loaded and exported without training is the same checkpoint, byte for byte") {
  TempDir tmp;
  write_llama_checkpoint(tmp / "in", "bf16", kShard);
  HfExportOptions options;
  options.config_from = tmp / "in";
  options.max_shard_size = kShard;
  for (const int world : {1, 2, 4}) {
    CAPTURE(world);
    const std::string out = tmp / fmt::format("out{}", world);
    import_train_export(world, 3, tmp / "in", 0, out, options);
    // The independent reader: the same names, dtypes, shapes and bytes.
    CHECK(compare_dirs(tmp / "in", out) == 0);
    CHECK(read_text_file(out + "/config.json") == read_text_file(tmp / "in/config.json"));
    const nlohmann::json index = read_json(out + "/model.safetensors.index.json");
    CHECK(index["metadata"]["total_size"] == 27408);
    CHECK(index["weight_map"].size() == 21);
    CHECK(HfCheckpoint::open(out).files().size() >= 4);
  }
}

TEST_CASE("an fp32 export of trained weights imports back bit for bit on another world size and stage") {
  TempDir tmp;
  write_llama_checkpoint(tmp / "in", "bf16", kShard);
  HfExportOptions options;
  options.config_from = tmp / "in";
  options.dtype = DType::kFloat32;
  options.max_shard_size = 20000;
  const Params trained = import_train_export(2, 3, tmp / "in", 2, tmp / "out", options);
  // Training moved the weights off bf16's grid, so only fp32 keeps them.
  CHECK_FALSE(same_bits(trained.at("lm_head.weight"), writer_values("lm_head.weight", 67 * 24)));
  const HfCheckpoint ckpt = HfCheckpoint::open(tmp / "out");
  CHECK(ckpt.tensor("lm_head.weight").dtype == "F32");
  for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{1, 0}, {4, 1}, {3, 3}}) {
    CAPTURE(world);
    CAPTURE(stage);
    const Params back = import_params(world, stage, tmp / "out");
    check_same(back, trained);
  }
}

TEST_CASE("shards hold at most max_shard_size bytes of tensor data and a larger tensor gets a shard of its own") {
  TempDir tmp;
  HfExportOptions options;
  options.config_json = R"({"model_type": "llama"})";
  options.max_shard_size = 3000;  // the embedding and the head are 3216 bytes in bf16
  import_train_export(2, 1, "", 0, tmp / "out", options);
  const HfCheckpoint ckpt = HfCheckpoint::open(tmp / "out");
  const std::vector<std::string> files = ckpt.files();
  REQUIRE(files.size() > 2);
  uint64_t total = 0;
  std::map<std::string, int> alone;  // oversized tensors -> the number of tensors in their file
  for (size_t f = 0; f < files.size(); ++f) {
    CAPTURE(files[f]);
    CHECK(files[f] == fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, files.size()));
    const SafetensorsFile file = SafetensorsFile::open(tmp / ("out/" + files[f]));
    uint64_t bytes = 0;
    for (const SafetensorsTensor& t : file.tensors()) {
      bytes += t.size_bytes();
      CHECK(t.dtype == "BF16");
      if (t.size_bytes() > 3000) alone[t.name] = static_cast<int>(file.tensors().size());
    }
    CHECK((bytes <= 3000 || file.tensors().size() == 1));
    CHECK(file.metadata().at("format") == "pt");
    total += bytes;
  }
  CHECK(alone == std::map<std::string, int>{{"lm_head.weight", 1}, {"model.embed_tokens.weight", 1}});
  CHECK(read_json(tmp / "out/model.safetensors.index.json")["metadata"]["total_size"] == total);
  CHECK(read_text_file(tmp / "out/config.json") == options.config_json);
  // The greedy rule fills shards: no two neighbours in the index order
  // (files 2 and 3 hold layer 0) would fit in one.
  const SafetensorsFile second = SafetensorsFile::open(tmp / ("out/" + files[1]));
  const SafetensorsFile third = SafetensorsFile::open(tmp / ("out/" + files[2]));
  uint64_t second_bytes = 0;
  for (const SafetensorsTensor& t : second.tensors()) second_bytes += t.size_bytes();
  CHECK(second_bytes + third.tensors().front().size_bytes() > 3000);
}

TEST_CASE("one model.safetensors and no index when everything fits in one shard, as save_pretrained writes") {
  TempDir tmp;
  HfExportOptions options;
  options.config_json = "{}";
  import_train_export(1, 0, "", 0, tmp / "out", options);
  std::set<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(tmp / "out")) names.insert(e.path().filename().string());
  CHECK(names == std::set<std::string>{"config.json", "model.safetensors"});
}

TEST_CASE("the export is published atomically: a failed export leaves the directory as it was") {
  TempDir tmp;
  const std::string out = tmp / "model";
  fs::create_directories(out);
  std::ofstream(out + "/old.txt") << "the previous export";
  HfExportOptions options;
  options.config_json = "{}";
  options.max_shard_size = kShard;
  options.replace = true;  // old.txt is no file of an export's
  options.transform = [](int unit, std::vector<HfTensor>&, HfExportPass pass) {
    if (unit == 2 && pass == HfExportPass::kWrite) throw std::runtime_error("the transform failed");
  };
  // The writing rank rethrows its transform's std::runtime_error, the other
  // rank a zest::Error quoting it, and run_inprocess rethrows the one whose
  // rank aborted the group first: either may come out here.
  std::string e = "(no error)";
  try {
    import_train_export(2, 3, "", 0, out, options);
  } catch (const std::exception& x) {
    e = x.what();
  }
  CHECK(e.find("the transform failed") != std::string::npos);
  std::set<std::string> left;
  for (const fs::directory_entry& d : fs::directory_iterator(out)) left.insert(d.path().filename().string());
  CHECK(left == std::set<std::string>{"old.txt"});
  std::set<std::string> beside;  // no partial directory left next to it
  for (const fs::directory_entry& d : fs::directory_iterator(tmp.path)) beside.insert(d.path().filename().string());
  CHECK(beside == std::set<std::string>{".zest-lock", "model"});

  options.transform = {};
  import_train_export(2, 3, "", 0, out, options);
  CHECK_FALSE(fs::exists(out + "/old.txt"));
  CHECK(fs::exists(out + "/model.safetensors.index.json"));
}

TEST_CASE("a transform merges LoRA adapters into the weights and `adapter` writes them apart, as PEFT does") {
  TempDir tmp;
  write_llama_checkpoint(tmp / "in", "bf16", kShard);
  TinyLlama m;
  m.lora_rank = 4;
  HfImportOptions import_options;
  import_options.allow_missing = [](const std::string& name) { return name.find(".lora_") != std::string::npos; };
  // Each layer's adapter unit (registered after the layer) visits first.
  HfExportOptions options;
  options.config_from = tmp / "in";
  options.dtype = DType::kFloat32;
  options.unit_order = {0, 2, 1, 4, 3, 5};
  const float scale = 0.5f;
  std::map<std::string, std::vector<float>> kept;  // A and B of the layer to come
  options.transform = [&](int, std::vector<HfTensor>& tensors, HfExportPass pass) {
    std::vector<HfTensor> out;
    for (HfTensor& t : tensors) {
      if (t.name.find(".lora_") != std::string::npos) {
        kept[t.name] = std::move(t.values);
        continue;
      }
      if (t.name.ends_with("q_proj.weight") && pass == HfExportPass::kWrite) {
        const std::string base = t.name.substr(0, t.name.size() - 6);  // "...q_proj."
        const std::vector<float>& a = kept.at(base + "lora_A.weight");  // [4, 24]
        const std::vector<float>& b = kept.at(base + "lora_B.weight");  // [24, 4]
        for (size_t i = 0; i < 24; ++i)
          for (size_t j = 0; j < 24; ++j) {
            float s = 0;
            for (size_t k = 0; k < 4; ++k) s += b[i * 4 + k] * a[k * 24 + j];
            t.values[i * 24 + j] += scale * s;
          }
      }
      out.push_back(std::move(t));
    }
    tensors = std::move(out);
  };
  const Params trained = import_train_export(2, 3, tmp / "in", 1, tmp / "merged", options, m, import_options);
  const HfCheckpoint merged = HfCheckpoint::open(tmp / "merged");
  CHECK(merged.names().size() == 21);  // the base model's names, adapters gone
  std::vector<float> q(24 * 24);
  merged.file_of("model.layers.1.self_attn.q_proj.weight")
      .read_as("model.layers.1.self_attn.q_proj.weight", DType::kFloat32, std::as_writable_bytes(std::span(q)));
  std::vector<float> expected = trained.at("model.layers.1.self_attn.q_proj.weight");
  const std::vector<float>& a = trained.at("model.layers.1.self_attn.q_proj.lora_A.weight");
  const std::vector<float>& b = trained.at("model.layers.1.self_attn.q_proj.lora_B.weight");
  for (size_t i = 0; i < 24; ++i)
    for (size_t j = 0; j < 24; ++j) {
      float s = 0;
      for (size_t k = 0; k < 4; ++k) s += b[i * 4 + k] * a[k * 24 + j];
      expected[i * 24 + j] += scale * s;
    }
  CHECK(same_bits(q, expected));
  CHECK_FALSE(same_bits(q, trained.at("model.layers.1.self_attn.q_proj.weight")));

  // Apart: the adapters in adapter_model.safetensors, the base unmerged.
  HfExportOptions apart;
  apart.config_from = tmp / "in";
  apart.dtype = DType::kFloat32;
  apart.adapter = [](const std::string& name) { return name.find(".lora_") != std::string::npos; };
  apart.adapter_config_json = R"({"peft_type": "LORA", "r": 4, "lora_alpha": 2, "target_modules": ["q_proj"]})";
  const Params trained2 = import_train_export(2, 3, tmp / "in", 1, tmp / "apart", apart, m, import_options);
  const SafetensorsFile adapters = SafetensorsFile::open(tmp / "apart/adapter_model.safetensors");
  CHECK(adapters.tensors().size() == 4);
  std::vector<float> got(4 * 24);
  adapters.read_as("model.layers.0.self_attn.q_proj.lora_A.weight", DType::kFloat32,
                   std::as_writable_bytes(std::span(got)));
  CHECK(same_bits(got, trained2.at("model.layers.0.self_attn.q_proj.lora_A.weight")));
  CHECK(read_text_file(tmp / "apart/adapter_config.json") == apart.adapter_config_json);
  CHECK(HfCheckpoint::open(tmp / "apart").names().size() == 21);
}

TEST_CASE("export refuses bad options on every rank before writing anything") {
  TempDir tmp;
  const auto fails = [&](const HfExportOptions& options) {
    return error_of([&] { import_train_export(2, 2, "", 0, tmp / "out", options); });
  };
  HfExportOptions options;
  CHECK(fails(options).find("needs its config.json") != std::string::npos);
  options.config_json = "[1]";
  CHECK(fails(options).find("expected an object") != std::string::npos);
  options.config_json = "{}";
  options.dtype = DType::kInt32;
  CHECK(fails(options).find("bf16, fp16 or fp32") != std::string::npos);
  options.dtype = DType::kBFloat16;
  options.max_shard_size = 0;
  CHECK(fails(options).find("max_shard_size is 0") != std::string::npos);
  options.max_shard_size = kShard;
  options.unit_order = {0, 1, 1, 2};
  CHECK(fails(options).find("is not an order of the model's 4 units") != std::string::npos);
  options.unit_order = {};
  options.adapter = [](const std::string& name) { return name == "lm_head.weight"; };
  CHECK(fails(options).find("adapter_config_json") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "out"));
}

TEST_CASE("an export never replaces what it did not write: the run's inputs and foreign files, unless replace") {
  TempDir tmp;
  write_llama_checkpoint(tmp / "in", "bf16", kShard);
  std::ofstream(tmp / "in/tokenizer.json") << "{}";
  fs::create_directories(tmp / "ckpt/step_000002");
  std::ofstream(tmp / "ckpt/latest") << "step_000002";
  std::set<std::string> before;
  for (const fs::directory_entry& d : fs::directory_iterator(tmp / "in")) before.insert(d.path().filename().string());
  HfExportOptions options;
  options.config_from = tmp / "in";
  options.max_shard_size = kShard;
  options.inputs = {tmp / "ckpt"};
  const auto refused = [&](const std::string& to, const char* what) {
    CAPTURE(to);
    const std::string e = error_of([&] { import_train_export(2, 3, tmp / "in", 0, to, options); });
    CHECK(e.find(what) != std::string::npos);
    CHECK(e.find("--export-replace") != std::string::npos);
  };
  refused(tmp / "in", "the destination is '");                  // the model the run started from
  refused(tmp / "in/", "the destination is '");
  refused(tmp / "in/../in", "the destination is '");
  refused(tmp / "in/sub", "the destination lies inside '");
  refused(tmp / "ckpt", "the destination is '");                 // a checkpoint root
  refused(tmp.path, "the destination contains '");               // the directory holding both
  fs::create_directories(tmp / "mine");
  std::ofstream(tmp / "mine/notes.txt") << "a user's file";
  refused(tmp / "mine", "it holds 'notes.txt', which an export does not write");
  fs::create_symlink(tmp / "in", tmp / "link");
  refused(tmp / "link", "the destination is '");                 // through a link
  // Nothing was touched.
  std::set<std::string> after;
  for (const fs::directory_entry& d : fs::directory_iterator(tmp / "in")) after.insert(d.path().filename().string());
  CHECK(after == before);
  CHECK(read_text_file(tmp / "mine/notes.txt") == "a user's file");
  CHECK(fs::exists(tmp / "ckpt/step_000002"));

  // A new directory, then the same one again: a previous export is replaced.
  import_train_export(2, 3, tmp / "in", 0, tmp / "out", options);
  import_train_export(2, 3, tmp / "in", 0, tmp / "out", options);
  CHECK(compare_dirs(tmp / "in", tmp / "out") == 0);
  // replace: the user's directory is replaced all the same.
  options.replace = true;
  import_train_export(2, 3, tmp / "in", 0, tmp / "mine", options);
  CHECK_FALSE(fs::exists(tmp / "mine/notes.txt"));
  CHECK(compare_dirs(tmp / "in", tmp / "mine") == 0);
}

TEST_CASE("adapters exported apart under PEFT's names are read back with the shards, or refused by name") {
  TempDir tmp;
  write_llama_checkpoint(tmp / "in", "bf16", kShard);
  TinyLlama m;
  m.lora_rank = 4;
  HfImportOptions base_only;
  base_only.allow_missing = [](const std::string& name) { return name.find(".lora_") != std::string::npos; };
  HfExportOptions apart;
  apart.config_from = tmp / "in";
  apart.dtype = DType::kFloat32;
  apart.transform = [](int, std::vector<HfTensor>& tensors, HfExportPass) {
    for (HfTensor& t : tensors) {
      if (t.name.find(".lora_") != std::string::npos) t.name = "base_model.model." + t.name;
    }
  };
  apart.adapter = [](const std::string& name) { return name.starts_with("base_model.model."); };
  apart.adapter_config_json = R"({"peft_type": "LORA", "r": 4, "lora_alpha": 2, "target_modules": ["q_proj"]})";
  // Two steps train the adapters away from their start (lora_B is not 0).
  const Params trained = import_train_export(2, 3, tmp / "in", 2, tmp / "apart", apart, m, base_only);
  // A fresh LoRA model: base and adapters as exported, bit for bit (fp32), on
  // another world size and stage.
  Params back;
  int adapters_loaded = 0;
  run_inprocess(4, [&](Communicator& comm) {
    RankEngine engine(comm, 2, [&](Engine& e) { register_llama(e, m); });
    const HfImportReport r = import_hf(*engine, tmp / "apart");
    Params p = master_params(*engine);
    if (comm.rank() == 0) {
      back = std::move(p);
      adapters_loaded = r.adapters_loaded;
    }
  });
  CHECK(adapters_loaded == 4);
  REQUIRE(back.size() == trained.size());
  for (const auto& [name, values] : trained) {
    CAPTURE(name);
    CHECK(same_bits(back.at(name), values));
  }
  // A model without adapters does not drop them silently.
  const std::string e = error_of([&] { import_params(1, 0, tmp / "apart"); });
  CHECK(e.find("adapter tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'") != std::string::npos);
  CHECK(e.find("is no parameter of the model") != std::string::npos);
  HfImportOptions skip;
  skip.ignore_adapters = true;
  run_inprocess(1, [&](Communicator& comm) {
    RankEngine engine(comm, 0, [&](Engine& en) { register_llama(en); });
    CHECK(import_hf(*engine, tmp / "apart", skip).adapters_loaded == 0);
  });
}

}  // namespace test_hf_export
