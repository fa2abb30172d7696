// zest::TorchModule's contract: units and names, parameters as views of the
// engine's memory, reductions during backward, stage 3's release and
// re-gather, bf16, gradient accumulation, checkpoints, safetensors export,
// and the forms of module code it refuses.
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "torch_harness.h"
#include "torch_doctest.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/comm/inprocess_comm.h"

using namespace zest;
using namespace zest::test;

namespace {

struct OneRank {
  CachingAllocator alloc{make_host_allocator()};
  std::unique_ptr<Communicator> comm = std::move(make_inprocess_group(1)[0]);
  Engine engine;
  explicit OneRank(int stage = 0, TrainSpec spec = {})
      : engine(zest_config(spec, stage), *comm, alloc, Stream::default_for(Device::host())) {}
};

std::vector<std::string> unit_names(const Engine& e) {
  std::vector<std::string> out;
  for (const UnitLayout& u : e.layout().units()) out.push_back(u.name);
  return out;
}

std::string temp_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / ("zest_torch_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

struct Holder : torch::nn::Module {
  explicit Holder(const torch::Tensor& w) { register_parameter("weight", w); register_parameter("bias", torch::zeros({3})); }
};

// One tensor registered in two top-level children (tied weights).
struct Shared : torch::nn::Module {
  Shared() {
    const torch::Tensor w = torch::randn({3, 3});
    register_module("a", std::make_shared<Holder>(w));
    register_module("b", std::make_shared<Holder>(w));
  }
};

}  // namespace

TEST_CASE("default units: one per top-level child, the root's own parameters as <root>") {
  OneRank r;
  auto model = std::static_pointer_cast<TinyTransformer>(make_model(Model::kTransformer));
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  TorchModule zt(r.engine, model);
  const bool default_units = unit_names(r.engine) == std::vector<std::string>{"<root>", "tok", "b0", "b1", "ln_f", "head"};
  CHECK(default_units);
  CHECK(r.engine.layout().unit(0).params.at(0).name == "pos");
  CHECK(r.engine.layout().numel() == static_cast<size_t>([&] {
          int64_t n = 0;
          for (const auto& p : model->parameters()) n += p.numel();
          return n;
        }()));
  // Every parameter is the engine's memory under its own name.
  for (int u = 0; u < r.engine.layout().num_units(); ++u) {
    const UnitHandle h = r.engine.gather(u);
    for (const ParamLayout& p : r.engine.layout().unit(u).params) {
      CAPTURE(p.name);
      CHECK(model->named_parameters()[p.name].data_ptr() == h.param_data(p.name));
    }
  }
  CHECK(zt.unit_of(*model->b1) == 3);
  CHECK(zt.unit_of(*model) == 0);
  CHECK_THROWS_WITH_AS(zt.unit_of(*model->b1->ln1), doctest::Contains("is not a unit of this TorchModule"), Error);
  size_t registered = 0;
  for (const UnitLayout& u : r.engine.layout().units()) registered += u.params.size();
  CHECK(registered == names.size());  // every parameter, once
  CHECK(registered == 28);
}

TEST_CASE("reductions start during backward, and .grad is the engine's outside no backward") {
  run_inprocess(2, [](Communicator& comm) {
    for (int stage : {0, 2, 3}) {
      CAPTURE(stage);
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, stage), comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Mlp>();
      TorchModule zt(engine, model);
      const auto [x, y] = batch(Model::kMlp, 0);
      torch::Tensor loss = model->loss(x, y, [&](const torch::nn::Module& m, const std::function<torch::Tensor()>& f) {
        return zt.call(m, f);
      });
      if (stage == 3) {
        // Released after the forward: 0 elements until backward gathers.
        CHECK(model->fc1->weight.numel() == 0);
      }
      comm.reset_counters();
      zt.scale(loss).backward();
      // fc3 and fc2 fill the 200-element bucket before fc1 is done: reduced
      // during backward (fc1 too, when padding makes it 200 elements).
      const CollectiveKind kind = stage == 0 ? CollectiveKind::kAllReduce : CollectiveKind::kReduceScatter;
      CHECK(comm.counters()[kind].calls >= 2);
      CHECK_FALSE(model->fc2->weight.grad().defined());
      const StepResult res = zt.step();
      CHECK(res.applied);
      CHECK(comm.counters()[kind].calls == 3);
      CHECK(model->fc1->weight.numel() == (stage == 3 ? 0 : 128));
    }
  });
}

