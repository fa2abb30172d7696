// The engine over a mesh's dp group, with the model-parallel group for what
// is global to the model: a model whose weights are split in halves across
// tp ranks (and its units across pp stages), with parameters replicated
// across tp, takes the same clipped steps and reports the same gradient
// norm as one rank holding the whole model.
//
// Note [bitwise across tp]. The norm is summed in chunks of 256 elements of
// each unit's flat buffer (optim/grad_norm.h), each chunk in double, and the
// chunk sums are added exactly. Where every tp slice is a run of whole
// chunks of the full parameter (a row split of a row-major weight whose
// halves are multiples of 256 elements, in units laid out on chunk
// boundaries), every chunk is summed the same way on the slice's rank as on
// the one rank, and a replicated parameter's chunks are summed on tp rank 0
// only (zeros elsewhere): the norm, the clip coefficient and every update
// have the bits of the one-rank run, which the first test asserts.
//
// A column split of a row-major weight is not a run of chunks: a chunk of
// the one-rank run holds elements of both halves, so its sum rounds
// differently from the halves' sums. Each chunk sum of n <= 256 squares
// (Note [float lanes, double fallback], optim/chunk_sum_order.h: a lane adds
// at most 4 squares into each of two floats, then the two, and the tree is
// in double) is within 5u of its exact value (u = 2^-24; the terms are not
// negative, and the tree's 2^-48 is below the last digit), so each run's
// total is within 5u of the exact sum of squares: the two squared norms
// differ by at most 10u relative, the norms by 5u = 2.98e-7, asserted as
// 3e-7. The clip coefficient is rounded once to fp32
// (optim/step_decision.h), so the two coefficients differ by at most 5u plus
// one fp32 ulp (2u), 7u; with SGD a parameter then moves by lr x coefficient
// x gradient within 7u of the one-rank step, and each update rounds once
// more to fp32: after 3 steps of |lr x c x g| <= 0.1 x 1 x 2 and |w| <= 1,
// at most 3 x (0.2 x 7u + u) = 7.2u < 4.3e-7, asserted as 4.5e-7. (The
// gradients here are quarter integers, whose sums floats hold exactly, so
// this data meets the bounds with room.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "zest/comm/inprocess_comm.h"
#include "zest/engine/engine.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/memory/raw_allocator.h"
#include "zest/mesh/device_mesh.h"

using namespace zest;

