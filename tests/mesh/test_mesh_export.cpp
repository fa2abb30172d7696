// Weight export from a dp x tp x pp mesh (checkpoint/whole_model.h): the
// file a mesh writes is, byte for byte, the file one rank holding the whole
// model writes, for every mesh of sizes 1 and 2. The model has what the
// joining must get right: several units per stage, a unit of one name on
// both stages (TorchModule's root unit: embeddings first, final norm and
// head last), splits along dim 0 with strides 1 and 3, along dim 1, along
// the middle dim of a 3-D tensor with stride 2, replicated parameters, and
// two parameter groups (the layout orders a unit's parameters by group).
// The values are multiples of 1/16 below 1: exact in fp32 and bf16, so the
// two files match exactly.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/temp_dir.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/file_io.h"
#include "zest/engine/engine.h"
#include "zest/hf/hf_export.h"
#include "zest/memory/raw_allocator.h"
#include "zest/mesh/device_mesh.h"

namespace test_mesh_export {

using namespace zest;
namespace fs = std::filesystem;

namespace {

struct Param {
  std::string name;
  std::vector<int64_t> shape;   // whole
  std::optional<TpSplit> split;  // none: replicated over tp
  int stage;                     // with pp = 2
  std::string unit;
};

// In whole-model order: a unit's first appearance places it.
std::vector<Param> model() {
  return {{"emb.w", {8, 6}, TpSplit{0, 1}, 0, "root"},
          {"b0.qkv.w", {12, 6}, TpSplit{0, 3}, 0, "b0"},
          {"b0.qkv.b", {12}, TpSplit{0, 3}, 0, "b0"},
          {"b0.proj.w", {6, 8}, TpSplit{1, 1}, 0, "b0"},
          {"b0.proj.b", {6}, std::nullopt, 0, "b0"},
          {"b1.ln.g", {6}, std::nullopt, 0, "b1"},
          {"b1.fc.w", {2, 8, 3}, TpSplit{1, 2}, 0, "b1"},
          {"final.g", {6}, std::nullopt, 1, "root"},
          {"final.b", {6}, std::nullopt, 1, "root"},
          {"head.w", {8, 6}, TpSplit{0, 1}, 1, "root"},
          {"b2.up.w", {16, 6}, TpSplit{0, 1}, 1, "b2"},
          {"b2.down.w", {6, 16}, TpSplit{1, 1}, 1, "b2"},
          {"b2.down.b", {6}, std::nullopt, 1, "b2"},
          {"b3.qkv.w", {24, 4}, TpSplit{0, 3}, 1, "b3"}};
}

// Tp rank t's slice of the whole: along split.dim, `stride` blocks each cut
// into tp pieces, piece t of each (zest::tp::partition's definition).
std::vector<int64_t> slice_shape(const Param& p, int tp) {
  std::vector<int64_t> s = p.shape;
  if (p.split) s[static_cast<size_t>(p.split->dim)] /= tp;
  return s;
}

// The whole tensor's flat index of slice element i on tp rank t.
int64_t whole_index(const Param& p, int tp, int t, int64_t i) {
  if (!p.split || tp == 1) return i;
  const auto d = static_cast<size_t>(p.split->dim);
  const std::vector<int64_t> s = slice_shape(p, tp);
  int64_t inner = 1;
  for (size_t k = d + 1; k < s.size(); ++k) inner *= s[k];
  const int64_t outer = i / (s[d] * inner), row = i / inner % s[d], in = i % inner;
  const int64_t piece = s[d] / p.split->stride;
  const int64_t whole_row = (row / piece * tp + t) * piece + row % piece;
  return (outer * p.shape[d] + whole_row) * inner + in;
}

float initial(const std::string& name, int64_t g) {
  int h = 0;
  for (const char c : name) h = (h * 31 + c) % 13;
  return static_cast<float>((g * 5 + h) % 15 - 7) * 0.0625f;
}

EngineConfig config() {
  EngineConfig c;
  c.zero.stage = 3;  // the masters are sharded: unit_master gathers them
  c.optimizer.lr = 0.01f;
  return c;
}

// One rank's engine of `mesh`'s part of the model, with its initial values.
std::unique_ptr<Engine> build(const DeviceMesh& mesh, CachingAllocator& alloc, const std::vector<Param>& params) {
  const MeshShape s = mesh.shape();
  auto engine = std::make_unique<Engine>(config(), mesh.dp(), alloc, Stream::default_for(Device::host()));
  engine->set_model_parallel(mesh.engine_model_parallel());
  engine->add_param_group("no_decay", 0.0f);
  std::vector<std::string> order;
  std::map<std::string, std::vector<ParamSpec>> units;
  std::map<std::string, const Param*> by_name;
  for (const Param& p : params) {
    if (s.pp > 1 && p.stage != mesh.pp_rank()) continue;
    ParamSpec spec{p.name, slice_shape(p, s.tp), p.shape.size() == 1 ? "no_decay" : "default"};
    spec.tp_replicated = s.tp > 1 && !p.split;
    if (s.tp > 1) spec.tp_split = p.split;
    if (!units.count(p.unit)) order.push_back(p.unit);
    units[p.unit].push_back(spec);
    by_name[p.name] = &p;
  }
  for (const std::string& u : order) engine->add_unit(u, units[u]);
  const int tp = s.tp, t = mesh.tp_rank();
  engine->finalize(
      [&](const ParamLayout& pl, std::span<float> v) {
        for (size_t i = 0; i < v.size(); ++i) {
          v[i] = initial(pl.name, whole_index(*by_name.at(pl.name), tp, t, static_cast<int64_t>(i)));
        }
      },
      InitFrom::kEveryRank);
  return engine;
}

std::string file_bytes(const fs::path& path) { return zest::read_text_file(path.string()); }

// Every file of a directory, by name.
std::map<std::string, std::string> dir_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = file_bytes(e);
  return out;
}

HfExportOptions hf_options() {
  HfExportOptions o;
  o.config_json = R"({"model_type": "test"})";
  o.max_shard_size = 600;  // bytes of bf16: several shards and an index
  return o;
}

// The mesh's exports: a safetensors file in fp32 and in bf16, and a Hugging
// Face directory.
void export_all(const MeshShape& shape, const std::vector<Param>& params, const test::TempDir& dir) {
  run_inprocess(shape.world(), [&](Communicator& world) {
    DeviceMesh mesh(world, shape);
    CachingAllocator alloc(make_host_allocator());
    std::unique_ptr<Engine> engine = build(mesh, alloc, params);
    export_weights(*engine, dir / "model.safetensors");
    export_weights(*engine, dir / "model_bf16.safetensors", {.dtype = DType::kBFloat16});
    export_hf(*engine, dir / "hf", hf_options());
  });
}

}  // namespace