// Values that need no generator: the in-process ranks are threads sharing
// torch's global one.
torch::Tensor wave(std::vector<int64_t> shape, double phase) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return torch::arange(n, torch::kFloat32).mul(0.37).add(phase).sin().mul(0.3).reshape(shape);
}

// fc1, then `skip` on the steps that take the branch, then fc2.
struct Branchy : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, skip{nullptr}, fc2{nullptr};
  Branchy() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 40));
    skip = register_module("skip", torch::nn::Linear(40, 40));
    fc2 = register_module("fc2", torch::nn::Linear(40, 3));
    const torch::NoGradGuard no_grad;
    double phase = 0;
    for (torch::Tensor& p : parameters()) p.copy_(wave(p.sizes().vec(), phase += 1));
  }
};

TEST_CASE("a unit no gradient reached is reduced from zeros without a gather, with the bits of every stage") {
  // The branch through `skip` is taken at steps 1 and 3, by every rank (the
  // engine reduces units in the order their gradients complete, so a unit
  // one rank skips while another does not is not supported).
  const auto takes_branch = [](int step) { return step % 2 == 1; };
  using Params = std::map<std::string, std::vector<float>>;
  std::map<int, std::array<Params, 2>> trained;
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    std::array<Params, 2>& per_rank = trained[stage];  // each rank's thread fills its own
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      EngineConfig config = zest_config({}, stage);
      config.zero.stage3_prefetch_bucket_size = 0;  // gathers only where a unit is called
      Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Branchy>();
      TorchModule zt(engine, model);
      REQUIRE(unit_names(engine) == std::vector<std::string>{"fc1", "skip", "fc2"});
      for (int step = 0; step < 4; ++step) {
        CAPTURE(step);
        const torch::Tensor x = wave({5, 6}, 10 + 2 * step + comm.rank());
        const torch::Tensor y = wave({5, 3}, 50 + 2 * step + comm.rank());
        comm.reset_counters();
        torch::Tensor h = zt.call(*model->fc1, [&] { return model->fc1->forward(x); });
        if (takes_branch(step)) h = h + zt.call(*model->skip, [&] { return model->skip->forward(h); });
        const torch::Tensor out = zt.call(*model->fc2, [&] { return model->fc2->forward(h); });
        zt.scale(torch::mse_loss(out, y)).backward();
        const uint64_t gathers = comm.counters()[CollectiveKind::kAllGather].calls;
        CHECK(zt.step().applied);
        // At stage 3 step() gathers nothing: the unit no gradient reached is
        // reduced from zeros with no all-gather of its parameters (one a
        // step before). Stages 1-2 gather the updated parameters, a unit at
        // a time.
        CHECK(comm.counters()[CollectiveKind::kAllGather].calls - gathers == (stage == 1 || stage == 2 ? 3u : 0u));
        // Every unit is reduced once a micro-step, taken or not.
        const CollectiveKind reduce = stage == 0 ? CollectiveKind::kAllReduce : CollectiveKind::kReduceScatter;
        CHECK(comm.counters()[reduce].calls == 3u);
      }
      for (const UnitLayout& u : engine.layout().units()) {
        for (const ParamLayout& q : u.params) per_rank[static_cast<size_t>(comm.rank())][q.name] = engine.param_master(q.name);
      }
    });
  }
  // The zeros of a skipped unit are the zeros torch would give it: every
  // stage has the bits of stage 0, on both ranks.
  for (const auto& [stage, ranks] : trained) {
    CAPTURE(stage);
    CHECK(ranks[0] == trained.at(0)[0]);
    CHECK(ranks[1] == ranks[0]);
  }
  // The branch trained on the steps that took it.
  const torch::Tensor w0 = Branchy().skip->weight.contiguous();
  const std::vector<float> initial(w0.data_ptr<float>(), w0.data_ptr<float>() + w0.numel());
  CHECK(trained.at(0)[0].at("skip.weight") != initial);
}

