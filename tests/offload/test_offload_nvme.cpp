// offload_optimizer device "nvme": the offloaded master weights and
// optimizer state in a swap file per rank, streamed through the buffer
// ring at each step, give the bits of CPU offload and of the device run at
// stages 1-3 on 1, 2 and 4 in-process ranks, fp32 and bf16, all or half of
// the state offloaded (checkpoints: test_offload_checkpoint.cpp); the swap
// files go with the engine; a failed transfer is an error naming the file
// and the operation, and a failed step() leaves the rank as it was before;
// on 2 ranks a failure on one is agreed, and both keep the state before it.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "checkpoint/temp_dir.h"
#include "config/config_test_helpers.h"
#include "engine/engine_harness.h"
#include "offload/memory_as_estimated.h"
#include "offload/nvme_test_helpers.h"
#include "error_of.h"
#include "zest/config/config.h"
#include "zest/engine/detail/optimizer_offload.h"

namespace test_offload_nvme {

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

EngineConfig on(EngineConfig c, OffloadDevice device, const std::string& dir, double ratio = 1.0) {
  c.offload_optimizer.device = device;
  c.offload_optimizer.ratio = ratio;
  c.offload_optimizer.nvme_path = device == OffloadDevice::kNvme ? dir : "";
  // Two buffers: every chunk after the first is read while one is updated.
  c.offload_optimizer.buffer_count = 2;
  return c;
}

void check_same_run(const std::vector<RankResult>& got, const std::vector<RankResult>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    REQUIRE(got[r].params.size() == want[r].params.size());
    for (const auto& [name, values] : got[r].params) {
      CAPTURE(name);
      CHECK(same_bits(values, want[r].params.at(name)));
    }
    REQUIRE(got[r].steps.size() == want[r].steps.size());
    for (size_t s = 0; s < got[r].steps.size(); ++s) {
      CHECK(got[r].steps[s].grad_norm == want[r].steps[s].grad_norm);
      CHECK(got[r].steps[s].applied == want[r].steps[s].applied);
    }
  }
}

// A model of larger units than register_model's, so the host part is many
// chunks (OptimizerOffload::chunk_numel) at every world size.
void large_model(Engine& engine) {
  engine.add_param_group("no_decay", 0.0f);
  engine.add_unit("a", {{"a.w", {7, 13}}, {"a.b", {7}, "no_decay"}});
  engine.add_unit("big", {{"big.w", {96, 70}}, {"big.b", {96}, "no_decay"}});
  engine.add_unit("c", {{"c.w", {11, 3}}});
}

// large_model, as the estimator describes it.
ModelDescription large_model_description() {
  ModelDescription m;
  m.units = {{"a", {91, 7}, 1}, {"big", {6720, 96}, 1}, {"c", {33}, 1}};
  return m;
}

}  // namespace

TEST_CASE("offload_optimizer nvme equals cpu offload and the device run bit for bit: stages 1-3, 1, 2 and 4 ranks") {
  for (const bool bf16 : {false, true}) {
    for (int world : {1, 2, 4}) {
      for (int stage : {1, 2, 3}) {
        CAPTURE(bf16);
        CAPTURE(world);
        CAPTURE(stage);
        EngineConfig config = base_config(stage);
        config.bf16 = bf16;
        config.gradient_accumulation_steps = 2;
        config.gradient_clipping = 0.5;
        RunOptions opt = runs(world, 3);
        if (world == 2) opt.model = large_model;
        const std::vector<RankResult> device = run_engine(config, opt);
        for (double ratio : {1.0, 0.5}) {
          CAPTURE(ratio);
          TempDir dir;
          const std::vector<RankResult> cpu = run_engine(on(config, OffloadDevice::kCpu, "", ratio), opt);
          const std::vector<RankResult> nvme = run_engine(on(config, OffloadDevice::kNvme, dir.str(), ratio), opt);
          check_same_run(nvme, cpu);
          check_same_run(nvme, device);
          // The swap files went with the engines.
          CHECK(files_in(dir.str()) == 0);
        }
        if (stage == 3) {
          INFO("offload_param cpu with offload_optimizer nvme");
          TempDir dir;
          EngineConfig both = on(config, OffloadDevice::kNvme, dir.str());
          both.offload_param.device = OffloadDevice::kCpu;
          check_same_run(run_engine(both, opt), device);
        }
      }
    }
  }
}

