// Hugging Face checkpoint directories in: written by an independent writer
// (tests/tools/hf_llama_writer.py), read on 1, 2 and 4 in-process ranks at
// every stage, bit for bit; every problem in one error; each rank reads
// only its own bytes.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "hf/hf_test_util.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/core/file_io.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/hf/hf_export.h"
#include "zest/hf/hf_import.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

// Tensor bytes of 4 shards for the default TinyLlama in bf16 (27408 bytes).
constexpr uint64_t kShard = 8000;

// Imports `dir` on `world` ranks at `stage`; returns rank 0's master values
// and every rank's report.
struct ImportRun {
  Params params;
  std::vector<HfImportReport> reports;
  bool optimizer_state_zero = true;
};

ImportRun import_run(int world, int stage, const std::string& dir, const HfImportOptions& options = {},
                     const std::function<void(Engine&)>& model = [](Engine& e) { register_llama(e); }) {
  ImportRun out;
  out.reports.resize(static_cast<size_t>(world));
  std::mutex mu;
  run_inprocess(world, [&](Communicator& comm) {
    RankEngine engine(comm, stage, model);
    const HfImportReport r = import_hf(*engine, dir, options);
    bool zero = true;
    for (int u = 0; u < engine->layout().num_units(); ++u) {
      for (const float x : engine->read_shard(u, 1)) zero = zero && x == 0.0f;
    }
    Params p = master_params(*engine);
    const std::lock_guard<std::mutex> lock(mu);
    out.reports[static_cast<size_t>(comm.rank())] = r;
    out.optimizer_state_zero = out.optimizer_state_zero && zero;
    if (comm.rank() == 0) out.params = std::move(p);
  });
  return out;
}

// Sum over the checkpoint's files of 8 + the header's length: what every
// rank reads besides tensor data.
// What every rank reads to open the checkpoint: each file's header, and the
// 16 bytes at the start and the middle of each tensor that its fingerprint
// samples (HfCheckpoint::fingerprint).
uint64_t header_bytes(const std::string& dir) {
  uint64_t total = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const SafetensorsFile f = SafetensorsFile::open(e.path().string());
    total += f.data_begin();
    for (const SafetensorsTensor& t : f.tensors()) total += 2 * std::min<uint64_t>(16, t.size_bytes());
  }
  return total;
}

}  // namespace

TEST_CASE("a sharded checkpoint imports bit for bit from bf16, fp16 and fp32 on 1, 2 and 4 ranks at stages 0-3") {
  for (const char* dtype : {"bf16", "fp16", "fp32"}) {
    TempDir dir;
    write_llama_checkpoint(dir.str(), dtype, kShard);
    const HfCheckpoint ckpt = HfCheckpoint::open(dir.str());
    CHECK(ckpt.indexed());
    CHECK(ckpt.files().size() >= 4);
    for (const int world : {1, 2, 4}) {
      for (const int stage : {0, 1, 2, 3}) {
        for (const bool map_files : {true, false}) {  // the file's pages viewed, or read into buffers
          CAPTURE(dtype);
          CAPTURE(world);
          CAPTURE(stage);
          CAPTURE(map_files);
          HfImportOptions options;
          options.map_files = map_files;
          const ImportRun r = import_run(world, stage, dir.str(), options);
          const std::map<std::string, size_t> numels = llama_numels();
          REQUIRE(r.params.size() == numels.size());
          for (const auto& [name, numel] : numels) {
            CAPTURE(name);
            CHECK(same_bits(r.params.at(name), writer_values(name, numel)));
          }
          CHECK(r.optimizer_state_zero);
          CHECK(r.reports[0].tensors_loaded == static_cast<int>(numels.size()));
        }
      }
    }
  }
}

TEST_CASE("one model.safetensors imports too") {
  TempDir dir;
  write_llama_checkpoint(dir.str(), "bf16", uint64_t{1} << 30);
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  const ImportRun r = import_run(2, 3, dir.str());
  CHECK(same_bits(r.params.at("lm_head.weight"), writer_values("lm_head.weight", 67 * 24)));
}