TEST_CASE("stage 3: an evaluation or a read between steps changes no bit and no training gather, and keeps nothing") {
  // TinyTransformer's units: <root> (used first and last), b0, b1. A reuse
  // distance that keeps whatever the order uses again, no prefetch: every
  // all-gather is a gather's. An evaluation forward under no_grad follows
  // the engine's inference order (recorded: 4 gathers; replayed, <root>
  // kept for its second use: 3) and ends at the next training gather; a
  // zt.read of b1 gathers it once and follows no order. Training records
  // and replays its own order as if neither were there.
  enum Between { kNothing, kEvaluation, kRead };
  const TrainSpec spec{Model::kTransformer, Optim::kAdamW, 4};
  std::vector<std::map<std::string, std::vector<float>>> params[3];
  std::vector<uint64_t> training[3];
  for (Between between : {kNothing, kEvaluation, kRead}) {
    CAPTURE(between);
    params[between].resize(2);
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      EngineConfig config = zest_config(spec, 3);
      config.zero.stage3_max_reuse_distance = 1'000'000'000;
      config.zero.stage3_prefetch_bucket_size = 0;
      Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
      const Wrapped w = wrap_model(engine, spec.model);
      const auto& model = static_cast<const TinyTransformer&>(*w.model);
      size_t shards = 0;
      for (const UnitLayout& U : engine.layout().units()) shards += U.shard;
      const auto all_gathers = [&] { return comm.counters()[CollectiveKind::kAllGather].calls; };
      std::vector<uint64_t> others, trained;
      for (int s = 0; s < spec.steps; ++s) {
        const auto [x, y] = batch(spec.model, s);
        const torch::Tensor lx = x.narrow(0, 4 * comm.rank(), 4), ly = y.narrow(0, 4 * comm.rank(), 4);
        comm.reset_counters();
        if (between == kEvaluation) {
          const torch::NoGradGuard no_grad;
          (void)w.model->loss(lx, ly, w.run);
        } else if (between == kRead) {
          // The values are there, the fp32 masters' bits.
          const std::vector<float> read = w.zt->read(*model.b1, [&] { return values(model.b1->down->weight); });
          CHECK(read == engine.param_master("b1.down.weight"));
          CHECK(model.b1->down->weight.numel() == 0);  // released after
        }
        others.push_back(all_gathers());
        CHECK(engine.memory_report()[MemoryCategory::kParameters].current == static_cast<int64_t>(shards * 4));
        comm.reset_counters();
        w.zt->scale(w.model->loss(lx, ly, w.run)).backward();
        CHECK(w.zt->step().applied);
        trained.push_back(all_gathers());
      }
      if (between == kEvaluation) CHECK(others == std::vector<uint64_t>{4, 3, 3, 3});
      if (between == kRead) CHECK(others == std::vector<uint64_t>{1, 1, 1, 1});
      if (comm.rank() == 0) training[between] = trained;
      for (const UnitLayout& u : engine.layout().units()) {
        for (const ParamLayout& q : u.params) params[between][comm.rank()][q.name] = engine.param_master(q.name);
      }
    });
  }
  CHECK(training[kNothing].at(1) < training[kNothing].at(0));  // the replay keeps units for their reuse
  for (Between between : {kEvaluation, kRead}) {
    CAPTURE(between);
    CHECK(training[between] == training[kNothing]);
    for (size_t r = 0; r < 2; ++r) {
      REQUIRE(params[between][r].size() == params[kNothing][r].size());
      for (const auto& [name, v] : params[kNothing][r]) {
        CAPTURE(name);
        const std::vector<float>& w = params[between][r].at(name);
        CHECK((w.size() == v.size() && std::memcmp(w.data(), v.data(), v.size() * sizeof(float)) == 0));
      }
    }
  }
}

