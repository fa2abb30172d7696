// LoRA (torch/lora.h): LoraLinear against the same adapter written with
// plain torch arithmetic, forward and gradients; enable_lora's matching,
// freezing and order-free initialization; merge_lora and the PEFT config;
// and adapters trained through zest::TorchModule at stages 0-3 on 1 and 2
// in-process ranks: against plain libtorch on one process, bit for bit
// across stages, the frozen base unchanged, memory counted frozen and
// trainable apart as the estimator says.
//
// Tolerances. The forward and gradient checks compare torch's linear
// (addmm) with matmul + add: the same sums rounded in another order, a few
// fp32 ulps of values ~1, so 1e-5 absolute. Training against plain torch
// uses test_torch_equivalence.cpp's 5e-6 (it says why).
#include <cmath>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "../checkpoint/temp_dir.h"
#include "torch_harness.h"
#include "torch_doctest.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/file_io.h"
#include "zest/estimate/memory_estimate.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/hf/hf_export.h"
#include "zest/hf/hf_import.h"
#include "zest/torch/lora.h"

using namespace zest;
using namespace zest::test;

namespace {

constexpr double kArithmetic = 1e-5;

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a - b).abs().max().item<double>();
}

torch::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(seed);
  return torch::randn(shape, gen);
}

}  // namespace

TEST_CASE("LoraLinear: a drop-in for torch::nn::Linear until its adapters are enabled") {
  torch::manual_seed(3);
  LoraLinear lora(LoraLinearOptions(6, 5));
  torch::manual_seed(3);
  torch::nn::Linear plain(torch::nn::LinearOptions(6, 5));
  std::vector<std::string> names;
  for (const auto& p : lora->named_parameters()) names.push_back(p.key());
  CHECK(names == std::vector<std::string>{"weight", "bias"});
  CHECK(torch::equal(lora->weight, plain->weight));  // torch's initialization, bit for bit
  CHECK(torch::equal(lora->bias, plain->bias));
  const torch::Tensor x = randn({3, 6}, 1);
  CHECK(torch::equal(lora->forward(x), plain->forward(x)));
  CHECK_FALSE(lora->lora_enabled());

  LoraLinear nobias(LoraLinearOptions(6, 5).bias(false));
  CHECK(nobias->named_parameters().size() == 1);
  CHECK_FALSE(nobias->bias.defined());
}

TEST_CASE("LoraLinear with adapters: forward and gradients equal plain torch arithmetic") {
  LoraLinear m(LoraLinearOptions(12, 10));
  LoraOptions o;
  o.r = 4;
  o.alpha = 12;
  m->enable_lora(o, at::detail::createCPUGenerator(5));
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  CHECK(names == std::vector<std::string>{"weight", "bias", "lora_A.weight", "lora_B.weight"});
  CHECK(m->lora_A->weight.sizes() == torch::IntArrayRef({4, 12}));
  CHECK(m->lora_B->weight.sizes() == torch::IntArrayRef({10, 4}));
  CHECK(m->lora_B->weight.abs().max().item<float>() == 0.0f);  // PEFT: B starts at zero
  // kaiming_uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)).
  const float bound = 1.0f / std::sqrt(12.0f);
  CHECK(m->lora_A->weight.abs().max().item<float>() <= bound);
  CHECK(m->lora_A->weight.abs().max().item<float>() > 0.8f * bound);
  CHECK(o.scale() == 3.0);
  CHECK_THROWS_WITH_AS(m->enable_lora(o, at::detail::createCPUGenerator(5)), doctest::Contains("enabled already"),
                       Error);

  {
    torch::NoGradGuard no_grad;
    m->lora_B->weight.copy_(randn({10, 4}, 9));  // a trained B, so the adapter counts
  }
  const torch::Tensor x = randn({2, 3, 12}, 2).requires_grad_(true);
  const torch::Tensor y = m->forward(x);
  const torch::Tensor dy = randn({2, 3, 10}, 4);
  y.backward(dy);

  // The reference: leaves of their own, the same values.
  const torch::Tensor W = m->weight.detach().clone().requires_grad_(true);
  const torch::Tensor b = m->bias.detach().clone().requires_grad_(true);
  const torch::Tensor A = m->lora_A->weight.detach().clone().requires_grad_(true);
  const torch::Tensor B = m->lora_B->weight.detach().clone().requires_grad_(true);
  const torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  const torch::Tensor want = torch::matmul(x2, W.t()) + b + 3.0 * torch::matmul(torch::matmul(x2, A.t()), B.t());
  want.backward(dy);
  CHECK(max_abs_diff(y, want) <= kArithmetic);
  CHECK(max_abs_diff(x.grad(), x2.grad()) <= kArithmetic);
  CHECK(max_abs_diff(m->weight.grad(), W.grad()) <= kArithmetic);
  CHECK(max_abs_diff(m->bias.grad(), b.grad()) <= kArithmetic);
  CHECK(max_abs_diff(m->lora_A->weight.grad(), A.grad()) <= kArithmetic);
  CHECK(max_abs_diff(m->lora_B->weight.grad(), B.grad()) <= kArithmetic);
  CHECK(m->lora_A->weight.grad().abs().max().item<float>() > 0.1f);  // not trivially zero
}