TEST_CASE("a dp x tp x pp mesh exports the file one rank writes, byte for byte") {
  const std::vector<Param> params = model();
  test::TempDir want;
  export_all({1, 1, 1}, params, want);
  const std::map<std::string, std::string> want_hf = dir_bytes(want.path / "hf");
  REQUIRE(want_hf.count("model.safetensors.index.json") == 1);  // sharded
  for (const MeshShape shape : {MeshShape{2, 2, 2}, MeshShape{1, 2, 1}, MeshShape{1, 1, 2}, MeshShape{2, 1, 1},
                                MeshShape{2, 2, 1}, MeshShape{2, 1, 2}, MeshShape{1, 2, 2}}) {
    CAPTURE(shape.str());
    test::TempDir got;
    export_all(shape, params, got);
    CHECK(file_bytes(got.path / "model.safetensors") == file_bytes(want.path / "model.safetensors"));
    CHECK(file_bytes(got.path / "model_bf16.safetensors") == file_bytes(want.path / "model_bf16.safetensors"));
    CHECK(dir_bytes(got.path / "hf") == want_hf);
  }
}

TEST_CASE("a mesh export refuses a split parameter whose split is unknown, naming it, on every rank") {
  test::TempDir dir;
  std::vector<std::string> errors(8);
  run_inprocess(8, [&](Communicator& world) {
    DeviceMesh mesh(world, {2, 2, 2});
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config(), mesh.dp(), alloc, Stream::default_for(Device::host()));
    engine.set_model_parallel(mesh.engine_model_parallel());
    // first.w is a slice (not tp_replicated) without its split: which
    // rows of the whole it holds is unknown, so it is not guessed.
    ParamSpec split_unknown{mesh.pp_rank() == 0 ? "first.w" : "last.w", {4, 6}};
    ParamSpec replicated{mesh.pp_rank() == 0 ? "first.b" : "last.b", {6}};
    replicated.tp_replicated = true;
    engine.add_unit(mesh.pp_rank() == 0 ? "first" : "last", {split_unknown, replicated});
    engine.finalize([](const ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.5f); });
    try {
      export_weights(engine, dir / "never.safetensors");
    } catch (const Error& e) {
      errors[static_cast<size_t>(world.rank())] = e.message();
    }
  });
  for (const std::string& e : errors) {
    CHECK(e.find("parameter 'first.w' (unit 'first', pp rank 0) is split over the tp ranks, but how is unknown: "
                 "register it with ParamSpec::tp_split") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir / "never.safetensors"));
}

TEST_CASE("a mesh export that fails on the writer fails on every rank of the mesh") {
  const std::vector<Param> params = model();
  test::TempDir dir;
  const std::string path = dir / "no_such_dir/model.safetensors";
  std::vector<std::string> errors(8);
  run_inprocess(8, [&](Communicator& world) {
    DeviceMesh mesh(world, {2, 2, 2});
    CachingAllocator alloc(make_host_allocator());
    std::unique_ptr<Engine> engine = build(mesh, alloc, params);
    try {
      export_weights(*engine, path);
    } catch (const Error& e) {
      errors[static_cast<size_t>(world.rank())] = e.message();
    }
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r);
    CHECK(errors[r].find("no_such_dir") != std::string::npos);
    if (r > 0) CHECK(errors[r].find("opening the weights file failed") != std::string::npos);
  }
}

}  // namespace test_mesh_export