TEST_CASE("refused: shared parameters across units, buffers") {
  {
    OneRank r;
    CHECK_THROWS_WITH_AS(TorchModule(r.engine, std::make_shared<Shared>()),
                         doctest::Contains("parameter 'a.weight' is in unit 'a' and in unit 'b'"), Error);
  }
  {
    // In one unit the tied tensor is one parameter, under its first name.
    OneRank r;
    auto model = std::make_shared<Shared>();
    TorchModuleOptions o;
    o.units = {model};
    CHECK_THROWS_WITH_AS(TorchModule(r.engine, model, o), doctest::Contains("is not a descendant"), Error);
  }
  {
    OneRank r;
    auto model = std::make_shared<torch::nn::Module>();
    auto outer = model->register_module("outer", std::make_shared<Shared>());
    TorchModuleOptions o;
    o.units = {outer};
    TorchModule zt(r.engine, model, o);
    const bool one_unit = unit_names(r.engine) == std::vector<std::string>{"outer"};
    CHECK(one_unit);
    CHECK(r.engine.layout().unit(0).params.size() == 3);  // a.weight, a.bias, b.bias
  }
  {
    OneRank r;
    auto model = std::make_shared<torch::nn::Module>();
    model->register_module("fc", torch::nn::Linear(2, 2));
    model->register_buffer("mask", torch::ones({2}));
    CHECK_THROWS_WITH_AS(TorchModule(r.engine, model), doctest::Contains("1 buffer(s), the first 'mask'"), Error);
    OneRank r2;
    TorchModuleOptions o;
    o.allow_buffers = true;
    TorchModule zt(r2.engine, model, o);
    CHECK(model->named_buffers()["mask"].numel() == 2);
  }
}

namespace {

// The Mlp with fc1 all frozen and fc2's weight frozen (its bias trains).
std::shared_ptr<Mlp> partly_frozen_mlp() {
  auto model = std::make_shared<Mlp>();
  model->fc1->weight.set_requires_grad(false);
  model->fc1->bias.set_requires_grad(false);
  model->fc2->weight.set_requires_grad(false);
  return model;
}

}  // namespace