TEST_CASE("offload_optimizer nvme: one swap file per rank while the engine lives, none after") {
  TempDir dir;
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    {
      const std::unique_ptr<Engine> engine = finalized_engine(on(base_config(2), OffloadDevice::kNvme, dir.str()), comm,
                                                              alloc, host, Stream::default_for(Device::host()));
      REQUIRE(files_in(dir.str()) == 1);
      for (const auto& e : fs::directory_iterator(dir.path)) {
        CHECK(e.path().filename().string().starts_with(std::string(kSwapFilePrefix) + "r0."));
      }
      // No master weights or state in host memory: they are in the file.
      const MemoryReport m = engine->memory_report();
      CHECK(m.host(MemoryCategory::kMasterWeights).current == 0);
      CHECK(m.host(MemoryCategory::kOptimizerState).current == 0);
      // The NVMe tier it reports is the file's size.
      REQUIRE(m.nvme_bytes() > 0);
      for (const auto& e : fs::directory_iterator(dir.path)) CHECK(fs::file_size(e.path()) == uint64_t(m.nvme_bytes()));
    }
    CHECK(files_in(dir.str()) == 0);
  });
}

TEST_CASE("offload_optimizer nvme: device, host and NVMe bytes equal the estimate, stages 1-3, ratio 1 and 0.5") {
  TempDir dir;
  for (const bool bf16_compute : {false, true}) {
    for (int world : {1, 2}) {
      for (int stage : {1, 2, 3}) {
        for (double ratio : {1.0, 0.5}) {
          CAPTURE(bf16_compute);
          CAPTURE(world);
          CAPTURE(stage);
          CAPTURE(ratio);
          EngineConfig config = base_config(stage);
          config.bf16 = bf16_compute;
          config = on(config, OffloadDevice::kNvme, dir.str(), ratio);
          RunOptions opt;
          opt.world = world;
          opt.steps = 2;
          opt.model = large_model;
          const std::vector<RankResult> got = run_engine(config, opt);
          const MemoryEstimate e =
              estimate_memory(large_model_description(), EstimateOptions::from_config(config, world));
          REQUIRE(e.nvme_bytes > 0);
          for (const RankResult& g : got) check_memory_as_estimated(g.memory, e);
        }
      }
    }
  }
}

TEST_CASE("a real DeepSpeed ZeRO-3 offload file with offload_optimizer device nvme trains as with device cpu") {
  TempDir swap;
  std::ifstream in(ds_config_path("llamafactory__examples_deepspeed_ds_z3_offload_config.json"));
  std::stringstream text;
  text << in.rdbuf();
  std::string json = text.str();
  // The file's offload_optimizer is its first device.
  const std::string cpu = "\"device\": \"cpu\"";
  const size_t at = json.find(cpu);
  REQUIRE(at != std::string::npos);
  json.replace(at, cpu.size(),
               fmt::format("\"device\": \"nvme\", \"nvme_path\": \"{}\", \"buffer_count\": 4, \"fast_init\": false",
                           swap.str()));
  json.insert(json.rfind('}'), R"(, "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1,
                                              "single_submit": false, "overlap_events": true})");
  EngineConfig config = parse_config_json(json, ds_config_program());
  REQUIRE(config.offload_optimizer.device == OffloadDevice::kNvme);
  REQUIRE(config.offload_optimizer.pin_memory);
  config.zero.stage3_param_persistence_threshold = 0;  // as the cpu file's test: units gathered on demand
  EngineConfig reference = config;
  reference.offload_optimizer.device = OffloadDevice::kCpu;
  const std::vector<RankResult> want = run_engine(reference, runs(2, 3));
  const std::vector<RankResult> got = run_engine(config, runs(2, 3));
  check_same_run(got, want);
  REQUIRE(got[0].steps.size() == 3);
  CHECK(got[0].steps[2].applied);
  CHECK(files_in(swap.str()) == 0);
}

TEST_CASE("offload_optimizer nvme: settings it cannot run are errors naming the key or the path") {
  TempDir dir;
  EngineConfig config = on(base_config(2), OffloadDevice::kNvme, dir.str());
  config.offload_optimizer.delayed_update = true;
  CHECK(error_of([&] { construct_engines(config, 1); }).find(
            "offload_optimizer.delayed_update with device \"nvme\" is not supported") != std::string::npos);
  config.offload_optimizer.delayed_update = false;
  // The swap file is made when the engine is finalized.
  config.offload_optimizer.nvme_path = (dir.path / "missing").string();
  const std::string missing = error_of([&] { run_engine(config, runs(1, 1)); });
  CAPTURE(missing);
  CHECK(missing.find(config.offload_optimizer.nvme_path) != std::string::npos);
  config.offload_optimizer.nvme_path = dir.str();
  config.optimizer.kind = OptimizerKind::kLamb;
  CHECK(error_of([&] { construct_engines(config, 1); }).find("optimizer Lamb with zero_optimization.offload_optimizer") !=
        std::string::npos);
}

