// Building modules for TorchModule (module_construction.h): reproducible
// construction on in-process ranks, and deferred construction (placeholders
// whose values come from build_unit one unit at a time), checked for values
// and for memory: a rank's growth during construction stays near its shards
// plus one unit, where building the whole model on every rank costs the
// whole model per rank.
#include <malloc.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "torch_harness.h"
#include "torch_doctest.h"
#include "zest/comm/inprocess_comm.h"

using namespace zest;
using namespace zest::test;

namespace {

// Units of one Linear each, drawn from torch's global generator as
// libtorch's modules draw their initial values.
struct Stack : torch::nn::Module {
  torch::nn::ModuleList blocks{nullptr};
  Stack(int units, int64_t width, bool placeholders) {
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < units; ++i) {
      torch::nn::Linear l = make_block(i, width);
      blocks->push_back(placeholders ? zest::placeholder(l) : l);
    }
  }
  // Block i alone, the same values whenever it is built.
  static torch::nn::Linear make_block(int i, int64_t width) {
    const std::lock_guard<std::mutex> lock(module_construction_mutex());
    torch::manual_seed(100 + static_cast<uint64_t>(i));
    return torch::nn::Linear(width, width);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() const {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (const auto& b : *blocks) out.push_back(b);
    return out;
  }
};

TorchModuleOptions stack_options(const Stack& model, int64_t width) {
  TorchModuleOptions o;
  o.units = model.units();
  o.build_unit = [width](const std::string& path) -> std::shared_ptr<torch::nn::Module> {
    // "blocks.<i>"
    return Stack::make_block(std::stoi(path.substr(path.rfind('.') + 1)), width).ptr();
  };
  return o;
}

using Masters = std::map<std::string, std::vector<float>>;

Masters masters_of(Engine& engine) {
  Masters m;
  for (const UnitLayout& u : engine.layout().units())
    for (const ParamLayout& p : u.params) m[p.name] = engine.param_master(p.name);
  return m;
}

struct Net : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(16, 32))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(32, 4))};
};

// Bytes from /proc/self/status ("VmRSS:   1234 kB").
int64_t proc_status_kib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
  }
  return -1;
}

}  // namespace

TEST_CASE("make_module_on: the same model on every run of in-process ranks") {
  // Four ranks build at once, each also drawing from torch's generator on
  // its own (as a data loader would) just before.
  const auto run = [] {
    Masters out;
    run_inprocess(4, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
      (void)torch::randn({64});
      auto net = make_module_on<Net>(comm);
      TorchModule zt(engine, net);
      const Masters m = masters_of(engine);
      if (comm.rank() == 0) out = m;
    });
    return out;
  };
  const Masters first = run();
  torch::manual_seed(0);
  auto alone = std::make_shared<Net>();  // what seed 0 builds on one thread
  for (int i = 0; i < 3; ++i) CHECK(run() == first);
  for (const auto& p : alone->named_parameters()) {
    CAPTURE(p.key());
    CHECK(values(p.value()) == first.at(p.key()));
  }
  auto seven = make_module<Net>(ModuleSeed{7});
  CHECK(values(seven->fc1->weight) != values(alone->fc1->weight));
}

TEST_CASE("deferred construction: placeholders take build_unit's values, at every stage the eager model's bits") {
  constexpr int kUnits = 5;
  constexpr int64_t kWidth = 24;
  for (const int world : {1, 2}) {
    for (const int stage : {0, 1, 2, 3}) {
      CAPTURE(world);
      CAPTURE(stage);
      std::vector<Masters> eager(static_cast<size_t>(world)), deferred(static_cast<size_t>(world));
      run_inprocess(world, [&](Communicator& comm) {
        for (const bool placeholders : {false, true}) {
          CachingAllocator alloc(make_host_allocator());
          Engine engine(zest_config({}, stage), comm, alloc, Stream::default_for(Device::host()));
          auto model = std::make_shared<Stack>(kUnits, kWidth, placeholders);
          if (placeholders) {
            for (const auto& p : model->parameters()) CHECK(is_placeholder(p));
          }
          TorchModule zt(engine, model, stack_options(*model, kWidth));
          for (const auto& p : model->parameters()) CHECK_FALSE(is_placeholder(p));
          (placeholders ? deferred : eager)[static_cast<size_t>(comm.rank())] = masters_of(engine);
          // It trains: a step through every unit.
          torch::Tensor h = torch::ones({2, kWidth});
          for (const auto& b : model->units()) {
            h = zt.call(*b, [&] { return torch::tanh(b->as<torch::nn::Linear>()->forward(h)); });
          }
          zt.scale(h.square().mean()).backward();
          CHECK(zt.step().applied);
        }
      });
      CHECK(deferred == eager);
    }
  }
}

