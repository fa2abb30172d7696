// offload_param device "nvme" at stage 3 (engine/detail/param_swap.h): the
// parameter shards past max_in_cpu in a swap file per rank, read through a
// pool of buffer_count buffers when gathered (ahead, in the recorded order,
// once it is recorded) and written back by the step. The bits of
// offload_param cpu and of no offload at all, on 1, 2 and 4 in-process ranks,
// fp32 and bf16, with units kept whole by the persistence threshold, units
// in host memory by max_in_cpu, and more units on NVMe than buffers; the
// file's bytes in memory_report(), as estimated; buffer_count reads in
// flight at most, and that many; buffer_size and buffer_count refused by
// name; a failed read at a gather and a failed write in the step are errors
// naming the file and the operation that leave the rank as it was;
// DeepSpeedExamples' ZeRO-Infinity file loads with its values and trains.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint/temp_dir.h"
#include "config/config_test_helpers.h"
#include "engine/engine_harness.h"
#include "error_of.h"
#include "offload/memory_as_estimated.h"
#include "offload/nvme_test_helpers.h"
#include "zest/config/config.h"
#include "zest/engine/detail/offload_swap.h"
#include "zest/engine/detail/param_swap.h"
#include "zest/nvme/swap_file.h"

namespace test_offload_nvme_param {

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

// Five units: "c" (33 elements) under the persistence threshold of 40, kept
// whole; the others gathered on demand, three of them larger than the rest.
void nvme_model(Engine& engine) {
  engine.add_param_group("no_decay", 0.0f);
  engine.add_unit("a", {{"a.w", {7, 13}}, {"a.b", {7}, "no_decay"}});
  engine.add_unit("big", {{"big.w", {96, 70}}, {"big.b", {96}, "no_decay"}});
  engine.add_unit("c", {{"c.w", {11, 3}}});
  engine.add_unit("mid", {{"mid.w", {40, 50}}});
  engine.add_unit("tail", {{"tail.w", {33, 29}}, {"tail.b", {33}, "no_decay"}});
}

// nvme_model, as the estimator describes it.
ModelDescription nvme_model_description() {
  ModelDescription m;
  m.units = {{"a", {91, 7}, 1}, {"big", {6720, 96}, 1}, {"c", {33}, 1}, {"mid", {2000}, 1}, {"tail", {957, 33}, 1}};
  return m;
}

EngineConfig stage3(bool bf16) {
  EngineConfig c = base_config(3);
  c.bf16 = bf16;
  c.gradient_accumulation_steps = 2;
  c.gradient_clipping = 0.5;
  c.zero.stage3_param_persistence_threshold = 40;
  return c;
}

// offload_optimizer nvme, and offload_param `device` (nvme: max_in_cpu
// elements in host memory, a pool of two buffers).
EngineConfig offloaded(EngineConfig c, OffloadDevice device, const std::string& dir, int64_t max_in_cpu = 0) {
  c.offload_optimizer.device = OffloadDevice::kNvme;
  c.offload_optimizer.nvme_path = dir;
  c.offload_optimizer.buffer_count = 2;
  c.offload_param.device = device;
  if (device == OffloadDevice::kNvme) {
    c.offload_param.nvme_path = dir;
    c.offload_param.buffer_count = 2;
    c.offload_param.max_in_cpu = max_in_cpu;
  }
  return c;
}

struct Run {
  Params master;
  std::vector<std::vector<std::byte>> params;  // gathered after the last step
  std::vector<StepResult> steps;
  MemoryReport memory;
};

// `steps` optimizer steps of nvme_model on `world` in-process ranks.
std::vector<Run> run(const EngineConfig& config, int world, int steps) {
  std::vector<Run> out(static_cast<size_t>(world));
  CommOptions comm_options;
  comm_options.timeout = std::chrono::seconds(20);
  run_inprocess(
      world,
      [&](Communicator& comm) {
        CachingAllocator alloc(make_host_allocator());
        CachingAllocator host(make_host_allocator());
        const std::unique_ptr<Engine> engine =
            finalized_engine(config, comm, alloc, host, Stream::default_for(Device::host()), nvme_model);
        RankResult r;
        run_steps(*engine, comm, runs(world, steps), 0, steps, r);
        Run& mine = out[static_cast<size_t>(comm.rank())];
        mine.memory = engine->memory_report();
        mine.master = master_params(*engine);
        mine.params = gathered_params(*engine);
        mine.steps = r.steps;
      },
      Device::host(), comm_options);
  return out;
}

void check_same_run(const std::vector<Run>& got, const std::vector<Run>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    check_same(got[r].master, want[r].master);
    CHECK(got[r].params == want[r].params);
    REQUIRE(got[r].steps.size() == want[r].steps.size());
    for (size_t s = 0; s < got[r].steps.size(); ++s) {
      CHECK(got[r].steps[s].grad_norm == want[r].steps[s].grad_norm);
      CHECK(got[r].steps[s].applied);
    }
  }
}

}  // namespace