namespace {

// Pre-norm residual block of LoraLinear projections (and a LayerNorm, never
// adapted).
struct LoraBlock : torch::nn::Module {
  static constexpr int64_t kDim = 16;
  torch::nn::LayerNorm norm{nullptr};
  LoraLinear q_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  LoraBlock() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    q_proj = register_module("q_proj", LoraLinear(kDim, kDim));
    up_proj = register_module("up_proj", LoraLinear(kDim, 2 * kDim));
    down_proj = register_module("down_proj", LoraLinear(LoraLinearOptions(2 * kDim, kDim).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = x + q_proj->forward(norm->forward(x));
    return h + down_proj->forward(torch::tanh(up_proj->forward(h)));
  }
};

// Two blocks and a plain Linear head (frozen whole: the "<root>" unit, laid
// out first).
struct LoraNet : torch::nn::Module {
  std::shared_ptr<LoraBlock> b0, b1;
  torch::nn::Linear head{nullptr};
  LoraNet() {
    b0 = register_module("b0", std::make_shared<LoraBlock>());
    b1 = register_module("b1", std::make_shared<LoraBlock>());
    head = register_module("head", torch::nn::Linear(LoraBlock::kDim, 4));
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, const UnitRunner& run) {
    torch::Tensor h = run(*b0, [&] { return b0->forward(x); });
    h = run(*b1, [&] { return b1->forward(h); });
    h = run(*this, [&] { return head->forward(h); });
    return torch::mse_loss(h, y);
  }
};

const std::vector<std::string> kTargets = {"q_proj", "up_proj", "down_proj"};

LoraOptions lora_options() {
  LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  return o;
}

std::shared_ptr<LoraNet> make_lora_net() {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(77);
  auto net = std::make_shared<LoraNet>();
  enable_lora(*net, kTargets, lora_options(), /*seed=*/11);
  return net;
}

std::pair<torch::Tensor, torch::Tensor> lora_batch(int step) {
  return {randn({kGlobalBatch, LoraBlock::kDim}, 500 + static_cast<uint64_t>(step)),
          randn({kGlobalBatch, 4}, 900 + static_cast<uint64_t>(step))};
}

bool is_adapter(const std::string& name) { return name.find(".lora_") != std::string::npos; }

std::map<std::string, std::vector<float>> named_values(torch::nn::Module& m) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = values(p.value());
  return out;
}

struct LoraRun {
  std::vector<float> losses;                       // rank 0's local means
  std::map<std::string, std::vector<float>> masters;  // every parameter, after the last step
  std::vector<std::string> units;
  int64_t frozen_bytes = 0;
  bool memory_as_estimated = false;
  int64_t estimated_frozen = 0;
};

constexpr int kSteps = 5;

LoraRun train_lora(int stage, int world, int64_t persistence_threshold) {
  std::vector<LoraRun> runs(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    torch::set_num_threads(1);
    CachingAllocator alloc(make_host_allocator());
    TrainSpec spec;
    EngineConfig config = zest_config(spec, stage);
    config.zero.stage3_param_persistence_threshold = persistence_threshold;
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    auto net = make_lora_net();
    TorchModuleOptions options;
    options.units = {net->b0, net->b1};
    TorchModule zt(engine, net, options);
    const UnitRunner run = [&](const torch::nn::Module& m, const std::function<torch::Tensor()>& f) {
      return zt.call(m, f);
    };
    LoraRun& r = runs[static_cast<size_t>(comm.rank())];
    const int64_t rows = kGlobalBatch / world;
    for (int s = 0; s < kSteps; ++s) {
      const auto [x, y] = lora_batch(s);
      torch::Tensor loss = net->loss(x.narrow(0, rows * comm.rank(), rows), y.narrow(0, rows * comm.rank(), rows), run);
      zt.scale(loss).backward();
      REQUIRE(zt.step().applied);
      r.losses.push_back(loss.item<float>());
    }
    for (const UnitLayout& u : engine.layout().units()) {
      r.units.push_back(u.name);
      for (const ParamLayout& q : u.params) r.masters[q.name] = engine.param_master(q.name);
    }
    const MemoryReport m = engine.memory_report();
    const MemoryEstimate e =
        estimate_memory([&] {
          ModelDescription d;
          for (const UnitLayout& u : engine.layout().units()) {
            UnitDescription ud;
            ud.name = u.name;
            ud.frozen = u.frozen;
            for (const ParamLayout& q : u.params) ud.param_numels.push_back(q.numel);
            d.units.push_back(ud);
          }
          return d;
        }(),
                        EstimateOptions::from_config(config, world));
    r.frozen_bytes = m.frozen_parameters;
    r.estimated_frozen = e.frozen_parameter_bytes;
    r.memory_as_estimated = true;
    for (MemoryCategory c : {MemoryCategory::kParameters, MemoryCategory::kGradients, MemoryCategory::kMasterWeights,
                             MemoryCategory::kOptimizerState}) {
      r.memory_as_estimated = r.memory_as_estimated && m[c].current == e[c].persistent;
    }
  });
  for (const LoraRun& r : runs) CHECK(r.masters == runs[0].masters);  // param_master gathers
  return runs[0];
}

