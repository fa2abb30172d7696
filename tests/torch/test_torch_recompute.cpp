// Activation checkpointing (zt.checkpoint, Note [recompute]) and fp16 on the
// host backend (Note [fp16 on the host]).
#include <malloc.h>

#include <fstream>

#include <fmt/format.h>

#include "torch_harness.h"
#include "torch_doctest.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/torch/host_tensor_allocator.h"

using namespace zest;
using namespace zest::test;

namespace {

// TinyTransformer's loss with its blocks checkpointed or called plainly.
torch::Tensor transformer_loss(TinyTransformer& m, TorchModule& zt, const torch::Tensor& x, const torch::Tensor& y,
                               bool recompute) {
  torch::Tensor h = zt.call(m, [&] { return m.tok->forward(x) + m.pos; });
  for (const auto& b : {m.b0, m.b1}) {
    if (recompute) {
      h = zt.checkpoint_call(*b, [b](const torch::Tensor& in) { return b->forward(in); }, h);
    } else {
      h = zt.call(*b, [&] { return b->forward(h); });
    }
  }
  const torch::Tensor logits = zt.call(m, [&] { return m.head->forward(m.ln_f->forward(h)); });
  return torch::nn::functional::cross_entropy(logits.reshape({-1, TinyTransformer::kVocab}), y.reshape({-1}));
}

struct Run {
  std::vector<double> loss;
  std::map<std::string, std::vector<float>> params;
};

// `freeze_qkv`: each block's attention weights frozen (a frozen companion
// inside each checkpointed unit).
Run train(int stage, int world, bool recompute, bool freeze_qkv) {
  std::vector<Run> runs(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    torch::set_num_threads(1);
    CachingAllocator alloc(make_host_allocator());
    Engine engine(zest_config({}, stage), comm, alloc, Stream::default_for(Device::host()));
    auto model = std::static_pointer_cast<TinyTransformer>(make_model(Model::kTransformer));
    if (freeze_qkv) {
      model->b0->qkv->weight.set_requires_grad(false);
      model->b1->qkv->weight.set_requires_grad(false);
    }
    TorchModuleOptions o;
    o.units = model->units();
    TorchModule zt(engine, model, o);
    Run& out = runs[static_cast<size_t>(comm.rank())];
    const int64_t per_rank = kGlobalBatch / comm.size();
    for (int s = 0; s < 6; ++s) {
      const auto [x, y] = batch(Model::kTransformer, s);
      torch::Tensor loss = transformer_loss(*model, zt, x.narrow(0, per_rank * comm.rank(), per_rank),
                                            y.narrow(0, per_rank * comm.rank(), per_rank), recompute);
      zt.scale(loss).backward();
      REQUIRE(zt.step().applied);
      out.loss.push_back(loss.item<double>());
    }
    for (const UnitLayout& u : engine.layout().units())
      for (const ParamLayout& q : u.params) out.params[q.name] = engine.param_master(q.name);
  });
  for (const Run& r : runs) REQUIRE(r.params == runs[0].params);
  return runs[0];
}

int64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Wide blocks: 4 units of Linear(512, 2048) -> gelu -> Linear(2048, 512).
struct Wide : torch::nn::Module {
  std::vector<torch::nn::Sequential> blocks;
  Wide() {
    for (int i = 0; i < 4; ++i) {
      blocks.push_back(register_module(fmt::format("b{}", i),
                                       torch::nn::Sequential(torch::nn::Linear(512, 2048), torch::nn::GELU(),
                                                             torch::nn::Linear(2048, 512), torch::nn::GELU())));
    }
  }
};

}  // namespace

TEST_CASE("checkpoint: the gradients of a plain call, bit for bit, at every stage and with frozen parameters") {
  for (const bool freeze_qkv : {false, true}) {
    for (const int world : {1, 2}) {
      CAPTURE(freeze_qkv);
      CAPTURE(world);
      const Run plain = train(0, world, false, freeze_qkv);
      for (const int stage : {0, 1, 2, 3}) {
        CAPTURE(stage);
        const Run r = train(stage, world, true, freeze_qkv);
        CHECK(r.loss == plain.loss);
        CHECK(r.params == plain.params);
      }
    }
  }
}