namespace {

// A parameter of the whole model and how tp slices it.
enum class Split { kRows, kColumns, kReplicated };
struct Param {
  std::string name;
  int64_t rows, cols;  // the whole parameter (cols = 1 for a vector)
  Split split;
  int stage;  // pipeline stage of its unit (with pp = 2)
  std::string unit;
};

// Bitwise layout: row splits of 2 x 256-multiples, a replicated vector, and
// a mixed unit (a split weight and a replicated bias).
std::vector<Param> aligned_model() {
  return {{"col.w", 32, 32, Split::kRows, 0, "col"},
          {"norm.g", 256, 1, Split::kReplicated, 0, "norm"},
          {"mix.w", 16, 32, Split::kRows, 1, "mix"},
          {"mix.b", 256, 1, Split::kReplicated, 1, "mix"}};
}

// Column splits: the one-rank chunks straddle the halves.
std::vector<Param> column_model() {
  return {{"row.w", 16, 48, Split::kColumns, 0, "row"},
          {"row.b", 16, 1, Split::kReplicated, 0, "row"},
          {"out.w", 40, 24, Split::kRows, 1, "out"}};
}

int64_t local_numel(const Param& p, int tp) {
  return p.split == Split::kReplicated ? p.rows * p.cols : p.rows * p.cols / tp;
}

// The index in the whole parameter of tp rank t's local element i.
int64_t global_index(const Param& p, int tp, int t, int64_t i) {
  switch (p.split) {
    case Split::kReplicated: return i;
    case Split::kRows: return i + t * (p.rows / tp) * p.cols;
    case Split::kColumns: {
      const int64_t local_cols = p.cols / tp;
      return (i / local_cols) * p.cols + t * local_cols + i % local_cols;
    }
  }
  return -1;
}

uint32_t name_hash(const std::string& s) {
  uint32_t h = 2166136261u;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return h % 1000;
}

// Exact in fp32, and their average over 2 ranks too.
float initial(const std::string& name, int64_t g) {
  return static_cast<float>(static_cast<int>((g * 3 + name_hash(name)) % 13) - 6) * 0.0625f;
}
float gradient(const std::string& name, int64_t g, int step, int dp_rank) {
  return static_cast<float>(static_cast<int>((g * 7 + step * 5 + dp_rank * 3 + name_hash(name)) % 17) - 8) * 0.25f;
}

struct Outcome {
  std::vector<double> norms;                        // per step, of world rank 0
  std::vector<std::vector<double>> rank_norms;      // per world rank
  std::map<std::string, std::vector<float>> whole;  // the whole parameters, after the steps
};

constexpr int kSteps = 3;

// One rank's run on a mesh of `shape` (tp 1, pp 1: the whole model),
// gradients averaged over `dp_for_grads` ranks' formulas. Returns its norms
// and writes its slices into `whole` at their global indices.
void run_rank(DeviceMesh& mesh, const std::vector<Param>& model, EngineConfig config, int dp_for_grads,
              Outcome& out, std::mutex& m) {
  const MeshShape s = mesh.shape();
  const int tp = s.tp, t = mesh.tp_rank();
  CachingAllocator alloc(make_host_allocator());
  Engine engine(config, mesh.dp(), alloc, Stream::default_for(Device::host()));
  engine.set_model_parallel(mesh.engine_model_parallel());
  std::map<std::string, std::vector<ParamSpec>> units;
  std::vector<std::string> order;
  std::map<std::string, const Param*> by_name;
  for (const Param& p : model) {
    if (s.pp > 1 && p.stage != mesh.pp_rank()) continue;
    std::vector<int64_t> shape = p.cols == 1 ? std::vector<int64_t>{local_numel(p, tp)}
                                             : std::vector<int64_t>{p.rows, p.cols};
    if (p.cols > 1 && p.split == Split::kRows) shape[0] /= tp;
    if (p.cols > 1 && p.split == Split::kColumns) shape[1] /= tp;
    ParamSpec spec{p.name, shape};
    spec.tp_replicated = p.split == Split::kReplicated;
    if (!units.count(p.unit)) order.push_back(p.unit);
    units[p.unit].push_back(spec);
    by_name[p.name] = &p;
  }
  std::vector<int> ids;
  for (const std::string& u : order) ids.push_back(engine.add_unit(u, units[u]));
  engine.finalize([&](const ParamLayout& pl, std::span<float> v) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = initial(pl.name, global_index(*by_name[pl.name], tp, t, static_cast<int64_t>(i)));
  }, InitFrom::kEveryRank);
  std::vector<double> norms;
  for (int step = 0; step < kSteps; ++step) {
    for (size_t k = 0; k < ids.size(); ++k) {
      UnitHandle h = engine.gather(ids[k]);
      GradHandle g = engine.grads(ids[k]);
      for (const ParamSpec& spec : units[order[k]]) {
        std::span<float> dw = g.grad<float>(spec.name);
        for (size_t i = 0; i < dw.size(); ++i) {
          const int64_t gi = global_index(*by_name[spec.name], tp, t, static_cast<int64_t>(i));
          if (dp_for_grads == 1) {
            // The one-rank run: the average of the dp ranks' gradients.
            dw[i] += (gradient(spec.name, gi, step, 0) + gradient(spec.name, gi, step, 1)) / 2.0f;
          } else {
            dw[i] += gradient(spec.name, gi, step, mesh.dp_rank());
          }
        }
      }
      g.done();
    }
    const StepResult r = engine.step();
    REQUIRE(r.applied);
    norms.push_back(r.grad_norm);
  }
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, p] : by_name) values[name] = engine.param_master(name);
  std::lock_guard<std::mutex> lock(m);
  out.rank_norms[static_cast<size_t>(mesh.world().rank())] = norms;
  for (const auto& [name, v] : values) {
    const Param& p = *by_name[name];
    std::vector<float>& whole = out.whole[name];
    whole.resize(static_cast<size_t>(p.rows * p.cols), NAN);
    for (size_t i = 0; i < v.size(); ++i) {
      float& slot = whole[static_cast<size_t>(global_index(p, tp, t, static_cast<int64_t>(i)))];
      // Replicated parameters and dp replicas must agree to the bit.
      if (!std::isnan(slot)) CHECK(slot == v[i]);
      slot = v[i];
    }
  }
}