// What every LoRA training run must show, whatever the stage.
void check_lora_run(const LoraRun& run, const std::map<std::string, std::vector<float>>& initial,
                    const std::map<std::string, std::vector<float>>& torch_trained) {
  CHECK(run.units == std::vector<std::string>{"<root>", "b0", "b0:frozen", "b1", "b1:frozen"});
  for (const auto& [name, before] : initial) {
    CAPTURE(name);
    const std::vector<float>& have = run.masters.at(name);
    if (!is_adapter(name)) {
      CHECK(have == before);  // the frozen base, bit for bit
      continue;
    }
    CHECK(have != before);  // trained
    const std::vector<float>& want = torch_trained.at(name);
    double worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(have[i] - want[i])));
    CHECK(worst <= 5e-6);
  }
  CHECK(run.frozen_bytes > 0);
  CHECK(run.frozen_bytes == run.estimated_frozen);
  CHECK(run.memory_as_estimated);
}

// Plain libtorch on one process: AdamW over the parameters with a gradient.
std::map<std::string, std::vector<float>> train_lora_torch(std::map<std::string, std::vector<float>>* initial) {
  auto net = make_lora_net();
  *initial = named_values(*net);
  TrainSpec spec;
  torch::optim::AdamW opt(net->parameters(),
                          torch::optim::AdamWOptions(spec.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(spec.weight_decay));
  for (int s = 0; s < kSteps; ++s) {
    const auto [x, y] = lora_batch(s);
    opt.zero_grad();
    net->loss(x, y, run_directly).backward();
    opt.step();
  }
  return named_values(*net);
}

void check_stages(const std::vector<int>& stages, int64_t persistence_threshold) {
  std::map<std::string, std::vector<float>> initial;
  const auto torch_trained = train_lora_torch(&initial);
  for (int world : {1, 2}) {
    std::optional<LoraRun> first;
    for (int stage : stages) {
      CAPTURE(world);
      CAPTURE(stage);
      const LoraRun run = train_lora(stage, world, persistence_threshold);
      check_lora_run(run, initial, torch_trained);
      if (!first) {
        first = run;
        continue;
      }
      CHECK(run.losses == first->losses);    // bit for bit across stages
      CHECK(run.masters == first->masters);
    }
  }
}

}  // namespace