TEST_CASE("each rank reads only the bytes of its own shard: the ranks together read the checkpoint once") {
  TempDir dir;
  write_llama_checkpoint(dir.str(), "bf16", kShard);
  const HfCheckpoint ckpt = HfCheckpoint::open(dir.str());
  const uint64_t data = ckpt.tensor_bytes();
  const uint64_t headers = header_bytes(dir.str());
  CHECK(data == 27408);
  for (const int world : {2, 4}) {
    for (const int stage : {1, 3}) {
      CAPTURE(world);
      CAPTURE(stage);
      const ImportRun r = import_run(world, stage, dir.str());
      uint64_t sum = 0;
      for (const HfImportReport& rep : r.reports) {
        sum += rep.bytes_read;
        // Each rank's share is about 1/world of the data, never all of it.
        CHECK(rep.bytes_read - headers < data / static_cast<uint64_t>(world) + 4096);
      }
      // Tensor data exactly once; each rank read each file's header.
      CHECK(sum == data + static_cast<uint64_t>(world) * headers);
    }
  }
  // At stage 0 every rank owns, and reads, everything.
  const ImportRun r0 = import_run(2, 0, dir.str());
  CHECK(r0.reports[0].bytes_read == data + headers);
  CHECK(r0.reports[1].bytes_read == data + headers);
}

TEST_CASE("the progress callback sees every byte a rank reads") {
  TempDir dir;
  write_llama_checkpoint(dir.str(), "fp32", kShard);
  std::mutex mu;
  std::map<int, std::pair<uint64_t, uint64_t>> last;  // rank -> (done, total)
  std::map<int, int> calls;
  run_inprocess(2, [&](Communicator& comm) {
    RankEngine engine(comm, 3, [](Engine& e) { register_llama(e); });
    HfImportOptions options;
    options.progress = [&](uint64_t done, uint64_t total) {
      const std::lock_guard<std::mutex> lock(mu);
      CHECK(done <= total);
      CHECK(done > last[comm.rank()].first);  // it only grows
      last[comm.rank()] = {done, total};
      ++calls[comm.rank()];
    };
    const HfImportReport r = import_hf(*engine, dir.str(), options);
    const std::lock_guard<std::mutex> lock(mu);
    CHECK(last[comm.rank()].first == last[comm.rank()].second);
    CHECK(r.bytes_read - header_bytes(dir.str()) == last[comm.rank()].second);
  });
  CHECK(last[0].second + last[1].second == HfCheckpoint::open(dir.str()).tensor_bytes());
  CHECK(calls[0] > 1);
}

TEST_CASE("missing, extra and mis-shaped tensors are one error listing all of them, on every rank") {
  TempDir dir;
  write_llama_checkpoint(dir.str(), "bf16", kShard);
  const auto model = [](Engine& e) {
    e.add_unit("embed", {{"model.embed_tokens.weight", {67, 24}}});
    // model.layers.* and model.norm.weight are not registered: extra.
    e.add_unit("head", {{"lm_head.weight", {68, 24}},            // wrong shape
                        {"model.rotary.inv_freq", {12}}});       // missing
  };
  std::mutex mu;
  std::vector<std::string> errors;
  run_inprocess(2, [&](Communicator& comm) {
    RankEngine engine(comm, 3, model);
    const std::string e = error_of([&] { import_hf(*engine, dir.str()); });
    const std::lock_guard<std::mutex> lock(mu);
    errors.push_back(e);
  });
  REQUIRE(errors.size() == 2);
  CHECK(errors[0] == errors[1]);
  const std::string& e = errors[0];
  CHECK(e.find("does not fit the model: 21 problems") != std::string::npos);
  CHECK(e.find("missing: parameter 'model.rotary.inv_freq' (unit 'head', shape [12]) has no tensor "
               "'model.rotary.inv_freq'") != std::string::npos);
  CHECK(e.find("shape: tensor 'lm_head.weight' is [67, 24]") != std::string::npos);
  CHECK(e.find("parameter 'lm_head.weight' is registered as [68, 24]") != std::string::npos);
  CHECK(e.find("extra: tensor 'model.norm.weight' is not a registered parameter") != std::string::npos);
  CHECK(e.find("extra: tensor 'model.layers.1.mlp.up_proj.weight'") != std::string::npos);

  // ignore_extra and allow_missing leave only the shape.
  HfImportOptions lenient;
  lenient.ignore_extra = true;
  lenient.allow_missing = [](const std::string& name) { return name == "model.rotary.inv_freq"; };
  const std::string only_shape = error_of([&] { import_run(1, 0, dir.str(), lenient, model); });
  CHECK(only_shape.find("1 problem:") != std::string::npos);
  CHECK(only_shape.find("lm_head.weight") != std::string::npos);
}

