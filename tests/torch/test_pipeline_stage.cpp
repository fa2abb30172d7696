// Pipeline stages (torch/pipeline_stage.h) on in-process ranks: a 4-layer
// model cut into 2 and 4 stages, 1F1B and GPipe, against the whole model on
// one rank accumulating the same micro-batches. Each stage runs the same
// kernels on the same values as the whole model (a stage's backward starts
// from the very gradient autograd would have passed across the cut), and the
// micro-batches' gradients are added in the same order, so the masters are
// compared bit for bit; likewise dp x pp = 2 x 2 at ZeRO stages 0-3 against
// dp = 2 without a pipeline. Last, dp x tp x pp = 2 x 2 x 2 with
// tensor-parallel layers inside the stages against the one-rank model,
// within test_tensor_parallel.cpp's tolerance, and bit for bit across
// stages within the mesh.
#include <mutex>

#include <fmt/format.h>

#include "torch_doctest.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/engine/engine.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/raw_allocator.h"
#include "zest/mesh/device_mesh.h"
#include "zest/torch/pipeline_stage.h"
#include "zest/torch/tensor_parallel.h"
#include "zest/torch/torch_module.h"
#include "../error_of.h"

namespace test_pipeline_stage {

using namespace zest;

namespace {

constexpr int64_t kWidth = 16, kRows = 8, kLayers = 4;
constexpr int kMicroBatches = 6, kSteps = 3;

// Layers [first, first + count) of the whole model, named as the whole
// model names them, so masters compare by name.
struct Piece : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;
  Piece(int first, int count) {
    for (int i = 0; i < kLayers; ++i) {
      // Every layer is drawn, in order, so each has the whole model's values.
      torch::nn::Linear l(kWidth, kWidth);
      if (i >= first && i < first + count) layers.push_back(register_module("l" + std::to_string(i), l));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::tanh(l(x));
    return x;
  }
};

std::shared_ptr<Piece> make_piece(int first, int count) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(99);
  return std::make_shared<Piece>(first, count);
}

// Micro-batch mb of step s: inputs and targets, rows [row0, row0 + rows).
std::pair<torch::Tensor, torch::Tensor> micro_batch(int s, int mb, int64_t row0, int64_t rows) {
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(static_cast<uint64_t>(1000 * s + mb));
  const torch::Tensor x = torch::randn({kRows, kWidth}, gen);
  const torch::Tensor y = torch::randn({kRows, kWidth}, gen);
  return {x.narrow(0, row0, rows), y.narrow(0, row0, rows)};
}

EngineConfig config(int stage) {
  EngineConfig c;
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.reduce_bucket_size = 100;
  c.gradient_accumulation_steps = kMicroBatches;
  c.optimizer.kind = OptimizerKind::kAdamW;
  c.optimizer.lr = 0.01f;
  c.optimizer.weight_decay = 0.01f;
  return c;
}

using Masters = std::map<std::string, std::vector<float>>;

Masters masters_of(Engine& engine) {
  Masters out;
  for (const UnitLayout& u : engine.layout().units())
    for (const ParamLayout& p : u.params) out[p.name] = engine.param_master(p.name);
  return out;
}

// The whole model on `dp` ranks (no pipeline): each micro-batch forward,
// backward and micro-step in turn.
Masters train_whole(Communicator& dp, int stage) {
  torch::set_num_threads(1);
  CachingAllocator alloc(make_host_allocator());
  Engine engine(config(stage), dp, alloc, Stream::default_for(Device::host()));
  auto model = make_piece(0, kLayers);
  TorchModule zt(engine, model);
  const int64_t rows = kRows / dp.size();
  for (int s = 0; s < kSteps; ++s)
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      const auto [x, y] = micro_batch(s, mb, rows * dp.rank(), rows);
      torch::Tensor h = x;
      for (auto& l : model->layers) h = zt.call(*l, [&] { return torch::tanh(l(h)); });
      zt.scale(torch::mse_loss(h, y)).backward();
      const StepResult r = zt.step();
      REQUIRE(r.boundary == (mb == kMicroBatches - 1));
    }
  return masters_of(engine);
}

