// Runs an engine on W in-process ranks with a synthetic backward, for the
// engine tests: every rank's fp32 master values, step results and counters.
#pragma once

#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zest/comm/inprocess_comm.h"
#include "zest/core/float16.h"
#include "zest/engine/engine.h"
#include "zest/memory/copy.h"
#include "zest/memory/raw_allocator.h"

namespace zest::test {

// A small model whose sizes divide by nothing in particular: 7x13 + 7,
// 5x7 + 5, 3 and 11x3, with biases and the scalar in a no-decay group.
inline void register_model(Engine& engine) {
  engine.add_param_group("no_decay", 0.0f);
  engine.add_unit("a", {{"a.w", {7, 13}}, {"a.b", {7}, "no_decay"}});
  engine.add_unit("b", {{"b.w", {5, 7}}, {"b.b", {5}, "no_decay"}, {"b.s", {}, "no_decay"}});
  engine.add_unit("c", {{"c.w", {11, 3}}});
}

inline uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// A value in [-1, 1) from integers, the same on every run.
inline float noise(uint32_t a, uint32_t b, uint32_t c) {
  return static_cast<float>(mix(a * 0x9e3779b9U ^ mix(b + 0x85ebca6bU * c)) >> 8) / 8388608.0f - 1.0f;
}

inline void init_values(const ParamLayout& p, std::span<float> v) {
  uint32_t salt = 0;
  for (char ch : p.name) salt = salt * 31 + static_cast<uint8_t>(ch);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * noise(salt, static_cast<uint32_t>(i), 7);
}

// Backward of a made-up loss: g = w * a + b, with a, b depending on the rank,
// the micro-step and the element, so ranks disagree and averaging matters.
// `poison`, when it returns true for (step, micro), writes an Inf.
struct Backward {
  std::function<bool(int64_t step, int micro)> poison;
  float scale = 1.0f;  // the loss scale the gradients carry
  // Every rank computes rank 0's gradients, so the average is the same for
  // every world size (exactly so when W is a power of two).
  bool same_on_every_rank = false;
  // Whole numbers in [-8, 8] (times scale), independent of the parameters:
  // every sum and power-of-two average of them is exact in fp32 and bf16.
  bool integer_valued = false;
};

// Reads the parameters and writes the gradients through host copies, so the
// same code drives host and CUDA engines.
template <typename T>
void write_grads(Engine& engine, int u, int rank, int64_t step, int micro, const Backward& bw) {
  if (bw.same_on_every_rank) rank = 0;
  const Stream stream = engine.stream();
  UnitHandle h = engine.gather(u);
  GradHandle g = engine.grads(u);
  for (const ParamLayout& p : engine.layout().unit(u).params) {
    std::vector<T> w(p.numel), gw(p.numel);
    copy_bytes(stream, w.data(), h.param<T>(p.name).data(), p.numel * sizeof(T));
    stream.synchronize();
    for (size_t i = 0; i < gw.size(); ++i) {
      const uint32_t id = static_cast<uint32_t>(p.offset + i + 1000u * static_cast<uint32_t>(u));
      const float a = noise(id, static_cast<uint32_t>(rank), static_cast<uint32_t>(step * 8 + micro));
      const float b = 0.1f * noise(id, static_cast<uint32_t>(rank) + 17u, static_cast<uint32_t>(micro));
      gw[i] = bw.integer_valued ? T(std::round(8.0f * a) * bw.scale)
                                : T((static_cast<float>(w[i]) * a + b) * bw.scale);
    }
    if (bw.poison && bw.poison(step, micro) && p.name == "b.w") gw[2] = T(INFINITY);
    copy_bytes(stream, g.grad<T>(p.name).data(), gw.data(), p.numel * sizeof(T));
    stream.synchronize();
  }
  g.done();
}

struct RankResult {
  std::map<std::string, std::vector<float>> params;  // fp32 master values
  std::vector<StepResult> steps;
  CommCounters last_step_counters;  // the data communicator's, over the last step
  // MiCS: the shard group's and the replica group's over the last step
  // (the shard group's is last_step_counters under flat sharding, and the
  // replica group's then empty).
  CommCounters last_step_shard_counters;
  CommCounters last_step_replica_counters;
  CommCounters last_step_hpz_counters;  // hpZ: its group's (empty without)
  MemoryReport memory;              // after the last step
};

struct RunOptions {
  int world = 1;
  int steps = 3;
  Backward backward;
  // Gathers in forward order, then in reverse for backward (stage 3's
  // pattern); false gathers each unit once for both.
  bool forward_then_backward = true;
  // From the second step on, gathers in another order than the first step's
  // (stage 3 then stops prefetching; results must not change).
  bool change_order = false;
  Device device = Device::host();
  // Bytes the device allocator may hold (0: no limit), as a smaller device
  // would (make_limited_allocator).
  size_t device_capacity = 0;
  // Bytes the host allocator (offloaded state and its staging) may hold (0:
  // no limit), as a smaller host would.
  size_t host_capacity = 0;
  // Registers the model (register_model's unless set).
  std::function<void(Engine&)> model;
};

inline RunOptions runs(int world, int steps) {
  RunOptions o;
  o.world = world;
  o.steps = steps;
  return o;
}

// Steps [first, last) of a run: each optimizer step's micro-steps of
// forward gathers and backward (gradients from write_grads).
inline void run_steps(Engine& engine, Communicator& comm, const RunOptions& opt, int64_t first, int64_t last,
                      RankResult& out) {
  const int units = engine.layout().num_units();
  Backward bw = opt.backward;
  Communicator& shards = engine.shard_comm();
  Communicator* replicas = engine.replica_comm();
  Communicator* hpz = engine.hpz_comm();
  for (int64_t s = first; s < last; ++s) {
    comm.reset_counters();
    shards.reset_counters();
    if (replicas != nullptr) replicas->reset_counters();
    if (hpz != nullptr) hpz->reset_counters();
    for (int m = 0; m < static_cast<int>(engine.config().accumulation_steps()); ++m) {
      bw.scale = static_cast<float>(engine.loss_scale());
      if (opt.forward_then_backward && !(opt.change_order && s > first)) {
        for (int u = 0; u < units; ++u) UnitHandle h = engine.gather(u);  // forward
      }
      for (int u = units - 1; u >= 0; --u) {
        switch (engine.compute_dtype()) {
          case DType::kFloat32: write_grads<float>(engine, u, comm.rank(), s, m, bw); break;
          case DType::kFloat16: write_grads<fp16>(engine, u, comm.rank(), s, m, bw); break;
          default: write_grads<bf16>(engine, u, comm.rank(), s, m, bw); break;
        }
      }
      StepResult r = engine.step();
      if (r.boundary) out.steps.push_back(r);
    }
    out.last_step_counters = comm.counters();
    out.last_step_shard_counters = shards.counters();
    if (replicas != nullptr) out.last_step_replica_counters = replicas->counters();
    if (hpz != nullptr) out.last_step_hpz_counters = hpz->counters();
  }
}

// Every parameter's fp32 master values. Collective.
inline std::map<std::string, std::vector<float>> master_params(Engine& engine) {
  std::map<std::string, std::vector<float>> out;
  for (const UnitLayout& u : engine.layout().units())
    for (const ParamLayout& p : u.params) out[p.name] = engine.param_master(p.name);
  return out;
}

// An allocator for the device a run uses, of at most `capacity` bytes (0:
// the device's own).
inline std::unique_ptr<CachingAllocator> allocator_for(Device device, size_t capacity = 0) {
  std::unique_ptr<RawAllocator> raw = device.is_cuda() ? make_cuda_allocator(device.index()) : make_host_allocator();
  if (capacity > 0) raw = make_limited_allocator(std::move(raw), capacity);
  return std::make_unique<CachingAllocator>(std::move(raw));
}

// The engine of a run, finalized with init_values: `model` registered
// (register_model's when empty), and with offload_optimizer its offloaded
// state in `host`.
inline std::unique_ptr<Engine> finalized_engine(const EngineConfig& config, Communicator& comm, CachingAllocator& alloc,
                                                CachingAllocator& host, const Stream& stream,
                                                const std::function<void(Engine&)>& model = {}) {
  auto engine = config.offload_optimizer.device != OffloadDevice::kNone
                    ? std::make_unique<Engine>(config, comm, alloc, host, stream)
                    : std::make_unique<Engine>(config, comm, alloc, stream);
  if (model) {
    model(*engine);
  } else {
    register_model(*engine);
  }
  engine->finalize(init_values);
  return engine;
}

// One rank's part of a run: `steps` optimizer steps (x accumulation
// micro-steps) on `comm`.
inline RankResult run_rank(const EngineConfig& config, const RunOptions& opt, Communicator& comm) {
  const auto alloc = allocator_for(opt.device, opt.device_capacity);
  // Offloaded state: pinned on a GPU, so the copies are asynchronous.
  std::unique_ptr<RawAllocator> host_raw = opt.device.is_cuda() ? make_cuda_pinned_allocator() : make_host_allocator();
  if (opt.host_capacity > 0) host_raw = make_limited_allocator(std::move(host_raw), opt.host_capacity);
  CachingAllocator host(std::move(host_raw));
  const OwnedStream stream(opt.device);
  const std::unique_ptr<Engine> engine = finalized_engine(config, comm, *alloc, host, stream, opt.model);
  RankResult out;
  run_steps(*engine, comm, opt, 0, opt.steps, out);
  out.params = master_params(*engine);
  out.memory = engine->memory_report();
  return out;
}

// The same run on `opt.world` in-process ranks.
inline std::vector<RankResult> run_engine(const EngineConfig& config, const RunOptions& opt) {
  std::vector<RankResult> results(static_cast<size_t>(opt.world));
  CommOptions comm_options;
  comm_options.timeout = std::chrono::seconds(20);
  run_inprocess(
      opt.world,
      [&](Communicator& comm) { results[static_cast<size_t>(comm.rank())] = run_rank(config, opt, comm); },
      opt.device, comm_options);
  return results;
}

// Constructs an engine of `config` on each of `world` in-process ranks and
// nothing more: for the constructor's refusals, which it rethrows.
inline void construct_engines(const EngineConfig& config, int world) {
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine e(config, comm, alloc, Stream::default_for(Device::host()));
  });
}