TEST_CASE("non-finite values found on different ranks are listed together and their units keep their values") {
  TempDir dir;
  // The embedding's element 3 lies in rank 0's shard, lm_head's elements
  // 1600 and 1607 in rank 1's (stage 3, 2 ranks).
  write_llama_checkpoint(dir.str(), "bf16", kShard,
                         "--nan model.embed_tokens.weight:3 --nan lm_head.weight:1607 --nan lm_head.weight:1600");
  std::mutex mu;
  std::vector<std::string> errors;
  Params before, after;
  run_inprocess(2, [&](Communicator& comm) {
    RankEngine engine(comm, 3, [](Engine& e) { register_llama(e); });
    Params b = master_params(*engine);
    const std::string e = error_of([&] { import_hf(*engine, dir.str()); });
    Params a = master_params(*engine);  // collective: the engine is consistent on every rank
    const std::lock_guard<std::mutex> lock(mu);
    errors.push_back(e);
    if (comm.rank() == 0) {
      before = std::move(b);
      after = std::move(a);
    }
  });
  REQUIRE(errors.size() == 2);
  CHECK(errors[0] == errors[1]);
  CHECK(errors[0].find("2 problems") != std::string::npos);
  CHECK(errors[0].find("non-finite: tensor 'model.embed_tokens.weight'") != std::string::npos);
  CHECK(errors[0].find("(element 3 is one)") != std::string::npos);
  CHECK(errors[0].find("non-finite: tensor 'lm_head.weight'") != std::string::npos);
  CHECK(errors[0].find("(element 1600 is one)") != std::string::npos);
  // Rank 0's shard of the embedding and rank 1's of the head kept their
  // values; every other shard was loaded.
  const std::vector<float>& embed = after.at("model.embed_tokens.weight");
  CHECK(std::equal(embed.begin(), embed.begin() + 800, before.at("model.embed_tokens.weight").begin()));
  const std::vector<float> embed_file = writer_values("model.embed_tokens.weight", 67 * 24);
  CHECK(std::equal(embed.end() - 500, embed.end(), embed_file.end() - 500));
  const std::vector<float>& head = after.at("lm_head.weight");
  const std::vector<float> head_file = writer_values("lm_head.weight", 67 * 24);
  CHECK(std::equal(head.begin(), head.begin() + 700, head_file.begin()));
  CHECK(std::equal(head.end() - 8, head.end(), before.at("lm_head.weight").end() - 8));
  CHECK(same_bits(after.at("model.layers.1.mlp.up_proj.weight"),
                  writer_values("model.layers.1.mlp.up_proj.weight", 40 * 24)));
}

TEST_CASE("a NaN in an fp16 or fp32 checkpoint is found on its stored bits, naming the tensor and element") {
  for (const std::string dtype : {"fp16", "fp32"}) {
    CAPTURE(dtype);
    TempDir dir;
    write_llama_checkpoint(dir.str(), dtype, kShard, "--nan model.layers.1.mlp.up_proj.weight:517");
    const std::string e = error_of([&] { import_run(1, 3, dir.str()); });
    CHECK(e.find("1 problem") != std::string::npos);
    CHECK(e.find("non-finite: tensor 'model.layers.1.mlp.up_proj.weight'") != std::string::npos);
    CHECK(e.find("(element 517 is one)") != std::string::npos);
  }
}