namespace {

std::byte* bytes(std::vector<float>& v) { return reinterpret_cast<std::byte*>(v.data()); }

// One unit of n elements, its master, state, gradients and parameters in
// host memory, stepped by an OptimizerOffload in memory or in a swap file.
struct HostPart {
  static constexpr size_t n = 64 * 8;  // 8 chunks of 64 (chunk_for)
  std::vector<float> master = std::vector<float>(n), grad = std::vector<float>(n), params = std::vector<float>(n);
  std::vector<GroupRun> runs{{0, n, 0}};
  HostPart() {
    for (size_t i = 0; i < n; ++i) {
      master[i] = noise(1, static_cast<uint32_t>(i), 2);
      grad[i] = noise(3, static_cast<uint32_t>(i), 4);
    }
  }
  OffloadUnit unit() { return {0, n, bytes(grad), bytes(params), &runs, {}}; }
  void step(OptimizerOffload& off, int64_t t) {
    const OffloadUnit u = unit();
    const std::vector<float> decay{0.05f};
    OptimizerConfig config;
    StepScalars s;
    s.lr = 0.01f;
    s.step = t;
    off.step(Stream::default_for(Device::host()), config, std::span<const OffloadUnit>(&u, 1), decay, s);
  }
  std::vector<float> read(const OptimizerOffload& off, int b) {
    std::vector<float> v(n);
    off.read(b, 0, n, bytes(v));
    return v;
  }
};

}  // namespace

TEST_CASE("an I/O failure in the nvme step throws naming the file and the operation, and the state before it stays") {
  // The master's first write: 8 records, each read and written back (16
  // transfers). Then the step's, two buffers: read 0, write 0, read 1,
  // write 1, read 2, ...
  struct Case {
    const char* what;
    AioFault fault;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"EIO reading chunk 1", {.fail_at = 16 + 2, .error = EIO}, "read of 4096 bytes at offset 4096 failed"},
      {"ENOSPC writing chunk 0", {.fail_at = 16 + 1, .error = ENOSPC}, "No space left on device"},
      {"short read of chunk 2", {.fail_at = 16 + 4, .short_by = 512}, "short read at offset 8192 (3584 of 4096 bytes)"},
  };
  CachingAllocator host(make_host_allocator());
  HostPart want_part;
  OptimizerOffload reference(host, Device::host(), HostPart::n, 2, OffloadDtypes{}, false);
  reference.write(0, 0, HostPart::n, bytes(want_part.master));
  want_part.step(reference, 1);
  for (const Case& c : cases) {
    CAPTURE(c.what);
    TempDir dir;
    OffloadSwapConfig swap{dir.str(), 2, 0, {},
                           make_faulty_aio_backend(make_aio_backend({}, {.kind = AioBackendKind::kThreadPool}), c.fault)};
    HostPart part;
    OptimizerOffload off(host, Device::host(), HostPart::n, 2, OffloadDtypes{}, false, &swap);
    REQUIRE(off.swap() != nullptr);
    off.write(0, 0, HostPart::n, bytes(part.master));
    const std::string message = error_of([&] { part.step(off, 1); });
    CAPTURE(message);
    CHECK(message.starts_with(fmt::format("NVMe swap file {}: ", off.swap()->path())));
    CHECK(message.find(c.says) != std::string::npos);
    // The master weights and state are those before the step.
    CHECK(same_bits(part.read(off, 0), part.master));
    CHECK(same_bits(part.read(off, 1), std::vector<float>(HostPart::n)));
    CHECK(same_bits(part.read(off, 2), std::vector<float>(HostPart::n)));
    // The step again, the fault passed: the bits of the step in memory.
    part.step(off, 1);
    for (int b = 0; b < 3; ++b) CHECK(same_bits(part.read(off, b), want_part.read(reference, b)));
    CHECK(same_bits(part.params, want_part.params));
  }
}