// This rank's stage of the mesh's pipeline, ZeRO over its dp group.
Masters train_stage(const DeviceMesh& mesh, int stage, PipelineKind kind, std::vector<double>* losses = nullptr) {
  torch::set_num_threads(1);
  Communicator& dp = mesh.dp();
  Communicator& pp = mesh.pp();
  CachingAllocator alloc(make_host_allocator());
  Engine engine(config(stage), dp, alloc, Stream::default_for(Device::host()));
  engine.set_model_parallel(mesh.engine_model_parallel());
  const int per_stage = static_cast<int>(kLayers) / pp.size();
  auto piece = make_piece(pp.rank() * per_stage, per_stage);
  TorchModule zt(engine, piece);
  const int64_t rows = kRows / dp.size();
  PipelineOptions po;
  po.schedule = kind;
  po.micro_batches = kMicroBatches;
  po.activation_shape = {rows, kWidth};
  PipelineStage pipe(pp, zt, po);
  for (int s = 0; s < kSteps; ++s) {
    const PipelineStage::Result r = pipe.run(
        [&](int mb, const torch::Tensor& in) {
          torch::Tensor h = in.defined() ? in : micro_batch(s, mb, rows * dp.rank(), rows).first;
          for (auto& l : piece->layers) h = zt.call(*l, [&] { return torch::tanh(l(h)); });
          return h;
        },
        [&](int mb, const torch::Tensor& out) {
          return torch::mse_loss(out, micro_batch(s, mb, rows * dp.rank(), rows).second);
        });
    REQUIRE(r.step.boundary);
    REQUIRE(r.step.applied);
    if (losses) losses->push_back(r.loss);
  }
  return masters_of(engine);
}

// Every stage's masters, merged by name (each name on one stage).
struct Collected {
  std::mutex mutex;
  Masters all;
  void add(const Masters& m) {
    const std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [k, v] : m) {
      REQUIRE(all.count(k) == 0);
      all[k] = v;
    }
  }
};

}  // namespace

TEST_CASE("a pipeline of 2 and 4 stages trains the whole model, bit for bit, 1F1B and GPipe") {
  Masters whole;
  run_inprocess(1, [&](Communicator& c) { whole = train_whole(c, 0); });
  REQUIRE(whole.size() == 2 * kLayers);
  for (const int stages : {2, 4})
    for (const PipelineKind kind : {PipelineKind::k1F1B, PipelineKind::kGPipe}) {
      CAPTURE(stages);
      CAPTURE(pipeline_kind_name(kind));
      Collected got;
      std::vector<std::vector<double>> losses(static_cast<size_t>(stages));
      run_inprocess(stages, [&](Communicator& world) {
        const DeviceMesh mesh(world, {.dp = 1, .tp = 1, .pp = stages});
        got.add(train_stage(mesh, 0, kind, &losses[static_cast<size_t>(mesh.pp_rank())]));
      });
      CHECK(got.all == whole);
      for (const auto& l : losses) CHECK(l == losses.back());  // every stage reports the last one's loss
    }
}

TEST_CASE("dp x pp = 2 x 2 at ZeRO stages 0-3 equals dp = 2 without a pipeline, bit for bit") {
  for (const int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    std::vector<Masters> whole(2);
    run_inprocess(2, [&](Communicator& dp) { whole[static_cast<size_t>(dp.rank())] = train_whole(dp, stage); });
    CHECK(whole[0] == whole[1]);
    Collected got;
    run_inprocess(4, [&](Communicator& world) {
      const DeviceMesh mesh(world, {.dp = 2, .tp = 1, .pp = 2});
      const Masters m = train_stage(mesh, stage, PipelineKind::k1F1B);
      if (mesh.dp_rank() == 0) got.add(m);
    });
    CHECK(got.all == whole[0]);
  }
}

