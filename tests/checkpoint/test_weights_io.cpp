// Weights out to safetensors and back in, across world sizes and stages.
#include <doctest/doctest.h>

#include <filesystem>
#include <cstdlib>
#include <random>

#include "engine/engine_harness.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/checkpoint/weights_io.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

struct TempFile {
  fs::path path;
  TempFile() {
    std::random_device rd;
    path = fs::temp_directory_path() / fmt::format("zest_weights_{:08x}.safetensors", rd());
  }
  ~TempFile() { fs::remove(path); }
  std::string str() const { return path.string(); }
};

using Params = std::map<std::string, std::vector<float>>;

// Trains `steps` on `world` ranks at `stage`; imports `import_from` first
// and exports to `export_to` last when given. Returns rank 0's parameters.
Params run(int world, int stage, int steps, const std::string& import_from, const std::string& export_to,
           DType dtype = DType::kFloat32, std::vector<float>* state_after_import = nullptr) {
  Params out;
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(stage), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    if (!import_from.empty()) {
      import_weights(engine, import_from);
      if (state_after_import && comm.rank() == 0) *state_after_import = engine.read_shard(0, 1);
    }
    RankResult r;
    run_steps(engine, comm, runs(world, steps), 0, steps, r);
    if (!export_to.empty()) export_weights(engine, export_to, {dtype, {}});
    Params p = master_params(engine);
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

}  // namespace

TEST_CASE("export writes every parameter with its registered name and shape, one unit at a time") {
  TempFile f;
  const Params trained = run(3, 3, 2, "", f.str());
  const SafetensorsFile file = SafetensorsFile::open(f.str());
  CHECK(file.tensors().size() == trained.size());
  CHECK(file.tensor("a.w").shape == std::vector<int64_t>{7, 13});
  CHECK(file.tensor("b.s").shape.empty());
  for (const auto& [name, values] : trained) {
    CAPTURE(name);
    CHECK(file.tensor(name).dtype == "F32");
    std::vector<float> got(values.size());
    file.read(name, std::as_writable_bytes(std::span(got)));
    CHECK(same_bits(got, values));
  }

  TempFile half;
  run(2, 1, 2, "", half.str(), DType::kBFloat16);
  const SafetensorsFile bf = SafetensorsFile::open(half.str());
  CHECK(bf.tensor("c.w").dtype == "BF16");
}

TEST_CASE("import sets every rank's shards from the file, on another world size and stage") {
  TempFile f;
  const Params exported = run(4, 2, 3, "", f.str());
  for (int world : {1, 2, 3}) {
    for (int stage : {0, 1, 3}) {
      CAPTURE(world);
      CAPTURE(stage);
      std::vector<float> state;
      const Params imported = run(world, stage, 0, f.str(), "", DType::kFloat32, &state);
      for (const auto& [name, values] : exported) {
        CAPTURE(name);
        CHECK(same_bits(imported.at(name), values));
      }
      CHECK(std::all_of(state.begin(), state.end(), [](float x) { return x == 0.0f; }));
    }
  }
}

TEST_CASE("import failures name the file, the tensor and the problem") {
  const auto write = [](const std::string& path, std::vector<SafetensorsEntry> entries,
                        const std::vector<std::vector<float>>& data) {
    SafetensorsWriter w(path, entries);
    for (size_t i = 0; i < entries.size(); ++i) w.write_tensor(entries[i].name, std::as_bytes(std::span(data[i])));
    w.finish();
  };
  // The harness model, complete and correct, as a base to break.
  std::vector<SafetensorsEntry> entries = {{"a.w", "F32", {7, 13}}, {"a.b", "F32", {7}}, {"b.w", "F32", {5, 7}},
                                           {"b.b", "F32", {5}},     {"b.s", "F32", {}},  {"c.w", "F32", {11, 3}}};
  std::vector<std::vector<float>> data = {std::vector<float>(91, 0.5f), std::vector<float>(7, 0.5f),
                                          std::vector<float>(35, 0.5f), std::vector<float>(5, 0.5f),
                                          std::vector<float>(1, 0.5f),  std::vector<float>(33, 0.5f)};
  TempFile f;
  const auto import = [&] { run(2, 2, 0, f.str(), ""); };

  SUBCASE("the complete file imports") {
    write(f.str(), entries, data);
    CHECK_NOTHROW(import());
  }
  SUBCASE("a missing tensor") {
    write(f.str(), {entries.begin(), entries.end() - 1}, {data.begin(), data.end() - 1});
    CHECK_THROWS_WITH_AS(import(), doctest::Contains("has no tensor 'c.w' (registered in unit 'c' with shape [11, 3])"),
                         Error);
  }
  SUBCASE("a wrong shape") {
    entries[5].shape = {3, 11};
    write(f.str(), entries, data);
    CHECK_THROWS_WITH_AS(import(), doctest::Contains("tensor 'c.w' has shape [3, 11], the model registers [11, 3]"),
                         Error);
  }
  SUBCASE("an unknown tensor") {
    entries.push_back({"extra", "F32", {2}});
    data.push_back({1.0f, 2.0f});
    write(f.str(), entries, data);
    CHECK_THROWS_WITH_AS(import(), doctest::Contains("a tensor 'extra' that the model does not register"), Error);
  }
  SUBCASE("a non-finite value") {
    data[0][17] = INFINITY;
    write(f.str(), entries, data);
    CHECK_THROWS_WITH_AS(import(), doctest::Contains("tensor 'a.w': element 17 is not finite (NaN or Inf)"), Error);
  }
}

TEST_CASE("a file written by another implementation imports, and ours reads there") {
  // tests/tools/safetensors_interop.py: an independent reader and writer of
  // the published format (standard library only). It reads our export
  // strictly and writes the tensors back in another order, with metadata and
  // an unpadded header.
  TempFile ours, theirs;
  const Params exported = run(2, 2, 2, "", ours.str());
  const std::string cmd = fmt::format("python3 {}/tests/tools/safetensors_interop.py rewrite {} {}", ZEST_SOURCE_DIR,
                                      ours.str(), theirs.str());
  REQUIRE(std::system(cmd.c_str()) == 0);
  const SafetensorsFile file = SafetensorsFile::open(theirs.str());
  CHECK(file.metadata().at("written_by") == "safetensors_interop.py");
  const Params imported = run(3, 3, 0, theirs.str(), "");
  for (const auto& [name, values] : exported) {
    CAPTURE(name);
    CHECK(same_bits(imported.at(name), values));
  }
}