inline EngineConfig base_config(int stage) {
  EngineConfig c;
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;
  c.optimizer.lr = 0.01f;
  c.optimizer.weight_decay = 0.05f;
  return c;
}

// Stage 3: no unit is gathered, the parameters' memory is the fp32 shards
// alone.
inline bool nothing_gathered(Engine& engine) {
  size_t shards = 0;
  for (const UnitLayout& U : engine.layout().units()) shards += U.shard;
  return engine.memory_report()[MemoryCategory::kParameters].current == static_cast<int64_t>(shards * 4);
}

// The checks below use doctest's macros: include this after doctest.h.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using Params = std::map<std::string, std::vector<float>>;

// Every parameter of `a` has the bits of `b`'s.
inline void check_same(const Params& a, const Params& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, values] : a) {
    CAPTURE(name);
    CHECK(same_bits(values, b.at(name)));
  }
}

// Runs stage 0 and then stages 1-3 on `world` ranks and checks that every
// rank of every stage ends with stage 0's parameters, bit for bit.
// `model` registers more than register_model's (which it must include).
inline void check_equivalence(EngineConfig config, int world, Device device = Device::host(),
                              const std::function<void(Engine&)>& model = {}) {
  CAPTURE(world);
  config.zero.stage = 0;
  RunOptions opt = runs(world, 4);
  opt.device = device;
  opt.model = model;
  const std::vector<RankResult> reference = run_engine(config, opt);
  for (const RankResult& r : reference) {
    for (const auto& [name, values] : r.params) {
      CAPTURE(name);
      CHECK(same_bits(values, reference[0].params.at(name)));
    }
  }
  // The parameters moved: a test of equality between runs that did nothing
  // would pass too.
  std::vector<float> initial(reference[0].params.at("a.w").size());
  ParamLayout aw{"a.w", {7, 13}, 91, 0, 0};
  init_values(aw, initial);
  CHECK_FALSE(same_bits(initial, reference[0].params.at("a.w")));

  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    config.zero.stage = stage;
    const std::vector<RankResult> got = run_engine(config, opt);
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      for (const auto& [name, values] : got[static_cast<size_t>(r)].params) {
        CAPTURE(name);
        CHECK(same_bits(values, reference[0].params.at(name)));
      }
      const auto& steps = got[static_cast<size_t>(r)].steps;
      REQUIRE(steps.size() == reference[0].steps.size());
      for (size_t s = 0; s < steps.size(); ++s) {
        CHECK(steps[s].grad_norm == reference[0].steps[s].grad_norm);
        CHECK(steps[s].clipped == reference[0].steps[s].clipped);
      }
    }
  }
}


}  // namespace zest::test