TEST_CASE("requires_grad false: frozen units, values fixed bit for bit, training as torch's on the rest") {
  // Plain torch: AdamW over every parameter skips those without a gradient.
  const int steps = 6;
  auto reference = partly_frozen_mlp();
  const std::map<std::string, std::vector<float>> initial = [&] {
    std::map<std::string, std::vector<float>> m;
    for (const auto& p : reference->named_parameters()) m[p.key()] = values(p.value());
    return m;
  }();
  torch::optim::AdamW opt(reference->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.01));
  for (int s = 0; s < steps; ++s) {
    const auto [x, y] = batch(Model::kMlp, s);
    opt.zero_grad();
    reference->loss(x, y, run_directly).backward();
    opt.step();
  }
  for (int stage : {0, 3}) {
    for (int world : {1, 2}) {
      CAPTURE(stage);
      CAPTURE(world);
      std::vector<std::map<std::string, std::vector<float>>> got(static_cast<size_t>(world));
      std::vector<int64_t> frozen_bytes(static_cast<size_t>(world));
      run_inprocess(world, [&](Communicator& comm) {
        CachingAllocator alloc(make_host_allocator());
        TrainSpec spec;
        Engine engine(zest_config(spec, stage), comm, alloc, Stream::default_for(Device::host()));
        auto model = partly_frozen_mlp();
        {
          // Every rank starts from the reference's initial values.
          torch::NoGradGuard no_grad;
          for (auto& p : model->named_parameters()) {
            const std::vector<float>& v = initial.at(p.key());
            p.value().copy_(torch::from_blob(const_cast<float*>(v.data()), p.value().sizes(), torch::kFloat));
          }
        }
        TorchModule zt(engine, model);
        const bool units = unit_names(engine) == std::vector<std::string>{"fc1", "fc2", "fc2:frozen", "fc3"};
        CHECK(units);
        CHECK(engine.layout().unit(0).frozen);
        CHECK_FALSE(engine.layout().unit(1).frozen);
        CHECK(engine.layout().unit(2).frozen);
        const UnitRunner run = [&](const torch::nn::Module& m, const std::function<torch::Tensor()>& f) {
          return zt.call(m, f);
        };
        const int64_t per_rank = kGlobalBatch / comm.size();
        for (int s = 0; s < steps; ++s) {
          const auto [x, y] = batch(Model::kMlp, s);
          torch::Tensor loss = model->loss(x.narrow(0, per_rank * comm.rank(), per_rank),
                                           y.narrow(0, per_rank * comm.rank(), per_rank), run);
          zt.scale(loss).backward();
          CHECK_FALSE(model->fc2->weight.grad().defined());
          CHECK(zt.step().applied);
        }
        std::map<std::string, std::vector<float>> p;
        for (const UnitLayout& u : engine.layout().units())
          for (const ParamLayout& q : u.params) p[q.name] = engine.param_master(q.name);
        got[static_cast<size_t>(comm.rank())] = p;
        frozen_bytes[static_cast<size_t>(comm.rank())] = engine.memory_report().frozen_parameters;
      });
      const auto& mine = got[0];
      for (const char* name : {"fc1.weight", "fc1.bias", "fc2.weight"}) {
        CAPTURE(name);
        CHECK(mine.at(name) == initial.at(name));  // bit for bit
      }
      for (const auto& p : reference->named_parameters()) {
        CAPTURE(p.key());
        const std::vector<float> want = values(p.value());
        const std::vector<float>& have = mine.at(p.key());
        REQUIRE(have.size() == want.size());
        // test_torch_equivalence.cpp's tolerance, and why.
        for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(have[i] - want[i]) <= 5e-6);
      }
      // fc1 (144 elements) and fc2's weight (256) pad to 256 x partitions
      // each; stage 3 holds one shard of each between steps.
      const int64_t partitions = stage == 0 ? 1 : world;
      CHECK(frozen_bytes[0] == (stage == 3 ? 2 * 256 : 2 * 256 * partitions) * 4);
    }
  }
}

TEST_CASE("refused: step without backward, two backwards in one micro-step, stage 3 use outside call") {
  {
    OneRank r;
    auto model = std::make_shared<Mlp>();
    TorchModule zt(r.engine, model);
    CHECK_THROWS_WITH_AS(zt.step(), doctest::Contains("without gradients"), Error);
    const auto [x, y] = batch(Model::kMlp, 0);
    model->loss(x, y, run_directly).backward();
    CHECK_THROWS_WITH_AS(model->loss(x, y, run_directly).backward(),
                         doctest::Contains("call zt.step() after each backward"), std::exception);
  }
  // Two ranks: one keeps stage 3's units whole (Note [one partition keeps
  // stage 3 resident]), so nothing would be refused.
  run_inprocess(2, [](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
    auto model = std::make_shared<Mlp>();
    TorchModule zt(engine, model);
    const auto [x, y] = batch(Model::kMlp, 0);
    // The parameters are empty outside zt.call: torch's shape checks fail,
    // nothing reads freed memory.
    CHECK_THROWS_AS((void)model->loss(x, y, run_directly), std::exception);
    // fc1 called through zt.call, its output used after (as it should be):
    // but fc2's parameters used directly are refused.
    torch::Tensor h = zt.call(*model->fc1, [&] { return model->fc1->forward(x); });
    CHECK_THROWS_AS((void)model->fc2->forward(h), std::exception);
  });
}