TEST_CASE("deferred construction: refused without values, and build_unit's mistakes named") {
  run_inprocess(1, [&](Communicator& comm) {
    {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Stack>(2, 8, true);
      TorchModuleOptions o;
      o.units = model->units();
      CHECK_THROWS_WITH_AS(TorchModule(engine, model, o),
                           doctest::Contains("4 parameter(s) are placeholders (the first 'blocks.0.bias')"), Error);
    }
    {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Stack>(2, 8, true);
      TorchModuleOptions o = stack_options(*model, 8);
      o.build_unit = [](const std::string&) -> std::shared_ptr<torch::nn::Module> { return torch::nn::Linear(8, 9).ptr(); };
      CHECK_THROWS_WITH_AS(TorchModule(engine, model, o),
                           doctest::Contains("build_unit('blocks.0'): parameter 'weight' has shape [9, 8], the model's is [8, 8]"),
                           Error);
    }
    {
      // Loaded later: zeros until a weights import.
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Stack>(2, 8, true);
      TorchModuleOptions o;
      o.units = model->units();
      o.placeholders_loaded_later = true;
      TorchModule zt(engine, model, o);
      CHECK(engine.param_master("blocks.1.weight") == std::vector<float>(64, 0.0f));
    }
  });
}

TEST_CASE("init_from kZeros never zeroes values the module set: refused by name, placeholders and zeros accepted") {
  run_inprocess(1, [&](Communicator& comm) {
    {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Stack>(2, 8, false);  // built eagerly: random values
      TorchModuleOptions o;
      o.units = model->units();
      o.init_from = InitFrom::kZeros;
      CHECK_THROWS_WITH_AS(TorchModule(engine, model, o),
                           doctest::Contains("init_from is kZeros, which would zero parameter 'blocks.0.weight'"),
                           Error);
    }
    {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Stack>(2, 8, false);
      {
        const torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.zero_();
      }
      TorchModuleOptions o;
      o.units = model->units();
      o.init_from = InitFrom::kZeros;
      TorchModule zt(engine, model, o);  // zeros lose nothing
      CHECK(engine.param_master("blocks.1.weight") == std::vector<float>(64, 0.0f));
    }
  });
}