TEST_CASE("offload_param nvme equals offload_param cpu and no offload bit for bit: stage 3, 1, 2 and 4 ranks") {
  for (const bool bf16 : {false, true}) {
    for (const int world : {1, 2, 4}) {
      CAPTURE(bf16);
      CAPTURE(world);
      TempDir dir;
      const EngineConfig config = stage3(bf16);
      const std::vector<Run> none = run(config, world, 3);
      const std::vector<Run> cpu = run(offloaded(config, OffloadDevice::kCpu, dir.str()), world, 3);
      check_same_run(cpu, none);
      // Every unit gathered on demand on NVMe, and with "a" (98 elements,
      // its shard 256 at these world sizes) kept in host memory by
      // max_in_cpu.
      for (const int64_t max_in_cpu : {int64_t{0}, int64_t{256}}) {
        CAPTURE(max_in_cpu);
        const EngineConfig nvme_config = offloaded(config, OffloadDevice::kNvme, dir.str(), max_in_cpu);
        const std::vector<Run> nvme = run(nvme_config, world, 3);
        check_same_run(nvme, cpu);
        const MemoryEstimate e =
            estimate_memory(nvme_model_description(), EstimateOptions::from_config(nvme_config, world));
        for (const Run& r : nvme) {
          // The shards past max_in_cpu are in the file, not in host memory;
          // device, host and NVMe bytes as estimated.
          CHECK(r.memory.nvme(MemoryCategory::kParameters).current > 0);
          CHECK((r.memory.host(MemoryCategory::kParameters).current > 0) == (max_in_cpu > 0));
          check_memory_as_estimated(r.memory, e);
        }
        CHECK(files_in(dir.str()) == 0);
      }
    }
  }
}

TEST_CASE("offload_param nvme: one buffer or many, reads ahead in the recorded order or none, the same bits") {
  // Four units on NVMe: one buffer reads one ahead, two cycle through the
  // units, five hold them all; reuse distance 0 gathers every unit again
  // for its backward, from the file.
  TempDir dir;
  for (const int64_t reuse : {int64_t{0}, int64_t{1'000'000'000}}) {
    CAPTURE(reuse);
    EngineConfig config = stage3(false);
    config.zero.stage3_max_reuse_distance = reuse;
    const std::vector<Run> want = run(offloaded(config, OffloadDevice::kCpu, dir.str()), 2, 3);
    EngineConfig nvme = offloaded(config, OffloadDevice::kNvme, dir.str());
    for (const int buffers : {1, 2, 5}) {
      CAPTURE(buffers);
      nvme.offload_param.buffer_count = buffers;
      check_same_run(run(nvme, 2, 3), want);
    }
  }
}

TEST_CASE("offload_param nvme: one swap file per rank for the parameters while the engine lives, its bytes reported") {
  TempDir dir;
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    {
      const std::unique_ptr<Engine> engine =
          finalized_engine(offloaded(stage3(false), OffloadDevice::kNvme, dir.str()), comm, alloc, host,
                           Stream::default_for(Device::host()), nvme_model);
      // The optimizer's file and the parameters'.
      REQUIRE(files_in(dir.str()) == 2);
      const MemoryReport m = engine->memory_report();
      uint64_t sizes = 0;
      for (const auto& e : fs::directory_iterator(dir.path)) sizes += fs::file_size(e.path());
      CHECK(sizes == uint64_t(m.nvme_bytes()));
      // Four units on NVMe, two slots each of their shards (fp32, one rank:
      // 256, 6912, 2048 and 1024 elements with padding) in 4096-byte blocks.
      CHECK(m.nvme(MemoryCategory::kParameters).current == 2 * 4096 * (1 + 7 + 2 + 1));
      CHECK(m.host(MemoryCategory::kParameters).current == 0);
      // Unit "c" is kept whole on the device; nothing else is there.
      CHECK(m[MemoryCategory::kParameters].current == 256 * 4);
      // The pool (two buffers of big's shard, 27648 bytes in 4096-byte
      // blocks) beside the optimizer's ring, in the host's comm_buffers.
      CHECK(m.host_swap_buffers >= 2 * 28672);
      CHECK(m.host(MemoryCategory::kCommBuffers).current >= m.host_swap_buffers);
    }
    CHECK(files_in(dir.str()) == 0);
  });
}