TEST_CASE("a truncated shard, a missing shard and a bad index are one error naming each file and tensor") {
  TempDir dir;
  write_llama_checkpoint(dir.str(), "bf16", kShard);
  fs::resize_file(dir / "model-00002-of-00004.safetensors", fs::file_size(dir / "model-00002-of-00004.safetensors") - 2);
  fs::remove(dir / "model-00003-of-00004.safetensors");
  // The index: a tensor no shard has, and one listed under the wrong shard.
  const std::string index_path = dir / "model.safetensors.index.json";
  std::string text = read_text_file(index_path);
  const std::string moved = "\"lm_head.weight\": \"model-00004-of-00004.safetensors\"";
  REQUIRE(text.find(moved) != std::string::npos);
  text.replace(text.find(moved), moved.size(),
               "\"lm_head.weight\": \"model-00001-of-00004.safetensors\", \"ghost.weight\": "
               "\"model-00004-of-00004.safetensors\"");
  std::ofstream(index_path) << text;

  const std::string e = error_of([&] { HfCheckpoint::open(dir.str()); });
  CHECK(e.find("5 problems") != std::string::npos);
  CHECK(e.find("model-00002-of-00004.safetensors") != std::string::npos);  // truncated
  CHECK(e.find("model-00003-of-00004.safetensors") != std::string::npos);  // missing
  CHECK(e.find("tensor 'ghost.weight' is listed in the index under 'model-00004-of-00004.safetensors', which has "
               "no such tensor") != std::string::npos);
  CHECK(e.find("tensor 'lm_head.weight' is listed in the index under 'model-00001-of-00004.safetensors', which has "
               "no such tensor") != std::string::npos);
  CHECK(e.find("tensor 'lm_head.weight' is in 'model-00004-of-00004.safetensors' but the index lists it under "
               "'model-00001-of-00004.safetensors'") != std::string::npos);
  // import_hf reports the same, on every rank.
  const std::string ie = error_of([&] { import_run(2, 3, dir.str()); });
  CHECK(ie.find("5 problems") != std::string::npos);
}

TEST_CASE("hostile index files are errors, never a crash or a read outside the directory") {
  TempDir dir;
  write_llama_checkpoint(dir.str(), "bf16", kShard);
  const std::string index_path = dir / "model.safetensors.index.json";
  const auto open_with_index = [&](const std::string& text) {
    std::ofstream(index_path, std::ios::trunc) << text;
    return error_of([&] { HfCheckpoint::open(dir.str()); });
  };
  CHECK(open_with_index("not json").find("index '") != std::string::npos);
  CHECK(open_with_index("[1, 2]").find("has no \"weight_map\" object") != std::string::npos);
  CHECK(open_with_index(R"({"weight_map": {}})").find("lists no tensors") != std::string::npos);
  CHECK(open_with_index(R"({"weight_map": {"a": "../model-00001-of-00004.safetensors"}})")
            .find("which is not a file name in the checkpoint's directory") != std::string::npos);
  CHECK(open_with_index(R"({"weight_map": {"a": 7}})").find("maps to 7; expected a file name") != std::string::npos);
  CHECK(open_with_index(R"({"weight_map": {"a": {"b": {"c": {"d": 1}}}}})").find("index '") != std::string::npos);
  fs::remove(index_path);
  CHECK(error_of([&] { HfCheckpoint::open(dir.str()); }).find("has neither model.safetensors nor") != std::string::npos);
  CHECK(error_of([&] { HfCheckpoint::open(dir / "nowhere"); }).find("is not a directory") != std::string::npos);
  const std::string short_header("\x08\0\0\0\0\0\0\0{}", 10);  // says 8 header bytes, has 2
  std::ofstream(dir / "model.safetensors").write(short_header.data(), static_cast<std::streamsize>(short_header.size()));
  std::ofstream(dir / "config.json") << "{\"a\": ";
  const std::string e = error_of([&] { HfCheckpoint::open(dir.str()); });
  CHECK(e.find("2 problems") != std::string::npos);  // config.json and the header
}