TEST_CASE("deferred construction: a rank grows by its shards and one unit, not by the model") {
  // 16 units of 1024 x 1024 (+ bias): 16.8M parameters, 64 MiB in fp32. On
  // 4 in-process ranks at stage 3 (fp32 AdamW) each rank's model states
  // are 4 bytes a parameter over 4 ranks (parameters, gradients, two
  // moments): 64 MiB a rank, all four together 256 MiB. Building the model
  // eagerly costs each rank the whole 64 MiB more, all four 256 MiB more.
  constexpr int kUnits = 16, kRanks = 4;
  constexpr int64_t kWidth = 1024;
  const double unit_mib = (kWidth * kWidth + kWidth) * 4.0 / (1 << 20);
  const auto grow_mib = [&](int64_t width, bool placeholders) {
    malloc_trim(0);  // what earlier tests freed leaves the process: growth is then new memory
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
    const int64_t before = proc_status_kib("VmRSS");
    std::vector<int64_t> states(kRanks);
    int64_t peak = 0;
    run_inprocess(kRanks, [&](Communicator& comm) {
      torch::set_num_threads(1);
      CachingAllocator alloc(make_host_allocator());
      EngineConfig config = zest_config({}, 3);
      config.zero.stage3_param_persistence_threshold = 0;
      Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Stack>(kUnits, width, placeholders);
      TorchModule zt(engine, model, stack_options(*model, width));
      states[static_cast<size_t>(comm.rank())] = engine.memory_report().model_states();
      comm.barrier(Stream::default_for(Device::host()));
      if (comm.rank() == 0) peak = proc_status_kib("VmHWM");
      comm.barrier(Stream::default_for(Device::host()));
    });
    REQUIRE(before > 0);
    REQUIRE(peak > 0);
    double shards_mib = 0;
    for (int64_t s : states) shards_mib += static_cast<double>(s) / (1 << 20);
    const double grown = static_cast<double>(peak - before) / 1024.0;
    MESSAGE(fmt::format("width {}, {}: peak RSS grew {:.1f} MiB; model states of the {} ranks {:.1f} MiB",
                        width, placeholders ? "deferred" : "eager", grown, kRanks, shards_mib));
    return std::pair{grown, shards_mib};
  };
  // What running 4 ranks costs whatever the model: their threads' stacks
  // and malloc arenas, libtorch's per-thread state, the engine's own
  // structures. Measured, not guessed: it is what a width-16 model grows by.
  const double overhead = grow_mib(16, true).first;
  const auto [deferred, shards] = grow_mib(kWidth, true);
  // Bound: that overhead, the shards, and per rank one unit three times
  // (build_unit's module, the engine's fp32 host copy of its initial values
  // and the staging buffer they reach the shards through, which the caching
  // allocator keeps), plus 2 MiB a rank for libtorch and the allocator's
  // rounding (the blocks left unsplit at the end of a segment).
  const double bound = overhead + shards + kRanks * (3 * unit_mib + 2);
  MESSAGE(fmt::format("deferred bound {:.1f} MiB ({:.1f} MiB of overhead, a unit {:.1f} MiB)", bound, overhead, unit_mib));
  CHECK(deferred <= bound);
  const auto [eager, shards_again] = grow_mib(kWidth, false);
  CHECK(shards_again == shards);
  // The bound is tight enough to tell: every rank holding the model breaks it.
  CHECK(eager > bound + kRanks * unit_mib * kUnits / 2);
}

TEST_CASE("placeholders loaded later: import_safetensors fills the base, the adapters absent from the file keep theirs") {
  const std::string file = (std::filesystem::temp_directory_path() / ("zest_base_" + std::to_string(getpid()) +
                                                                       ".safetensors")).string();
  constexpr int64_t kWidth = 24;
  Masters base;
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(zest_config({}, 3), comm, alloc, Stream::default_for(Device::host()));
    auto model = std::make_shared<Stack>(3, kWidth, false);
    TorchModule zt(engine, model, stack_options(*model, kWidth));
    zt.export_safetensors(file);
    const Masters m = masters_of(engine);
    if (comm.rank() == 0) base = m;
  });
  for (const int stage : {0, 3}) {
    CAPTURE(stage);
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(zest_config({}, stage), comm, alloc, Stream::default_for(Device::host()));
      auto model = std::make_shared<Stack>(3, kWidth, true);
      // An adapter on block 1 that the file does not have.
      torch::Tensor adapter = model->units()[1]->register_parameter("adapter", torch::full({4}, 0.25f));
      TorchModuleOptions o;
      o.units = model->units();
      o.placeholders_loaded_later = true;
      TorchModule zt(engine, model, o);
      CHECK_THROWS_WITH_AS(zt.import_safetensors(file), doctest::Contains("has no tensor 'blocks.1.adapter'"), Error);
      WeightsImportOptions io;
      io.keep_missing = [](const std::string& name) { return name.ends_with(".adapter"); };
      zt.import_safetensors(file, io);
      Masters got = masters_of(engine);
      CHECK(got.at("blocks.1.adapter") == std::vector<float>(4, 0.25f));
      got.erase("blocks.1.adapter");
      CHECK(got == base);
    });
  }
  std::filesystem::remove(file);
}