TEST_CASE("a failed nvme step() throws and leaves the rank as before it, and the step again has the bits of CPU offload") {
  std::atomic<int> countdown{0};
  set_offload_swap_io([&] { return std::make_shared<FailingIo>(AioOp::kRead, countdown); });
  for (const bool bf16 : {false, true}) {
    for (const double ratio : {1.0, 0.5}) {
      CAPTURE(bf16);
      CAPTURE(ratio);
      EngineConfig config = base_config(2);
      config.bf16 = bf16;
      RunOptions opt = runs(1, 2);
      opt.model = large_model;
      const std::vector<RankResult> want = run_engine(on(config, OffloadDevice::kCpu, "", ratio), opt);
      TempDir dir;
      run_inprocess(1, [&](Communicator& comm) {
        CachingAllocator alloc(make_host_allocator());
        CachingAllocator host(make_host_allocator());
        const std::unique_ptr<Engine> engine =
            finalized_engine(on(config, OffloadDevice::kNvme, dir.str(), ratio), comm, alloc, host,
                             Stream::default_for(Device::host()), large_model);
        RankResult r;
        run_steps(*engine, comm, opt, 0, 1, r);
        const Params master = master_params(*engine);
        const std::vector<std::vector<std::byte>> params = gathered_params(*engine);
        // The step's third read: chunks 0 and 1 are updated and their
        // parameters sent when it fails.
        countdown = 3;
        const std::string message = error_of([&] { run_steps(*engine, comm, opt, 1, 2, r); });
        CAPTURE(message);
        CHECK(message.starts_with("NVMe swap file " + dir.str() + "/" + kSwapFilePrefix));
        CHECK(message.find(": read of ") != std::string::npos);
        CHECK(message.find("Input/output error") != std::string::npos);
        check_same(master_params(*engine), master);
        CHECK(gathered_params(*engine) == params);
        CHECK(engine->progress().applied_steps == 1);
        run_steps(*engine, comm, opt, 1, 2, r);
        check_same(master_params(*engine), want[0].params);
      });
    }
  }
  set_offload_swap_io({});
}

namespace {

// The in-process rank of this thread, for a swap I/O that fails on one rank.
thread_local int this_rank = 0;

}  // namespace

TEST_CASE("a failed nvme step on one rank of 2 throws on both, each keeps the state before it, and the step again has the bits of CPU offload") {
  std::array<std::atomic<int>, 2> countdown{};
  set_offload_swap_io([&] { return std::make_shared<FailingIo>(AioOp::kRead, countdown[static_cast<size_t>(this_rank)]); });
  for (const int stage : {2, 3}) {
    CAPTURE(stage);
    // Rank 1 fails at stage 2, rank 0 at stage 3.
    const int failing = stage == 2 ? 1 : 0;
    EngineConfig config = base_config(stage);
    config.bf16 = true;
    RunOptions opt = runs(2, 2);
    opt.model = large_model;
    const std::vector<RankResult> want = run_engine(on(config, OffloadDevice::kCpu, ""), opt);
    TempDir dir;
    run_inprocess(2, [&](Communicator& comm) {
      this_rank = comm.rank();
      CachingAllocator alloc(make_host_allocator());
      CachingAllocator host(make_host_allocator());
      const std::unique_ptr<Engine> engine = finalized_engine(on(config, OffloadDevice::kNvme, dir.str()), comm,
                                                              alloc, host, Stream::default_for(Device::host()),
                                                              large_model);
      RankResult r;
      run_steps(*engine, comm, opt, 0, 1, r);
      const Params master = master_params(*engine);
      const std::vector<std::vector<std::byte>> params = gathered_params(*engine);
      // The failing rank's third read of the step; the other's step succeeds.
      if (comm.rank() == failing) countdown[static_cast<size_t>(failing)] = 3;
      const std::string message = error_of([&] { run_steps(*engine, comm, opt, 1, 2, r); });
      CAPTURE(message);
      if (comm.rank() == failing) {
        CHECK(message.starts_with("NVMe swap file " + dir.str() + "/" + kSwapFilePrefix));
        CHECK(message.find("Input/output error") != std::string::npos);
      } else {
        CHECK(message.starts_with(fmt::format("offload_optimizer nvme: the step failed on rank {} ", failing)));
      }
      // Every rank as before the step: master weights, parameters, count.
      check_same(master_params(*engine), master);
      CHECK(gathered_params(*engine) == params);
      CHECK(engine->progress().applied_steps == 1);
      // In step: the step again, on both, has CPU offload's bits.
      run_steps(*engine, comm, opt, 1, 2, r);
      check_same(master_params(*engine), want[static_cast<size_t>(comm.rank())].params);
      CHECK(engine->progress().applied_steps == 2);
    });
  }
  set_offload_swap_io({});
}

}  // namespace test_offload_nvme
