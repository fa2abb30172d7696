// Models, data and training runs shared by the libtorch tests: the same
// torch::nn model trained by plain libtorch on the global batch, and through
// a zest::TorchModule on W ranks, each on its slice of the batch.
#pragma once

#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/engine/engine.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/raw_allocator.h"
#include "zest/torch/torch_module_io.h"

namespace zest::test {

// How a model's forward runs a piece that uses one unit's parameters:
// directly for plain torch, through TorchModule::call for ZEST.
using UnitRunner = std::function<torch::Tensor(const torch::nn::Module&, const std::function<torch::Tensor()>&)>;

inline torch::Tensor run_directly(const torch::nn::Module&, const std::function<torch::Tensor()>& f) { return f(); }

// A model: its forward returns the loss, the mean over the given batch rows.
struct TestModel : torch::nn::Module {
  virtual torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, const UnitRunner& run) = 0;
  // The modules that are units for ZEST; empty: the default units.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> units() { return {}; }
};

// 8 -> 16 -> 16 -> 4, tanh, mean squared error. Default units: fc1, fc2, fc3.
struct Mlp : TestModel {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 4));
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, const UnitRunner& run) override {
    torch::Tensor h = run(*fc1, [&] { return torch::tanh(fc1->forward(x)); });
    h = run(*fc2, [&] { return torch::tanh(fc2->forward(h)); });
    h = run(*fc3, [&] { return fc3->forward(h); });
    return torch::mse_loss(h.to(torch::kFloat), y.to(torch::kFloat));  // bf16: 1.13 has no bf16 mse on the CPU
  }
};

// Pre-norm block: causal single-head self-attention and a GELU MLP, each
// with a residual.
struct Block : torch::nn::Module {
  static constexpr int64_t kDim = 8;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, up{nullptr}, down{nullptr};
  Block() {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    // No bias: a key bias has an exactly zero gradient (softmax ignores a
    // shift common to all keys), so its computed gradient is rounding noise,
    // which Adam scales up to full-size steps: noise that no two
    // implementations share.
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(kDim, 3 * kDim).bias(false)));
    proj = register_module("proj", torch::nn::Linear(kDim, kDim));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    up = register_module("up", torch::nn::Linear(kDim, 2 * kDim));
    down = register_module("down", torch::nn::Linear(2 * kDim, kDim));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // [batch, time, dim]
    const std::vector<torch::Tensor> parts = qkv->forward(ln1->forward(x)).chunk(3, -1);
    const int64_t t = x.size(1);
    torch::Tensor att = torch::matmul(parts[0], parts[1].transpose(1, 2)) / std::sqrt(static_cast<double>(kDim));
    att = att.masked_fill(torch::ones({t, t}, torch::kBool).triu(1), -1e9).softmax(-1);
    torch::Tensor h = x + proj->forward(torch::matmul(att, parts[2]));
    return h + down->forward(torch::gelu(up->forward(ln2->forward(h))));
  }
};

// Token embedding, a position table directly on the root, two blocks, a
// final LayerNorm and a head; cross-entropy on the next token. Units: each
// block, and "<root>" for the rest (used at the start and at the end).
struct TinyTransformer : TestModel {
  static constexpr int64_t kVocab = 11, kTime = 6;
  torch::nn::Embedding tok{nullptr};
  torch::Tensor pos;
  std::shared_ptr<Block> b0, b1;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
  TinyTransformer() {
    tok = register_module("tok", torch::nn::Embedding(kVocab, Block::kDim));
    pos = register_parameter("pos", 0.1 * torch::randn({kTime, Block::kDim}));
    b0 = register_module("b0", std::make_shared<Block>());
    b1 = register_module("b1", std::make_shared<Block>());
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({Block::kDim})));
    head = register_module("head", torch::nn::Linear(Block::kDim, kVocab));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() override { return {b0, b1}; }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, const UnitRunner& run) override {
    torch::Tensor h = run(*this, [&] { return tok->forward(x) + pos; });
    h = run(*b0, [&] { return b0->forward(h); });
    h = run(*b1, [&] { return b1->forward(h); });
    const torch::Tensor logits = run(*this, [&] { return head->forward(ln_f->forward(h)); });
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), y.reshape({-1}));
  }
};

enum class Model { kMlp, kTransformer };
enum class Optim { kAdamW, kSgd };

// Seeds torch's global generator and builds the model from it: one thread at
// a time, since in-process ranks are threads of one process.
inline std::shared_ptr<TestModel> make_model(Model m) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(1234);
  if (m == Model::kMlp) return std::make_shared<Mlp>();
  return std::make_shared<TinyTransformer>();
}

constexpr int64_t kGlobalBatch = 8;