TEST_CASE("a name map renames prefixes and single tensors and allow_missing keeps an adapter's values") {
  TempDir dir;
  write_llama_checkpoint(dir.str(), "bf16", kShard);
  HfImportOptions options;
  options.names.checkpoint_prefix = "model.";
  options.names.engine_prefix = "decoder.";
  options.names.table["lm_head.weight"] = "output.weight";
  options.allow_missing = [](const std::string& name) { return name.find(".lora_") != std::string::npos; };
  const auto model = [](Engine& e) {
    e.add_param_group("no_decay", 0.0f);
    e.add_unit("embed", {{"decoder.embed_tokens.weight", {67, 24}}});
    for (int l = 0; l < 2; ++l) {
      const std::string p = fmt::format("decoder.layers.{}.", l);
      std::vector<ParamSpec> specs;
      for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"})
        specs.push_back({p + n + ".weight", {24, 24}});
      for (const char* n : {"mlp.gate_proj", "mlp.up_proj"}) specs.push_back({p + n + ".weight", {40, 24}});
      specs.push_back({p + "mlp.down_proj.weight", {24, 40}});
      specs.push_back({p + "input_layernorm.weight", {24}, "no_decay"});
      specs.push_back({p + "post_attention_layernorm.weight", {24}, "no_decay"});
      specs.push_back({p + "self_attn.q_proj.lora_A.weight", {4, 24}});
      specs.push_back({p + "self_attn.q_proj.lora_B.weight", {24, 4}});
      e.add_unit(fmt::format("layer{}", l), specs);
    }
    e.add_unit("head", {{"decoder.norm.weight", {24}, "no_decay"}, {"output.weight", {67, 24}}});
  };
  const ImportRun r = import_run(2, 3, dir.str(), options, model);
  CHECK(same_bits(r.params.at("output.weight"), writer_values("lm_head.weight", 67 * 24)));
  CHECK(same_bits(r.params.at("decoder.layers.1.mlp.down_proj.weight"),
                  writer_values("model.layers.1.mlp.down_proj.weight", 24 * 40)));
  std::vector<float> init(4 * 24);
  init_values(ParamLayout{"decoder.layers.0.self_attn.q_proj.lora_A.weight", {4, 24}, 96, 0, 0}, init);
  CHECK(same_bits(r.params.at("decoder.layers.0.self_attn.q_proj.lora_A.weight"), init));
  CHECK(r.reports[0].tensors_loaded == 21);

  // Without allow_missing the adapters are missing, and named.
  options.allow_missing = {};
  const std::string e = error_of([&] { import_run(1, 0, dir.str(), options, model); });
  CHECK(e.find("4 problems") != std::string::npos);
  CHECK(e.find("missing: parameter 'decoder.layers.0.self_attn.q_proj.lora_A.weight'") != std::string::npos);
}

TEST_CASE("a name map that does not map back is refused naming the tensor and with a table entry it round-trips") {
  TempDir dir;
  write_llama_checkpoint(dir / "in", "bf16", kShard);
  const auto model = [](Engine& e) { register_llama(e, {}, ""); };  // "layers.0....", "lm_head.weight"
  HfImportOptions options;
  options.names.checkpoint_prefix = "model.";
  const std::string e = error_of([&] { import_run(1, 0, dir / "in", options, model); });
  CHECK(e.find("2 problems") != std::string::npos);  // and so the head has no tensor:
  CHECK(e.find("missing: parameter 'lm_head.weight'") != std::string::npos);
  CHECK(e.find("the name map takes tensor 'lm_head.weight' to 'lm_head.weight', which maps back to "
               "'model.lm_head.weight'") != std::string::npos);
  options.names.table["lm_head.weight"] = "lm_head.weight";
  run_inprocess(2, [&](Communicator& comm) {
    RankEngine engine(comm, 3, model);
    import_hf(*engine, dir / "in", options);
    HfExportOptions out;
    out.config_from = dir / "in";
    out.max_shard_size = kShard;
    out.names = options.names;
    export_hf(*engine, dir / "out", out);
  });
  // The export carries the checkpoint's names again, and its bytes.
  CHECK(std::system(hf_tool(fmt::format("compare {} {}", dir / "in", dir / "out")).c_str()) == 0);
}