TEST_CASE("bf16 compute: the module becomes bf16, trains, and stages 0 and 3 agree bit for bit") {
  std::vector<std::vector<float>> finals;
  for (int stage : {0, 3}) {
    std::vector<float> final_w;
    std::vector<double> losses;
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      EngineConfig c = zest_config({}, stage);
      c.bf16 = true;
      Engine engine(c, comm, alloc, Stream::default_for(Device::host()));
      auto model = make_model(Model::kMlp);
      TorchModule zt(engine, model);
      const auto run = [&](const torch::nn::Module& m, const std::function<torch::Tensor()>& f) { return zt.call(m, f); };
      for (int s = 0; s < 20; ++s) {
        const auto [x, y] = batch(Model::kMlp, s);
        torch::Tensor loss = model->loss(x.narrow(0, 4 * comm.rank(), 4).to(torch::kBFloat16),
                                         y.narrow(0, 4 * comm.rank(), 4).to(torch::kBFloat16), run);
        CHECK((model->parameters()[0].scalar_type() == torch::kBFloat16));
        zt.scale(loss).backward();
        CHECK(zt.step().applied);
        if (comm.rank() == 0) losses.push_back(loss.item<double>());
      }
      std::vector<float> w = engine.param_master("fc2.weight");
      if (comm.rank() == 0) final_w = w;
    });
    CHECK((losses[15] + losses[16] + losses[17] + losses[18] + losses[19]) <
          0.95 * (losses[0] + losses[1] + losses[2] + losses[3] + losses[4]));
    finals.push_back(final_w);
  }
  CHECK(finals[0] == finals[1]);
}

TEST_CASE("gradient accumulation: two micro-steps of half the batch match torch on the whole batch") {
  TrainSpec spec;
  spec.steps = 10;
  const Trace ref = train_torch(spec);
  std::vector<float> zest_w;
  run_inprocess(2, [&](Communicator& comm) {
    torch::set_num_threads(1);
    CachingAllocator alloc(make_host_allocator());
    EngineConfig c = zest_config(spec, 2);
    c.gradient_accumulation_steps = 2;
    Engine engine(c, comm, alloc, Stream::default_for(Device::host()));
    auto model = make_model(Model::kMlp);
    TorchModule zt(engine, model);
    for (int s = 0; s < spec.steps; ++s) {
      const auto [x, y] = batch(Model::kMlp, s);
      for (int m = 0; m < 2; ++m) {
        const int64_t row = 4 * comm.rank() + 2 * m;  // rank's half of the batch, in two micro-batches
        zt.scale(model->loss(x.narrow(0, row, 2), y.narrow(0, row, 2), run_directly)).backward();
        CHECK(zt.step().boundary == (m == 1));
      }
    }
    std::vector<float> w = engine.param_master("fc2.weight");
    if (comm.rank() == 0) zest_w = w;
  });
  const std::vector<float>& want = ref.params.back().at("fc2.weight");
  REQUIRE(zest_w.size() == want.size());
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(zest_w[i]) - want[i]));
  CHECK(worst <= 5e-6);  // the tolerance of test_torch_equivalence.cpp, for the same reasons
  CHECK(worst > 0.0);    // a different summation order: not the same bits (so this compares something)
}

