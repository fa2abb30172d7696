// Frozen parameters in backward at stage 3 (Note [frozen parameters in
// backward], torch_module_hooks.cpp): a unit that mixes a frozen base with
// trainable adapters (LoRA's shape), and a unit all frozen between trainable
// ones, at sizes where the frozen memory is sharded and released. Before the
// frozen part was tracked through the call's graph, its memory went back
// with the unit's last trainable gradient while x W^T's backward still
// needed W, and backward failed inside libtorch.
#include "torch_harness.h"
#include "torch_doctest.h"
#include "zest/comm/inprocess_comm.h"

using namespace zest;
using namespace zest::test;

namespace {

// h = tanh(fc0 x); h = base h + b(a h) (base frozen); out = head tanh(h).
// The input of the adapted unit requires grad (fc0 trains), so base's
// weight is read in backward to compute that input's gradient.
struct Adapted : torch::nn::Module {
  torch::nn::Linear base{nullptr}, a{nullptr}, b{nullptr};
  Adapted() {
    base = register_module("base", torch::nn::Linear(64, 64));
    a = register_module("a", torch::nn::Linear(torch::nn::LinearOptions(64, 4).bias(false)));
    b = register_module("b", torch::nn::Linear(torch::nn::LinearOptions(4, 64).bias(false)));
    base->weight.set_requires_grad(false);
    base->bias.set_requires_grad(false);
    torch::NoGradGuard no_grad;
    b->weight.normal_(0.0, 0.05);  // not LoRA's zeros: the adapter path then moves from step 0
  }
  torch::Tensor forward(const torch::Tensor& x) { return base->forward(x) + b->forward(a->forward(x)); }
};

struct LoraModel : TestModel {
  torch::nn::Linear fc0{nullptr}, mid{nullptr}, head{nullptr};
  std::shared_ptr<Adapted> adapted;
  // all_frozen_mid: a unit all frozen between two trainable ones.
  explicit LoraModel(bool all_frozen_mid) {
    fc0 = register_module("fc0", torch::nn::Linear(8, 64));
    adapted = register_module("adapted", std::make_shared<Adapted>());
    mid = register_module("mid", torch::nn::Linear(64, 64));
    head = register_module("head", torch::nn::Linear(64, 4));
    if (all_frozen_mid) {
      mid->weight.set_requires_grad(false);
      mid->bias.set_requires_grad(false);
    }
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, const UnitRunner& run) override {
    torch::Tensor h = run(*fc0, [&] { return torch::tanh(fc0->forward(x)); });
    h = run(*adapted, [&] { return torch::tanh(adapted->forward(h)); });
    h = run(*mid, [&] { return torch::tanh(mid->forward(h)); });
    h = run(*head, [&] { return head->forward(h); });
    return torch::mse_loss(h, y);
  }
};

std::shared_ptr<LoraModel> make_lora_model(bool all_frozen_mid) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(77);
  return std::make_shared<LoraModel>(all_frozen_mid);
}

using Params = std::map<std::string, std::vector<float>>;

constexpr int kSteps = 5;

Params train_reference(bool all_frozen_mid) {
  auto model = make_lora_model(all_frozen_mid);
  std::vector<torch::Tensor> trainable;
  for (const auto& p : model->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
  for (int s = 0; s < kSteps; ++s) {
    const auto [x, y] = batch(Model::kMlp, s);
    opt.zero_grad();
    model->loss(x, y, run_directly).backward();
    opt.step();
  }
  Params out;
  for (const auto& p : model->named_parameters()) out[p.key()] = values(p.value());
  return out;
}

struct Run {
  Params params;
  std::vector<double> loss;
  // stage 3: released before step() on more than one rank, kept whole on one
  bool frozen_released_in_backward = true;
};

Run train_zest(bool all_frozen_mid, int stage, int world, int64_t persistence) {
  std::vector<Run> runs(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    torch::set_num_threads(1);
    CachingAllocator alloc(make_host_allocator());
    EngineConfig config = zest_config({}, stage);
    config.zero.stage3_param_persistence_threshold = persistence;
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    auto model = make_lora_model(all_frozen_mid);
    TorchModule zt(engine, model);
    const UnitRunner run = [&](const torch::nn::Module& m, const std::function<torch::Tensor()>& f) {
      return zt.call(m, f);
    };
    Run& out = runs[static_cast<size_t>(comm.rank())];
    const int64_t per_rank = kGlobalBatch / comm.size();
    for (int s = 0; s < kSteps; ++s) {
      const auto [x, y] = batch(Model::kMlp, s);
      torch::Tensor loss = model->loss(x.narrow(0, per_rank * comm.rank(), per_rank),
                                       y.narrow(0, per_rank * comm.rank(), per_rank), run);
      zt.scale(loss).backward();
      if (stage == 3 && comm.size() > 1) {
        out.frozen_released_in_backward = out.frozen_released_in_backward &&
                                          model->adapted->base->weight.numel() == 0 &&
                                          (!all_frozen_mid || model->mid->weight.numel() == 0);
      } else if (stage == 3) {
        // One rank keeps the units whole (Note [one partition keeps stage 3
        // resident]): nothing to release.
        out.frozen_released_in_backward = out.frozen_released_in_backward &&
                                          model->adapted->base->weight.numel() > 0 &&
                                          (!all_frozen_mid || model->mid->weight.numel() > 0);
      }
      REQUIRE(zt.step().applied);
      out.loss.push_back(loss.item<double>());
    }
    for (const UnitLayout& u : engine.layout().units()) {
      for (const ParamLayout& q : u.params) out.params[q.name] = engine.param_master(q.name);
    }
  });
  Run out = runs[0];
  for (const Run& r : runs) REQUIRE(r.params == out.params);
  for (size_t s = 0; s < out.loss.size(); ++s) {
    double sum = 0.0;
    for (const Run& r : runs) sum += r.loss[s];
    out.loss[s] = sum / world;
  }
  return out;
}

}  // namespace

TEST_CASE("stage 3, frozen base with trainable adapters in one unit: trains as torch, every stage the same bits") {
  for (const bool all_frozen_mid : {false, true}) {
    CAPTURE(all_frozen_mid);
    const Params reference = train_reference(all_frozen_mid);
    for (const int world : {1, 2}) {
      CAPTURE(world);
      const Run stage0 = train_zest(all_frozen_mid, 0, world, 0);
      // The adapters (512 elements) stay whole, the frozen base (4160) and
      // mid are sharded: the companion is released while its unit is not.
      // Then every unit sharded.
      for (const int64_t persistence : {int64_t{1000}, int64_t{0}}) {
        CAPTURE(persistence);
        for (const int stage : {1, 2, 3}) {
          CAPTURE(stage);
          const Run r = train_zest(all_frozen_mid, stage, world, persistence);
          CHECK(r.params == stage0.params);  // bit for bit
          CHECK(r.loss == stage0.loss);
          CHECK(r.frozen_released_in_backward);
        }
      }
      // The frozen values never move; the rest trains as plain torch does
      // (test_torch_equivalence.cpp's tolerance and its reasons).
      for (const auto& [name, want] : reference) {
        CAPTURE(name);
        const std::vector<float>& have = stage0.params.at(name);
        REQUIRE(have.size() == want.size());
        double worst = 0.0;
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(have[i] - want[i])));
        CHECK(worst <= 5e-6);
      }
    }
  }
}