TEST_CASE("enable_lora: PEFT's target matching, everything else frozen, values independent of the order") {
  auto net = make_lora_net();
  for (const auto& p : net->named_parameters()) {
    CAPTURE(p.key());
    CHECK(p.value().requires_grad() == is_adapter(p.key()));
  }
  CHECK_FALSE(net->b0->q_proj->weight.requires_grad());
  CHECK(net->b1->down_proj->lora_enabled());
  CHECK(net->named_parameters().contains("b1.down_proj.lora_B.weight"));

  // Block by block with a prefix: the whole tree's values.
  torch::manual_seed(77);
  auto piecewise = std::make_shared<LoraNet>();
  const std::vector<std::string> second = enable_lora(*piecewise->b1, kTargets, lora_options(), 11, "b1.");
  const std::vector<std::string> first = enable_lora(*piecewise->b0, kTargets, lora_options(), 11, "b0.");
  CHECK(first == std::vector<std::string>{"b0.q_proj", "b0.up_proj", "b0.down_proj"});
  CHECK(second.size() == 3);
  CHECK(named_values(*piecewise) == named_values(*net));
  CHECK(named_values(*net->b0->q_proj->lora_A) != named_values(*net->b1->q_proj->lora_A));  // each its own draw

  // Names match whole components only, and a miss is refused.
  torch::manual_seed(77);
  auto other = std::make_shared<LoraNet>();
  CHECK(enable_lora(*other, {"b1.up_proj"}, lora_options(), 1) == std::vector<std::string>{"b1.up_proj"});
  CHECK_FALSE(other->b0->up_proj->lora_enabled());
  torch::manual_seed(77);
  auto none = std::make_shared<LoraNet>();
  CHECK_THROWS_WITH_AS(enable_lora(*none, {"proj", "head"}, lora_options(), 1),
                       doctest::Contains("none of the LoRA target modules [proj, head]"), Error);
  LoraOptions bad = lora_options();
  bad.r = 0;
  CHECK_THROWS_WITH_AS(enable_lora(*none, kTargets, bad, 1), doctest::Contains("rank r is 0"), Error);
}

TEST_CASE("merge_lora: the merged weight computes the adapted Linear, the adapters are dropped") {
  auto net = make_lora_net();
  LoraLinearImpl& up = *net->b0->up_proj;
  {
    torch::NoGradGuard no_grad;
    up.lora_B->weight.copy_(randn({32, 4}, 3));
  }
  std::map<std::string, HostTensor> tensors;
  for (const auto& p : net->b0->named_parameters()) {
    tensors[p.key()] = {p.value().sizes().vec(), values(p.value())};
  }
  const size_t before = tensors.size();
  CHECK(merge_lora(tensors, lora_options().scale()) == 3);
  CHECK(tensors.size() == before - 6);
  for (const auto& [name, t] : tensors) CHECK_FALSE(is_adapter(name));
  const HostTensor& w = tensors.at("up_proj.weight");
  const torch::Tensor merged = torch::from_blob(const_cast<float*>(w.values.data()), {32, 16}, torch::kFloat);
  const torch::Tensor x = randn({5, 16}, 8);
  torch::NoGradGuard no_grad;
  CHECK(max_abs_diff(torch::nn::functional::linear(x, merged, up.bias), up.forward(x)) <= kArithmetic);
  // B = 0 (never trained): the base weight, bit for bit.
  CHECK(tensors.at("q_proj.weight").values == values(net->b0->q_proj->weight));

  std::map<std::string, HostTensor> lonely = {{"m.lora_A.weight", {{2, 3}, std::vector<float>(6)}},
                                              {"m.weight", {{4, 3}, std::vector<float>(12)}}};
  CHECK_THROWS_WITH_AS(merge_lora(lonely, 1.0), doctest::Contains("m has lora_A but not lora_B"), Error);
  lonely["m.lora_B.weight"] = {{4, 3}, std::vector<float>(12)};
  CHECK_THROWS_WITH_AS(merge_lora(lonely, 1.0), doctest::Contains("does not give the weight's shape [4, 3]"), Error);
}