TEST_CASE("checkpoints: a run resumed from step 3 (at another stage) ends with the same bits") {
  const std::string dir = temp_dir("ckpt");
  const auto train = [&](int stage, int from, int to, bool save_at_3, bool load) {
    std::vector<float> out;
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, stage), comm, alloc, Stream::default_for(Device::host()));
      auto model = make_model(Model::kTransformer);
      TorchModuleOptions o;
      o.units = model->units();
      TorchModule zt(engine, model, o);
      if (load) zt.load(dir);
      const auto run = [&](const torch::nn::Module& m, const std::function<torch::Tensor()>& f) { return zt.call(m, f); };
      for (int s = from; s < to; ++s) {
        const auto [x, y] = batch(Model::kTransformer, s);
        zt.scale(model->loss(x.narrow(0, 4 * comm.rank(), 4), y.narrow(0, 4 * comm.rank(), 4), run)).backward();
        CHECK(zt.step().applied_steps == s + 1);
        if (save_at_3 && s == 2) zt.save(dir);
      }
      std::vector<float> w = engine.param_master("b1.up.weight");
      if (comm.rank() == 0) out = w;
    });
    return out;
  };
  const std::vector<float> straight = train(1, 0, 6, true, false);
  const std::vector<float> resumed = train(3, 3, 6, false, true);
  CHECK(straight == resumed);
  std::filesystem::remove_all(dir);
}

TEST_CASE("safetensors export: the module's own parameter names and shapes, the engine's values") {
  const std::string dir = temp_dir("export");
  std::filesystem::create_directories(dir);
  OneRank r(0);
  auto model = make_model(Model::kTransformer);
  TorchModuleOptions o;
  o.units = model->units();
  TorchModule zt(r.engine, model, o);
  zt.export_safetensors(dir + "/model.safetensors");
  const SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors");
  CHECK(f.tensors().size() == model->parameters().size());
  for (const auto& p : model->named_parameters()) {
    CAPTURE(p.key());
    const SafetensorsTensor& t = f.tensor(p.key());
    CHECK(t.shape == p.value().sizes().vec());
    std::vector<float> v(t.numel);
    f.read_as(p.key(), DType::kFloat32, std::as_writable_bytes(std::span(v)));
    CHECK(v == values(p.value()));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("after the TorchModule, the module keeps its trained values in memory of its own") {
  auto model = std::static_pointer_cast<Mlp>(make_model(Model::kMlp));
  std::vector<float> trained;
  {
    OneRank r(1);
    TorchModule zt(r.engine, model);
    const auto [x, y] = batch(Model::kMlp, 0);
    zt.scale(model->loss(x, y, run_directly)).backward();
    zt.step();
    trained = r.engine.param_master("fc1.weight");
  }
  CHECK(values(model->fc1->weight) == trained);
  // Still trainable by torch itself.
  const auto [x, y] = batch(Model::kMlp, 1);
  model->loss(x, y, run_directly).backward();
  CHECK(model->fc1->weight.grad().defined());
}

TEST_CASE("in-process ranks sharing a GPU are refused by name: their backward shares one autograd thread") {
  const std::string two = backward_thread_conflict("in-process", Device::cuda(0), 2, 1);
  CHECK(two.starts_with("TorchModule: 2 in-process ranks share cuda:0, and libtorch runs the backward"));
  CHECK(two.find("one rank per process and GPU") != std::string::npos);
  CHECK(backward_thread_conflict("in-process", Device::cuda(1), 2, 2).starts_with(
      "TorchModule: 4 in-process ranks share cuda:1 (2 of them a tensor-parallel group)"));
  CHECK(backward_thread_conflict("in-process", Device::cuda(0), 1, 2).starts_with(
      "TorchModule: 2 in-process ranks share cuda:0 (2 of them"));
  // Each backward on its calling thread (the host), one rank, or one
  // process a GPU: nothing to refuse.
  CHECK(backward_thread_conflict("in-process", Device::host(), 4, 2).empty());
  CHECK(backward_thread_conflict("in-process", Device::cuda(0), 1, 1).empty());
  CHECK(backward_thread_conflict("nccl", Device::cuda(0), 8, 2).empty());
  CHECK(backward_thread_conflict("mpi", Device::host(), 2, 1).empty());
}