TEST_CASE("checkpoint: what the forward keeps for backward shrinks to the blocks' inputs") {
  // A batch of 256 x 512: each block keeps its input (512 KiB) when
  // checkpointed, and its four activations (2 x 2 MiB + 2 x 512 KiB, about
  // 5 MiB) when not: about 20 MiB over 4 blocks against 2 MiB.
  const auto kept_mib = [](bool recompute) {
    double grown = 0;
    run_inprocess(1, [&](Communicator& comm) {
      torch::set_num_threads(1);
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
      auto model = make_module<Wide>();
      TorchModule zt(engine, model);
      const torch::Tensor x = torch::randn({256, 512});
      // What earlier tests freed leaves the process: growth is then new
      // memory (from malloc, or from the huge page cache if a test in this
      // process turned it on).
      malloc_trim(0);
      release_idle_host_tensors();
      const int64_t before = rss_kib();
      torch::Tensor h = x;
      for (auto& b : model->blocks) {
        if (recompute) {
          h = zt.checkpoint(b, h);
        } else {
          h = zt.forward(b, h);
        }
      }
      malloc_trim(0);  // the no_grad forward's temporaries, freed, leave too
      release_idle_host_tensors();
      grown = static_cast<double>(rss_kib() - before) / 1024.0;
      zt.scale(h.square().mean()).backward();
      CHECK(zt.step().applied);
    });
    return grown;
  };
  const double plain = kept_mib(false), recomputed = kept_mib(true);
  MESSAGE(fmt::format("forward kept {:.1f} MiB plainly, {:.1f} MiB checkpointed", plain, recomputed));
  CHECK(plain >= 15.0);
  CHECK(recomputed <= plain / 4);
}

TEST_CASE("fp16 on the host: libtorch modules train, every stage the same bits, overflow skips the step") {
  // The Mlp's Linear layers have no fp16 kernels on the CPU in libtorch 1.13:
  // the module computes in fp32 over the fp16 values.
  std::vector<std::vector<double>> losses;
  std::vector<std::map<std::string, std::vector<float>>> params;
  for (const int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    std::vector<double> loss;
    std::map<std::string, std::vector<float>> p;
    int skipped = 0;
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      EngineConfig config = zest_config({}, stage);
      config.fp16.enabled = true;
      config.fp16.initial_scale_power = 24;  // 2^24 x these gradients overflows fp16: the first steps skip
      config.fp16.hysteresis = 1;
      Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
      auto model = std::static_pointer_cast<Mlp>(make_model(Model::kMlp));
      TorchModule zt(engine, model);
      CHECK((model->fc1->weight.scalar_type() == torch::kFloat));
      const UnitRunner run = [&](const torch::nn::Module& m, const std::function<torch::Tensor()>& f) {
        return zt.call(m, f);
      };
      for (int s = 0; s < 30; ++s) {
        const auto [x, y] = batch(Model::kMlp, s);
        torch::Tensor l = model->loss(x.narrow(0, 4 * comm.rank(), 4), y.narrow(0, 4 * comm.rank(), 4), run);
        zt.scale(l).backward();
        const StepResult r = zt.step();
        if (comm.rank() == 0) {
          loss.push_back(l.item<double>());
          skipped += r.applied ? 0 : 1;
        }
      }
      for (const UnitLayout& u : engine.layout().units()) {
        for (const ParamLayout& q : u.params) {
          std::vector<float> v = engine.param_master(q.name);  // collective
          if (comm.rank() == 0) p[q.name] = std::move(v);
        }
      }
    });
    MESSAGE(fmt::format("stage {}: {} skipped, loss {:.4f} -> {:.4f}", stage, skipped, loss.front(), loss.back()));
    CHECK(skipped >= 1);   // the scale came down from 2^24
    CHECK(skipped <= 12);  // and training went on
    CHECK(loss.back() < loss.front() * 0.85);  // 0.6496 -> 0.5295 (fixed seeds, so the same every run)
    losses.push_back(loss);
    params.push_back(p);
  }
  for (size_t i = 1; i < losses.size(); ++i) {
    CHECK(losses[i] == losses[0]);
    CHECK(params[i] == params[0]);
  }
}