TEST_CASE("a pipeline stage refuses a mismatched accumulation and a wrong activation shape, naming them") {
  const std::string acc = test::error_of([] {
    run_inprocess(1, [](Communicator& c) {
      CachingAllocator alloc(make_host_allocator());
      EngineConfig cfg = config(0);
      cfg.gradient_accumulation_steps = 2;
      Engine engine(cfg, c, alloc, Stream::default_for(Device::host()));
      TorchModule zt(engine, make_piece(0, 1));
      PipelineOptions po;
      po.micro_batches = 3;
      po.activation_shape = {kRows, kWidth};
      PipelineStage pipe(c, zt, po);
    });
  });
  CAPTURE(acc);
  CHECK(acc.find("runs 3 micro-batches per batch but the engine's gradient_accumulation_steps is 2") !=
        std::string::npos);
  const std::string shape = test::error_of([] {
    run_inprocess(2, [](Communicator& pp) {
      torch::set_num_threads(1);
      std::unique_ptr<Communicator> dp = pp.split(pp.rank(), 0);
      CachingAllocator alloc(make_host_allocator());
      Engine engine(config(0), *dp, alloc, Stream::default_for(Device::host()));
      auto piece = make_piece(pp.rank(), 1);
      TorchModule zt(engine, piece);
      PipelineOptions po;
      po.micro_batches = kMicroBatches;
      po.activation_shape = {kRows, kWidth + 1};
      PipelineStage pipe(pp, zt, po);
      (void)pipe.run([&](int, const torch::Tensor&) { return piece->forward(torch::ones({kRows, kWidth})); },
                     [&](int, const torch::Tensor& out) { return out.sum(); });
    });
  });
  CAPTURE(shape);
  CHECK(shape.find("pipeline stage 0: the forward's output is [8, 16] Float, not PipelineOptions' activation "
                   "[8, 17] Float") != std::string::npos);
}