TEST_CASE("adapter_config_json: PEFT's LoraConfig fields") {
  LoraOptions o;
  o.r = 8;
  o.alpha = 16;
  o.dropout = 0.05;
  const nlohmann::json j = nlohmann::json::parse(adapter_config_json(o, llama_lora_targets(), "base"));
  CHECK(j.at("r") == 8);
  CHECK(j.at("lora_alpha") == 16.0);
  CHECK(j.at("lora_dropout") == 0.05);
  CHECK(j.at("target_modules") ==
        nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  CHECK(j.at("bias") == "none");
  CHECK(j.at("task_type") == "CAUSAL_LM");
  CHECK(j.at("peft_type") == "LORA");
  CHECK(j.at("base_model_name_or_path") == "base");
}

TEST_CASE("LoRA through TorchModule, stages 0-3 (units kept whole at stage 3): as torch, bit for bit across stages") {
  check_stages({0, 1, 2, 3}, /*persistence_threshold=*/int64_t{1} << 30);
}

TEST_CASE("LoRA through TorchModule, stage 3 with every unit sharded: as stage 0, bit for bit") {
  check_stages({0, 3}, /*persistence_threshold=*/0);
}

TEST_CASE("export_hf_lora_merged and _apart: PEFT's merge_and_unload and save_pretrained, read back by import_hf") {
  // Adapters with nonzero B (as after training), so the merge changes the
  // weights; 2 ranks at stage 3 with every unit sharded.
  TempDir tmp;
  auto adapted = make_lora_net();
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : adapted->named_parameters()) {
      if (p.key().ends_with("lora_B.weight")) p.value().copy_(randn(p.value().sizes().vec(), 31));
    }
  }
  const auto before = named_values(*adapted);
  const double scale = lora_options().scale();
  run_inprocess(2, [&](Communicator& comm) {
    torch::set_num_threads(1);
    CachingAllocator alloc(make_host_allocator());
    EngineConfig config = zest_config(TrainSpec{}, 3);
    config.zero.stage3_param_persistence_threshold = 0;
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    std::shared_ptr<LoraNet> net;
    {
      static std::mutex mutex;
      const std::lock_guard<std::mutex> lock(mutex);
      net = make_lora_net();
      torch::NoGradGuard no_grad;
      for (const auto& p : net->named_parameters()) p.value().copy_(adapted->named_parameters()[p.key()]);
    }
    TorchModuleOptions options;
    options.units = {net->b0, net->b1};
    TorchModule zt(engine, net, options);
    HfExportOptions e;
    e.config_json = "{}";
    e.dtype = DType::kFloat32;
    export_hf_lora_merged(engine, tmp / "merged", e, lora_options());
    export_hf_lora_apart(engine, tmp / "apart", e, lora_options(), kTargets, "the-base");
    e.transform = [](int, std::vector<HfTensor>&, HfExportPass) {};
    CHECK_THROWS_WITH_AS(export_hf_lora_merged(engine, tmp / "x", e, lora_options()),
                         doctest::Contains("transform is set"), Error);
  });
  // Merged: the base model's names only, each adapted weight W + scale B A.
  const HfCheckpoint merged = HfCheckpoint::open(tmp / "merged");
  for (const std::string& name : merged.names()) CHECK_FALSE(is_lora_adapter(name));
  CHECK(merged.names().size() == 16);  // 2 blocks x (norm 2 + q 2 + up 2 + down 1), head 2
  auto plain = std::make_shared<LoraNet>();  // adapters off: the base names
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(zest_config(TrainSpec{}, 0), comm, alloc, Stream::default_for(Device::host()));
    TorchModule zt(engine, plain);
    zt.import_hf(tmp / "merged");
  });
  const auto tensor = [&](const std::string& name) {
    const std::vector<float>& v = before.at(name);
    return torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}).clone();
  };
  for (const char* block : {"b0", "b1"}) {
    for (const std::string& target : kTargets) {
      const std::string m = fmt::format("{}.{}", block, target);
      CAPTURE(m);
      const torch::Tensor W = plain->named_parameters()[m + ".weight"];
      const torch::Tensor A = tensor(m + ".lora_A.weight").view({4, W.size(1)});
      const torch::Tensor B = tensor(m + ".lora_B.weight").view({W.size(0), 4});
      const torch::Tensor want = tensor(m + ".weight").view(W.sizes()) + scale * torch::matmul(B, A);
      CHECK(max_abs_diff(W, want) <= kArithmetic);
      CHECK(max_abs_diff(W, tensor(m + ".weight").view(W.sizes())) > 1e-3);  // the merge changed it
    }
  }
  // Apart: the base weights unchanged in the shards, the adapters under
  // PEFT's names beside them with adapter_config.json.
  const HfCheckpoint apart = HfCheckpoint::open(tmp / "apart");
  CHECK(apart.contains("b0.q_proj.weight"));
  CHECK_FALSE(apart.contains("b0.q_proj.lora_A.weight"));
  CHECK(std::filesystem::exists(tmp / "apart/adapter_model.safetensors"));
  const nlohmann::json config = nlohmann::json::parse(read_text_file(tmp / "apart/adapter_config.json"));
  CHECK(config["base_model_name_or_path"] == "the-base");
  auto back = make_lora_net();
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : back->named_parameters()) p.value().zero_();
  }
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(zest_config(TrainSpec{}, 0), comm, alloc, Stream::default_for(Device::host()));
    TorchModule zt(engine, back);
    const HfImportReport r = zt.import_hf(tmp / "apart");
    CHECK(r.adapters_loaded == 12);  // 2 blocks x 3 targets x (A, B)
  });
  CHECK(named_values(*back) == before);
}