Outcome run(const MeshShape& shape, const std::vector<Param>& model, const EngineConfig& config) {
  Outcome out;
  out.rank_norms.resize(static_cast<size_t>(shape.world()));
  std::mutex m;
  run_inprocess(shape.world(), [&](Communicator& world) {
    DeviceMesh mesh(world, shape);
    run_rank(mesh, model, config, shape.dp, out, m);
  });
  out.norms = out.rank_norms[0];
  // Every rank, of every stage and tp slice, reports the same norm.
  for (const auto& n : out.rank_norms) CHECK(n == out.norms);
  return out;
}

EngineConfig config_for(int stage, OptimizerKind kind) {
  EngineConfig c;
  c.zero.stage = stage;
  c.optimizer.kind = kind;
  c.optimizer.lr = 0.1f;
  c.gradient_clipping = 0.5;  // below every step's norm: clipping is on
  return c;
}

}  // namespace

TEST_CASE("dp x tp x pp with whole-chunk tp slices gives the one-rank norms and updates, bit for bit") {
  const std::vector<Param> model = aligned_model();
  const Outcome reference = run({1, 1, 1}, model, config_for(0, OptimizerKind::kAdamW));
  for (double n : reference.norms) CHECK(n > 0.5);
  struct Case {
    MeshShape shape;
    std::vector<int> stages;
  };
  const Case cases[] = {{{2, 2, 1}, {0, 1, 2, 3}}, {{1, 2, 2}, {0, 1}}, {{2, 2, 2}, {0, 1}}};
  for (const Case& c : cases) {
    for (int stage : c.stages) {
      CAPTURE(c.shape.str());
      CAPTURE(stage);
      const Outcome got = run(c.shape, model, config_for(stage, OptimizerKind::kAdamW));
      CHECK(got.norms == reference.norms);
      for (const auto& [name, want] : reference.whole) {
        CAPTURE(name);
        const std::vector<float>& have = got.whole.at(name);
        REQUIRE(have.size() == want.size());
        size_t differ = 0;
        for (size_t i = 0; i < want.size(); ++i) differ += std::memcmp(&have[i], &want[i], sizeof(float)) != 0;
        CHECK(differ == 0);
      }
    }
  }
}

TEST_CASE("column-split slices give the one-rank norm within 3e-7 and parameters within 4.5e-7") {
  // The tolerances: the top of this file.
  const std::vector<Param> model = column_model();
  const Outcome reference = run({1, 1, 1}, model, config_for(0, OptimizerKind::kSgd));
  for (const MeshShape shape : {MeshShape{2, 2, 1}, MeshShape{1, 2, 2}}) {
    CAPTURE(shape.str());
    const Outcome got = run(shape, model, config_for(1, OptimizerKind::kSgd));
    REQUIRE(got.norms.size() == reference.norms.size());
    for (size_t k = 0; k < got.norms.size(); ++k) {
      CHECK(std::fabs(got.norms[k] - reference.norms[k]) <= 3e-7 * reference.norms[k]);
    }
    for (const auto& [name, want] : reference.whole) {
      CAPTURE(name);
      const std::vector<float>& have = got.whole.at(name);
      double worst = 0.0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(have[i]) - want[i]));
      CAPTURE(worst);
      CHECK(worst <= 4.5e-7);
    }
  }
}