namespace {

// The compute-dtype bits of every parameter, gathered (collective).
std::map<std::string, std::vector<uint16_t>> bf16_params(Engine& engine) {
  std::map<std::string, std::vector<uint16_t>> out;
  for (int u = 0; u < engine.layout().num_units(); ++u) {
    UnitHandle h = engine.gather(u);
    for (const ParamLayout& p : engine.layout().unit(u).params) {
      const std::span<const bf16> w = h.param<bf16>(p.name);
      std::vector<uint16_t>& bits = out[p.name];
      for (const bf16 x : w) bits.push_back(x.bits);
    }
  }
  return out;
}

void bf16_engine(EngineConfig& c) { c.bf16 = true; }

}  // namespace

TEST_CASE("a bf16 checkpoint into a bf16 engine: read into the parameters in place, the master widened from them") {
  TempDir dir;
  write_llama_checkpoint(dir.str(), "bf16", kShard);
  for (const int stage : {0, 1, 2, 3}) {
    for (const bool offload : {false, true}) {
      if (offload && stage == 0) continue;
      CAPTURE(stage);
      CAPTURE(offload);
      std::mutex mu;
      Params masters;
      std::map<std::string, std::vector<uint16_t>> params;
      bool state_zero = true;
      run_inprocess(2, [&](Communicator& comm) {
        RankEngine engine(comm, stage, [](Engine& e) { register_llama(e); }, [&](EngineConfig& c) {
          c.bf16 = true;
          if (offload) {
            c.offload_optimizer.device = OffloadDevice::kCpu;
            c.offload_optimizer.ratio = 0.5;
          }
        });
        import_hf(*engine, dir.str());
        auto p = bf16_params(*engine);  // before any master read: what the file holds
        Params m = master_params(*engine);
        bool zero = true;
        for (int u = 0; u < engine->layout().num_units(); ++u) {
          for (const float x : engine->read_shard(u, 1)) zero = zero && x == 0.0f;
        }
        const std::lock_guard<std::mutex> lock(mu);
        state_zero = state_zero && zero;
        if (comm.rank() == 0) {
          masters = std::move(m);
          params = std::move(p);
        }
      });
      CHECK(state_zero);
      for (const auto& [name, numel] : llama_numels()) {
        CAPTURE(name);
        const std::vector<float> want = writer_values(name, numel);
        CHECK(same_bits(masters.at(name), want));
        std::vector<uint16_t> want_bits(numel);
        for (size_t i = 0; i < numel; ++i) want_bits[i] = float_to_bf16_bits(want[i]);
        CHECK(params.at(name) == want_bits);
      }
    }
  }
}