TEST_CASE("offload_param nvme: buffer_size and buffer_count it cannot run are errors naming the key and the value") {
  TempDir dir;
  EngineConfig config = offloaded(stage3(false), OffloadDevice::kNvme, dir.str());
  config.offload_param.buffer_size = 2048;
  const std::string small = error_of([&] { run(config, 1, 1); });
  CHECK(small ==
        "zero_optimization.offload_param.buffer_size is 2048 elements, but unit 'big' keeps a shard of 6912 elements "
        "on NVMe, which must fit one buffer (DeepSpeed asserts the same); set buffer_size to at least 6912, or raise "
        "max_in_cpu to keep the unit in host memory");
  // Kept in host memory by max_in_cpu (with "a" before it), it need not
  // fit; "mid" (2048) and "tail" (1024) do.
  config.offload_param.max_in_cpu = 256 + 6912;
  CHECK_NOTHROW(run(config, 1, 1));
  config.offload_param.buffer_size = 100'000'000;
  config.offload_param.buffer_count = 0;
  CHECK(error_of([&] { run(config, 1, 1); }).starts_with("zero_optimization.offload_param.buffer_count is 0: it "
                                                           "must be at least 1"));
  CHECK(files_in(dir.str()) == 0);
  // The parameters' directory is their own: a missing one is named.
  config.offload_param.buffer_count = 2;
  config.offload_param.nvme_path = (dir.path / "missing").string();
  const std::string missing = error_of([&] { run(config, 1, 1); });
  CAPTURE(missing);
  CHECK(missing.find(config.offload_param.nvme_path) != std::string::npos);
  CHECK(files_in(dir.str()) == 0);
  config.offload_param.nvme_path = dir.str();
  // With the optimizer in host memory a failed write could not be undone.
  config.offload_param.buffer_count = 2;
  config.offload_optimizer.device = OffloadDevice::kCpu;
  CHECK(error_of([&] { construct_engines(config, 1); })
            .starts_with("zero_optimization.offload_param (device nvme) needs offload_optimizer {\"device\": \"nvme\"}"));
}

namespace {

// The parameters' swap file is an engine's second (after the optimizer's):
// set_offload_swap_io's factory counts this thread's files.
thread_local int this_rank = 0;
thread_local int files_made = 0;

// The I/O of an engine's parameter swap file: a thread pool's, counting the
// most reads in flight at once (submitted, not yet waited for).
class CountingReads : public AioBackend {
 public:
  explicit CountingReads(std::atomic<int>& most)
      : inner_(make_aio_backend({}, {.kind = AioBackendKind::kThreadPool})), most_(most) {}
  std::string_view name() const override { return "counting reads"; }
  AioHandle submit(const AioRequest& r) override {
    const AioHandle h = inner_->submit(r);
    if (r.op == AioOp::kRead) {
      reads_.insert(h);
      most_ = std::max<int>(most_, static_cast<int>(reads_.size()));
    }
    return h;
  }
  AioResult wait(AioHandle h) override {
    reads_.erase(h);
    return inner_->wait(h);
  }

 private:
  std::unique_ptr<AioBackend> inner_;
  std::atomic<int>& most_;
  std::set<AioHandle> reads_;
};

}  // namespace

TEST_CASE("offload_param nvme: the prefetcher has buffer_count reads in flight at most, and that many") {
  // Four units on NVMe; the recorded order (from the second step) is read
  // ahead into every free buffer, with or without a prefetch window.
  std::atomic<int> most{0};
  set_offload_swap_io([&]() -> std::shared_ptr<AioBackend> {
    if (++files_made % 2 == 1) return make_aio_backend({}, {.kind = AioBackendKind::kThreadPool});
    return std::make_shared<CountingReads>(most);
  });
  TempDir dir;
  for (const int64_t window : {int64_t{0}, int64_t{50'000'000}}) {
    for (const int buffers : {1, 2, 3}) {
      CAPTURE(window);
      CAPTURE(buffers);
      EngineConfig config = offloaded(stage3(false), OffloadDevice::kNvme, dir.str());
      config.zero.stage3_prefetch_bucket_size = window;
      config.zero.stage3_max_reuse_distance = 0;
      config.offload_param.buffer_count = buffers;
      most = 0;
      files_made = 0;
      (void)run(config, 1, 3);
      CHECK(most == buffers);
    }
  }
  set_offload_swap_io({});
}