// Step s's global batch, the same in every run.
inline std::pair<torch::Tensor, torch::Tensor> batch(Model m, int step) {
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(1000 + step);
  if (m == Model::kMlp) {
    torch::Tensor x = torch::randn({kGlobalBatch, 8}, gen);
    torch::Tensor y = torch::sin(x.narrow(1, 0, 4) * 2.0) + 0.1 * torch::randn({kGlobalBatch, 4}, gen);
    return {x, y};
  }
  torch::Tensor seq = torch::randint(TinyTransformer::kVocab, {kGlobalBatch, TinyTransformer::kTime + 1}, gen);
  // A learnable rule: the next token is mostly the current one plus 1.
  seq = torch::cumsum(torch::ones_like(seq), 1) + seq.narrow(1, 0, 1);
  seq = torch::remainder(seq, TinyTransformer::kVocab);
  return {seq.narrow(1, 0, TinyTransformer::kTime), seq.narrow(1, 1, TinyTransformer::kTime)};
}

struct TrainSpec {
  Model model = Model::kMlp;
  Optim optim = Optim::kAdamW;
  int steps = 20;
  float lr = 0.01f;
  float weight_decay = 0.01f;
  float momentum = 0.9f;
};

// Per step: the loss (mean over the global batch) and every parameter after
// the step, by name.
struct Trace {
  std::vector<double> loss;
  std::vector<std::map<std::string, std::vector<float>>> params;
};

inline std::vector<float> values(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

// (a) plain libtorch: one process, the global batch, torch::optim.
inline Trace train_torch(const TrainSpec& spec) {
  std::shared_ptr<TestModel> model = make_model(spec.model);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (spec.optim == Optim::kAdamW) {
    opt = std::make_unique<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(spec.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(spec.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(spec.lr).momentum(spec.momentum).weight_decay(spec.weight_decay));
  }
  Trace out;
  for (int s = 0; s < spec.steps; ++s) {
    const auto [x, y] = batch(spec.model, s);
    opt->zero_grad();
    torch::Tensor loss = model->loss(x, y, run_directly);
    loss.backward();
    opt->step();
    out.loss.push_back(loss.item<double>());
    std::map<std::string, std::vector<float>> p;
    for (const auto& item : model->named_parameters()) p[item.key()] = values(item.value());
    out.params.push_back(std::move(p));
  }
  return out;
}

inline EngineConfig zest_config(const TrainSpec& spec, int stage) {
  EngineConfig c;
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;  // every unit sharded at stage 3
  c.zero.reduce_bucket_size = 200;                // several reduction buckets
  c.optimizer.kind = spec.optim == Optim::kAdamW ? OptimizerKind::kAdamW : OptimizerKind::kSgd;
  c.optimizer.lr = spec.lr;
  c.optimizer.weight_decay = spec.weight_decay;
  c.optimizer.momentum = spec.optim == Optim::kSgd ? spec.momentum : 0.0f;
  return c;
}

// A model of kind `m` wrapped by a TorchModule on `engine` (units: its
// units()), and the runner that calls its pieces through it.
struct Wrapped {
  std::shared_ptr<TestModel> model;
  std::unique_ptr<TorchModule> zt;
  UnitRunner run;
};

inline Wrapped wrap_model(Engine& engine, Model m) {
  Wrapped w;
  w.model = make_model(m);
  TorchModuleOptions options;
  options.units = w.model->units();
  w.zt = std::make_unique<TorchModule>(engine, w.model, options);
  TorchModule* zt = w.zt.get();
  w.run = [zt](const torch::nn::Module& unit, const std::function<torch::Tensor()>& f) { return zt->call(unit, f); };
  return w;
}

// (b) one rank of a ZEST run: this rank's slice of each global batch.
// Returns the rank's trace: losses are this rank's local means (the caller
// averages them over ranks), parameters the engine's fp32 masters.
inline Trace train_zest_rank(const TrainSpec& spec, int stage, Communicator& comm) {
  CachingAllocator alloc(make_host_allocator());
  Engine engine(zest_config(spec, stage), comm, alloc, Stream::default_for(Device::host()));
  const Wrapped w = wrap_model(engine, spec.model);
  TestModel* model = w.model.get();
  TorchModule& zt = *w.zt;
  const UnitRunner& run = w.run;
  const int64_t per_rank = kGlobalBatch / comm.size();
  Trace out;
  for (int s = 0; s < spec.steps; ++s) {
    const auto [x, y] = batch(spec.model, s);
    const torch::Tensor lx = x.narrow(0, per_rank * comm.rank(), per_rank);
    const torch::Tensor ly = y.narrow(0, per_rank * comm.rank(), per_rank);
    torch::Tensor loss = model->loss(lx, ly, run);
    zt.scale(loss).backward();
    const StepResult r = zt.step();
    if (!r.applied) throw std::runtime_error("step " + std::to_string(s) + " not applied: " + r.skip_reason);
    out.loss.push_back(loss.item<double>());
    std::map<std::string, std::vector<float>> p;
    for (const UnitLayout& u : engine.layout().units())
      for (const ParamLayout& q : u.params) p[q.name] = engine.param_master(q.name);
    out.params.push_back(std::move(p));
  }
  return out;
}

}  // namespace zest::test