TEST_CASE("the engine refuses what it cannot make correct with model parallelism, by name") {
  run_inprocess(4, [](Communicator& world) {
    DeviceMesh mesh(world, {1, 2, 2});
    CachingAllocator alloc(make_host_allocator());
    const Stream stream = Stream::default_for(Device::host());
    for (int stage : {2, 3}) {  // allowed, unlike DeepSpeed: tests/torch/test_pipeline_stage.cpp
      Engine engine(config_for(stage, OptimizerKind::kAdamW), mesh.dp(), alloc, stream);
      engine.set_model_parallel(mesh.engine_model_parallel());
    }
    {
      Engine engine(config_for(1, OptimizerKind::kLamb), mesh.dp(), alloc, stream);
      CHECK_THROWS_WITH_AS(engine.set_model_parallel(mesh.engine_model_parallel()),
                           doctest::Contains("LAMB with tensor parallelism (tp 2) is refused"), Error);
    }
    {
      Engine engine(config_for(1, OptimizerKind::kAdamW), mesh.dp(), alloc, stream);
      ModelParallel wrong = mesh.engine_model_parallel();
      wrong.group = &mesh.tp();
      CHECK_THROWS_WITH_AS(engine.set_model_parallel(wrong),
                           doctest::Contains("tp 2 x pp 2 needs the model-parallel group of 4 ranks"), Error);
      engine.set_model_parallel(mesh.engine_model_parallel());
      engine.add_unit("u", {{"u.w", {256}}});
      engine.finalize([](const ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 1.0f); });
      // Exports join the parts (test_mesh_export.cpp); imports do not split a whole file yet.
      CHECK_THROWS_WITH_AS(import_weights(engine, "unused_mp.safetensors"),
                           doctest::Contains("import_weights of a model split over tp 2 x pp 2 ranks is not "
                                             "supported yet"),
                           Error);
      CHECK_THROWS_WITH_AS(engine.set_model_parallel(mesh.engine_model_parallel()),
                           doctest::Contains("set_model_parallel() after finalize()"), Error);
    }
    {
      // A DeepSpeed file's AutoTP size the program did not build.
      EngineConfig c = config_for(1, OptimizerKind::kAdamW);
      c.tensor_parallel_size = 4;
      Engine engine(c, mesh.dp(), alloc, stream);
      engine.set_model_parallel(mesh.engine_model_parallel());
      engine.add_unit("u", {{"u.w", {256}}});
      CHECK_THROWS_WITH_AS(engine.finalize([](const ParamLayout&, std::span<float>) {}),
                           doctest::Contains("tensor parallelism of 4 (tensor_parallel.autotp_size) but the "
                                             "engine's tp size is 2"),
                           Error);
    }
  });
}

TEST_CASE("a NaN gradient on one tp rank or stage skips the step on every rank of the mesh") {
  for (const MeshShape shape : {MeshShape{2, 2, 1}, MeshShape{1, 2, 2}}) {
    CAPTURE(shape.str());
    std::vector<int> applied(static_cast<size_t>(shape.world()), -1);
    run_inprocess(shape.world(), [&](Communicator& world) {
      DeviceMesh mesh(world, shape);
      CachingAllocator alloc(make_host_allocator());
      Engine engine(config_for(1, OptimizerKind::kAdamW), mesh.dp(), alloc, Stream::default_for(Device::host()));
      engine.set_model_parallel(mesh.engine_model_parallel());
      const int u = engine.add_unit("u", {{"u.w", {512}}});
      engine.finalize([](const ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 1.0f); });
      {
        UnitHandle h = engine.gather(u);
        GradHandle g = engine.grads(u);
        std::span<float> dw = g.grad<float>("u.w");
        std::fill(dw.begin(), dw.end(), 0.5f);
        // Only the last rank of the model-parallel group, a slice (or a
        // stage) the others never see.
        if (mesh.tp_rank() == 1 && mesh.pp_rank() == shape.pp - 1 && mesh.dp_rank() == 0) dw[3] = NAN;
        g.done();
      }
      const StepResult r = engine.step();
      applied[static_cast<size_t>(world.rank())] = r.applied ? 1 : 0;
    });
    // dp rank 0's NaN reaches its dp replicas through the gradient
    // reduction, and the other slices and stages through the norm.
    for (int a : applied) CHECK(a == 0);
  }
}