TEST_CASE("offload_param nvme: a failed read at a gather throws naming the file, and the gather again succeeds") {
  std::atomic<int> countdown{0};
  // The parameters' file is an engine's second (after the optimizer's).
  set_offload_swap_io([&]() -> std::shared_ptr<AioBackend> {
    if (++files_made % 2 == 1) return make_aio_backend({}, {.kind = AioBackendKind::kThreadPool});
    return std::make_shared<FailingIo>(AioOp::kRead, countdown);
  });
  TempDir dir;
  // Released units go at once (no reuse distance) and none is gathered
  // ahead (no prefetch window), so a gather reads.
  EngineConfig config = offloaded(stage3(true), OffloadDevice::kNvme, dir.str());
  config.zero.stage3_max_reuse_distance = 0;
  config.zero.stage3_prefetch_bucket_size = 0;
  run_inprocess(1, [&](Communicator& comm) {
    files_made = 0;
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    const std::unique_ptr<Engine> engine =
        finalized_engine(config, comm, alloc, host, Stream::default_for(Device::host()), nvme_model);
    RankResult r;
    run_steps(*engine, comm, runs(1, 1), 0, 1, r);
    const std::vector<std::vector<std::byte>> params = gathered_params(*engine);
    // The next read of the parameters' file: unit "a"'s, which the last
    // gathers did not read ahead ("mid" and "big" come next in the order,
    // their reads in flight give way to it).
    countdown = 1;
    const std::string message = error_of([&] { UnitHandle h = engine->gather(0); });
    CAPTURE(message);
    CHECK(message.starts_with("NVMe swap file " + dir.str() + "/" + kSwapFilePrefix));
    CHECK(message.find(": read of ") != std::string::npos);
    CHECK(message.find("Input/output error") != std::string::npos);
    // Nothing is left gathered or held: the same gathers again, then steps.
    CHECK(gathered_params(*engine) == params);
    run_steps(*engine, comm, runs(1, 2), 1, 2, r);
    CHECK(engine->progress().applied_steps == 2);
  });
  set_offload_swap_io({});
}

TEST_CASE("offload_param nvme: a failed write in the step throws on every rank, each keeps the state before it, "
          "and the step again has the bits of offload_param cpu") {
  std::array<std::atomic<int>, 2> countdown{};
  set_offload_swap_io([&]() -> std::shared_ptr<AioBackend> {
    if (++files_made % 2 == 1) return make_aio_backend({}, {.kind = AioBackendKind::kThreadPool});
    return std::make_shared<FailingIo>(AioOp::kWrite, countdown[static_cast<size_t>(this_rank)]);
  });
  for (const int world : {1, 2}) {
    CAPTURE(world);
    TempDir dir;
    const EngineConfig config = stage3(true);
    const std::vector<Run> want = run(offloaded(config, OffloadDevice::kCpu, dir.str()), world, 2);
    const int failing = world - 1;
    run_inprocess(world, [&](Communicator& comm) {
      this_rank = comm.rank();
      files_made = 0;
      CachingAllocator alloc(make_host_allocator());
      CachingAllocator host(make_host_allocator());
      const std::unique_ptr<Engine> engine =
          finalized_engine(offloaded(config, OffloadDevice::kNvme, dir.str()), comm, alloc, host,
                           Stream::default_for(Device::host()), nvme_model);
      RankResult r;
      run_steps(*engine, comm, runs(world, 2), 0, 1, r);
      const Params master = master_params(*engine);
      const std::vector<std::vector<std::byte>> params = gathered_params(*engine);
      // The step's third unit written back fails: two units' new values are
      // in their other slots by then.
      if (comm.rank() == failing) countdown[static_cast<size_t>(failing)] = 3;
      const std::string message = error_of([&] { run_steps(*engine, comm, runs(world, 2), 1, 2, r); });
      CAPTURE(message);
      if (comm.rank() == failing) {
        CHECK(message.starts_with("NVMe swap file " + dir.str() + "/" + kSwapFilePrefix));
        CHECK(message.find(": write of ") != std::string::npos);
        CHECK(message.find("No space left on device") != std::string::npos);
      } else {
        CHECK(message.starts_with(fmt::format("offload_optimizer nvme: the step failed on rank {} ", failing)));
      }
      check_same(master_params(*engine), master);
      CHECK(gathered_params(*engine) == params);
      CHECK(engine->progress().applied_steps == 1);
      run_steps(*engine, comm, runs(world, 2), 1, 2, r);
      check_same(master_params(*engine), want[static_cast<size_t>(comm.rank())].master);
      CHECK(gathered_params(*engine) == want[static_cast<size_t>(comm.rank())].params);
    });
    CHECK(files_in(dir.str()) == 0);
  }
  set_offload_swap_io({});
}