namespace {

// dp x tp x pp: an embedding, two MLP blocks and a vocabulary-parallel head,
// tensor-parallel layers over `tp`, cut into two stages (embedding and the
// first block; the second block and the head). Every layer is drawn, in
// order, on every rank, so each keeps the whole model's values.
struct TpPiece : torch::nn::Module {
  static constexpr int64_t kVocab = 16, kDim = 8, kTime = 4;
  tp::VocabParallelEmbedding emb{nullptr};
  std::vector<std::pair<tp::ColumnParallelLinear, tp::RowParallelLinear>> blocks;
  tp::ColumnParallelLinear head{nullptr};
  bool first, last;
  TpPiece(Communicator& tp_group, int stage, int stages) : first(stage == 0), last(stage == stages - 1) {
    tp::VocabParallelEmbedding e(tp_group, tp::VocabParallelEmbeddingOptions(kVocab, kDim));
    if (first) emb = register_module("emb", e);
    for (int b = 0; b < 2; ++b) {
      tp::ColumnParallelLinear up(tp_group, tp::ParallelLinearOptions(kDim, 4 * kDim));
      tp::RowParallelLinear down(tp_group, tp::ParallelLinearOptions(4 * kDim, kDim));
      if ((b == 0 && first) || (b == 1 && last)) {
        blocks.emplace_back(register_module(fmt::format("b{}_up", b), up), register_module(fmt::format("b{}_down", b), down));
      }
    }
    tp::ColumnParallelLinear h(tp_group, tp::ParallelLinearOptions(kDim, kVocab).bias(false));
    if (last) head = register_module("head", h);
  }
  torch::Tensor forward(TorchModule& zt, torch::Tensor x) {
    if (first) x = zt.call(*emb, [&] { return emb(x); });
    for (auto& [up, down] : blocks) {
      const torch::Tensor u = zt.call(*up, [&] { return torch::gelu(up(x)); });
      x = x + zt.call(*down, [&] { return down(u); });
    }
    return last ? zt.call(*head, [&] { return head(x); }) : x;
  }
};

std::pair<torch::Tensor, torch::Tensor> token_batch(int s, int mb, int64_t row0, int64_t rows) {
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(static_cast<uint64_t>(5000 + 100 * s + mb));
  const torch::Tensor seq = torch::randint(TpPiece::kVocab, {kRows, TpPiece::kTime + 1}, gen);
  return {seq.narrow(1, 0, TpPiece::kTime).narrow(0, row0, rows), seq.narrow(1, 1, TpPiece::kTime).narrow(0, row0, rows)};
}

struct MeshRun {
  std::map<std::string, torch::Tensor> masters;  // in the parameters' shapes
  std::vector<double> norms;
};

// This rank's part of the 3D run (or the whole model, with a mesh of one),
// clipped by the global norm.
MeshRun train_3d(const DeviceMesh& mesh, int stage) {
  torch::set_num_threads(1);
  CachingAllocator alloc(make_host_allocator());
  EngineConfig c = config(stage);
  c.gradient_clipping = 0.01;  // below every norm seen: each step clips
  Engine engine(c, mesh.dp(), alloc, Stream::default_for(Device::host()));
  engine.set_model_parallel(mesh.engine_model_parallel());
  std::shared_ptr<TpPiece> piece;
  {
    static std::mutex mutex;
    const std::lock_guard<std::mutex> lock(mutex);
    torch::manual_seed(4242);
    piece = std::make_shared<TpPiece>(mesh.tp(), mesh.pp_rank(), mesh.shape().pp);
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : piece->named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  TorchModule zt(engine, piece);
  const int64_t rows = kRows / mesh.dp().size();
  PipelineOptions po;
  po.micro_batches = kMicroBatches;
  po.activation_shape = {rows, TpPiece::kTime, TpPiece::kDim};
  PipelineStage pipe(mesh.pp(), zt, po);
  MeshRun out;
  for (int s = 0; s < kSteps; ++s) {
    const PipelineStage::Result r = pipe.run(
        [&](int mb, const torch::Tensor& in) {
          return piece->forward(zt, in.defined() ? in : token_batch(s, mb, rows * mesh.dp_rank(), rows).first);
        },
        [&](int mb, const torch::Tensor& logits) {
          return tp::vocab_parallel_cross_entropy(logits, token_batch(s, mb, rows * mesh.dp_rank(), rows).second,
                                                  mesh.tp())
              .mean();
        });
    REQUIRE(r.step.applied);
    CHECK(r.step.clipped);
    out.norms.push_back(r.step.grad_norm);
  }
  for (const auto& [name, shape] : shapes)
    out.masters[name] = torch::tensor(engine.param_master(name)).reshape(shape);
  return out;
}

}  // namespace

// The tolerance of test_tensor_parallel.cpp's trained model: tp splits sums
// in two (a few fp32 ulps of O(1) values per step), AdamW carries the
// relative difference into updates of lr 1e-2: 1e-5 on weights after 3
// steps; the norm, summed in another order, 1e-6 relative.
TEST_CASE("dp x tp x pp = 2 x 2 x 2 trains the one-rank model, bit for bit across ZeRO stages") {
  MeshRun whole;
  run_inprocess(1, [&](Communicator& world) {
    const DeviceMesh mesh(world, {.dp = 1, .tp = 1, .pp = 1});
    whole = train_3d(mesh, 0);
  });
  std::vector<std::map<std::string, torch::Tensor>> stage0(8);
  for (const int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    run_inprocess(8, [&](Communicator& world) {
      const DeviceMesh mesh(world, {.dp = 2, .tp = 2, .pp = 2});
      const MeshRun mine = train_3d(mesh, stage);
      for (size_t s = 0; s < whole.norms.size(); ++s)
        CHECK(mine.norms[s] == doctest::Approx(whole.norms[s]).epsilon(1e-6));
      for (const auto& [name, value] : mine.masters) {
        CAPTURE(name);
        // Row-parallel weights are split along columns, the replicated
        // row-parallel biases not at all, the rest along rows.
        const bool row_weight = name.find("_down.weight") != std::string::npos;
        const bool replicated = name.find("_down.bias") != std::string::npos;
        const torch::Tensor& w = whole.masters.at(name);
        const torch::Tensor expect = replicated ? w : w.chunk(2, row_weight ? 1 : 0)[static_cast<size_t>(mesh.tp_rank())];
        CHECK((value - expect).abs().max().item<double>() < 1e-5);
        if (stage == 0) {
          stage0[static_cast<size_t>(world.rank())][name] = value;
        } else {
          CHECK(torch::equal(value, stage0[static_cast<size_t>(world.rank())].at(name)));
        }
      }
    });
  }
}

}  // namespace test_pipeline_stage