TEST_CASE("a NaN in a bf16 checkpoint read in place: a trained unit keeps its weights, a frozen one is zeroed") {
  TempDir dir;
  // As in the fp32 case above: the embedding's element 3 in rank 0's shard,
  // lm_head's 1600 and 1607 in rank 1's (stage 3, 2 ranks).
  write_llama_checkpoint(dir.str(), "bf16", kShard,
                         "--nan model.embed_tokens.weight:3 --nan lm_head.weight:1607 --nan lm_head.weight:1600");
  const TinyLlama m;
  const auto model = [&](Engine& e) {
    e.add_param_group("no_decay", 0.0f);
    e.add_unit("embed", {{"model.embed_tokens.weight", {m.vocab, m.hidden}, "default", false}});  // frozen
    e.add_unit("head", {{"model.norm.weight", {m.hidden}, "no_decay"}, {"lm_head.weight", {m.vocab, m.hidden}}});
  };
  HfImportOptions options;
  options.ignore_extra = true;  // the layers
  std::mutex mu;
  std::string error;
  Params before, after;
  std::map<std::string, std::vector<uint16_t>> params;
  run_inprocess(2, [&](Communicator& comm) {
    RankEngine engine(comm, 3, model, bf16_engine);
    Params b = master_params(*engine);
    const std::string e = error_of([&] { import_hf(*engine, dir.str(), options); });
    Params a = master_params(*engine);
    auto p = bf16_params(*engine);
    const std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) {
      error = e;
      before = std::move(b);
      after = std::move(a);
      params = std::move(p);
    }
  });
  CHECK(error.find("2 problems") != std::string::npos);
  CHECK(error.find("(a frozen unit read in place was zeroed)") != std::string::npos);
  // The frozen embedding: rank 0's shard zeroed, rank 1's loaded.
  const std::vector<float>& embed = after.at("model.embed_tokens.weight");
  CHECK(std::all_of(embed.begin(), embed.begin() + 800, [](float x) { return detail::float_bits(x) == 0; }));
  const std::vector<float> embed_file = writer_values("model.embed_tokens.weight", 67 * 24);
  CHECK(std::equal(embed.end() - 500, embed.end(), embed_file.end() - 500));
  // The head: rank 0's shard loaded, rank 1's master as before and its
  // parameters that master narrowed again.
  const std::vector<float>& head = after.at("lm_head.weight");
  const std::vector<float> head_file = writer_values("lm_head.weight", 67 * 24);
  CHECK(std::equal(head.begin(), head.begin() + 700, head_file.begin()));
  CHECK(same_bits({head.end() - 8, head.end()}, {before.at("lm_head.weight").end() - 8, before.at("lm_head.weight").end()}));
  const std::vector<uint16_t>& head_bits = params.at("lm_head.weight");
  for (size_t i = head.size() - 8; i < head.size(); ++i) {
    CHECK(head_bits[i] == float_to_bf16_bits(before.at("lm_head.weight")[i]));
  }
  for (size_t i = 0; i < 700; ++i) CHECK(head_bits[i] == float_to_bf16_bits(head_file[i]));
}

TEST_CASE("ranks that read different copies of a checkpoint are refused on every rank, naming the ranks") {
  TempDir a, b, c;
  write_llama_checkpoint(a.str(), "bf16", kShard);
  write_llama_checkpoint(c.str(), "fp32", kShard);  // other headers
  fs::copy(a.path, b.path, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  // b: the same headers, one tensor's first byte changed (another fine-tune).
  std::vector<fs::path> shards;
  for (const fs::directory_entry& e : fs::directory_iterator(b.path)) {
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());
  REQUIRE(shards.size() > 1);
  const SafetensorsFile first = SafetensorsFile::open(shards.back().string());
  const SafetensorsTensor& t = first.tensors().front();
  {
    std::fstream f(shards.back(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(first.data_begin() + t.begin));
    const char x = 0x5a;
    f.write(&x, 1);
  }
  for (const std::string& other : {b.str(), c.str()}) {
    std::mutex mu;
    std::vector<std::string> errors;
    run_inprocess(2, [&](Communicator& comm) {
      RankEngine engine(comm, 3, [](Engine& e) { register_llama(e); });
      const std::string e = error_of([&] { import_hf(*engine, comm.rank() == 0 ? a.str() : other); });
      const std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e);
    });
    REQUIRE(errors.size() == 2);
    for (const std::string& e : errors) {
      CAPTURE(e);
      CHECK(e.find("ranks read different copies of Hugging Face checkpoint") != std::string::npos);
      CHECK(e.find("rank 1 of the data-parallel group") != std::string::npos);
    }
  }
  // The same files under two paths agree.
  const fs::path same = c.path / "same";
  fs::copy(a.path, same, fs::copy_options::recursive);
  run_inprocess(2, [&](Communicator& comm) {
    RankEngine engine(comm, 3, [](Engine& e) { register_llama(e); });
    CHECK(error_of([&] { import_hf(*engine, comm.rank() == 0 ? a.str() : same.string()); }) == "(no error)");
  });
}