namespace {

// DeepSpeedExamples' ZeRO-Infinity configuration, byte for byte
// (microsoft/DeepSpeedExamples, Megatron-LM-v1.1.5-ZeRO3/examples/
// ds_zero_stage_infinity_config.json at 7d936b35ecf400c2a40395ddd067c51d6761ee04):
// the optimizer and the parameters on NVMe, one element in CPU memory.
constexpr const char* kInfinityConfig = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 3,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e8,
    "stage3_param_persitance_threshold": 1e5,
    "stage3_prefetch_bucket_size": 5e7,
    "contiguous_gradients": true,
    "overlap_comm": true,
    "reduce_bucket_size": 90000000,
    "sub_group_size": 1e8,
    "offload_optimizer": {
      "device": "nvme",
      "nvme_path": "/nvme_data",
      "buffer_count": 4,
      "pipeline_read": false,
      "pipeline_write": false,
      "pin_memory": true
    },
    "offload_param": {
      "device": "nvme",
      "nvme_path": "/nvme_data",
      "max_in_cpu": 1,
      "pin_memory": true
    }
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "loss_scale": 1024,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": false,
  "aio": {
    "block_size": 1048576,
    "queue_depth": 16,
    "single_submit": false,
    "overlap_events": true,
    "thread_count": 2
  }
})";

}  // namespace

TEST_CASE("DeepSpeedExamples' ZeRO-Infinity file: its NVMe values honoured, and it trains as with the parameters in host memory") {
  // The file misspells stage3_param_persistence_threshold, which DeepSpeed
  // skipped silently when the file was written: refused, naming the key.
  const std::string refused = error_of(std::string(kInfinityConfig), ds_config_program());
  CAPTURE(refused);
  CHECK(refused.find("stage3_param_persitance_threshold") != std::string::npos);
  CHECK(refused.find("stage3_param_persistence_threshold") != std::string::npos);
  // As its authors meant it (the key spelled right), it loads with its
  // values.
  std::string json = kInfinityConfig;
  const std::string typo = "persitance";
  json.replace(json.find(typo), typo.size(), "persistence");
  EngineConfig config = parse_config_json(json, ds_config_program());
  REQUIRE(config.zero.stage == 3);
  CHECK(config.offload_optimizer.device == OffloadDevice::kNvme);
  CHECK(config.offload_optimizer.buffer_count == 4);
  CHECK(config.offload_param.device == OffloadDevice::kNvme);
  CHECK(config.offload_param.nvme_path == "/nvme_data");
  CHECK(config.offload_param.max_in_cpu == 1);
  CHECK(config.offload_param.pin_memory);
  CHECK(config.offload_param.buffer_count == 5);  // DeepSpeed's defaults
  CHECK(config.offload_param.buffer_size == 100'000'000);
  CHECK(config.aio.queue_depth == 16);
  CHECK(config.aio.intra_op_parallelism == 2);
  CHECK(config.fp16.enabled);
  // Trained here: the swap files in a scratch directory, and the units
  // gathered on demand (the file's threshold of 1e5 would keep this small
  // model whole).
  TempDir dir;
  config.offload_optimizer.nvme_path = dir.str();
  config.offload_param.nvme_path = dir.str();
  config.zero.stage3_param_persistence_threshold = 40;
  EngineConfig reference = config;
  reference.offload_param.device = OffloadDevice::kCpu;
  const std::vector<Run> want = run(reference, 2, 3);
  const std::vector<Run> got = run(config, 2, 3);
  check_same_run(got, want);
  for (const Run& r : got) {
    // max_in_cpu 1: no shard fits, all four are on NVMe.
    CHECK(r.memory.host(MemoryCategory::kParameters).current == 0);
    CHECK(r.memory.nvme(MemoryCategory::kParameters).current > 0);
  }
  CHECK(files_in(dir.str()) == 0);
}

