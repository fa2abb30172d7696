// Pipeline stages (torch/pipeline_stage.h) on in-process ranks: a 4-layer
// model cut into 2 and 4 stages, 1F1B and GPipe, against the whole model on
// one rank accumulating the same micro-batches. Each stage runs the same
// kernels on the same values as the whole model (a stage's backward starts
// from the very gradient autograd would have passed across the cut), and the
// micro-batches' gradients are added in the same order, so the masters are
// compared bit for bit; likewise dp x pp = 2 x 2 at ZeRO stages 0-3 against
// dp = 2 without a pipeline.
#include <mutex>

#include "torch_doctest.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/engine/engine.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/raw_allocator.h"
#include "zest/mesh/device_mesh.h"
#include "zest/torch/pipeline_stage.h"
#include "zest/torch/torch_module.h"
#include "../error_of.h"

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