TEST_CASE("offload_param nvme: fp16 with an overflow step skipped writes nothing back, and the bits are CPU offload's") {
  // register_model's units, all gathered on demand, on NVMe; step 1's
  // gradients overflow, so it is skipped: no shard is written, none changes.
  TempDir dir;
  EngineConfig config = base_config(3);
  config.optimizer.kind = OptimizerKind::kAdam;
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 8;
  RunOptions opt = runs(2, 4);
  opt.backward.poison = [](int64_t step, int) { return step == 1; };
  const std::vector<RankResult> want = run_engine(offloaded(config, OffloadDevice::kCpu, dir.str()), opt);
  const std::vector<RankResult> got = run_engine(offloaded(config, OffloadDevice::kNvme, dir.str()), opt);
  for (size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    check_same(got[r].params, want[r].params);
    REQUIRE(got[r].steps.size() == 4);
    CHECK_FALSE(got[r].steps[1].applied);
    CHECK(got[r].steps[3].applied);
    CHECK(got[r].steps[3].grad_norm == want[r].steps[3].grad_norm);
    CHECK(got[r].memory.nvme(MemoryCategory::kParameters).current > 0);
  }
  CHECK(files_in(dir.str()) == 0);
}

TEST_CASE("ParamSwap::write_piece stages a shard's pieces and writes the slot once, before anything reads it") {
  // Note [staged shard writes]: the file keeps the slot's old bytes until
  // flush(), or any other call, writes the staged buffer whole.
  TempDir dir;
  CachingAllocator host(make_host_allocator());
  const std::vector<size_t> numel = {1000, 1500};
  ParamSwap swap({.nvme_path = dir.str(), .buffer_count = 2, .buffer_numel = 1500, .rank = 0,
                  .dtype = DType::kFloat32, .aio = {}},
                 host, numel);
  const auto file_floats = [&](uint64_t offset, size_t n) {
    std::vector<float> v(n);
    std::ifstream in(swap.path(), std::ios::binary);
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
    REQUIRE(in.good());
    return v;
  };
  const auto bytes = [](const std::vector<float>& v) { return reinterpret_cast<const std::byte*>(v.data()); };
  std::vector<float> first(1000);
  for (size_t i = 0; i < first.size(); ++i) first[i] = static_cast<float>(i) + 0.5f;
  swap.write(0, 0, 1000, bytes(first));  // staged and flushed at once
  CHECK(file_floats(0, 1000) == first);  // unit 0's current slot: the file's first bytes

  // Three pieces of unit 0: the file unchanged until the flush.
  std::vector<float> piece(300, -2.0f);
  swap.write_piece(0, 0, 300, bytes(piece));
  swap.write_piece(0, 700, 1000, bytes(piece));
  swap.write_piece(0, 300, 400, bytes(piece));
  CHECK(file_floats(0, 1000) == first);
  swap.flush();
  std::vector<float> want = first;
  for (size_t i = 0; i < 400; ++i) want[i] = -2.0f;
  for (size_t i = 700; i < 1000; ++i) want[i] = -2.0f;
  CHECK(file_floats(0, 1000) == want);

  // A read of the staged unit sees the pieces (they are written first); a
  // piece of another unit writes the first unit's.
  swap.write_piece(0, 500, 501, bytes(piece));
  std::vector<float> back(1000);
  swap.read(0, 0, 1000, reinterpret_cast<std::byte*>(back.data()));
  want[500] = -2.0f;
  CHECK(back == want);
  CHECK(file_floats(0, 1000) == want);
  swap.write_piece(0, 999, 1000, bytes(first));
  swap.write_piece(1, 0, 300, bytes(piece));
  want[999] = first[0];
  CHECK(file_floats(0, 1000) == want);
  swap.flush();
  std::vector<float> unit1(300);
  swap.read(1, 0, 300, reinterpret_cast<std::byte*>(unit1.data()));
  CHECK(unit1 == piece);
}

}  // namespace test_offload_nvme_param
